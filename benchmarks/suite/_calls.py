"""Scenario 9: WebRTC calls (issue 28, docs/plans/webrtc.md §5.6) against WebSocket voice
sessions, on the same ``voice`` engine (``benchmarks/probes/call_engine.py``: the
engine as built, noting microphone lateness and, for the latency phase, its send times).

- **Calls per core.** ``serve --calls`` (its media worker a child process on the same
  core as the server: it inherits the server's ``taskset``) takes a ramp of calls from
  two aiortc load generators (``clients/calls.py``, on the other core), each call a
  20 ms Opus microphone and the engine speaking without pause; the same server and
  schedule take a ramp of ``/v1/duplex`` sessions on the binary lane (20 ms PCM up, the
  engine's audio down), interleaved by round. A step holds when the gaps between a
  call's audio packets, as the client receives them, have p99 ≤ ``calls_gap_ms`` and
  the microphone's lateness at the engine (``call_engine``'s, scenario 3's "added
  latency" on the way in) has p99 ≤ scenario 3's threshold, in one of its two windows.
  Reported: the largest N that held; the calls one core holds by the CPU each costs
  (the server and its media worker, psutil: 1 / the slope against N, as scenario 8's,
  over the steps whose CPU still grew, ``growing``); the CPU per call at the last.
- **Media-path latency**: one call, short answers a second apart; the engine's send
  time of each audio frame against the worker's RTP send time of its packet
  (``STATS``), both ``CLOCK_MONOTONIC``: the first packet of each answer (after idle:
  no pacing wait) and the others (steady state).
- **Memory per call**: the RSS of the server and of its worker, separately, at
  ``calls_memory_steps`` calls, idle (no audio either way) and active (the ramp's).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import psutil

from benchmarks.suite._procs import (
    PY,
    BenchError,
    Proc,
    free_port,
    pinned,
    run_to_result,
    start_server,
)
from benchmarks.suite._scenarios import row
from benchmarks.suite._stats import Row, Summary, largest_passing, percentile
from benchmarks.suite._suite import SERVER_CPU, Suite

ENGINE = "benchmarks.probes.call_engine:StampedVoice"
CALLS = "WebRTC calls (aiortc clients)"
WS = "WebSocket sessions, binary lane"
SHARES = 2


def server_argv(port: int, log_level: str) -> list[str]:
    return [
        PY, "-m", "benchmarks.probes.call_server",
        "--host", "127.0.0.1", "--port", str(port), "--engine", ENGINE,
        "--calls", "--call-allow-peer", "127.0.0.0/8",
        "--max-sessions", "20000", "--max-connections", "20000",
        "--max-connections-per-ip", "20000", "--call-max-setup", "64",
        "--journal-max-bytes", str(64 * 2**20), "--max-event-bytes", str(2**20),
        "--drain-timeout", "1", "--log-level", log_level,
    ]  # fmt: skip


def tree(proc: Proc) -> dict[str, float]:
    """CPU seconds of the server and its children (the media worker), and each one's RSS."""
    try:
        kids = proc.ps.children(recursive=True)
        with proc.ps.oneshot():
            cpu = proc.ps.cpu_times()
            rss = float(proc.ps.memory_info().rss)
        own = cpu.user + cpu.system
        kid_cpu = kid_rss = 0.0
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                c = kid.cpu_times()
                kid_cpu += c.user + c.system
                kid_rss += kid.memory_info().rss
    except psutil.Error as exc:
        raise BenchError(f"{proc.name} is gone: {exc}\n{proc.tail()}") from None
    return {
        "t": time.monotonic(),
        "cpu": own + kid_cpu,
        "worker_cpu": kid_cpu,
        "rss": rss,
        "worker_rss": kid_rss,
        "kids": len(kids),
    }


