"""docs/protocol.md, Disconnect, grace and expiry, through the core with time as a number:
the grace period and its restart, the unconfirmed grace of a client that never spoke,
idle expiry and what resets its clock, and an expiry at the instant of a resume.

The shell's part (what loss of a connection is: a close frame, a cut, a failed send, an
unanswered ping; the engine cancelled; timers racing client events and the engine) is
tests/server/test_protocol_disconnect.py."""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

import pytest

from trio_duplex.core.events import Reason
from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import Action
from trio_duplex.core.session import Registry

from ..helpers import resume_event
from .driving import (
    Conn,
    advance,
    engine_emits,
    make_registry,
    open_session,
    refused,
    resume,
    state_of,
)


def speak(conn: Conn, now: float = 0.0) -> None:
    """The client says something after ``session.created`` (tests/helpers.speak)."""
    conn.heartbeat(now)


def expires_at(registry: Registry, conn: Conn, deadline: float) -> None:
    """The detached session ends exactly at ``deadline``, as a grace expiry."""
    session = conn.session
    assert state_of(registry, session.id) == "detached"
    assert session.next_deadline() == pytest.approx(deadline)  # when its timer fires
    assert advance(registry, deadline - 0.1) == []
    assert state_of(registry, session.id) == "detached"
    (terminal,) = advance(registry, deadline + 0.1)
    assert state_of(registry, session.id) is None  # ended, its slot free
    assert terminal.event == {
        "type": "session.expired",
        "session_id": session.id,
        "reason": "disconnect_grace_expired",
        "usage": ANY,
    }
    assert (terminal.close_code, terminal.generation) == (1000, None)
    assert registry.slots_held == 0
    refused(registry, resume_event(session.id, conn.token), "session_resume_expired", deadline)


# -- the grace period ---------------------------------------------------------------------


def test_grace_expiry_closes_the_detached_session() -> None:
    registry = make_registry(disconnect_grace_s=30)
    conn = open_session(registry)
    speak(conn)
    assert conn.lost(0.0)
    expires_at(registry, conn, 30)


def test_resume_just_inside_the_grace_succeeds() -> None:
    registry = make_registry(disconnect_grace_s=30)
    conn = open_session(registry)
    speak(conn)
    conn.lost(0.0)
    new, writes = resume(registry, conn.session.id, conn.token, now=29.9)
    assert writes[0]["type"] == "session.resumed"
    assert advance(registry, 89.9) == []  # attached again: no grace expiry any more
    assert state_of(registry, conn.session.id) == "attached" and new.current


def test_grace_restarts_after_each_new_loss() -> None:
    registry = make_registry(disconnect_grace_s=10)
    conn = open_session(registry)
    speak(conn)  # (after a resume the whole grace applies at once)
    now = 0.0
    for _ in range(3):
        assert conn.lost(now)
        now += 9
        assert advance(registry, now) == []
        conn, writes = resume(registry, conn.session.id, conn.token, now=now)
        assert writes[0]["type"] == "session.resumed"
    conn.lost(now)
    assert advance(registry, now + 9.9) == []
    assert len(advance(registry, now + 10.1)) == 1
    assert state_of(registry, conn.session.id) is None


def test_zero_grace_closes_at_once() -> None:
    registry = make_registry(disconnect_grace_s=0)
    conn = open_session(registry)
    conn.lost(5.0)
    assert conn.session.next_deadline() == 5.0
    (terminal,) = advance(registry, 5.0)
    assert terminal.reason == Reason.GRACE_EXPIRED
    assert registry.slots_held == 0
    refused(registry, resume_event(conn.session.id, conn.token), "session_resume_expired", 5.0)


def test_a_later_second_report_of_the_loss_does_not_restart_the_grace() -> None:
    registry = make_registry(disconnect_grace_s=10)
    conn = open_session(registry)
    speak(conn)
    assert conn.lost(0.0)  # the write half dies first ...
    engine_emits(conn.session, "lost", 0.0)  # journaled while detached
    assert conn.lost(5.0) is False  # ... the read half is noticed 5 s later
    assert advance(registry, 9.9) == []
    assert state_of(registry, conn.session.id) == "detached"
    assert len(advance(registry, 10.1)) == 1
    assert state_of(registry, conn.session.id) is None


def test_grace_expiry_at_the_instant_of_a_resume_wins() -> None:
    # The shell polls before it looks at a resume: at the deadline, the expiry is due.
    registry = make_registry(disconnect_grace_s=10)
    conn = open_session(registry)
    speak(conn)
    conn.lost(0.0)
    refused(registry, resume_event(conn.session.id, conn.token), "session_resume_expired", 10.0)
    terminal = conn.session.terminal
    assert terminal is not None and terminal.reason == Reason.GRACE_EXPIRED
    assert conn.session.resume is None


# -- the unconfirmed grace: a client that never spoke after session.created ---------------


def test_a_client_that_never_spoke_gets_the_unconfirmed_grace() -> None:
    registry = make_registry(disconnect_grace_s=30)
    assert Limits().unconfirmed_grace_s == 5  # the default
    conn = open_session(registry)
    conn.lost(0.0)
    expires_at(registry, conn, 5)


