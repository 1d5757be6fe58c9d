"""trio_duplex.server.sessions.timers: the one timer task, and what its heap keeps alive."""

from __future__ import annotations

import gc
import math
import weakref

import trio
from trio.testing import MockClock

from trio_duplex.server.sessions.timers import Entry, Timers


class Item:
    def __init__(self, deadline: float) -> None:
        self.timer: Entry | None = None
        self.deadline = deadline
        self.fired: list[float] = []

    def next_deadline(self) -> float:
        return self.deadline

    def fire(self, now: float) -> None:
        self.fired.append(now)


def test_a_forgotten_item_is_freed_at_once_not_at_its_deadline() -> None:
    # Was: the heap entry kept an ended session's runner (its connection, its outbox:
    # hundreds of MB for a client that did not read) alive until the old idle deadline.
    timers = Timers()
    item = Item(300.0)
    timers.schedule(item)
    gone = weakref.ref(item)
    timers.forget(item)
    gc.disable()  # freed by its reference count alone, not by a collection
    try:
        del item
        assert gone() is None
    finally:
        gc.enable()


def test_a_moved_deadline_leaves_no_reference_in_the_stale_entry() -> None:
    timers = Timers()
    item = Item(300.0)
    timers.schedule(item)
    first = item.timer
    item.deadline = 10.0
    timers.schedule(item)
    assert first is not None and first[2] is None and item.timer is not first


async def test_deadlines_fire_in_order_and_forgotten_ones_never(autojump_clock: MockClock) -> None:
    timers = Timers()
    early, late, dropped = Item(1.0), Item(2.0), Item(1.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        for item in (late, dropped, early):
            timers.schedule(item)
        timers.forget(dropped)
        timers.schedule(dropped)  # an ended item is never scheduled again
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert (early.fired, late.fired, dropped.fired) == ([1.0], [2.0], [])
    assert early.timer is None and dropped.timer is not None and dropped.timer[0] == -math.inf
