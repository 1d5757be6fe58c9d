"""``python -m benchmarks.soak``: hold 1,000 mixed sessions for 10 minutes and watch the
server's memory.

    python -m benchmarks.soak                      # 1,000 sessions, 10 minutes
    python -m benchmarks.soak --quick              # 100 sessions, 1 minute
    python -m benchmarks.soak --sessions 200 --minutes 2 --server-cmd "trio-duplex serve"

Starts ``trio-duplex serve`` as its own process (pinned to CPU 0, as the benchmarks do)
and one or more load generators (``benchmarks/probes/clients/soak_load.py``, on CPU 1), which
keep a constant mix of sessions open: voice streams, hostile readers (they send but never
read, so the server's outbound queues fill until it cuts them; each cut one is replaced),
resumers (they drop their socket mid-answer, resume, and check exactly-once), and a few
abusers (fragmented, oversize and malformed messages). The server's RSS is sampled every
few seconds with psutil.

After the warm-up, the RSS samples are fitted by least squares. The run fails (exit 1) if
the fitted rise over the measured window exceeds the tolerance, ``max(--tolerance-pct`` %
of the RSS at the window's start, ``--tolerance-mib)`` (5 % or 16 MiB by default; see
docs/benchmarks.md for why), or if exactly-once failed for a reading client, or if a
process died. A Markdown summary goes to stdout, progress to stderr, and every sample,
count and setting to ``benchmarks/results/soak-<UTC time>-<quick|full|custom>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import queue
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks.suite._procs import (
    PY,
    ROOT,
    BenchError,
    LoadMeter,
    Proc,
    free_port,
    install_reaper,
    machine_info,
    pinned,
    start_server,
    stop_all,
)
from benchmarks.suite._stats import percentile
from benchmarks.suite._workload import PATH, raise_nofile

RESULTS: Final = Path(__file__).resolve().parents[1] / "results"
KINDS: Final = ("voice", "hostile", "resume", "abuse")
MiB: Final = 2**20
SERVER_CPU: Final = "0"
CLIENT_CPU: Final = "1"
DEFAULT_MIX: Final = "voice=73,hostile=15,resume=10,abuse=2"
DEFAULT_SERVER_CMD: Final = [PY, "-m", "trio_duplex", "serve"]


# --------------------------------------------------------------------- pure helpers
def parse_mix(text: str) -> dict[str, float]:
    """``"voice=55,hostile=20,..."`` → weights by kind; unknown kinds are an error."""
    mix = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        if not part.strip():
            continue
        kind, _, weight = part.partition("=")
        kind = kind.strip()
        if kind not in mix:
            raise ValueError(f"unknown session kind {kind!r} (kinds: {', '.join(KINDS)})")
        mix[kind] = float(weight)
        if mix[kind] < 0:
            raise ValueError(f"negative weight for {kind}")
    if sum(mix.values()) <= 0:
        raise ValueError("the mix has no weight")
    return mix


def allocate(total: int, mix: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` sessions by ``mix`` (largest remainder). Every kind with a weight
    gets at least one session when there are enough to go round."""
    weights = {kind: mix.get(kind, 0.0) for kind in KINDS}
    wanted = [kind for kind in KINDS if weights[kind] > 0]
    whole = sum(weights.values())
    exact = {kind: total * weights[kind] / whole for kind in KINDS}
    counts = {kind: math.floor(exact[kind]) for kind in KINDS}
    if total >= len(wanted):
        for kind in wanted:
            counts[kind] = max(counts[kind], 1)
    while sum(counts.values()) > total:  # the minimum of one overshot: take from the largest
        largest = max(wanted, key=lambda k: counts[k])
        counts[largest] -= 1
    by_remainder = sorted(wanted, key=lambda k: exact[k] - math.floor(exact[k]), reverse=True)
    i = 0
    while sum(counts.values()) < total:
        counts[by_remainder[i % len(by_remainder)]] += 1
        i += 1
    return counts


