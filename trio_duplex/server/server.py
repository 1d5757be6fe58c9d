"""The trio server shell: listeners, the WebSocket handshake, opening and resuming.

Task tree::

    DuplexServer.run (and, beside the loop, the watchdog thread: watchdog.py)
    ├── Sessions.run (sessions.py): the runners' nursery
    │   ├── Timers.run (every session's deadlines, every connection's next ping)
    │   └── SessionRunner.run (one per session: runs its engine)
    └── connections nursery
        ├── DuplexServer._accept, one per listener
        └── one task per TCP connection: the handshake, then ``Connection.open``,
            whose body is the reader and whose nursery holds the pump and a ping
            waiting for its pong (connection.py)

Nothing that one connection does can raise out of its own task: every error ends that
connection (1011) and is logged, and the session it held follows docs/protocol.md.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from ..core.config import ServerConfig
from ..core.events import ErrorCode, Event, EventType
from ..core.frames import CloseCode
from ..core.replay import Replay
from ..core.session import State
from ..core.wire import ProtocolError, decode, encode, is_seq
from ..engines.api import Engine, EngineFactory
from .connection import Connection
from .runner import SessionRunner, check_input
from .sessions import Observer, Sessions
from .watchdog import watching_the_loop
from .websocket import ConnectionClosed, WebSocket, accept_websocket

log = logging.getLogger("trio_duplex")

_AT_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""What accept(2) returns when the process or the system is out of room: retry later."""
_AT_CAPACITY_RETRY_S = 0.1
_AT_CAPACITY_QUIET_S = 60.0

_CONFIG_TIMEOUT = ProtocolError(
    ErrorCode.CONFIG_TIMEOUT, "no first message in time", close_code=CloseCode.CONFIG_TIMEOUT
)


