"""The suite's scenarios 1-7 (8 is ``_dialects``). Each runs its variants interleaved and
adds report rows.

Scenario 7 (the Socket.IO peer) rides along in 1 and 4: its server takes its turn in the
same rounds, so its figures are interleaved with ours like every other baseline.

Both dialects are in scenarios 1 and 7: the OpenAI dialect (``/v1/realtime``) runs
scenario 8's text turns (``clients/dialects.py``: ``conversation.item.create`` and
``response.create``, answered by 12 server events) in the same rounds, since an OpenAI
session converses and has no one-for-one echo. Its rows count **every event either way**
(every WebSocket message, client's and server's) for every server: an echo is two events
(the event and its echo), a text turn 14. The native rows count echoes, each once (the
same ratio as counting either way, since both sides echo).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.suite._plan import geometric_steps
from benchmarks.suite._procs import Proc
from benchmarks.suite._stats import TIMES, Row, Summary, largest_passing, paired_ratios
from benchmarks.suite._suite import NAMES, Suite, Variant, server_cpu

Runs = list[dict[str, Any] | None]

BINARY_LANE = "trio-duplex binary lane"


def col(runs: Runs, f: Callable[[dict[str, Any]], float]) -> list[float | None]:
    out: list[float | None] = []
    for r in runs:
        try:
            out.append(None if r is None else f(r))
        except (KeyError, ZeroDivisionError, TypeError):
            out.append(None)
    return out


def row(
    suite: Suite,
    scenario: str,
    metric: str,
    ours: Sequence[float | None],
    base_name: str,
    base: Sequence[float | None],
    **kw: Any,
) -> Row:
    r = Row(
        scenario=scenario,
        metric=metric,
        ours=Summary.of(x for x in ours if x is not None),
        baseline_name=base_name,
        baseline=Summary.of(x for x in base if x is not None),
        ratio=Summary.of(paired_ratios(ours, base)),
        **kw,
    )
    suite.rows.append(r)
    return r


def per10k(events_key: str = "events") -> Callable[[dict[str, Any]], float]:
    return lambda r: server_cpu(r) * 10_000 / r[events_key]


def client_per10k(r: dict[str, Any]) -> float:
    return float(r["client_cpu"]) * 10_000 / float(r["events"])


OPENAI_TURNS = "trio-duplex OpenAI dialect (text turns, websockets client)"
EITHER_WAY = "every event either way: an echo is 2, an OpenAI text turn 2 in + 12 out"


def either_way(r: dict[str, Any]) -> float:
    """Every event either way in a run's window: a turns run's client and server events
    (``clients/dialects.py``), an echo run's two per echo (its event and the echo)."""
    if "server_events" in r:
        return float(r["client_events"]) + float(r["server_events"])
    return 2.0 * float(r["events"])


def either_way_per_cpu(r: dict[str, Any]) -> float:
    """Events either way per server CPU-second (``either_way``)."""
    return either_way(r) / server_cpu(r)


