"""``Pace``: a cancellation point on every call, a scheduler round on every Nth.

Per-event paths that can go on without waiting (the connection's reader serving
messages from one read, an engine's ``receive`` taking queued input, an engine's
``send``) call ``await pace.step()`` once per event. A full checkpoint per event cost a
task switch per event; with ``Pace`` no task runs more than ``EVERY`` events without
letting the others run, and every event can still be cancelled.
"""

from __future__ import annotations

import trio

EVERY = 16


class Pace:
    __slots__ = ("_count",)

    def __init__(self) -> None:
        self._count = 0

    async def step(self) -> None:
        """A cancellation point; a scheduler round too on every ``EVERY``-th call."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._count += 1
        if self._count >= EVERY:
            self._count = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    def reset(self) -> None:
        """The caller just waited (a scheduler round): count from zero again."""
        self._count = 0