@attrs.define(eq=False)
class DuplexServer:
    config: ServerConfig
    engine_factory: EngineFactory
    close_timeout_s: float = 2.0
    """How long a closing connection may take to send its last frames and close."""
    sessions: Sessions = attrs.field(init=False)
    connections: set[Connection] = attrs.field(factory=set, init=False)
    _shutdown: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self.sessions = Sessions(self.config, self.close_timeout_s)

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
        with watching_the_loop(self.config.loop_lag_warning_s):
            async with trio.open_nursery() as sessions_nursery:
                await sessions_nursery.start(self.sessions.run)
                async with trio.open_nursery() as conns:
                    for listener in listeners:
                        conns.start_soon(self._accept, listener, conns)
                    task_status.started()
                    await self._shutdown.wait()
                    await self.sessions.drain()
                    with trio.move_on_after(self.close_timeout_s):
                        while self.sessions.slots_held or self.connections:
                            await self.sessions.wait_changed()
                    conns.cancel_scope.cancel()
                sessions_nursery.cancel_scope.cancel()

    def begin_shutdown(self) -> None:
        """Refuse new opens and resumes, warn attached clients, and start the drain."""
        if not self.sessions.shutting_down:
            self.sessions.begin_shutdown()
            self._shutdown.set()

    @property
    def shutting_down(self) -> bool:
        return self.sessions.shutting_down

    @property
    def slots_held(self) -> int:
        return self.sessions.slots_held

    def add_observer(self, observer: Observer) -> None:
        """Watch this server's sessions (see ``Observer``)."""
        self.sessions.observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        self.sessions.observers.remove(observer)

    async def wait_changed(self) -> None:
        """Wait until a session or connection ends (for tests)."""
        await self.sessions.wait_changed()

    # -- one connection ----------------------------------------------------------------

    async def _accept(self, listener: trio.abc.Listener[Any], nursery: trio.Nursery) -> None:
        """Accept connections for ever; each one's task runs in ``nursery``.

        trio.serve_listeners logged an ERROR with a traceback every 100 ms while the
        process was out of file descriptors: here it is one warning a minute."""
        quiet_until = -math.inf
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _AT_CAPACITY:
                        raise
                    now = trio.current_time()
                    if now >= quiet_until:
                        quiet_until = now + _AT_CAPACITY_QUIET_S
                        log.warning(
                            "accept: %s (%s); retrying every %ss (said once a minute)",
                            errno.errorcode[exc.errno],
                            os.strerror(exc.errno),
                            _AT_CAPACITY_RETRY_S,
                        )
                    await trio.sleep(_AT_CAPACITY_RETRY_S)
                else:
                    nursery.start_soon(self._handle_stream, stream)

    async def _handle_stream(self, stream: trio.abc.Stream) -> None:
        try:
            accepted = None
            with trio.move_on_after(self.config.handshake_timeout_s):
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
        conn: Connection | None = None
        try:
            async with Connection.open(
                ws,
                self.config.max_pending_output,
                close_timeout=self.close_timeout_s,
                watchers=self.sessions.observers,
            ) as conn:
                self.connections.add(conn)
                await self._converse(conn, query)
        finally:
            if conn is not None:
                self.connections.discard(conn)
            self.sessions.changed()

    async def _converse(self, conn: Connection, query: dict[str, list[str]]) -> None:
        """The whole conversation on one connection, whatever it turns out to be for."""
        runner: SessionRunner | None = None
        try:
            if query.get("autostart") == ["1"]:
                try:
                    runner = await self._open(conn, {}, None, self.engine_factory({}))
                except ProtocolError as exc:
                    code = exc.close_code or CloseCode.GOING_AWAY
                    conn.finish([encode(exc.to_event())], code)
            else:
                runner = await self._first_message(conn)
            if runner is not None:
                timers, config = self.sessions.timers, self.config
                conn.start_keepalive(timers, config.ping_interval_s, config.ping_timeout_s)
                await self._read(conn, runner)
            # Closing, or a resumer owed the terminal event of a session that ended.
            await conn.send_rest()
        finally:
            if runner is not None:
                runner.connection_lost(conn)  # before the close handshake: detach now

    async def _first_message(self, conn: Connection) -> SessionRunner | None:
        """Wait for the message that decides what this connection is for."""
        deadline = trio.current_time() + self.config.config_timeout_s
        while True:
            with trio.move_on_at(deadline) as waiting:
                text = await conn.ws.get_message()
            event: Event = {}
            try:
                if waiting.cancelled_caught:
                    raise _CONFIG_TIMEOUT
                event = decode(text)
                if event["type"] == EventType.RESUME:
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
        if kind == EventType.UPDATE:
            check_input(None, event)
            config = dict(event["session"])
            return await self._open(conn, config, None, self.engine_factory(config))
        engine = self.engine_factory({})
        check_input(engine, event)
        if kind == EventType.EVENT_ACK and event.get("server_event_seq") != 0:
            raise ProtocolError(
                ErrorCode.INVALID_EVENT_ACK,
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
    ) -> SessionRunner:
        sessions = self.sessions
        session, token = sessions.admit(config)  # ProtocolError: full, or draining
        try:
            # The handshake rule: resumable only once this send has completed.
            await conn.ws.send_message(encode(sessions.registry.created_event(session, token)))
        except BaseException:
            sessions.undelivered(session)
            raise
        runner = sessions.start(session, engine, conn)
        if first is not None:
            runner.handle(conn, first)
        return runner

    async def _resume(self, conn: Connection, event: Event) -> SessionRunner | None:
        session_id = event.get("session_id")
        token = event.get("resume_token")
        last = event.get("last_received_server_event_seq", 0)
        if not isinstance(session_id, str) or not isinstance(token, str) or not is_seq(last):
            raise ProtocolError.resume_refused(
                ErrorCode.INVALID_SESSION_RESUME,
                "session.resume needs session_id, resume_token (strings) and an optional "
                "non-negative integer last_received_server_event_seq",
            )
        runner = self.sessions.for_resume(session_id)
        session = runner.session
        now = trio.current_time()
        runner.apply(session.poll(now))  # a due expiry wins before the resume is looked at
        attempt = session.begin_resume(token, last, now)
        self.sessions.reschedule(runner)
        replay = Replay(attempt)
        try:
            # The core decides what to write; this only writes it, within a bound: a
            # resumer that does not read would otherwise hold the session (its timers
            # frozen, other resumes refused as a conflict) for ever.
            with trio.fail_after(self.config.replay_timeout_s):
                while frames := replay.next_frames(trio.current_time()):
                    await conn.ws.send_many(frames)
            # Caught up with the journal and no await since: switch the attachment now.
            commit = session.commit_resume(attempt, trio.current_time())
        except BaseException as exc:
            runner.apply(session.abort_resume(attempt, trio.current_time()))
            self.sessions.reschedule(runner)
            if isinstance(exc, trio.TooSlowError):  # the write was cut: no close frame
                log.info(
                    "session %s: resume aborted, replay not written within %ss",
                    session.id,
                    self.config.replay_timeout_s,
                )
                return None
            raise
        self.sessions.reschedule(runner)
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
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_EXPIRED,
                "the session ended during the resume",
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


__all__ = ["DuplexServer", "Observer"]
