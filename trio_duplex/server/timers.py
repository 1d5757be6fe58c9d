"""One timer task for every deadline of the server: sessions' grace and idle TTL, and
connections' keepalive pings.

A sleeping task per session and per connection would cost a task, a nursery and cancel
scopes each. Instead each ``Timed`` item has at most one live entry in a heap; an entry
that has gone stale (the item ended, or its deadline moved) is skipped when it comes up.
What a deadline means is the item's business (``fire``); this only wakes it on time.
"""

from __future__ import annotations

import heapq
import math
from itertools import count
from typing import Protocol

import attrs
import trio


class Timed(Protocol):
    due: float
    """The deadline of this item's live heap entry (inf: none; -inf: forgotten)."""

    def next_deadline(self) -> float: ...

    def fire(self, now: float) -> None: ...


@attrs.define(eq=False)
class Timers:
    _heap: list[tuple[float, int, Timed]] = attrs.field(factory=list)
    _order: count[int] = attrs.field(factory=count)
    _sleep: trio.CancelScope | None = None
    _stale: int = 0

    def schedule(self, item: Timed) -> None:
        """Make sure ``item`` is fired at its next deadline."""
        deadline = item.next_deadline()
        if deadline >= item.due:
            return  # an entry at or before it is already waiting (or it has ended)
        if item.due != math.inf:
            self._stale += 1
        item.due = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), item))
        if self._sleep is not None and deadline < self._sleep.deadline:
            self._sleep.deadline = deadline

    def forget(self, item: Timed) -> None:
        """The item has ended: its entry is stale, and no new one will be made."""
        if item.due != math.inf:
            self._stale += 1
        item.due = -math.inf
        heap = self._heap
        if self._stale > 64 and 2 * self._stale > len(heap):
            # Drop stale entries (and the items they keep alive) in one pass.
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
                deadline, _, item = heapq.heappop(heap)
                if deadline != item.due:
                    self._stale -= 1
                    continue  # stale: the item has an earlier entry, or none is needed
                item.due = math.inf
                item.fire(now)