@contextlib.contextmanager
def server(suite: Suite, *, stamp: bool = False) -> Iterator[tuple[Proc, str, Path]]:
    """The bench server; its recorder's file, readable once the block is over."""
    port = free_port()
    fd, name = tempfile.mkstemp(prefix="calls-bench-", suffix=".json")
    os.close(fd)
    out = Path(name)
    saved = {k: os.environ.get(k) for k in ("DUPLEX_BENCH_CALLS_OUT", "DUPLEX_BENCH_CALLS_STAMP")}
    os.environ["DUPLEX_BENCH_CALLS_OUT"] = str(out)
    if stamp:
        os.environ["DUPLEX_BENCH_CALLS_STAMP"] = "1"
    try:
        argv = pinned(server_argv(port, suite.log_level), SERVER_CPU if suite.pin else None)
        proc, _ = start_server(
            "trio-duplex --calls", argv, probe=f"ws://127.0.0.1:{port}/v1/duplex"
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield proc, f"http://127.0.0.1:{port}", out
    finally:
        proc.stop()


def read_recorder(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        data = {}
    finally:
        path.unlink(missing_ok=True)
    return data


def run_fleet(
    suite: Suite, proc: Proc, client: str, args: Sequence[str], steps: Sequence[int], *,
    opening: float, settle: float, measure: float, windows: int, lead_s: float,
) -> tuple[list[dict[str, Any]], list[dict[str, float]]]:  # fmt: skip
    """``SHARES`` processes of ``benchmarks.suite.clients.<client>`` (each given ``args``,
    the schedule's flags and its share) on one schedule, starting ``lead_s`` from now
    (every process has started by then): every process's steps, and the server's samples
    at each step's window edges (``windows`` + 1 a step). Scenarios 9 and 10."""
    period = opening + settle + windows * measure
    epoch = time.monotonic() + lead_s
    argv = [
        "ramp", *args, "--steps", ",".join(map(str, steps)), "--epoch", f"{epoch:.3f}",
        "--open", str(opening), "--settle", str(settle), "--measure", str(measure),
        "--windows", str(windows),
    ]  # fmt: skip
    results: list[dict[str, Any] | BaseException] = [BenchError("no result")] * SHARES
    timeout = 30 + len(steps) * period

    def one(i: int) -> None:
        try:
            command = suite.py_client(client, [*argv, "--share", f"{i}/{SHARES}"])
            results[i] = run_to_result(
                f"{client} load generator {i}", command, on_mark=lambda _: None,
                timeout=timeout, watch=proc,
            )  # fmt: skip
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(SHARES)]
    for t in threads:
        t.start()
    samples: list[dict[str, float]] = []
    for j in range(len(steps)):
        first = epoch + j * period + opening + settle
        for edge in [first + w * measure for w in range(windows + 1)]:
            while time.monotonic() < edge and any(t.is_alive() for t in threads):
                time.sleep(min(0.01, max(0.0, edge - time.monotonic())))
            if not any(t.is_alive() for t in threads):
                break
            samples.append(tree(proc))
    for t in threads:
        t.join(timeout)
    out: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r if isinstance(r, BenchError) else BenchError(str(r))
        out.append(r)
    return out, samples


Window = Callable[
    [list[dict[str, Any]], list[dict[str, Any]], dict[str, float], dict[str, float],
     list[float], list[float]],
    dict[str, Any],
]  # fmt: skip
"""One measured window of a step from every share's part of it: (the shares' steps, their
windows, the server's samples at its edges, the recorder's microphone times and
lateness) → the step's figures, ``held_slo`` among them."""


def merge_steps(
    shares: list[dict[str, Any]], samples: list[dict[str, float]], windows: int,
    recorder: dict[str, Any], window: Window, kept: Sequence[str],
) -> list[dict[str, Any]]:  # fmt: skip
    """One step per N: of its ``windows``, the first that held (else its first), each
    judged by ``window`` from every share's part together; ``windows_tried`` keeps the
    ``kept`` figures of each. Scenarios 9 and 10."""
    per = windows + 1
    count = min(min(len(s["steps"]) for s in shares), len(samples) // per)
    mic_t, mic_late = recorder.get("mic_t", []), recorder.get("mic_late", [])
    steps = []
    for j in range(count):
        parts = [s["steps"][j] for s in shares]
        edges = samples[j * per : (j + 1) * per]
        tried = [
            window(parts, [part["windows"][w] for part in parts], edges[w], edges[w + 1],
                   mic_t, mic_late)
            for w in range(windows)
        ]  # fmt: skip
        step = next((t for t in tried if t["held_slo"]), tried[0])
        step["windows_tried"] = [{k: t[k] for k in kept} for t in tried]
        steps.append(step)
    return steps


def fleet(
    suite: Suite, proc: Proc, url: str, kind: str, steps: Sequence[int], *, idle: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, float]]]:
    """Scenario 9's load generators (``run_fleet``)."""
    p = suite.plan
    opening = p.calls_open if kind == "call" else p.calls_ws_open
    if idle:
        opening = p.calls_memory_open
    args = ["--kind", kind, "--url", url, "--gap-ms", str(p.calls_gap_ms)]
    return run_fleet(
        suite, proc, "calls", [*args, *(["--idle"] if idle else [])], steps,
        opening=opening, settle=p.calls_settle, measure=p.calls_measure,
        windows=p.calls_windows,
        lead_s=3.0,  # every load generator has imported aiortc by then
    )  # fmt: skip


