"""``SessionState``, the client's protocol state machine, alone: no I/O, no clock, no
trio. Frames are taken from ``next_frame`` and server events fed to ``on_event`` by hand,
time is passed in as ``now``; the last test drives it against a model server through
random cuts (hypothesis). Also the reconnect policy's backoff, which is pure too.
"""

from __future__ import annotations

import json
import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.client import (
    AckPolicy,
    Attached,
    EventTooLarge,
    HeartbeatPolicy,
    ProtocolViolation,
    ReconnectPolicy,
    ResumeState,
    SessionState,
    Verdict,
)
from trio_duplex.client.state import Phase

from .helpers import CUT_PLANS, Event, ModelJournal, Wire, created, resumed, text


def native_opening(state: SessionState) -> str:
    """The opening frame of a native session (which always has one)."""
    frame = state.opening_frame()
    assert frame is not None
    return frame


def opened(acks: AckPolicy | None = None, heartbeat: HeartbeatPolicy | None = None) -> SessionState:
    """A state machine attached by ``created()``, after checking its opening frame."""
    state = SessionState({"voice": "x"}, acks or AckPolicy(), heartbeat or HeartbeatPolicy())
    assert json.loads(native_opening(state)) == {
        "type": "session.update",
        "session": {"voice": "x"},
    }
    state.on_handshake(created(), now=0.0)
    # Nothing queued: the first frame is a heartbeat that says we hold the credentials.
    hello = state.next_frame(0.0)
    assert isinstance(hello, str) and json.loads(hello) == {"type": "session.heartbeat"}
    state.on_event({"type": "session.heartbeat_ack", "session_id": "s"}, 40, now=0.0)
    return state


def test_a_new_sessions_first_frame_speaks_and_a_queued_event_is_enough() -> None:
    """The server keeps a session whose client never spoke after session.created only
    for the unconfirmed grace: a client that got it speaks at once."""
    state = SessionState({})
    state.on_handshake(created(), now=0.0)
    assert drain(state) == [{"type": "session.heartbeat"}]
    assert drain(state) == []  # once
    queued = SessionState({})
    queued.enqueue(text("first"))
    queued.on_handshake(created(), now=0.0)
    assert [f["type"] for f in drain(queued)] == ["input.text.append"]  # no heartbeat needed
    back = SessionState.for_resume(ResumeState("s1", "secret-1", 0))
    back.opening_frame()
    back.on_handshake(resumed(0), now=0.0)
    assert drain(back) == []  # a resume shows the server we hold the token


def drain(state: SessionState, now: float = 0.0) -> list[Event]:
    frames = []
    while (frame := state.next_frame(now)) is not None:
        frames.append(json.loads(frame))
    return frames


def test_send_stamps_seqs_and_refuses_what_the_client_owns() -> None:
    state = opened()
    assert state.enqueue(text("a")) == 1
    assert state.enqueue({"type": "session.update", "session": {}}) == 2  # goes to the engine
    for bad in (
        {"type": "session.close"},
        {"type": "session.heartbeat"},
        {"type": "session.resume"},
        {"type": "session.event_ack", "server_event_seq": 0},
        {**text("b"), "client_event_seq": 9},
        {"text": "no type"},
    ):
        with pytest.raises(ValueError):
            state.enqueue(bad)
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2]
    assert state.next_client_seq == 3


def test_too_large_event_is_refused_before_it_is_queued() -> None:
    state = SessionState({})
    state.opening_frame()
    state.on_handshake(created(max_event_bytes=100), now=0.0)
    with pytest.raises(EventTooLarge) as caught:
        state.enqueue(text("x" * 100))
    assert caught.value.limit == 100
    assert state.next_client_seq == 1 and not state.outbox


def test_resume_resends_exactly_what_the_server_did_not_receive() -> None:
    state = opened()
    for i in range(5):
        state.enqueue(text(str(i)))
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2, 3, 4, 5]
    state.on_event({"type": "x", "server_event_seq": 1}, 10, now=0.0)
    state.on_event({"type": "x", "server_event_seq": 2}, 10, now=0.0)
    resume = json.loads(native_opening(state))
    assert resume == {
        "type": "session.resume",
        "session_id": "s1",
        "resume_token": "secret-1",
        "last_received_server_event_seq": 2,
    }
    change = state.on_handshake(resumed(received=3), now=1.0)
    assert change == Attached("s1", 2, resumed=True, resent=2)
    assert [f["client_event_seq"] for f in drain(state, 1.0)] == [4, 5]
    assert state.resume_token == "secret-2" and state.acked_seq == 2  # the resume acked 2


