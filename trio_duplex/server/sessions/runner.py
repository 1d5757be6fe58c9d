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
the server or the sessions module. What a client event means is the core's
(``core/protocol.py``): ``handle`` hands it to the machine and does what it decides.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from ..._pace import EVERY, Pace
from ...audio import AudioConfig, Decoder, Encoder, negotiate
from ...core import events, opening
from ...core.events import EventType, Reason
from ...core.frames import CloseCode
from ...core.migration import Frozen
from ...core.protocol import (
    IGNORE,
    TO_ENGINE,
    Action,
    ClientEvents,
    Decision,
    binary_not_negotiated,
    refusal,
)
from ...core.session import Commit, Emitted, Session, State, Terminal, audio_ms
from ...core.spelling import Frame, Spelling
from ...core.wire import ConfigBudget, ProtocolError
from ...dialects import NATIVE, Dialect, Shaper
from ...engines.api import (
    Engine,
    EngineSession,
    Event,
    Inbox,
    UpstreamLost,
    engine_audio_rate,
    run_engine,
    writes_raw,
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


# Module globals, not enum members, on the per-event path: a member lookup costs ~100 ns.
_APPEND = str(EventType.INPUT_AUDIO_APPEND)
_TO_ENGINE, _IGNORE = TO_ENGINE, IGNORE
_REPLY, _REFUSE = Action.REPLY, Action.REFUSE
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


class Once:
    """A ``trio.Event`` for a runner, made only once someone waits: most sessions never
    freeze, so ``_engine_gone`` and ``_end_decided`` are set and never waited for, and
    an idle session keeps 2 x 48 bytes rather than 2 x 272 (an Event and its set)."""

    __slots__ = ("_done", "_event")

    def __init__(self) -> None:
        self._done = False
        self._event: trio.Event | None = None

    def set(self) -> None:
        self._done = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        return self._done

    async def wait(self) -> None:
        """As ``trio.Event.wait``: a checkpoint if set, else wait until it is."""
        if self._done:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        await self._event.wait()


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
    owner: Owner = attrs.field(repr=False)  # (its repr holds every runner: quadratic)
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
    dialect: Dialect = attrs.field(default=NATIVE, kw_only=True)
    """The dialect the session was opened in (its ``session.spelling``)."""
    shaper: Shaper | None = attrs.field(default=None, kw_only=True)
    """The dialect's expansion of each engine event (``Dialect.shaper``); None: the
    engine's events are sequenced as they are."""
    abandoned: bool = False
    """Its engine did not return in time once cancelled: the session ended without it."""
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _pace: Pace = attrs.field(factory=lambda: Pace(2 * EVERY))
    """Shared by the engine's receives and sends: two steps per event answered."""
    _inbox: Inbox = attrs.field(init=False)
    _machine: ClientEvents = attrs.field(init=False)
    """What each client event means (core/protocol.py)."""
    _returned: bool = False
    """The engine's ``run`` has returned (or raised)."""
    _give_up_at: float = math.inf
    """Once the engine is cancelled: when it is abandoned unless it has returned."""
    _audio_out: dict[str, int] = attrs.field(factory=dict)
    """The engine's ``audio_formats`` for its own events (the machine counts the client's)."""
    audio: AudioConfig | None = None
    """The session's negotiated audio, for an engine with an ``audio_rate``."""
    _encoder: Encoder | None = None
    _binary: bool = False
    """Output audio goes out on the binary lane."""
    _pcm_per_ms: int = 48
    _last_delta: Event | None = None
    """The engine's last output audio delta: the fields of a tail (with its own audio)."""
    _freezing: bool = False
    """``freeze`` stopped the engine: the session waits, engineless, for its end."""
    _batching: bool = False
    """An ``emit_many`` writes event by event: each frame joins the outbox for the pump."""
    _engine_gone: Once = attrs.field(factory=Once)
    _end_decided: Once = attrs.field(factory=Once)
    _attaching: trio.lowlevel.ParkingLot | None = None
    """Engines waiting in ``EngineSession.wait_attached`` (made by the first: most never
    wait)."""
    _frame: Callable[[Event], Frame] = attrs.field(init=False)
    """The session's dialect's ``frame``, bound once: what its other answers are written by."""

    def __attrs_post_init__(self) -> None:
        self._frame = self.session.spelling.frame
        self._inbox = Inbox(self.max_pending_input, self.max_input_bytes, self._report_consumed)
        budget = ConfigBudget.of(self.session.config, self.max_config_bytes)
        decoding: Decoder | None = None
        audio_in: dict[str, int] = {}
        usage = self.session.usage
        rate = engine_audio_rate(self.engine)
        if rate is not None:
            # Negotiated when the session opened (settle_audio): this cannot refuse.
            audio = self.audio = negotiate(self.session.config.get("audio"), rate)
            self._pcm_per_ms = rate // 500
            decoding = Decoder(audio.input, rate)
            self._encoder = Encoder(audio.output, rate)
            self._binary = audio.wire == "binary"
            if usage.audio_ms_in is None:  # (a session restored by a migration counts on)
                usage.audio_ms_in = 0.0
            if usage.audio_ms_out is None:
                usage.audio_ms_out = 0.0
        elif formats := self.engine.audio_formats:  # (most engines: none)
            accepts = self.engine.accepts
            audio_in = {k: v for k, v in formats.items() if k in accepts}
            self._audio_out = {k: v for k, v in formats.items() if k not in accepts}
            if audio_in and usage.audio_ms_in is None:  # (restored: counted on)
                usage.audio_ms_in = 0.0
            if self._audio_out and usage.audio_ms_out is None:
                usage.audio_ms_out = 0.0
        self._machine = ClientEvents(
            self.session,
            self.engine,
            budget,
            self._inbox.has_room,
            decoding,
            audio_in,
            self._pcm_per_ms,
            None if rate is None else _Reaudio(self, rate),
        )

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
            self._pace,
            audio=self.audio,
            principal=session.principal,
            dialect=self.dialect.name,
            raw=writes_raw(self.engine, self.dialect.name),
            attached=self._wait_attached,
            journal=session.journal,
            emit_many=self.emit_many,
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
            conn.ws.playout_fenced(True)  # a call's caller stops hearing it now
        self._scope.cancel()
        with trio.move_on_after(self.owner.engine_stop_timeout_s):
            await self._engine_gone.wait()
        frozen = self._frozen() if self._engine_gone.is_set() else None
        if frozen is None and conn is not None and conn.generation == 0:
            conn.generation = fenced  # staying here after all: it hears how the session ends
            conn.ws.playout_fenced(False)
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
        shaper = self.shaper
        return Frozen(
            state,
            session.client_seq,
            tuple(self._inbox.pending()),
            dialect=self.dialect.name,
            shaper_state=None if shaper is None else shaper.state(),
        )

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
        if self._attaching is not None:
            self._attaching.unpark_all()

    async def _wait_attached(self) -> None:
        # (woken by every attach; a commit has set ``conn`` before it wakes anyone)
        while self.session.state is not State.ATTACHED:
            if self._attaching is None:
                self._attaching = trio.lowlevel.ParkingLot()
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
        # A cancellation point, and a scheduler round every so often (``Pace.step``,
        # without its coroutine: one per event).
        if self._pace.due():
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        if self.shaper is not None:  # every event the shaper makes of it, written together
            await self._emit_frames(self._shape(event, self.shaper), True)
            return
        encoder = self._encoder
        if encoder is not None:
            kind = event["type"]
            if kind == _DELTA:  # (``_emit_with_audio``'s delta, inline: a voice's every event)
                payloads = self._encode(event, encoder)
                emit_audio = self.session.emit_audio
                carrier = None if self._binary else event
                for payload in payloads:
                    now = trio.current_time()
                    conn = self._deliver(emit_audio(payload, now, carrier), now)
                    if conn is not None:
                        await self._wait_drained(conn)
                return
            if kind in _AUDIO_ENDS:
                await self._emit_with_audio(event, kind, encoder)
                return
        now = trio.current_time()
        emitted = self.session.emit(event, now)
        if self._audio_out and emitted is not None:
            self._count_audio_out(event)
        conn = self._deliver(emitted, now)
        if conn is not None:
            await self._wait_drained(conn)

    async def emit_many(self, events: list[Event]) -> None:
        """An engine's ``send_many``: each event as ``emit`` sends it, with one ``Pace``
        step per chunk of ``EVERY`` events, not one per event; the first is the batch's
        cancellation point. A freeze lets the batch finish (no cancellation point after
        the first: what a migration sees is all of it or none). The frames of a chunk
        go to the connection together: one write while the socket takes them."""
        pace = self._pace
        for at in range(0, len(events), EVERY):
            chunk = events[at : at + EVERY] if at or len(events) > EVERY else events
            if at and self._freezing:
                await trio.lowlevel.cancel_shielded_checkpoint()
            else:
                await pace.step_many(len(chunk))
            shaper = self.shaper
            if shaper is not None:  # every event shaped, then all of them written together
                shaped: list[Event] = []
                for event in chunk:
                    shaped += self._shape(event, shaper)
                await self._emit_frames(shaped, True)
                continue
            encoder = self._encoder
            if encoder is None or not any(e["type"] in _AUDIO_KINDS for e in chunk):
                await self._emit_frames(chunk, False)
                continue
            plain: list[Event] = []  # (as emit, less its step; plain events together)
            self._batching = True  # more follows at once: the pump writes them together
            try:
                for event in chunk:
                    kind = event["type"]
                    if kind in _AUDIO_KINDS:
                        if plain:
                            await self._emit_frames(plain, False)
                            plain = []
                        await self._emit_with_audio(event, kind, encoder)
                        continue
                    plain.append(event)
            finally:
                self._batching = False
            if plain:
                await self._emit_frames(plain, False)

    async def _emit_frames(self, chunk: list[Event], shaped: bool) -> None:
        """Sequence each event of ``chunk`` and write their frames to the attached
        connection together; past what would congest it, they are written and the
        connection waited for (as each ``send`` waits) before the next is sequenced.

        ``shaped``: the events are a shaper's (``_shape``), their audio already counted;
        an output audio delta whose ``audio`` is the wire's bytes goes as the dialect
        writes audio (``audio_frame``: on the binary lane if negotiated), and while more
        follows at once (a batch, more input waiting) the frames join the outbox for the
        pump, as ``_deliver`` would have them. Else: engine events, as they are.

        A freeze sees all of ``chunk`` sequenced or none: the only waits are
        ``_wait_drained``'s, which a freeze's cancellation does not end early."""
        session = self.session
        now = trio.current_time()
        frames: list[Frame] = []
        pending = 0
        sampled = False
        count_out = not shaped and bool(self._audio_out)
        carrier = not self._binary
        coalesce = shaped and (self._batching or len(self._inbox) > 0)
        conn = self.conn
        live = conn is not None and session.is_current(conn.generation)
        room, room_bytes = (0, 0.0) if conn is None else conn.room()
        for event in chunk:
            if shaped and event["type"] == _DELTA and type(audio := event.get("audio")) is bytes:
                emitted = session.emit_audio(audio, now, event if carrier else None)
            else:
                emitted = session.emit(event, now)
            if emitted is None:
                break  # ending: nothing more is sequenced
            if count_out:
                self._count_audio_out(event)
            if not live:
                continue
            assert conn is not None
            if emitted.notice is not None:
                frames.append(emitted.notice)
                pending += len(emitted.notice)
            frame = emitted.frame
            frames.append(frame)
            pending += len(frame)
            if not session.usage.events_out & _SAMPLE_MASK:
                sampled = True
            if len(frames) > room or pending > room_bytes:  # queued, they would congest it
                conn.push_many(frames, coalesce=coalesce)
                frames, pending = [], 0
                if sampled:
                    conn.sample_write(now, self.owner.send_to_write)
                    sampled = False
                if conn.congested:
                    await self._wait_drained(conn)
                    now = trio.current_time()
                    conn = self.conn
                    live = conn is not None and session.is_current(conn.generation)
                room, room_bytes = (0, 0.0) if conn is None else conn.room()
        if frames and live:
            assert conn is not None
            conn.push_many(frames, coalesce=coalesce)
            if sampled:
                conn.sample_write(now, self.owner.send_to_write)
            if conn.congested:
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
        coalesce = self._batching or len(self._inbox) > 0
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
            await self._emit_audio(event, self._encode(event, encoder))
            return
        tail = encoder.flush()
        if tail and kind != _CANCELLED and self._last_delta is not None:
            await self._emit_audio(self._last_delta, tail)
        now = trio.current_time()
        conn = self._deliver(self.session.emit(event, now), now)
        if conn is not None:
            await self._wait_drained(conn)

    def _encode(self, delta: Event, encoder: Encoder) -> list[bytes]:
        """An engine's output delta's PCM16 encoded for the wire, counted in the usage;
        the delta is kept for its fields (a tail's carrier: its audio is replaced)."""
        pcm = delta.get("audio")
        if type(pcm) is not bytes:
            pcm = _as_pcm(pcm)
        payloads = encoder.encode(pcm)  # ValueError: not whole samples
        usage = self.session.usage
        if usage.audio_ms_out is not None:
            usage.audio_ms_out += len(pcm) / self._pcm_per_ms
        self._last_delta = delta
        return payloads

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

    def _shape(self, event: Event, shaper: Shaper) -> list[Event]:
        """What the shaper makes of an engine event, in order: the encoder's rules apply
        to the engine's own event first (each encoded payload shaped as a delta of its
        own; the tail before the events that end the audio, none after a cancel)."""
        kind = event["type"]
        encoder = self._encoder
        if encoder is not None and kind in _AUDIO_KINDS:
            if kind == _DELTA:
                payloads = self._encode(event, encoder)
                if len(payloads) == 1:  # (a voice's every delta)
                    return shaper.shape({**event, "audio": payloads[0]})
                out: list[Event] = []
                for payload in payloads:
                    out += shaper.shape({**event, "audio": payload})
                return out
            out = []
            tail = encoder.flush()
            if tail and kind != _CANCELLED and self._last_delta is not None:
                for payload in tail:
                    out += shaper.shape({**self._last_delta, "audio": payload})
            out += shaper.shape(event)
            return out
        if self._audio_out:
            self._count_audio_out(event)
        return shaper.shape(event)

    def _count_audio_out(self, event: Event) -> None:
        rate = self._audio_out.get(event["type"])
        usage = self.session.usage
        if rate is not None and usage.audio_ms_out is not None:
            usage.audio_ms_out += audio_ms(event, rate)

    def handle(self, conn: Connection, event: Event, size: int = 0) -> None:
        """One client event from ``conn``, already decoded from ``size`` characters:
        the machine (core/protocol.py) decides, this acts. Never awaits."""
        decision = self._machine.receive(event, size, conn.generation, trio.current_time())
        if decision is _TO_ENGINE:
            try:
                self._inbox.put_nowait(event, size)
            except trio.WouldBlock:  # (only for an event that took nothing: see receive)
                self._act(conn, self._machine.full(event), size)
        elif decision is not _IGNORE:
            self._act(conn, decision, size)

    def _act(self, conn: Connection, decision: Decision, size: int) -> None:
        action = decision.action
        if action is _REPLY:
            assert decision.frame is not None
            conn.push(decision.frame)
        elif action is _REFUSE:
            self._refuse(conn, decision)
            if decision.consumed:
                self._inbox.refused(size)
        else:  # END
            if decision.cause is not None:
                log.error(
                    "engine of session %s failed in check",
                    self.session.id,
                    exc_info=decision.cause,
                    extra={"session_id": self.session.id, "generation": conn.generation},
                )
            self.apply(decision.terminal)

    def _report_consumed(self, event: Event | None, drained: bool) -> bool:
        """The inbox's report step was reached (core/flow.py): the machine says whether it
        is reported, and what to tell the attached client."""
        conn = self.conn
        generation = 0 if conn is None else conn.generation
        reported, frame = self._machine.report_consumed(event, drained, generation)
        if frame is not None and conn is not None:
            conn.push(frame)
        return reported

    def handle_binary(self, conn: Connection, data: bytes) -> None:
        """One binary message from ``conn``: input audio on the binary lane, decoded by
        the connection's dialect and handled as the ``input_audio_buffer.append`` it
        stands for."""
        if not self.session.is_current(conn.generation):
            return
        try:
            if not self._binary:
                raise binary_not_negotiated()
            event = conn.dialect.decode_binary(data)
        except ProtocolError as exc:
            self._refuse(conn, refusal(exc, None, self.session.spelling))
            return
        self.handle(conn, event, len(data))

    def _refuse(self, conn: Connection, decision: Decision) -> None:
        assert decision.frame is not None
        if decision.fault is not None:
            conn.ws.report_fault(decision.fault)
        if decision.close_code is None:
            conn.push(decision.frame)
        else:  # (config_locked) the connection ends; the session detaches
            conn.finish([decision.frame], decision.close_code)


@attrs.frozen
class _Reaudio:
    """A runner's ``AudioSwitch`` (core/protocol.py): ``session.audio`` changed by a
    ``session.update`` before any audio passed. The encoder and the binary lane switch
    as the machine takes the update, so output from then on is in the new format."""

    runner: SessionRunner
    rate: int

    def negotiate(self, requested: object, /) -> dict[str, Any]:
        return negotiate(requested, self.rate).as_event()  # ProtocolError: unsupported

    def switch(self, negotiated: dict[str, Any], /) -> Decoder:
        runner = self.runner
        audio = runner.audio = negotiate(negotiated, self.rate)
        runner._encoder = Encoder(audio.output, self.rate)
        runner._binary = audio.wire == "binary"
        runner._last_delta = None
        return Decoder(audio.input, self.rate)


def _as_pcm(pcm: object) -> bytes:
    """An engine's output audio as bytes; TypeError: it is no bytes-like object."""
    if not isinstance(pcm, bytes | bytearray | memoryview):
        raise TypeError(
            f"an engine with audio_rate sends audio as bytes of PCM16, not {type(pcm).__name__}"
        )
    return bytes(pcm)


def engine_broke(where: str, exc: BaseException) -> ProtocolError:
    """The engine failed before a session existed: no slot is held any more, and the
    client is answered ``engine_error`` and closed 1011. The engine's fault: logged at
    ERROR."""
    log.error("engine failed in its %s; no session opened", where, exc_info=exc)
    return opening.engine_failed()


def only_trio_cancellation(exc: BaseException) -> bool:
    """A group of nothing but trio's own Cancelled (an engine's nursery cancelled)."""
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
