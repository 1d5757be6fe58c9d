"""The JavaScript client (clients/js) against a real ``trio-duplex serve``.

Runs its own tests, Node's test runner over ``clients/js/test/*.test.js`` (with
``--experimental-websocket``: Node 20 has no global WebSocket without it), against two
servers started here: the echo engine, and the echo engine behind ``--api-key-file``.
The Node tests check open/send/receive, close and detach, resume, the binary audio
lane, typed errors, and exactly-once through a proxy that cuts connections at random.
Then ``tsc`` checks the module's JSDoc types and its ``.d.ts`` (``.ci/run`` installs
TypeScript when it is missing).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Servers

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "js"
API_KEY = "js-test-key-0123456789"
MAX_EVENT_BYTES = 100_000  # as clients/js/test/helpers.js expects

pytestmark = pytest.mark.integration


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (.ci/run installs it)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(re.match(r"v(\d+)", version.stdout).group(1))  # type: ignore[union-attr]
    assert major >= 20, f"the JS client's tests need Node >= 20, found {version.stdout.strip()}"
    return node


def test_node_client_against_serve(servers: Servers, tmp_path: Path) -> None:
    node = _node()
    keys = tmp_path / "keys"
    keys.write_text(f"js-tests:{API_KEY}\n")
    echo, auth = servers.start_many(
        (),
        ("--api-key-file", str(keys), "--max-event-bytes", str(MAX_EVENT_BYTES)),
    )
    env = {
        **os.environ,
        "TRIO_DUPLEX_URL": echo.url,
        "TRIO_DUPLEX_AUTH_URL": auth.url,
        "TRIO_DUPLEX_API_KEY": API_KEY,
        "TRIO_DUPLEX_PYTHON": sys.executable,
    }
    files = sorted(str(path) for path in (CLIENT / "test").glob("*.test.js"))
    assert files, "no JS test files"
    run = subprocess.run(
        [node, "--experimental-websocket", "--test", "--test-timeout=60000", *files],
        cwd=CLIENT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"node --test failed ({run.returncode}):\n{output}"
    # node's closing lines: every test passed, and there were tests.
    passed = re.search(r"^# pass (\d+)$", output, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= 20, output
    assert re.search(r"^# fail 0$", output, re.MULTILINE), output


def test_typescript_checks_the_module_and_its_types() -> None:
    tsc = shutil.which("tsc")
    if tsc is None:
        pytest.skip("tsc is not installed (.ci/run installs typescript with npm)")
    run = subprocess.run(
        [tsc, "--project", str(CLIENT / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"tsc found errors:\n{run.stdout}{run.stderr}"
