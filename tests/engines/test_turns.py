"""The turn loop the voice and speech engines share (``engines/turns.py``), on its own:
a fake response whose speaking is whatever each test makes it, under the mock clock."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from trio_duplex.engines.api import EngineSession, Event, Inbox
from trio_duplex.engines.turns import (
    Turns,
    send_end,
    send_live,
    speak_unless_cancelled,
)


@attrs.define(eq=False)
class Reply:
    response_id: str
    turn: str
    cancelled: bool = False
    finished: bool = False
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    cancel_reason: str | None = None


def new_turns() -> Turns[str, Reply]:
    return Turns[str, Reply](Reply)


@attrs.define
class Recorder:
    """A ``respond`` that logs each response's start and end and speaks until released."""

    log: list[str] = attrs.Factory(list)
    release: trio.Event = attrs.Factory(trio.Event)
    hold: bool = True

    async def respond(self, reply: Reply) -> None:
        self.log.append(f"start {reply.response_id} {reply.turn}")
        if self.hold:
            await speak_unless_cancelled(reply, self.release.wait)
        self.log.append(f"end {reply.response_id} {'cancelled' if reply.cancelled else 'done'}")
        reply.finished = True


def session_for(inbox: Inbox, sent: list[Event] | None = None) -> EngineSession:
    async def emit(event: Event) -> None:
        if sent is not None:
            sent.append(event)

    return EngineSession("sess_test", {}, inbox=inbox, emit=emit)


async def test_turns_are_answered_in_order_one_at_a_time() -> None:
    turns, recorder = new_turns(), Recorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.speak, recorder.respond)
        for turn in ("a", "b", "c"):
            turns.put(turn)
        await trio.testing.wait_all_tasks_blocked()
        # The first is speaking; the others wait, with no id yet.
        assert recorder.log == ["start resp_1 a"]
        assert list(turns.queued) == ["b", "c"] and turns.responses == 1
        for _ in range(3):
            recorder.release.set()
            recorder.release = trio.Event()
            await trio.testing.wait_all_tasks_blocked()
        turns.end_input()
    assert recorder.log == [
        "start resp_1 a", "end resp_1 done",
        "start resp_2 b", "end resp_2 done",
        "start resp_3 c", "end resp_3 done",
    ]  # fmt: skip
    assert turns.speaking is None and turns.responses == 3


async def test_the_speaker_waits_for_a_turn_and_ends_only_once_input_has() -> None:
    turns, recorder = new_turns(), Recorder(hold=False)
    done = trio.Event()

    async def speak() -> None:
        await turns.speak(recorder.respond)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(speak)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and recorder.log == []  # no turn: it waits
        turns.put("a")
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.log == ["start resp_1 a", "end resp_1 done"] and not done.is_set()
        turns.end_input()
        await trio.testing.wait_all_tasks_blocked()
        assert done.is_set()


async def test_turns_queued_when_input_ends_are_still_answered() -> None:
    turns, recorder = new_turns(), Recorder(hold=False)
    turns.put("a")
    turns.put("b")
    turns.end_input()
    await turns.speak(recorder.respond)
    assert recorder.log == [
        "start resp_1 a", "end resp_1 done", "start resp_2 b", "end resp_2 done"
    ]  # fmt: skip


async def test_a_restored_response_is_spoken_first_and_ids_go_on_from_the_count() -> None:
    turns, recorder = new_turns(), Recorder(hold=False)
    turns.speaking = Reply("resp_7", "restored")
    turns.responses = 7
    turns.put("next")
    turns.end_input()
    await turns.speak(recorder.respond)
    assert recorder.log == [
        "start resp_7 restored", "end resp_7 done", "start resp_8 next", "end resp_8 done"
    ]  # fmt: skip


@pytest.mark.parametrize("response_id", [None, "resp_1"])
async def test_a_cancel_of_none_or_the_speaking_id_stops_it_at_once(
    response_id: str | None,
) -> None:
    turns, recorder = new_turns(), Recorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.speak, recorder.respond)
        turns.put("a")
        turns.put("b")
        await trio.testing.wait_all_tasks_blocked()
        speaking = turns.speaking
        assert speaking is not None
        turns.cancel(response_id)
        # Synchronous: marked and its scope cancelled before any other task runs.
        assert speaking.cancelled and speaking.scope.cancel_called
        await trio.testing.wait_all_tasks_blocked()
        # Only the one speaking: the queued turn follows, and speaks until released.
        assert recorder.log == ["start resp_1 a", "end resp_1 cancelled", "start resp_2 b"]
        recorder.release.set()
        turns.end_input()
    assert recorder.log[-1] == "end resp_2 done"


async def test_a_cancel_naming_another_response_or_with_none_speaking_is_ignored() -> None:
    turns, recorder = new_turns(), Recorder()
    turns.cancel(None)  # nothing speaking: nothing to mark, and no error
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.speak, recorder.respond)
        turns.put("a")
        await trio.testing.wait_all_tasks_blocked()
        speaking = turns.speaking
        assert speaking is not None
        turns.cancel("resp_0")  # a stale id
        turns.cancel("resp_2")  # not started yet
        assert not speaking.cancelled and not speaking.scope.cancel_called
        recorder.release.set()
        turns.end_input()
    assert recorder.log == ["start resp_1 a", "end resp_1 done"]


