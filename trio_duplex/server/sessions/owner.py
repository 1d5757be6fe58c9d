"""``Sessions``: the one owner of every session of a server.

It owns the admission registry (the core's ``Registry``), each session's runner and the
nursery the runners live in, the timer heap that wakes every deadline, and the drain.
A session starts here (``start``, once its ``session.created`` is delivered) and ends
here (``ended``, called by its runner once the engine is gone): nothing else adds or
removes a runner, frees a slot or forgets a timer entry.

The runners' nursery and the timer task live in a trio system task of their own
(``running``), not in the server's task: an engine that ignores cancellation keeps its
runner's task, and so that nursery, from ever finishing, and trio cannot wait for it or
stop it. Its session is ended without it (``SessionRunner``, ``engine_stop_timeout_s``);
the server can still return, and ``abandoned`` says what it leaves behind. What breaks
that task (a bug: a runner and the timers catch everything an engine does) is handed
to the server to raise (``watch``), so it does not become a TrioInternalError.

``Observer`` is how tests (and, later, metrics) watch the sessions: an explicit hook,
like trio's ``Instrument``, called synchronously at each decision.
"""

from __future__ import annotations

import bisect
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from ...core import events, opening
from ...core.events import Reason
from ...core.opening import Assigned
from ...core.session import Commit, Registry, Session, State, Terminal, Usage
from ...core.spelling import Frame, Spelling
from ...core.wire import ProtocolError
from ...dialects import NATIVE, Dialect, Shaper
from ...engines.api import Engine, writes_raw
from ..config import ServerConfig
from .connection import Connection
from .runner import Prepared, SessionRunner, engine_broke, hold_prepared, only_trio_cancellation
from .timers import Timers

SEND_TO_WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (seconds) of the send-to-write histogram's buckets, +Inf implied."""


@attrs.define(eq=False)
class Histogram:
    """Counts of sampled times per bucket (``SEND_TO_WRITE_BUCKETS``), not cumulative."""

    bounds: tuple[float, ...] = SEND_TO_WRITE_BUCKETS
    counts: list[int] = attrs.field(init=False)
    total: float = 0.0

    def __attrs_post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds


@attrs.define(eq=False)
class Totals:
    """Counts since the server started, for the metrics (read at scrape time)."""

    opened: int = 0
    """Sessions whose ``session.created`` was delivered."""
    resumes: dict[str, int] = attrs.field(factory=dict)
    """By result: ``ok``, an error code, ``aborted`` (replay not written in time)."""
    refusals: dict[str, int] = attrs.field(factory=dict)
    """HTTP handshakes refused, by reason."""
    engine_errors: int = 0
    """Sessions ended ``engine_error``, and engines that failed before a session."""
    replayed_events: int = 0
    replay_audio_dropped: int = 0
    """Journaled audio frames resumes skipped (a dialect that does not replay audio)."""
    ended: Usage = attrs.field(factory=Usage)
    """The sum of the usage of every session that has ended."""
    opened_by: dict[str, int] = attrs.field(factory=dict)
    """``opened`` by the sessions' dialect (``native``, ``openai``)."""
    ended_by: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    """By dialect: the events in and out of every session that has ended."""

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


log = logging.getLogger("trio_duplex")

PREPARE_TIMEOUT_S = 30.0
"""The longest an engine's ``prepare`` may take (its client waits for ``session.created``
meanwhile); then the open is refused, retryable."""


class Observer:
    """Watches a server's sessions. Subclass it and override what you need; every method
    runs synchronously inside the server and must neither raise nor block."""

    def terminal_decided(self, session: Session, terminal: Terminal) -> None:
        """The core returned ``terminal``: the session is ending (once per session)."""

    def terminal_queued(self, conn: Connection, frames: list[str | bytes]) -> None:
        """Frames that end a connection were queued (``Connection.finish``)."""

    def attached(self, session: Session, conn: Connection) -> None:
        """``conn`` now carries ``session`` (opened or resumed)."""

    def released(self, session: Session) -> None:
        """``session``'s slot is free (it ended, or its ``session.created`` was never
        delivered)."""


