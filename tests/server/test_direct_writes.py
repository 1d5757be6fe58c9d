"""Frames written straight from the emitting task, over a real socket on 127.0.0.1.

``Connection.push`` writes a frame with a non-blocking write when nothing is queued
(``WebSocket.write_now``); what the socket does not take is finished by the pump, before
anything else. In-memory streams have no socket, so only real sockets reach this path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.server.sessions.connection import Connection, Keepalive
from trio_duplex.server.sessions.timers import Timers
from trio_duplex.server.sessions.websocket import ConnectionClosed, WebSocket
from trio_duplex.testing import ScriptedEngine

from ..helpers import RawClient, raw_handshake


@asynccontextmanager
async def real_server(**config: Any) -> AsyncIterator[tuple[DuplexServer, int, Any]]:
    factory = ScriptedEngine.factory()
    server = DuplexServer(ServerConfig(host="127.0.0.1", port=0, **config), factory)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run_tcp)
        yield server, port, factory
        nursery.cancel_scope.cancel()


async def open_session(port: int) -> RawClient:
    client = RawClient(await trio.open_tcp_stream("127.0.0.1", port))
    await raw_handshake(client, "/v1/duplex")
    await client.send({"type": "session.update", "session": {}})
    assert (await client.receive())["type"] == "session.created"
    return client


async def test_frames_the_socket_takes_in_part_arrive_whole_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    partial = trio.Event()
    direct = 0
    write_now = WebSocket.write_now

    def spy(self: WebSocket, text: str) -> None:
        nonlocal direct
        write_now(self, text)
        direct += 1
        if self.unsent:
            partial.set()

    monkeypatch.setattr(WebSocket, "write_now", spy)
    texts = [f"{i:03d}:" + "x" * 250_000 for i in range(48)]  # 12 MB: more than the buffers
    with trio.fail_after(30):
        async with real_server(max_pending_output=4, journal_max_bytes=64 << 20) as (
            _,
            port,
            factory,
        ):
            client = await open_session(port)
            engine = factory.last
            await engine.started.wait()
            async with trio.open_nursery() as nursery:

                async def produce() -> None:
                    for text in texts:
                        await engine.emit(text)

                nursery.start_soon(produce)
                await partial.wait()  # the client has read nothing yet: a write went short
                got = [await client.receive() for _ in texts]
            await client.stream.aclose()
    assert [e["text"] for e in got] == texts
    assert [e["server_event_seq"] for e in got] == list(range(1, len(texts) + 1))
    assert direct >= 1


async def test_a_reader_that_keeps_up_gets_frames_written_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    direct = 0
    write_now = WebSocket.write_now

    def spy(self: WebSocket, text: str) -> None:
        nonlocal direct
        write_now(self, text)
        direct += not self.unsent

    monkeypatch.setattr(WebSocket, "write_now", spy)
    with trio.fail_after(30):
        async with real_server() as (server, port, _):
            client = await open_session(port)
            assert direct == 1  # session.created, written from the opening task
            direct = 0
            for i in range(20):
                await client.send({"type": "input.text.append", "text": f"t{i}"})
                answer = await client.receive()
                assert (answer["text"], answer["server_event_seq"]) == (f"t{i}", i + 1)
            # Every answer went out whole from the engine's own task: no pump was needed.
            assert direct == 20
            (conn,) = server.connections
            assert not conn.outbox
            await client.stream.aclose()


class BrokenOnWrite:
    """A WebSocket whose socket turns out to be broken at the first write."""

    broken = False
    unsent = False

    def can_write_now(self) -> bool:
        return not self.broken

    def write_now(self, text: str) -> None:
        self.broken = True  # os.write raised EPIPE/ECONNRESET

    async def flush(self) -> None:
        raise ConnectionClosed(1006, "connection lost")

    async def ping(self) -> None:
        raise ConnectionClosed(1006, "connection lost")

    async def aclose(self, code: int) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_direct_write_that_finds_the_socket_broken_ends_the_connection(
    autojump_clock: Any,
) -> None:
    ws = BrokenOnWrite()
    with pytest.RaisesGroup(ConnectionClosed), trio.fail_after(1):
        async with Connection.open(ws, 8, close_timeout=1) as conn:  # type: ignore[arg-type]
            conn.push("frame")
            assert ws.broken and not conn.outbox
            await trio.sleep_forever()  # the pump's flush raises: the connection ends


async def test_a_ping_on_a_broken_socket_ends_the_connection(autojump_clock: Any) -> None:
    ws = BrokenOnWrite()
    ws.broken = True
    reached = False
    with trio.fail_after(1):
        async with Connection.open(ws, 8, close_timeout=1) as conn:  # type: ignore[arg-type]
            keepalive = Keepalive(conn, Timers(), interval=20.0, patience=20.0)
            await keepalive.ping()
            await trio.sleep_forever()  # cancelled: the ping found the socket broken
        reached = True
    assert reached


async def test_a_client_that_stops_reading_is_cut_after_the_write_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Real sockets: the kernel's buffers fill, then the write waits; with the clock
    # jumping, exactly write_timeout_s later the connection is cut and the session
    # detaches. Was: a write waited for as long as the client did not read (the pings
    # behind it bounded it only at ping_interval + ping_timeout).
    async with real_server(
        write_timeout_s=7.0, ping_interval_s=1000.0, journal_max_bytes=64 << 20
    ) as (server, port, factory):
        client = await open_session(port)
        engine = factory.last
        await engine.started.wait()
        (session,) = server.sessions.registry.sessions.values()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:

                async def produce() -> None:
                    for i in range(400):  # 100 MB: far more than any socket buffer
                        await engine.emit(f"{i:03d}:" + "y" * 250_000)
                    await trio.sleep_forever()

                start = trio.current_time()
                nursery.start_soon(produce)
                while session.state.value != "detached":
                    await server.wait_changed()
                assert trio.current_time() - start == 7.0  # the clock only jumps at the wait
                nursery.cancel_scope.cancel()
        await client.stream.aclose()


def _client_frame(data: bytes, opcode: int = 1) -> bytes:
    """One masked client frame (the reader's input), mask 0: the payload as it is."""
    n = len(data)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + bytes(4) + data


async def test_the_reader_reads_a_socket_when_it_is_readable_whole_and_in_order() -> None:
    # The socket's own path (os.read once readable; at once after a full read): many
    # messages in one write, one message over many full reads, then the peer's end.
    ours, theirs = trio.socket.socketpair()
    ws = WebSocket(trio.SocketStream(ours), max_message_bytes=1 << 22)
    peer = trio.SocketStream(theirs)
    small = [f"m{i}".encode() for i in range(300)]
    big = bytes(range(256)) * 4096  # 1 MiB: 16 full reads and more
    got: list[str | bytes] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                await peer.send_all(b"".join(_client_frame(m) for m in small))
                await peer.send_all(_client_frame(big, opcode=2))
                await peer.send_eof()

            nursery.start_soon(write)
            with pytest.raises(ConnectionClosed):
                while True:
                    got.append(await ws.get_message())
    assert got == [m.decode() for m in small] + [big]
    await peer.aclose()
    await ws.stream.aclose()


async def test_a_reader_waiting_on_a_socket_closed_under_it_sees_the_connection_end() -> None:
    ours, theirs = trio.socket.socketpair()
    ws = WebSocket(trio.SocketStream(ours), max_message_bytes=1 << 20)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def close_it() -> None:
                await trio.testing.wait_all_tasks_blocked()
                await ws.stream.aclose()  # the reader waits for readable meanwhile

            nursery.start_soon(close_it)
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        with pytest.raises(ConnectionClosed):  # and once closed, at once
            await ws.get_message()
    theirs.close()