def test_resume_from_another_process_continues_the_numbering() -> None:
    state = SessionState.for_resume(ResumeState("s1", "secret-1", 7))
    assert json.loads(native_opening(state))["last_received_server_event_seq"] == 7
    state.on_handshake(resumed(received=12), now=0.0)
    assert state.enqueue(text("next")) == 13


def test_events_with_a_seq_are_deduplicated_control_events_are_not() -> None:
    state = opened()
    seen = [
        state.on_event({"type": "x", "server_event_seq": seq}, 10, now=0.0)
        for seq in (1, 2, 2, 1, 3, 5, 4)
    ]
    assert seen == [Verdict.DELIVER] * 2 + [Verdict.DUPLICATE] * 2 + [Verdict.DELIVER] * 2 + [
        Verdict.DUPLICATE
    ]
    resync = {"type": "session.resync_required", "reason": "journal_gap", "dropped_through_seq": 5}
    assert state.on_event(resync, 10, now=0.0) is Verdict.DELIVER
    assert state.on_event(dict(resync), 10, now=0.0) is Verdict.DELIVER
    assert state.on_event({"type": "session.going_away"}, 10, now=0.0) is Verdict.DELIVER
    assert state.on_event({"type": "session.replaced"}, 10, now=0.0) is Verdict.REPLACED
    assert state.on_event({"type": "session.closed"}, 10, now=0.0) is Verdict.END


def test_acks_go_out_by_count_by_bytes_and_by_time() -> None:
    state = opened(acks=AckPolicy(every_events=3, every_bytes=1000, max_delay=0.5))
    for seq in (1, 2):
        state.on_event({"type": "x", "server_event_seq": seq}, 10, now=0.0)
    assert drain(state) == []
    assert state.next_deadline() == 0.5
    state.on_event({"type": "x", "server_event_seq": 3}, 10, now=0.1)
    assert drain(state, 0.1) == [{"type": "session.event_ack", "server_event_seq": 3}]
    state.on_event({"type": "x", "server_event_seq": 4}, 1000, now=0.2)  # bytes
    assert drain(state, 0.2) == [{"type": "session.event_ack", "server_event_seq": 4}]
    state.on_event({"type": "x", "server_event_seq": 5}, 10, now=1.0)  # time
    assert drain(state, 1.4) == []
    assert drain(state, 1.5) == [{"type": "session.event_ack", "server_event_seq": 5}]


def test_heartbeats_keep_time_confirm_and_trim_the_resend_buffer() -> None:
    state = opened(heartbeat=HeartbeatPolicy(interval=10, timeout=4, confirm_every=3))
    assert state.next_deadline() == 10
    assert drain(state, 10.0) == [{"type": "session.heartbeat"}]
    assert state.heartbeat_overdue(14.0) and not state.heartbeat_overdue(13.9)
    state.on_event({"type": "session.heartbeat_ack"}, 10, now=11.0)
    for i in range(4):
        state.enqueue(text(str(i)))
    kinds = [f["type"] for f in drain(state, 11.0)]
    # After three unconfirmed events a heartbeat goes out as a barrier.
    assert kinds == ["input.text.append"] * 3 + ["session.heartbeat", "input.text.append"]
    assert state.on_event({"type": "session.heartbeat_ack"}, 10, now=11.5) is Verdict.INTERNAL
    assert state.confirmed_seq == 3 and [item.seq for item in state.outbox] == [4]
    target = state.request_confirm()
    assert target == 4 and drain(state, 12.0) == [{"type": "session.heartbeat"}]
    state.on_event({"type": "session.heartbeat_ack"}, 10, now=12.1)
    assert state.confirmed_seq == 4 and not state.outbox and state.outbox_bytes == 0


def test_heartbeat_interval_is_at_most_a_third_of_the_idle_ttl() -> None:
    state = SessionState({})
    state.opening_frame()
    state.on_handshake(created(idle_ttl_s=6), now=100.0)
    assert state.next_deadline() == 102.0


def test_close_goes_out_after_everything_queued() -> None:
    state = opened()
    state.enqueue(text("last words"))
    state.request_close("done")
    frames = drain(state)
    assert [f["type"] for f in frames] == ["input.text.append", "session.close"]
    assert frames[1] == {"type": "session.close", "reason": "done"}
    assert drain(state) == []


