"""Part 2 of ``benchmarks.workers``, the split (``split``): how many sessions the kernel
gave each worker of ``--workers 2`` (counted in part 1's windows and in rounds of idle
sessions opened here), each round's deviation from an even share against what a fair coin
per connection gives, and the pooled share with its z score.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from benchmarks.probes.workers.procs import hurry, load_avg, niced, say, start_server
from benchmarks.probes.workers.tables import spread
from benchmarks.suite._procs import PY, BenchError, LoadMeter, run_to_result
from benchmarks.suite._stats import DASH

SPLIT_TARGET = 0.10
"""Part 2's target: each worker within ±10 % of an even share."""


def split_runs(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """``--split-rounds`` rounds of opening each of ``--split-sessions`` on one
    ``--workers 2`` server: how many each worker took."""
    meter = LoadMeter()
    workers = max(args.counts)
    server, url = start_server(workers, redis_url, args.server_nice)
    samples: list[dict[str, Any]] = []
    try:
        for r in range(args.split_rounds):
            for n in args.split_sessions:
                counts: list[int] = []
                readings: list[int] = []

                def on_mark(
                    mark: str,
                    n: int = n,
                    counts: list[int] = counts,
                    readings: list[int] = readings,
                ) -> None:
                    hurry(args)
                    if mark == "opened":
                        try:
                            got, tries = server.sessions_by_worker(n)
                        except BenchError:
                            return  # the main loop reports the server's death
                        counts.extend(got)
                        readings.append(tries)

                client = [
                    *(PY, "-m", "benchmarks.suite.clients.asyncio_ws", "idle", "--url", url),
                    # The sessions stay open for 2 s after the mark: the count is taken
                    # meanwhile, by a thread of this (ordinary-priority) process.
                    *("--proto", "duplex", "--count", str(n), "--settle", "2"),
                    *("--open-time-limit", "30", "--max-time", "60"),
                ]
                result = run_to_result(
                    "idle opens", niced(client, args.client_nice), on_mark=on_mark,
                    timeout=90, watch=server,
                )  # fmt: skip
                if not counts:
                    raise BenchError(f"split: no count at {n} sessions\n{server.tail()}")
                samples.append(
                    {"round": r, "sessions": result["count"], "wanted": n,
                     "sessions_by_worker": counts, "readings": readings[0],
                     "failures": result["failures"]}
                )  # fmt: skip
                say(f"split {n}: {counts} (opened {result['count']}), {load_avg()}")
    finally:
        server.stop(grace=10)
        background = meter.read()
    return {"workers": workers, "samples": samples, "background": background}


def deviation(counts: Sequence[int]) -> float:
    """The largest ``|count - N/W| / (N/W)``: 0 for an even split."""
    total = sum(counts)
    if not total:
        return math.nan
    even = total / len(counts)
    return max(abs(c - even) for c in counts) / even


def fair_within(n: int, bound: float) -> float:
    """How often N connections, each a fair coin between two workers, split within
    ``±bound`` of N/2 (exact binomial)."""
    lo, hi = math.ceil(n / 2 * (1 - bound) - 1e-9), math.floor(n / 2 * (1 + bound) + 1e-9)
    hits: int = sum(math.comb(n, k) for k in range(lo, hi + 1))
    return hits / (1 << n)


def report_split(
    cpu: dict[int, list[dict[str, Any]]], split: dict[str, Any] | None, workers: int
) -> dict[str, Any]:
    # (N, counts, whether its connections are counted in no other sample): a voice run's
    # windows count the same first sessions again, so only its last one is pooled.
    # A count that does not add up to the sessions open (the reading came too late, or a
    # session failed) is left out, and said.
    samples: list[tuple[int, list[int], bool]] = []
    incomplete = 0
    for run in cpu.get(workers, []):
        steps = [s for s in run["steps"] if "sessions_by_worker" in s and s["sessions"]]
        for i, step in enumerate(steps):
            if sum(step["sessions_by_worker"]) != step["sessions"]:
                incomplete += 1
                continue
            samples.append((step["sessions"], step["sessions_by_worker"], i == len(steps) - 1))
    for sample in (split or {}).get("samples", []):
        if sum(sample["sessions_by_worker"]) != sample["sessions"] or not sample["sessions"]:
            incomplete += 1
            continue
        samples.append((sample["sessions"], sample["sessions_by_worker"], True))
    if not samples:
        return {}
    print(f"### Sessions per worker, --workers {workers} (the kernel's SO_REUSEPORT hash)\n")
    print(
        "| sessions | rounds | sessions per worker, each round | largest deviation from "
        f"even: median (min{DASH}max) | rounds within ±10 % | a fair coin per connection: within "
        "±10 % |"
    )
    print("|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    by_n: dict[int, list[list[int]]] = {}
    for n, counts, _ in samples:
        by_n.setdefault(n, []).append(counts)
    for n in sorted(by_n):
        rounds = by_n[n]
        devs = [deviation(c) for c in rounds]
        within = sum(d <= SPLIT_TARGET + 1e-9 for d in devs)
        fair = f"{fair_within(n, SPLIT_TARGET):.0%}" if workers == 2 and n > 0 else DASH
        shown = ", ".join("/".join(map(str, c)) for c in rounds)
        print(
            f"| {n} | {len(rounds)} | {shown} | **{spread(devs, '.1%')}** "
            f"| {within}/{len(rounds)} | {fair} |"
        )
        summary[str(n)] = {"deviations": devs, "within": within, "rounds": len(rounds)}
    total = sum(sum(c) for _, c, alone in samples if alone)
    first = sum(c[0] for _, c, alone in samples if alone)
    z = (first - total / workers) / math.sqrt(total * (1 / workers) * (1 - 1 / workers))
    leaning = (
        "|z| < 2: no sign that the hash favours a worker"
        if abs(z) < 2
        else "|z| >= 2: worker 0 took more (or fewer) than a fair hash would give"
    )
    print(
        f"\nPooled (each connection once: every idle round, each voice run's last window): "
        f"worker 0 took {first:,} of {total:,} sessions ({first / total:.1%}; "
        f"an even share is {1 / workers:.1%}; z = {z:+.2f}, {leaning}). A fair coin per "
        "connection deviates by about 1/√N at W = 2: ±10 % holds for 95 % of rounds only "
        "from about 400 sessions on."
        + (f" {incomplete} count(s) that did not add up were left out." if incomplete else "")
        + "\n"
    )
    summary["pooled"] = {"worker0": first, "total": total, "z": z, "left_out": incomplete}
    return summary
