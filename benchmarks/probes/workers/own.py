"""Part 1b of ``benchmarks.workers``, a worker on a core of its own (``own``): the steps
of each configuration (measured by part 1's run, ``cpu.cpu_run(..., own_core=True)``) and
the table, worker 0's CPU over its own sessions against --workers 1's at as many, read
off --workers 1's steps (piecewise linear).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from benchmarks.probes.workers.tables import CPU_TARGET, THRESHOLD_MS, mid, spread
from benchmarks.suite._stats import DASH, TIMES


def own_steps(per_worker: Sequence[int], workers: int) -> list[int]:
    """Part 1b's steps: --workers W (W > 1) at W*N for each N; --workers 1 at each N and
    a step below and above them, so that its cost can be read at whatever worker 0 of
    the other got (the kernel's split moves it by a few sessions)."""
    if workers > 1:
        return [n * workers for n in per_worker]
    low, high = round(min(per_worker) * 2 / 3), round(max(per_worker) * 4 / 3)
    return sorted({max(1, low), *per_worker, high})


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted by x), extended linearly past the ends."""
    pts = sorted(points)
    if len(pts) == 1:
        return pts[0][1] * x / pts[0][0] if pts[0][0] else math.nan
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x <= x1 or (x1, y1) == pts[-1]:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return math.nan  # unreachable: the loop returns at the last pair


def report_own(own: dict[int, list[dict[str, Any]]], counts: list[int]) -> dict[str, Any]:
    one, two = counts[0], counts[-1]
    print(
        f"### A worker on a core of its own: worker 0 of --workers {two} against --workers "
        f"{one}\n\nEach alone on core 0; the load generator, redis-server and the other "
        f"worker(s) on the other core(s). --workers {two} carries {two}N sessions, so that "
        "worker 0 gets about N (its own count shown); its CPU is divided by its own "
        "sessions.\n"
    )
    print(
        f"| worker 0's sessions (rounds) | worker 0 of --workers {two} on core 0 | --workers "
        f"{one} on core 0 at as many (interpolated) | ratio per round | p99 {one} / {two} "
        f"| echoes per wake-up {one} / {two} | within 10 % |"
    )
    print("|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    key = "own_core_cpu_ms_per_session_s"
    # Round i of the one against round i of the other. --workers 1's CPU (cores) against
    # its sessions, through its steps of that round, read at worker 0's count.
    for n in sorted({s["sessions"] for run in own.get(two, []) for s in run["steps"]}):
        rows: list[tuple[int, float, float, float, float, float, float]] = []
        uncounted = 0  # rounds where --workers 1's CPU at that count read as none
        for run1, run2 in zip(own.get(one, []), own.get(two, []), strict=False):
            curve = [(s["sessions"], s["server_cores"]) for s in run1["steps"] if s["sessions"]]
            for y in run2["steps"]:
                if y["sessions"] != n or key not in y or not curve:
                    continue
                mine = y["own_core_sessions"]
                base = 1000 * interpolate(curve, mine) / mine
                if not base > 0:  # (a window within the clock's tick: no CPU counted)
                    uncounted += 1
                    continue
                p99_1 = max(s["p99_ms"] for s in run1["steps"] if s["sessions"])
                wake = y.get("frames_per_wake", math.nan)
                rows.append((mine, y[key], base, y[key] / base, p99_1, y["p99_ms"], wake))
        if not rows:  # the kernel gave worker 0 none of the sessions (a small N)
            why = (
                f"no CPU counted for --workers {one} at as many: a window too short"
                if uncounted
                else "worker 0 got no session"
            )
            print(f"| 0 (--workers {two} at {n}) | {DASH} | {DASH} | {DASH} | {DASH} | {DASH} "
                  f"| not judged ({why}) |")  # fmt: skip
            continue
        ratios = [r[3] for r in rows]
        held = [r[3] for r in rows if max(r[4], r[5]) <= THRESHOLD_MS]
        if not held:
            met = f"not judged (no round below the knee, of {len(ratios)})"
        else:
            met = "met" if mid(held) <= CPU_TARGET else "not met"
            met += f" ({mid(held):.3f}{TIMES}, {len(held)} of {len(ratios)} rounds held)"
        fpw_one = mid(
            [s.get("frames_per_wake", math.nan) for run in own.get(one, []) for s in run["steps"]]
        )
        print(
            f"| {', '.join(str(r[0]) for r in rows)} (--workers {two} at {n}) "
            f"| {spread([r[1] for r in rows], '.2f', ' ms/s')} "
            f"| {spread([r[2] for r in rows], '.2f', ' ms/s')} "
            f"| **{spread(ratios, '.3f', TIMES)}** "
            f"| {mid([r[4] for r in rows]):.1f} / {mid([r[5] for r in rows]):.1f} ms "
            f"| {fpw_one:.2f} / {mid([r[6] for r in rows]):.2f} | {met} |"
        )
        summary[str(n // two)] = {"ratio": ratios, "held": held, "met": met.startswith("met")}
    loads = [run["background"]["loadavg_1m"] for w in (one, two) for run in own.get(w, [])]
    print(
        f"\n(load avg {spread(loads, '.2f')}; echoes per wake-up: all workers together; "
        f"--workers {two}'s p99 covers all its sessions, also those of the worker that shares "
        "its core with the load generator)\n"
    )
    return summary
