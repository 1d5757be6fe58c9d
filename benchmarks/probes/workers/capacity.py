"""Part 3 of ``benchmarks.workers``, capacity with cores (``capacity``): scenario 3's ramp
against each configuration, its workers and the load generator on cores of their own; and
where the machine has too few cores for that, the extrapolation from one worker's sessions
per core, the CPU ratio of part 1 or 1b and the split.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from benchmarks.probes.workers.procs import hurry, load_avg, say, start_server, voice_client
from benchmarks.probes.workers.tables import THRESHOLD_MS, mid, spread
from benchmarks.suite._procs import BenchError, LoadMeter, run_to_result
from benchmarks.suite._stats import TIMES, largest_passing


def cores_for(workers: int, cores: int) -> tuple[list[int], list[int]]:
    """The server's cores and the load generator's: the load generator keeps at least one
    core of its own; the workers get as many of the rest as they number."""
    server = list(range(max(1, min(workers, cores - 1))))
    return server, [c for c in range(cores) if c not in server] or [0]


def ramp(
    workers: int, steps: list[int], args: argparse.Namespace, redis_url: str
) -> dict[str, Any]:
    meter = LoadMeter()
    server_cpus, client_cpus = cores_for(workers, args.cores)
    server, url = start_server(workers, redis_url, args.server_nice, server_cpus)
    try:
        flags = [
            *("--settle", str(args.ramp_settle), "--measure", str(args.ramp_measure)),
            *("--threshold-ms", str(THRESHOLD_MS), "--ramp-time", str(args.ramp_time)),
            *("--max-time", str(args.ramp_time + 60)),
        ]
        marks: dict[str, dict[str, float]] = {}

        def on_mark(mark: str) -> None:
            hurry(args)
            try:
                marks[mark] = server.snapshot()
            except BenchError:
                pass  # the server died: run_to_result reports it

        result = run_to_result(
            "voice load",
            voice_client(url, steps, args, flags, client_cpus),
            on_mark=on_mark,
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
    result.update(workers=workers, server_cpus=server_cpus, client_cpus=client_cpus)
    last = result["steps"][-1] if result["steps"] else {}
    say(
        f"capacity --workers {workers} on cores {server_cpus} (load generator {client_cpus}): "
        f"{result['largest']} sessions held (stopped at {last.get('sessions')}: p99 "
        f"{last.get('p99_ms', math.nan):.1f} ms, server "
        f"{last.get('server_cpu_util', math.nan):.0%} of a core, load generator "
        f"{last.get('client_cpu_util', math.nan):.0%}, its sends late by "
        f"{last.get('lateness_p99_ms', math.nan):.1f} ms at p99; other processes "
        f"{background['other_share']:.0%}, {load_avg()})"
    )
    return result


def report_capacity(
    caps: dict[int, list[dict[str, Any]]], counts: list[int], ratio: float, args: argparse.Namespace
) -> dict[str, Any]:
    one, two = counts[0], counts[-1]
    print("### Capacity with cores (load generator and redis-server pinned to their own core)\n")
    print(
        "| --workers | server cores | load generator's | voice sessions held at p99 ≤ 20 ms "
        "| at the stop: server CPU, load generator CPU | load avg |"
    )
    print("|---|---|---|---|---|---|")
    held: dict[int, list[int]] = {}
    for w in counts:
        runs = caps.get(w, [])
        if not runs:
            continue
        # The fine ramps decide; one that failed at its first step (the machine got busier)
        # found nothing and is dropped; if every one did, the coarse ramp's figure stands.
        deciding = [r for r in runs[1:] if r["largest"]] or runs[:1]
        held[w] = [r["largest"] for r in deciding if r["largest"]]
        stops = [r["steps"][-1] for r in deciding if r["steps"]]
        srv = [s.get("server_cpu_util", math.nan) for s in stops]
        cli = [s.get("client_cpu_util", math.nan) for s in stops]
        loads = [r["background"]["loadavg_1m"] for r in runs]
        print(
            f"| {w} | {','.join(map(str, runs[0]['server_cpus']))} "
            f"| {','.join(map(str, runs[0]['client_cpus']))} "
            f"| **{spread([float(h) for h in held[w]], '.0f')}** "
            f"| {mid(srv):.0%}, {mid(cli):.0%} | {spread(loads, '.2f')} |"
        )
    summary: dict[str, Any] = {"held": {str(w): h for w, h in held.items()}}
    s1, s2 = cores_for(one, args.cores)[0], cores_for(two, args.cores)[0]
    if not (held.get(one) and held.get(two)):
        print(
            f"\n--workers {two} on {len(s2)} core(s) over --workers {one} on {len(s1)}: not "
            "measured (a ramp held none of its steps)\n"
        )
        return summary
    c1, c2 = mid(held[one]), mid(held[two])
    print(
        f"\n--workers {two} on {len(s2)} core(s) over --workers {one} on {len(s1)}: "
        f"**{c2 / c1:.2f}{TIMES}** (measured)"
    )
    summary["measured_ratio"] = c2 / c1
    others = mid([r["background"]["other_share"] for w in counts for r in caps.get(w, [])])
    if others > 0.2:
        print(
            f"Other processes took {others:.0%} of the machine during the ramps: where they "
            "share the servers' core, the scheduler gives two workers two shares of it and "
            "one worker one, so these figures say more about the machine than the servers "
            "(run them on a quiet machine)."
        )
    if len(s2) < two:
        # The machine cannot give each worker a core of its own beside the load generator:
        # extrapolate from one worker's sessions per core, the CPU ratio and the split.
        per_core = c1 / len(s1)
        # Never below 1: a worker doing one worker's job on its own core is not expected
        # to beat --workers 1 (a figure below 1 is noise or batching).
        r = max(1.0, ratio) if not math.isnan(ratio) else 1.0
        clamped = "" if math.isnan(ratio) or ratio >= 1 else f", {ratio:.3f} taken as 1"
        n = two * per_core / r
        for _ in range(20):  # the busiest worker, at a split 2 sigma off even (W = 2)
            n = two * per_core / r / (1 + 2 * math.sqrt((two - 1) / n))
        print(
            f"Extrapolation (not measured: this machine has {args.cores} cores and the load "
            f"generator needs one): --workers {two} on {two} cores, load from elsewhere, holds "
            f"about {two} {TIMES} {per_core:.0f} / {r:.3f} (the CPU ratio, {args.ratio_source}"
            f"{clamped}) = {two * per_core / r:.0f} sessions with an even split"
            f", or **{n:.0f}** if the busiest worker takes a 2-sigma share of "
            f"the kernel's hash (≈ {2 * math.sqrt((two - 1) / n):.0%} over even at that N): "
            f"{n / c1:.2f}{TIMES} --workers {one}. Capacity scales with the workers, one core "
            "each, as long as each has a core (a worker is one thread; --workers 1 cannot use "
            "a second core) and the cluster store keeps up.\n"
        )
        summary["extrapolated"] = {"sessions": n, "even_split": two * per_core / r}
    else:
        print()
    return summary