KEPT: Final = ("gap_p99_ms", "mic_late_p99_ms", "server_cpu_util", "held_slo")


def merge(
    suite: Suite, shares: list[dict[str, Any]], samples: list[dict[str, float]],
    recorder: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Scenario 9's steps (``merge_steps``): each window from every share's gaps together,
    the engine's microphone lateness in the window, and the server's CPU (with its
    worker's) and RSS at its edges."""
    window = functools.partial(_window, suite)
    return merge_steps(shares, samples, suite.plan.calls_windows, recorder, window, KEPT)


def _window(
    suite: Suite, parts: list[dict[str, Any]], got: list[dict[str, Any]],
    a: dict[str, float], b: dict[str, float], mic_t: list[float], mic_late: list[float],
) -> dict[str, Any]:  # fmt: skip
    p = suite.plan
    gaps = [g for window in got for g in window["gaps_ms"]]
    late = [x * 1000 for t, x in zip(mic_t, mic_late, strict=True) if a["t"] <= t < b["t"]]
    lateness = [x for window in got for x in window["lateness_ms"]]
    step: dict[str, Any] = {
        "sessions": parts[0]["sessions"],
        "held": sum(part["held"] for part in parts),
        "dead": sum(part["dead"] for part in parts),
        "packets": sum(window["packets"] for window in got),
        "gap_p50_ms": percentile(gaps, 50) if gaps else math.nan,
        "gap_p99_ms": percentile(gaps, 99) if gaps else math.nan,
        "mic_late_p99_ms": percentile(late, 99) if late else math.nan,
        "mic_chunks": len(late),
        "client_late_p99_ms": percentile(lateness, 99) if lateness else math.nan,
        "client_cpu_util": max(window["client_cpu_util"] for window in got),
        "server_cpu_util": (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]),
        "worker_cpu_util": (b["worker_cpu"] - a["worker_cpu"]) / (b["t"] - a["t"]),
        "server_rss": b["rss"],
        "worker_rss": b["worker_rss"],
        "errors": {k: v for window in got for k, v in window["errors"].items()},
        "failures": {k: v for part in parts for k, v in part["failures"].items()},
    }
    step["held_slo"] = bool(
        step["held"] >= step["sessions"]
        and not step["dead"]
        and step["gap_p99_ms"] <= p.calls_gap_ms
        and step["mic_late_p99_ms"] <= p.voice_threshold_ms
    )
    return step


def growing(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ramp's steps whose every call was carried, up to the first whose CPU did not
    grow with N: past it the core has ended (or the machine stalled the server) and the
    server does less than its load asks, so its CPU no longer says what a call costs."""
    out: list[dict[str, Any]] = []
    for s in steps:
        if s["held"] < s["sessions"] or s["dead"]:
            break
        if out and float(s["server_cpu_util"]) <= float(out[-1]["server_cpu_util"]):
            break
        out.append(s)
    return out


def per_core(steps: list[dict[str, Any]]) -> float | None:
    """1 / the slope of the server's CPU (with its worker's) against N (least squares)
    over the ``growing`` steps; None for fewer than two. The SLO's knee moves with
    whatever else the machine runs; the CPU a call costs much less."""
    points = [(float(s["sessions"]), float(s["server_cpu_util"])) for s in growing(steps)]
    if len(points) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_u = sum(u for _, u in points) / len(points)
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    slope = sum((n - mean_n) * (u - mean_u) for n, u in points) / spread
    return 1 / slope if slope > 0 else None


def say_step(kind: str, step: dict[str, Any]) -> None:
    print(
        f"  9 {kind} n={step['sessions']} held={step['held']} "
        f"gap p99={step['gap_p99_ms']:.1f} ms mic late p99={step['mic_late_p99_ms']:.1f} ms "
        f"server+worker cpu={step['server_cpu_util']:.0%} (worker {step['worker_cpu_util']:.0%}) "
        f"client cpu={step['client_cpu_util']:.0%} "
        f"{'ok' if step['held_slo'] else 'FAIL'}",
        flush=True,
        file=sys.stderr,
    )


def ramp_run(suite: Suite, kind: str, steps: Sequence[int], idle: bool = False) -> dict[str, Any]:
    with server(suite) as (proc, url, out):
        before = tree(proc)
        shares, samples = fleet(suite, proc, url, kind, steps, idle=idle)
    merged = merge(suite, shares, samples, read_recorder(out))
    for step in merged:
        say_step(kind + (" idle" if idle else ""), step)
    return {"before": before, "steps": merged}


@attrs.define
class Ramps:
    """What interleaved rounds of two ramps found, per ramp (its name), a value a round."""

    runs: dict[str, list[dict[str, Any]]]
    found: dict[str, list[float | None]]
    """The largest N of each round's ramp that held its SLO."""
    cores: dict[str, list[float | None]]
    """N per core, from the server's CPU against N (``per_core``)."""
    each: dict[str, list[float | None]]
    """% of a core per session at the most its CPU grew to."""
    at: dict[str, list[int | None]]
    """That N."""

    def raw(self) -> dict[str, Any]:
        return {"runs": self.runs, "largest": self.found, "per_core": self.cores,
                "cpu_pct_each": self.each, "at": self.at}  # fmt: skip


def interleaved(
    suite: Suite,
    label: str,
    rounds: int,
    plan: Mapping[str, tuple[str, Sequence[int]]],
    ramp: Callable[[Suite, str, Sequence[int]], dict[str, Any]],
) -> Ramps:
    """``rounds`` rounds of each of ``plan``'s two ramps (name: its kind and its steps of
    N), their order swapped every round (scenarios 9 and 10), as many as fit the time
    budget; a ramp that fails is told and counts as nothing for its round."""
    names = list(plan)
    found = Ramps({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names},
                  {n: [] for n in names}, {n: [] for n in names})  # fmt: skip
    slowest = 0.0
    for r in range(rounds):
        if r > 0 and suite.time_left() < slowest:
            suite.say(f"{label}: {r} of {rounds} rounds fit the time budget")
            break
        t0 = time.monotonic()
        for name in names if r % 2 == 0 else names[::-1]:
            kind, steps = plan[name]
            try:
                result = ramp(suite, kind, steps)
            except BenchError as exc:
                suite.fail(f"{label} / {name} round {r + 1}", exc)
                for column in (found.found, found.cores, found.each, found.at):
                    column[name].append(None)
                continue
            found.runs[name].append(result)
            best = largest_passing(
                [(s["sessions"], 0.0 if s["held_slo"] else 1.0) for s in result["steps"]], 0.5
            )
            found.found[name].append(float(best) if best else None)
            found.cores[name].append(per_core(result["steps"]))
            grown = growing(result["steps"])
            top = grown[-1] if grown else None
            found.each[name].append(top["server_cpu_util"] / top["sessions"] * 100 if top else None)
            found.at[name].append(top["sessions"] if top else None)
        slowest = max(slowest, time.monotonic() - t0)
    return found


def calls(suite: Suite) -> None:
    p = suite.plan
    if not suite.available("duplex"):
        suite.say(f"9 calls skipped: {suite.missing['duplex']}")
        return
    plan = {CALLS: ("call", p.calls_steps), WS: ("ws", p.calls_ws_steps)}
    ramps = interleaved(suite, "9 calls", p.calls_rounds, plan, ramp_run)
    suite.raw["9 calls"] = ramps.raw()
    found, cores, each, at, runs = ramps.found, ramps.cores, ramps.each, ramps.at, ramps.runs
    slo = f"gap p99 ≤ {p.calls_gap_ms:g} ms, mic p99 ≤ {p.voice_threshold_ms:g} ms"
    row(suite, "9", f"voice calls held, {slo} (server + worker on 1 core)", found[CALLS],
        "WebSocket sessions, binary lane", found[WS],
        note="largest N of the ramp that held; the voice engine both ways")  # fmt: skip
    row(suite, "9", "voice calls per core, from server + worker CPU per call", cores[CALLS],
        "WebSocket sessions, binary lane", cores[WS],
        note="1 / the slope of CPU against N over the steps that held")  # fmt: skip
    row(suite, "9", "server + worker CPU per call, at the most calls its CPU grew to", each[CALLS],
        "WebSocket sessions, binary lane", each[WS], higher_is_better=False, unit="%",
        note=f"% of a core, fixed costs in; N = {at[CALLS]} calls, {at[WS]} sessions")  # fmt: skip
    _latency(suite)
    _memory(suite, runs[CALLS])


def _latency(suite: Suite) -> None:
    p = suite.plan
    try:
        with server(suite, stamp=True) as (proc, url, out):
            argv = suite.py_client("calls", [
                "probe", "--url", url, "--responses", str(p.calls_latency_responses),
            ])  # fmt: skip
            limit = 60 + 2 * p.calls_latency_responses  # an answer takes ~0.8 s
            run_to_result("calls probe", argv, on_mark=lambda _: None, timeout=limit, watch=proc)
        data = read_recorder(out)
    except BenchError as exc:
        suite.fail("9 calls latency", exc)
        return
    engine = {int(k): v for k, v in data.get("engine_ns", {}).items()}
    rtp = {int(k): v for k, v in data.get("rtp_ns", {}).items()}
    seqs = sorted(s for s in engine if s in rtp)
    first, steady = [], []
    previous = None
    for seq in seqs:
        ms = (rtp[seq] - engine[seq]) / 1e6
        # The first frame of an answer: the engine sent none for more than 100 ms before.
        if previous is None or engine[seq] - engine[previous] > 100_000_000:
            first.append(ms)
        else:
            steady.append(ms)
        previous = seq
    suite.raw["9 calls latency"] = {
        "first_ms": first,
        "steady_ms": steady,
        "unmatched": len(engine) - len(seqs),
    }
    for label, values in (("first packet after idle", first), ("steady state", steady)):
        if not values:
            suite.say(f"9 calls latency: no {label} sample")
            continue
        for q in (50, 99):
            suite.rows.append(Row(
                scenario="9", metric=f"engine frame → RTP packet, {label}, p{q}",
                ours=Summary.of([percentile(values, q)]), baseline_name="", baseline=Summary.of([]),
                ratio=Summary.of([]), higher_is_better=False, unit="ms",
                note=f"{len(values)} packets, one call",
            ))  # fmt: skip


def _memory(suite: Suite, call_runs: list[dict[str, Any]]) -> None:
    """ΔRSS per call of the server and of its worker: idle calls (no audio either way) at
    ``calls_memory_steps``, against the same run's step of 0 calls; active calls between
    the first call ramp's first step and the most calls it carried (ΔRSS / ΔN)."""
    p = suite.plan
    try:
        idle = ramp_run(suite, "call", p.calls_memory_steps, idle=True)
    except BenchError as exc:
        suite.fail("9 calls memory", exc)
        return
    suite.raw["9 calls memory"] = idle
    steps = idle["steps"]
    zero = next((s for s in steps if s["sessions"] == 0), None)
    base = (zero["server_rss"], zero["worker_rss"]) if zero else (idle["before"]["rss"], 0.0)
    rows = [(s, "idle", base, s["held"]) for s in steps if s["sessions"] and s["held"]]
    for run in call_runs[:1]:
        carried = [s for s in run["steps"] if s["held"] >= s["sessions"] and not s["dead"]]
        if len(carried) > 1:  # from its first step: by then the worker has its imports
            low, high = carried[0], carried[-1]
            n = high["held"] - low["held"]
            rows.append((high, "active", (low["server_rss"], low["worker_rss"]), n))
    for step, kind, (server0, worker0), n in rows:
        for who, now, then in (
            ("server", step["server_rss"], server0),
            ("media worker", step["worker_rss"], worker0),
        ):
            suite.rows.append(Row(
                scenario="9", metric=f"{who} ΔRSS per {kind} call ({step['held']} calls)",
                ours=Summary.of([(now - then) / n / 1024]), baseline_name="",
                baseline=Summary.of([]), ratio=Summary.of([]), higher_is_better=False,
                unit="KB",
                note=f"{who} RSS {then / 2**20:.1f} → {now / 2**20:.1f} MiB over {n} calls",
            ))  # fmt: skip
