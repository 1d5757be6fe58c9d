"""Voice sessions held at p99 ≤ 20 ms with ``serve --workers 2`` against ``--workers 1``
(docs/cluster.md, "Worker processes"), both in cluster mode against a local redis-server
started here.

    python -m benchmarks.workers [--workers 1,2] [--rounds 1] [--client-nice 10]
                                 [--server-nice -10] [--lane binary] [--quick]

Scenario 3's method and load generator (``benchmarks.suite.clients.asyncio_ws voice``): N
sessions each send a 20 ms audio frame every 20 ms (protocol v2's binary lane by
default) to the echo engine and time each echo; a ramp adds sessions step by step and the
answer is the largest N whose p99 (frames still unanswered counted with their age) held
at or below 20 ms, with no session lost and no error. One coarse ramp per server, then
``--rounds`` fine ramps (factor 1.07) from 70 % of what the coarse one found, the servers
alternating (1, 2, then 2, 1, ...).

The cores. Scenario 3 pins the server to one core and the load generator to the other;
here the server must have both cores (that is the point of two workers), so nothing is
pinned, and the load generator (one process) shares the machine with the server. So
that it takes what the server leaves rather than the reverse, it runs at a lower
priority than the servers (as root: servers at ``--server-nice -10``, the load generator
at ``--client-nice -5``, both ahead of anything else on the machine; otherwise 0 and 5).
Each ramp also records what other processes took of the machine meanwhile (/proc/stat).
Its own delay still counts in the latency it measures: each step records
its CPU use and how late its sends were (``lateness_p99_ms``), and the report says how busy
it was at the step where the ramp stopped. Both servers are measured the same way; but
the load generator itself needs most of a core at 100+ sessions, so on a 2-core machine
there is about one core of room for the server whatever the number of workers (see
docs/benchmarks.md, "Worker processes"): two workers can only show their worth with
more cores than the load generator takes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.suite._plan import geometric_steps
from benchmarks.suite._procs import (
    PY,
    ROOT,
    BenchError,
    LoadMeter,
    Proc,
    free_port,
    install_reaper,
    machine_info,
    redis,
    run_client,
)
from benchmarks.suite._stats import DASH, TIMES, largest_passing
from benchmarks.suite._suite import duplex_flags

SECRET = "benchmark-cluster-secret-0123456789"
SERVING = re.compile(r"serving (ws://\S+)")
THRESHOLD_MS = 20.0


class Tree(Proc):
    """A server process whose CPU counts its children's: the supervisor and its workers."""

    def snapshot(self) -> dict[str, float]:
        try:
            family = [self.ps, *self.ps.children(recursive=True)]
            cpu = rss = 0.0
            for proc in family:
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    rss += proc.memory_info().rss
        except psutil.Error as exc:
            raise BenchError(f"{self.name} is gone: {exc}\n{self.tail()}") from None
        return {"t": time.monotonic(), "cpu": cpu, "rss": rss}


def _niced(argv: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *argv] if nice else argv


def start_server(workers: int, redis_url: str, nice: int) -> tuple[Tree, str]:
    port = free_port()
    argv = [
        *(PY, "-m", "trio_duplex", "serve", *duplex_flags(port)),
        *("--workers", str(workers), "--cluster", redis_url, "--cluster-secret", SECRET),
    ]
    proc = Tree(f"serve --workers {workers}", _niced(argv, nice))
    deadline = time.monotonic() + 30
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.stop()
            raise BenchError(f"{proc.name} did not report ready\n{proc.tail()}")
        try:
            line = proc.lines.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if line is None:
            proc.stop()
            raise BenchError(f"{proc.name} exited before ready\n{proc.tail()}")
        match = SERVING.search(line)
        if match:
            return proc, match.group(1)


