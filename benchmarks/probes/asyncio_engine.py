"""The per-event cost of an asyncio engine: the same echo, written for trio
and for asyncio (``AioEcho``, through trio_duplex.engines.aio), each served by
``trio-duplex serve``; clients (threads of the websockets sync client) send text events
one round trip at a time. Reports events per server CPU-second and the round trip's
p50/p99 for each, and the ratios.

    python -m benchmarks.asyncio_engine [--events 4000] [--clients 4] [--loops 500]

First, what one asyncio loop per session costs (``loop_cost``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import psutil
from websockets.sync.client import connect

from benchmarks.suite._procs import PY, install_reaper, start_server
from trio_duplex.engines.aio import AsyncioEngine
from trio_duplex.engines.api import EngineSession


class AioEcho(AsyncioEngine):
    """``echo``'s text path, in asyncio: the same loop, the same sends."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Any) -> None:
        self.config = config

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            await session.send({"type": "response.output_text.delta", "text": event["text"]})


ENGINES = {"trio": "echo", "asyncio": "benchmarks.probes.asyncio_engine:AioEcho"}


def _client(url: str, events: int, rtts: list[float]) -> None:
    with connect(url, open_timeout=10, ping_interval=None) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        json.loads(ws.recv(timeout=10))
        message = json.dumps({"type": "input.text.append", "text": "x" * 64})
        for _ in range(events):
            start = time.perf_counter()
            ws.send(message)
            ws.recv(timeout=10)
            rtts.append(time.perf_counter() - start)


def measure(engine: str, events: int, clients: int) -> dict[str, float]:
    proc, url = start_server(engine, [PY, "-m", "trio_duplex", "serve", "--engine", engine])
    try:
        server = psutil.Process(proc.popen.pid)
        _client(url, 200, [])  # warm up
        cpu = server.cpu_times()
        before = cpu.user + cpu.system
        rtts: list[list[float]] = [[] for _ in range(clients)]
        threads = [
            threading.Thread(target=_client, args=(url, events, rtts[i])) for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu = server.cpu_times()
        used = cpu.user + cpu.system - before
    finally:
        proc.stop()
    every = sorted(rtt for one in rtts for rtt in one)
    quantiles = statistics.quantiles(every, n=100)
    return {
        "events_per_cpu_s": len(every) / used,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
    }


def loop_cost(loops: int) -> dict[str, float]:
    """What one asyncio loop per session costs: ``loops`` session loops (the bridge's
    ``_Loop``, each running a main task until told to stop) open at once, each in its own
    trio task (as each session's engine runs one): the time to open and close each, and
    the memory each holds while open."""
    import asyncio
    import tracemalloc

    import trio

    from trio_duplex.engines.aio import _Loop

    async def run() -> dict[str, float]:
        opened = trio.Event()
        stops: list[asyncio.Event] = []

        async def main(stop: asyncio.Event) -> None:
            if len(stops) == loops:
                opened.set()
            await stop.wait()

        async def one() -> None:
            stop = asyncio.Event()
            stops.append(stop)
            await _Loop().run_main(main(stop))

        tracemalloc.start()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(loops):
                nursery.start_soon(one)
            await opened.wait()
            opening = time.perf_counter() - start
            held = tracemalloc.get_traced_memory()[0]
            start = time.perf_counter()
            for stop in stops:
                stop.set()
        closing = time.perf_counter() - start
        tracemalloc.stop()
        return {
            "open_us": opening / loops * 1e6,
            "close_us": closing / loops * 1e6,
            "kib_each": held / loops / 1024,
        }

    return trio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000, help="round trips per client")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--loops", type=int, default=500, help="loops open at once")
    args = parser.parse_args()
    install_reaper()
    cost = loop_cost(args.loops)
    print(
        f"{args.loops} asyncio loops open at once: {cost['open_us']:.0f} us to open and "
        f"{cost['close_us']:.0f} us to close each, {cost['kib_each']:.1f} KiB each"
    )
    results = {name: measure(spec, args.events, args.clients) for name, spec in ENGINES.items()}
    for name, result in results.items():
        print(
            f"{name:8} {result['events_per_cpu_s']:9.0f} events/CPU-s  "
            f"p50 {result['p50_ms']:.3f} ms  p99 {result['p99_ms']:.3f} ms"
        )
    trio_r, aio_r = results["trio"], results["asyncio"]
    print(
        f"asyncio/trio: {aio_r['events_per_cpu_s'] / trio_r['events_per_cpu_s']:.2f}x events "
        f"per CPU-s, p50 {aio_r['p50_ms'] / trio_r['p50_ms']:.2f}x, "
        f"p99 {aio_r['p99_ms'] / trio_r['p99_ms']:.2f}x"
    )


if __name__ == "__main__":
    main()