def test_a_close_is_sent_again_on_the_next_connection_until_the_session_ends() -> None:
    state = opened()
    state.request_close("first")
    state.request_close("second")  # only the first request counts
    phases = [state.phase]
    assert state.closing and state.close_reason == "first"
    assert drain(state) == [{"type": "session.close", "reason": "first"}]
    state.opening_frame()  # the connection was lost before session.closed
    state.on_handshake(resumed(received=0), now=1.0)
    assert drain(state, 1.0) == [{"type": "session.close", "reason": "first"}]
    closed = {"type": "session.closed", "reason": "client_close"}
    assert state.on_event(closed, 10, now=1.0) is Verdict.END
    phases.append(state.phase)
    assert phases == [Phase.CLOSING, Phase.ENDED] and state.ended and not state.closing


def test_a_close_requested_after_the_end_is_ignored() -> None:
    state = opened()
    state.on_event({"type": "session.replaced", "attachment_generation": 2}, 10, now=0.0)
    state.request_close()
    assert state.phase is Phase.ENDED and drain(state) == []


STATE = """config acks heartbeat session_id resume_token generation limits last_received_seq
acked_seq next_client_seq confirmed_seq outbox outbox_bytes phase closing close_reason ended"""


@pytest.mark.parametrize("name", STATE.split())
def test_its_state_changes_only_through_its_methods(name: str) -> None:
    state = opened()
    with pytest.raises(AttributeError):
        setattr(state, name, getattr(state, name))


def test_the_resume_token_is_never_in_a_repr() -> None:
    state = opened()
    resume = state.resume_state()
    assert resume is not None and resume.resume_token == "secret-1"
    assert "secret" not in repr(resume) and "secret" not in repr(state)


@given(st.integers(1, 40), st.integers(0, 2**32))
def test_backoff_grows_is_capped_and_jittered_within_bounds(attempt: int, seed: int) -> None:
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=5.0, multiplier=2.0, jitter=0.5)
    base = min(5.0, 0.1 * 2.0 ** (attempt - 1))
    assert base * 0.5 <= policy.delay(attempt, random.Random(seed)) <= base


@attrs.define
class ModelServer(ModelJournal):
    """The server side of the protocol, reduced to what the client's guarantees rest on:
    highest-seq dedup, an ordered journal with acks and replay, heartbeat acks in order."""

    client_seq: int = 0
    inputs: list[str] = attrs.field(factory=list)

    def handle(self, frame: str) -> list[str]:
        event = json.loads(frame)
        if event["type"] == "session.heartbeat":
            return [json.dumps({"type": "session.heartbeat_ack"})]
        if event["type"] == "session.event_ack":
            self.ack(event["server_event_seq"])
            return []
        seq = event["client_event_seq"]
        if seq <= self.client_seq:
            return []
        assert seq == self.client_seq + 1, "the client skipped a seq"
        self.client_seq = seq
        self.inputs.append(event["text"])
        return [self.emit()]

    def resume(self, frame: str) -> list[str]:
        replay = self.replay(json.loads(frame)["last_received_server_event_seq"])
        answer = {**resumed(self.client_seq), "session_id": "s1"}
        return [json.dumps(answer), *replay]


@settings(max_examples=300, deadline=None)
@given(CUT_PLANS)
def test_model_every_event_once_in_order_through_any_cuts(plan: list[tuple[str, int]]) -> None:
    state = opened(
        acks=AckPolicy(every_events=2, max_delay=1.0),
        heartbeat=HeartbeatPolicy(interval=5, timeout=100, confirm_every=2),
    )
    server = ModelServer()
    sent: list[str] = []
    wire = Wire(state, server.handle)

    def send() -> None:
        sent.append(f"m{len(sent)}")
        state.enqueue(text(sent[-1]))

    wire.run(plan, send=send, emit=server.emit, resume=lambda: server.resume(native_opening(state)))
    wire.settle()
    assert not wire.up and not wire.down and not state.outbox
    assert server.inputs == sent
    assert wire.delivered == list(range(1, server.head + 1))


# -- input flow control (protocol v2) ------------------------------------------------------


def refusal(code: str, seq: int, expected: int | None = None) -> Event:
    event: Event = {"type": "error", "code": code, "message": "", "retryable": True}
    event["client_event_seq"] = seq
    if expected is not None:
        event["expected_client_event_seq"] = expected
    return event


def seqs(frames: list[Event]) -> list[int]:
    return [f["client_event_seq"] for f in frames if "client_event_seq" in f]


