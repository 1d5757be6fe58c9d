"""trio_duplex.engines.api: the engine's handle on its session, without a server."""

from __future__ import annotations

import trio

from trio_duplex._pace import EVERY
from trio_duplex.engines.api import EngineSession, Event, Inbox


async def _no_emit(event: Event) -> None:
    raise AssertionError(f"nothing should be sent here: {event}")


def handle(inbox: Inbox) -> EngineSession:
    return EngineSession("sess_test", {}, inbox, _no_emit)


async def test_a_cancelled_receive_takes_no_event() -> None:
    inbox = Inbox(8)
    inbox.put_nowait({"type": "input.text.append", "text": "kept"})
    session = handle(inbox)
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.receive()
    assert scope.cancelled_caught
    assert len(inbox) == 1
    assert (await session.receive())["text"] == "kept"


async def test_queued_events_are_taken_with_a_scheduler_round_every_few() -> None:
    inbox = Inbox(4 * EVERY)
    for i in range(3 * EVERY):
        inbox.put_nowait({"type": "e", "i": i})
    session = handle(inbox)
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    rounds = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()  # it has started
        start = ran
        for _ in range(3 * EVERY):
            await session.receive()
            rounds.append(ran - start)
        nursery.cancel_scope.cancel()
    # The other task ran only at every EVERY-th event (once or twice per yield, as trio
    # orders the batch): a burst, not a task switch per event.
    assert rounds[EVERY - 2] == 0
    assert 2 <= rounds[-1] <= 2 * 3
