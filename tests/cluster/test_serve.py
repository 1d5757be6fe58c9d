"""``trio-duplex serve --cluster``: membership and cluster-wide admission, with real
``trio-duplex serve`` processes on 127.0.0.1 and a real redis-server.

Clients are trio-websocket's (independent of the server's own connection code). Every
wait is bounded. Real time passes only where Redis's TTL clock is what is tested (a
killed node's membership lapsing) or the server's own heartbeat is (recovery after
Redis returns); both are polled against a deadline, never slept through blindly.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from trio_duplex import ServerConfig
from trio_duplex.cluster.keys import _NODE_ID
from trio_duplex.cluster.node import advertise_url, default_node_id, shown_url
from trio_duplex.cluster.store import HEARTBEAT_INTERVAL_S, LEASE_TTL_S, NODE_TTL_S, Store
from trio_duplex.server import config_checks

from ..helpers import ServerProcess
from .conftest import SECRET, RedisServer

pytestmark = pytest.mark.integration

TIMEOUT = 5.0
MEMBERSHIP_BOUND_S = NODE_TTL_S + HEARTBEAT_INTERVAL_S
LOST_BOUND_S = LEASE_TTL_S + HEARTBEAT_INTERVAL_S
"""A killed node's leases come back, and its sessions read as lost, within this."""


CAPPED = ("--cluster-max-sessions", "10", "--max-sessions", "10")


# -- clients -------------------------------------------------------------------------------


async def receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(TIMEOUT):
        message = await ws.get_message()
    event: dict[str, Any] = json.loads(message)
    return event


@attrs.define(eq=False)
class Clients:
    """Client connections in one nursery; every TCP stream is closed at the end
    (trio-websocket leaves a stream open when the server closed the WebSocket)."""

    nursery: trio.Nursery
    streams: list[trio.SocketStream] = attrs.field(factory=list)

    async def open_on(
        self, url: str
    ) -> tuple[WebSocketConnection | None, dict[str, Any], int | None]:
        """Open a session: (its connection, session.created, None), or, refused,
        (None, the error event, the close code)."""
        match = re.fullmatch(r"ws://([^:/]+):(\d+)(/.*)", url)
        assert match, url
        host, port, path = match.group(1), int(match.group(2)), match.group(3)
        with trio.fail_after(TIMEOUT):
            stream = await trio.open_tcp_stream(host, port)
            self.streams.append(stream)
            ws = await wrap_client_stream(self.nursery, stream, host, path)
        await ws.send_message(json.dumps({"type": "session.update", "session": {}}))
        first = await receive(ws)
        if first["type"] == "session.created":
            return ws, first, None
        with pytest.raises(ConnectionClosed) as closed:
            await receive(ws)
        reason = closed.value.reason
        return None, first, None if reason is None else reason.code


@asynccontextmanager
async def clients() -> AsyncIterator[Clients]:
    """Client connections, dropped at the end (their sessions detach)."""
    streams: list[trio.SocketStream] = []
    try:
        async with trio.open_nursery() as nursery:
            yield Clients(nursery, streams)
            nursery.cancel_scope.cancel()
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)


async def open_many(
    clients: Clients, urls: list[str]
) -> tuple[list[WebSocketConnection], list[tuple[dict[str, Any], int | None]]]:
    """One open per URL, all at once: the opened connections, and the refusals."""
    opened: list[WebSocketConnection] = []
    refused: list[tuple[dict[str, Any], int | None]] = []

    async def one(url: str) -> None:
        ws, event, code = await clients.open_on(url)
        if ws is None:
            refused.append((event, code))
        else:
            opened.append(ws)

    async with trio.open_nursery() as opening:
        for url in urls:
            opening.start_soon(one, url)
    return opened, refused


async def echo(ws: WebSocketConnection, text: str) -> None:
    await ws.send_message(json.dumps({"type": "input.text.append", "text": text}))
    reply = await receive(ws)
    assert reply["type"] == "response.output_text.delta" and reply["text"] == text, reply


async def close_session(ws: WebSocketConnection) -> None:
    await ws.send_message(json.dumps({"type": "session.close"}))
    with pytest.raises(ConnectionClosed):
        while True:
            await receive(ws)


def assert_cluster_full(refused: list[tuple[dict[str, Any], int | None]], says: str) -> None:
    for event, code in refused:
        assert event["type"] == "error", event
        assert (event["code"], event["retryable"], code) == ("resource_exhausted", True, 1013)
        assert says in event["message"], event


async def total_leases(store: Store) -> int:
    return sum((await store.leases()).values())