def split(counts: Mapping[str, int], parts: int) -> list[list[int]]:
    """Each load process's share, per kind in KINDS order, as even as it goes."""
    shares = [[0] * len(KINDS) for _ in range(parts)]
    for k, kind in enumerate(KINDS):
        for p in range(parts):
            shares[p][k] = counts[kind] // parts + (1 if p < counts[kind] % parts else 0)
    return [share for share in shares if sum(share)]


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Slope and intercept of the least-squares line through the points."""
    n = len(xs)
    if n < 2:
        raise ValueError("a line needs two points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all points at one x")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def rss_verdict(
    samples: Sequence[Mapping[str, float]],
    warmup_s: float,
    tolerance_pct: float,
    tolerance_mib: float,
) -> dict[str, Any]:
    """RSS after the warm-up: first, min, max, last, the least-squares slope, and whether
    the fitted rise over the window stays within ``max(pct of the fitted start, mib)``."""
    window = [s for s in samples if s["t"] >= warmup_s]
    if len(window) < 3:
        return {"samples": len(window), "passed": None, "why": "fewer than 3 samples after warm-up"}
    ts = [s["t"] for s in window]
    rss = [s["rss"] / MiB for s in window]
    slope, intercept = least_squares(ts, rss)  # MiB per second
    span = ts[-1] - ts[0]
    fitted_start = intercept + slope * ts[0]
    rise = slope * span
    tolerance = max(fitted_start * tolerance_pct / 100, tolerance_mib)
    return {
        "samples": len(window),
        "window_s": [round(ts[0], 1), round(ts[-1], 1)],
        "start_mib": round(rss[0], 1),
        "min_mib": round(min(rss), 1),
        "max_mib": round(max(rss), 1),
        "end_mib": round(rss[-1], 1),
        "slope_mib_per_min": round(slope * 60, 3),
        "fitted_rise_mib": round(rise, 1),
        "tolerance_mib": round(tolerance, 1),
        "tolerance_rule": (
            f"max({tolerance_pct:g} % of {fitted_start:.1f} MiB, {tolerance_mib:g} MiB)"
        ),
        "passed": rise <= tolerance,
    }


def merge_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))


def problems(counts: Mapping[str, int]) -> dict[str, int]:
    """The counts that are errors: refusals, failures, crashes, unexpected closes and
    error events sent to clients that read (hostile readers never see theirs)."""
    marks = (
        ".error.",
        ".failed.",
        ".refused.",
        ".server_closed.",
        ".close_failed",
        ".crashed.",
        ".unexpected_",
        "resume_refused",
        "fragmented_refused",
        "slots.unfinished",
    )
    return {k: v for k, v in counts.items() if v and any(m in k for m in marks)}


def exactly_once(
    counts: Mapping[str, int], violations: Sequence[str], resumers: int
) -> dict[str, Any]:
    """Did every reading client get each server event once, in order, and each question
    answered once? ``held`` is None when no resumer ran, False when none resumed."""
    resumes = counts.get("resume.ok", 0)
    verdict: dict[str, Any] = {
        "resumes": resumes,
        "drops": counts.get("resume.drops", 0),
        "sessions_checked": counts.get("resume.sessions_checked", 0),
        "events_checked": counts.get("resume.events_checked", 0),
        "events_all_readers": counts.get("events", 0),
        "resent_client_events": counts.get("resume.resent", 0),
        "gaps": counts.get("eo.gap", 0),
        "duplicates": counts.get("eo.duplicate", 0),
        "resync_required": counts.get("eo.resync_required", 0),
        "answers_out_of_order": counts.get("eo.answer_order", 0),
        "unanswered": counts.get("eo.unanswered", 0),
        "generation_errors": counts.get("eo.generation", 0),
        "violations": list(violations[:20]),
    }
    broken = counts.get("eo.violations", 0) > 0
    if resumers == 0:
        verdict["held"] = None if not broken else False
    else:
        verdict["held"] = not broken and resumes > 0
    return verdict


def fmt_mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


def markdown(report: Mapping[str, Any]) -> str:
    """The run as Markdown: settings, RSS, RSS over time, activity, exactly-once."""
    s = report["settings"]
    rss = report["rss"]
    lines = [
        f"## Soak: {s['sessions']:,} sessions, {s['seconds'] / 60:g} min, engine {s['engine']}",
        "",
        f"Server `{s['server_cmd']}`; mix {s['counts']}; {s['clients']} load process(es); "
        f"RSS sampled every {s['sample_every']:g} s, warm-up {s['warmup']:g} s.",
        "",
        "| RSS after warm-up | start | min | max | end | slope | fitted rise | tolerance "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if rss.get("passed") is None:
        lines.append(f"| MiB | n/a | | | | | | | {rss.get('why', 'n/a')} |")
    else:
        verdict = "flat ✓" if rss["passed"] else "GROWS ✗"
        lines.append(
            f"| MiB | {fmt_mib(rss['start_mib'])} | {fmt_mib(rss['min_mib'])} | "
            f"{fmt_mib(rss['max_mib'])} | {fmt_mib(rss['end_mib'])} | "
            f"{rss['slope_mib_per_min']:+.2f}/min | {rss['fitted_rise_mib']:+.1f} | "
            f"{rss['tolerance_mib']:.1f} ({rss['tolerance_rule']}) | {verdict} |"
        )
    lines += [
        "",
        "| t (s) | RSS (MiB) | server CPU | server waiting for a CPU | sessions live | events/s |",
        "|---|---|---|---|---|---|",
    ]
    digits = 0 if s["sample_every"] >= 1 else 1
    for row in report["timeline"]:
        lines.append(
            f"| {row['t']:.{digits}f} | {row['rss_mib']:,.1f} | {row['cpu_pct']:.0f} % | "
            f"{row['wait_pct']:.0f} % | {row['live']} | {row['events_per_s']:,.0f} |"
        )
    a = report["activity"]
    eo = report["exactly_once"]
    held = {True: "held ✓", False: "FAILED ✗", None: "not exercised"}[eo["held"]]
    lines += [
        "",
        "| activity | |",
        "|---|---|",
        f"| sessions opened | {a['opened']} |",
        f"| server events read (audio) | {a['events']:,} ({a['audio_events']:,}) |",
        f"| audio frames sent / due (skipped: socket backed up) | {a['audio_sent']:,} / "
        f"{a['audio_due']:,} ({a['audio_skipped']:,}) |",
        f"| resumes ok / drops | {a['resumes']:,} / {a['drops']:,} |",
        f"| resume time p50 / p99 / max | {a['resume_ms']} |",
        f"| hostile readers cut by the server | {a['cuts']:,} (after {a['cut_after_s']}) |",
        f"| hostile readers never cut (age at the end) | {a['uncut']} |",
        f"| abuse outcomes | {a['abuse']} |",
        f"| errors | {a['errors'] or 'none'} |",
        f"| load generator | 5 ms ticker late by p99 {a['tick_late_p99_ms']:.1f} ms (worst "
        f"interval), max {a['tick_late_max_ms']:.1f} ms; "
        f"CPU {a['client_cpu_pct']:.0f} % of a core |",
        "",
        f"**Exactly-once (resuming clients): {held}**: {eo['resumes']:,} resumes, "
        f"{eo['sessions_checked']:,} sessions checked to their close, "
        f"{eo['events_checked']:,} events in them ({eo['events_all_readers']:,} read by all "
        f"voice and resume clients); gaps {eo['gaps']}, duplicates {eo['duplicates']}, "
        f"resync_required {eo['resync_required']}, answers out of order "
        f"{eo['answers_out_of_order']}, unanswered {eo['unanswered']}.",
    ]
    for text in eo["violations"]:
        lines.append(f"- {text}")
    after = report.get("rss_after_clients_closed")
    if after is not None:
        lines += [
            "",
            f"RSS once every client had closed its sessions (cut hostile readers' sessions "
            f"still wait out their grace): {after / MiB:,.1f} MiB.",
        ]
    lines += ["", f"**Verdict: {'PASS' if report['passed'] else 'FAIL'}**"]
    for why in report["failures"]:
        lines.append(f"- {why}")
    return "\n".join(lines)


def spread(values: Sequence[float], unit: str) -> str:
    if not values:
        return "none"
    return (
        f"p50 {percentile(values, 50):.1f} {unit}, p99 {percentile(values, 99):.1f} {unit}, "
        f"max {max(values):.1f} {unit}"
    )


def timeline(samples: Sequence[Mapping[str, Any]], rows: int = 12) -> list[dict[str, Any]]:
    """About ``rows`` evenly spaced samples, each with CPU and event rates since the last."""
    if len(samples) < 2:
        return []
    step = max(1, round((len(samples) - 1) / rows))
    picked = list(range(0, len(samples), step))
    if picked[-1] != len(samples) - 1:
        picked.append(len(samples) - 1)
    out = []
    for a, b in itertools.pairwise(picked):
        s0, s1 = samples[a], samples[b]
        dt = max(s1["t"] - s0["t"], 1e-9)
        out.append(
            {
                "t": s1["t"],
                "rss_mib": s1["rss"] / MiB,
                "cpu_pct": 100 * (s1["cpu"] - s0["cpu"]) / dt,
                "wait_pct": 100 * (s1.get("wait", 0.0) - s0.get("wait", 0.0)) / dt,
                "live": s1.get("live", 0),
                "events_per_s": (s1.get("events", 0) - s0.get("events", 0)) / dt,
            }
        )
    return out


# ----------------------------------------------------------------------- the run
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description="Hold many mixed sessions against `trio-duplex serve` and watch its RSS.",
    )
    p.add_argument("--quick", action="store_true", help="100 sessions, 1 minute (unless given)")
    p.add_argument("--sessions", type=int, help="concurrent sessions (1000; quick 100)")
    p.add_argument("--minutes", type=float, help="how long (10; quick 1); fractions allowed")
    p.add_argument(
        "--warmup",
        type=float,
        help="seconds left out of the RSS fit (180, or 30 %% of a shorter run)",
    )
    p.add_argument("--sample-every", type=float, help="seconds between RSS samples (5; quick 2)")
    p.add_argument("--engine", choices=["voice", "echo"], default="voice", help="(voice)")
    p.add_argument("--mix", default=DEFAULT_MIX, help=f"weights of the kinds ({DEFAULT_MIX})")
    p.add_argument("--clients", type=int, default=1, help="load-generator processes (1)")
    p.add_argument(
        "--server-cmd",
        help="command that starts the server (default: python -m trio_duplex serve); "
        "the soak appends --host, --port, --engine, --max-sessions, --drain-timeout, "
        "--log-level",
    )
    p.add_argument(
        "--server-arg", action="append", default=[],
        help="one more argument for the server, after the soak's own (repeatable; "
        "e.g. --server-arg=--journal-ttl=30)",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", help="the server's --log-level (info)")
    p.add_argument(
        "--tolerance-pct", type=float, default=5.0,
        help="RSS may rise by this %% of its value at the end of the warm-up (5) ...",
    )  # fmt: skip
    p.add_argument(
        "--tolerance-mib", type=float, default=16.0,
        help="... or by this many MiB, whichever is larger (16)",
    )  # fmt: skip
    p.add_argument(
        "--lifetime",
        default="60,240",
        help="MIN,MAX seconds a voice or resume session lives (60,240)",
    )
    p.add_argument("--talk", default="1,3", help="MIN,MAX seconds of audio per turn (1,3)")
    p.add_argument(
        "--pause",
        default="60,180",
        help="MIN,MAX seconds a voice session is quiet after a question (60,180)",
    )
    p.add_argument("--resume-pause", default="10,20", help="the same for a resumer (10,20)")
    p.add_argument(
        "--drop-after", default="3,10", help="MIN,MAX seconds from a resume to the next drop (3,10)"
    )
    p.add_argument("--ramp", type=float, help="seconds over which the sessions open (30; quick 5)")
    p.add_argument("--out", type=Path, help="JSON to write (default: benchmarks/results/)")
    p.add_argument("--no-pin", action="store_true", help="do not pin server/clients to cores")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "sessions": 100 if quick else 1000,
        "minutes": 1.0 if quick else 10.0,
        "sample_every": 2.0 if quick else 5.0,
        "ramp": 5.0 if quick else 30.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warmup is None:  # 3 minutes of 10; 30 % of a shorter run
        args.warmup = min(180.0, 0.3 * args.minutes * 60)
    if args.sessions < 1 or args.minutes <= 0 or args.clients < 1 or args.sample_every <= 0:
        p.error("--sessions, --minutes, --clients and --sample-every must be positive")
    if args.warmup >= args.minutes * 60:
        p.error("--warmup must be shorter than the run")
    try:
        args.mix_weights = parse_mix(args.mix)
    except ValueError as exc:
        p.error(str(exc))
    if quick and args.sessions == 100 and args.minutes == 1.0:
        args.plan = "quick"
    elif args.sessions == 1000 and args.minutes == 10.0:
        args.plan = "full"
    else:
        args.plan = "custom"
    return args


def server_argv(args: argparse.Namespace, port: int) -> list[str]:
    head = shlex.split(args.server_cmd) if args.server_cmd else list(DEFAULT_SERVER_CMD)
    flags = [
        "--host", "127.0.0.1",
        "--port", str(port),
        "--engine", args.engine,
        # Hostile readers that were cut wait out their grace detached while their
        # replacements open: room for all of them, so admission is never what is measured.
        "--max-sessions", str(max(4 * args.sessions, 256)),
        "--drain-timeout", "0",  # nothing is measured after the run: stop at once
        "--log-level", args.log_level,
    ]  # fmt: skip
    argv = [*head, *flags, *args.server_arg]
    return argv if args.no_pin else pinned(argv, SERVER_CPU)


def client_argv(args: argparse.Namespace, url: str, share: Sequence[int], seed: int) -> list[str]:
    argv = [
        PY, "-m", "benchmarks.probes.clients.soak_load",
        "--url", url,
        "--counts", ",".join(map(str, share)),
        "--duration", str(args.minutes * 60),
        "--ramp", str(args.ramp),
        "--engine", args.engine,
        "--lifetime", args.lifetime,
        "--talk", args.talk,
        "--pause", args.pause,
        "--resume-pause", args.resume_pause,
        "--drop-after", args.drop_after,
        "--stats-every", str(args.sample_every),
        "--seed", str(seed),
    ]  # fmt: skip
    return argv if args.no_pin else pinned(argv, CLIENT_CPU)


def run_queue_wait(pid: int) -> float:
    """Seconds the process's threads have waited, runnable, for a CPU (0 where Linux does
    not say): on a shared machine, the time other processes took from the server."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[1])
    except OSError:
        return 0.0
    return total / 1e9


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Loads:
    """The load-generator processes and the latest ``@stats`` / the ``@result`` of each."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        self.stats: list[dict[str, Any]] = [{} for _ in procs]
        self.results: list[dict[str, Any] | None] = [None for _ in procs]
        self.ended = [False for _ in procs]

    def poll(self) -> None:
        for i, proc in enumerate(self.procs):
            while True:
                try:
                    line = proc.stdout_q.get_nowait()
                except queue.Empty:
                    break
                if line is None:
                    self.ended[i] = True
                elif line.startswith("@stats "):
                    self.stats[i] = json.loads(line[7:])
                elif line.startswith("@result "):
                    self.results[i] = json.loads(line[8:])

    def latest(self) -> dict[str, Any]:
        """What the load processes said last: events read, sessions live, ticker lateness."""
        counts = merge_counts(s.get("counts", {}) for s in self.stats)
        live = sum(sum(s.get("live", {}).values()) for s in self.stats)
        late = max((s.get("tick_late_p99_ms") or 0.0 for s in self.stats), default=0.0)
        return {"events": counts.get("events", 0), "live": live, "tick_late_p99": late}

    def check(self) -> None:
        for i, proc in enumerate(self.procs):
            if self.ended[i] and self.results[i] is None and not proc.alive():
                raise BenchError(f"{proc.name} exited without a result:\n{proc.tail()}")


def run(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    counts = allocate(args.sessions, args.mix_weights)
    shares = split(counts, min(args.clients, args.sessions))
    seconds = args.minutes * 60
    port = free_port()
    say(f"soak: {args.sessions} sessions {counts}, {seconds:g} s, {len(shares)} load process(es)")
    meter = LoadMeter()
    url = f"ws://127.0.0.1:{port}{PATH}"
    # The probe makes a quieter --log-level (no "serving" line) work too.
    server, _ = start_server("trio-duplex", server_argv(args, port), probe=url)
    samples: list[dict[str, Any]] = []
    failures: list[str] = []
    loads = Loads([])
    try:
        loads = Loads(
            [
                Proc(f"soak load {i}", client_argv(args, url, share, args.seed + i),
                     stdout_lines=True)
                for i, share in enumerate(shares)
            ]
        )  # fmt: skip
        t0 = time.monotonic()
        next_at = 0.0
        while True:
            loads.poll()
            loads.check()
            now = time.monotonic() - t0
            if now >= next_at:
                snap = server.snapshot()
                sample = {
                    "t": round(now, 2),
                    "rss": snap["rss"],
                    "cpu": snap["cpu"],
                    "wait": run_queue_wait(server.pid),
                }
                sample.update(loads.latest())
                samples.append(sample)
                if len(samples) % max(1, round(30 / args.sample_every)) == 0:
                    say(
                        f"  t={now:5.0f}s rss={snap['rss'] / MiB:,.1f} MiB "
                        f"sessions={sample['live']} events={sample['events']:,}"
                    )
                next_at += args.sample_every
                if next_at > seconds + 1e-6:
                    break
            time.sleep(min(0.1, max(0.0, next_at - (time.monotonic() - t0))))
        # The load processes now close their sessions and report.
        deadline = time.monotonic() + 60
        while not all(r is not None for r in loads.results) and time.monotonic() < deadline:
            loads.poll()
            loads.check()
            if not server.alive():
                raise BenchError(f"the server died\n{server.tail()}")
            time.sleep(0.1)
        if not all(r is not None for r in loads.results):
            raise BenchError("a load process did not report within 60 s of the end")
        after = server.snapshot()
    except BenchError as exc:
        failures.append(str(exc).splitlines()[0])
        say(f"soak: {exc}")
        after = None
    finally:
        for proc in loads.procs:
            proc.stop(grace=2.0)
        server.stop()
    background = meter.read()
    results = [r for r in loads.results if r is not None]
    totals = merge_counts(r["counts"] for r in results)
    violations = [v for r in results for v in r.get("violations", [])]
    cut_ages = [x for r in results for x in r.get("hostile_cut_ages_s", [])]
    uncut_ages = [x for r in results for x in r.get("hostile_uncut_ages_s", [])]
    resume_ms = [x for r in results for x in r.get("resume_ms", [])]
    rss = rss_verdict(samples, args.warmup, args.tolerance_pct, args.tolerance_mib)
    eo = exactly_once(totals, violations, counts["resume"])
    if rss.get("passed") is False:
        failures.append(
            f"RSS rose {rss['fitted_rise_mib']:+.1f} MiB after the warm-up "
            f"(tolerance {rss['tolerance_mib']:.1f} MiB)"
        )
    elif rss.get("passed") is None and not failures:
        failures.append(f"no RSS verdict: {rss.get('why')}")
    if eo["held"] is False:
        failures.append("exactly-once failed for the resuming clients" if eo["resumes"] else
                        "no resume succeeded, so exactly-once was not shown")  # fmt: skip
    elapsed = samples[-1]["t"] if samples else 0.0
    client_cpu = sum(r.get("cpu_s", 0.0) for r in results)
    activity = {
        "opened": {k: totals.get(f"{k}.opened", 0) for k in KINDS},
        "events": totals.get("events", 0),
        "audio_events": totals.get("events.audio", 0),
        "audio_sent": totals.get("audio.sent", 0),
        "audio_due": totals.get("audio.due", 0),
        "audio_skipped": totals.get("audio.skipped", 0),
        "resumes": totals.get("resume.ok", 0),
        "drops": totals.get("resume.drops", 0),
        "resume_ms": spread(resume_ms, "ms"),
        "cuts": totals.get("hostile.cut", 0),
        "cut_after_s": spread(cut_ages, "s"),
        "uncut": f"{len(uncut_ages)} ({spread(uncut_ages, 's')})",
        "abuse": {k.removeprefix("abuse."): v for k, v in totals.items() if k.startswith("abuse.")},
        "errors": problems(totals),
        # The worst 5-second interval's p99 of the 5 ms ticker's lateness, and its max.
        "tick_late_p99_ms": max((s.get("tick_late_p99", 0.0) for s in samples), default=0.0),
        "tick_late_max_ms": max((r.get("tick_late_max_ms") or 0.0 for r in results), default=0.0),
        "client_cpu_pct": 100 * client_cpu / max(elapsed, 1e-9),
    }
    report: dict[str, Any] = {
        "settings": {
            "sessions": args.sessions,
            "seconds": seconds,
            "engine": args.engine,
            "counts": counts,
            "clients": len(shares),
            "sample_every": args.sample_every,
            "warmup": args.warmup,
            "server_cmd": shlex.join(server_argv(args, port)),
            "tolerance_pct": args.tolerance_pct,
            "tolerance_mib": args.tolerance_mib,
            "lifetime": args.lifetime,
            "talk": args.talk,
            "pause": args.pause,
            "resume_pause": args.resume_pause,
            "drop_after": args.drop_after,
            "plan": args.plan,
        },
        "rss": rss,
        "timeline": timeline(samples),
        "activity": activity,
        "exactly_once": eo,
        "failures": failures,
        "passed": not failures,
        "samples": samples,
        "rss_after_clients_closed": after["rss"] if after else None,
        "counts": totals,
        "hostile_cut_ages_s": cut_ages,
        "resume_ms": resume_ms,
        "load_results": results,
        "background_load": background,
        "machine": machine_info(),
    }
    return report, 0 if report["passed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install_reaper()
    raise_nofile()  # children inherit it
    started = datetime.datetime.now(datetime.UTC)
    try:
        report, status = run(args)
    except BenchError as exc:  # the server never came up
        say(f"soak: {exc}")
        return 1
    finally:
        stop_all()
    report["started"] = started.isoformat()
    report["command"] = "python -m benchmarks.soak " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    report["cwd"] = str(ROOT)
    out = args.out or RESULTS / f"soak-{started.strftime('%Y%m%dT%H%M%SZ')}-{args.plan}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(markdown(report))
    bg = report["background_load"]
    print(
        f"\nbackground: other processes used {bg['other_share']:.0%} of the machine, "
        f"steal {bg['steal_share']:.0%}\nresults: {out}"
    )
    return status


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    stop_all()
    print("interrupted: every process this run started has been stopped", file=sys.stderr)
    sys.exit(130)
