"""A session's life in trio: its engine, its timer, and the connection attached to it.

A ``SessionRunner`` task lives in the server's sessions nursery, not in any connection's,
so the session and its engine outlive connections. It owns the engine's cancel scope;
teardown (the engine gone) happens before the slot is released, and the slot is released
before the terminal event is queued for the attached connection.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import attrs
import trio

from ..core.session import Commit, Session, Terminal
from ..core.wire import (
    CLOSE_REPLACED,
    REASON_CLIENT_CLOSE,
    REASON_ENGINE_ERROR,
    REASON_ENGINE_FINISHED,
    REASON_SHUTDOWN,
    ProtocolError,
    encode,
    is_seq,
)
from ..engines.api import YIELD_EVERY, Engine, EngineSession, Event, Inbox
from .connection import Connection

if TYPE_CHECKING:
    from .server import DuplexServer

log = logging.getLogger("trio_duplex")

_CONTROL_INPUT = frozenset({"session.update", "session.heartbeat", "session.close"})


def check_input(engine: Engine | None, event: Event) -> None:
    """Validate a client event bound for a session (not a resume). Raises ProtocolError.

    ``engine`` may be None only before one exists, for a first ``session.update``."""
    kind = event["type"]
    if kind == "session.update":
        if not isinstance(event.get("session"), dict):
            raise ProtocolError("bad_event", "session must be an object", param="session")
    elif kind == "session.event_ack" or kind in _CONTROL_INPUT:
        return
    elif kind == "session.resume":
        raise ProtocolError(
            "unsupported_session_resume",
            "session.resume must be the first message of a new connection",
        )
    elif engine is None or kind not in engine.accepts:
        raise ProtocolError("unknown_event", f"event type {kind!r} is not accepted", param="type")
    else:
        engine.check(event)
    seq = event.get("client_event_seq")
    if seq is not None and not (is_seq(seq) and seq > 0):
        raise ProtocolError(
            "bad_event", "client_event_seq must be a positive integer", param="client_event_seq"
        )


@attrs.define(eq=False)
class SessionRunner:
    server: DuplexServer
    session: Session
    engine: Engine
    conn: Connection | None = None
    resumer: Connection | None = None
    """A resuming connection owed the terminal event of a session that ended detached."""
    _unyielded: int = 0
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    due: float = math.inf
    """When the server's timer will next look at this session (see _timers.py)."""
    _inbox: Inbox = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._inbox = Inbox(self.server.config.max_pending_input)

    # -- lifetime ----------------------------------------------------------------------

    async def run(self) -> None:
        session = self.session
        try:
            with self._scope:
                await self._run_engine()
        finally:
            self._inbox.close()
            if session.terminal is None:  # the server itself was cancelled
                session.begin_close(REASON_SHUTDOWN, trio.current_time())
            self.server.registry.release(session)
            self.server.runners.pop(session.id, None)
            self.server.timers.forget(self)
            self.server.changed()
            terminal = session.terminal
            assert terminal is not None
            if terminal.generation is None:  # ended detached: only a resumer can hear it
                target = self.resumer
            elif self.conn is not None and self.conn.generation == terminal.generation:
                target = self.conn
            else:
                target = None
            if target is not None:
                target.finish([encode(terminal.event)], terminal.close_code)
            log.info("session %s ended: %s", session.id, terminal.reason)

    async def _run_engine(self) -> None:
        handle = EngineSession(self.session.id, self.session.config, self._inbox, self._emit)
        try:
            await self.engine.run(handle)
        except Exception:
            log.exception("engine of session %s failed", self.session.id)
            self.end(REASON_ENGINE_ERROR)
        else:
            self.end(REASON_ENGINE_FINISHED)

    def next_deadline(self) -> float:
        return self.session.next_deadline()

    def fire(self, now: float) -> None:
        """The server's timer: a deadline of this session may have passed."""
        self.apply(self.session.poll(now))
        self.reschedule()

    def reschedule(self) -> None:
        """A deadline may have moved (opened, detached, resume begun or ended)."""
        self.server.timers.schedule(self)

    def apply(self, terminal: Terminal | None) -> None:
        """The core decided the end: tear down (the ``run`` finally does the rest)."""
        if terminal is not None:
            self._scope.cancel()

    def end(self, reason: str) -> None:
        self.apply(self.session.begin_close(reason, trio.current_time()))

    # -- attachment --------------------------------------------------------------------

    def attach(self, conn: Connection, commit: Commit) -> None:
        old, self.conn = self.conn, conn
        conn.generation = commit.generation
        if old is not None and old is not conn:
            old.release_waiters()
            if commit.replaced == old.generation:
                replaced = {
                    "type": "session.replaced",
                    "session_id": self.session.id,
                    "attachment_generation": commit.generation,
                }
                old.finish([encode(replaced)], CLOSE_REPLACED, flush=False)
                old.abort_after(self.server.close_timeout_s)
        if self.server.registry.shutting_down:  # attached during the drain: warn it too
            conn.push(self.server.going_away_frame())

    def connection_lost(self, conn: Connection) -> None:
        if self.session.detach(conn.generation, trio.current_time()):
            log.info("session %s detached (generation %d)", self.session.id, conn.generation)
            self.reschedule()
        if self.conn is conn:
            conn.release_waiters()

    # -- the per-event paths -----------------------------------------------------------

    async def _emit(self, event: Event) -> None:
        # A cancellation point on every send, but a scheduler round only on every
        # YIELD_EVERY-th one (or when the connection is congested): a full checkpoint
        # per event cost a task switch per event, and an engine that only sends still
        # cannot starve the others.
        await trio.lowlevel.checkpoint_if_cancelled()
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        emitted = self.session.emit(event, trio.current_time())
        conn = self.conn
        if emitted is None or conn is None or not self.session.is_current(conn.generation):
            return
        # While more input waits for the engine, more output will follow at once: let
        # the pump send it together. Otherwise write it now, from this task.
        coalesce = len(self._inbox) > 0
        if emitted.notice is not None:
            conn.push(emitted.notice, coalesce=coalesce)
        conn.push(emitted.frame, coalesce=coalesce)
        # Wait only while this connection is still the session's live attachment: once
        # it is lost or replaced, output goes to the journal without waiting.
        while (
            conn.congested and conn.close_code is None and self.session.is_current(conn.generation)
        ):
            await conn.wait_drained()

    def handle(self, conn: Connection, event: Event) -> None:
        """One client event from ``conn``, already decoded. Never awaits."""
        session = self.session
        if not session.is_current(conn.generation):
            return  # a replaced or ending attachment: fenced off
        now = trio.current_time()
        session.touch(now)
        try:
            check_input(self.engine, event)
            kind = event["type"]
            if kind == "session.heartbeat":
                conn.push(encode({"type": "session.heartbeat_ack", "session_id": session.id}))
            elif kind == "session.event_ack":
                session.ack(event.get("server_event_seq"))
            elif kind == "session.close":
                self.end(REASON_CLIENT_CLOSE)
            else:
                self._to_engine(event)
        except ProtocolError as exc:
            conn.push(encode(exc.to_event(event)))

    def _to_engine(self, event: Event) -> None:
        seq = event.get("client_event_seq")
        session = self.session
        if seq is not None and not session.is_new_client_seq(seq):
            return  # a resend of something already received
        try:
            self._inbox.put_nowait(event)
        except trio.WouldBlock:
            raise ProtocolError(
                "input_backpressure", "the session's input queue is full; retry later"
            ) from None
        if seq is not None:
            session.note_client_seq(seq)