async def until(condition: Callable[[], Any], within: float, what: str) -> float:
    """Poll the async ``condition`` every 50 ms until it is true; the time it took. (What
    it watches is in other processes, Redis or a node: there is no event to wait on.)"""
    start = trio.current_time()
    with trio.move_on_after(within):
        while not await condition():  # noqa: ASYNC110
            await trio.sleep(0.05)
        return trio.current_time() - start
    raise AssertionError(f"not within {within}s: {what}")


def http_get(port: int, path: str) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


# -- admission -----------------------------------------------------------------------------


async def test_concurrent_opens_on_three_nodes_never_overshoot_the_cap(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    three = nodes(("n0", "n1", "n2"), *CAPPED)
    async with clients() as mine:
        opened, refused = await open_many(mine, [node.url for node in three] * 10)
        assert (len(opened), len(refused)) == (10, 20)
        assert_cluster_full(refused, "cluster-wide session slots are in use")
        assert await total_leases(store) == 10

        for ws in opened[:2]:
            await close_session(ws)
        # A lease goes back in a task just after the slot is freed: wait for Redis to
        # have it (a client reopening in that sub-millisecond would be refused, retryable).
        await until(lambda: _equals(total_leases(store), 8), TIMEOUT, "two leases back")
        more, refused = await open_many(mine, [node.url for node in three] * 10)
        assert (len(more), len(refused)) == (2, 28)
        assert_cluster_full(refused, "cluster-wide session slots are in use")
        for ws in opened[2:] + more:  # every admitted session still works
            await echo(ws, "still here")
    for node in three:
        assert "Traceback" not in node.log


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_a_killed_node_s_leases_come_back_within_the_lease_bound(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    """Real time: the killed node's leases lapse on Redis's TTL clock; not when its
    membership does (a node that is only slow keeps its place), but by the lease TTL."""
    a, b, c = nodes("abc", *CAPPED)
    async with clients() as mine:
        held_a, _ = await open_many(mine, [a.url] * 6)
        held_b, _ = await open_many(mine, [b.url] * 4)
        assert (len(held_a), len(held_b)) == (6, 4)
        _, refused = await open_many(mine, [c.url])
        assert_cluster_full(refused, "in use")

        a.proc.send_signal(signal.SIGKILL)
        killed = trio.current_time()

        async def opens_on_c() -> bool:
            ws, _, _ = await mine.open_on(c.url)
            return ws is not None

        # The bound is the lease TTL plus a heartbeat; the 2 s beyond it are this test's
        # (the polling of opens, three node processes on a loaded machine). The lower
        # bound is what tells the lease TTL from a lapse of membership or none at all.
        took = await until(opens_on_c, LOST_BOUND_S + 2, "an open on c")
        assert LEASE_TTL_S - HEARTBEAT_INTERVAL_S <= trio.current_time() - killed, took
        more, refused = await open_many(mine, [c.url] * 6)
        assert (len(more), len(refused)) == (5, 1)  # 1 + 5 on c, 4 on b: the cap again
        assert await store.leases() == {"b": 4, "c": 6}


async def test_with_redis_down_live_sessions_go_on_and_opens_are_refused(
    cluster: Callable[..., ServerProcess], redis_server: RedisServer, store: Store
) -> None:
    """Real time: the node's own heartbeat notices the outage and the recovery."""
    node = cluster("solo", *CAPPED)
    async with clients() as mine:
        ws, _, _ = await mine.open_on(node.url)
        assert ws is not None
        await echo(ws, "before")
        with redis_server.stopped():
            warned = trio.to_thread.run_sync(
                node.wait_for_line, "cluster: store unreachable", TIMEOUT
            )
            # Redis stays down for two heartbeats at least: the session echoes throughout.
            outage_ends = trio.current_time() + 2 * HEARTBEAT_INTERVAL_S + 0.2
            i = 0
            while trio.current_time() < outage_ends:
                await echo(ws, f"during {i}")
                i += 1
                await trio.sleep(0.1)
            _, refused = await open_many(mine, [node.url, node.url])
            assert_cluster_full(refused, "cluster store is unreachable")
            await warned
            assert http_get(node.port, "/readyz")[0] == 503
            assert "trio_duplex_cluster_store_up 0.0" in http_get(node.port, "/metrics")[1]
            for i in range(5):
                await echo(ws, f"still during {i}")

        # Redis came back empty: the next heartbeats register the node again and set its
        # lease count (the live session's lease) before any open is let in.
        async def opens() -> bool:
            again, _, _ = await mine.open_on(node.url)
            return again is not None

        await until(opens, 2 * HEARTBEAT_INTERVAL_S + 1, "an open after Redis returned")
        assert await store.leases() == {"solo": 2}
        await echo(ws, "after")
        await trio.to_thread.run_sync(node.wait_for_line, "cluster: store reachable again", 1)
        assert http_get(node.port, "/readyz")[0] == 200
        assert "trio_duplex_cluster_store_up 1.0" in http_get(node.port, "/metrics")[1]
    assert "Traceback" not in node.log
    assert len(re.findall("store unreachable", node.log)) == 1, node.log


async def test_a_drained_node_leaves_the_cluster_at_once(
    cluster: Callable[..., ServerProcess], store: Store
) -> None:
    node = cluster("leaving", *CAPPED, "--drain-timeout", "0")
    assert await store.nodes() == {"leaving": node.url}
    async with clients() as mine:
        opened, _ = await open_many(mine, [node.url] * 3)
        assert await total_leases(store) == 3
        node.interrupt()
        assert await trio.to_thread.run_sync(node.wait, TIMEOUT) == 0
        assert len(opened) == 3
    assert await store.nodes() == {}
    assert "node leaving left" in node.log


# -- the command line ------------------------------------------------------------------------


def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_duplex", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    "flags",
    [
        ("--node-id", "a"),
        ("--cluster-max-sessions", "5"),
        ("--advertise-url", "ws://10.0.0.1:8765/v1/duplex"),
        ("--cluster-secret", SECRET),
        ("--relay-port", "0"),
    ],
)
def test_cluster_flags_need_cluster(flags: tuple[str, ...]) -> None:
    result = run_serve(*flags)
    assert result.returncode == 2
    assert f"{flags[0]} needs --cluster" in result.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port  # closed again: nothing listens there


def test_an_unreachable_store_at_start_exits_2_with_one_line() -> None:
    result = run_serve(
        "--cluster", f"redis://127.0.0.1:{closed_port()}/0", "--cluster-secret", SECRET
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the cluster store" in lines[0], result.stderr


def test_without_cluster_the_redis_client_is_not_loaded() -> None:
    code = (
        "import sys, trio_duplex.cli, trio_duplex.server.server; "
        "assert 'coredis' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_the_store_s_password_stays_out_of_the_log() -> None:
    assert shown_url("redis://:s3cret@db:6379/0") == "redis://:***@db:6379/0"
    assert shown_url("redis://app:s3cret@db/1") == "redis://app:***@db/1"
    assert shown_url("redis://db:6379/0") == "redis://db:6379/0"
    result = run_serve("--cluster", f"redis://:s3cret@127.0.0.1:{closed_port()}/0")
    assert result.returncode == 2 and "s3cret" not in result.stderr, result.stderr


def test_the_config_checks_node_ids_as_the_store_does() -> None:
    assert config_checks.NODE_ID.pattern == _NODE_ID.pattern
    assert _NODE_ID.fullmatch(default_node_id())
    assert default_node_id() != default_node_id()


def test_the_advertised_url_defaults_to_the_listening_address() -> None:
    config = ServerConfig(cluster="redis://db/0", cluster_secret=SECRET, host="10.1.2.3")
    assert advertise_url(config, "ws", 8001) == "ws://10.1.2.3:8001/v1/duplex"
    anywhere = ServerConfig(
        cluster="redis://db/0", cluster_secret=SECRET, host="0.0.0.0", path="/rt"
    )
    assert advertise_url(anywhere, "wss", 443) == f"wss://{socket.gethostname()}:443/rt"
    v6 = ServerConfig(cluster="redis://db/0", cluster_secret=SECRET, host="::1")
    assert advertise_url(v6, "ws", 1) == "ws://[::1]:1/v1/duplex"
    given = ServerConfig(cluster="redis://db/0", cluster_secret=SECRET, advertise_url="ws://lb:9/x")
    assert advertise_url(given, "ws", 1) == "ws://lb:9/x"


def test_cluster_needs_a_secret_and_never_shows_it() -> None:
    alone = run_serve("--cluster", "redis://127.0.0.1:1/0")
    assert alone.returncode == 2 and "needs --cluster-secret" in alone.stderr
    short = run_serve("--cluster", "redis://127.0.0.1:1/0", "--cluster-secret", "tooshort-xyz")
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    assert "tooshort-xyz" not in short.stderr
    config = ServerConfig(cluster="redis://db/0", cluster_secret=SECRET)
    assert SECRET not in repr(config)
