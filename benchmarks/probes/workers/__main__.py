"""``python -m benchmarks.workers`` (``benchmarks/probes/workers/``, its parts described
there): the command line, the rounds of each part against one redis-server, the tables of
them all, and the JSON record (``--report`` prints the tables of an earlier one again).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import workers as package
from benchmarks.probes.workers.capacity import cores_for, ramp, report_capacity
from benchmarks.probes.workers.cpu import cpu_run, report_cpu
from benchmarks.probes.workers.own import own_steps, report_own
from benchmarks.probes.workers.procs import load_avg, say
from benchmarks.probes.workers.split import report_split, split_runs
from benchmarks.probes.workers.tables import mid
from benchmarks.suite._plan import geometric_steps
from benchmarks.suite._procs import ROOT, install_reaper, machine_info, redis


def report(
    args: argparse.Namespace,
    parts: set[str],
    cpu: dict[int, list[dict[str, Any]]],
    split: dict[str, Any] | None,
    caps: dict[int, list[dict[str, Any]]],
    own: dict[int, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Print the parts' tables; their figures, for the record."""
    two = args.counts[1]
    summary: dict[str, Any] = {}
    ratio = math.nan
    args.ratio_source = "not measured below the knee: 1 assumed"
    if "cpu" in parts:
        summary["cpu"] = report_cpu(cpu, args.counts)
        largest = str(max(args.sessions))
        # Capacity is each worker at its knee: the same-load-per-worker ratio (the largest
        # measured) says what a worker per core costs; else the same-total one.
        # Only rounds below the knee (past it, a starved worker's cost per frame falls).
        per_worker = [k for k in summary["cpu"] if k.startswith("per_worker_")]
        per_worker = [k for k in per_worker if summary["cpu"][k]["held"]]
        at_largest = summary["cpu"].get(largest, {})
        if per_worker:
            best = max(per_worker, key=lambda k: int(k.removeprefix("per_worker_")))
            ratio = mid(summary["cpu"][best]["held"])
            args.ratio_source = f"the same sessions per worker, {best.removeprefix('per_worker_')}"
        elif at_largest.get("held"):
            ratio = mid(at_largest["held"])
            args.ratio_source = f"the same sessions in all, {largest}"
    if "own" in parts:
        summary["own"] = report_own(own, args.counts)
        held = [k for k, v in summary["own"].items() if v["held"]]
        if held:  # the figure that decides capacity: a worker on a core of its own
            best = max(held, key=int)
            ratio = mid(summary["own"][best]["held"])
            args.ratio_source = f"a worker on a core of its own, {best} sessions per worker"
    if parts & {"cpu", "own", "split"}:
        merged = {w: cpu.get(w, []) + own.get(w, []) for w in args.counts}
        summary["split"] = report_split(merged, split, two)
    if "capacity" in parts:
        summary["capacity"] = report_capacity(caps, args.counts, ratio, args)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.workers", description=(package.__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--workers", default="1,2", help="the two --workers values to compare")
    parser.add_argument("--parts", default="cpu,own,split,capacity")
    parser.add_argument(
        "--own-sessions", default="30,45",
        help="part 1b's sessions per worker: a worker on a core of its own (own)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="part 1's interleaved rounds")
    parser.add_argument(
        "--sessions", default="0,30,60,90", help="part 1's fixed loads (0: the workers idle)"
    )
    parser.add_argument("--measure", type=float, default=2.5, help="part 1's window, seconds")
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--split-sessions", default="100,400,1000")
    parser.add_argument("--split-rounds", type=int, default=2)
    parser.add_argument("--capacity-rounds", type=int, default=1, help="fine ramps per server")
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
    parser.add_argument(
        "--realtime", action="store_true",
        help="part 1 (cpu) only: servers and load generator under SCHED_FIFO (priorities 20 "
        "and 10; root), ahead of everything else on a shared machine, so that its other work "
        "does not starve the loops into batching (the kernel still leaves it 5 %% of each "
        "second; the ramps never run so: a real-time server at 100 %% would starve its "
        "core's kernel threads)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="one round, small splits, coarse ramps only"
    )
    parser.add_argument("--start", type=int, default=30, help="sessions at the coarse ramp's start")
    parser.add_argument("--max-sessions", type=int, default=2000, help="the ramps' last step")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="print the tables of an earlier run's record"
    )
    args = parser.parse_args(argv)
    args.counts = [int(w) for w in args.workers.split(",")]
    args.server_rt, args.client_rt = (20, 10) if args.realtime else (0, 0)
    if len(args.counts) != 2 or args.counts[0] >= args.counts[1]:
        parser.error("--workers: two values, the smaller first (1,2)")
    parts = set(args.parts.split(","))
    if args.quick:
        args.rounds, args.split_rounds, args.capacity_rounds = 1, 1, 0
        args.measure = min(args.measure, 1.5)
    args.sessions = [int(n) for n in args.sessions.split(",")]
    args.own_sessions = [int(n) for n in args.own_sessions.split(",")]
    args.split_sessions = [int(n) for n in args.split_sessions.split(",")]
    args.cpu_timeout = len(args.sessions) * (args.settle + args.measure + 20) + 30
    args.ramp_settle, args.ramp_measure, args.ramp_time = (
        (0.5, 1.0, 30.0) if args.quick else (0.6, 1.5, 45.0)
    )
    if args.report is not None:
        return report_again(args)
    install_reaper()
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    two = args.counts[1]
    cpu: dict[int, list[dict[str, Any]]] = {w: [] for w in args.counts}
    caps: dict[int, list[dict[str, Any]]] = {w: [] for w in args.counts}
    own: dict[int, list[dict[str, Any]]] = {w: [] for w in args.counts}
    split: dict[str, Any] | None = None
    say(f"benchmarks.workers: {args.cores} cores, {load_avg()} at the start")
    with redis() as (redis_proc, redis_url):
        if "cpu" in parts:
            for i in range(args.rounds):
                for w in args.counts if i % 2 == 0 else args.counts[::-1]:
                    cpu[w].append(cpu_run(w, args, redis_proc, redis_url))
        if "own" in parts:
            redis_proc.ps.cpu_affinity(list(range(1, args.cores)) or [0])  # off core 0
            for i in range(args.rounds):
                for w in args.counts if i % 2 == 0 else args.counts[::-1]:
                    steps = own_steps(args.own_sessions, w)
                    own[w].append(cpu_run(w, args, redis_proc, redis_url, steps, own_core=True))
        if "split" in parts:
            split = split_runs(args, redis_url)
        if "capacity" in parts:
            _, client_cpus = cores_for(two, args.cores)
            redis_proc.ps.cpu_affinity(client_cpus)  # the store beside the load generator
            coarse = geometric_steps(min(args.start, args.max_sessions), 1.25, args.max_sessions)
            for w in args.counts:
                caps[w].append({"phase": "coarse", **ramp(w, coarse, args, redis_url)})
            for i in range(args.capacity_rounds):
                for w in args.counts[::-1] if i % 2 == 0 else args.counts:
                    found = caps[w][0]["largest"] or args.start
                    begin = min(max(1, int(found * 0.7)), args.max_sessions)
                    fine = geometric_steps(begin, 1.07, args.max_sessions)
                    caps[w].append({"phase": "fine", **ramp(w, fine, args, redis_url)})
    given = " ".join(sys.argv[1:] if argv is None else argv)
    print(
        f"benchmarks.workers: {args.cores} cores, `{given}`, "
        f"{time.monotonic() - t0:.0f} s, load avg {os.getloadavg()[0]:.2f} at the end\n"
    )
    summary = report(args, parts, cpu, split, caps, own)
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"workers-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["python -m benchmarks.workers", *(argv or sys.argv[1:])]),
        "started": started.isoformat(),
        "seconds": time.monotonic() - t0,
        "machine": machine_info(),
        "client_nice": args.client_nice,
        "server_nice": args.server_nice,
        "realtime": args.realtime,
        "lane": args.lane,
        "cores": args.cores,
        "counts": args.counts,
        "sessions": args.sessions,
        "parts": sorted(parts),
        "summary": summary,
        "cpu": {str(w): rs for w, rs in cpu.items()},
        "own": {str(w): rs for w, rs in own.items()},
        "split": split,
        "capacity": {str(w): rs for w, rs in caps.items()},
    }
    out.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    print(f"raw figures: {out}", file=sys.stderr)
    return 0


def report_again(args: argparse.Namespace) -> int:
    record = json.loads(args.report.read_text(encoding="utf-8"))
    args.counts = record.get("counts", args.counts)
    args.cores = record.get("cores", args.cores)
    cpu = {int(w): rs for w, rs in record["cpu"].items()}
    caps = {int(w): rs for w, rs in record["capacity"].items()}
    args.sessions = record.get("sessions") or sorted(
        {s["sessions"] for rs in cpu.values() for r in rs for s in r["steps"]} or {0}
    )
    parts = set(record.get("parts") or ["cpu", "split", "capacity"])
    print(f"benchmarks.workers: the record of `{record['command']}`, {record['started']}\n")
    own = {int(w): rs for w, rs in record.get("own", {}).items()}
    report(args, parts, cpu, record["split"], caps, own)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
