"""The ``--cluster`` URL: a password in it is never shown (a repr, a refusal), and a URL
that cannot be used, a port that is not a number included, exits 2 with a message."""

from __future__ import annotations

import os
import subprocess

import pytest

from trio_duplex import ServerConfig
from trio_duplex.server.config_checks import ConfigError

from ..helpers import serve_command

SECRET = "a-cluster-secret-0123456789"
PASSWORD = "hunter2-pw"


def test_the_password_is_not_in_the_configs_repr() -> None:
    config = ServerConfig(cluster=f"redis://app:{PASSWORD}@db:6379/0", cluster_secret=SECRET)
    assert PASSWORD not in repr(config) and SECRET not in repr(config)
    assert "cluster='redis://app:***@db:6379/0'" in repr(config)
    assert "cluster=None" in repr(ServerConfig())


def test_a_refusal_does_not_quote_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        ServerConfig(cluster=f"redis://:{PASSWORD}@db:sixty/0", cluster_secret=SECRET)
    assert PASSWORD not in str(info.value) and "redis://:***@db:sixty/0" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{PASSWORD}@db:abc/0",  # the port is not a number: was a traceback
        f"redis://:{PASSWORD}@db:99999/0",
        f"redis://:{PASSWORD}@db:6379/zero",
        f"http://:{PASSWORD}@db:6379",
        f"redis://:{PASSWORD}@db:6379,db2:6379/0",  # several hosts: Sentinel only
        f"redis+sentinel://:{PASSWORD}@db:2637x/mymaster",
        f"redis://user:{PASSWORD}@:6379",
        f"redis://:{PASSWORD}/x@db:6379",  # an unescaped / in the password
    ],
)
@pytest.mark.parametrize("given", ["flag", "environment"])
def test_a_bad_cluster_url_exits_2_without_the_password(url: str, given: str) -> None:
    env = dict(os.environ, TRIO_DUPLEX_CLUSTER_SECRET=SECRET)
    args = ["--port", "0"]
    if given == "flag":
        args += ["--cluster", url]
    else:
        env["TRIO_DUPLEX_CLUSTER"] = url
    result = subprocess.run(
        serve_command(*args), capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2, result.stderr
    assert "--cluster" in result.stderr or "TRIO_DUPLEX_CLUSTER" in result.stderr
    assert "must be redis://" in result.stderr, result.stderr
    assert PASSWORD not in result.stderr and "Traceback" not in result.stderr, result.stderr
