"""Part 1 of ``benchmarks.workers``, CPU per voice session (``cpu``): one server held at
fixed loads, each window's CPU per worker, per session and second; and its tables, the
ratio --workers 2 / --workers 1 at the same sessions in all and at the same sessions per
worker. Part 1b (``own.py``) measures with the same run, worker 0 on a core of its own.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from typing import Any

import psutil

from benchmarks.probes.workers.procs import hurry, load_avg, say, start_server, voice_client
from benchmarks.probes.workers.tables import CPU_TARGET, THRESHOLD_MS, mid, spread
from benchmarks.suite._procs import BenchError, LoadMeter, Proc, run_to_result
from benchmarks.suite._stats import DASH, TIMES

NO_THRESHOLD_MS = 10_000.0
"""Part 1 measures at a fixed load: a slow window is recorded, never a reason to stop."""


def cpu_run(
    workers: int,
    args: argparse.Namespace,
    redis_proc: Proc,
    redis_url: str,
    sessions: Sequence[int] | None = None,
    own_core: bool = False,
) -> dict[str, Any]:
    """One server at each of ``sessions`` in turn (one client run): each window's CPU
    per worker, the supervisor's, redis-server's, and (W > 1) each worker's sessions.

    ``own_core``: worker 0 alone on core 0, every other worker and the load generator on
    the other cores (--workers 1: the one worker on core 0); worker 0's CPU over its own
    sessions is then what a worker costs on a core of its own."""
    meter = LoadMeter()
    steps = list(sessions or args.sessions)
    rest = list(range(1, args.cores)) or [0]
    pin = [0] if own_core and workers == 1 else None
    server, url = start_server(workers, redis_url, args.server_nice, pin, realtime=args.server_rt)
    if own_core and workers > 1:
        try:
            for i, proc in enumerate(server.worker_ps):
                proc.cpu_affinity([0] if i == 0 else rest)
        except psutil.Error as exc:
            server.stop()
            raise BenchError(f"{server.name}: cannot pin its workers: {exc}") from None
    marks: dict[str, dict[str, Any]] = {}

    def on_mark(mark: str) -> None:
        hurry(args)
        try:
            each, system, wakes, own = server.worker_cpu()
            snap: dict[str, Any] = {
                "t": time.monotonic(),
                "workers": each,
                "system": system,
                "wakes": wakes,
                "supervisor": own,
                "redis": redis_proc.snapshot()["cpu"],
            }
            if mark.startswith("start_") and workers > 1:
                n = int(mark.removeprefix("start_"))
                snap["sessions_by_worker"], snap["readings"] = server.sessions_by_worker(n)
        except BenchError as exc:
            snap = {"error": str(exc)}
        marks[mark] = snap

    try:
        flags = [
            *("--settle", str(args.settle), "--measure", str(args.measure)),
            *("--threshold-ms", str(NO_THRESHOLD_MS), "--confirm", "0"),
            *("--ramp-time", "600", "--max-time", str(args.cpu_timeout)),
        ]
        result = run_to_result(
            "voice load",
            voice_client(url, steps, args, flags, rest if own_core else None, args.client_rt),
            on_mark=on_mark,
            timeout=args.cpu_timeout + 30,
            watch=server,
        )
    finally:
        server.stop(grace=10)
        background = meter.read()
    for step in result["steps"]:
        a, b = marks.get(f"start_{step['mark']}", {}), marks.get(f"end_{step['mark']}", {})
        if "error" in a or "error" in b or not a or not b:
            raise BenchError(f"--workers {workers}: {a.get('error') or b.get('error')}")
        n, wall = step["sessions"], b["t"] - a["t"]
        cpu = [y - x for x, y in zip(a["workers"], b["workers"], strict=True)]
        step["window_s"] = wall
        step["worker_cpu_s"] = cpu
        step["worker_system_s"] = [y - x for x, y in zip(a["system"], b["system"], strict=True)]
        step["worker_wakes"] = [y - x for x, y in zip(a["wakes"], b["wakes"], strict=True)]
        if step["samples"]:
            step["frames_per_wake"] = step["samples"] / max(1, sum(step["worker_wakes"]))
        step["supervisor_cpu_s"] = b["supervisor"] - a["supervisor"]
        step["server_cores"] = sum(cpu) / wall
        step["redis_cores"] = (b["redis"] - a["redis"]) / wall
        if n:
            step["cpu_ms_per_session_s"] = 1000 * sum(cpu) / (n * wall)
            step["redis_cpu_ms_per_session_s"] = 1000 * step["redis_cores"] / n
        if "sessions_by_worker" in a:
            step["sessions_by_worker"], step["readings"] = a["sessions_by_worker"], a["readings"]
        if own_core and n:
            mine = step["sessions_by_worker"][0] if workers > 1 else n
            step["own_core_sessions"] = mine
            if mine:
                step["own_core_cpu_ms_per_session_s"] = 1000 * cpu[0] / (mine * wall)
    result.update(workers=workers, background=background, own_core=own_core)
    shown = ", ".join(
        f"{s['sessions']}: {s['cpu_ms_per_session_s']:.2f} ms/s per session "
        f"(p99 {s['p99_ms']:.1f} ms" + (f", split {s['sessions_by_worker']}" if workers > 1 else "")
        + ")" if s["sessions"] else f"idle: {s['server_cores']:.2%} of a core"
        for s in result["steps"]
    )  # fmt: skip
    if own_core:
        shown = ", ".join(
            f"{s['sessions']}: worker 0 {s.get('own_core_cpu_ms_per_session_s', math.nan):.2f} "
            f"ms/s per session over its {s['own_core_sessions']} (p99 {s['p99_ms']:.1f} ms)"
            for s in result["steps"]
        )
    say(
        f"cpu{' (a core of its own)' if own_core else ''} --workers {workers}: {shown}; other "
        f"processes {background['other_share']:.0%}, {load_avg()}"
    )
    return result


def _ratios(
    a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]
) -> tuple[list[float], list[float]]:
    """Round i of the one against round i of the other (measured within a minute): every
    round's ratio of CPU per session, and those of the rounds where both held p99 <=
    20 ms. A round past the knee (a busy machine) is shown but not judged: a starved
    worker batches more and costs less per frame."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x["cpu_ms_per_session_s"] > 0]
    ratios = [y["cpu_ms_per_session_s"] / x["cpu_ms_per_session_s"] for x, y in pairs]
    held = [
        y["cpu_ms_per_session_s"] / x["cpu_ms_per_session_s"]
        for x, y in pairs
        if max(x["p99_ms"], y["p99_ms"]) <= THRESHOLD_MS
    ]
    return ratios, held


