"""trio_duplex.engines.api: the engine's handle on its session, without a server."""

from __future__ import annotations

import math

import pytest
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


# -- consumption reports (protocol v2, core/flow.py) -------------------------------------


def reporting_inbox(bound: int, max_bytes: float) -> tuple[Inbox, list[tuple[object, bool]]]:
    reports: list[tuple[object, bool]] = []

    def on_report(event: Event | None, drained: bool) -> bool:
        reports.append((None if event is None else event["client_event_seq"], drained))
        return True

    return Inbox(bound, max_bytes, on_report), reports


def test_the_inbox_reports_every_half_bound_of_events_taken() -> None:
    inbox, reports = reporting_inbox(8, math.inf)
    for seq in range(1, 9):
        inbox.put_nowait({"client_event_seq": seq}, 10)
    for _ in range(8):
        inbox.get_nowait()
    assert reports == [(4, False), (8, True)]


def test_the_inbox_reports_every_half_bound_of_bytes_and_takes_while_under_it() -> None:
    inbox, reports = reporting_inbox(256, 10_000)
    for seq in range(1, 4):  # 3 x 4,000: the third is taken, with 8,000 queued (< 10,000)
        inbox.put_nowait({"client_event_seq": seq}, 4000)
    with pytest.raises(trio.WouldBlock):
        inbox.put_nowait({"client_event_seq": 4}, 1)  # 12,000 queued: full
    for _ in range(3):
        inbox.get_nowait()
    assert reports == [(2, False)]  # 8,000 >= 5,000 once the second is taken


def test_small_events_are_counted_in_bytes_when_the_bound_needs_it() -> None:
    # 64 events under 100 bytes each: the flow argument needs events of B // N = 62
    # bytes or more counted, though 4,096 is the usual threshold.
    inbox, reports = reporting_inbox(64, 4000)
    for seq in range(1, 31):
        inbox.put_nowait({"client_event_seq": seq}, 100)
    for _ in range(30):
        inbox.get_nowait()
    assert reports == [(20, False)]  # 2,000 bytes by the 20th; 10 more are not a report


def test_refusals_behind_queued_events_count_once_those_are_taken() -> None:
    inbox, reports = reporting_inbox(2, math.inf)  # a report per event consumed
    inbox.refused(10)  # nothing queued: consumed now
    assert reports == [(None, True)]
    inbox.put_nowait({"client_event_seq": 2}, 10)
    inbox.refused(10)  # behind 2
    assert reports == [(None, True)]
    inbox.get_nowait()
    assert reports == [(None, True), (2, True)]
    with pytest.raises(trio.WouldBlock):
        inbox.get_nowait()  # the engine waits: what was refused behind counts now
    assert reports == [(None, True), (2, True), (None, True)]
