"""Scenario 8: what the OpenAI dialect costs against the native one, per event.

One server (``trio-duplex serve --engine echo``) serves both paths; each round runs the
native client on ``/v1/duplex`` and the OpenAI client on ``/v1/realtime`` against fresh
servers, interleaved, with the same client events (``clients/dialects.py``), so the
engine's work is the same and the ratio is the dialect's: its decoding, its shaping of
the engine's events into OpenAI's structure, its ``event_id``.

- **Events per server CPU-second**: pipelined text turns (``conversation.item.create`` +
  ``response.create``), every event either way over the server's CPU time. The server
  writes more events per turn on OpenAI's dialect (its structure: ``output_item``,
  ``content_part``, ``*.done``...): turns per CPU-second and events per turn are beside
  it.
- **Voice sessions per core**: sessions streaming 20 ms frames with a turn every 200 ms
  (commit, ``response.create``, the echo's audio back as two deltas); the most sessions
  whose p99 ``response.create`` → ``response.done`` stays within the voice threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from benchmarks.suite._plan import geometric_steps
from benchmarks.suite._procs import Proc
from benchmarks.suite._scenarios import col, row
from benchmarks.suite._stats import TIMES, largest_passing
from benchmarks.suite._suite import Suite, Variant, server_cpu

NATIVE = "native (/v1/duplex)"
OPENAI = "openai (/v1/realtime)"
REALTIME_PATH = "/v1/realtime"
DIALECTS = {NATIVE: "native", OPENAI: "openai"}


def dialect_url(url: str, dialect: str) -> str:
    """The server's ``/v1/duplex`` URL, or its ``/v1/realtime`` one for ``openai``."""
    if dialect == "native":
        return url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, REALTIME_PATH, "model=bench", ""))