def _row(
    n: int,
    a: Sequence[dict[str, Any]],
    b: Sequence[dict[str, Any]],
    ratios: Sequence[float],
    last: str,
) -> None:
    """A row of either table: both servers' CPU per session at ``n`` (``a``, ``b``: their
    steps, round by round), the ratio per round, their p99 and echoes per wake-up, and
    ``last`` (the row's last cells)."""
    print(
        f"| {n} | {spread([s['cpu_ms_per_session_s'] for s in a], '.2f', ' ms/s')} "
        f"| {spread([s['cpu_ms_per_session_s'] for s in b], '.2f', ' ms/s')} "
        f"| **{spread(ratios, '.3f', TIMES)}** "
        f"| {mid([s['p99_ms'] for s in a]):.1f} / {mid([s['p99_ms'] for s in b]):.1f} ms "
        f"| {mid([s.get('frames_per_wake', math.nan) for s in a]):.2f} / "
        f"{mid([s.get('frames_per_wake', math.nan) for s in b]):.2f} "
        f"| {last} |"
    )


def report_cpu(cpu: dict[int, list[dict[str, Any]]], counts: list[int]) -> dict[str, Any]:
    one, two = counts[0], counts[-1]
    print(
        f"### CPU per voice session: --workers {two} against --workers {one} (nothing pinned, "
        "interleaved rounds)\n"
    )
    print(
        f"| sessions | --workers {one}: server CPU per session | --workers {two} | ratio "
        f"{two}/{one} per round | p99 {one} / {two} | echoes per worker wake-up {one} / {two} "
        "| load avg | within 10 % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    sessions = sorted({s["sessions"] for run in cpu[one] for s in run["steps"]})
    loads = [run["background"]["loadavg_1m"] for w in (one, two) for run in cpu[w]]
    for n in sessions:

        def at(w: int, n: int = n) -> list[dict[str, Any]]:
            return [s for run in cpu[w] for s in run["steps"] if s["sessions"] == n]

        a, b = at(one), at(two)
        if n == 0:  # no session: what the workers cost doing nothing (timers, the cluster)
            print(
                f"| 0 (idle) | {spread([s['server_cores'] * 100 for s in a], '.2f', ' %')} "
                f"of a core | {spread([s['server_cores'] * 100 for s in b], '.2f', ' %')} "
                f"| {DASH} | {DASH} | {DASH} | {spread(loads, '.2f')} | {DASH} |"
            )
            continue
        ratios, held = _ratios(a, b)
        if not held:
            met = f"not judged (no round below the knee, of {len(ratios)})"
        else:
            met = "met" if mid(held) <= CPU_TARGET else "not met"
            met += f" ({mid(held):.3f}{TIMES} over the {len(held)} of {len(ratios)} rounds held)"
        _row(n, a, b, ratios, f"{spread(loads, '.2f')} | {met}")
        summary[str(n)] = {"ratio": ratios, "held": held, "met": met.startswith("met")}
    # The same load per worker: --workers W at W*N sessions against --workers 1 at N. An
    # event loop's cost per event falls as more events share a wake-up, and W workers
    # splitting N sessions each wake for fewer; at the same sessions per worker they batch
    # alike. This is the comparison that says what a worker per core holds.
    per_worker = [n for n in sessions if n and n * two // one in sessions]
    if per_worker:
        print(
            f"\n| sessions per worker | --workers {one} at N | --workers {two} at "
            f"{two // one}N | ratio per round | p99 {one} / {two} | echoes per wake-up "
            "| rounds below the knee: ratio |"
        )
        print("|---|---|---|---|---|---|---|")
    for n in per_worker:
        a = [s for run in cpu[one] for s in run["steps"] if s["sessions"] == n]
        b = [s for run in cpu[two] for s in run["steps"] if s["sessions"] == n * two // one]
        ratios, held = _ratios(a, b)
        _row(n, a, b, ratios, f"{len(held)} of {len(ratios)}: {spread(held, '.3f', TIMES)}")
        summary[f"per_worker_{n}"] = {"ratio": ratios, "held": held}
    sup = [s["supervisor_cpu_s"] / s["window_s"] for run in cpu[two] for s in run["steps"]]
    red = {
        w: [
            s["redis_cpu_ms_per_session_s"] for run in cpu[w] for s in run["steps"] if s["sessions"]
        ]
        for w in (one, two)
    }
    print(
        f"\n(ms/s: server CPU-milliseconds per session per second, the workers summed; the "
        f"supervisor took {mid(sup):.1%} of a core besides; redis-server "
        f"{mid(red[one]):.3f} / {mid(red[two]):.3f} ms/s per session)\n"
    )
    return summary
