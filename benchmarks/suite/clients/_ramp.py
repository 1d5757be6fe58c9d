"""The ramp the load generators of scenarios 9 and 10 share (``calls.py``,
``telephony.py``): one schedule for every process of a run (``--epoch``, ``--open``,
``--settle``, ``--windows`` x ``--measure``, ``--share I/N``), so that the orchestrator
samples the server at the same edges; each step opens this share's part of N (a few at a
time, within the step's opening window) and says what it held.

What a step measures in its windows is each generator's own.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

OPEN_CONCURRENCY: Final = 6
"""Legs opening at once, per process."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def my_count(n: int, index: int, shares: int) -> int:
    """This share's part of ``n``: the shares differ by at most one and add up to n."""
    return (n + shares - 1 - index) // shares


class RampLeg(Protocol):
    """One call or session of a ramp."""

    dead: bool

    async def open(self) -> None: ...

    async def stop(self) -> None: ...


class Ramp:
    """The schedule of one load-generator process and the legs it holds."""

    def __init__(self, args: argparse.Namespace, make: Callable[[], RampLeg]) -> None:
        self.args = args
        self.make = make
        self.index, self.shares = (int(x) for x in args.share.split("/"))
        self.period = args.open + args.settle + args.windows * args.measure
        self.loop = asyncio.get_running_loop()
        self.offset = time.monotonic() - self.loop.time()  # (time.monotonic here)
        self.held: list[Any] = []
        self.failures: collections.Counter[str] = collections.Counter()
        self._limit = asyncio.Semaphore(OPEN_CONCURRENCY)
        self.label = f"{args.kind} {args.share}"

    def steps(self) -> list[int]:
        return [int(s) for s in self.args.steps.split(",")]

    def start_of(self, j: int) -> float:
        return float(self.args.epoch + j * self.period)

    def window_start(self, j: int, w: int) -> float:
        """When step ``j``'s ``w``-th measured window begins."""
        args = self.args
        return self.start_of(j) + float(args.open + args.settle + w * args.measure)

    def mine(self, n: int) -> int:
        return my_count(n, self.index, self.shares)

    async def until(self, t: float) -> None:
        delay = t - self.offset - self.loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def begin(self, j: int, n: int) -> float | None:
        """At step ``j``'s start, open legs up to this share's part of ``n`` within its
        opening window: the seconds it took, or None if the step's start was missed (the
        ramp ends)."""
        start = self.start_of(j)
        if time.monotonic() > start + self.args.open:
            log(f"{self.label}: step {n} missed its start; ramp ends")
            return None
        await self.until(start)
        want = self.mine(n) - len(self.held)
        t0 = time.monotonic()
        adding = asyncio.gather(*(self._add() for _ in range(max(0, want))))
        try:
            async with asyncio.timeout(max(0.1, start + self.args.open - time.monotonic())):
                await adding
        except TimeoutError:
            log(f"{self.label}: opening for step {n} ran past its window")
        return time.monotonic() - t0

    async def _add(self) -> None:
        one = self.make()
        async with self._limit:
            try:
                await one.open()
            except Exception as exc:
                self.failures[type(exc).__name__] += 1
                log(f"{self.label}: one failed to open: {exc!r}"[:300])
                await one.stop()
                return
        self.held.append(one)

    def step(self, n: int, open_s: float, windows: list[dict[str, Any]]) -> dict[str, Any]:
        """The step's record (what the orchestrator merges across shares)."""
        return {
            "sessions": n,
            "mine": self.mine(n),
            "held": len(self.held),
            "dead": sum(one.dead for one in self.held),
            "open_s": round(open_s, 3),
            "failures": dict(self.failures),
            "windows": windows,
        }

    def too_few(self, n: int) -> bool:
        """Fewer than half of this share's part of step ``n`` opened: the ramp ends."""
        if len(self.held) < self.mine(n) // 2:
            log(f"{self.label}: fewer than half of step {n} opened; ramp ends")
            return True
        return False

    async def stop(self) -> None:
        await asyncio.gather(*(one.stop() for one in self.held), return_exceptions=True)