@attrs.define(eq=False)
class Sessions:
    config: ServerConfig
    close_timeout_s: float
    dialect: Dialect = NATIVE
    """The dialect its connections speak, and its sessions are written in."""
    registry: Registry = attrs.field(init=False)
    timers: Timers = attrs.field(factory=Timers, init=False)
    observers: list[Observer] = attrs.field(factory=list, init=False)
    totals: Totals = attrs.field(factory=Totals, init=False)
    send_to_write: Histogram = attrs.field(factory=Histogram, init=False)
    """Sampled times from an engine's send to its frame's write (runner.SAMPLE_EVERY)."""
    abandoned: set[SessionRunner] = attrs.field(factory=set, init=False)
    """Runners whose engine was abandoned (it ignored cancellation) and has not returned:
    their sessions have ended, their tasks have not."""
    _runners: dict[str, SessionRunner] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _stopped: trio.Event = attrs.field(factory=trio.Event, init=False)
    """The system task has finished (stopped, or broken: see ``_failure``)."""
    _failure: BaseException | None = attrs.field(default=None, init=False)
    _drain_deadline: float | None = attrs.field(default=None, init=False)
    _drained: bool = attrs.field(default=False, init=False)
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    handing_over: Callable[[SessionRunner], bool] | None = attrs.field(default=None, init=False)
    """Cluster mode, once the drain has begun: is this session being handed to another
    node (migration.py)? Such a session is neither warned nor ended by the drain: its
    hand-over ends it."""

    def __attrs_post_init__(self) -> None:
        self.registry = Registry(self.config.core_limits, spelling=self.dialect)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The runners' nursery and the timer task (a system task; see above) for the
        block. At its end, whatever ends it, every session still running ends
        (``server_shutdown``) and the block waits until each one's engine has returned
        or been abandoned (``engine_stop_timeout_s`` at most); it does not wait for
        abandoned engines' tasks. Run ``watch`` beside the block."""
        ready = trio.Event()
        trio.lowlevel.spawn_system_task(
            self._run, ready, name="trio_duplex.Sessions", context=contextvars.copy_context()
        )
        await ready.wait()
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):  # bounded by engine_stop_timeout_s
                await self._stop()

    async def _run(self, ready: trio.Event) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self.timers.run)
                    ready.set()
                    await trio.sleep_forever()
        except BaseException as exc:  # a system task must not raise: ``watch`` will
            self._failure = exc
        finally:
            self._stopped.set()
            self.changed()

    async def watch(self) -> None:
        """Run beside the server until cancelled: raises what broke the system task."""
        await self._stopped.wait()
        if self._failure is not None:
            raise self._failure
        raise RuntimeError("the sessions task stopped before the server")

    async def _stop(self) -> None:
        await self._end_all()
        self._scope.cancel()
        if not self.abandoned:
            await self._stopped.wait()  # nothing left in it that could block

    # -- what the server asks ----------------------------------------------------------

    @property
    def slots_held(self) -> int:
        return self.registry.slots_held

    @property
    def engine_stop_timeout_s(self) -> float:
        return self.config.engine_stop_timeout_s

    @property
    def shutting_down(self) -> bool:
        return self.registry.shutting_down

    def runners(self) -> list[SessionRunner]:
        """The runners of the sessions started and not yet ended, now."""
        return list(self._runners.values())

    def runner(self, session_id: str) -> SessionRunner | None:
        """The runner of a started session that has not ended yet."""
        return self._runners.get(session_id)

    def admits(self, max_sessions: int) -> bool:
        """Would ``admit`` take a slot now (not draining, a slot free)?"""
        return not self.shutting_down and self.slots_held < max_sessions

    def admit(
        self,
        config: dict[str, object],
        principal: str | None = None,
        locked: bool = False,
        dialect: Dialect | None = None,
        assigned: Assigned | None = None,
    ) -> tuple[Session, str]:
        """Take a slot for a new OPENING session, written in ``dialect`` (that of the
        connection opening it; by default ``self.dialect``), with the id and fixed token
        ``assigned`` if given. ProtocolError: full, or draining (or ``assigned``'s id is
        here already)."""
        return self.registry.admit(
            config, principal, locked, dialect or self.dialect, assigned=assigned
        )

    def undelivered(self, session: Session) -> None:
        """Its ``session.created`` was not delivered: nothing ran, the slot is free now."""
        terminal = session.handshake_failed(trio.current_time())
        if terminal is not None:
            self._decided(session, terminal)
        if self.registry.release(session):
            self._released(session)
        self.changed()
        log.info(
            "session %s: session.created undelivered",
            session.id,
            extra={"session_id": session.id},
        )

    async def prepare(self, engine: Engine) -> Prepared:
        """Run ``engine.prepare`` (``Engine.prepare``) within ``PREPARE_TIMEOUT_S``, in a
        nursery of the sessions nursery, and return the handle that keeps that nursery
        (``start``'s or ``adopt``'s ``prepared``; else ``release`` it). ProtocolError:
        the engine refused (with its own error), was not ready in time (retryable
        ``resource_exhausted``), or broke (``engine_error``)."""
        assert self._nursery is not None
        try:
            with trio.fail_after(PREPARE_TIMEOUT_S):
                prepared: Prepared = await self._nursery.start(hold_prepared, engine)
                return prepared
        except (ProtocolError, trio.Cancelled):
            raise
        except trio.TooSlowError:
            log.warning("an engine was not ready within %gs: open refused", PREPARE_TIMEOUT_S)
            raise opening.engine_not_ready(PREPARE_TIMEOUT_S) from None
        except BaseException as exc:
            if only_trio_cancellation(exc):
                raise
            raise engine_broke("prepare", exc) from None

    def start(
        self,
        session: Session,
        engine: Engine,
        conn: Connection,
        *,
        opening_event: bool = False,
        prepared: Prepared | None = None,
    ) -> SessionRunner:
        """``session.created`` was delivered on ``conn``: run the session's engine.
        ``opening_event``: the message that opened it is handled next, as its input."""
        session.handshake_delivered(trio.current_time(), opening_event=opening_event)
        # The core lets an OPENING session be closed, but here only a runner, a timer
        # entry or the drain ends a session, and it has none of them yet.
        assert session.terminal is None, "a session ended before it started"
        dialect = conn.dialect
        # An engine that writes this dialect's own shapes (realtime-proxy) is not shaped.
        shaper = None if writes_raw(engine, dialect.name) else dialect.shaper(session.config)
        runner = self._runner(session, engine, dialect, shaper)
        runner.prepared = prepared
        runner.attach(conn, Commit(session.generation, None))
        self._start_runner(runner)
        self.totals.opened += 1
        self.totals.count(self.totals.opened_by, dialect.name)
        self.reschedule(runner)
        if self._drained:  # delivered after the drain ended: it ends with the others
            runner.end(Reason.SHUTDOWN)
        log.info(
            "session %s opened",
            session.id,
            extra={
                "session_id": session.id,
                "generation": session.generation,
                "principal": session.principal,
            },
        )
        return runner

    def adopt(
        self,
        session: Session,
        engine: Engine,
        prepared: Prepared | None = None,
        *,
        dialect: Dialect = NATIVE,
        shaper: Shaper | None = None,
    ) -> SessionRunner:
        """Run a session restored from another node (core/migration.py): DETACHED, with
        no connection, its ``engine`` fresh from the factory and its state ``restore``d
        by the caller, as are ``dialect`` (its ``spelling``) and its ``shaper``. Its
        grace runs as any detached session's; a ``session.resume``
        (``for_resume``) attaches a client. ProtocolError: refused as ``admit`` refuses
        (full, draining), or the session is already here."""
        self.registry.adopt(session)
        runner = self._runner(session, engine, dialect, shaper)
        runner.prepared = prepared
        self._start_runner(runner)
        self.reschedule(runner)
        log.info(
            "session %s adopted (migrated here)",
            session.id,
            extra={"session_id": session.id, "principal": session.principal},
        )
        return runner

    def _runner(
        self, session: Session, engine: Engine, dialect: Dialect, shaper: Shaper | None
    ) -> SessionRunner:
        config = self.config
        return SessionRunner(
            self,
            session,
            engine,
            config.max_pending_input,
            config.max_input_bytes,
            config.max_config_bytes,
            dialect=dialect,
            shaper=shaper,
        )

    def _start_runner(self, runner: SessionRunner) -> None:
        """Own ``runner`` and start its task (synchronous: no cancel point in between)."""
        self._runners[runner.session.id] = runner
        assert self._nursery is not None
        self._nursery.start_soon(runner.run)

    def for_resume(self, session_id: str) -> SessionRunner:
        """The runner of a resumable session (ProtocolError: none, or draining)."""
        session = self.registry.lookup_for_resume(session_id)
        runner = self.runner(session.id)
        if runner is None:  # still opening: its session.created is not delivered
            raise opening.not_resumable()
        return runner

    # -- what runners report (runner.Owner) --------------------------------------------

    def reschedule(self, runner: SessionRunner) -> None:
        self.timers.schedule(runner)

    def decided(self, runner: SessionRunner, terminal: Terminal) -> None:
        self._decided(runner.session, terminal)

    def ended(self, runner: SessionRunner) -> None:
        if self.registry.release(runner.session):
            usage, ended = runner.session.usage, self.totals.ended
            ended.events_in += usage.events_in
            ended.bytes_in += usage.bytes_in
            ended.events_out += usage.events_out
            ended.bytes_out += usage.bytes_out
            ended.resumes += usage.resumes
            by = self.totals.ended_by
            events_in, events_out = by.get(runner.dialect.name, (0, 0))
            by[runner.dialect.name] = (events_in + usage.events_in, events_out + usage.events_out)
            self._released(runner.session)
        del self._runners[runner.session.id]
        self.timers.forget(runner)
        if runner.abandoned:
            self.abandoned.add(runner)
        self.changed()

    def returned_late(self, runner: SessionRunner) -> None:
        self.abandoned.discard(runner)
        self.changed()

    def attached(self, runner: SessionRunner, conn: Connection) -> None:
        for observer in self.observers:
            observer.attached(runner.session, conn)

    def detached(self, runner: SessionRunner) -> None:
        """During the drain a detached session cannot resume: end it now rather than let
        it hold the drain. One whose resume began before the drain may still finish it."""
        session = runner.session
        if self.shutting_down and session.state is State.DETACHED and session.resume is None:
            if self.handing_over is None or not self.handing_over(runner):
                runner.end(Reason.SHUTDOWN)

    def _released(self, session: Session) -> None:
        for observer in self.observers:
            observer.released(session)

    def _decided(self, session: Session, terminal: Terminal) -> None:
        if terminal.reason == Reason.ENGINE_ERROR:
            self.totals.engine_errors += 1
        for observer in self.observers:
            observer.terminal_decided(session, terminal)

    # -- shutdown ----------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Refuse new opens and resumes, warn every attached client, and end every
        detached session at once: it cannot resume during the drain, so waiting for it
        would only hold the drain until its deadline (one that detaches later ends at
        once too: ``detached``)."""
        self.registry.shutting_down = True
        self._drain_deadline = trio.current_time() + self.config.drain_timeout_s
        going = events.going_away(round(self.config.drain_timeout_s * 1000))
        for runner in list(self._runners.values()):
            if self.handing_over is not None and self.handing_over(runner):
                continue
            conn = runner.conn
            if conn is not None and runner.session.is_current(conn.generation):
                conn.push(runner.session.frame(going))
            else:
                self.detached(runner)

    async def drain(self) -> None:
        """Wait for the sessions to end until the drain deadline, then end the rest, and
        wait until each one's engine has returned or been abandoned."""
        assert self._drain_deadline is not None, "begin_shutdown first"
        # Slots, not runners: a session still sending its session.created counts too.
        with trio.move_on_at(self._drain_deadline):
            while self.registry.slots_held:
                await self.wait_changed()
        await self._end_all()

    async def _end_all(self) -> None:
        self._drained = True  # a session delivered from now on ends at once (``start``)
        for runner in list(self._runners.values()):
            runner.end(Reason.SHUTDOWN)
        # Each one returns, or the timer heap abandons it at its engine's stop deadline.
        while self._runners and not self._stopped.is_set():
            await self.wait_changed()

    def going_away_ms(self) -> int:
        """While draining: the time left until the drain ends, in ms (0 otherwise)."""
        if self._drain_deadline is None:
            return 0
        return round(max(0.0, self._drain_deadline - trio.current_time()) * 1000)

    def going_away_frame(self, spelling: Spelling) -> Frame | None:
        """While draining: ``session.going_away`` with the time left now."""
        if self._drain_deadline is None:
            return None
        return spelling.frame(events.going_away(self.going_away_ms()))

    # -- changes -----------------------------------------------------------------------

    async def wait_changed(self) -> None:
        """Wait until a session or connection ends (for the drain, and for tests)."""
        await self._changed.park()

    def changed(self) -> None:
        # (Called as each connection and session ends: mostly with nobody waiting.)
        if self._changed:
            self._changed.unpark_all()
