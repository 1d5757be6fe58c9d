"""``Pace``: a cancellation point on every call, a scheduler round on every Nth.

Per-event paths that can go on without waiting (the connection's reader serving
messages from one read, an engine's ``receive`` taking queued input, an engine's
``send``) call ``await pace.step()`` once per event. A full checkpoint per event cost a
task switch per event; with ``Pace`` no task runs more than ``limit`` (``EVERY``) events
without letting the others run, and every event can still be cancelled.

The batch paths (``EngineSession.receive_batch`` and ``send_many``) count a batch of
``n`` events as ``n`` steps with one call (``step_many``): one cancellation point per
batch, and a scheduler round first when the batch would take the count past ``limit``.
So between two rounds a task still handles at most ``limit`` events (or one batch).

A session's engine shares one ``Pace`` of ``2 * EVERY`` between its receives and its
sends (the runner's): an event in and its answer out are two steps, as when each had a
``Pace`` of ``EVERY`` of its own.
"""

from __future__ import annotations

import trio

EVERY = 16

_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


class Pace:
    __slots__ = ("_count", "limit")

    def __init__(self, limit: int = EVERY) -> None:
        self._count = 0
        self.limit = limit

    async def step(self) -> None:
        """A cancellation point; a scheduler round too on every ``limit``-th call."""
        await _checkpoint_if_cancelled()
        self._count += 1
        if self._count >= self.limit:
            self._count = 0
            await _cancel_shielded_checkpoint()

    async def step_many(self, n: int) -> None:
        """A cancellation point before a batch of ``n`` events; a scheduler round first
        if the count is past ``limit``, or the batch would take it past."""
        await _checkpoint_if_cancelled()
        count = self._count + n
        if count > self.limit and self._count:
            count = n
            await _cancel_shielded_checkpoint()
        self._count = count

    def due(self) -> bool:
        """Count one event, without a checkpoint: is a scheduler round due (every
        ``limit``-th call)? The caller then takes one (``trio.lowlevel.checkpoint``)."""
        self._count += 1
        if self._count >= self.limit:
            self._count = 0
            return True
        return False

    def count(self, n: int) -> None:
        """``n`` events were handled with no step (a batch taken right after a wait)."""
        self._count += n

    def reset(self) -> None:
        """The caller just waited (a scheduler round): count from zero again."""
        self._count = 0
