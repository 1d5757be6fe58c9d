"""trio_duplex.engines.api: the engine's handle on its session, without a server."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from trio_duplex import _pace
from trio_duplex._pace import EVERY, Pace
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


# -- batches: receive_batch and send_many ----------------------------------------------


def text_events(n: int) -> list[Event]:
    return [{"type": "input.text.append", "text": str(i)} for i in range(n)]


async def test_a_batch_takes_what_is_queued_up_to_its_limit_in_order() -> None:
    inbox = Inbox(64)
    for event in text_events(20):
        inbox.put_nowait(event)
    session = handle(inbox)
    first = await session.receive_batch(limit=8)
    rest = await session.receive_batch()  # EVERY: 16, and 12 are left
    assert [e["text"] for e in first] == [str(i) for i in range(8)]
    assert [e["text"] for e in rest] == [str(i) for i in range(8, 20)]
    assert len(inbox) == 0
    with pytest.raises(ValueError, match="at least one"):
        await session.receive_batch(limit=0)


async def test_a_batch_waits_for_its_first_event() -> None:
    inbox = Inbox(8)
    session = handle(inbox)
    batches: list[list[Event]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _collect(session, batches))
        await trio.testing.wait_all_tasks_blocked()
        assert batches == []
        for event in text_events(3):  # all three queued before the engine runs again
            inbox.put_nowait(event)
    assert [[e["text"] for e in batch] for batch in batches] == [["0", "1", "2"]]


async def _collect(session: EngineSession, batches: list[list[Event]]) -> None:
    batches.append(await session.receive_batch())


async def test_a_cancelled_batch_takes_no_event() -> None:
    inbox = Inbox(8)
    for event in text_events(3):
        inbox.put_nowait(event)
    session = handle(inbox)
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.receive_batch()
    assert scope.cancelled_caught
    assert len(inbox) == 3
    assert len(await session.receive_batch()) == 3


async def test_a_cancelled_wait_for_a_batch_takes_no_event() -> None:
    inbox = Inbox(8)
    session = handle(inbox)
    with trio.move_on_after(1) as scope:
        await session.receive_batch()
    assert scope.cancelled_caught
    inbox.put_nowait({"type": "input.text.append", "text": "later"})
    assert (await session.receive_batch())[0]["text"] == "later"


async def test_a_batch_ends_before_a_session_update_which_is_applied_and_answered() -> None:
    inbox = Inbox(8)
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    session = EngineSession("sess_test", {}, inbox, emit)
    update = {"type": "session.update", "session": {"instructions": "x"}}
    for event in [*text_events(2), update, *text_events(1)]:
        inbox.put_nowait(event)
    assert len(await session.receive_batch()) == 2
    assert sent == []
    after = await session.receive_batch()  # the update is applied, then the batch after it
    assert [e["text"] for e in after] == ["0"]
    assert session.config == {"instructions": "x"}
    assert [e["type"] for e in sent] == ["session.updated"]
    inbox.put_nowait(dict(update))
    inbox.put_nowait(text_events(1)[0])
    assert await session.receive_batch(updates=True) == [update]  # alone


async def test_an_ended_input_ends_a_batch_wait() -> None:
    inbox = Inbox(8)
    inbox.put_nowait(text_events(1)[0])
    inbox.close()
    session = handle(inbox)
    assert len(await session.receive_batch()) == 1
    with pytest.raises(trio.EndOfChannel):
        await session.receive_batch()


async def test_batches_of_queued_events_let_other_tasks_run_between_them() -> None:
    inbox = Inbox(8 * EVERY)
    for event in text_events(8 * EVERY):
        inbox.put_nowait(event)
    session = EngineSession("sess_test", {}, inbox, _no_emit, Pace(2 * EVERY))
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    rounds = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        start = ran
        for _ in range(8):
            assert len(await session.receive_batch()) == EVERY
            rounds.append(ran - start)
        nursery.cancel_scope.cancel()
    # A scheduler round before every other batch (2 * EVERY events in all), none within.
    assert rounds[0] == 0
    assert rounds[-1] >= 2  # (3 rounds: the last may not have let it run yet)


async def test_send_many_checks_every_event_before_it_sends_any() -> None:
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    session = EngineSession("sess_test", {}, Inbox(1), emit)
    with pytest.raises(ValueError, match=r"session\.created"):
        await session.send_many([*text_events(2), {"type": "session.created"}])
    assert sent == []
    await session.send_many(text_events(3))  # outside a server: each in turn
    assert [e["text"] for e in sent] == ["0", "1", "2"]
    await session.send_many([])


async def test_send_many_hands_the_batch_to_the_server_whole() -> None:
    batches: list[list[Event]] = []

    async def emit_many(events: list[Event]) -> None:
        batches.append(events)

    session = EngineSession("sess_test", {}, Inbox(1), _no_emit, emit_many=emit_many)
    await session.send_many(tuple(text_events(3)))
    assert [[e["text"] for e in batch] for batch in batches] == [["0", "1", "2"]]


# -- Pace's batch steps --------------------------------------------------------------------


async def test_pace_counts_a_batch_and_yields_before_one_that_would_go_past_its_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = 0
    checkpoint = _pace._cancel_shielded_checkpoint

    async def counted() -> None:
        nonlocal rounds
        rounds += 1
        await checkpoint()

    monkeypatch.setattr(_pace, "_cancel_shielded_checkpoint", counted)
    pace = Pace(8)
    await pace.step_many(8)  # from zero: up to the limit, no round
    assert rounds == 0
    await pace.step_many(1)  # past it: a round first
    assert rounds == 1
    pace.count(7)  # 8: the next batch of any size has a round first
    await pace.step_many(1)
    assert rounds == 2
    assert not pace.due() and rounds == 2  # 2 of 8
    for _ in range(5):
        assert not pace.due()
    assert pace.due()  # the 8th
    with trio.CancelScope() as scope:
        scope.cancel()
        await pace.step_many(1)
    assert scope.cancelled_caught


async def test_the_inbox_has_one_receiver_woken_by_a_put_or_the_close() -> None:
    inbox = Inbox(8)
    got: list[object] = []

    async def receive() -> None:
        try:
            got.append((await inbox.get())["text"])
        except trio.EndOfChannel:
            got.append("ended")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await inbox.get()  # a second receiver while one waits
        inbox.put_nowait({"type": "input.text.append", "text": "woken"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        inbox.close()
    assert got == ["woken", "ended"]
    with trio.move_on_after(1):  # a cancelled wait leaves no receiver behind
        await Inbox(1).get()


def test_a_batch_is_counted_as_its_events_and_reported_once_after_the_last() -> None:
    inbox, reports = reporting_inbox(16, 100_000)
    for seq in range(1, 11):  # 5,000 bytes each: counted (past 4,096)
        inbox.put_nowait({"type": "e", "client_event_seq": seq}, 5000)
    inbox.put_nowait({"type": "session.update", "session": {}, "client_event_seq": 11}, 10)
    batch = [inbox.get_nowait()]  # 1 of 8 events to a report, 5,000 of 50,000 bytes
    inbox.get_batch(batch, 6)
    assert [e["client_event_seq"] for e in batch] == [1, 2, 3, 4, 5, 6]
    assert reports == []  # 6 events, 30,000 bytes: no step reached
    assert inbox.queued_bytes == 20_000
    batch = [inbox.get_nowait()]
    inbox.get_batch(batch, 16)  # to the update, which stays queued
    assert [e["client_event_seq"] for e in batch] == [7, 8, 9, 10]
    assert reports == [(10, False)]  # 10 events: one report, naming the last
    assert inbox.queued_bytes == 0 and len(inbox) == 1
