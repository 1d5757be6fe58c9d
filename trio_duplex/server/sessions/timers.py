"""One timer task for every deadline of the server: sessions' grace and idle TTL, and
connections' keepalive pings.

A sleeping task per session and per connection would cost a task, a nursery and cancel
scopes each. Instead each ``Timed`` item has at most one live entry in a heap. An entry
that has gone stale (the item ended, or its deadline moved) stays in the heap until it
comes up or a compaction drops it, but it no longer refers to its item: an ended
session's runner, and what it holds, are freed at once, not at its old deadline.
What a deadline means is the item's business (``fire``); this only wakes it on time.
"""

from __future__ import annotations

import heapq
import math
from itertools import count
from typing import Any, Protocol

import attrs
import trio


class Timed(Protocol):
    timer: Entry | None
    """Its live heap entry (None: none; ``FORGOTTEN``: it has ended). Only Timers sets it."""

    def next_deadline(self) -> float: ...

    def fire(self, now: float) -> None: ...


Entry = list[Any]
"""A heap entry: [deadline, order, item], the item None once the entry is stale. A list
(compared by deadline, then order) so that it can go stale in place."""

FORGOTTEN: Entry = [-math.inf, -1, None]
"""The ``timer`` of an item that has ended: it is never scheduled again."""


@attrs.define(eq=False)
class Timers:
    _heap: list[Entry] = attrs.field(factory=list)
    _order: count[int] = attrs.field(factory=count)
    _sleep: trio.CancelScope | None = None
    _stale: int = 0

    def schedule(self, item: Timed) -> None:
        """Make sure ``item`` is fired at its next deadline."""
        deadline = item.next_deadline()
        entry = item.timer
        if entry is not None:
            if entry is FORGOTTEN or deadline >= entry[0]:
                return  # an entry at or before it is already waiting (or it has ended)
            self._go_stale(entry)
        if deadline == math.inf:
            item.timer = None
            return
        item.timer = entry = [deadline, next(self._order), item]
        heapq.heappush(self._heap, entry)
        if self._sleep is not None and deadline < self._sleep.deadline:
            self._sleep.deadline = deadline

    def forget(self, item: Timed) -> None:
        """The item has ended: its entry goes stale, and no new one will be made."""
        if item.timer is not None and item.timer is not FORGOTTEN:
            self._go_stale(item.timer)
        item.timer = FORGOTTEN
        heap = self._heap
        if self._stale > 64 and 2 * self._stale > len(heap):
            heap[:] = [entry for entry in heap if entry[2] is not None]
            heapq.heapify(heap)
            self._stale = 0

    def _go_stale(self, entry: Entry) -> None:
        entry[2] = None  # the heap no longer keeps the item alive
        self._stale += 1

    async def run(self) -> None:
        heap = self._heap
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, item = heapq.heappop(heap)
                if item is None:
                    self._stale -= 1
                    continue
                item.timer = None
                item.fire(now)
