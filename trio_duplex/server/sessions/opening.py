"""``Opener``: a connection past its handshake, from its first message to its session.

It reads the message that decides what the connection is for, asks the core's opening
rules (core/opening.py) what it may be, and acts on the answer: it opens a session (the
engine from the factory, a slot from ``Sessions``, ``session.created`` delivered per the
handshake rule), or resumes one (the core's replay written, then the attachment
switched), then reads the session's messages until the connection closes. Cluster mode
is asked at its named points only (``Placement``: placement.py).

Nothing one connection does raises out of its task: a refusal is answered (an ``error``
event, and a close when the rule says so) and the session it held follows
docs/protocol.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from ...audio import negotiate
from ...core import opening
from ...core.events import ErrorCode, Event, EventType
from ...core.frames import CloseCode
from ...core.opening import OPEN, Grant, Resume
from ...core.protocol import CheckFailed, check_input
from ...core.replay import Replay
from ...core.session import Session, State
from ...core.wire import ProtocolError
from ...dialects import NATIVE, Dialect
from ...engines.api import Engine, EngineFactory, engine_audio_rate, prepares
from ..config import ServerConfig
from .connection import Connection, decode_large
from .owner import Sessions
from .placement import Placement, SingleProcess
from .runner import Prepared, SessionRunner, engine_broke, only_trio_cancellation
from .transport import MessageTransport
from .websocket import ConnectionClosed

log = logging.getLogger("trio_duplex")

_OPENAI = frozenset({"openai", "openai-call"})
"""The dialects whose session object names ``turn_detection`` (OpenAI's)."""


@attrs.define(eq=False)
class Opener:
    """Serves each connection past its handshake (``serve``)."""

    config: ServerConfig
    sessions: Sessions
    engine_factory: EngineFactory
    close_timeout_s: float
    resume_failed: Callable[[str | None], None]
    """The front door's count of failed resumes by address (a credential from elsewhere)."""
    placement: Placement = attrs.field(factory=SingleProcess)
    connections: set[Connection] = attrs.field(factory=set)
    """The connections past their handshake."""

    async def serve(
        self,
        ws: MessageTransport,
        query: dict[str, list[str]],
        grant: Grant = OPEN,
        dialect: Dialect | None = None,
        bearer: str | None = None,
    ) -> None:
        """The whole life of one connection past its handshake, spoken in ``dialect``
        (its path's; by default ``Sessions.dialect``). ``bearer``: the credential the
        upgrade presented, for a dialect that speaks first (its resume token).

        The reading is inline, not a coroutine of its own: an idle session waits here,
        and each frame on its stack is held for as long as it is open (~0.3 KB each)."""
        conn: Connection | None = None
        try:
            async with Connection.open(
                ws,
                self.config.max_pending_output,
                close_timeout=self.close_timeout_s,
                max_output_bytes=self.config.max_output_bytes,
                watchers=self.sessions.observers,
                dialect=self.sessions.dialect if dialect is None else dialect,
            ) as conn:
                self.connections.add(conn)
                runner: SessionRunner | None = None
                try:
                    runner = await self._begin(conn, query, grant, bearer)
                    if runner is None:
                        # Closing, or a resumer owed the terminal event of a session
                        # that ended: never returns (the pump's end cancels it).
                        await conn.send_rest()
                        return
                    self.session_bounds(conn)
                    d = conn.dialect
                    get, handle, decode, large = (
                        conn.ws.get_message,
                        runner.handle,
                        d.decode,
                        d.large,
                    )
                    while conn.close_code is None:
                        text = await get()
                        if isinstance(text, bytes):  # a binary lane (the native dialect's audio)
                            runner.handle_binary(conn, text)
                            continue
                        try:
                            # A large message is decoded in slices, letting others run.
                            event = (
                                decode(text) if len(text) < large else await decode_large(d, text)
                            )
                        except ProtocolError as exc:
                            conn.ws.report_fault(str(exc))
                            conn.push(d.frame(exc.to_event()))
                            continue
                        handle(conn, event, len(text))
                    # Closing: keep reading so pings and the peer's close are seen while
                    # the pump sends the last frames.
                    while True:
                        await get()
                finally:
                    if runner is not None:
                        runner.connection_lost(conn)  # before the close handshake: detach now
        finally:
            if conn is not None:
                self.connections.discard(conn)
            self.sessions.changed()

    async def _begin(
        self, conn: Connection, query: dict[str, list[str]], grant: Grant, bearer: str | None
    ) -> SessionRunner | None:
        """What the connection turns out to be for: the session it opened or resumed,
        or None (refused, or it ended first)."""
        # (A relayed connection's first message is the front node's session.resume.)
        if conn.dialect.speaks_first and not grant.relayed:
            return await self._spoken_first(conn, query, bearer, grant)
        if query.get("autostart") == ["1"]:
            try:
                config = opening.autostart(grant)
                engine = self.new_engine(config)
                return await self._open(conn, config, None, engine, grant=grant)
            except ProtocolError as exc:
                code = exc.close_code or CloseCode.GOING_AWAY
                conn.finish([conn.dialect.frame(exc.to_event())], code)
                return None
        return await self._first_message(conn, grant)

    async def _spoken_first(
        self, conn: Connection, query: dict[str, list[str]], bearer: str | None, grant: Grant
    ) -> SessionRunner | None:
        """A dialect that speaks first: the upgrade stands for the first message
        (``Dialect.opening``), handled as one; no config timeout runs. A refusal is an
        ``error`` and a close, as ``?autostart=1``'s."""
        event: Event = {}
        try:
            opened = conn.dialect.opening(query, bearer)
            if opened is None:
                return await self._first_message(conn, grant)
            event = opened
            resume = opening.first_step(grant, event)
            if resume is not None:
                return await self._resume(conn, event, resume, grant)
            return await self._open_with(conn, event, 0, grant, spoken=True)
        except ProtocolError as exc:
            error = self._refused(conn, event, exc, grant)
            conn.finish([error], exc.close_code or CloseCode.GOING_AWAY)
            return None

    def session_bounds(self, conn: Connection) -> None:
        """A connection that carries a session: its own message bound, and pings."""
        config = self.config
        conn.ws.max_message_bytes = config.max_event_bytes
        conn.start_keepalive(self.sessions.timers, config.ping_interval_s, config.ping_timeout_s)

    async def _first_message(self, conn: Connection, grant: Grant) -> SessionRunner | None:
        """Wait for the message that decides what this connection is for."""
        deadline = trio.current_time() + self.config.config_timeout_s
        # A relayed resume's first message is the front node's, in native JSON.
        dialect = NATIVE if grant.relayed else conn.dialect
        while True:
            with trio.move_on_at(deadline) as waiting:
                text = await conn.ws.get_message()
            event: Event = {}
            try:
                if waiting.cancelled_caught:
                    raise opening.CONFIG_TIMEOUT
                if len(text) < dialect.large:
                    event = dialect.decode(text)
                else:
                    event = await decode_large(dialect, text)
                resume = opening.first_step(grant, event)
                if resume is not None:
                    return await self._resume(conn, event, resume, grant)
                return await self._open_with(conn, event, len(text), grant)
            except ProtocolError as exc:
                error = self._refused(conn, event, exc, grant)
                if exc.close_code is not None:
                    conn.finish([error], exc.close_code)
                    return None
                # No session was opened; the config timeout keeps running. (A client
                # that does not read is cut by the write timeout.)
                await conn.ws.send_message(error)

    def _refused(
        self, conn: Connection, event: Event, exc: ProtocolError, grant: Grant
    ) -> str | bytes:
        """Count and report a refused first message; its ``error`` event."""
        if grant.elsewhere is not None:  # an unknown credential that resumed nothing
            self.resume_failed(conn.ws.peer)
        totals = self.sessions.totals
        if event.get("type") == EventType.RESUME:
            totals.count(totals.resumes, exc.code)
        elif exc.code == ErrorCode.ENGINE_ERROR:
            totals.engine_errors += 1
        if exc.code not in opening.NOT_FAULTS:
            conn.ws.report_fault(str(exc))
        return conn.dialect.frame(exc.to_event(event))

    async def _open_with(
        self, conn: Connection, event: Event, size: int, grant: Grant, *, spoken: bool = False
    ) -> SessionRunner | None:
        """Open a session for a first message other than a resume, if it is valid.
        ``spoken``: ``event`` is the upgrade's own (``Dialect.opening``), not the client's."""
        if event["type"] == EventType.UPDATE:
            check_input(None, event)
        if spoken:
            plan = opening.open_spoken(
                grant,
                event,
                self.config.max_config_bytes,
                transport_audio=conn.dialect.audio_by_transport,
            )
        else:
            plan = opening.open_with(grant, event, self.config.max_config_bytes)
        engine = self.new_engine(plan.config)
        if spoken and engine_audio_rate(engine) is None:
            # The dialect's default audio, which no client asked for: an engine that
            # knows no audio format passes audio through as it comes (docs/engines.md).
            plan.config.pop("audio", None)
        if spoken and "turn_detection" not in plan.config and conn.dialect.name in _OPENAI:
            # What the engine does of itself, shown as the session's (Engine.turn_detection):
            # OpenAI's session object always names it. (A telephony call's session shows
            # nothing to anyone: its configuration stays as opened, so ``echo`` echoes.)
            detection = getattr(engine, "turn_detection", None)
            plan.config["turn_detection"] = None if detection is None else dict(detection)
        if plan.first is None:
            return await self._open(conn, plan.config, None, engine, grant=grant)
        try:
            check_input(engine, event)
        except CheckFailed as exc:
            raise engine_broke("check of the first message", exc.__cause__ or exc) from None
        opening.check_first_event(event)
        return await self._open(conn, plan.config, event, engine, size, grant=grant)

    def new_engine(self, config: Mapping[str, Any]) -> Engine:
        """The engine of a session about to be admitted (``new_engine``)."""
        return new_engine(self.engine_factory, config)

    async def _open(
        self,
        conn: Connection,
        config: dict[str, Any],
        first: Event | None,
        engine: Engine,
        first_size: int = 0,
        *,
        grant: Grant = OPEN,
    ) -> SessionRunner:
        sessions, placement = self.sessions, self.placement
        settle_audio(engine, config)  # ProtocolError: an audio format it cannot serve
        # A draining or full node refuses below without asking the cluster.
        leased = sessions.admits(self.config.max_sessions) and await placement.lease()
        try:
            # ProtocolError: full, or draining (this node's own, single-step decision)
            session, token = sessions.admit(
                config, grant.principal, grant.locked is not None, conn.dialect, grant.assigned
            )
        except BaseException:
            if leased:
                placement.release()
            raise
        prepared = None
        ws = conn.ws
        first_bytes, ws.max_message_bytes = ws.max_message_bytes, self.config.max_event_bytes
        # The handshake rule: resumable only once session.created is handed to the
        # transport, by a client still there. Until then the connection is read, and a
        # close frame, FIN or reset arriving before that write has completed (during
        # the prepare, the claim or the write) leaves the session undelivered. One seen
        # after it, even before this task runs on, may have come after the client read
        # session.created: that session is delivered, and detaches as on any loss. (So
        # nothing looks at the socket after the write; and a stream's send_all yields
        # once more after its last byte, shielded: the cancel can no longer land.)
        # With nothing to await before the write (no prepare, no cluster to claim in),
        # the socket is read just before a direct write instead (``_write_at_once``),
        # and no task watches it unless the write must wait.
        try:
            if prepares(engine) or not isinstance(placement, SingleProcess):
                prepared = await self._deliver_watched(conn, session, token, engine)
            else:  # nothing to await first: written at once where the socket allows
                created = sessions.registry.created_frame(session, token)
                if not _write_at_once(ws, created):  # a pong reply_now left goes first
                    await _watched(conn, functools.partial(ws.send_message, created))
                elif ws.unsent:  # the socket took part of it: the rest, watched
                    await _watched(conn, ws.flush)
        except BaseException:
            ws.max_message_bytes = first_bytes
            sessions.undelivered(session)
            raise
        runner = sessions.start(
            session, engine, conn, opening_event=first is not None, prepared=prepared
        )
        if ws.unsent:  # a pong reply_now could not finish
            conn.start_pump()
        if first is not None:
            runner.handle(conn, first, first_size)
        return runner

    async def _deliver_watched(
        self, conn: Connection, session: Session, token: str, engine: Engine
    ) -> Prepared | None:
        """Prepare the engine, claim the session in the cluster, then write its
        ``session.created``, all while the connection is watched (``_watched``); the
        engine's ``Prepared``, if it prepares. Raises (its ``Prepared`` released) if the
        client left first or anything failed."""
        sessions, ws = self.sessions, conn.ws
        prepared: Prepared | None = None

        async def deliver() -> None:
            nonlocal prepared
            if prepares(engine):  # e.g. its upstream connected: else the open is refused
                prepared = await sessions.prepare(engine)
            # Found from any node before its client hears of it (a client that drops at
            # once may resume elsewhere).
            await self.placement.claim(session.id)
            ws.reply_now(ws.read_now())  # what the socket holds already
            if ws.peer_gone:
                raise _gone_while_opening()
            await ws.send_message(sessions.registry.created_frame(session, token))

        try:
            await _watched(conn, deliver)
        except BaseException:
            if prepared is not None:
                prepared.release()
            raise
        return prepared

    async def _resume(
        self, conn: Connection, event: Event, resume: Resume, grant: Grant = OPEN
    ) -> SessionRunner | None:
        sessions = self.sessions
        if (
            not grant.relayed  # (a relayed resume is never relayed on)
            and not sessions.shutting_down
            and sessions.runner(resume.session_id) is None
            and await self.placement.resume_elsewhere(conn, event, resume.session_id)
        ):
            return None
        runner = sessions.for_resume(resume.session_id)
        session = runner.session
        if session.spelling is not conn.dialect:
            raise opening.other_dialect()
        now = trio.current_time()
        runner.apply(session.poll(now))  # a due expiry wins before the resume is looked at
        last_seq = resume.last_seq
        if conn.dialect.resumes_from_ack:  # its client presents no seq: the acks tell
            last_seq = max(last_seq, session.journal.acked_through)
        attempt = session.begin_resume(resume.token, last_seq, now)
        sessions.reschedule(runner)
        replay = Replay(attempt, audio=conn.dialect.replays_audio)
        totals = sessions.totals
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
            sessions.reschedule(runner)
            sessions.detached(runner)  # detached again: during a drain it ends now
            totals.count(totals.resumes, "aborted")
            if isinstance(exc, trio.TooSlowError):  # the write was cut: no close frame
                log.info(
                    "session %s: resume aborted, replay not written within %ss",
                    session.id,
                    self.config.replay_timeout_s,
                    extra={"session_id": session.id, "generation": attempt.generation},
                )
                return None
            raise
        finally:
            totals.replayed_events += replay.replayed
            totals.replay_audio_dropped += replay.audio_dropped
        sessions.reschedule(runner)
        if commit is None:
            self._ended_during_resume(conn, runner)
            return None
        runner.attach(conn, commit)
        totals.count(totals.resumes, "ok")
        log.info(
            "session %s resumed (generation %d)",
            session.id,
            commit.generation,
            extra={"session_id": session.id, "generation": commit.generation},
        )
        return runner

    def _ended_during_resume(self, conn: Connection, runner: SessionRunner) -> None:
        """The session ended while its replay was written (``commit_resume`` None)."""
        session, totals = runner.session, self.sessions.totals
        terminal = session.terminal
        if terminal is None or terminal.generation is not None:
            raise opening.ended_during_resume()
        # It ended while detached: nobody else heard how. The resumer, which has
        # session.resumed already, gets the terminal event in place of live events,
        # once the slot is free (now, or when the teardown finishes).
        if session.state is State.CLOSED:
            conn.finish([session.frame(terminal.event)], terminal.close_code)
        else:
            runner.resumer = conn
        totals.count(totals.resumes, "ended")


def new_engine(factory: EngineFactory, config: Mapping[str, Any]) -> Engine:
    """The engine of a session about to be admitted. ProtocolError: the engine refused
    the configuration (``BadEvent``), or it broke (``engine_error``, close 1011)."""
    try:
        return factory(config)
    except (ProtocolError, trio.Cancelled):
        raise
    except BaseException as exc:  # KeyboardInterrupt, asyncio's CancelledError, ...
        if only_trio_cancellation(exc):
            raise
        raise engine_broke("factory", exc) from None


def settle_audio(engine: Engine, config: dict[str, Any]) -> None:
    """At open: replace the client's ``session.audio`` request with the effective audio
    configuration (protocol v2), or refuse it (``unsupported_audio_format``: the core's
    ``check_audio``). Without a request nothing is added (a v1 client sees v1's
    ``session.created``) and the defaults apply."""
    rate = engine_audio_rate(engine)
    opening.check_audio(rate, config)
    if rate is not None and "audio" in config:
        config["audio"] = negotiate(config["audio"], rate).as_event()


def _write_at_once(ws: MessageTransport, created: str | bytes) -> bool:
    """Write ``session.created`` from this task without awaiting, if the socket is free
    (a socket, nothing being written); False: it is not (nothing written). What the
    socket holds is read just before (``read_now``: a close frame, FIN or reset that came
    by then is seen), and nothing between that read and the write awaits, so no task
    needs to watch the connection meanwhile: written whole (``unsent`` false), it is
    delivered. Raises ``ConnectionClosed`` if the client is gone (read before the write,
    or the write failed)."""
    ws.reply_now(ws.read_now())
    if ws.peer_gone:
        raise _gone_while_opening()
    if not ws.can_write_now():
        return False
    ws.write_now(created)
    if ws.peer_gone:  # the write failed: reset, broken pipe
        raise _gone_while_opening()
    return True


async def _watched(conn: Connection, steps: Callable[[], Awaitable[None]]) -> None:
    """Run ``steps`` while the connection is read in a task of its own
    (``Connection.watch_opening``): the client's close frame, FIN or reset, as it
    arrives, cuts them (a write under way too) and raises ``ConnectionClosed``: the
    client left before its ``session.created`` was written whole, not delivered."""
    watch = trio.CancelScope()
    conn.watch_opening(watch.cancel)
    try:
        with watch:
            await steps()
    finally:
        conn.ws.stop_watching()
    if watch.cancelled_caught:  # the end came while the write was under way
        raise _gone_while_opening()


def _gone_while_opening() -> ConnectionClosed:
    return ConnectionClosed(CloseCode.ABNORMAL, "the client left before session.created")


__all__ = ["Opener", "new_engine", "settle_audio"]
