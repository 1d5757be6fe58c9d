"""Engines written for asyncio: ``AsyncioEngine``, run under the trio server.

A subclass implements ``async def run(self, session)`` with asyncio code (asyncio
queues, ``asyncio.sleep``, an asyncio model client); ``session`` is an
``AsyncioSession``, the same API as the trio ``EngineSession`` (``receive``, ``send``,
``async for``), awaited from asyncio. The server calls ``run_in_trio``, which runs an
asyncio event loop of the session's own (``_Loop``: the standard selector loop, driven
from the session's trio task tree) with the engine's ``run`` as its main task, and
closes it when the engine is done.

The contract is a trio engine's (``engines/api.py``):

* The session's end cancels the engine's asyncio task: it sees ``asyncio.CancelledError``
  at its current await. One that swallows it is abandoned after
  ``engine_stop_timeout_s``, as a trio engine is.
* Whatever the engine raises ends only its session (``engine_error``). That includes an
  ``asyncio.CancelledError`` it raises on its own (a cancelled model call it did not
  handle, not the session's end): ``engine_error`` too, never a trio ``Cancelled``.
* ``send`` waits while the connection is congested; a ``send`` that returned was
  sequenced and one that raised was not, and a ``receive`` that raised took nothing, so
  ``snapshot``/``restore`` (synchronous) work as for trio engines.

``loop.run_in_executor(None, f)`` (and ``asyncio.to_thread``) runs ``f`` in a trio worker
thread and is cancelled at once, as in asyncio: ``f`` runs to its end in its thread and
its result is dropped.

How it runs. The loop is asyncio's own ``SelectorEventLoop`` (its tasks, futures, timers,
sockets and transports), but it never blocks in its selector: a trio task, the loop's
*driver*, runs its ready callbacks in batches and, when none is ready, waits in trio:
for the session's input if an engine task waits in ``receive``, until the loop's next
timer, for a wake-up (a callback queued from trio or from a thread), and for the
selector's own file descriptor (an engine's sockets) through a watcher task. The loop's
clock is trio's, so ``trio.testing.MockClock`` drives ``asyncio.sleep`` in tests.

The session's calls run in the driver's own task, inside the batch, without a task or a
future each:

* ``receive`` takes a queued event at once (``Inbox.get_nowait``); with none queued the
  engine's task waits on a future that the driver resolves once it has taken the next
  event, the driver itself parked in the inbox (an event's arrival wakes the driver
  directly: one trio task switch per event, as for a trio engine).
* ``send`` runs ``EngineSession.send`` in the driver's task: without congestion it never
  suspends, and returns having sequenced the event. If it must wait (a congested
  connection) it has already parked the driver's task where it waits, so that task stays
  with the call (its waits are handed back to trio as they are) and the loop goes on in
  a new driver task; the engine's task waits on a future for the call's outcome. A
  cancel of that task from asyncio (not the session's end) takes effect once the send is
  done, at the engine's next await: the event was sequenced, so the send returns.
* Every 16th call (the runner's ``Pace``) the engine's task yields to the loop, and the
  driver to trio, before the call returns: no session runs more than that many events
  without letting the others run. A cancel that arrives there is due at the next await.

The session's end cancels the driver's task: it cancels the engine's main task and then
drives the loop shielded until the task is done (the runner abandons it after the stop
timeout, as any engine); from then on ``receive`` and ``send`` raise CancelledError.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import heapq
import math
import selectors
import sys
import threading
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any, TypeVar, TypeVarTuple, Unpack

import attrs
import outcome
import sniffio
import trio

from .._pace import EVERY as BATCH
from ..core import events
from ..core.events import EventType
from .api import Engine, EngineSession, Event, check_sendable

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_SCHEDULE: object
try:  # what trio's cancel_shielded_checkpoint yields (Pace's scheduler round)
    from trio._core._traps import CancelShieldedCheckpoint as _SCHEDULE
except ImportError:  # pragma: no cover  (another trio: such a round takes the slow path)
    _SCHEDULE = object()

EVERY = 16
"""Calls of the session's (receives taken at once) between two yields to the loop."""

