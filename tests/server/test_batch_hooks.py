"""The hooks a relay uses to do less per event: ``WebSocket.get_messages`` (what one
read brought, as a batch) and ``Connection.push_frames`` (a server's frames, already
encoded, passed on as they are), in memory: no sleeps, nothing timed."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_duplex.core.frames import Opcode, close_frame, text_frame
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.server.sessions.websocket import ConnectionClosed, WebSocket


def masked(opcode: int, payload: bytes) -> bytes:
    """A client's frame (masked, with a zero key), payload under 126 bytes."""
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\x00" * 4 + payload


async def test_get_messages_gives_what_one_read_brought_and_holds_a_split_frame() -> None:
    client, server = trio.testing.memory_stream_pair()
    ws = WebSocket(server, 1 << 16)
    frames = [masked(Opcode.TEXT, f"m{i}".encode()) for i in range(5)]
    await client.send_all(b"".join(frames) + frames[0][:3])  # five, and part of one
    assert await ws.get_messages() == ["m0", "m1", "m2", "m3", "m4"]
    await client.send_all(frames[0][3:] + masked(Opcode.BINARY, b"\x00\x01"))
    assert await ws.get_messages() == ["m0", b"\x00\x01"]


async def test_get_messages_gives_what_get_message_left_first() -> None:
    client, server = trio.testing.memory_stream_pair()
    ws = WebSocket(server, 1 << 16)
    await client.send_all(b"".join(masked(Opcode.TEXT, f"m{i}".encode()) for i in range(3)))
    assert await ws.get_message() == "m0"
    assert await ws.get_messages() == ["m1", "m2"]


async def test_get_messages_answers_a_ping_and_ends_at_the_close() -> None:
    client, server = trio.testing.memory_stream_pair()
    ws = WebSocket(server, 1 << 16)
    ping = bytes((0x80 | Opcode.PING, 0x82)) + b"\x00" * 4 + b"hi"
    close = bytes((0x80 | Opcode.CLOSE, 0x82)) + b"\x00" * 4 + (1000).to_bytes(2, "big")
    await client.send_all(masked(Opcode.TEXT, b"a") + ping + masked(Opcode.TEXT, b"b") + close)
    assert await ws.get_messages() == ["a", "b"]
    with pytest.raises(ConnectionClosed) as closed:
        await ws.get_messages()
    assert closed.value.code == 1000
    answers = await client.receive_some(1000)
    assert answers == bytes((0x80 | Opcode.PONG, 2)) + b"hi" + close_frame(1000)


async def _collect(stream: trio.abc.Stream, into: bytearray) -> None:
    while data := await stream.receive_some(65536):
        into.extend(data)


async def test_pushed_frames_go_out_as_they_are_in_order_with_pushed_messages() -> None:
    client, server = trio.testing.memory_stream_pair()
    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, client, got)
        ws = WebSocket(server, 1 << 16)
        async with Connection.open(ws, 8, close_timeout=1.0) as conn:
            raw = text_frame("x") + text_frame("y")
            conn.push("before")
            conn.push_frames(raw, 2)
            conn.push("after")
            conn.finish([], 1000)
            await conn.send_rest()
        await trio.testing.wait_all_tasks_blocked()
        assert bytes(got).startswith(text_frame("before") + raw + text_frame("after"))
        nursery.cancel_scope.cancel()


async def test_pushed_frames_count_each_frame_towards_congestion_and_drain() -> None:
    client, server = trio.testing.lockstep_stream_pair()  # a client that reads only when told
    async with trio.open_nursery() as nursery:
        ws = WebSocket(server, 1 << 16)
        async with Connection.open(ws, 8, close_timeout=0.0, max_output_bytes=1 << 20) as conn:
            frame = text_frame("e")
            conn.push_frames(frame, 1)  # the pump takes it and waits on the client
            await trio.testing.wait_all_tasks_blocked()
            conn.push_frames(frame * 9, 9)  # one item, nine frames: past the high water
            assert conn.congested and conn.room()[0] == 8 - 9
            drained = trio.Event()

            async def wait() -> None:
                await conn.wait_drained()
                drained.set()

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not drained.is_set()
            got = bytearray()
            while len(got) < 10 * len(frame):
                got.extend(await client.receive_some(1 << 16))
            await trio.testing.wait_all_tasks_blocked()
            assert drained.is_set() and not conn.congested and conn.bundled == 0
            assert got == frame * 10
            conn.lost()
        nursery.cancel_scope.cancel()


async def test_pushed_frames_past_the_output_bound_cut_the_connection() -> None:
    _client, server = trio.testing.lockstep_stream_pair()
    ws = WebSocket(server, 1 << 16)
    async with Connection.open(ws, 8, close_timeout=0.0, max_output_bytes=1000) as conn:
        conn.push_frames(b"\x82\x7e\x02\x58" + b"\x00" * 600, 1)  # the pump waits with it
        await trio.testing.wait_all_tasks_blocked()
        conn.push_frames(b"\x82\x7e\x02\x58" + b"\x00" * 600, 1)
        assert conn.close_code is None and conn.queued == 604
        conn.push_frames(b"\x82\x7e\x02\x58" + b"\x00" * 600, 1)  # past the bound
        assert conn.close_code == 4003 and not conn.outbox
        await conn.send_rest()  # cut at once: it does not wait on the client
