"""TLS in a cluster (docs/cluster.md, "TLS"): to Redis (``rediss://``, ``--cluster-redis-ca``, the
password from ``TRIO_DUPLEX_REDIS_PASSWORD``) and between nodes (``wss://`` relays
checked against ``--cluster-ca``).

Real processes: a redis-server serving TLS only (Debian's build has it), and
``trio-duplex serve`` nodes with certificates from a private CA made by ``trustme``.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trustme
from websockets.trio.client import ClientConnection, connect

from trio_duplex.cluster.connect import PASSWORD_ENV, parse
from trio_duplex.cluster.store import StoreUnavailable, open_store

from ..helpers import ServerProcess, Servers
from .conftest import SECRET, STARTUP_S, RedisServer, _free_port
from .test_relay import closed_with, open_session, receive, resume, send
from .test_serve import TIMEOUT

pytestmark = pytest.mark.integration

PASSWORD = "redis-password-not-in-argv-0123"


@attrs.frozen
class Pki:
    ca: str
    cert: str
    key: str
    context: ssl.SSLContext
    """A client context trusting the CA."""


def make_pki(where: Path, name: str = "cluster") -> Pki:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = {part: str(where / f"{name}-{part}.pem") for part in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    leaf.private_key_pem.write_to_path(paths["key"])
    leaf.cert_chain_pems[0].write_to_path(paths["cert"])
    context = ssl.create_default_context(cafile=paths["ca"])
    return Pki(paths["ca"], paths["cert"], paths["key"], context)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_ping(port: int, context: ssl.SSLContext) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(f"AUTH {PASSWORD}\r\nPING\r\n".encode())
                answer = b""
                while b"PONG" not in answer and len(answer) < 64:
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    answer += chunk
                return b"+PONG" in answer
    except OSError:
        return False


@pytest.fixture(scope="module")
def tls_redis(pki: Pki) -> Iterator[str]:
    """A redis-server that speaks TLS only and wants a password: its rediss:// URL."""
    executable = shutil.which("redis-server")
    assert executable is not None, "redis-server is not installed"
    port = _free_port()
    process = subprocess.Popen(
        [
            *(executable, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
            *("--tls-cert-file", pki.cert, "--tls-key-file", pki.key),
            *("--tls-ca-cert-file", pki.ca, "--tls-auth-clients", "no"),
            *("--requirepass", PASSWORD, "--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _tls_ping(port, pki.context):
            assert process.poll() is None and time.monotonic() < deadline, "no TLS redis"
            time.sleep(0.02)
        yield f"rediss://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


async def test_the_store_speaks_tls_to_redis_checked_against_the_ca(
    tls_redis: str, pki: Pki, tmp_path: Path
) -> None:
    async with open_store(tls_redis, ca_file=pki.ca, password=PASSWORD, timeout_s=2) as store:
        store.sign_with(SECRET)
        await store.register("n1", "ws://n1:1/v1/duplex")
        assert await store.nodes() == {"n1": "ws://n1:1/v1/duplex"}
        await store.forget("n1")
    other = make_pki(tmp_path, "other")  # a CA that did not sign the server's certificate
    async with open_store(tls_redis, ca_file=other.ca, password=PASSWORD, timeout_s=2) as store:
        store.sign_with(SECRET)
        with pytest.raises(StoreUnavailable):
            await store.nodes()
    plain = tls_redis.replace("rediss://", "redis://")  # no TLS: the server never answers
    async with open_store(plain, password=PASSWORD, timeout_s=0.5) as store:
        store.sign_with(SECRET)
        with pytest.raises(StoreUnavailable):
            await store.nodes()


def test_store_urls_parse_strictly_and_keep_passwords_out_of_repr() -> None:
    target = parse("rediss://u:p%40ss@h:7/2")
    assert (target.scheme, target.locations, target.db) == ("rediss", (("h", 7),), 2)
    assert (target.username, target.password) == ("u", "p@ss")
    assert "p@ss" not in repr(target)
    sentinel = parse("redis+sentinel://s1:26379,[::1]:26380/mymaster/3")
    assert sentinel.locations == (("s1", 26379), ("::1", 26380))
    assert (sentinel.service, sentinel.db) == ("mymaster", 3)
    for bad in ("http://h", "redis://h/x", "redis+sentinel://h:1", "redis://h:99999", "rediss://"):
        with pytest.raises(ValueError):
            parse(bad)


@pytest.fixture
def servers_with_password(servers: Servers, monkeypatch: pytest.MonkeyPatch) -> Servers:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)  # inherited by the nodes, never in argv
    return servers


async def test_serve_joins_through_rediss_with_the_password_from_the_environment(
    servers_with_password: Servers, tls_redis: str, pki: Pki
) -> None:
    node = servers_with_password.start(
        *("--cluster", tls_redis, "--cluster-redis-ca", pki.ca),
        *("--cluster-secret", SECRET, "--node-id", "tls-node"),
    )
    node.wait_for_line(r"node tls-node registered", TIMEOUT)
    async with open_store(tls_redis, ca_file=pki.ca, password=PASSWORD) as store:
        store.sign_with(SECRET)
        assert "tls-node" in await store.nodes()
    cmdline = await trio.Path(f"/proc/{node.proc.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in cmdline and PASSWORD not in node.log


@asynccontextmanager
async def wss_to(url: str, context: ssl.SSLContext) -> AsyncIterator[ClientConnection]:
    async with connect(url, ssl=context, proxy=None, compression=None, open_timeout=TIMEOUT) as ws:
        yield ws


@pytest.fixture
def tls_nodes(
    nodes: Callable[..., list[ServerProcess]], pki: Pki
) -> Callable[..., list[ServerProcess]]:
    def start(*flags: str) -> list[ServerProcess]:
        tls = ("--tls-cert", pki.cert, "--tls-key", pki.key, "--relay-port", "0")
        return nodes("ab", *tls, *flags)

    return start


async def test_a_resume_is_relayed_over_wss_checked_against_the_cluster_ca(
    tls_nodes: Callable[..., list[ServerProcess]], pki: Pki
) -> None:
    a, b = tls_nodes("--cluster-ca", pki.ca)
    a.wait_for_line(r"advertised as wss://127\.0\.0\.1:\d+", TIMEOUT)
    async with wss_to(a.url, pki.context) as on_a:
        created = await open_session(on_a)
    async with wss_to(b.url, pki.context) as on_b:
        await send(on_b, resume(created, created["resume_token"], 0))
        assert (await receive(on_b))["type"] == "session.resumed"
    assert "relaying its resume to its home node a" in b.log


async def test_without_the_cluster_ca_a_wss_home_is_not_trusted(
    tls_nodes: Callable[..., list[ServerProcess]], pki: Pki
) -> None:
    a, b = tls_nodes()  # the private CA is not among the system's
    async with wss_to(a.url, pki.context) as on_a:
        created = await open_session(on_a)
    async with wss_to(b.url, pki.context) as on_b:
        await send(on_b, resume(created, created["resume_token"], 0))
        events, code = await closed_with(on_b)
    assert events and events[0]["code"] == "session_home_unreachable", b.log
    assert code == 1013
    assert "CERTIFICATE_VERIFY_FAILED" in b.log or "certificate verify failed" in b.log


def test_a_cluster_ca_that_cannot_be_used_is_refused_at_start(
    servers: Servers, redis_server: RedisServer, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for ca in (str(junk), str(tmp_path / "missing.pem")):
        node = servers.launch(
            *("--cluster", redis_server.url, "--cluster-secret", SECRET, "--cluster-ca", ca)
        )
        assert node.wait(TIMEOUT) == 2
        node.wait_for_line(r"cannot use --cluster-ca", TIMEOUT)
        assert "Traceback" not in node.log