# --------------------------------------------------------------------------- 1 and 7
def throughput(suite: Suite) -> None:
    p = suite.plan
    common = ["--warmup", str(p.tp_warmup), "--duration", str(p.tp_duration)]
    common += ["--window", str(p.tp_window), "--ack-every", str(p.ack_every)]
    timeout = 30 + p.tp_warmup + p.tp_duration

    def py(module: str, proto: str) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client(module, ["throughput", "--url", url, "--proto", proto, *common])
            result, marks = suite.client(argv, watch=proc, timeout=timeout)
            return {**result, "server": marks}

        return run

    def sio(proc: Proc, url: str) -> dict[str, Any]:
        base = url.split("/socket.io")[0]
        argv = suite.node_client(["throughput", "--url", base, *common[:6]])
        result, marks = suite.client(argv, watch=proc, timeout=timeout)
        return {**result, "server": marks}

    def openai(proc: Proc, url: str) -> dict[str, Any]:
        from benchmarks.suite._dialects import dialect_url

        argv = suite.py_client("dialects", [
            "turns", "--url", dialect_url(url, "openai"), "--dialect", "openai", *common[:4],
            "--window", str(p.dialect_window), "--ack-every", str(p.ack_every),
        ])  # fmt: skip
        result, marks = suite.client(argv, watch=proc, timeout=timeout)
        return {**result, "server": marks}

    variants = [
        Variant("trio-duplex (trio-websocket client)", "duplex", py("trio_ws", "duplex")),
        Variant("bare trio-websocket pair", "bare_trio", py("trio_ws", "bare")),
        Variant("trio-duplex (websockets client)", "duplex", py("asyncio_ws", "duplex")),
        Variant("bare websockets pair", "bare_asyncio", py("asyncio_ws", "bare")),
        Variant("Socket.IO 4.8 (node client)", "socketio", sio),
        Variant(OPENAI_TURNS, "duplex", openai),
    ]
    runs = suite.interleave("1 throughput", variants, p.tp_rounds)
    us, bare, us_ws, ceiling, peer, us_openai = (runs[v.name] for v in variants)
    rate = lambda r: float(r["rate"])  # noqa: E731
    for r in (*us, *us_ws, *us_openai):
        if r and r.get("errors"):
            suite.say(f"1 throughput: trio-duplex answered errors {r['errors']}")

    row(
        suite,
        "1",
        "events/s, 100-byte echo, pipelined",
        col(us, rate),
        "bare trio-websocket pair",
        col(bare, rate),
        target=f"≥ 0.9{TIMES}",
        target_ratio=0.9,
    )
    row(
        suite,
        "1",
        "server CPU s / 10k events",
        col(us, per10k()),
        "bare trio-websocket pair",
        col(bare, per10k()),
        higher_is_better=False,
        unit="s",
    )
    row(
        suite,
        "1",
        "client CPU s / 10k events",
        col(us, client_per10k),
        "bare trio-websocket pair",
        col(bare, client_per10k),
        higher_is_better=False,
        unit="s",
    )
    row(
        suite,
        "1",
        "events/s, websockets client both sides",
        col(us_ws, rate),
        "bare websockets pair (ceiling)",
        col(ceiling, rate),
    )
    row(
        suite,
        "1",
        "server CPU s / 10k events (websockets client)",
        col(us_ws, per10k()),
        "bare websockets pair (ceiling)",
        col(ceiling, per10k()),
        higher_is_better=False,
        unit="s",
    )
    row(
        suite,
        "1",
        "events per server CPU-second, every event either way, OpenAI dialect (text turns)",
        col(us_openai, either_way_per_cpu),
        "bare websockets pair (an echo: 2 events)",
        col(ceiling, either_way_per_cpu),
        target=f"≥ 1.25{TIMES}",
        target_ratio=1.25,
        note=EITHER_WAY,
    )

    peer_name = NAMES["socketio"]
    if not suite.available("socketio"):
        suite.say(f"7 peer throughput skipped: {suite.missing['socketio']}")
        return
    eff = lambda r: r["events"] / server_cpu(r)  # noqa: E731
    row(
        suite,
        "7",
        "events/s, same workload",
        col(us_ws, rate),
        peer_name,
        col(peer, rate),
        note="ours with the websockets client; Socket.IO with its node client",
    )
    row(
        suite,
        "7",
        "events per server CPU-second, an echo counted once (native dialect)",
        col(us_ws, eff),
        peer_name,
        col(peer, eff),
        target=f"> 1.0{TIMES}",
        target_ratio=1.0,
        note="native dialect; an echo counted once both sides (either way: 2 each, same ratio)",
    )
    row(
        suite,
        "7",
        "events per server CPU-second, every event either way, OpenAI dialect (text turns)",
        col(us_openai, either_way_per_cpu),
        f"{peer_name} (an echo: 2 events)",
        col(peer, either_way_per_cpu),
        target=f"≥ 1.0{TIMES}",
        target_ratio=1.0,
        note=EITHER_WAY,
    )
    row(
        suite,
        "7",
        "server CPU s / 10k events",
        col(us_ws, per10k()),
        peer_name,
        col(peer, per10k()),
        higher_is_better=False,
        unit="s",
    )
    row(suite, "7", "client CPU s / 10k events", col(us_ws, client_per10k), peer_name,
        col(peer, client_per10k), higher_is_better=False, unit="s")  # fmt: skip


