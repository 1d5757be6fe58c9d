"""--max-connections and --max-connections-per-ip.

Every accepted TCP connection counts, from its accept to the end of its task, whatever it
turns out to be for; one over a limit gets 503 with Retry-After once its request has
arrived, or a plain close if it does not arrive within a short bound. The per-address
limit needs real sockets (127.0.0.1, 127.0.0.2: Linux routes all of 127/8 to loopback);
the bounds in time are tested in memory, where no stream has an address.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from trio.testing import MockClock
from wsproto.events import AcceptConnection

from trio_duplex import DuplexServer, ServerConfig, cli
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import MemoryListener, Simulation, running_server

from ..helpers import RawClient, RawHttp, raw_handshake

REQUEST = (
    b"GET /v1/duplex HTTP/1.1\r\n"
    b"Host: test\r\n"
    b"Upgrade: websocket\r\n"
    b"Connection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n"
    b"\r\n"
)


@attrs.define
class RealServer:
    """A DuplexServer on 127.0.0.1, and the client connections to close at the end."""

    server: DuplexServer
    port: int
    streams: list[trio.SocketStream] = attrs.field(factory=list)

    async def tcp(self, source: str = "127.0.0.1") -> trio.SocketStream:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port, local_address=source)
        self.streams.append(stream)
        return stream

    async def upgraded(self, source: str = "127.0.0.1") -> RawClient:
        """A WebSocket from ``source`` whose upgrade got 101."""
        client = RawClient(await self.tcp(source))
        answer = await raw_handshake(client, "/v1/duplex")
        assert isinstance(answer, AcceptConnection), answer
        return client

    async def refused(self, source: str = "127.0.0.1") -> None:
        """A connection from ``source`` whose upgrade request gets 503, then the end."""
        stream = await self.tcp(source)
        await stream.send_all(REQUEST)
        assert_503(await until_eof(stream))
        await stream.aclose()


@asynccontextmanager
async def real_server(**config: Any) -> AsyncIterator[RealServer]:
    server = DuplexServer(ServerConfig(host="127.0.0.1", port=0, **config), EchoEngine)
    async with trio.open_nursery() as nursery:
        real = RealServer(server, await nursery.start(server.run_tcp))
        try:
            with trio.fail_after(20):  # a deadline for the whole test, not a wait
                yield real
        finally:
            for stream in real.streams:
                await trio.aclose_forcefully(stream)
            nursery.cancel_scope.cancel()


async def open_session(client: RawClient) -> None:
    await client.send({"type": "session.update", "session": {}})
    assert (await client.receive())["type"] == "session.created"


async def echoed(client: RawClient) -> None:
    await client.send({"type": "input.text.append", "text": "hi"})
    assert (await client.receive())["text"] == "hi"


async def until_eof(stream: trio.abc.Stream) -> bytes:
    answer = b""
    while True:
        try:
            chunk = await stream.receive_some()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return answer
        if not chunk:
            return answer
        answer += chunk


def assert_503(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *headers = head.split(b"\r\n")
    assert status == b"HTTP/1.1 503 Service Unavailable", answer
    assert b"Retry-After: 1" in headers, answer
    assert b"Connection: close" in headers, answer
    assert body == b"Too many connections; retry later.\n"


async def until_open(server: DuplexServer, count: int) -> None:
    while server.open_connections != count:
        await server.wait_changed()


# -- over real sockets ------------------------------------------------------------------------


async def test_the_connection_over_the_per_ip_limit_gets_503_with_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with real_server(max_connections=3, max_connections_per_ip=2) as real:
        first, second = await real.upgraded(), await real.upgraded()
        await open_session(first)
        await real.refused()
        await real.refused()
        # The limit is per address: another one still has room (3 in all now).
        third = await real.upgraded(source="127.0.0.2")
        await open_session(third)
        # Those served before go on, unharmed.
        await echoed(first)
        await open_session(second)
        await echoed(second)
        assert (real.server.open_connections, real.server.connections_refused) == (3, 2)
    said = [r for r in caplog.records if r.name == "trio_duplex" and "503" in r.getMessage()]
    assert len(said) == 1, said  # not one per refusal
    assert said[0].levelno == logging.WARNING and said[0].exc_info is None
    assert "127.0.0.1" in said[0].getMessage()
    assert "max_connections_per_ip 2" in said[0].getMessage()


async def test_a_closed_connection_gives_its_place_back() -> None:
    async with real_server(max_connections=10, max_connections_per_ip=2) as real:
        kept = await real.upgraded()
        for _ in range(3):
            other = await real.upgraded()
            await open_session(other)
            await real.refused()
            await other.stream.aclose()
            await until_open(real.server, 1)
        fresh = await real.upgraded()
        await open_session(fresh)
        await echoed(fresh)
        await open_session(kept)
        await real.refused()
        await kept.stream.aclose()
        await fresh.stream.aclose()
        await until_open(real.server, 0)
        # Nothing stayed counted for the address either.
        for client in [await real.upgraded(), await real.upgraded()]:
            await open_session(client)


async def test_the_total_limit_counts_every_connection_from_every_address() -> None:
    # Per address there is room for 10: only the total can refuse.
    async with real_server(max_connections=3, max_connections_per_ip=10) as real:
        with_session = await real.upgraded()
        await open_session(with_session)
        await real.upgraded(source="127.0.0.2")  # past the handshake, no session
        silent = await real.tcp(source="127.0.0.3")  # nothing sent: still handshaking
        await real.refused(source="127.0.0.4")
        await real.refused()
        await silent.aclose()
        await until_open(real.server, 2)
        await real.upgraded(source="127.0.0.4")
        await real.refused(source="127.0.0.5")
        await echoed(with_session)


async def test_a_connection_that_never_sends_its_request_holds_its_place() -> None:
    # The handshake timeout is far off: only the count can refuse the second one.
    config = {"max_connections": 3, "max_connections_per_ip": 1, "handshake_timeout_s": 60.0}
    async with real_server(**config) as real:
        silent = await real.tcp()  # accepted first: the listen queue is in order
        await real.refused()
        await silent.aclose()
        await until_open(real.server, 0)
        await open_session(await real.upgraded())


# -- in memory, in virtual time ---------------------------------------------------------------


async def test_streams_without_an_address_count_only_toward_the_total(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    config = ServerConfig(max_connections=2, max_connections_per_ip=1)
    async with running_server(config) as sim:
        first, _ = await sim.open_session()
        second, _ = await sim.open_session()  # no address: the per-address 1 does not apply
        assert_503(await raw_http(sim, REQUEST))
        await first.ws.aclose()
        await until_open(sim.server, 1)
        third, _ = await sim.open_session()
        assert_503(await raw_http(sim, REQUEST))
        await second.ws.aclose()
        await third.ws.aclose()


async def test_an_over_limit_connection_whose_request_never_comes_is_closed_within_the_bound(
    autojump_clock: MockClock,
) -> None:
    # Was: counted like any other, it was held for the whole handshake timeout.
    # The bound is 1 s, or the handshake timeout if that is shorter.
    for handshake_timeout_s, bound in [(10.0, 1.0), (0.25, 0.25)]:
        config = ServerConfig(max_connections=1, handshake_timeout_s=handshake_timeout_s)
        async with running_server(config) as sim:
            await sim.listener.connect()  # holds the one place, silent
            over, _ = await sim.listener.connect()
            start = trio.current_time()
            assert await until_eof(over) == b""
            assert trio.current_time() - start == bound


async def test_beyond_max_refusing_an_over_limit_connection_is_closed_at_once(
    autojump_clock: MockClock,
) -> None:
    server = DuplexServer(ServerConfig(max_connections=1), EchoEngine, max_refusing=1)
    listener = MemoryListener.create()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [listener])
        sim = Simulation(server, listener, nursery)
        holder, _ = await sim.open_session()
        start = trio.current_time()
        waiting, _ = await listener.connect()  # being answered: its request may come
        dropped, _ = await listener.connect()  # one too many being answered
        assert await until_eof(dropped) == b""
        assert trio.current_time() == start
        await waiting.send_all(REQUEST)
        assert_503(await until_eof(waiting))
        await trio.testing.wait_all_tasks_blocked()  # its task has ended
        again, _ = await listener.connect()  # so this one is answered
        await again.send_all(REQUEST)
        assert_503(await until_eof(again))
        assert server.connections_refused == 3
        await holder.ws.aclose()
        nursery.cancel_scope.cancel()


async def test_refusals_are_one_warning_a_minute_and_no_traceback(
    autojump_clock: MockClock, raw_http: RawHttp, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_server(ServerConfig(max_connections=1)) as sim:
        holder, _ = await sim.open_session()
        start = trio.current_time()
        for i in range(260):  # a refusal every half second for 130 s
            await trio.sleep_until(start + i / 2)
            assert_503(await raw_http(sim, REQUEST))
        assert sim.server.connections_refused == 260
        await holder.ws.aclose()
    said = [r for r in caplog.records if r.name == "trio_duplex" and "503" in r.getMessage()]
    assert len(said) == 3, said  # minutes 0, 1 and 2
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said)
    assert "max_connections 1" in said[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- the flags ---------------------------------------------------------------------------------


def test_the_serve_command_has_both_flags_with_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configs: list[ServerConfig] = []

    async def instead_of_serving(server: DuplexServer, engine: str) -> None:
        configs.append(server.config)

    monkeypatch.setattr(cli, "_serve_until_signalled", instead_of_serving)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # not in the test process
    assert cli.main(["serve"]) == 0
    flags = ["--max-connections", "7", "--max-connections-per-ip", "3"]
    assert cli.main(["serve", *flags]) == 0
    defaults, given = configs
    assert (defaults.max_connections, defaults.max_connections_per_ip) == (10_000, 1_000)
    assert (given.max_connections, given.max_connections_per_ip) == (7, 3)
