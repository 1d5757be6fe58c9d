"""``Connection.open``'s ``async with``: however its block ends, the WebSocket is closed
once, with the code that ending calls for, within the close timeout."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_duplex.server.sessions.connection import Connection


class Closing:
    """What the lifetime does to its WebSocket: the codes it closed with."""

    def __init__(self, hang: bool = False) -> None:
        self.codes: list[int] = []
        self.hang = hang

    async def aclose(self, code: int) -> None:
        self.codes.append(code)
        if self.hang:  # a peer that never answers the close
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()


def opened(ws: Closing, close_timeout: float = 1.0) -> Any:
    return Connection.open(ws, 8, close_timeout=close_timeout)  # type: ignore[arg-type]


async def test_a_block_that_returns_closes_with_going_away() -> None:
    ws = Closing()
    async with opened(ws) as conn:
        assert isinstance(conn, Connection) and id(conn.ws) == id(ws)
    assert ws.codes == [1001]


async def test_an_error_of_ours_in_the_block_closes_with_1011_and_is_raised() -> None:
    ws = Closing()
    with pytest.RaisesGroup(ValueError):
        async with opened(ws):
            raise ValueError("ours")
    assert ws.codes == [1011]


async def test_an_error_in_one_of_its_tasks_closes_with_1011() -> None:
    ws = Closing()

    async def fails() -> None:
        raise RuntimeError("the pump's")

    with pytest.RaisesGroup(RuntimeError):
        async with opened(ws) as conn:
            assert conn._nursery is not None
            conn._nursery.start_soon(fails)
            await trio.sleep_forever()
    assert ws.codes == [1011]


async def test_a_cancelled_block_closes_with_going_away() -> None:
    ws = Closing()
    with trio.CancelScope() as scope:
        async with opened(ws):
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught and ws.codes == [1001]


async def test_a_close_code_set_in_the_block_wins_even_over_an_error() -> None:
    ws = Closing()
    with pytest.RaisesGroup(ValueError):
        async with opened(ws) as conn:
            conn.close_code = 4000
            raise ValueError("after the code was set")
    assert ws.codes == [4000]


async def test_nothing_starts_in_the_nursery_once_the_block_has_ended() -> None:
    ws = Closing()
    async with opened(ws) as conn:
        pass
    assert conn._nursery is None
    conn.start_pump()  # (a late frame: nothing to start it in, no error)
    assert ws.codes == [1001]


async def test_a_peer_that_never_answers_the_close_is_left_at_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ws = Closing(hang=True)
    start = trio.current_time()
    async with opened(ws, close_timeout=3.0):
        pass
    assert ws.codes == [1001] and trio.current_time() - start == pytest.approx(3.0)