def test_room_is_paced_by_the_advertised_bounds_and_the_consumption_reports() -> None:
    state = SessionState({})
    state.on_handshake(created(max_pending_input=2, max_pending_input_bytes=10_000), now=0.0)
    assert state.limits.max_pending_input == 2
    state.enqueue(text("a"))
    assert state.has_room(1024, 1 << 30)
    state.enqueue(text("b"))
    assert not state.has_room(1024, 1 << 30)  # two events sent, none consumed
    report = {"type": "input.consumed", "consumed_client_event_seq": 1}
    assert state.on_event(report, 60, 0.0) is Verdict.INTERNAL
    assert state.consumed_seq == 1 and state.has_room(1024, 1 << 30)
    assert state.confirmed_seq == 1  # consumed: read too
    state.enqueue(text("x" * 10_000))
    events, size = state.unconsumed
    assert events == 2 and size == sum(
        len(f) for f in (state.outbox[0].frame, state.outbox[1].frame)
    )
    assert not state.has_room(1024, 1 << 30)  # 10,000 bytes reached


def test_without_advertised_bounds_only_the_resend_buffer_paces() -> None:
    state = opened()  # a v1 server: no max_pending_input
    for _ in range(3000):
        state.enqueue(text("a"))
    assert state.limits.max_pending_input is None
    assert state.has_room(4000, 1 << 30) and not state.has_room(3000, 1 << 30)


def test_a_backpressure_refusal_rewinds_to_the_refused_seq_after_a_backoff() -> None:
    state = opened()
    for value in "abcde":
        state.enqueue(text(value))
    assert seqs(drain(state)) == [1, 2, 3, 4, 5]
    heartbeat = state.request_confirm()
    assert heartbeat == 5 and [f["type"] for f in drain(state)] == ["session.heartbeat"]
    assert state.on_event(refusal("input_backpressure", 3), 90, 1.0) is Verdict.INTERNAL
    assert state.rewinds == 1
    # The answers to 4 and 5 (sent before the rewind) are dropped, whatever they are.
    assert state.on_event(refusal("unexpected_client_event_seq", 4, 3), 90, 1.0) is (
        Verdict.INTERNAL
    )
    bad = {**refusal("bad_event", 5), "retryable": False}
    assert state.on_event(bad, 90, 1.0) is Verdict.INTERNAL
    # The heartbeat sent after 5 confirms only what was before the refused one.
    assert state.on_event({"type": "session.heartbeat_ack"}, 40, 1.0) is Verdict.INTERNAL
    assert state.confirmed_seq == 2 and [o.seq for o in state.outbox] == [3, 4, 5]
    assert drain(state, 1.01) == [] and state.next_deadline() == 1.05
    assert seqs(drain(state, 1.05)) == [3, 4, 5]
    # Answers to the resent events are new: a refusal for good is delivered, and the
    # next retryable one rewinds again, with a longer backoff.
    assert state.on_event(bad, 90, 2.0) is Verdict.DELIVER
    assert state.on_event(refusal("input_backpressure", 5), 90, 2.0) is Verdict.INTERNAL
    assert state.rewinds == 2 and drain(state, 2.05) == []
    # A consumption report means room was made: resend at once.
    state.on_event({"type": "input.consumed", "consumed_client_event_seq": 4}, 60, 2.0)
    assert seqs(drain(state, 2.0)) == [5]


def test_an_unexpected_seq_refusal_rewinds_to_the_seq_expected() -> None:
    state = opened()
    for value in "abc":
        state.enqueue(text(value))
    drain(state)
    assert state.on_event(refusal("unexpected_client_event_seq", 3, 2), 90, 0.0) is (
        Verdict.INTERNAL
    )
    assert seqs(drain(state, 1.0)) == [2, 3]


def test_a_refusal_asking_for_what_the_client_no_longer_holds_is_a_violation() -> None:
    state = opened()
    state.enqueue(text("a"))
    drain(state)
    with pytest.raises(ProtocolViolation):
        state.on_event(refusal("unexpected_client_event_seq", 1, 7), 90, 0.0)


def test_a_resume_tells_the_client_how_far_its_input_was_consumed() -> None:
    state = SessionState({})
    state.on_handshake(created(max_pending_input=2), now=0.0)
    for value in "abc":
        state.enqueue(text(value))
    state.opening_frame()
    state.on_handshake({**resumed(2), "consumed_client_event_seq": 2}, now=1.0)
    assert state.consumed_seq == 2 and state.unconsumed[0] == 1