async def test_a_cancel_after_the_response_finished_is_ignored() -> None:
    turns = new_turns()
    finished = Reply("resp_1", "a", finished=True)  # only its end is left to send
    turns.speaking = finished
    turns.cancel(None)
    turns.cancel("resp_1")
    assert not finished.cancelled and not finished.scope.cancel_called


async def test_a_response_cancelled_before_it_speaks_never_speaks() -> None:
    reply = Reply("resp_1", "a", cancelled=True)
    spoke: list[bool] = []

    async def speak() -> None:
        spoke.append(True)
        await trio.lowlevel.checkpoint()

    await speak_unless_cancelled(reply, speak)
    assert spoke == []
    await speak_unless_cancelled(Reply("resp_2", "b"), speak)
    assert spoke == [True]


async def test_send_live_sends_nothing_once_the_response_is_cancelled() -> None:
    sent: list[Event] = []
    session = session_for(Inbox(10), sent)
    reply = Reply("resp_1", "a")
    with reply.scope:
        await send_live(session, {"type": "response.output_audio.delta", "n": 1})
        # A cancel read while this task was runnable (woken by its deadline): the next
        # send must not go out, although the task resumes without a checkpoint.
        reply.scope.cancel()
        await send_live(session, {"type": "response.output_audio.delta", "n": 2})
        pytest.fail("send_live returned after the cancel")  # pragma: no cover
    assert [event["n"] for event in sent] == [1]


@pytest.mark.parametrize(("cancelled", "ending"), [(False, "done"), (True, "cancelled")])
async def test_send_end_sends_the_one_end(cancelled: bool, ending: str) -> None:
    sent: list[Event] = []
    await send_end(session_for(Inbox(10), sent), Reply("resp_3", "a", cancelled=cancelled))
    assert sent == [{"type": f"response.{ending}", "response_id": "resp_3"}]


async def test_a_barge_in_s_cancel_says_why_in_its_end() -> None:
    turns = new_turns()
    reply = turns.speaking = Reply("resp_4", "a")
    turns.cancel(None, "turn_detected")
    assert reply.cancelled and reply.scope.cancel_called
    sent: list[Event] = []
    await send_end(session_for(Inbox(10), sent), reply)
    assert sent == [
        {"type": "response.cancelled", "response_id": "resp_4", "reason": "turn_detected"}
    ]


async def test_the_reader_reads_nothing_while_full_and_a_start_makes_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    inbox = Inbox(10)
    session = session_for(inbox)
    turns, recorder = new_turns(), Recorder()
    taken: list[str] = []

    async def take(event: Event) -> None:
        taken.append(event["text"])
        await trio.lowlevel.checkpoint()
        turns.put(event["text"])

    def full() -> bool:
        return len(turns.queued) > 1  # one turn over the limit may be held

    for text in ("a", "b", "c", "d"):
        inbox.put_nowait({"type": "input.text.append", "text": text})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turns.read, session, take, full)
        await trio.testing.wait_all_tasks_blocked()
        assert taken == ["a", "b"] and len(inbox) == 2  # full: it reads no more
        await trio.sleep(10)
        assert taken == ["a", "b"]  # it waits for room, not for time
        nursery.start_soon(turns.speak, recorder.respond)  # starting "a" makes room
        await trio.testing.wait_all_tasks_blocked()
        assert taken == ["a", "b", "c"] and recorder.log == ["start resp_1 a"]
        recorder.release.set()
        recorder.release = trio.Event()
        await trio.testing.wait_all_tasks_blocked()
        assert taken == ["a", "b", "c", "d"]
        assert not turns.input_ended
        inbox.close()  # input ends: the reader returns, the speaker answers the rest
        recorder.hold = False
        recorder.release.set()
    assert turns.input_ended
    assert [line for line in recorder.log if line.startswith("end")] == [
        f"end resp_{n} done" for n in range(1, 5)
    ]


async def test_wait_room_looks_again_at_each_make_room() -> None:
    turns = new_turns()
    room = [False]
    through = trio.Event()

    async def wait() -> None:
        await turns.wait_room(lambda: not room[0])
        through.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        turns.make_room()  # woken, still full: it waits again
        await trio.testing.wait_all_tasks_blocked()
        assert not through.is_set()
        room[0] = True
        await trio.testing.wait_all_tasks_blocked()
        assert not through.is_set()  # room, but nobody said so
        turns.make_room()
        await trio.testing.wait_all_tasks_blocked()
        assert through.is_set()


async def test_every_waiter_for_room_is_woken(autojump_clock: trio.testing.MockClock) -> None:
    # The speech engine's reader and listener can both wait for room at once.
    turns = new_turns()
    turns.put("a")
    woken: list[int] = []

    async def wait(n: int) -> None:
        await turns.wait_room(lambda: bool(turns.queued))
        woken.append(n)

    recorder = Recorder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 1)
        nursery.start_soon(wait, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        nursery.start_soon(turns.speak, recorder.respond)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken) == [1, 2]
        recorder.release.set()
        turns.end_input()
