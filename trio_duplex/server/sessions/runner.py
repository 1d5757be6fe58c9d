"""A session's life in trio: its engine task and the connection attached to it.

A ``SessionRunner`` task lives in the sessions nursery (``Sessions``), not in any
connection's, so the session and its engine outlive connections. It owns the engine's
cancel scope; teardown (the engine gone) happens before the slot is released, and the
slot is released before the terminal event is queued for the attached connection.

"The engine gone" means it returned, or it was abandoned: an engine that has not
returned ``engine_stop_timeout_s`` after its cancellation (blocked under a shield, or in
a thread that cannot be abandoned) is given up on by the timer heap. The session then
ends without it, and its task, which trio can neither stop nor wait for, is left behind;
should it ever return, nothing is done a second time.

The runner knows its owner only through ``Owner``, a narrow interface: it never imports
the server or the sessions module.
"""

from __future__ import annotations

import binascii
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from ..._pace import Pace
from ...audio import AudioConfig, Decoder, Encoder, negotiate
from ...core import events
from ...core.events import SESSION_INPUT, ErrorCode, EventType, Reason
from ...core.frames import CloseCode
from ...core.migration import Frozen
from ...core.session import Commit, Emitted, Session, State, Terminal, audio_ms
from ...core.spelling import Frame, Spelling
from ...core.wire import ConfigBudget, ProtocolError, is_seq
from ...engines.api import (
    Engine,
    EngineSession,
    Event,
    Inbox,
    UpstreamLost,
    engine_audio_rate,
    run_engine,
)
from .connection import Connection, WriteSampler
from .timers import Entry

log = logging.getLogger("trio_duplex")


class Owner(Protocol):
    """What a runner needs from whoever owns the sessions (``Sessions``)."""

    close_timeout_s: float

    @property
    def engine_stop_timeout_s(self) -> float:
        """How long a cancelled engine may take to return before it is abandoned."""

    def reschedule(self, runner: SessionRunner) -> None:
        """The session's next deadline may have moved."""

    def decided(self, runner: SessionRunner, terminal: Terminal) -> None:
        """The core decided the session's end (report it; the runner tears down)."""

    def ended(self, runner: SessionRunner) -> None:
        """Teardown finished (or the engine was abandoned): free the slot and forget the
        runner."""

    def returned_late(self, runner: SessionRunner) -> None:
        """The engine of an abandoned runner returned after all."""

    def attached(self, runner: SessionRunner, conn: Connection) -> None:
        """``conn`` now carries the session."""

    def detached(self, runner: SessionRunner) -> None:
        """The session lost its connection and waits for a resume."""

    def going_away_frame(self, spelling: Spelling) -> Frame | None:
        """While the server drains: the warning for a newly attached connection."""

    @property
    def send_to_write(self) -> WriteSampler:
        """Where sampled send-to-write times go (the metrics' histogram)."""


class CheckFailed(Exception):
    """An engine's ``check`` raised something other than a ProtocolError (a ``BadEvent``):
    the engine is broken, not the event. What it raised is the ``__cause__``."""


def check_input(engine: Engine | None, event: Event) -> None:
    """Validate a client event bound for a session (not a resume). Raises ProtocolError,
    or CheckFailed when the engine's own check breaks.

    ``engine`` may be None only before one exists, for a first ``session.update``."""
    kind = event["type"]
    if kind not in _PROTOCOL_INPUT:  # an engine's event: the per-event path, one lookup
        if engine is None or kind not in engine.accepts:
            raise ProtocolError(
                ErrorCode.UNKNOWN_EVENT, f"event type {kind!r} is not accepted", param="type"
            )
        try:
            engine.check(event)
        except ProtocolError:
            raise
        except BaseException as exc:  # a BadEvent is the event's fault, the rest the engine's
            raise CheckFailed from exc
    elif kind == EventType.RESUME:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SESSION_RESUME,
            "session.resume must be the first message of a new connection",
        )
    elif kind != EventType.UPDATE:
        return  # heartbeat, ack and close carry nothing more to check
    elif not isinstance(event.get("session"), dict):
        raise ProtocolError(ErrorCode.BAD_EVENT, "session must be an object", param="session")
    seq = event.get("client_event_seq")
    if seq is not None and not (is_seq(seq) and seq > 0):
        raise ProtocolError(
            ErrorCode.BAD_EVENT,
            "client_event_seq must be a positive integer",
            param="client_event_seq",
        )


