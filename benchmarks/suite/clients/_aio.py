"""What the `websockets` (asyncio) load generators share: a log line, a connection as
they all open it, a session opened and closed, one JSON event read, and the voice
ramp's steps (``ramp``, ``failed``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sized
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._workload import FRAME_PERIOD_S, SESSION_CLOSE, SESSION_UPDATE

Event = dict[str, Any]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def dial(url: str, max_queue: int = 64) -> ClientConnection:
    return await connect(
        url,
        compression=None,
        max_size=None,
        ping_interval=None,  # the server pings; an idle client costs nothing on its own
        open_timeout=30,
        close_timeout=2,
        max_queue=max_queue,
    )


async def recv_event(ws: ClientConnection) -> Event:
    """The next JSON event, skipping protocol v2's flow reports (``input.consumed``)."""
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            raise RuntimeError("unexpected binary message")
        event: Event = json.loads(message)
        if event["type"] != "input.consumed":
            return event


async def open_session(ws: ClientConnection, update: str = SESSION_UPDATE) -> Event:
    await ws.send(update)
    created = await recv_event(ws)
    if created.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {created}")
    return created


async def close_session(ws: ClientConnection) -> None:
    """``session.close``, then its answer (binary audio still arriving is skipped), then
    the close; within 3 s, else the connection is aborted."""
    try:
        async with asyncio.timeout(3):
            await ws.send(SESSION_CLOSE)
            while True:
                message = await ws.recv()
                if isinstance(message, str) and json.loads(message).get("type") in (
                    "session.closed",
                    "error",
                ):
                    break
            await ws.close()
    except (TimeoutError, ConnectionClosed):
        ws.transport.abort()


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def first_due(epoch: float, phase: float, now: float) -> float:
    """A voice session's next frame time after ``now``: its ``phase`` in the 20 ms grid
    from ``epoch``, so that the sessions' frames do not all coincide."""
    ticks = math.ceil((now - epoch - phase) / FRAME_PERIOD_S) + 1
    return epoch + phase + ticks * FRAME_PERIOD_S


def failed(step: dict[str, Any], args: argparse.Namespace) -> bool:
    return bool(step["p99_ms"] > args.threshold_ms or step["dead"] or step["errors"])


async def ramp(
    args: argparse.Namespace,
    sessions: Sized,
    add_one: Callable[[], Awaitable[None]],
    measure: Callable[[int, str], Awaitable[dict[str, Any]]],
    *,
    name: str,
    confirm: bool = True,
) -> list[dict[str, Any]]:
    """The voice ramp: at each of ``--steps``' counts, ``add_one`` until ``sessions`` has
    that many (``open_s``: how long that took), settle, ``measure`` a window (its mark).
    Stops after the first failing step, or once ``--ramp-time`` is used up."""
    steps: list[dict[str, Any]] = []
    deadline = time.perf_counter() + args.ramp_time
    for n in [int(s) for s in args.steps.split(",")]:
        if time.perf_counter() > deadline:
            log(f"{name}: ramp time {args.ramp_time}s used up before {n} sessions")
            break
        t_open = time.perf_counter()
        await asyncio.gather(*(add_one() for _ in range(n - len(sessions))))
        open_s = time.perf_counter() - t_open
        await asyncio.sleep(args.settle)
        step = await measure(n, str(n))
        step["open_s"] = open_s
        if failed(step, args) and not (step["dead"] or step["errors"]) and confirm:
            # One noisy window must not end the ramp: measure the same N once more
            # (the same rule for every server), and keep the first window on record.
            await asyncio.sleep(args.settle)
            again = await measure(n, f"{n}_2")
            again["open_s"], again["first_window"] = open_s, step
            step = again
        steps.append(step)
        if failed(step, args):
            break
    return steps