SPEAKING: dict[str, tuple[dict[str, Any], Action]] = {  # the event, what the core decides
    "heartbeat": ({"type": "session.heartbeat"}, Action.REPLY),
    "ack": ({"type": "session.event_ack", "server_event_seq": 0}, Action.IGNORE),
    "input": ({"type": "input.text.append", "text": "x"}, Action.ENGINE),
    "refused": ({"type": "nope"}, Action.REFUSE),  # unknown_event, but it decoded
}


@pytest.mark.parametrize("kind", SPEAKING)
def test_a_client_that_spoke_after_created_gets_the_whole_grace(kind: str) -> None:
    registry = make_registry(disconnect_grace_s=30)
    conn = open_session(registry)
    event, action = SPEAKING[kind]
    assert conn.send(event, 0.0).action is action
    conn.lost(0.0)
    expires_at(registry, conn, 30)


@pytest.mark.parametrize(
    "opening", [{"type": "session.heartbeat"}, {"type": "input.text.append", "text": "x"}]
)
def test_the_message_that_opened_the_session_does_not_count(opening: dict[str, Any]) -> None:
    """It was sent before session.created: it does not show the client received it."""
    registry = make_registry(disconnect_grace_s=30)
    session, token = registry.admit({})
    session.handshake_delivered(0.0, opening_event=True)  # not a session.update
    conn = Conn(session, session.generation, token)
    assert conn.send(opening, 0.0).action in (Action.REPLY, Action.ENGINE)  # its answer
    conn.lost(0.0)
    expires_at(registry, conn, 5)


def test_a_resume_inside_the_unconfirmed_grace_works_then_the_whole_grace_applies() -> None:
    registry = make_registry(disconnect_grace_s=30)
    conn = open_session(registry)
    conn.lost(0.0)
    engine_emits(conn.session, "while away", 4.9)
    new, writes = resume(registry, conn.session.id, conn.token, now=4.9)
    resumed, replayed = writes
    assert resumed["type"] == "session.resumed"
    assert (replayed["text"], replayed["server_event_seq"]) == ("while away", 1)
    assert advance(registry, 64.9) == []  # attached: no grace runs
    new.lost(64.9)  # lost again, having said nothing on it
    expires_at(registry, new, 64.9 + 30)


def test_the_unconfirmed_grace_is_never_longer_than_the_grace() -> None:
    registry = make_registry(disconnect_grace_s=2, unconfirmed_grace_s=5)
    conn = open_session(registry)
    conn.lost(0.0)
    expires_at(registry, conn, 2)


# -- idle expiry --------------------------------------------------------------------------


def idle_expiry(registry: Registry, conn: Conn, at: float) -> None:
    """The attached session expires idle at exactly ``at``, on its connection."""
    assert advance(registry, at - 0.1) == []
    (terminal,) = advance(registry, at + 0.1)
    assert terminal.event == {
        "type": "session.expired",
        "session_id": conn.session.id,
        "reason": "idle_ttl_expired",
        "usage": ANY,
    }
    assert (terminal.close_code, terminal.generation) == (1000, conn.generation)
    assert registry.slots_held == 0


def test_idle_ttl_expires_an_attached_session() -> None:
    registry = make_registry(idle_ttl_s=50)
    conn = open_session(registry)
    idle_expiry(registry, conn, 50)


def test_idle_ttl_default_is_300_seconds() -> None:
    registry = make_registry()
    conn = open_session(registry)
    idle_expiry(registry, conn, 300)


def test_heartbeat_resets_the_idle_clock() -> None:
    registry = make_registry(idle_ttl_s=10)
    conn = open_session(registry)
    for n in range(1, 6):
        assert advance(registry, 8.0 * n) == []
        conn.heartbeat(8.0 * n)
    idle_expiry(registry, conn, 50)


def test_any_client_event_resets_the_idle_clock() -> None:
    registry = make_registry(idle_ttl_s=10)
    conn = open_session(registry)
    conn.echo(now=9.0)
    assert advance(registry, 18.0) == []
    assert conn.send({"type": "session.event_ack", "server_event_seq": 1}, 18.0).action is (
        Action.IGNORE
    )
    idle_expiry(registry, conn, 28)


def test_server_output_does_not_reset_the_idle_clock() -> None:
    registry = make_registry(idle_ttl_s=10)
    conn = open_session(registry)
    for n in range(1, 4):
        engine_emits(conn.session, str(n), 3.0 * n)
    idle_expiry(registry, conn, 10)


def test_idle_ttl_does_not_run_while_detached() -> None:
    registry = make_registry(idle_ttl_s=10, disconnect_grace_s=30)
    conn = open_session(registry)
    speak(conn)
    conn.lost(0.0)
    assert advance(registry, 25.0) == []  # idle_ttl long past, grace not
    new, writes = resume(registry, conn.session.id, conn.token, now=25.0)
    assert writes[0]["type"] == "session.resumed"
    # Attached again: the idle clock starts from the resume.
    idle_expiry(registry, new, 35)
