"""One timer task for every session's deadlines (disconnect grace, idle TTL).

A task per session would cost a task, a nursery and two cancel scopes per idle session.
Instead each session has at most one live entry in a heap; an entry that has gone stale
(the session ended, or its deadline moved) is skipped when it comes up. The core decides
what a deadline means (``Session.poll``); this only wakes it at the right time.
"""

from __future__ import annotations

import heapq
import math
from itertools import count
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from ._runner import SessionRunner


@attrs.define(eq=False)
class Timers:
    _heap: list[tuple[float, int, SessionRunner]] = attrs.field(factory=list)
    _order: count[int] = attrs.field(factory=count)
    _sleep: trio.CancelScope | None = None
    _stale: int = 0

    def schedule(self, runner: SessionRunner) -> None:
        """Make sure ``runner`` is woken at its session's next deadline."""
        deadline = runner.session.next_deadline()
        if deadline >= runner.due:
            return  # an entry at or before it is already waiting (or it has ended)
        if runner.due != math.inf:
            self._stale += 1
        runner.due = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), runner))
        if self._sleep is not None and deadline < self._sleep.deadline:
            self._sleep.deadline = deadline

    def forget(self, runner: SessionRunner) -> None:
        """The session has ended: its entry is stale, and no new one will be made."""
        if runner.due != math.inf:
            self._stale += 1
        runner.due = -math.inf
        heap = self._heap
        if self._stale > 64 and 2 * self._stale > len(heap):
            # Drop stale entries (and the runners they keep alive) in one pass.
            heap[:] = [entry for entry in heap if entry[0] == entry[2].due]
            heapq.heapify(heap)
            self._stale = 0

    async def run(self) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                deadline, _, runner = heapq.heappop(heap)
                if deadline != runner.due:
                    self._stale -= 1
                    continue  # stale: the runner has an earlier entry, or none is needed
                runner.due = math.inf
                runner.poll(now)