def check_locked(engine: Engine, event: Event) -> None:
    """On a locked session, after ``check_input``: the engine's ``check_locked`` (an
    override of the locked configuration: ConfigLocked); CheckFailed if it breaks."""
    if event["type"] in _PROTOCOL_INPUT:
        return  # session.update is refused by the runner itself
    check = getattr(engine, "check_locked", None)
    if check is None:
        return
    try:
        check(event)
    except ProtocolError:
        raise
    except BaseException as exc:
        raise CheckFailed from exc


# Sets, not enum members, on the per-event path: a member lookup costs ~100 ns on 3.11.
_PROTOCOL_INPUT = frozenset({*SESSION_INPUT, EventType.EVENT_ACK, EventType.RESUME})
_ANSWERED_HERE = frozenset({EventType.HEARTBEAT, EventType.EVENT_ACK, EventType.CLOSE})
_UPDATE = str(EventType.UPDATE)
_PACING = frozenset({ErrorCode.INPUT_BACKPRESSURE, ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ})
_APPEND = str(EventType.INPUT_AUDIO_APPEND)
_DELTA = str(EventType.OUTPUT_AUDIO_DELTA)
_CANCELLED = "response.cancelled"
_AUDIO_ENDS = frozenset({"response.output_audio.done", "response.done", _CANCELLED})
"""Engine events that end a stretch of output audio: the encoder's tail (a resampler's
last samples, a last Opus packet padded with silence) goes out before them; before a
``response.cancelled`` (barge-in) it is dropped."""
_AUDIO_KINDS = _AUDIO_ENDS | {_DELTA}
"""The engine events the encoder must see: one set test per event of an audio session."""

SAMPLE_EVERY = 64
"""One engine event in this many (per session) has its send-to-write time measured:
the clock read and the bookkeeping stay off the other events' path."""
_SAMPLE_MASK = SAMPLE_EVERY - 1


class Prepared:
    """What an engine's ``prepare`` started, in a nursery of its own (a task of the
    sessions nursery, ``Sessions.prepare``): alive until the session's engine is gone
    (``release``), whatever happens to the client's connection in between."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()

    def release(self) -> None:
        self.scope.cancel()


async def hold_prepared(
    engine: Engine, *, task_status: trio.TaskStatus[Prepared] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run ``engine.prepare`` in a nursery of its own, report it ready, then keep that
    nursery (and what the engine started in it) until released. Raises what ``prepare``
    raised, before it is reported ready; after that a failure of what it started is
    logged, never raised: the engine's ``run`` finds out for itself."""
    prepared = Prepared()
    failure: BaseException | None = None
    try:
        with prepared.scope:
            async with trio.open_nursery() as nursery:
                try:
                    await engine.prepare(nursery)
                except trio.Cancelled:
                    raise
                except BaseException as exc:  # raised by start(), unwrapped
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    task_status.started(prepared)
                    await trio.sleep_forever()
    except BaseException as exc:
        if failure is not None or only_trio_cancellation(exc):
            raise
        log.warning("what an engine started in its prepare failed", exc_info=exc)
    if failure is not None:
        raise failure