_UPDATE = frozenset({EventType.UPDATE})


class EngineCancelledItself(RuntimeError):
    """An asyncio engine raised ``asyncio.CancelledError`` that its session's end did not
    cause: its session ends with ``engine_error`` (the CancelledError is the cause)."""


@types.coroutine
def _trap(message: object) -> Generator[object, Any, Any]:
    """Hand a trio coroutine's yield to trio as it is; what trio sends back, back."""
    return (yield message)


@types.coroutine
def _yield_to_loop() -> Generator[None, None, None]:
    """An asyncio task's bare yield: it is stepped again in the loop's next batch."""
    yield


def _rearm(task: asyncio.Task[Any]) -> None:
    """A cancel reached the task as the call it was in completed: the call's result
    stands, and the cancel is due again at the task's next await."""
    task.uncancel()
    task.cancel()


class _CallFuture(asyncio.Future[Any]):
    """The outcome of a session call that waits in trio (a congested send). Cancelling it
    cannot stop that call: the task that waits on it gets its outcome (sequenced or not)
    and, if it returned, the cancel at its next await (see ``_Loop.wait_call``)."""

    def cancel(self, msg: Any = None) -> bool:
        return not self.done()

    def resolve(self, result: outcome.Outcome[Any]) -> None:
        if self.done():  # (nothing cancels it; defensive)
            return
        if isinstance(result, outcome.Value):
            self.set_result(result.value)
        elif isinstance(result, outcome.Error):
            if isinstance(result.error, trio.Cancelled):  # the session's end
                super().cancel()
            else:
                self.set_exception(result.error)


class _LazySelector(selectors.BaseSelector):
    """The loop's selector, made at its first registration (most engines open no socket
    of their own: no epoll file descriptor for them). Its ``select`` never blocks: the
    driver waits for the inner selector's descriptor in trio, through a watcher task."""

    def __init__(self, loop: _Loop) -> None:
        self._loop = loop
        self._inner: selectors.BaseSelector | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        if self._inner is None:
            self._inner = selectors.DefaultSelector()
            self._loop._watch(self._inner)
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        if self._inner is None:
            raise KeyError(fileobj)
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        if self._inner is None:
            raise KeyError(fileobj)
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return [] if self._inner is None else self._inner.select(0)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return {} if self._inner is None else self._inner.get_map()