# --------------------------------------------------------------------------------- 2
def latency(suite: Suite) -> None:
    p = suite.plan
    args = ["--samples", str(p.lat_samples), "--warmup-events", str(p.lat_warmup)]
    args += ["--ack-every", str(p.ack_every)]

    def run_for(proto: str) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("trio_ws", ["latency", "--url", url, "--proto", proto, *args])
            result, marks = suite.client(argv, watch=proc, timeout=90)
            return {**result, "server": marks}

        return run

    variants = [
        Variant("trio-duplex", "duplex", run_for("duplex")),
        Variant("bare trio-websocket pair", "bare_trio", run_for("bare")),
    ]
    runs = suite.interleave("2 latency", variants, p.lat_rounds)
    us, bare = runs["trio-duplex"], runs["bare trio-websocket pair"]
    for key, label in (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")):
        get = lambda r, k=key: float(r[k])  # noqa: E731
        row(suite, "2", f"round trip {label}", col(us, get), "bare trio-websocket pair",
            col(bare, get), higher_is_better=False, unit="µs")  # fmt: skip


# --------------------------------------------------------------------------------- 3
def voice(suite: Suite) -> None:
    p = suite.plan
    # name -> (server kind, --proto, --lane): trio-duplex's two audio lanes (protocol v2's
    # binary lane, v1's base64 JSON) and the bare trio-websocket echo of the JSON text.
    kinds = {
        BINARY_LANE: ("duplex", "duplex", "binary"),
        "trio-duplex": ("duplex", "duplex", "json"),
        "bare trio-websocket": ("bare_trio", "bare", "json"),
    }
    found: dict[str, list[float | None]] = {name: [] for name in kinds}
    ramps: dict[str, list[dict[str, Any]]] = {name: [] for name in kinds}

    def ramp(name: str, steps: list[int]) -> Callable[[Proc, str], dict[str, Any]]:
        _, proto, lane = kinds[name]

        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("asyncio_ws", [
                "voice", "--url", url, "--proto", proto, "--lane", lane,
                "--steps", ",".join(map(str, steps)),
                "--settle", str(p.voice_settle), "--measure", str(p.voice_measure),
                "--threshold-ms", str(p.voice_threshold_ms), "--ramp-time", str(p.voice_ramp_time),
                "--ack-every", str(p.voice_ack_every), "--max-time", str(p.voice_ramp_time + 60),
            ])  # fmt: skip
            result, marks = suite.client(argv, watch=proc, timeout=p.voice_ramp_time + 90)
            for step in result["steps"]:
                mark = step.get("mark", step["sessions"])
                a, b = marks.get(f"start_{mark}"), marks.get(f"end_{mark}")
                if a and b:
                    step["server_cpu_util"] = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"])
                    step["server_rss"] = b["rss"]
            return result

        return run

    def largest(name: str, result: dict[str, Any] | None) -> float | None:
        if not result:
            return None
        last = result["steps"][-1] if result["steps"] else None
        if last and last["p99_ms"] > p.voice_threshold_ms and last.get("server_cpu_util", 1) < 0.8:
            suite.say(
                f"3 voice: {name} passed {p.voice_threshold_ms:g} ms at {last['sessions']} "
                f"sessions while its server was only {last['server_cpu_util']:.0%} busy: "
                "the latency came from CPU contention, not from the server"
            )
        steps = [(s["sessions"], s["p99_ms"]) for s in result["steps"]]
        best = largest_passing(steps, p.voice_threshold_ms)
        if best == 0:  # failed at its first step: the ramp found nothing, it is not "0"
            first = steps[0][0] if steps else "?"
            suite.say(f"3 voice: a {name} ramp failed at its first step ({first}); run dropped")
            return None
        return float(best)

    coarse = geometric_steps(p.voice_coarse_start, p.voice_coarse_factor, p.voice_max_sessions)
    variants = [Variant(name, kinds[name][0], ramp(name, coarse)) for name in kinds]
    t0 = time.monotonic()
    runs = suite.interleave("3 voice (coarse ramp)", variants, 1)
    slowest = time.monotonic() - t0
    for name in kinds:
        for result in runs[name]:
            found[name].append(largest(name, result))
            if result:
                ramps[name].append({"phase": "coarse", **result})
    # Fine ramps: from 70% of what the coarse ramp found, in small steps.
    fine_done = 0
    for i in range(p.voice_fine_rounds):
        if suite.time_left() < slowest * 0.8:  # a fine round is shorter than the coarse one
            suite.say(f"3 voice: {i} of {p.voice_fine_rounds} fine ramps fit the time budget")
            break
        variants = []
        for name in kinds:
            hit = found[name][0] or p.voice_coarse_start
            start = max(1, int(hit * 0.7))
            steps = geometric_steps(start, p.voice_fine_factor, p.voice_max_sessions)
            variants.append(Variant(name, kinds[name][0], ramp(name, steps)))
        t0 = time.monotonic()
        runs = suite.interleave("3 voice (fine ramp)", variants, 1)
        slowest = max(slowest * 0.8, time.monotonic() - t0)
        fine_done += 1
        for name in kinds:
            for result in runs[name]:
                found[name].append(largest(name, result))
                if result:
                    ramps[name].append({"phase": "fine", **result})
    # With fine ramps, they decide; the coarse one only located the knee.
    pick = slice(1, None) if fine_done else slice(None)
    us, bare = found["trio-duplex"][pick], found["bare trio-websocket"][pick]
    binary = found[BINARY_LANE][pick]
    suite.raw["3 voice"] = {"ramps": ramps, "largest": found}
    limit = f"p99 ≤ {p.voice_threshold_ms:g} ms (server on 1 core)"
    note = "largest N of the ramp whose p99 added latency held"
    row(
        suite,
        "3",
        f"voice sessions with {limit}",
        us,
        "bare trio-websocket",
        bare,
        target=f"≥ 1.0{TIMES}",
        target_ratio=1.0,
        note=f"JSON lane (base64); {note}",
    )
    row(
        suite,
        "3",
        f"voice sessions per core, binary lane, {limit}",
        binary,
        "bare trio-websocket",
        bare,
        target=f"≥ 1.5{TIMES}",
        target_ratio=1.5,
        note=f"protocol v2's binary lane against the bare echo of the JSON text; {note}",
    )
    row(
        suite,
        "3",
        "voice sessions per core, binary lane",
        binary,
        "trio-duplex JSON lane",
        us,
        note="the same server, audio as binary messages instead of base64 JSON",
    )


# ------------------------------------------------------------------------------ 4 and 7
def idle(suite: Suite) -> None:
    p = suite.plan
    n = p.idle_count

    def py(proto: str) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("asyncio_ws", [
                "idle", "--url", url, "--proto", proto, "--count", str(n),
                "--open-concurrency", str(p.idle_open_concurrency),
                "--settle", str(p.idle_settle), "--max-time", str(p.idle_open_limit + 60),
                "--open-time-limit", str(p.idle_open_limit),
            ])  # fmt: skip
            result, marks = suite.client(argv, watch=proc, timeout=p.idle_open_limit + 90)
            return {**result, "server": marks}

        return run

    def sio(proc: Proc, url: str) -> dict[str, Any]:
        base = url.split("/socket.io")[0]
        argv = suite.node_client([
            "idle", "--url", base, "--count", str(n),
            "--open-concurrency", str(p.idle_open_concurrency),
            "--settle", str(p.idle_settle), "--gc", "1", "--max-time", str(p.idle_open_limit + 60),
            "--open-time-limit", str(p.idle_open_limit),
        ])  # fmt: skip
        result, marks = suite.client(argv, watch=proc, timeout=p.idle_open_limit + 90)
        return {**result, "server": marks}

    variants = [
        Variant("trio-duplex", "duplex", py("duplex")),
        Variant("bare trio-websocket", "bare_trio", py("bare")),
        Variant("Socket.IO 4.8", "socketio", sio),
    ]
    runs = suite.interleave(f"4 idle ({n:,} sessions)", variants, p.idle_rounds)
    us, bare, peer = (runs[v.name] for v in variants)

    def kb_per(r: dict[str, Any]) -> float:
        if r["count"] < n / 2:
            raise KeyError("too few opened to judge")
        m = r["server"]
        return float((m["settled"]["rss"] - m["before_open"]["rss"]) / r["count"] / 1024)

    opened = lambda r: float(r["open_seconds"]) if r["count"] == n else math.nan  # noqa: E731
    for name, rs in (("trio-duplex", us), ("bare trio-websocket", bare), ("Socket.IO", peer)):
        for r in rs:
            if r and (r["count"] < n or r.get("failures")):
                suite.say(
                    f"4 idle: {name} opened {r['count']:,} of {n:,} in "
                    f"{r['open_seconds']:.0f}s (limit {p.idle_open_limit:g}s); "
                    f"failures {r.get('failures') or 'none'}; RSS/session uses the count opened"
                )
    row(
        suite,
        "4",
        f"server RSS per idle session ({n:,})",
        col(us, kb_per),
        "bare trio-websocket",
        col(bare, kb_per),
        higher_is_better=False,
        unit="KB",
        target="≤ 25 KB",
        target_abs=25.0,
    )
    row(
        suite,
        "4",
        f"time to open {n:,} sessions",
        col(us, opened),
        "bare trio-websocket",
        col(bare, opened),
        higher_is_better=False,
        unit="s",
    )
    if suite.available("socketio"):
        row(
            suite,
            "7",
            f"server memory per connection ({n:,})",
            col(us, kb_per),
            NAMES["socketio"],
            col(peer, kb_per),
            higher_is_better=False,
            unit="KB",
            note="Socket.IO's RSS sampled after a forced GC",
        )
    else:
        suite.say(f"7 peer memory skipped: {suite.missing['socketio']}")  # fmt: skip


# --------------------------------------------------------------------------------- 5
def handshake(suite: Suite) -> None:
    p = suite.plan

    def run_for(proto: str) -> Callable[[Proc, str], dict[str, Any]]:
        def run(proc: Proc, url: str) -> dict[str, Any]:
            argv = suite.py_client("asyncio_ws", [
                "handshake", "--url", url, "--proto", proto, "--warmup", "0.3",
                "--duration", str(p.hs_duration), "--concurrency", str(p.hs_concurrency),
            ])  # fmt: skip
            result, marks = suite.client(argv, watch=proc, timeout=60)
            return {**result, "server": marks}

        return run

    variants = [
        Variant("trio-duplex", "duplex", run_for("duplex")),
        Variant("bare trio-websocket", "bare_trio", run_for("bare")),
    ]
    runs = suite.interleave("5 handshake", variants, p.hs_rounds)
    us, bare = runs["trio-duplex"], runs["bare trio-websocket"]
    rate = lambda r: float(r["rate"])  # noqa: E731
    p99 = lambda r: float(r["p99_ms"])  # noqa: E731
    row(
        suite,
        "5",
        "sessions opened+closed per second",
        col(us, rate),
        "bare trio-websocket",
        col(bare, rate),
        note="bare: connect, 2 echo round trips, close",
    )
    row(suite, "5", "p99 time to session.created", col(us, p99), "bare trio-websocket",
        col(bare, p99), higher_is_better=False, unit="ms",
        note="bare: time to first echo")  # fmt: skip
    cpu_ms = lambda r: server_cpu(r) * 1000 / r["cycles"]  # noqa: E731
    row(
        suite,
        "5",
        "server CPU per session opened+closed",
        col(us, cpu_ms),
        "bare trio-websocket",
        col(bare, cpu_ms),
        higher_is_better=False,
        unit="ms",
    )


# --------------------------------------------------------------------------------- 6
def resume(suite: Suite) -> None:
    p = suite.plan
    results: list[dict[str, Any]] = []
    if not suite.available("duplex"):
        suite.say(f"6 resume skipped: {suite.missing['duplex']}")
        return
    try:
        with (
            suite.server("duplex") as (us_proc, us_url),
            suite.server("bare_trio") as (_, bare_url),
        ):
            shares = {0: 0.15, 100: 0.2}  # of the time left; the big K gets the rest
            for k, trials in p.resume_trials:
                left = suite.time_left()
                soft = max(3.0, left * shares[k] if k in shares else left - 3)
                argv = suite.py_client("asyncio_ws", [
                    "resume", "--k", str(k), "--trials", str(trials),
                    "--window", str(p.resume_window), "--trial-time", f"{soft:.1f}",
                    "--max-time", f"{soft + 60:.1f}",
                    "--target", f"duplex={us_url}", "--target", f"bare={bare_url}",
                ])  # fmt: skip
                result, _ = suite.client(argv, watch=us_proc, timeout=soft + 90)
                results.append(result)
                print(f"  6 resume: K={k} done", file=sys.stderr, flush=True)
    except Exception as exc:
        suite.fail("6 resume", exc)
    suite.raw["6 resume"] = results
    for result in results:
        k = result["k"]
        us, bare = result["duplex"], result["bare"]
        for q in ("p50", "p99"):
            target: dict[str, Any] = {}
            if k == 100 and q == "p99":
                target = {"target": "< 10 ms", "target_abs": 10.0}
            suite.rows.append(Row(
                scenario="6",
                metric=f"resume K={k:,}: {q} to last replayed event",
                ours=Summary.of([us[f"{q}_ms"]]),
                baseline_name="bare: connect + 1 echo + K frames",
                baseline=Summary.of([bare[f"{q}_ms"]]),
                ratio=Summary.of([us[f"{q}_ms"] / bare[f"{q}_ms"]]),
                higher_is_better=False,
                unit="ms",
                note=f"{us['trials']} trials each, interleaved",
                **target,
            ))  # fmt: skip


SCENARIOS: dict[str, Callable[[Suite], None]] = {
    "1": throughput,
    "2": latency,
    "3": voice,
    "4": idle,
    "5": handshake,
    "6": resume,
}