@attrs.define(eq=False)
class SessionRunner:
    owner: Owner
    session: Session
    engine: Engine
    max_pending_input: int
    max_input_bytes: float = math.inf
    max_config_bytes: int = 64 * 1024
    conn: Connection | None = None
    prepared: Prepared | None = None
    """What the engine's ``prepare`` started: released once the engine is gone."""
    resumer: Connection | None = None
    """A resuming connection owed the terminal event of a session that ended detached."""
    timer: Entry | None = None
    """Its entry in the timer heap (timers.py)."""
    abandoned: bool = False
    """Its engine did not return in time once cancelled: the session ended without it."""
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _pace: Pace = attrs.field(factory=Pace)
    _inbox: Inbox = attrs.field(init=False)
    _budget: ConfigBudget = attrs.field(init=False)
    """The configuration's size, as the updates the engine has queued will leave it."""
    _returned: bool = False
    """The engine's ``run`` has returned (or raised)."""
    _give_up_at: float = math.inf
    """Once the engine is cancelled: when it is abandoned unless it has returned."""
    _audio_in: dict[str, int] = attrs.field(factory=dict)
    """The engine's ``audio_formats`` for client events, and for its own."""
    _audio_out: dict[str, int] = attrs.field(factory=dict)
    audio: AudioConfig | None = None
    """The session's negotiated audio, for an engine with an ``audio_rate``."""
    _decoder: Decoder | None = None
    """Client audio (wire format) to the engine's PCM16; None: audio passes as it is."""
    _encoder: Encoder | None = None
    _binary: bool = False
    """Output audio goes out on the binary lane."""
    _pcm_per_ms: int = 48
    _last_delta: Event | None = None
    """The engine's last output audio delta: the fields of a tail (with its own audio)."""
    _freezing: bool = False
    """``freeze`` stopped the engine: the session waits, engineless, for its end."""
    _engine_gone: trio.Event = attrs.field(factory=trio.Event)
    _end_decided: trio.Event = attrs.field(factory=trio.Event)
    _attaching: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    """Engines waiting in ``EngineSession.wait_attached``."""
    _frame: Callable[[Event], Frame] = attrs.field(init=False)
    """The session's dialect's ``frame``, bound once: what its other answers are written by."""

    def __attrs_post_init__(self) -> None:
        self._frame = self.session.spelling.frame
        self._inbox = Inbox(self.max_pending_input, self.max_input_bytes, self._report_consumed)
        self._budget = ConfigBudget.of(self.session.config, self.max_config_bytes)
        rate = engine_audio_rate(self.engine)
        if rate is not None:
            # Negotiated when the session opened (settle_audio): this cannot refuse.
            audio = self.audio = negotiate(self.session.config.get("audio"), rate)
            self._decoder = Decoder(audio.input, rate)
            self._encoder = Encoder(audio.output, rate)
            self._binary = audio.wire == "binary"
            self._pcm_per_ms = rate // 500
            usage = self.session.usage
            if usage.audio_ms_in is None:  # (a session restored by a migration counts on)
                usage.audio_ms_in = 0.0
            if usage.audio_ms_out is None:
                usage.audio_ms_out = 0.0
            return
        formats = self.engine.audio_formats
        if formats:  # (most engines: none, and the per-event paths test one empty dict)
            accepts = self.engine.accepts
            self._audio_in = {k: v for k, v in formats.items() if k in accepts}
            self._audio_out = {k: v for k, v in formats.items() if k not in accepts}
            usage = self.session.usage
            if self._audio_in and usage.audio_ms_in is None:  # (restored: counted on)
                usage.audio_ms_in = 0.0
            if self._audio_out and usage.audio_ms_out is None:
                usage.audio_ms_out = 0.0

    # -- lifetime ----------------------------------------------------------------------

    async def run(self) -> None:
        reason = Reason.SHUTDOWN  # unless the engine ends first: the server was cancelled
        try:
            with self._scope:
                reason = await self._run_engine()
            if self._freezing and reason != Reason.ENGINE_ERROR:
                # Stopped for a migration: the session lives on without its engine until
                # its owner ends it (``end(Reason.MIGRATED)`` once its record is stored).
                self._returned = True
                self._engine_gone.set()
                await self._end_decided.wait()
        finally:
            self._returned = True
            self._engine_gone.set()
            if self.prepared is not None:
                self.prepared.release()
            if self.abandoned:  # the session ended without it long ago
                self.owner.returned_late(self)
                log.info(
                    "the abandoned engine of session %s has returned",
                    self.session.id,
                    extra={"session_id": self.session.id},
                )
            else:
                self.end(reason)  # changes nothing if the end was decided before
                self._teardown()

    async def _run_engine(self) -> Reason:
        session = self.session
        handle = EngineSession(
            session.id,
            session.config,
            self._inbox,
            self.emit,
            audio=self.audio,
            principal=session.principal,
            attached=self._wait_attached,
            journal=session.journal,
        )
        try:
            await run_engine(self.engine, handle)
        except trio.Cancelled:
            raise
        except UpstreamLost as exc:  # not the engine's fault: no traceback
            log.warning(
                "session %s: upstream lost: %s",
                self.session.id,
                exc,
                extra={"session_id": self.session.id},
            )
            return Reason.UPSTREAM_LOST
        except BaseException as exc:  # whatever an engine raises ends only its session
            if only_trio_cancellation(exc):
                raise
            log.error(
                "engine of session %s failed",
                self.session.id,
                exc_info=exc,
                extra={"session_id": self.session.id},
            )
            return Reason.ENGINE_ERROR
        return Reason.ENGINE_FINISHED

    def _teardown(self) -> None:
        """The engine is gone (returned, or abandoned): free the slot, then send the
        terminal event to whoever can still hear it. Runs once."""
        session = self.session
        self._inbox.close()
        self._inbox.clear()  # nobody will read it: free it now
        self.owner.ended(self)
        terminal = session.terminal
        assert terminal is not None
        if terminal.reason == Reason.MIGRATED:  # its client was told to go (going_away)
            target = None
            if self.conn is not None:  # (finished already by its owner, normally)
                self.conn.finish([], terminal.close_code)
        elif terminal.generation is None:  # ended detached: only a resumer can hear it
            target = self.resumer
        elif self.conn is not None and self.conn.generation == terminal.generation:
            target = self.conn
        else:
            target = None
        if target is not None:
            target.finish([self._frame(terminal.event)], terminal.close_code)
        log.info(
            "session %s ended: %s",
            session.id,
            terminal.reason,
            extra={"session_id": session.id, "generation": terminal.generation},
        )

    def next_deadline(self) -> float:
        # Until the end is decided the session's deadline; then (the session has none
        # left) the engine's stop deadline, if it is still running.
        return min(self.session.next_deadline(), self._give_up_at)

    def fire(self, now: float) -> None:
        """The timer heap: a deadline of this session, or of its engine, may have passed."""
        if now >= self._give_up_at:
            self._abandon()
            return
        self.apply(self.session.poll(now))
        self.owner.reschedule(self)

    def apply(self, terminal: Terminal | None) -> None:
        """The core decided the end: cancel the engine (the ``run`` finally tears down)
        and give it ``engine_stop_timeout_s`` to return."""
        if terminal is not None:
            self._end_decided.set()
            self.owner.decided(self, terminal)
            if not self._returned:
                self._scope.cancel()
                self._give_up_at = trio.current_time() + self.owner.engine_stop_timeout_s
                self.owner.reschedule(self)

    def _abandon(self) -> None:
        """The cancelled engine has not returned in time (it ignores cancellation): end
        the session without it. Its task stays blocked where it is; ``run`` does nothing
        more should it return."""
        self.abandoned = True
        log.error(
            "engine of session %s did not return within %ss of its cancellation; "
            "abandoned (its task is left running, the session ends without it)",
            self.session.id,
            self.owner.engine_stop_timeout_s,
            extra={"session_id": self.session.id},
        )
        self._teardown()

    def end(self, reason: Reason) -> None:
        self.apply(self.session.begin_close(reason, trio.current_time()))

    # -- migration (core/migration.py) -------------------------------------------------

    async def freeze(self) -> Frozen | None:
        """Stop the engine at a safe point and take its snapshot, for a migration.

        Every event the engine's ``send`` returned from is journaled, and one whose
        ``send`` raised is not (a multi-payload audio delta goes whole or not at all);
        every event its ``receive`` returned was taken, and one whose ``receive``
        raised was not. From its start the attached connection is fenced off: nothing
        more it sends is taken or answered (the client sends it again after the
        resume, from ``resume_client_seq + 1``), so the session's client-seq state and
        its engine's queued input (``pending_input``, carried over) are exactly what the
        client was told was received. The session stays live, without its engine, until
        the caller ends it, with ``Reason.MIGRATED`` once the record is stored, or
        another reason.

        None: it cannot migrate (the engine did not return within
        ``engine_stop_timeout_s``, failed, has no snapshot, or the session is ending);
        the caller ends the session as it would have without a migration."""
        session = self.session
        if self._freezing or self._returned or session.terminal is not None:
            return None
        self._freezing = True
        conn, fenced = self.conn, 0
        if conn is not None:
            conn.release_waiters()  # an engine waiting for a congested connection
            # Fenced off from here: nothing more is taken from it, answered or acked (a
            # heartbeat's ack would tell the client that what it sent before is safe),
            # so the record holds exactly what the session received.
            fenced, conn.generation = conn.generation, 0
        self._scope.cancel()
        with trio.move_on_after(self.owner.engine_stop_timeout_s):
            await self._engine_gone.wait()
        frozen = self._frozen() if self._engine_gone.is_set() else None
        if frozen is None and conn is not None and conn.generation == 0:
            conn.generation = fenced  # staying here after all: it hears how the session ends
        return frozen

    def _frozen(self) -> Frozen | None:
        session = self.session
        if session.terminal is not None:
            return None  # failed, or the session ended meanwhile
        snapshot = getattr(self.engine, "snapshot", None)  # (engines are duck-typed)
        if snapshot is None:
            return None
        try:
            state = snapshot()
        except Exception as exc:  # the engine's fault: the session just cannot move
            log.error(
                "engine of session %s failed in snapshot",
                session.id,
                exc_info=exc,
                extra={"session_id": session.id},
            )
            return None
        if not isinstance(state, bytes | dict):
            if state is not None:  # (None: this engine cannot migrate)
                log.error(
                    "engine of session %s: snapshot returned a %s, not bytes or a dict",
                    session.id,
                    type(state).__name__,
                    extra={"session_id": session.id},
                )
            return None
        # Received and not yet taken: carried over, so nothing the client was told is
        # safe (received) is asked for again.
        return Frozen(state, session.client_seq, tuple(self._inbox.pending()))

    def restore_input(self, pending: tuple[tuple[Event, int], ...]) -> None:
        """Queue, for the engine, the input a migrated session's old node had received
        and its engine had not taken yet (``Frozen.pending_input``)."""
        for event, size in pending:
            self._inbox.put_restored(event, size)

    # -- attachment --------------------------------------------------------------------

    def attach(self, conn: Connection, commit: Commit) -> None:
        self.owner.attached(self, conn)
        old, self.conn = self.conn, conn
        conn.generation = commit.generation
        if old is not None and old is not conn:
            old.release_waiters()
            if commit.replaced == old.generation:
                replaced = events.replaced(self.session.id, commit.generation)
                old.finish([self._frame(replaced)], CloseCode.REPLACED, flush=False)
                old.abort_after(self.owner.close_timeout_s)
        going_away = self.owner.going_away_frame(self.session.spelling)
        if going_away is not None:  # attached during the drain: warn it too
            conn.push(going_away)
        self._attaching.unpark_all()

    async def _wait_attached(self) -> None:
        # (woken by every attach; a commit has set ``conn`` before it wakes anyone)
        while self.session.state is not State.ATTACHED:
            await self._attaching.park()
        await trio.lowlevel.checkpoint()

    def connection_lost(self, conn: Connection) -> None:
        if self.session.detach(conn.generation, trio.current_time()):
            log.info(
                "session %s detached (generation %d)",
                self.session.id,
                conn.generation,
                extra={"session_id": self.session.id, "generation": conn.generation},
            )
            self.owner.reschedule(self)
            self.owner.detached(self)
        if self.conn is conn:
            conn.release_waiters()

    # -- the per-event paths -----------------------------------------------------------

    async def emit(self, event: Event) -> None:
        """An engine's ``send``: sequence, journal, and write to the attached connection."""
        await self._pace.step()
        if self._encoder is not None:
            kind = event["type"]
            if kind in _AUDIO_KINDS:
                await self._emit_with_audio(event, kind, self._encoder)
                return
        now = trio.current_time()
        emitted = self.session.emit(event, now)
        if self._audio_out and emitted is not None:
            self._count_audio_out(event)
        conn = self._deliver(emitted, now)
        if conn is not None:
            await self._wait_drained(conn)

    def _deliver(self, emitted: Emitted | None, now: float) -> Connection | None:
        """Write what the core sequenced to the attached connection. Returns that
        connection if it is congested: the engine's ``send`` waits for it."""
        conn = self.conn
        session = self.session
        if emitted is None or conn is None or not session.is_current(conn.generation):
            return None
        # While more input waits for the engine, more output will follow at once: let
        # the pump send it together. Otherwise write it now, from this task.
        coalesce = len(self._inbox) > 0
        if emitted.notice is not None:
            conn.push(emitted.notice, coalesce=coalesce)
        conn.push(emitted.frame, coalesce=coalesce)
        if not session.usage.events_out & _SAMPLE_MASK:
            conn.sample_write(now, self.owner.send_to_write)
        return conn if conn.congested else None

    async def _wait_drained(self, conn: Connection) -> None:
        # Wait only while this connection is still the session's live attachment: once
        # it is lost or replaced, output goes to the journal without waiting.
        try:
            while (
                conn.congested
                and conn.close_code is None
                and self.session.is_current(conn.generation)
            ):
                await conn.wait_drained()
        except trio.Cancelled:
            # The event was sequenced: a freeze must see the ``send`` return, or the
            # engine would count it unsent. The scope stays cancelled: its next
            # checkpoint raises again.
            if not self._freezing:
                raise

    async def _emit_with_audio(self, event: Event, kind: str, encoder: Encoder) -> None:
        """An engine event on a session with audio: an output delta's PCM16 is encoded
        for the wire (zero or more deltas, each sequenced); an event that ends a stretch
        of audio first sends (or, for a cancel, drops) the encoder's tail."""
        if kind == _DELTA:
            pcm = event.get("audio")
            if type(pcm) is not bytes:
                if not isinstance(pcm, bytes | bytearray | memoryview):
                    raise TypeError(
                        f"an engine with audio_rate sends audio as bytes of PCM16, not "
                        f"{type(pcm).__name__}"
                    )
                pcm = bytes(pcm)
            payloads = encoder.encode(pcm)  # ValueError: not whole samples
            usage = self.session.usage
            if usage.audio_ms_out is not None:
                usage.audio_ms_out += len(pcm) / self._pcm_per_ms
            self._last_delta = event  # its fields, for a tail (its audio is replaced)
            await self._emit_audio(event, payloads)
            return
        tail = encoder.flush()
        if tail and kind != _CANCELLED and self._last_delta is not None:
            await self._emit_audio(self._last_delta, tail)
        now = trio.current_time()
        conn = self._deliver(self.session.emit(event, now), now)
        if conn is not None:
            await self._wait_drained(conn)

    async def _emit_audio(self, fields: Event, payloads: list[bytes]) -> None:
        """Sequence each payload as an output delta, as the session's dialect writes it:
        on the binary lane, or as ``fields`` carrying the payload."""
        emit_audio = self.session.emit_audio
        carrier = None if self._binary else fields
        for payload in payloads:
            now = trio.current_time()
            emitted = emit_audio(payload, now, carrier)
            conn = self._deliver(emitted, now)
            if conn is not None:
                await self._wait_drained(conn)

    def _count_audio_out(self, event: Event) -> None:
        rate = self._audio_out.get(event["type"])
        usage = self.session.usage
        if rate is not None and usage.audio_ms_out is not None:
            usage.audio_ms_out += audio_ms(event, rate)

    def handle(self, conn: Connection, event: Event, size: int = 0) -> None:
        """One client event from ``conn``, already decoded from ``size`` characters.
        Never awaits."""
        session = self.session
        if not session.is_current(conn.generation):
            return  # a replaced or ending attachment: fenced off
        now = trio.current_time()
        session.touch(now)
        usage = session.usage
        usage.events_in += 1
        usage.bytes_in += size
        try:
            kind = event["type"]
            if kind == _APPEND and self._decoder is not None:
                if not self._decode_audio(event, size, self._decoder):
                    return  # a resend of what was received
            check_input(self.engine, event)
            if session.config_locked:
                check_locked(self.engine, event)
            if kind not in _ANSWERED_HERE:  # for the engine (session.update too)
                self._to_engine(event, kind, size)
            elif kind == EventType.HEARTBEAT:
                conn.push(self._frame(events.heartbeat_ack(session.id)))
            elif kind == EventType.EVENT_ACK:
                session.ack(event.get("server_event_seq"))
            else:
                self.end(Reason.CLIENT_CLOSE)
        except ProtocolError as exc:
            self._refuse(conn, exc, event)
            if not exc.retryable:
                self._refused_for_good(event, size)
        except CheckFailed as exc:
            log.error(
                "engine of session %s failed in check",
                session.id,
                exc_info=exc.__cause__,
                extra={"session_id": session.id, "generation": conn.generation},
            )
            self.end(Reason.ENGINE_ERROR)

    def _refused_for_good(self, event: Event, size: int) -> None:
        """A non-retryable refusal of the next ``client_event_seq``: numbering goes on past
        it, and it counts as consumed (core/flow.py)."""
        seq = event.get("client_event_seq")
        if type(seq) is int and seq == self.session.client_seq + 1:
            self.session.note_client_seq(seq)
            self._inbox.refused(size)

    def _report_consumed(self, event: Event | None, drained: bool) -> bool:
        """The inbox's report step was reached (core/flow.py): tell the attached client how
        far its input is consumed. Drained, that is every seq received; else the seq of
        the event just taken. If it has none: nothing to report, and False (count on)
        unless the client numbers none of its events."""
        session = self.session
        seq = session.client_seq if drained or event is None else event.get("client_event_seq")
        if type(seq) is not int:
            return session.client_seq == 0
        frame = session.consumed(seq)
        conn = self.conn
        if frame is not None and conn is not None and session.is_current(conn.generation):
            conn.push(frame)
        return True

    def handle_binary(self, conn: Connection, data: bytes) -> None:
        """One binary message from ``conn``: input audio on the binary lane, decoded by
        the connection's dialect and handled as the ``input_audio_buffer.append`` it
        stands for."""
        if not self.session.is_current(conn.generation):
            return
        try:
            if not self._binary:
                raise ProtocolError(
                    ErrorCode.BAD_EVENT,
                    'binary messages need a session opened with session.audio.wire "binary"',
                )
            event = conn.dialect.decode_binary(data)
        except ProtocolError as exc:
            self._refuse(conn, exc, None)
            return
        self.handle(conn, event, len(data))

    def _refuse(self, conn: Connection, exc: ProtocolError, event: Event | None) -> None:
        if exc.code not in _PACING:  # pacing, not a fault
            conn.ws.report_fault(str(exc))
        if exc.close_code is None:
            conn.push(self._frame(exc.to_event(event)))
        else:  # (config_locked) the connection ends; the session detaches
            conn.finish([self._frame(exc.to_event(event))], exc.close_code)

    def _decode_audio(self, event: Event, size: int, decoder: Decoder) -> bool:
        """Turn an input audio event's ``audio`` (base64 from JSON, bytes from the
        binary lane, in the session's input format) into the engine's PCM16, in place.
        False: it is a resend of an event already received (nothing decoded). Refused
        (ProtocolError) before it is decoded if the engine's queue has no room: the
        decoder's state (a resampler's, Opus's) only ever sees audio that goes on."""
        seq = event.get("client_event_seq")
        if type(seq) is int and seq > 0 and not self.session.is_new_client_seq(seq):
            return False
        audio = event.get("audio")
        if isinstance(audio, str):
            try:
                audio = binascii.a2b_base64(audio, strict_mode=True)
            except (binascii.Error, ValueError):
                raise ProtocolError(
                    ErrorCode.BAD_EVENT, "audio is not valid base64", param="audio"
                ) from None
        elif not isinstance(audio, bytes):
            raise ProtocolError(ErrorCode.BAD_EVENT, "audio must be a base64 string", param="audio")
        if not self._inbox.has_room(size):
            raise _backpressure()
        pcm = event["audio"] = decoder.decode(audio)
        usage = self.session.usage
        if usage.audio_ms_in is not None:
            usage.audio_ms_in += len(pcm) / self._pcm_per_ms
        return True

    def _to_engine(self, event: Event, kind: str, size: int) -> None:
        seq = event.get("client_event_seq")
        session = self.session
        if seq is not None and not session.is_new_client_seq(seq):
            return  # a resend of something already received
        if kind == _UPDATE:
            self._update_to_engine(event, size)
        else:
            try:
                self._inbox.put_nowait(event, size)
            except trio.WouldBlock:
                raise _backpressure() from None
            if self._audio_in:
                rate = self._audio_in.get(kind)
                usage = session.usage
                if rate is not None and usage.audio_ms_in is not None:
                    usage.audio_ms_in += audio_ms(event, rate)
        if seq is not None:
            session.note_client_seq(seq)

    def _update_to_engine(self, event: Event, size: int) -> None:
        """Queue a ``session.update`` if the configuration it leaves fits its bound."""
        if self.session.config_locked:
            raise ProtocolError(
                ErrorCode.CONFIG_LOCKED,
                "the client token that opened this session locked its configuration",
                param="session",
                close_code=CloseCode.POLICY_VIOLATION,
            )
        update = event["session"]
        if "audio" in update and update["audio"] != self.session.config.get("audio"):
            raise ProtocolError(
                ErrorCode.BAD_EVENT,
                "session.audio is set when the session opens and cannot change",
                param="session.audio",
            )
        measured = self._budget.check(update)
        try:
            self._inbox.put_nowait(event, size)
        except trio.WouldBlock:
            raise _backpressure() from None
        self._budget.commit(measured)


