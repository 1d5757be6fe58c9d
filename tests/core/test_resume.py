"""docs/protocol.md, Resume, through the core with time as a number: every refusal,
success, replay, token rotation, journal_gap, takeover, concurrent and half-way resumes.

The shell's part (a takeover's ``session.replaced`` delivered and its connection closed,
frames still arriving on a replaced connection, output racing a takeover, a resume held
mid-write) is tests/server/test_protocol_resume.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from trio_duplex.core.events import Reason
from trio_duplex.core.protocol import Action
from trio_duplex.core.session import State

from ..helpers import RESUMED_FIELDS, assert_error_shape, resume_event
from .driving import (
    TEXT,
    advance,
    detached_session,
    finish_resume,
    make_registry,
    open_session,
    refused,
    resume,
    start_resume,
    state_of,
)


def seqs(writes: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in writes if "server_event_seq" in e]


# -- refusals -----------------------------------------------------------------------------


def test_unknown_session_is_session_resume_expired() -> None:
    event = resume_event("sess_does_not_exist", "token", 0, event_id="r1")
    error = refused(make_registry(), event, "session_resume_expired")
    assert error["event_id"] == "r1"


def test_closed_session_is_session_resume_expired() -> None:
    registry = make_registry()
    conn = open_session(registry)
    decision = conn.send({"type": "session.close"})
    assert decision.action is Action.END and decision.terminal is not None
    assert registry.release(conn.session)  # its teardown finished
    refused(registry, resume_event(conn.session.id, conn.token), "session_resume_expired")


def test_expired_session_is_session_resume_expired() -> None:
    registry = make_registry(disconnect_grace_s=5)
    conn = detached_session(registry)
    advance(registry, 6.0)
    event = resume_event(conn.session.id, conn.token)
    refused(registry, event, "session_resume_expired", 6.0)


def test_a_due_expiry_wins_over_a_resume_before_its_timer_fired() -> None:
    registry = make_registry(disconnect_grace_s=5)
    conn = detached_session(registry)
    event = resume_event(conn.session.id, conn.token)
    refused(registry, event, "session_resume_expired", 6.0)
    assert conn.session.terminal is not None
    assert conn.session.terminal.reason == Reason.GRACE_EXPIRED


def test_idle_expired_session_is_session_resume_expired() -> None:
    registry = make_registry(idle_ttl_s=5)
    conn = open_session(registry)
    (terminal,) = advance(registry, 5.0)
    assert (terminal.reason, terminal.generation) == (Reason.IDLE_EXPIRED, 1)
    event = resume_event(conn.session.id, conn.token)
    refused(registry, event, "session_resume_expired", 5.0)


@pytest.mark.parametrize("token", ["wrong", "", "x" * 43])
def test_wrong_token_is_invalid_resume_token(token: str) -> None:
    registry = make_registry()
    conn = detached_session(registry)
    sid = conn.session.id
    error = refused(registry, resume_event(sid, token, 0, event_id="r2"), "invalid_resume_token")
    assert error["event_id"] == "r2"
    # A refused attempt changes nothing: the real token still works.
    assert state_of(registry, sid) == "detached"
    _, writes = resume(registry, sid, conn.token)
    assert writes[0]["type"] == "session.resumed"


def test_token_of_another_session_is_invalid_resume_token() -> None:
    registry = make_registry()
    a, b = detached_session(registry), detached_session(registry)
    refused(registry, resume_event(a.session.id, b.token), "invalid_resume_token")


MALFORMED = [
    {"type": "session.resume"},
    {"type": "session.resume", "resume_token": "t"},
    {"type": "session.resume", "session_id": "s"},
    {"type": "session.resume", "session_id": 5, "resume_token": "t"},
    {"type": "session.resume", "session_id": "s", "resume_token": None},
    {"type": "session.resume", "session_id": "s", "resume_token": ["t"]},
]


@pytest.mark.parametrize("event", MALFORMED)
def test_malformed_resume_is_invalid_session_resume(event: dict[str, Any]) -> None:
    error = refused(make_registry(), {**event, "event_id": "r3"}, "invalid_session_resume")
    assert error["event_id"] == "r3"


@pytest.mark.parametrize("last", [-1, "1", 1.5, True, None, [0]])
def test_malformed_last_seq_is_invalid_session_resume(last: object) -> None:
    registry = make_registry()
    conn = detached_session(registry, events=2)
    event = resume_event(conn.session.id, conn.token)
    event["last_received_server_event_seq"] = last
    refused(registry, event, "invalid_session_resume")
    assert state_of(registry, conn.session.id) == "detached"


def test_last_seq_above_the_newest_is_invalid_session_resume() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=2)
    sid = conn.session.id
    error = refused(registry, resume_event(sid, conn.token, 3), "invalid_session_resume")
    assert error["param"] == "last_received_server_event_seq"
    # Refused, not half-done: the token was not rotated away, the session is detached.
    assert state_of(registry, sid) == "detached"
    _, writes = resume(registry, sid, conn.token, 2)
    assert [e["type"] for e in writes] == ["session.resumed"]


def test_a_wrong_token_reveals_nothing_about_the_seq() -> None:
    # docs/protocol.md orders the checks: the token before the seq.
    registry = make_registry()
    conn = detached_session(registry, events=1)
    refused(registry, resume_event(conn.session.id, "wrong", 99), "invalid_resume_token")


def test_resume_errors_carry_a_message() -> None:
    error = refused(make_registry(), resume_event("nope", "nope"), "session_resume_expired")
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) <= {"type", "code", "message", "retryable", "event_id", "param"}


# -- success ------------------------------------------------------------------------------


def test_resumed_fields_then_replay_then_live() -> None:
    registry = make_registry()
    conn = open_session(registry, config={"voice": "v"})
    for n in range(1, 5):
        conn.echo(f"e{n}", seq=n)
    conn.lost()
    new, writes = resume(registry, conn.session.id, conn.token, 1)
    resumed, *replay = writes
    assert set(resumed) == RESUMED_FIELDS
    assert resumed["type"] == "session.resumed"
    assert resumed["session_id"] == conn.session.id
    assert resumed["session"] == {"voice": "v"}
    assert resumed["attachment_generation"] == 2
    assert resumed["last_received_client_event_seq"] == 4
    assert resumed["consumed_client_event_seq"] == 0  # no report due yet (128 events)
    assert isinstance(resumed["resume_token"], str)
    assert resumed["resume_token"] != conn.token
    assert "server_event_seq" not in resumed
    assert [(e["text"], e["server_event_seq"]) for e in replay] == [
        ("e2", 2),
        ("e3", 3),
        ("e4", 4),
    ]
    assert new.echo("live")["server_event_seq"] == 5


def test_last_seq_defaults_to_zero() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=2)
    _, writes = resume(registry, conn.session.id, conn.token)
    assert writes[0]["type"] == "session.resumed"
    assert seqs(writes) == [1, 2]


def test_resume_at_the_newest_seq_replays_nothing() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=3)
    _, writes = resume(registry, conn.session.id, conn.token, 3)
    assert [e["type"] for e in writes] == ["session.resumed"]


def test_the_resume_acks_everything_up_to_its_seq() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=5)
    journal = conn.session.journal
    assert len(journal) == 5
    _, writes = resume(registry, conn.session.id, conn.token, 3)
    assert seqs(writes) == [4, 5]
    assert len(journal) == 2


def test_generation_increments_with_every_resume() -> None:
    registry = make_registry()
    conn = open_session(registry)
    for generation in range(2, 6):
        assert conn.lost()
        conn, writes = resume(registry, conn.session.id, conn.token)
        assert writes[0]["attachment_generation"] == conn.generation == generation


def test_journal_gap_resumed_then_resync_then_what_is_held_then_live() -> None:
    registry = make_registry()
    conn = open_session(registry)
    for n in range(3):
        conn.echo(str(n))
    assert conn.send({"type": "session.event_ack", "server_event_seq": 2}).action is Action.IGNORE
    conn.heartbeat()
    conn.lost()
    new, writes = resume(registry, conn.session.id, conn.token, 0)
    resumed, notice, held = writes
    assert resumed["type"] == "session.resumed"
    assert notice == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": 2,  # the last seq the journal no longer holds
    }
    assert (held["text"], held["server_event_seq"]) == ("2", 3)  # still held: replayed
    assert new.echo()["server_event_seq"] == 4


def test_resume_at_the_head_after_acking_everything_has_no_gap() -> None:
    registry = make_registry()
    conn = open_session(registry)
    for _ in range(3):
        conn.echo()
    conn.send({"type": "session.event_ack", "server_event_seq": 3})
    conn.lost()
    _, writes = resume(registry, conn.session.id, conn.token, 3)
    assert [e["type"] for e in writes] == ["session.resumed"]  # no resync_required


# -- token rotation -----------------------------------------------------------------------


def test_the_new_token_works_and_kills_the_old_one() -> None:
    registry = make_registry()
    conn = detached_session(registry)
    sid, t0 = conn.session.id, conn.token
    conn, _ = resume(registry, sid, t0)
    t1 = conn.token
    conn.lost()
    conn, writes = resume(registry, sid, t1)
    assert writes[0]["type"] == "session.resumed"
    t2 = conn.token
    conn.lost()
    refused(registry, resume_event(sid, t0), "invalid_resume_token")
    _, writes = resume(registry, sid, t2)
    assert writes[0]["type"] == "session.resumed"


def test_a_lost_session_resumed_leaves_the_presented_token_valid() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=2)
    sid, t0 = conn.session.id, conn.token
    # The connection dies before session.resumed reaches the client: it still has t0.
    lost, _ = resume(registry, sid, t0, 0)
    lost.lost()
    conn, writes = resume(registry, sid, t0, 0)
    assert writes[0]["type"] == "session.resumed"
    assert seqs(writes) == [1, 2]
    # Presenting the newest token kills t0.
    conn.lost()
    conn, writes = resume(registry, sid, conn.token, 2)
    assert writes[0]["type"] == "session.resumed"
    conn.lost()
    refused(registry, resume_event(sid, t0), "invalid_resume_token")


def resumed_once(registry: Any) -> tuple[Any, str, str, str]:
    """Open a session, lose its connection and resume it: the resumed connection, the
    session id, the token presented (t0) and the one issued (t1)."""
    conn = open_session(registry)
    sid, t0 = conn.session.id, conn.token
    conn.lost()
    conn, _ = resume(registry, sid, t0)
    return conn, sid, t0, conn.token


def test_presented_token_stays_valid_after_a_committed_resume() -> None:
    registry = make_registry()
    conn, sid, t0, t1 = resumed_once(registry)  # t1 issued, maybe lost
    conn.lost()
    conn, writes = resume(registry, sid, t0)  # t0 again: accepted, t2 issued
    assert writes[0]["type"] == "session.resumed"
    assert writes[0]["attachment_generation"] == 3
    t2 = conn.token
    assert len({t0, t1, t2}) == 3
    conn.lost()
    # t1 was never presented and has been replaced by t2: no other old token works.
    refused(registry, resume_event(sid, t1), "invalid_resume_token")
    _, writes = resume(registry, sid, t2)
    assert writes[0]["type"] == "session.resumed"


def test_the_presented_token_dies_with_the_first_event_on_the_resumed_connection() -> None:
    # Was: the pre-rotation token stayed valid until the next resume, so whoever stole it
    # could take over a live session whose client already held the new token.
    registry = make_registry()
    conn, sid, t0, t1 = resumed_once(registry)
    conn.echo("holds t1")  # the client shows it has session.resumed
    refused(registry, resume_event(sid, t0), "invalid_resume_token")
    assert state_of(registry, sid) == "attached" and conn.current
    assert conn.echo("undisturbed")["server_event_seq"] == 2
    conn.lost()
    _, again = resume(registry, sid, t1)
    assert again[0]["type"] == "session.resumed"


def test_until_the_first_event_a_lost_session_resumed_can_be_retried() -> None:
    registry = make_registry()
    conn, sid, t0, _ = resumed_once(registry)  # committed, then lost before any event
    conn.lost()
    _, again = resume(registry, sid, t0)
    assert again[0]["type"] == "session.resumed"


def test_tokens_are_stored_only_as_digests() -> None:
    registry = make_registry()
    conn = detached_session(registry)
    t0 = conn.token
    conn, _ = resume(registry, conn.session.id, t0)
    t1 = conn.token
    session = conn.session
    stored = []
    for obj in (session, session.credentials):
        for name in getattr(type(obj), "__slots__", ()) or vars(obj):
            stored.append(getattr(obj, name, None))
    # docs/protocol.md: SHA-256 digests (this also proves the walk sees the store).
    assert hashlib.sha256(t1.encode()).digest() in stored
    for token in (t0, t1):
        for value in stored:
            assert value != token and value != token.encode()
        assert token not in repr(session)
        assert token not in repr(session.credentials)


# -- takeover -----------------------------------------------------------------------------


def test_takeover_of_a_takeover() -> None:
    registry = make_registry()
    first = open_session(registry)
    second, writes2 = resume(registry, first.session.id, first.token)
    assert writes2[0]["attachment_generation"] == 2
    assert (second.generation, second.replaced) == (2, 1)
    third, writes3 = resume(registry, first.session.id, second.token)
    assert writes3[0]["attachment_generation"] == 3
    assert (third.generation, third.replaced) == (3, 2)
    assert not first.current and not second.current and third.current
    third.heartbeat()


def test_the_loss_of_a_replaced_connection_detaches_nothing() -> None:
    registry = make_registry()
    old = open_session(registry)
    old.echo("one")
    new, _ = resume(registry, old.session.id, old.token, 1)
    assert old.lost() is False
    assert old.send({"type": TEXT, "text": "ghost", "client_event_seq": 7}).action is (
        Action.IGNORE
    )
    assert state_of(registry, old.session.id) == "attached"
    assert new.echo("two")["server_event_seq"] == 2
    assert old.session.client_seq == 0  # "ghost" never counted


def test_takeover_replays_what_the_old_connection_had_not_acked() -> None:
    registry = make_registry()
    old = open_session(registry)
    for n in range(3):
        old.echo(str(n))
    new, writes = resume(registry, old.session.id, old.token, 1)
    assert seqs(writes) == [2, 3]
    assert new.echo("live")["server_event_seq"] == 4


# -- concurrent and half-way resumes ------------------------------------------------------


def test_concurrent_resume_gets_session_resume_conflict() -> None:
    registry = make_registry()
    conn = detached_session(registry, events=1)
    sid, t0 = conn.session.id, conn.token
    winner = start_resume(registry, resume_event(sid, t0, 0))  # in progress
    late = resume_event(sid, t0, 0, event_id="late")
    error = refused(registry, late, "session_resume_conflict", retryable=True)
    assert error["event_id"] == "late"
    won, writes = finish_resume(winner)
    assert writes[0]["type"] == "session.resumed"
    assert seqs(writes) == [1]
    # Arriving after the winner finished, with a still-valid token: a takeover.
    third, writes3 = resume(registry, sid, t0, 1)
    assert writes3[0]["type"] == "session.resumed"
    assert (third.generation, third.replaced) == (3, won.generation)
    assert not won.current


def test_resume_failing_half_way_leaves_a_detached_session_detached() -> None:
    registry = make_registry(disconnect_grace_s=20)
    conn = detached_session(registry, events=2)  # lost at 0
    sid, t0 = conn.session.id, conn.token
    half = start_resume(registry, resume_event(sid, t0, 0), 5.0)
    assert json.loads(half.next_frames(5.0)[0])["type"] == "session.resumed"
    assert conn.session.abort_resume(half.attempt, 8.0) is None  # its connection was cut
    assert state_of(registry, sid) == "detached"
    # Still inside its original grace, not a new one ...
    assert conn.session.next_deadline() == 20.0
    assert advance(registry, 19.8) == []
    _, writes = resume(registry, sid, t0, 0, 19.8)
    assert writes[0]["type"] == "session.resumed"
    assert seqs(writes) == [1, 2]


def test_grace_is_not_extended_by_a_failed_resume() -> None:
    registry = make_registry(disconnect_grace_s=20)
    conn = detached_session(registry, events=1)  # it spoke: the whole grace, 20 s
    session, sid, t0 = conn.session, conn.session.id, conn.token
    half = start_resume(registry, resume_event(sid, t0, 0), 15.0)
    half.next_frames(15.0)
    assert session.abort_resume(half.attempt, 16.0) is None
    (terminal,) = advance(registry, 20.1)
    assert terminal.reason == Reason.GRACE_EXPIRED
    assert state_of(registry, sid) is None
    refused(registry, resume_event(sid, t0), "session_resume_expired", 20.1)


def test_resume_failing_half_way_leaves_the_old_connection_attached() -> None:
    registry = make_registry()
    old = open_session(registry)
    old.echo("a")
    half = start_resume(registry, resume_event(old.session.id, old.token, 0))
    half.next_frames(0.0)
    assert old.session.abort_resume(half.attempt, 0.0) is None
    assert state_of(registry, old.session.id) == "attached"
    assert old.current and old.session.generation == 1  # not replaced
    assert old.echo("b")["server_event_seq"] == 2


# -- session.resume anywhere else ---------------------------------------------------------


@pytest.mark.parametrize("own", [True, False], ids=["same-session", "other-session"])
def test_resume_mid_session_is_unsupported_and_the_session_goes_on(own: bool) -> None:
    registry = make_registry()
    other = detached_session(registry)
    conn = open_session(registry)
    conn.echo("a")
    target = conn if own else other
    event = resume_event(target.session.id, target.token, 0, event_id="mid")
    decision = conn.send(event)
    assert decision.action is Action.REFUSE and decision.frame is not None
    assert decision.close_code is None  # the connection stays open
    error = json.loads(decision.frame)
    assert_error_shape(error)
    assert error["code"] == "unsupported_session_resume"
    assert error["retryable"] is False
    assert error["event_id"] == "mid"
    assert conn.echo("b")["server_event_seq"] == 2
    assert conn.current
    assert other.session.state is State.DETACHED and other.session.resume is None
