"""The trio server shell: listeners, the WebSocket handshake, opening and resuming.

Task tree::

    DuplexServer.run
    ├── sessions nursery
    │   ├── Timers.run (every session's deadlines, every connection's next ping)
    │   ├── SessionRunner.run (one per session: runs its engine)
    │   └── Keepalive._ping (short-lived: one ping waiting for its pong)
    └── connections nursery
        ├── trio.serve_listeners
        └── one task per TCP connection: the handshake, then the reader (it parses
            the socket itself, _ws.py), owning a nursery for the pump (started by
            the first frame to send, _connection.py)

Nothing that one connection does can raise out of its own task: every error ends that
connection (1011) and is logged, and the session it held follows PROTOCOL.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import trio

from ..core.config import ServerConfig
from ..core.session import Commit, Registry, State, resync_frame
from ..core.wire import (
    CLOSE_CONFIG_TIMEOUT,
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_RESUME_REFUSED,
    REASON_SHUTDOWN,
    ProtocolError,
    decode,
    encode,
    error_event,
    is_seq,
)
from ..engines.api import Engine, EngineFactory, Event
from .connection import BATCH, Connection, Keepalive
from .runner import SessionRunner, check_input
from .timers import Timers
from .websocket import ConnectionClosed, WebSocket, accept_websocket

log = logging.getLogger("trio_duplex")

_HANDSHAKE_TIMEOUT_S = 10.0


@attrs.define(eq=False)
class DuplexServer:
    config: ServerConfig
    engine_factory: EngineFactory
    close_timeout_s: float = 2.0
    """How long a closing connection may take to send its last frames and close."""
    registry: Registry = attrs.field(init=False)
    runners: dict[str, SessionRunner] = attrs.field(factory=dict, init=False)
    timers: Timers = attrs.field(factory=Timers, init=False)
    connections: set[Connection] = attrs.field(factory=set, init=False)
    _sessions: trio.Nursery | None = attrs.field(default=None, init=False)
    _shutdown: trio.Event = attrs.field(factory=trio.Event, init=False)
    _shutdown_deadline: float = attrs.field(default=0.0, init=False)
    _drained: bool = attrs.field(default=False, init=False)
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)

    def __attrs_post_init__(self) -> None:
        self.registry = Registry(self.config)

    # -- running -----------------------------------------------------------------------

    async def run_tcp(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on ``config.host:config.port``; reports the bound port when ready."""
        listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
        port: int = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(self.run, listeners)
            task_status.started(port)

    async def run(
        self,
        listeners: Sequence[trio.abc.Listener[Any]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``begin_shutdown`` has drained every session."""
        async with trio.open_nursery() as sessions:
            self._sessions = sessions
            sessions.start_soon(self.timers.run)
            async with trio.open_nursery() as conns:
                await conns.start(
                    partial(
                        trio.serve_listeners,
                        self._handle_stream,
                        list(listeners),
                        handler_nursery=conns,
                    )
                )
                task_status.started()
                await self._shutdown.wait()
                await self._drain()
                conns.cancel_scope.cancel()
            sessions.cancel_scope.cancel()

    def begin_shutdown(self) -> None:
        """Refuse new opens and resumes, warn attached clients, and start the drain."""
        if self.registry.shutting_down:
            return
        self.registry.shutting_down = True
        self._shutdown_deadline = trio.current_time() + self.config.drain_timeout_s
        going = self.going_away_frame()
        for runner in self.runners.values():
            if runner.conn is not None and runner.session.is_current(runner.conn.generation):
                runner.conn.push(going)
        self._shutdown.set()

    def going_away_frame(self) -> str:
        left = max(0.0, self._shutdown_deadline - trio.current_time())
        return encode({"type": "session.going_away", "time_left_ms": round(left * 1000)})

    async def _drain(self) -> None:
        # Slots, not runners: a session still sending its session.created counts too.
        with trio.move_on_at(self._shutdown_deadline):
            while self.registry.slots_held:
                await self.wait_changed()
        self._drained = True
        for runner in list(self.runners.values()):
            runner.end(REASON_SHUTDOWN)
        with trio.move_on_after(self.close_timeout_s):
            while self.registry.slots_held or self.connections:
                await self.wait_changed()

    async def wait_changed(self) -> None:
        """Wait until a session or connection ends (for the drain, and for tests)."""
        await self._changed.park()

    def changed(self) -> None:
        """A session or connection ended (the drain waits on this)."""
        self._changed.unpark_all()

    @property
    def slots_held(self) -> int:
        return self.registry.slots_held

    # -- one connection ----------------------------------------------------------------

    async def _handle_stream(self, stream: trio.abc.Stream) -> None:
        try:
            accepted = None
            with trio.move_on_after(_HANDSHAKE_TIMEOUT_S):
                accepted = await accept_websocket(
                    stream, self.config.path, self.config.max_event_bytes
                )
            if accepted is not None:
                await self._serve(*accepted)
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except* Exception as group:
            log.error("connection failed: %r", group.exceptions[0], exc_info=group)
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve(self, ws: WebSocket, query: dict[str, list[str]]) -> None:
        conn = Connection(ws, self.config.max_pending_output)
        self.connections.add(conn)
        close_code = CLOSE_GOING_AWAY
        try:
            with trio.CancelScope() as conn.scope:
                await self._converse(conn, query)
        except BaseException as exc:
            if not _only_cancelled(exc):
                close_code = CLOSE_INTERNAL_ERROR
            raise
        finally:
            if conn.close_code is not None:
                close_code = conn.close_code
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.close_timeout_s):
                try:
                    await ws.aclose(close_code)
                except Exception:  # the peer may already be gone; nothing left to save
                    pass
            self.connections.discard(conn)
            self.changed()

    async def _converse(self, conn: Connection, query: dict[str, list[str]]) -> None:
        """The whole conversation on one connection, whatever it turns out to be for."""
        runner: SessionRunner | None = None
        keepalive: Keepalive | None = None
        try:
            async with trio.open_nursery() as conn.nursery:
                try:
                    if query.get("autostart") == ["1"]:
                        try:
                            runner = await self._open(conn, {}, None, self.engine_factory({}))
                        except ProtocolError as exc:
                            code = exc.close_code or CLOSE_GOING_AWAY
                            conn.finish([encode(exc.to_event())], code)
                    else:
                        runner = await self._first_message(conn)
                    if runner is not None:
                        assert self._sessions is not None
                        keepalive = Keepalive(
                            conn,
                            self.timers,
                            self._sessions,
                            self.config.ping_interval_s,
                            self.config.ping_timeout_s,
                        )
                        keepalive.start()
                        await self._read(conn, runner)
                except BaseException:
                    conn.nursery = None  # ending: nothing more starts in it
                    raise
                # Ended without an error: the connection is closing, or it is a resumer
                # still owed a terminal event. The pump ends it once that is sent.
                conn.start_pump()
        finally:
            conn.nursery = None
            if keepalive is not None:
                self.timers.forget(keepalive)
            if runner is not None:
                runner.connection_lost(conn)

    async def _first_message(self, conn: Connection) -> SessionRunner | None:
        """Wait for the message that decides what this connection is for."""
        deadline = trio.current_time() + self.config.config_timeout_s
        while True:
            with trio.move_on_at(deadline) as waiting:
                text = await conn.ws.get_message()
            if waiting.cancelled_caught:
                conn.finish(
                    [encode(error_event("config_timeout", "no first message in time"))],
                    CLOSE_CONFIG_TIMEOUT,
                )
                return None
            event: Event = {}
            try:
                event = decode(text)
                if event["type"] == "session.resume":
                    return await self._resume(conn, event)
                return await self._open_with(conn, event)
            except ProtocolError as exc:
                error = encode(exc.to_event(event))
                if exc.close_code is not None:
                    conn.finish([error], exc.close_code)
                    return None
                # No session was opened; the config timeout keeps running.
                await conn.ws.send_message(error)

    async def _open_with(self, conn: Connection, event: Event) -> SessionRunner | None:
        """Open a session for a first message other than a resume, if it is valid."""
        kind = event["type"]
        if kind == "session.update":
            check_input(None, event)
            config = dict(event["session"])
            return await self._open(conn, config, None, self.engine_factory(config))
        engine = self.engine_factory({})
        check_input(engine, event)
        if kind == "session.event_ack" and event.get("server_event_seq") != 0:
            raise ProtocolError(
                "invalid_event_ack",
                "no server event has been sent yet",
                param="server_event_seq",
            )
        return await self._open(conn, {}, event, engine)

    async def _open(
        self,
        conn: Connection,
        config: dict[str, Any],
        first: Event | None,
        engine: Engine,
    ) -> SessionRunner | None:
        session, token = self.registry.admit(config)  # ProtocolError: full, or draining
        try:
            # The handshake rule: resumable only once this send has completed.
            await conn.ws.send_message(encode(self.registry.created_event(session, token)))
        except BaseException:
            session.handshake_failed(trio.current_time())
            self.registry.release(session)  # nothing ran yet: teardown is already done
            self.changed()
            log.info("session %s: session.created undelivered", session.id)
            raise
        session.handshake_delivered(trio.current_time())
        if session.terminal is not None:  # closed while opening (the core allows it)
            self.registry.release(session)
            self.changed()
            conn.finish([encode(session.terminal.event)], session.terminal.close_code)
            return None
        runner = SessionRunner(self, session, engine)
        runner.attach(conn, Commit(session.generation, None))
        self.runners[session.id] = runner
        assert self._sessions is not None
        self._sessions.start_soon(runner.run)  # synchronous: no cancel point in between
        runner.reschedule()
        if self._drained:  # delivered after the drain ended: it ends with the others
            runner.end(REASON_SHUTDOWN)
        log.info("session %s opened", session.id)
        if first is not None:
            runner.handle(conn, first)
        return runner

    async def _resume(self, conn: Connection, event: Event) -> SessionRunner | None:
        session_id = event.get("session_id")
        token = event.get("resume_token")
        last = event.get("last_received_server_event_seq", 0)
        if not isinstance(session_id, str) or not isinstance(token, str) or not is_seq(last):
            raise ProtocolError(
                "invalid_session_resume",
                "session.resume needs session_id, resume_token (strings) and an optional "
                "non-negative integer last_received_server_event_seq",
                close_code=CLOSE_RESUME_REFUSED,
            )
        session = self.registry.lookup_for_resume(session_id)
        runner = self.runners.get(session.id)
        if runner is None:  # still opening: its session.created is not delivered
            raise ProtocolError(
                "session_resume_expired",
                "no such session, or it has ended",
                close_code=CLOSE_RESUME_REFUSED,
            )
        now = trio.current_time()
        runner.apply(session.poll(now))  # a due expiry wins before the resume is looked at
        attempt = session.begin_resume(token, last, now)
        runner.reschedule()
        try:
            await conn.ws.send_message(encode(session.resumed_event(attempt)))
            cursor = attempt.last_seq
            if session.replay(cursor, trio.current_time()) is None:
                cursor = session.journal.head  # no replay: live events follow
                session.journal.ack(cursor)  # given up: no later overflow notice names them
                await conn.ws.send_message(resync_frame("journal_gap", cursor))
            while True:
                entries = session.replay(cursor, trio.current_time())
                if entries is None:  # lost while replaying (overflow, TTL, an old ack)
                    cursor = session.journal.floor
                    await conn.ws.send_message(resync_frame("journal_gap", cursor))
                    continue
                if not entries:
                    break
                for start in range(0, len(entries), BATCH):
                    batch = entries[start : start + BATCH]
                    await conn.ws.send_many([entry.frame for entry in batch])
                    cursor = batch[-1].seq
            # Caught up with the journal and no await since: switch the attachment now.
            commit = session.commit_resume(attempt, trio.current_time())
        except BaseException:
            runner.apply(session.abort_resume(attempt, trio.current_time()))
            runner.reschedule()
            raise
        runner.reschedule()
        if commit is None:
            terminal = session.terminal
            if terminal is not None and terminal.generation is None:
                # It ended while detached: nobody else heard how. The resumer, which has
                # session.resumed already, gets the terminal event in place of live
                # events, once the slot is free (now, or when the teardown finishes).
                if session.state is State.CLOSED:
                    conn.finish([encode(terminal.event)], terminal.close_code)
                else:
                    runner.resumer = conn
                return None
            raise ProtocolError(
                "session_resume_expired",
                "the session ended during the resume",
                close_code=CLOSE_RESUME_REFUSED,
            )
        runner.attach(conn, commit)
        log.info("session %s resumed (generation %d)", session.id, commit.generation)
        return runner

    async def _read(self, conn: Connection, runner: SessionRunner) -> None:
        get, handle = conn.ws.get_message, runner.handle
        while conn.close_code is None:
            text = await get()
            try:
                event = decode(text)
            except ProtocolError as exc:
                conn.push(encode(exc.to_event()))
                continue
            handle(conn, event)
        # Closing: keep reading so pings and the peer's close are seen while the pump
        # sends the last frames.
        while True:
            await get()


def _only_cancelled(exc: BaseException) -> bool:
    """Did the conversation end by cancellation or by the peer, not by our own error?"""
    benign = (trio.Cancelled, ConnectionClosed, trio.BrokenResourceError)
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(benign)[1] is None
    return isinstance(exc, benign)
