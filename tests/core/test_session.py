"""The session core (``core/session.py``) driven directly: no trio, no I/O, time as a number."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from trio_duplex.core import opening
from trio_duplex.core.events import Reason
from trio_duplex.core.limits import Limits
from trio_duplex.core.session import Commit, Registry, Session, State, Terminal
from trio_duplex.core.wire import (
    ProtocolError,
)
from trio_duplex.dialects import NATIVE

GRACE = 30.0
UNCONFIRMED = 5.0  # unconfirmed_grace_s, by default
IDLE = 300.0


NO_USAGE = {"events_in": 0, "events_out": 0, "bytes_in": 0, "bytes_out": 0, "resumes": 0}


def make_registry(**overrides: Any) -> Registry:
    settings: dict[str, Any] = {
        "max_sessions": 4,
        "disconnect_grace_s": GRACE,
        "idle_ttl_s": IDLE,
        "journal_max_bytes": 10_000,
        "journal_ttl_s": 60.0,
    }
    settings.update(overrides)
    return Registry(Limits(**settings), spelling=NATIVE)


def opened(registry: Registry, now: float = 0.0, *, spoke: bool = True) -> tuple[Session, str]:
    """Admit a session and deliver its session.created: ATTACHED at generation 1. With
    ``spoke``, its client then sends an event (it holds its token: the whole grace)."""
    session, token = registry.admit({"voice": "x"})
    session.handshake_delivered(now)
    if spoke:
        session.touch(now)
    return session, token


def refusal(call: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        call(*args)
    return info.value


def snapshot(s: Session) -> tuple[Any, ...]:
    j = s.journal
    return (
        s.state,
        s.generation,
        s.grace_deadline,
        s.idle_deadline,
        s.resume,
        s.terminal,
        s.client_seq,
        s.heard,
        j.head,
        j.acked_through,
        j.dropped_through,
        len(j),
        j.bytes,
    )


def state_of(s: Session) -> State:
    """``s.state``, read through a call so that type checkers do not narrow it."""
    return s.state


def emit(s: Session, now: float = 0.0, **fields: Any) -> int:
    emitted = s.emit({"type": "response.delta", **fields}, now)
    assert emitted is not None
    seq = json.loads(emitted.frame)["server_event_seq"]
    assert isinstance(seq, int)
    return seq


# -- opening and the handshake ---------------------------------------------------------


def test_admit_creates_an_opening_session_holding_a_slot() -> None:
    registry = make_registry()
    session, token = registry.admit({"voice": "x"})
    assert session.state is State.OPENING
    assert session.generation == 1
    assert registry.slots_held == 1
    assert registry.sessions == {session.id: session}
    assert session.id.startswith("sess_")
    assert session.next_deadline() == math.inf  # nothing expires before the handshake
    created = registry.created_event(session, token)
    assert created == {
        "type": "session.created",
        "session_id": session.id,
        "session": {"voice": "x"},
        "resume_token": token,
        "attachment_generation": 1,
        "limits": {
            "disconnect_grace_s": GRACE,
            "idle_ttl_s": IDLE,
            "journal_max_bytes": 10_000,
            "max_event_bytes": 15 * 1024 * 1024,
            "max_config_bytes": 64 * 1024,
            "max_pending_input": 256,
            "max_pending_input_bytes": 16 * 1024 * 1024,
        },
    }


def test_session_ids_and_tokens_are_unique() -> None:
    registry = make_registry(max_sessions=50)
    admitted = [registry.admit({}) for _ in range(50)]
    assert len({s.id for s, _ in admitted}) == 50
    assert len({t for _, t in admitted}) == 50


def test_handshake_delivered_attaches_and_starts_the_idle_clock() -> None:
    session, _ = opened(make_registry(), now=5.0)
    assert session.state is State.ATTACHED
    assert session.is_current(1)
    assert session.idle_deadline == 5.0 + IDLE
    assert session.grace_deadline == math.inf
    assert session.next_deadline() == 5.0 + IDLE
    session.handshake_delivered(100.0)  # a second report changes nothing
    assert session.idle_deadline == 5.0 + IDLE


def test_an_opening_session_cannot_be_resumed() -> None:
    registry = make_registry()
    session, token = registry.admit({})
    before = snapshot(session)
    error = refusal(session.begin_resume, token, 0, 0.0)
    assert error.code == "session_resume_expired"
    assert error.close_code == 4001
    assert snapshot(session) == before


def test_undelivered_handshake_closes_at_once_and_frees_the_slot() -> None:
    registry = make_registry(max_sessions=1)
    session, _ = registry.admit({})
    terminal = session.handshake_failed(1.0)
    assert terminal == Terminal(
        {
            "type": "session.closed",
            "session_id": session.id,
            "reason": Reason.UNDELIVERED,
            "usage": NO_USAGE,
        },
        1000,
        1,  # the connection that was carrying session.created (if it is still there)
    )
    assert state_of(session) is State.CLOSING
    assert session.handshake_failed(2.0) is None
    assert registry.release(session)
    assert registry.slots_held == 0
    assert state_of(session) is State.CLOSED
    registry.admit({})  # the slot is free again immediately, not after the grace


def test_handshake_failed_after_delivery_changes_nothing() -> None:
    session, _ = opened(make_registry())
    before = snapshot(session)
    assert session.handshake_failed(1.0) is None
    assert snapshot(session) == before


def test_connection_lost_during_the_handshake_then_delivered_detaches() -> None:
    session, token = make_registry().admit({})
    assert session.detach(1, 2.0) is False  # the outcome waits for the send
    assert state_of(session) is State.OPENING
    session.handshake_delivered(3.0)
    assert state_of(session) is State.DETACHED
    assert session.grace_deadline == 3.0 + UNCONFIRMED  # its client never spoke after it
    assert session.begin_resume(token, 0, 4.0).generation == 2  # it is resumable


def test_connection_lost_during_the_handshake_then_failed_closes() -> None:
    session, _ = make_registry().admit({})
    session.detach(1, 2.0)
    terminal = session.handshake_failed(3.0)
    assert terminal is not None and terminal.reason == Reason.UNDELIVERED


# -- attachment and fencing ------------------------------------------------------------


def test_detach_starts_the_grace_once() -> None:
    session, _ = opened(make_registry())
    assert session.detach(1, 10.0) is True
    assert session.state is State.DETACHED
    assert session.grace_deadline == 10.0 + GRACE
    assert session.next_deadline() == 10.0 + GRACE
    assert not session.is_current(1)
    # The pump reports the same loss later: the grace is not restarted.
    assert session.detach(1, 20.0) is False
    assert session.grace_deadline == 10.0 + GRACE


def test_a_client_that_never_spoke_gets_the_unconfirmed_grace() -> None:
    session, token = opened(make_registry(), spoke=False)
    assert session.heard is False
    assert session.detach(1, 10.0) is True
    assert session.grace_deadline == session.next_deadline() == 10.0 + UNCONFIRMED
    assert session.poll(10.0 + UNCONFIRMED - 0.001) is None
    terminal = session.poll(10.0 + UNCONFIRMED)
    assert terminal is not None and terminal.reason == Reason.GRACE_EXPIRED
    assert refusal(session.begin_resume, token, 0, 11.0 + UNCONFIRMED).code == (
        "session_resume_expired"
    )


def test_a_client_event_after_created_earns_the_whole_grace() -> None:
    session, _ = opened(make_registry(), spoke=False)
    session.touch(1.0)  # the shell touches for every event that decodes, of any kind
    assert session.heard is True
    session.detach(1, 10.0)
    assert session.grace_deadline == 10.0 + GRACE


def test_the_unconfirmed_grace_is_never_longer_than_the_grace() -> None:
    session, _ = opened(make_registry(disconnect_grace_s=2.0, unconfirmed_grace_s=5.0), spoke=False)
    session.detach(1, 10.0)
    assert session.grace_deadline == 12.0
    session, _ = opened(make_registry(unconfirmed_grace_s=0.0), spoke=False)
    session.detach(1, 10.0)
    assert session.grace_deadline == 10.0


def test_the_event_that_opened_the_session_shows_nothing() -> None:
    """It was sent before session.created: it does not show the client has the token."""
    session, _ = make_registry().admit({})
    session.handshake_delivered(0.0, opening_event=True)
    session.touch(0.0)  # the opening event, handled as the first input
    assert session.heard is False
    session.touch(1.0)  # the next one was sent after session.created arrived
    assert session.heard is True
    session, _ = make_registry().admit({})
    session.handshake_delivered(0.0, opening_event=True)
    session.touch(0.0)
    session.detach(1, 2.0)
    assert session.grace_deadline == 2.0 + UNCONFIRMED


def test_a_resume_inside_the_unconfirmed_grace_works_and_earns_the_whole_grace() -> None:
    session, token = opened(make_registry(), spoke=False)
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, UNCONFIRMED - 0.5)
    assert session.commit_resume(attempt, UNCONFIRMED - 0.5) == Commit(2, None)
    assert session.heard is True  # it presented a token: it has one
    session.detach(2, 10.0)  # lost again before it said anything: the whole grace
    assert session.grace_deadline == 10.0 + GRACE


def test_an_aborted_resume_does_not_earn_the_whole_grace() -> None:
    session, token = opened(make_registry(), spoke=False)
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, 1.0)
    assert session.abort_resume(attempt, 1.0) is None
    assert session.heard is False and session.grace_deadline == UNCONFIRMED


def test_a_stale_generation_changes_nothing_after_a_takeover() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, 1.0)
    assert session.commit_resume(attempt, 1.0) == Commit(2, replaced=1)
    before = snapshot(session)
    for stale in (0, 1, 3):
        assert session.detach(stale, 2.0) is False
        assert not session.is_current(stale)
    assert session.is_current(2)
    assert snapshot(session) == before


def test_the_resuming_generation_cannot_detach_before_its_commit() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, 1.0)
    before = snapshot(session)
    assert session.detach(attempt.generation, 2.0) is False
    assert not session.is_current(attempt.generation)
    assert snapshot(session) == before


def test_touch_restarts_the_idle_clock() -> None:
    session, _ = opened(make_registry())
    session.touch(100.0)
    assert session.idle_deadline == 100.0 + IDLE
    assert session.poll(IDLE + 1.0) is None


# -- admission ---------------------------------------------------------------------------


def test_max_sessions_is_never_exceeded() -> None:
    registry = make_registry(max_sessions=2)
    first, _ = registry.admit({})
    opened(registry)
    first.detach(1, 0.0)  # opening, attached and detached sessions all hold slots
    error = refusal(registry.admit, {})
    assert (error.code, error.retryable, error.close_code) == ("resource_exhausted", True, 1013)
    assert registry.slots_held == 2


def test_a_closing_session_holds_its_slot_until_release() -> None:
    registry = make_registry(max_sessions=1)
    session, _ = opened(registry)
    assert session.begin_close(Reason.CLIENT_CLOSE, 1.0) is not None
    assert refusal(registry.admit, {}).code == "resource_exhausted"
    assert registry.release(session) is True
    assert registry.slots_held == 0
    assert session.id not in registry.sessions
    registry.admit({})
    assert registry.slots_held == 1


@pytest.mark.parametrize("state", ["opening", "attached", "detached", "released"])
def test_only_a_closing_session_can_be_released(state: str) -> None:
    registry = make_registry()
    session, _ = registry.admit({})
    if state != "opening":
        session.handshake_delivered(0.0)
    if state == "detached":
        session.detach(1, 0.0)
    if state == "released":
        session.begin_close(Reason.CLIENT_CLOSE, 0.0)
        assert registry.release(session)
    held = registry.slots_held
    assert registry.release(session) is False
    assert registry.slots_held == held


def test_shutting_down_refuses_opens_and_resumes() -> None:
    registry = make_registry()
    session, _ = opened(registry)
    registry.shutting_down = True
    for error in (refusal(registry.admit, {}), refusal(registry.lookup_for_resume, session.id)):
        assert (error.code, error.retryable, error.close_code) == (
            "server_shutting_down",
            True,
            1001,
        )
    assert registry.slots_held == 1


@pytest.mark.parametrize("session_id", ["sess_nope", None, 5, ["x"]])
def test_lookup_of_an_unknown_session_is_refused(session_id: object) -> None:
    error = refusal(make_registry().lookup_for_resume, session_id)
    assert (error.code, error.close_code) == ("session_resume_expired", 4001)


def test_a_released_session_cannot_be_looked_up() -> None:
    registry = make_registry()
    session, _ = opened(registry)
    session.begin_close(Reason.CLIENT_CLOSE, 0.0)
    assert registry.lookup_for_resume(session.id) is session  # closing: still there
    registry.release(session)
    assert refusal(registry.lookup_for_resume, session.id).code == "session_resume_expired"


# -- resume ------------------------------------------------------------------------------


def test_resume_rotates_the_token_and_takes_over_the_next_generation() -> None:
    session, token = opened(make_registry())
    for seq in range(1, 8):
        session.note_client_seq(seq)
    assert session.consumed(5) is not None
    emit(session)
    attempt = session.begin_resume(token, 1, 10.0)
    assert attempt.generation == 2
    assert attempt.new_token != token
    assert session.resumed_event(attempt) == {
        "type": "session.resumed",
        "session_id": session.id,
        "session": {"voice": "x"},
        "resume_token": attempt.new_token,
        "attachment_generation": 2,
        "last_received_client_event_seq": 7,
        "consumed_client_event_seq": 5,
    }
    # Nothing about the attachment changes before the commit.
    assert session.state is State.ATTACHED and session.is_current(1)
    assert session.commit_resume(attempt, 11.0) == Commit(2, replaced=1)
    assert session.is_current(2) and not session.is_current(1)
    assert session.idle_deadline == 11.0 + IDLE
    assert session.resume is None


def test_resume_of_a_detached_session_clears_the_grace() -> None:
    session, token = opened(make_registry())
    session.detach(1, 5.0)
    attempt = session.begin_resume(token, 0, 6.0)
    assert session.commit_resume(attempt, 7.0) == Commit(2, replaced=None)
    assert session.state is State.ATTACHED
    assert session.grace_deadline == math.inf
    assert session.next_deadline() == 7.0 + IDLE
    assert session.poll(5.0 + GRACE + 1) is None


@pytest.mark.parametrize("token", ["x" * 43, "", None, 12, b"token"])
def test_a_wrong_token_is_refused_and_changes_nothing(token: object) -> None:
    session, _ = opened(make_registry())
    before = snapshot(session)
    error = refusal(session.begin_resume, token, 0, 1.0)
    assert (error.code, error.close_code, error.retryable) == ("invalid_resume_token", 4001, False)
    assert snapshot(session) == before


def test_a_last_seq_past_the_head_is_refused_and_changes_nothing() -> None:
    session, token = opened(make_registry())
    emit(session)
    before = snapshot(session)
    error = refusal(session.begin_resume, token, 2, 1.0)
    assert (error.code, error.param, error.close_code) == (
        "invalid_session_resume",
        "last_received_server_event_seq",
        4001,
    )
    assert snapshot(session) == before
    session.begin_resume(token, 1, 1.0)  # the token was not used up by the refusal


def test_concurrent_resumes_conflict_then_a_later_one_takes_over() -> None:
    session, token = opened(make_registry())
    session.detach(1, 0.0)
    first = session.begin_resume(token, 0, 1.0)
    before = snapshot(session)
    error = refusal(session.begin_resume, token, 0, 1.0)
    assert (error.code, error.retryable, error.close_code) == (
        "session_resume_conflict",
        True,
        4001,
    )
    assert snapshot(session) == before
    assert session.commit_resume(first, 2.0) == Commit(2, replaced=None)
    # After the winner finished, a still-valid token is a takeover of the winner.
    second = session.begin_resume(first.new_token, 0, 3.0)
    assert session.commit_resume(second, 3.0) == Commit(3, replaced=2)


def test_resume_acks_everything_up_to_the_presented_seq() -> None:
    session, token = opened(make_registry())
    for _ in range(3):
        emit(session)
    session.detach(1, 0.0)
    session.begin_resume(token, 2, 1.0)
    assert session.journal.acked_through == 2
    assert [e.seq for e in session.journal.replay(2, 1.0) or []] == [3]


def test_an_aborted_resume_leaves_an_attached_session_on_its_connection() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, 1.0)
    assert session.abort_resume(attempt, 2.0) is None
    assert session.state is State.ATTACHED
    assert session.is_current(1) and session.generation == 1
    assert session.resume is None
    # The aborted attempt can neither commit nor abort again.
    assert session.commit_resume(attempt, 3.0) is None
    assert session.abort_resume(attempt, 3.0) is None
    assert session.is_current(1)


def test_an_aborted_resume_leaves_a_detached_session_inside_its_grace() -> None:
    session, token = opened(make_registry())
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, 10.0)
    assert session.abort_resume(attempt, 20.0) is None
    assert session.state is State.DETACHED
    assert session.grace_deadline == GRACE
    assert session.poll(GRACE - 1) is None
    terminal = session.poll(GRACE)
    assert terminal is not None and terminal.reason == Reason.GRACE_EXPIRED


def test_a_resume_cannot_commit_after_the_session_ended() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, 1.0)
    terminal = session.begin_close(Reason.SHUTDOWN, 2.0)
    assert terminal is not None and terminal.generation == 1  # to the old attachment
    assert session.commit_resume(attempt, 3.0) is None
    assert session.state is State.CLOSING
    assert session.abort_resume(attempt, 3.0) is None
    assert session.begin_close(Reason.SHUTDOWN, 4.0) is None


@pytest.mark.parametrize("attached", [False, True], ids=["detached", "attached"])
def test_a_session_ending_during_a_resume(attached: bool) -> None:
    """docs/protocol.md, Ending: if a connection was attached, the terminal event goes to
    it and the resumer is refused (session_resume_expired, 4001); if the session was
    detached, the terminal goes to no attachment: the resumer, the only one who can hear
    it, is owed it."""
    session, token = opened(make_registry())
    if not attached:
        session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, 1.0)
    terminal = session.begin_close(Reason.SHUTDOWN, 2.0)
    assert terminal is not None
    assert (terminal.event["type"], terminal.reason, terminal.close_code) == (
        "session.closed",
        Reason.SHUTDOWN,
        1001,
    )
    assert terminal.generation == (1 if attached else None)
    assert session.commit_resume(attempt, 3.0) is None
    error = opening.ended_during_resume()
    assert (error.code, error.close_code) == ("session_resume_expired", 4001)


def test_a_closed_session_cannot_be_resumed() -> None:
    registry = make_registry()
    session, token = opened(registry)
    session.begin_close(Reason.CLIENT_CLOSE, 0.0)
    assert refusal(session.begin_resume, token, 0, 1.0).code == "session_resume_expired"
    registry.release(session)
    assert refusal(session.begin_resume, token, 0, 1.0).code == "session_resume_expired"


# -- grace and idle expiry -------------------------------------------------------------


def test_grace_expiry() -> None:
    session, _ = opened(make_registry())
    session.detach(1, 10.0)
    assert session.poll(10.0 + GRACE - 0.001) is None
    terminal = session.poll(10.0 + GRACE)
    assert terminal == Terminal(
        {
            "type": "session.expired",
            "session_id": session.id,
            "reason": Reason.GRACE_EXPIRED,
            "usage": NO_USAGE,
        },
        1000,
        None,
    )
    assert session.state is State.CLOSING
    assert session.next_deadline() == math.inf
    assert session.poll(1e9) is None


def test_idle_expiry_goes_to_the_attached_connection() -> None:
    session, _ = opened(make_registry())
    assert session.poll(IDLE - 0.001) is None
    terminal = session.poll(IDLE)
    assert terminal is not None
    assert (terminal.event["type"], terminal.reason, terminal.close_code, terminal.generation) == (
        "session.expired",
        Reason.IDLE_EXPIRED,
        1000,
        1,
    )


def test_the_idle_clock_does_not_run_while_detached() -> None:
    session, _ = opened(make_registry(idle_ttl_s=10.0))
    session.detach(1, 5.0)  # idle deadline 10, grace deadline 35
    assert session.poll(20.0) is None
    terminal = session.poll(35.0)
    assert terminal is not None and terminal.reason == Reason.GRACE_EXPIRED


def test_a_resume_is_refused_once_the_grace_ran_out_even_before_the_poll() -> None:
    session, token = opened(make_registry())
    session.detach(1, 0.0)
    before = snapshot(session)
    assert refusal(session.begin_resume, token, 0, GRACE).code == "session_resume_expired"
    assert snapshot(session) == before


def test_expiry_racing_a_resume_that_commits() -> None:
    session, token = opened(make_registry())
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, GRACE - 1)
    assert session.next_deadline() == math.inf  # the resume freezes the timers
    assert session.poll(GRACE + 5) is None
    assert session.commit_resume(attempt, GRACE + 10) == Commit(2, None)
    assert session.grace_deadline == math.inf
    assert session.poll(GRACE + 20) is None
    assert session.state is State.ATTACHED


def test_expiry_racing_a_resume_that_aborts_after_the_deadline() -> None:
    session, token = opened(make_registry())
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 0, GRACE - 1)
    assert session.poll(GRACE + 5) is None
    terminal = session.abort_resume(attempt, GRACE + 10)
    assert terminal is not None and terminal.reason == Reason.GRACE_EXPIRED
    assert session.state is State.CLOSING
    assert session.begin_close(Reason.SHUTDOWN, GRACE + 11) is None


def test_idle_expiry_racing_a_takeover_that_aborts() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, IDLE - 1)
    assert session.poll(IDLE + 1) is None
    terminal = session.abort_resume(attempt, IDLE + 1)
    assert terminal is not None
    assert (terminal.reason, terminal.generation) == (Reason.IDLE_EXPIRED, 1)


# -- the terminal event -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind", "code"),
    [
        (Reason.CLIENT_CLOSE, "session.closed", 1000),
        (Reason.ENGINE_FINISHED, "session.closed", 1000),
        (Reason.ENGINE_ERROR, "session.closed", 1011),
        (Reason.SHUTDOWN, "session.closed", 1001),
        (Reason.GRACE_EXPIRED, "session.expired", 1000),
        (Reason.IDLE_EXPIRED, "session.expired", 1000),
    ],
)
def test_exactly_one_terminal_event(reason: Reason, kind: str, code: int) -> None:
    session, _ = opened(make_registry())
    terminal = session.begin_close(reason, 1.0)
    assert terminal is not None
    assert terminal.event == {
        "type": kind,
        "session_id": session.id,
        "reason": reason,
        "usage": NO_USAGE,
    }
    assert (terminal.close_code, terminal.generation, terminal.reason) == (code, 1, reason)
    assert session.terminal is terminal
    for other in (Reason.CLIENT_CLOSE, Reason.SHUTDOWN, reason):
        assert session.begin_close(other, 2.0) is None
    assert session.poll(1e9) is None
    assert session.handshake_failed(3.0) is None
    assert session.terminal is terminal


def test_a_detached_session_ends_with_a_terminal_for_no_attachment() -> None:
    session, _ = opened(make_registry())
    session.detach(1, 0.0)
    terminal = session.begin_close(Reason.SHUTDOWN, 1.0)
    assert terminal is not None and terminal.generation is None


def test_nothing_is_emitted_after_the_end() -> None:
    session, _ = opened(make_registry())
    emit(session)
    session.begin_close(Reason.ENGINE_FINISHED, 1.0)
    assert session.emit({"type": "late"}, 2.0) is None
    assert session.journal.head == 1


def test_terminal_of_a_session_closed_while_opening_goes_to_the_created_connection() -> None:
    registry = make_registry()
    session, _ = registry.admit({})
    session.begin_close(Reason.SHUTDOWN, 1.0)
    session.handshake_delivered(2.0)  # the client now holds session.created, generation 1
    assert session.terminal is not None
    assert session.terminal.generation == 1


# -- events, acks, client seqs ---------------------------------------------------------


def test_events_are_numbered_from_1_and_encoded_compactly() -> None:
    session, _ = opened(make_registry())
    emitted = session.emit({"type": "response.delta", "text": "héllo"}, 0.0)
    assert emitted is not None and emitted.notice is None
    assert emitted.frame == '{"type":"response.delta","text":"héllo","server_event_seq":1}'
    assert session.journal.bytes == len(emitted.frame.encode("utf-8"))
    assert [emit(session) for _ in range(3)] == [2, 3, 4]


def test_numbering_is_never_reset_by_a_resume() -> None:
    session, token = opened(make_registry())
    emit(session)
    emit(session)
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 2, 1.0)
    session.commit_resume(attempt, 1.0)
    assert emit(session, 2.0) == 3


def test_an_event_emitted_while_detached_is_journaled_for_the_resume() -> None:
    session, token = opened(make_registry())
    emit(session)
    session.detach(1, 0.0)
    emit(session, 1.0)
    emit(session, 2.0)
    attempt = session.begin_resume(token, 1, 3.0)
    assert [e.seq for e in session.journal.replay(attempt.last_seq, 3.0) or []] == [2, 3]


def test_ack_of_0_is_accepted_and_frees_nothing() -> None:
    session, _ = opened(make_registry())
    session.ack(0)  # before any event
    emit(session)
    session.ack(0)
    assert len(session.journal) == 1


def test_ack_frees_entries_up_to_and_including_the_seq() -> None:
    session, _ = opened(make_registry())
    for _ in range(4):
        emit(session)
    session.ack(2)
    assert [e.seq for e in session.journal.replay(2, 0.0) or []] == [3, 4]
    assert session.journal.replay(1, 0.0) is None  # acked entries are gone
    session.ack(4)
    assert len(session.journal) == 0 and session.journal.bytes == 0
    session.ack(1)  # an older ack after a newer one is harmless
    assert session.journal.acked_through == 4


@pytest.mark.parametrize("seq", [2, 3, -1, True, False, 1.0, "1", None, [1]])
def test_an_invalid_ack_is_refused_and_the_session_goes_on(seq: object) -> None:
    session, _ = opened(make_registry())
    emit(session)
    before = snapshot(session)
    error = refusal(session.ack, seq)
    assert (error.code, error.param, error.close_code) == (
        "invalid_event_ack",
        "server_event_seq",
        None,
    )
    assert snapshot(session) == before
    assert emit(session) == 2


def test_only_the_next_client_event_seq_is_taken_and_one_further_ahead_is_refused() -> None:
    session, token = opened(make_registry())
    assert session.is_new_client_seq(1)
    session.note_client_seq(1)
    assert not session.is_new_client_seq(1)  # a resend: dropped silently
    with pytest.raises(ProtocolError) as raised:
        session.is_new_client_seq(3)  # 2 is missing: nothing may overtake it
    assert raised.value.retryable
    assert raised.value.to_event({"client_event_seq": 3, "event_id": "e"}) == {
        "type": "error",
        "code": "unexpected_client_event_seq",
        "message": "client_event_seq 3 is not the next one, 2; resend from 2",
        "retryable": True,
        "event_id": "e",
        "param": "client_event_seq",
        "client_event_seq": 3,
        "expected_client_event_seq": 2,
    }
    session.note_client_seq(3)  # only the next one counts
    assert session.client_seq == 1
    assert session.is_new_client_seq(2)
    session.note_client_seq(2)
    assert not session.is_new_client_seq(2) and session.is_new_client_seq(3)
    attempt = session.begin_resume(token, 0, 1.0)
    assert session.resumed_event(attempt)["last_received_client_event_seq"] == 2


def test_consumption_is_reported_once_per_advance() -> None:
    session, _ = opened(make_registry())
    assert session.consumed(0) is None
    assert session.consumed(2) == '{"type":"input.consumed","consumed_client_event_seq":2}'
    assert session.consumed(2) is None and session.consumed(1) is None
    assert session.consumed_seq == 2


# -- overflow and gaps across a resume -------------------------------------------------


def small_journal_session(max_bytes: int = 80) -> tuple[Session, str]:
    """A journal that holds two small events (34-35 bytes each) and not three."""
    return opened(make_registry(journal_max_bytes=max_bytes))


def test_overflow_while_attached_sends_a_notice_before_the_event() -> None:
    session, _ = small_journal_session()
    emit(session)
    emit(session)
    emitted = session.emit({"type": "response.delta"}, 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice) == {
        "type": "session.resync_required",
        "reason": "journal_overflow",
        "dropped_through_seq": 2,
    }
    assert json.loads(emitted.frame)["server_event_seq"] == 3
    assert [e.seq for e in session.journal.replay(2, 0.0) or []] == [3]
    assert emit(session) == 4  # numbering goes on


def test_an_event_alone_over_the_bound_is_delivered_not_journaled() -> None:
    session, _ = small_journal_session()
    emit(session)
    emitted = session.emit({"type": "response.delta", "text": "x" * 100}, 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice)["dropped_through_seq"] == 2
    assert json.loads(emitted.frame)["server_event_seq"] == 2  # still delivered live
    assert len(session.journal) == 0 and session.journal.head == 2
    assert emit(session) == 3


def test_overflow_then_resume_reports_a_gap() -> None:
    session, token = small_journal_session()
    emit(session)  # the client receives 1
    session.detach(1, 1.0)
    for _ in range(3):  # 2, 3 fit; 4 drops everything through 3
        emit(session, 2.0)
    attempt = session.begin_resume(token, 1, 3.0)
    assert session.journal.replay(attempt.last_seq, 3.0) is None  # the shell sends journal_gap
    assert session.journal.dropped_through == 3
    # What the shell does next: no replay, live events follow from the head.
    assert session.journal.replay(session.journal.head, 3.0) == []
    assert session.commit_resume(attempt, 3.0) == Commit(2, None)


def test_a_resume_that_needs_nothing_dropped_gets_the_rest() -> None:
    session, token = small_journal_session()
    for _ in range(3):
        emit(session)
    session.detach(1, 1.0)
    attempt = session.begin_resume(token, 2, 2.0)  # 3 is still journaled
    assert [e.seq for e in session.journal.replay(attempt.last_seq, 2.0) or []] == [3]


def test_replay_from_the_head_is_empty() -> None:
    session, token = opened(make_registry())
    emit(session)
    emit(session)
    session.detach(1, 0.0)
    attempt = session.begin_resume(token, 2, 1.0)
    assert session.journal.replay(attempt.last_seq, 1.0) == []
    assert session.commit_resume(attempt, 1.0) == Commit(2, None)


def test_replay_after_ttl_reports_a_gap() -> None:
    session, token = opened(make_registry(journal_ttl_s=10.0, disconnect_grace_s=100.0))
    emit(session, 0.0)
    emit(session, 8.0)
    session.detach(1, 8.0)
    attempt = session.begin_resume(token, 0, 12.0)  # entry 1 is older than the TTL
    assert session.journal.replay(0, 12.0) is None
    assert session.journal.dropped_through == 1
    assert [e.seq for e in session.journal.replay(1, 12.0) or []] == [2]
    assert session.commit_resume(attempt, 12.0) is not None


def test_journal_floor_lets_a_replay_resume_after_an_ack_by_the_old_attachment() -> None:
    session, token = opened(make_registry())
    attempt = session.begin_resume(token, 0, 0.0)  # a takeover: generation 1 still attached
    assert session.journal.replay(0, 0.0) == []
    emit(session)  # goes live to generation 1 and into the journal
    session.ack(1)  # generation 1 acks it before the commit
    assert session.journal.replay(attempt.last_seq, 0.0) is None  # the resume needs a dropped entry
    # The shell recovers with cursor = journal.floor; the replay must make progress.
    assert session.journal.floor == 1
    assert session.journal.replay(session.journal.floor, 0.0) == []
    assert session.commit_resume(attempt, 0.0) == Commit(2, replaced=1)