class _Loop(asyncio.SelectorEventLoop):
    """A session's asyncio loop, driven from trio (see the module's docstring)."""

    _ready: collections.deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _timer_cancelled_count: int
    _clock_resolution: float
    _thread_id: int | None

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._nursery: trio.Nursery | None = None
        self._idle: trio.CancelScope | None = None
        """The driver's wait while nothing is ready: cancelled to wake it."""
        self._handoff: tuple[Coroutine[Any, Any, Any], object, _CallFuture] | None = None
        """A session call that must wait in trio, parked in the driver's task."""
        self._inputs: collections.deque[asyncio.Future[Event]] = collections.deque()
        """Engine tasks' ``receive``, waiting for the driver to take the next event."""
        self._take: Callable[[], Awaitable[Event]] | None = None
        self._steps = 0
        self.ending = False
        """The session's end has cancelled the engine: its calls raise CancelledError."""
        self._main: asyncio.Task[Any] | None = None
        self._finished = False
        self._io_ready = False
        self._io_lot = trio.lowlevel.ParkingLot()
        self._helpers: set[trio.CancelScope] = set()
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        """The loop's tasks (``asyncio.all_tasks`` goes through every loop's)."""
        super().__init__(_LazySelector(self))

    # -- what asyncio asks of a loop ----------------------------------------------------

    def time(self) -> float:
        return trio.current_time()

    def create_task(
        self,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        *,
        name: object = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        self._tasks.add(task)
        return task

    def call_soon(
        self,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        if self._idle is not None:  # queued from trio while the driver waits: wake it
            self._idle.cancel()
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        timer = super().call_at(when, callback, *args, context=context)
        if self._idle is not None and when < self._idle.deadline:
            self._idle.deadline = when
        return timer

    def _make_self_pipe(self) -> None:
        """No self-pipe: ``call_soon_threadsafe`` wakes the driver through trio."""

    def _close_self_pipe(self) -> None:
        pass

    def _write_to_self(self) -> None:
        try:
            self._token.run_sync_soon(self._wake)
        except trio.RunFinishedError:  # pragma: no cover  (trio has ended: nothing to wake)
            pass

    def _wake(self) -> None:
        if self._idle is not None:
            self._idle.cancel()

    def add_signal_handler(
        self, sig: int, callback: Callable[[Unpack[Ts]], object], *args: *Ts
    ) -> None:
        raise NotImplementedError("an engine's asyncio loop handles no signals (the server does)")

    def run_in_executor(
        self,
        executor: concurrent.futures.Executor | None,
        func: Callable[[Unpack[Ts]], T],
        *args: *Ts,
    ) -> asyncio.Future[T]:
        """With ``None`` (the default executor; ``asyncio.to_thread``): a trio worker
        thread, whose await a cancel interrupts at once (``f`` runs on, its result
        dropped). An executor of the engine's own is used as asyncio uses it."""
        if executor is not None:
            return super().run_in_executor(executor, func, *args)
        self._check_closed()  # type: ignore[attr-defined]
        call = functools.partial(func, *args)
        return self.run_trio(
            functools.partial(trio.to_thread.run_sync, abandon_on_cancel=True), call
        )

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """The default executor's threads are trio's: nothing to shut down."""

    def run_trio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> asyncio.Future[T]:
        """``await fn(*args)`` in a trio task of the loop's nursery, as an asyncio future;
        cancelling the future cancels that task (its outcome is then dropped). For calls
        that take and sequence nothing."""
        assert self._nursery is not None, "the loop is not running"
        future: asyncio.Future[T] = self.create_future()
        scope = trio.CancelScope()
        future.add_done_callback(lambda f: scope.cancel() if f.cancelled() else None)
        self._nursery.start_soon(self._helper, future, scope, fn, args)
        return future

    async def _helper(
        self,
        future: asyncio.Future[T],
        scope: trio.CancelScope,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
    ) -> None:
        self._helpers.add(scope)
        try:
            with scope:
                result = await outcome.acapture(fn, *args)
        finally:
            self._helpers.discard(scope)
        if future.done():
            return
        if scope.cancelled_caught or (
            isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled)
        ):
            future.cancel()
        elif isinstance(result, outcome.Value):
            future.set_result(result.value)
        else:
            future.set_exception(result.error)

    # -- the session's calls (from the engine's tasks, in the driver's task) ------------

    def call(self, coro: Coroutine[Any, Any, T]) -> tuple[Any, int]:
        """Run a trio coroutine of the session's here, in the driver's task, as far as it
        goes without waiting. Returns ``(result, 0)``; ``(result, 1)`` if it asked for a
        scheduler round (the caller then yields, see ``paced``); ``(future, 2)`` if it
        must wait in trio: the driver hands it the task it parked in."""
        paced = 0
        try:
            message = coro.send(None)
            while message is _SCHEDULE:
                paced = 1  # (the round is given once the caller has its result)
                message = coro.send(outcome.Value(None))
        except StopIteration as stop:
            return stop.value, paced
        future = _CallFuture(loop=self)
        self._handoff = (coro, message, future)
        return future, 2

    def step(self) -> bool:
        """Count a call that went on without waiting: True every ``EVERY``-th."""
        self._steps += 1
        if self._steps >= EVERY:
            self._steps = 0
            return True
        return False

    async def paced(self, result: T) -> T:
        """Yield to the loop (and the driver to trio) before returning ``result``, a
        call's: a cancel that arrives meanwhile is due at the task's next await."""
        try:
            await _yield_to_loop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            _rearm(task)
        return result

    async def wait_call(self, future: _CallFuture) -> Any:
        """The outcome of a call that waits in trio (``call`` returned a future)."""
        task = asyncio.current_task()
        assert task is not None, "an AsyncioSession is awaited from the engine's asyncio task"
        requested = task.cancelling()
        try:
            result = await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled() or future.exception() is not None:
                raise
            _rearm(task)  # done before the cancel reached the task: the result stands
            return future.result()
        if task.cancelling() > requested:
            _rearm(task)  # cancelled while the call went on to complete
        return result

    async def wait_input(self) -> Event:
        """The next event, once the driver has taken it (nothing is queued now)."""
        self._steps = 0
        future: asyncio.Future[Event] = self.create_future()
        self._inputs.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled() or future.exception() is not None:
                raise
            task = asyncio.current_task()
            assert task is not None
            _rearm(task)  # taken before the cancel reached the task: it is the engine's
            return future.result()
        finally:
            if future in self._inputs:  # (cancelled before the driver took anything)
                self._inputs.remove(future)

    # -- the driver ---------------------------------------------------------------------

    async def drive(self) -> None:
        """Run the loop until its main task and the tasks it left are done; while this
        task is its driver (a call that must wait in trio keeps the task it parked, and
        the loop goes on in a new one)."""
        while not self._finished:
            try:
                # One scope for as long as nothing wakes the driver from trio (a wake-up
                # cancels it): a scope costs about a fifth of a trio echo's whole event.
                with trio.CancelScope(shield=self.ending) as scope:
                    if await self._run(scope):
                        return
            except trio.Cancelled:  # the session's end
                self._end()

    async def _run(self, scope: trio.CancelScope) -> bool:
        """Drive the loop inside ``scope`` until it is cancelled (a wake-up), the loop is
        done (False), or a call that must wait in trio has this task (True)."""
        while not self._finished:
            if self._ready or self._io_ready or self._due():
                self._batch()
                if self._handoff is not None:
                    coro, message, future = self._handoff
                    self._handoff = None
                    assert self._nursery is not None
                    self._nursery.start_soon(self.drive)  # first: it may wait long
                    await self._finish_call(coro, message, future)
                    return True
                if self._ready and not self._finished:  # more: the others' turn first
                    if self.ending:
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    else:
                        await trio.lowlevel.checkpoint()
                continue
            await self._wait(scope)
        return False

    def _due(self) -> bool:
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False  # type: ignore[attr-defined]
        return bool(scheduled) and scheduled[0].when() < self.time() + self._clock_resolution

    def _batch(self) -> None:
        """What ``BaseEventLoop._run_once`` does once its selector has returned: the
        ready callbacks and the due timers, run once each; stops after a call that must
        wait in trio (the driver's task is that call's from then on)."""
        ready = self._ready
        if self._io_ready:
            self._io_ready = False
            self._process_events(self._selector.select(0))  # type: ignore[attr-defined]
            self._io_lot.unpark_all()
        scheduled = self._scheduled
        if scheduled:
            end = self.time() + self._clock_resolution
            while scheduled and scheduled[0].when() < end:
                timer = heapq.heappop(scheduled)
                timer._scheduled = False  # type: ignore[attr-defined]
                ready.append(timer)
        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(
            firstiter=self._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
            finalizer=self._asyncgen_finalizer_hook,  # type: ignore[attr-defined]
        )
        library, sniffio.thread_local.name = sniffio.thread_local.name, "asyncio"
        running = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        try:
            for _ in range(len(ready)):
                handle = ready.popleft()
                if handle._cancelled:
                    continue
                handle._run()
                if self._handoff is not None:
                    break
        finally:
            asyncio.events._set_running_loop(running)
            sniffio.thread_local.name = library
            sys.set_asyncgen_hooks(*hooks)

    async def _wait(self, scope: trio.CancelScope) -> None:
        """Nothing is ready: wait in trio for the next event (if a task waits in
        ``receive``), until the next timer, or for a wake-up (``scope`` cancelled)."""
        scheduled = self._scheduled
        timed = bool(scheduled)
        if timed:
            scope.deadline = scheduled[0].when()
        inputs = self._inputs
        while inputs and inputs[0].done():  # (cancelled: their tasks remove them too)
            inputs.popleft()
        got: outcome.Outcome[Event] | None = None
        self._idle = scope
        try:
            if not inputs or self.ending or self._take is None:
                await trio.sleep_forever()
            else:
                try:
                    got = outcome.Value(await self._take())
                except trio.EndOfChannel as exc:
                    got = outcome.Error(exc)
        finally:
            self._idle = None
        if timed:
            scope.deadline = math.inf
        if got is not None:
            # (the loop ran nothing meanwhile: the receive that waited still does)
            waiter = inputs.popleft()
            if isinstance(got, outcome.Value):
                waiter.set_result(got.value)
            elif isinstance(got, outcome.Error):
                waiter.set_exception(got.error)

    async def _finish_call(
        self, coro: Coroutine[Any, Any, Any], message: object, future: _CallFuture
    ) -> None:
        """Go on with a session call that parked this task: its waits are this task's."""
        while True:
            sent = await _trap(message)
            try:
                message = coro.send(sent)
            except StopIteration as stop:
                result: outcome.Outcome[Any] = outcome.Value(stop.value)
                break
            except BaseException as exc:  # (its outcome is the engine's, as a future's)
                result = outcome.Error(exc)
                break
        future.resolve(result)

    def _end(self) -> None:
        """The session's end (trio cancelled the driver): cancel the engine's main task."""
        if self.ending:
            return
        self.ending = True
        if self._main is not None and not self._main.done():
            self._main.cancel()

    def _watch(self, selector: selectors.BaseSelector) -> None:
        assert self._nursery is not None, "the loop is not running"
        fileno: Callable[[], int] = getattr(selector, "fileno")  # noqa: B009  (epoll's, kqueue's)
        self._nursery.start_soon(self._watcher, fileno())

    async def _watcher(self, fd: int) -> None:
        """The selector's descriptor, readable: wake the driver, which selects."""
        with trio.CancelScope(shield=True) as scope:  # (sockets work while it unwinds)
            self._helpers.add(scope)
            try:
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    self._io_ready = True
                    self._wake()
                    await self._io_lot.park()
            finally:
                self._helpers.discard(scope)

    # -- lifetime -----------------------------------------------------------------------

    async def run_main(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as the loop's main task, then (as ``asyncio.run`` does) cancel and
        wait for the tasks it left, and close the loop's async generators."""
        self._thread_id = threading.get_ident()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                main = self._main = self.create_task(coro)
                main.add_done_callback(self._main_done)
                await self.drive()
        finally:
            self._nursery = None
            self._thread_id = None
            self.close()
        return main

    def _main_done(self, main: asyncio.Task[Any]) -> None:
        epilogue = self.create_task(self._epilogue())
        epilogue.add_done_callback(self._finish)

    async def _epilogue(self) -> None:
        me = asyncio.current_task()
        left = [task for task in self._tasks if task is not me and not task.done()]
        for task in left:
            task.cancel()
        results = await asyncio.gather(*left, return_exceptions=True)
        for task, result in zip(left, results, strict=True):
            if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
                self.call_exception_handler(
                    {
                        "message": "unhandled exception of an engine's task at its end",
                        "exception": result,
                        "task": task,
                    }
                )
        await self.shutdown_asyncgens()

    def _finish(self, epilogue: asyncio.Task[Any]) -> None:
        self._finished = True
        for scope in self._helpers:
            scope.cancel()


@attrs.define(eq=False)
class AsyncioSession(EngineSession):
    """An asyncio engine's handle on its session: ``EngineSession``'s API, from asyncio."""

    _loop: Any = attrs.field(default=None, kw_only=True)
    """The session's asyncio loop (``_Loop``)."""

    @classmethod
    def of(cls, session: EngineSession, loop: Any) -> AsyncioSession:
        """The asyncio handle on the session that ``session`` (the runner's) is for: its
        fields, every one (``config`` the same dict: ``session.update`` changes both)."""
        handle = cls.__new__(cls)
        for field in attrs.fields(EngineSession):
            object.__setattr__(handle, field.name, getattr(session, field.name))
        object.__setattr__(handle, "_loop", loop)
        if isinstance(loop, _Loop):
            loop._take = handle._inbox.get
        return handle

    async def send(self, event: Event) -> None:
        loop: _Loop = self._loop
        if loop.ending:
            raise asyncio.CancelledError
        result, how = loop.call(super().send(event))
        if how == 1:
            await loop.paced(None)
        elif how == 2:
            await loop.wait_call(result)

    async def receive(self, *, updates: bool = False, answer: bool = True) -> Event:
        loop: _Loop = self._loop
        inbox = self._inbox
        while True:
            if loop.ending:
                raise asyncio.CancelledError
            if inbox:  # queued: taken at once
                event = inbox.get_nowait()
                if loop.step():
                    await loop.paced(None)
            else:  # (the driver takes it, and does what get_nowait does on empty)
                event = await loop.wait_input()
            if event["type"] not in _UPDATE:
                return event
            update = event["session"]
            self.config.update(update)
            if answer or not updates:
                # The fields it set, not the whole configuration: an update's cost is its own.
                await self.send(events.updated(self.session_id, update))
            if updates:
                return event

    async def receive_batch(
        self, limit: int = BATCH, *, updates: bool = False, answer: bool = True
    ) -> list[Event]:
        """``EngineSession.receive_batch``, from asyncio: ``receive`` for the first event,
        then what is queued behind it, up to ``limit``, ending before a ``session.update``.
        Cancelled, it took nothing; returned, exactly the events it returns."""
        if limit < 1:
            raise ValueError(f"a batch holds at least one event, not {limit}")
        first = await self.receive(updates=updates, answer=answer)
        batch = [first]
        if first["type"] in _UPDATE:
            return batch
        inbox = self._inbox
        while len(batch) < limit and (queued := inbox.peek()) is not None:
            if queued["type"] in _UPDATE:
                break
            batch.append(inbox.get_nowait())  # (no await: nothing can cancel half-way)
        return batch

    async def send_many(self, events: Sequence[Event]) -> None:
        """``EngineSession.send_many``, from asyncio: every event is checked first
        (ValueError: none is sent), then each is sent as ``send`` sends it. A
        cancellation may land between two of them (each one sent was sequenced:
        ``sent_seq`` says how far), at a migration's stop too."""
        batch = list(events)
        for event in batch:
            check_sendable(event, self.raw)
        for event in batch:
            await self.send(event)

    async def wait_attached(self) -> None:
        loop: _Loop = self._loop
        if loop.ending:
            raise asyncio.CancelledError
        await loop.run_trio(super().wait_attached)


class AsyncioEngine(Engine):
    """Base class for engines written with asyncio. Subclasses set ``accepts`` (and
    ``check``, ``audio_rate``, ``snapshot``/``restore`` as trio engines do) and implement
    ``async def run(self, session)`` with asyncio code."""

    async def run(self, session: EngineSession) -> None:
        """Asyncio-flavoured: ``session`` is an ``AsyncioSession``."""
        raise NotImplementedError

    def bridge_problem(self) -> str | None:
        """Why it cannot run (``engine_problem`` asks): None, it can."""
        if getattr(type(self), "run", None) is AsyncioEngine.run:
            return "which does not implement 'run'"
        return None

    async def run_in_trio(self, session: EngineSession) -> None:
        """What the server awaits (trio): ``run`` on an asyncio loop of the session's own."""
        loop = _Loop()
        main = await loop.run_main(self.run(AsyncioSession.of(session, loop)))
        if main.cancelled():
            if loop.ending:  # the session's end: it ends as trio's Cancelled
                await trio.lowlevel.checkpoint()
                return
            try:
                main.result()
            except asyncio.CancelledError as exc:
                failure = EngineCancelledItself(
                    "the asyncio engine raised CancelledError on its own"
                )
                raise failure from exc
        main.result()  # (what it raised ends its session: engine_error)
        if loop.ending:
            await trio.lowlevel.checkpoint()