def per_cpu_second(key: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: float(r[key]) / server_cpu(r)


def with_events(r: dict[str, Any]) -> dict[str, Any]:
    """A turns result with ``events``: every event either way in its window."""
    return {**r, "events": r["client_events"] + r["server_events"]}


def per_turn(r: dict[str, Any]) -> float:
    return float(r["server_events"]) / float(r["turns"])


def sessions_per_core(ramps: list[dict[str, Any]]) -> float | None:
    """Sessions one core holds, from the server's CPU against the session count over
    every step that held (least squares: 1 / the slope); None for fewer than two N.

    The latency knee moves with whatever else the machine runs; the CPU a session
    costs does not, so this is the figure that compares the dialects' cost."""
    points = [
        (float(s["sessions"]), float(s["server_cpu_util"]))
        for ramp in ramps
        for s in ramp["steps"]
        if "server_cpu_util" in s and not s["errors"] and not s["dead"]
    ]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_u = sum(u for _, u in points) / len(points)
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    slope = sum((n - mean_n) * (u - mean_u) for n, u in points) / spread
    return 1 / slope if slope > 0 else None


def dialects(suite: Suite) -> None:
    p = suite.plan
    common = ["--warmup", str(p.tp_warmup), "--duration", str(p.tp_duration)]
    common += ["--window", str(p.dialect_window), "--ack-every", str(p.ack_every)]
    timeout = 30 + p.tp_warmup + p.tp_duration

    def turns(dialect: str) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("dialects", [
                "turns", "--url", dialect_url(url, dialect), "--dialect", dialect, *common,
            ])  # fmt: skip
            result, marks = suite.client(argv, watch=proc, timeout=timeout)
            return {**with_events(result), "server": marks}

        return run

    variants = [Variant(name, "duplex", turns(d)) for name, d in DIALECTS.items()]
    runs = suite.interleave("8 dialects (turns)", variants, p.tp_rounds)
    native, openai = runs[NATIVE], runs[OPENAI]
    for name, rs in runs.items():
        for r in rs:
            if r and r.get("errors"):
                suite.say(f"8 dialects: {name} answered errors {r['errors']}")
    row(
        suite,
        "8",
        "events per server CPU-second, every event either way (text turns)",
        col(openai, per_cpu_second("events")),
        "native dialect",
        col(native, per_cpu_second("events")),
        target=f"≥ 0.9{TIMES}",
        target_ratio=0.9,
        note="the client's events and the server's, over the server's CPU",
    )
    row(
        suite,
        "8",
        "text turns per server CPU-second (the same conversation)",
        col(openai, per_cpu_second("turns")),
        "native dialect",
        col(native, per_cpu_second("turns")),
        note="the same client events both ways; OpenAI's answer is more events",
    )
    row(
        suite,
        "8",
        "server events written per text turn",
        col(openai, per_turn),
        "native dialect",
        col(native, per_turn),
        higher_is_better=False,
        note="OpenAI's response structure: output item, content part, their *.done",
    )
    _voice(suite)


def _voice(suite: Suite) -> None:
    p = suite.plan
    found: dict[str, list[float | None]] = {name: [] for name in DIALECTS}
    ramps: dict[str, list[dict[str, Any]]] = {name: [] for name in DIALECTS}

    def ramp(dialect: str, steps: list[int]) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("dialects", [
                "voice", "--url", dialect_url(url, dialect), "--dialect", dialect,
                "--steps", ",".join(map(str, steps)), "--turn-frames", str(p.dialect_turn_frames),
                "--settle", str(p.voice_settle), "--measure", str(p.dialect_voice_measure),
                "--threshold-ms", str(p.voice_threshold_ms), "--ramp-time", str(p.voice_ramp_time),
                "--ack-every", str(p.voice_ack_every), "--max-time", str(p.voice_ramp_time + 60),
            ])  # fmt: skip
            result, marks = suite.client(argv, watch=proc, timeout=p.voice_ramp_time + 90)
            for step in result["steps"]:
                a, b = marks.get(f"start_{step['mark']}"), marks.get(f"end_{step['mark']}")
                if a and b:
                    step["server_cpu_util"] = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"])
            return result

        return run

    def largest(result: dict[str, Any] | None) -> float | None:
        if not result:
            return None
        best = largest_passing(
            [(s["sessions"], s["p99_ms"]) for s in result["steps"]], p.voice_threshold_ms
        )
        return float(best) if best else None

    coarse = geometric_steps(p.voice_coarse_start, p.voice_coarse_factor, p.voice_max_sessions)
    variants = [Variant(name, "duplex", ramp(d, coarse)) for name, d in DIALECTS.items()]
    t0 = time.monotonic()
    runs = suite.interleave("8 dialects (voice, coarse ramp)", variants, 1)
    slowest = time.monotonic() - t0
    for name in DIALECTS:
        for result in runs[name]:
            found[name].append(largest(result))
            if result:
                ramps[name].append({"phase": "coarse", **result})
    fine_done = 0
    for i in range(p.voice_fine_rounds):
        if suite.time_left() < slowest * 0.8:
            suite.say(f"8 dialects: {i} of {p.voice_fine_rounds} fine voice ramps fit the budget")
            break
        variants = []
        for name, d in DIALECTS.items():
            start = max(1, int((found[name][0] or p.voice_coarse_start) * 0.7))
            steps = geometric_steps(start, p.voice_fine_factor, p.voice_max_sessions)
            variants.append(Variant(name, "duplex", ramp(d, steps)))
        t0 = time.monotonic()
        runs = suite.interleave("8 dialects (voice, fine ramp)", variants, 1)
        slowest = max(slowest * 0.8, time.monotonic() - t0)
        fine_done += 1
        for name in DIALECTS:
            for result in runs[name]:
                found[name].append(largest(result))
                if result:
                    ramps[name].append({"phase": "fine", **result})
    pick = slice(1, None) if fine_done else slice(None)
    per_core = {name: sessions_per_core(ramps[name]) for name in DIALECTS}
    suite.raw["8 dialects voice"] = {"ramps": ramps, "largest": found, "per_core": per_core}
    row(
        suite,
        "8",
        "voice sessions per core, from the server's CPU per session",
        [per_core[OPENAI]],
        "native dialect",
        [per_core[NATIVE]],
        target=f"≥ 0.9{TIMES}",
        target_ratio=0.9,
        note="1 / the slope of the server's CPU against N over every step that held",
    )
    row(
        suite,
        "8",
        f"voice sessions per core, a turn per 200 ms, p99 ≤ {p.voice_threshold_ms:g} ms",
        found[OPENAI][pick],
        "native dialect",
        found[NATIVE][pick],
        target=f"≥ 0.9{TIMES}",
        target_ratio=0.9,
        note="response.create → response.done of the echoed turn; same client events",
    )
