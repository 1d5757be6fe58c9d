"""A real ``redis-server`` (Debian's, see .ci/run) on a free loopback port, one per test
session, emptied before each test; ``RedisServer.stopped()`` takes it down for a while."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager

import coredis
import pytest

from trio_duplex.cluster.store import Store, open_store

from ..helpers import Serve, ServerProcess, Servers

SECRET = "test-cluster-secret-0123456789"
STARTUP_S = 5.0
TIMEOUT_S = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.process is None
        self.process = subprocess.Popen(
            [
                *(self.executable, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + STARTUP_S
        while not _answers_ping(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """Redis is down inside the block (its data is lost: no persistence), up after."""
        self.stop()
        try:
            yield
        finally:
            self.start()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server)")
    server = RedisServer(executable)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[Store]:
    """A store on the emptied shared server (short timeout: these tests wait for it)."""
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as raw:
        await raw.flushdb()
    async with open_store(redis_server.url, timeout_s=TIMEOUT_S) as store:
        store.sign_with(SECRET)
        yield store


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[coredis.Redis[str]]:
    """A plain client, to look at (or tamper with) keys behind the store's back."""
    async with coredis.Redis.from_url(redis_server.url, decode_responses=True) as client:
        yield client


def node_flags(redis_server: RedisServer, name: str) -> tuple[str, ...]:
    return ("--cluster", redis_server.url, "--cluster-secret", SECRET, "--node-id", name)


@pytest.fixture
def cluster(serve: Serve, redis_server: RedisServer, store: Store) -> Callable[..., ServerProcess]:
    """``cluster(name, *flags)``: a node of the cluster on the (emptied) test Redis."""

    def start(name: str, *flags: str) -> ServerProcess:
        return serve(*node_flags(redis_server, name), *flags)

    return start


@pytest.fixture
def nodes(
    servers: Servers, redis_server: RedisServer, store: Store
) -> Callable[..., list[ServerProcess]]:
    """``nodes(names, *flags)``: a node per name, started side by side."""

    def start(names: Iterable[str], *flags: str) -> list[ServerProcess]:
        return servers.start_many(*((*node_flags(redis_server, n), *flags) for n in names))

    return start
