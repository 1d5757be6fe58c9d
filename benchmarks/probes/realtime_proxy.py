"""What the ``realtime-proxy`` engine costs.

    python -m benchmarks.realtime_proxy [--rounds 3] [--turns 300] [--sessions 8] [--seconds 5]

Processes: the fake OpenAI Realtime upstream (``trio_duplex.testing.realtime_upstream``,
unpaced: it answers as fast as it can) and the clients (this process, ``websockets``'
trio client) pinned to CPU 1; ``trio-duplex serve --engine realtime-proxy --upstream``
that fake, pinned to CPU 0, or with ``--one-cpu`` to CPU 1 as well: on a small VM, a
message that wakes an idle CPU can wait for it for milliseconds, which the proxy's extra
hop (CPU 1 → 0 → 1 each way) adds to the latency's tail; on one CPU the added latency is
the proxy's own work.

- Latency added per event: one client runs ``turns`` turns, each ``response.create`` then
  reading up to ``response.done`` (the upstream sends ``response.created``, one 20 ms
  audio delta, ``response.output_audio.done``, ``response.done``); the time from the send
  to ``response.created`` is a round trip client → upstream → client. Run against the
  upstream directly and through the proxy, in alternating order per round; the added
  latency is the proxy's p50 (p99) minus the direct one's, per round, and the table gives
  medians over rounds (min-max).
- Events per server CPU-second: ``sessions`` clients through the proxy, each looping a
  turn of five 20 ms ``input_audio_buffer.append`` (JSON, base64), a commit, a
  ``response.create``, and reading up to ``response.done`` (a response of 50 deltas of
  20 ms, 1 s of audio): every event that crossed the proxy, either way, over the proxy
  process's CPU time (user + system) in the window.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import time

import psutil
import trio
from websockets.trio.client import ClientConnection, connect

from benchmarks.suite._procs import PY, pinned, start_server, stop_all
from benchmarks.suite._stats import DASH, percentile

UPSTREAM = [PY, "-m", "trio_duplex.testing.realtime_upstream"]
_APPEND = json.dumps(
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(960)).decode()}
)
_COMMIT = json.dumps({"type": "input_audio_buffer.commit"})
_CREATE = json.dumps({"type": "response.create"})


async def _until(ws: ClientConnection, kind: str) -> int:
    """Read up to an event of ``kind``; returns how many events were read."""
    count = 0
    while True:
        count += 1
        if json.loads(await ws.recv())["type"] == kind:
            return count


async def _latencies(url: str, turns: int) -> list[float]:
    async with connect(url, compression=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {}}))
        samples = []
        for _ in range(turns + 20):  # the first 20: warm-up
            start = time.perf_counter()
            await ws.send(_CREATE)
            await _until(ws, "response.created")
            samples.append(time.perf_counter() - start)
            await _until(ws, "response.done")
        return samples[20:]


async def _throughput(url: str, sessions: int, seconds: float, proxy: psutil.Process) -> float:
    events = 0
    counting = False

    async def client() -> None:
        nonlocal events
        async with connect(url, compression=None, max_size=None) as ws:
            while True:
                for _ in range(5):
                    await ws.send(_APPEND)
                await ws.send(_COMMIT)
                await ws.send(_CREATE)
                read = await _until(ws, "response.done")
                if counting:
                    events += 7 + read

    async with trio.open_nursery() as nursery:
        for _ in range(sessions):
            nursery.start_soon(client)
        await trio.sleep(1.0)  # warm-up: sessions open, upstreams connected
        counting = True
        before = proxy.cpu_times()
        await trio.sleep(seconds)  # the measured window
        after = proxy.cpu_times()
        counted = events
        nursery.cancel_scope.cancel()
    cpu = (after.user - before.user) + (after.system - before.system)
    return counted / cpu


def _summary(values: list[float], unit: str, digits: int = 0) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} {unit} ({min(values):.{digits}f}{DASH}{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=300, help="latency samples per run")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="throughput window")
    parser.add_argument("--one-cpu", action="store_true", help="the proxy on CPU 1 too")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    try:
        added50, added99, direct50, proxied50, rates = [], [], [], [], []
        for round_ in range(args.rounds):
            for frames, measure in ((1, "latency"), (50, "throughput")):
                upstream, up_url = start_server(
                    "upstream", pinned([*UPSTREAM, "--frames", str(frames)], "1")
                )
                serve = [PY, "-m", "trio_duplex", "serve", "--port", "0",
                         "--engine", "realtime-proxy", "--upstream", up_url]  # fmt: skip
                proxy, url = start_server("proxy", pinned(serve, "1" if args.one_cpu else "0"))
                try:
                    if measure == "latency":
                        order = [up_url, url] if round_ % 2 == 0 else [url, up_url]
                        got = {u: trio.run(_latencies, u, args.turns) for u in order}
                        d, p = got[up_url], got[url]
                        direct50.append(percentile(d, 50) * 1e6)
                        proxied50.append(percentile(p, 50) * 1e6)
                        added50.append((percentile(p, 50) - percentile(d, 50)) * 1e6)
                        added99.append((percentile(p, 99) - percentile(d, 99)) * 1e6)
                    else:
                        rates.append(
                            trio.run(_throughput, url, args.sessions, args.seconds, proxy.ps)
                        )
                finally:
                    proxy.stop()
                    upstream.stop()
        cpus = "proxy, upstream and clients on CPU 1" if args.one_cpu else "proxy on CPU 0"
        print(f"realtime proxy, {args.rounds} rounds, {cpus}; medians (min{DASH}max)\n")
        print("| measure | value |")
        print("|---|---|")
        print(f"| round trip direct, p50 | {_summary(direct50, 'µs')} |")
        print(f"| round trip through the proxy, p50 | {_summary(proxied50, 'µs')} |")
        print(f"| added by the proxy, p50 | {_summary(added50, 'µs')} |")
        print(f"| added by the proxy, p99 | {_summary(added99, 'µs')} |")
        print(f"| events per proxy CPU-second ({args.sessions} sessions) | {_summary(rates, '')} |")
    finally:
        stop_all()


if __name__ == "__main__":
    main(sys.argv[1:])
