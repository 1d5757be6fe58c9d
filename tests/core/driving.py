"""The core driven as the trio shell drives it, with time as a number and no I/O.

Each step is the shell's, spelled with the core's own objects: a connection's client events
go through ``ClientEvents.receive`` (core/protocol.py); a resume is the shell's order
(server/sessions/opening.py): ``first_step``, ``lookup_for_resume``, ``poll``,
``begin_resume``, ``Replay.next_frames`` until caught up, ``commit_resume``; the timers
fire each session's ``next_deadline`` and a session that ended is released, as its
teardown does. What the shell alone does (sockets, tasks, trio timers) is tested in
tests/server."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from trio_duplex.core import opening
from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import Action, ClientEvents, Decision
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session, State, Terminal
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE

from ..helpers import assert_error_shape, resume_event

TEXT = "input.text.append"
DELTA = "response.output_text.delta"


@attrs.define
class EchoRules:
    """The engine's checks, as the echo engine's: it takes text input."""

    accepts: frozenset[str] = frozenset({TEXT})

    def check(self, event: dict[str, Any]) -> None:
        del event


def make_registry(**limits: Any) -> Registry:
    return Registry(Limits(**limits), spelling=NATIVE)


@attrs.define(eq=False)
class Conn:
    """One connection: the session it is attached to and the generation it holds."""

    session: Session
    generation: int
    token: str
    """The newest resume token its client was given."""
    replaced: int | None = None
    """The generation this connection's resume replaced (a takeover), if any."""
    machine: ClientEvents = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        budget = ConfigBudget.of(self.session.config, 64 * 1024)
        self.machine = ClientEvents(self.session, EchoRules(), budget, lambda size: True)

    def send(self, event: dict[str, Any], now: float = 0.0) -> Decision:
        return self.machine.receive(event, len(json.dumps(event)), self.generation, now)

    def echo(self, text: str = "x", now: float = 0.0, seq: int | None = None) -> dict[str, Any]:
        """``input.text.append`` and the echo engine's answer to it, as journaled."""
        event: dict[str, Any] = {"type": TEXT, "text": text}
        if seq is not None:
            event["client_event_seq"] = seq
        assert self.send(event, now).action is Action.ENGINE
        return engine_emits(self.session, text, now)

    def heartbeat(self, now: float = 0.0) -> None:
        decision = self.send({"type": "session.heartbeat"}, now)
        assert decision.action is Action.REPLY and decision.frame is not None
        assert json.loads(decision.frame)["type"] == "session.heartbeat_ack"

    def lost(self, now: float = 0.0) -> bool:
        """The connection is gone (a cut, a close frame, a failed send)."""
        return self.session.detach(self.generation, now)

    @property
    def current(self) -> bool:
        return self.session.is_current(self.generation)


def engine_emits(session: Session, text: str, now: float = 0.0) -> dict[str, Any]:
    emitted = session.emit({"type": DELTA, "text": text}, now)
    assert emitted is not None
    event: dict[str, Any] = json.loads(emitted.frame)
    return event


def open_session(
    registry: Registry, now: float = 0.0, config: dict[str, Any] | None = None
) -> Conn:
    """``session.update`` then ``session.created`` delivered: the client has said nothing
    since (as ``Simulation.open_session``)."""
    session, token = registry.admit(dict(config or {}))
    session.handshake_delivered(now)
    return Conn(session, session.generation, token)


def detached_session(registry: Registry, events: int = 0, now: float = 0.0) -> Conn:
    """Open a session, echo ``events`` times, lose the connection."""
    conn = open_session(registry, now)
    for n in range(events):
        conn.echo(f"e{n + 1}", now)
    assert conn.lost(now)
    return conn


def start_resume(registry: Registry, event: dict[str, Any], now: float = 0.0) -> Replay:
    """A connection's first message is ``event``: up to the replay (ProtocolError: refused)."""
    resume = opening.first_step(opening.OPEN, event)
    assert resume is not None
    session = registry.lookup_for_resume(resume.session_id)
    if session.state is State.OPENING:
        raise opening.not_resumable()
    session.poll(now)  # a due expiry wins before the resume is looked at
    return Replay(session.begin_resume(resume.token, resume.last_seq, now))


def finish_resume(replay: Replay, now: float = 0.0) -> tuple[Conn, list[dict[str, Any]]]:
    """Write the replay until caught up, then commit: the new connection and its frames."""
    writes: list[dict[str, Any]] = []
    while frames := replay.next_frames(now):
        writes.extend(json.loads(frame) for frame in frames)
    attempt = replay.attempt
    commit = attempt.session.commit_resume(attempt, now)
    assert commit is not None
    return Conn(attempt.session, commit.generation, attempt.new_token, commit.replaced), writes


def resume(
    registry: Registry, session_id: str, token: str, last: int | None = None, now: float = 0.0
) -> tuple[Conn, list[dict[str, Any]]]:
    """A whole resume: the new connection and what was written on it, in order
    (``session.resumed`` first)."""
    return finish_resume(start_resume(registry, resume_event(session_id, token, last), now), now)


def refused(
    registry: Registry,
    event: dict[str, Any],
    code: str,
    now: float = 0.0,
    *,
    retryable: bool = False,
    close_code: int = 4001,
) -> dict[str, Any]:
    """The resume ``event`` is answered ``error{code}`` and the connection closed."""
    with pytest.raises(ProtocolError) as info:
        start_resume(registry, event, now)
    exc = info.value
    error = exc.to_event(event)
    assert_error_shape(error)
    assert error["code"] == code, error
    assert error["retryable"] is retryable
    assert exc.close_code == close_code
    return error


def advance(registry: Registry, now: float) -> list[Terminal]:
    """Fire every session timer due by ``now``, each at its deadline, as the shell's
    timers do; a session that ends is released (its teardown finished)."""
    ended = []
    for session in list(registry.sessions.values()):
        deadline = session.next_deadline()
        if deadline <= now:
            terminal = session.poll(deadline)
            if terminal is not None:
                ended.append(terminal)
                assert registry.release(session)
    return ended


def state_of(registry: Registry, session_id: str) -> str | None:
    """The session's state, None once it is gone (as tests/helpers.state_of)."""
    session = registry.sessions.get(session_id)
    return None if session is None else session.state.value