def ramp(
    workers: int, steps: list[int], args: argparse.Namespace, redis_url: str
) -> dict[str, Any]:
    meter = LoadMeter()
    server, url = start_server(workers, redis_url, args.server_nice)
    try:
        client = [
            *(PY, "-m", "benchmarks.suite.clients.asyncio_ws", "voice", "--url", url),
            *("--proto", "duplex", "--lane", args.lane, "--steps", ",".join(map(str, steps))),
            *("--settle", str(args.settle), "--measure", str(args.measure)),
            *("--threshold-ms", str(THRESHOLD_MS), "--ramp-time", str(args.ramp_time)),
            *("--ack-every", "50", "--max-time", str(args.ramp_time + 60)),
        ]
        result, marks = run_client(
            "voice load",
            _niced(client, args.client_nice),
            watch=server,
            timeout=args.ramp_time + 90,
        )
    finally:
        server.stop(grace=10)
        background = meter.read()
    result["background"] = background
    for step in result["steps"]:
        mark = step.get("mark", step["sessions"])
        a, b = marks.get(f"start_{mark}"), marks.get(f"end_{mark}")
        if a and b:
            step["server_cpu_util"] = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"])
    passing = [(s["sessions"], s["p99_ms"] if not (s["dead"] or s["errors"]) else float("inf"))
               for s in result["steps"]]  # fmt: skip
    result["largest"] = largest_passing(passing, THRESHOLD_MS)
    result["workers"] = workers
    last = result["steps"][-1] if result["steps"] else {}
    print(
        f"--workers {workers}: {result['largest']} sessions held (stopped at "
        f"{last.get('sessions')}: p99 {last.get('p99_ms', float('nan')):.1f} ms, server "
        f"{last.get('server_cpu_util', float('nan')):.0%} of a core, load generator "
        f"{last.get('client_cpu_util', float('nan')):.0%}, its sends late by "
        f"{last.get('lateness_p99_ms', float('nan')):.1f} ms at p99; other processes "
        f"{background['other_share']:.0%} of the machine, steal {background['steal_share']:.0%})",
        file=sys.stderr,
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="the --workers values to compare")
    parser.add_argument("--rounds", type=int, default=1, help="fine ramps per server")
    parser.add_argument("--lane", choices=["binary", "json"], default="binary")
    root = os.geteuid() == 0
    parser.add_argument(
        "--server-nice", type=int, default=-10 if root else 0, help="(negative needs root)"
    )
    parser.add_argument(
        "--client-nice", type=int, default=-5 if root else 5,
        help="the load generator's: above the servers' (lower priority), below the rest "
        "of the machine's (default -5 as root, else 5)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="coarse ramps only, shorter steps")
    parser.add_argument("--start", type=int, default=10, help="sessions at the coarse ramp's start")
    parser.add_argument("--max-sessions", type=int, default=2000, help="the ramps' last step")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.settle, args.measure, args.ramp_time = (0.5, 1.0, 30.0) if args.quick else (0.6, 1.5, 45.0)
    rounds = 0 if args.quick else args.rounds
    counts = [int(w) for w in args.workers.split(",")]
    install_reaper()
    started = datetime.datetime.now(datetime.UTC)
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in counts}
    with redis() as (_, redis_url):
        coarse = geometric_steps(min(args.start, args.max_sessions), 1.25, args.max_sessions)
        for w in counts:
            runs[w].append({"phase": "coarse", **ramp(w, coarse, args, redis_url)})
        for i in range(rounds):
            order = counts if i % 2 else counts[::-1]
            for w in order:
                found = runs[w][0]["largest"] or args.start
                start = min(max(1, int(found * 0.7)), args.max_sessions)
                fine = geometric_steps(start, 1.07, args.max_sessions)
                runs[w].append({"phase": "fine", **ramp(w, fine, args, redis_url)})
    # With fine ramps, they decide; the coarse one only located the knee.
    # A ramp that failed at its first step found nothing (it is not "0"): dropped, as in
    # scenario 3, and said.
    best: dict[int, list[int]] = {}
    for w, rs in runs.items():
        deciding = rs[1:] if len(rs) > 1 else rs
        best[w] = [r["largest"] for r in deciding if r["largest"]]
        if len(best[w]) < len(deciding):
            print(
                f"--workers {w}: {len(deciding) - len(best[w])} ramp(s) failed at their first "
                "step; dropped",
                file=sys.stderr,
            )
    print("| --workers | voice sessions at p99 ≤ 20 ms | ramps |")
    print("|---|---|---|")
    for w in counts:
        values = best[w]
        if not values:
            print(f"| {w} | none | 0 |")
            continue
        shown = f"{sorted(values)[len(values) // 2]}" + (
            f" ({min(values)}{DASH}{max(values)})" if len(values) > 1 else ""
        )
        print(f"| {w} | {shown} | {len(values)} |")
    if len(counts) == 2 and best[counts[0]] and best[counts[1]]:
        a = sorted(best[counts[0]])[len(best[counts[0]]) // 2]
        b = sorted(best[counts[1]])[len(best[counts[1]]) // 2]
        print(f"\n--workers {counts[1]} over --workers {counts[0]}: {b / a:.2f}{TIMES}")
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"workers-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["python -m benchmarks.workers", *(argv or sys.argv[1:])]),
        "started": started.isoformat(),
        "machine": machine_info(),
        "client_nice": args.client_nice,
        "server_nice": args.server_nice,
        "lane": args.lane,
        "runs": {str(w): rs for w, rs in runs.items()},
    }
    out.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    print(f"\nraw figures: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