def settle_audio(engine: Engine, config: dict[str, Any]) -> None:
    """At open: replace the client's ``session.audio`` request with the effective audio
    configuration (protocol v2), or refuse it (``unsupported_audio_format``). Without a
    request nothing is added (a v1 client sees v1's ``session.created``) and the
    defaults apply; an engine without ``audio_rate`` takes no audio settings."""
    rate = engine_audio_rate(engine)
    if rate is not None:
        if "audio" in config:
            config["audio"] = negotiate(config["audio"], rate).as_event()
    elif "audio" in config:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            "this server's engine declares no audio format: session.audio cannot be set",
            param="session.audio",
        )


def _backpressure() -> ProtocolError:
    return ProtocolError(
        ErrorCode.INPUT_BACKPRESSURE, "the session's input queue is full; retry later"
    )


def engine_broke(where: str, exc: BaseException) -> ProtocolError:
    """The engine failed before a session existed: no slot is held any more, and the
    client is answered ``engine_error`` and closed 1011. The engine's fault: logged at
    ERROR."""
    log.error("engine failed in its %s; no session opened", where, exc_info=exc)
    return ProtocolError(
        ErrorCode.ENGINE_ERROR,
        "the engine failed; no session was opened",
        close_code=CloseCode.INTERNAL_ERROR,
    )


def only_trio_cancellation(exc: BaseException) -> bool:
    """A group of nothing but trio's own Cancelled (an engine's nursery cancelled)."""
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
