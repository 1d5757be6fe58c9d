"""Engines written for asyncio: ``AsyncioEngine``, run under the trio server.

A subclass implements ``async def run(self, session)`` with asyncio code (asyncio
queues, ``asyncio.sleep``, an asyncio model client); ``session`` is an
``AsyncioSession``, the same API as the trio ``EngineSession`` (``receive``, ``send``,
``async for``), awaited from asyncio. The server calls ``run_in_trio``, which opens an
asyncio loop for the session (trio-asyncio's ``open_loop``: asyncio on top of trio, in
the session's own task tree), runs the engine there and closes the loop when it ends.

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

``loop.run_in_executor(None, f)`` (and ``asyncio.to_thread``) is cancelled at once, as
in asyncio: ``f`` runs to its end in its worker thread and its result is dropped.

Each bridged call runs the trio ``EngineSession`` method as a trio task of the session's
loop (trio-asyncio's ``trio_as_future``): cancelling the asyncio side cancels the trio
call and waits for its outcome, so an event is never both taken and lost.

Needs the ``asyncio`` extra (``pip install 'trio-duplex[asyncio]'``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from .api import Engine, EngineSession, Event

T = TypeVar("T")


class EngineCancelledItself(RuntimeError):
    """An asyncio engine raised ``asyncio.CancelledError`` that its session's end did not
    cause: its session ends with ``engine_error`` (the CancelledError is the cause)."""


@attrs.define(eq=False)
class AsyncioSession(EngineSession):
    """An asyncio engine's handle on its session: ``EngineSession``'s API, from asyncio."""

    _loop: Any = attrs.field(default=None, kw_only=True)
    """The session's trio-asyncio loop."""

    @classmethod
    def of(cls, session: EngineSession, loop: Any) -> AsyncioSession:
        """The asyncio handle on the session that ``session`` (the runner's) is for."""
        return cls(
            session.session_id,
            session.config,  # the same dict: session.update changes it for both
            session._inbox,
            session._emit,
            session._pace,
            audio=session.audio,
            principal=session.principal,
            dialect=session.dialect,
            raw=session.raw,
            attached=session._attached,
            journal=session._journal,
            loop=loop,
        )

    async def send(self, event: Event) -> None:
        await self._bridge(super().send, event)

    async def receive(self, *, updates: bool = False, answer: bool = True) -> Event:
        receive = functools.partial(super().receive, updates=updates, answer=answer)
        return await self._bridge(receive)

    async def wait_attached(self) -> None:
        await self._bridge(super().wait_attached)

    async def _bridge(self, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        task = asyncio.current_task()
        assert task is not None, "an AsyncioSession is awaited from the engine's asyncio task"
        requested = task.cancelling()
        # Cancelling this future cancels the trio call and waits for its outcome.
        future: asyncio.Future[T] = self._loop.trio_as_future(call, *args)
        try:
            result = await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled() or future.exception() is not None:
                raise
            # Done before the cancel reached it (an event taken, a send sequenced): its
            # result stands, and the cancel is due at the engine's next await.
            result = future.result()
            task.uncancel()
            task.cancel()
            return result
        if task.cancelling() > requested:
            # Cancelled while the trio call went on to complete (a send the migration
            # stop lets finish): the same.
            task.uncancel()
            task.cancel()
        return result


def _abandoning_executor() -> Any:
    """The loop's default executor (``run_in_executor(None, f)``, ``asyncio.to_thread``):
    trio-asyncio's, whose await a cancel could not interrupt (it waited for ``f`` to
    return, then lost the cancel), made to behave as asyncio's own: the await is
    cancelled at once, and ``f`` runs to its end in its thread, its result dropped."""
    import trio
    import trio_asyncio

    class AbandoningExecutor(trio_asyncio.TrioExecutor):  # type: ignore[misc]
        async def submit(self, func: Callable[..., T], *args: Any) -> T:
            if not self._running:
                raise RuntimeError("the executor is shut down")
            return await trio.to_thread.run_sync(
                func, *args, limiter=self._limiter, abandon_on_cancel=True
            )

    return AbandoningExecutor()


def _bridge_missing() -> str | None:
    try:
        import trio_asyncio  # noqa: F401
    except ImportError:
        return "an asyncio engine, which needs trio-asyncio: pip install 'trio-duplex[asyncio]'"
    return None


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
        return _bridge_missing()

    async def run_in_trio(self, session: EngineSession) -> None:
        """What the server awaits (trio): ``run`` on an asyncio loop of the session's own."""
        import trio_asyncio  # the asyncio extra; engine_problem says so if it is missing

        failure: Exception | None = None
        async with trio_asyncio.open_loop() as loop:
            loop.set_default_executor(_abandoning_executor())
            try:
                await trio_asyncio.aio_as_trio(self.run)(AsyncioSession.of(session, loop))
            except asyncio.CancelledError as exc:  # the session's end arrives as trio's
                failure = EngineCancelledItself(
                    "the asyncio engine raised CancelledError on its own"
                )
                failure.__cause__ = exc
            except Exception as exc:  # raised once the loop is closed, not in its group
                failure = exc
        if failure is not None:
            raise failure
