"""``ClientSession`` against a scripted WebSocket server in memory (trio-websocket on
``trio_duplex.testing``'s ``MemoryListener``, virtual time): each connection runs a
script, for the answers a correct server never gives or gives only in a race (overlapping
replays, lost ``session.resumed``, a bare close 4001, a first frame that is not an
event). Also the client's filter of a benign websockets log record.
"""

from __future__ import annotations

import logging

import pytest
import trio
from trio_websocket import WebSocketConnection

from trio_duplex.client import ProtocolViolation, ResumeRefused, ServerRefused, connect, transport

from .helpers import FAST, URL, created, out, resumed
from .scripted import receive_json, scripted_server, send_json


async def test_a_replay_that_overlaps_is_deduplicated(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            assert first["type"] == "session.update"
            await send_json(ws, created(), out(1), out(2), out(3))
            return  # the connection ends: the client resumes
        assert first["last_received_server_event_seq"] == 3
        await send_json(ws, resumed(0), out(2), out(3), out(4), {"type": "session.going_away"})
        await send_json(ws, out(4), out(5), {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            events = [event async for event in session]
    assert [e.get("server_event_seq", e["type"]) for e in events] == [
        1,
        2,
        3,
        4,
        "session.going_away",
        5,
        "session.closed",
    ]
    assert session.duplicates_dropped == 3


async def test_a_resume_conflict_is_retried(autojump_clock: trio.abc.Clock) -> None:
    tokens: list[str] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        tokens.append(first["resume_token"])
        if n == 1:
            conflict = {"type": "error", "code": "session_resume_conflict", "retryable": True}
            await send_json(ws, {**conflict, "message": "busy"})
            await ws.aclose(4001)
            return
        await send_json(ws, resumed(0), {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            assert [e["type"] async for e in session] == ["session.closed"]
    assert tokens == ["secret-1", "secret-1"]


async def test_a_lost_session_resumed_is_retried_with_the_same_token(
    autojump_clock: trio.abc.Clock,
) -> None:
    tokens: list[str] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        tokens.append(first["resume_token"])
        if n == 1:
            return  # processed, but session.resumed never arrives
        await send_json(ws, resumed(0, generation=3))
        await send_json(ws, {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            assert [e["type"] async for e in session] == ["session.closed"]
            assert session.generation == 3
    assert tokens == ["secret-1", "secret-1"]


async def test_close_4001_without_an_error_is_terminal(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        await ws.aclose(4001)

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            with pytest.raises(ResumeRefused) as caught:
                await session.receive()
    assert caught.value.close_code == 4001


async def test_a_first_frame_that_is_not_an_event_is_a_violation(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await ws.send_message("hello")

    async with scripted_server(script) as open_stream:
        with pytest.raises(ProtocolViolation):
            async with connect(URL, open_stream=open_stream, options=FAST):
                raise AssertionError("not reached")


async def test_a_refused_open_is_raised_at_connect(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await send_json(
            ws, {"type": "error", "code": "bad_event", "message": "no", "retryable": False}
        )
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        with pytest.raises(ServerRefused) as caught:
            async with connect(URL, open_stream=open_stream, options=FAST):
                raise AssertionError("not reached")
    assert caught.value.code == "bad_event" and not caught.value.retryable


class StuckReads(trio.abc.Stream):
    """A client stream to a peer wedged for good once ``stuck``: nothing more arrives,
    and once the client has tried to close it, nothing more it sends is taken (as with a
    dead NAT, or a proxy that stopped forwarding while the socket's buffers are full):
    websockets' closing handshake then waits on a send that never completes."""

    def __init__(self, inner: trio.abc.Stream, *, sends_stop: str) -> None:
        self.inner = inner
        self.stuck = False
        self.closing = sends_stop == "at_once"

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.stuck:
            await trio.sleep_forever()
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.stuck and self.closing:
            await trio.sleep_forever()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self.closing = True
        if not self.stuck:
            await self.inner.aclose()


@pytest.mark.parametrize("sends_stop", ["on_close", "at_once"])
async def test_a_wedged_connection_is_left_within_the_heartbeat_and_close_timeouts(
    autojump_clock: trio.abc.Clock, sends_stop: str
) -> None:
    """The heartbeat finds the connection dead (no ack; or its own send is never taken),
    and leaving it would wait on a send that never completes: the client leaves it within
    ``transport_close_timeout`` and resumes (it hung for good before)."""
    streams: list[StuckReads] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            streams[0].stuck = True  # the client reads session.created, then nothing
            await send_json(ws, created())
            await trio.sleep_forever()  # no heartbeat_ack: the client gives up on it
        await send_json(ws, resumed(0), {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:

        async def opener() -> trio.abc.Stream:
            stream = StuckReads(await open_stream(), sends_stop=sends_stop)
            streams.append(stream)
            return stream

        with trio.fail_after(60):
            async with connect(URL, open_stream=opener, options=FAST) as session:
                start = trio.current_time()
                assert [e["type"] async for e in session] == ["session.closed"]
    # Given up on within a heartbeat's interval and timeout, left within the close timeout.
    took = trio.current_time() - start
    beat, close = FAST.heartbeat, FAST.transport_close_timeout
    assert len(streams) == 2
    assert beat.timeout + close <= took <= beat.interval + beat.timeout + close + 1, took


def test_a_benign_websockets_race_is_not_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # websockets wraps the logger it is given in an adapter of its own, as here.
    logger = logging.LoggerAdapter(transport.WEBSOCKETS_LOG, {"websocket": None})
    try:
        raise EOFError("stream of frames ended")
    except EOFError:
        logger.error("unexpected internal error", exc_info=True)
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        logger.error("unexpected internal error", exc_info=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and errors[0].exc_info[0] is RuntimeError
