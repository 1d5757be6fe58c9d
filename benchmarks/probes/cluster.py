"""Cluster mode on Redis: what a relayed resume, a relayed event and a drain cost.

    python -m benchmarks.cluster [--sessions 100] [--k 1,100] [--rounds 3] [--nice -10]
                                 [--only resume,throughput,migrate]

One ``redis-server`` (no persistence, a free port) and ``trio-duplex serve --cluster``
nodes on 127.0.0.1, all started and stopped here; the load generator
(``benchmarks/probes/clients/cluster_load.py``) runs in its own process, niced ``--load-nice``
(10) above the servers so that, where they compete for the 2 cores, the servers win.

``resume``
    Nodes A and B (echo engine). Per round and journal depth K, ``--sessions`` sessions
    opened on A are resumed on A (home) and as many on B (relayed to A), alternating
    which goes first: from sending ``session.resume`` to ``session.resumed``, to the
    first replayed event and to the K-th; p50/p99 per round, relayed ÷ home per round.
``throughput``
    Nodes A and B (echo). ``--streams`` sessions pipeline echo events (``--window`` in
    flight each) for ``--seconds``, direct to A or through B, alternating per round:
    events/s, round trips p50/p99, each server's CPU per event (psutil, sampled at the
    window's edges), then ``--pings`` one-at-a-time round trips per path.
``migrate``
    Nodes A, B, C (voice engine). ``--sessions`` voice sessions on A, each speaking a long
    text on the binary lane; SIGTERM to A; each client that hears ``session.going_away``
    resumes on B or C when A closes it. Per session: going_away to ``session.resumed``
    and to the next audio frame, p50/p99; and every server_event_seq checked gapless and
    duplicate-free across the move (any violation is printed loudly).

Results: Markdown tables on stdout, everything in
``benchmarks/results/cluster-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

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
    run_to_result,
    start_server,
)
from benchmarks.suite._stats import Summary, fmt_num, fmt_ratio, fmt_summary, paired_ratios
from benchmarks.suite._suite import duplex_flags

SECRET = "benchmark-cluster-secret-not-for-production"
SCENARIOS = ("resume", "throughput", "migrate")


# -------------------------------------------------------------------------- processes
NODE_LOG_LEVEL = os.environ.get("BENCH_NODE_LOG_LEVEL", "warning")
NODE_LOG_DIR = os.environ.get("BENCH_NODE_LOG_DIR")  # keep each node's log there


def node_argv(name: str, port: int, store: str, engine: str, drain_timeout: float) -> list[str]:
    flags = duplex_flags(port)
    flags[flags.index("--log-level") + 1] = NODE_LOG_LEVEL
    flags[flags.index("--engine") + 1] = engine
    flags[flags.index("--drain-timeout") + 1] = f"{drain_timeout:g}"
    return [
        *(PY, "-m", "trio_duplex", "serve", *flags),
        *("--cluster", store, "--cluster-secret", SECRET, "--node-id", name),
        *("--relay-port", "0"),
    ]


@contextmanager
def nodes(
    names: Sequence[str], store: str, engine: str, drain_timeout: float = 5.0
) -> Iterator[dict[str, tuple[Proc, str]]]:
    """The nodes, started side by side (each waits for its port), always stopped."""
    started: dict[str, tuple[Proc, str]] = {}
    failures: list[BaseException] = []

    def start(name: str) -> None:
        port = free_port()
        url = f"ws://127.0.0.1:{port}/v1/duplex"
        try:
            started[name] = start_server(
                f"node {name}", node_argv(name, port, store, engine, drain_timeout), probe=url
            )
        except BaseException as exc:  # re-raised below, in the calling thread
            failures.append(exc)

    threads = [threading.Thread(target=start, args=(name,)) for name in names]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        yield {name: started[name] for name in names}
    finally:
        for name, (proc, _) in started.items():
            proc.stop()
            if NODE_LOG_DIR:  # every line the node logged, for a post-mortem
                with open(Path(NODE_LOG_DIR) / f"{name}.log", "a") as f:
                    while True:
                        try:
                            line = proc.lines.get_nowait()
                        except queue.Empty:
                            break
                        if line is None:
                            break
                        f.write(line)


def run_load(
    argv: Sequence[str], watch: dict[str, Proc], timeout: float
) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, float]]]]:
    """Run the load generator to its end; at each ``@mark NAME`` sample every watched
    process (CPU seconds, RSS). Returns its ``@result`` and the samples by mark."""
    marks: dict[str, dict[str, dict[str, float]]] = {}

    def on_mark(mark: str) -> None:
        sample = {}
        for name, proc in watch.items():
            try:
                sample[name] = proc.snapshot()
            except BenchError:
                pass  # gone (the drained node): its figures are simply absent
        marks[mark] = sample

    result = run_to_result("the load generator", argv, on_mark=on_mark, timeout=timeout, echo=True)
    return result, marks


def load_argv(mode: str, args: argparse.Namespace, *extra: str) -> list[str]:
    return [
        *(PY, "-m", "benchmarks.probes.clients.cluster_load", mode),
        *("--nice", str(args.load_nice), "--rounds", str(args.rounds)),
        *extra,
    ]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- figures
def summary(rounds: Sequence[dict[str, Any]], *keys: str) -> Summary:
    values = []
    for r in rounds:
        v: Any = r
        for k in keys:
            v = v[k]
        values.append(float(v))
    return Summary.of(values)


def ratio(rounds: Sequence[dict[str, Any]], ours: Sequence[str], base: Sequence[str]) -> Summary:
    def get(r: dict[str, Any], keys: Sequence[str]) -> float:
        v: Any = r
        for k in keys:
            v = v[k]
        return float(v)

    return Summary.of(paired_ratios([get(r, ours) for r in rounds], [get(r, base) for r in rounds]))


def resume_table(result: dict[str, Any]) -> str:
    lines = [
        "| K | from `session.resume` sent to | q | via the home (A) | relayed (B → A) "
        "| relayed ÷ home |",
        "|---|---|---|---|---|---|",
    ]
    names = {
        "to_resumed": "`session.resumed`",
        "to_first": "first replayed event",
        "to_last": "K-th replayed event",
    }
    for k, rounds in result["rounds"].items():
        for key, label in names.items():
            if key == "to_last" and k == "1":
                continue  # the first is the last
            for q in ("p50_ms", "p99_ms"):
                home = summary(rounds, "home", key, q)
                relayed = summary(rounds, "relayed", key, q)
                r = ratio(rounds, ("relayed", key, q), ("home", key, q))
                lines.append(
                    f"| {k} | {label} | {q[:3]} | {fmt_summary(home, 'ms')} "
                    f"| {fmt_summary(relayed, 'ms')} | {fmt_ratio(r)} |"
                )
        for q in ("p50_ms",):
            home = summary(rounds, "home", "connect", q)
            relayed = summary(rounds, "relayed", "connect", q)
            lines.append(
                f"| {k} | (before: TCP + WebSocket connect) | p50 | {fmt_summary(home, 'ms')} "
                f"| {fmt_summary(relayed, 'ms')} | |"
            )
    return "\n".join(lines)


def cpu_per_event(marks: dict[str, Any], path: str, r: int, node: str, events: int) -> float:
    try:
        a = float(marks[f"{path}-{r}-start"][node]["cpu"])
        b = float(marks[f"{path}-{r}-end"][node]["cpu"])
    except KeyError:
        return float("nan")
    return (b - a) * 1e6 / max(events, 1)


def throughput_table(result: dict[str, Any], marks: dict[str, Any]) -> str:
    rounds = result["rounds"]
    for n, rnd in enumerate(rounds):
        for path in ("direct", "relayed"):
            ev = rnd[path]["events"]
            rnd[path]["cpu_us_a"] = cpu_per_event(marks, path, n, "A", ev)
            rnd[path]["cpu_us_b"] = cpu_per_event(marks, path, n, "B", ev)
            rnd[path]["cpu_us_total"] = rnd[path]["cpu_us_a"] + rnd[path]["cpu_us_b"]
    rows = [
        ("events/s (pipelined)", ("events_per_s",), ""),
        ("round trip p50, pipelined", ("rtt", "p50_ms"), "ms"),
        ("round trip p99, pipelined", ("rtt", "p99_ms"), "ms"),
        ("round trip p50, one in flight", ("ping", "p50_ms"), "ms"),
        ("round trip p99, one in flight", ("ping", "p99_ms"), "ms"),
        ("server CPU per event, home (A)", ("cpu_us_a",), "µs"),
        ("server CPU per event, relaying node (B)", ("cpu_us_b",), "µs"),
        ("server CPU per event, both", ("cpu_us_total",), "µs"),
    ]
    lines = ["| figure | direct to A | through B | through ÷ direct |", "|---|---|---|---|"]
    for label, keys, unit in rows:
        direct = summary(rounds, "direct", *keys)
        relayed = summary(rounds, "relayed", *keys)
        rr = ratio(rounds, ("relayed", *keys), ("direct", *keys))
        lines.append(
            f"| {label} | {fmt_summary(direct, unit)} | {fmt_summary(relayed, unit)} "
            f"| {fmt_ratio(rr) if direct.median else 'n/a'} |"
        )
    errors: dict[str, int] = {}
    for rnd in rounds:
        for path in ("direct", "relayed"):
            if rnd[path].get("seq_violations"):
                errors[f"{path}: server_event_seq not consecutive"] = (
                    errors.get(f"{path}: server_event_seq not consecutive", 0)
                    + rnd[path]["seq_violations"]
                )
            for code, n in rnd[path]["errors"].items():
                errors[f"{path}: {code}"] = errors.get(f"{path}: {code}", 0) + n
    if errors:
        lines.append(f"\nerrors seen: {errors}")
    return "\n".join(lines)


def migrate_table(runs: Sequence[dict[str, Any]]) -> str:
    rows = [
        ("SIGTERM → session.going_away", "sigterm_to_going_away"),
        ("going_away → close (1001)", "going_away_to_close"),
        ("going_away → `session.resumed` on B or C", "going_away_to_resumed"),
        ("going_away → next audio frame", "going_away_to_audio"),
        ("resume sent → `session.resumed` (last attempt)", "resume_sent_to_resumed"),
        ("audio gap: last frame from A → first from B/C", "audio_gap"),
    ]
    lines = ["| per session | p50 | p99 | max | n |", "|---|---|---|---|---|"]
    for label, key in rows:
        p50 = Summary.of([float(r[key]["p50_ms"]) for r in runs])
        p99 = Summary.of([float(r[key]["p99_ms"]) for r in runs])
        mx = Summary.of([float(r[key]["max_ms"]) for r in runs])
        n = sum(int(r[key]["n"]) for r in runs)
        lines.append(
            f"| {label} | {fmt_summary(p50, 'ms')} | {fmt_summary(p99, 'ms')} "
            f"| {fmt_summary(mx, 'ms')} | {n} |"
        )
    lines.append("")
    for i, r in enumerate(runs):
        lines.append(
            f"drain {i + 1}: {r['sessions']} sessions, before SIGTERM each got "
            f"{r['frame_rate_before']:.0f} audio frames/s of 50 due; "
            f"{r['going_away']} got going_away "
            f"({r['going_away_migrating']} with migrating: true), close codes "
            f"{r['close_codes']}, {r['resumed']} resumed ({r['resumed_with_audio_after']} "
            f"heard audio after), resume attempts {r['attempts']}, refusals "
            f"{r['refusals'] or 'none'}, last resumed {r['sigterm_to_last_resumed_ms']:.0f} ms "
            f"after SIGTERM; A exited {r.get('home_exit')} after "
            f"{r.get('home_exit_ms', float('nan')):.0f} ms after SIGTERM; seq violations: "
            f"{r['violations']}"
        )
        keys = ("terminal_events", "resumed_without_going_away", "resumed_after_terminal",
                "client_errors", "failed", "other_events")  # fmt: skip
        extra = {k: r[k] for k in keys if r.get(k)}
        if extra:
            lines.append(f"drain {i + 1}, also: {extra}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- scenarios
def resume_scenario(
    args: argparse.Namespace, store: str, a: Proc, url_a: str, b: Proc, url_b: str
) -> Any:
    argv = load_argv(
        "resume", args, "--home", url_a, "--other", url_b,
        "--sessions", str(args.sessions), "--k", args.k,
    )  # fmt: skip
    result, _ = run_load(argv, {"A": a, "B": b}, timeout=args.max_time)
    parts = [
        *(PY, "-m", "benchmarks.probes.clients.relay_parts", "--store", store, "--home", url_a),
        *("--secret", SECRET, "--sessions", str(args.sessions)),
    ]  # at the servers' niceness: it does what the relaying node does
    result["parts"], _ = run_load(parts, {}, timeout=args.max_time)
    return result


def parts_table(parts: dict[str, Any]) -> str:
    names = {
        "locate": "the store's `locate` (one Lua script, coredis)",
        "relay_connect": "a new pooled peer connection to the home (signed upgrade and "
        "proof; paid once per pair of nodes, then kept)",
        "resume": "`session.resume` over a kept peer connection (a channel) → `session.resumed`",
        "public_connect": "(compare) the same client's connect to the public endpoint",
    }
    lines = ["| step of a relayed resume, timed alone | p50 | p99 |", "|---|---|---|"]
    for key, label in names.items():
        lines.append(
            f"| {label} | {fmt_num(parts[key]['p50_ms'])} ms | {fmt_num(parts[key]['p99_ms'])} ms |"
        )
    return "\n".join(lines)


def throughput_scenario(
    args: argparse.Namespace, a: Proc, url_a: str, b: Proc, url_b: str
) -> tuple[dict[str, Any], Any]:
    argv = load_argv(
        "throughput", args, "--home", url_a, "--other", url_b,
        "--streams", str(args.streams), "--window", str(args.window),
        "--seconds", str(args.seconds), "--pings", str(args.pings),
    )  # fmt: skip
    return run_load(argv, {"A": a, "B": b}, timeout=args.max_time)


def _note_exit(proc: Proc, exited: list[float]) -> None:
    proc.popen.wait()
    exited.append(time.monotonic())


def migrate_scenario(args: argparse.Namespace, store: str) -> list[dict[str, Any]]:
    runs = []
    with nodes(["B", "C"], store, "voice", args.drain_timeout) as others:
        urls = ",".join(url for _, url in others.values())
        for d in range(args.drains):
            with nodes([f"A{d + 1}"], store, "voice", args.drain_timeout) as home:
                a, url_a = home[f"A{d + 1}"]
                argv = load_argv(
                    "migrate", args, "--home", url_a, "--others", urls,
                    "--sessions", str(args.sessions), "--kill-pid", str(a.pid),
                    "--settle", str(args.settle), "--after", str(args.after),
                    "--drain-wait", str(args.drain_timeout + 10),
                )  # fmt: skip
                t0 = time.monotonic()
                exited: list[float] = []
                waiter = threading.Thread(target=_note_exit, args=(a, exited), daemon=True)
                waiter.start()
                result, marks = run_load(argv, {"A": a}, timeout=args.max_time)
                waiter.join(args.drain_timeout + 15)
                result["home_exit"] = a.popen.poll()
                sigterm = marks.get("sigterm", {}).get("A")
                result["home_exit_ms"] = (
                    (exited[0] - sigterm["t"]) * 1e3 if exited and sigterm else float("nan")
                )
                result["run_wall_s"] = time.monotonic() - t0
                result["home_log_tail"] = list(a.stderr_tail)[-30:]
                runs.append(result)
                if result["violations"]:
                    say("!" * 78)
                    say(f"!!! SEQ VIOLATIONS in drain {d + 1}: {result['violations']}")
                    for line in result["violation_examples"]:
                        say(f"!!!   {line}")
                    say("!" * 78)
    return runs


# --------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--sessions", type=int, default=100, help="resume trials per path "
                        "per round; voice sessions per drain")  # fmt: skip
    parser.add_argument("--k", default="1,100", help="resume: journal depths (unacked events)")
    parser.add_argument("--rounds", type=int, default=3, help="resume and throughput rounds")
    parser.add_argument("--streams", type=int, default=4, help="throughput: sessions")
    parser.add_argument("--window", type=int, default=16, help="throughput: in flight each")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput: per window")
    parser.add_argument("--pings", type=int, default=300, help="throughput: one-at-a-time")
    parser.add_argument("--drains", type=int, default=1, help="migrate: drains (a fresh A each)")
    parser.add_argument("--settle", type=float, default=3.0, help="migrate: stream before")
    parser.add_argument("--after", type=float, default=2.0, help="migrate: stream after")
    parser.add_argument("--drain-timeout", type=float, default=5.0, help="migrate: A's")
    parser.add_argument("--nice", type=int, default=0, help="niceness of every process "
                        "(negative needs root)")  # fmt: skip
    parser.add_argument("--load-nice", type=int, default=10, help="the load generator's "
                        "niceness above the servers'")  # fmt: skip
    parser.add_argument("--max-time", type=float, default=600.0, help="per load generator")
    parser.add_argument("--out", type=Path, default=None, help="the JSON results file")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_reaper()
    if args.nice:
        try:  # children inherit it: every server and Redis at the same priority
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as exc:
            say(f"--nice {args.nice} refused ({exc}); running at the default")
    only = args.only.split(",")
    meter = LoadMeter()
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.cluster", *(argv or sys.argv[1:])]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": machine_info(),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "settings": vars(args) | {"out": str(args.out)},
    }
    out: list[str] = []
    status = 0
    with redis() as (_, store), ExitStack() as stack:
        if "resume" in only or "throughput" in only:
            echo = stack.enter_context(nodes(["A", "B"], store, "echo"))
            (a, url_a), (b, url_b) = echo["A"], echo["B"]
        if "resume" in only:
            say("resume: home vs relayed ...")
            try:
                res = resume_scenario(args, store, a, url_a, b, url_b)
                report["resume"] = res
                title = (f"### Resume via the home node vs relayed ({args.sessions} sessions "
                         f"per path per round, {args.rounds} rounds)")  # fmt: skip
                out += [title, "", resume_table(res), "", parts_table(res["parts"]), ""]
            except BenchError as exc:
                status = 1
                say(f"resume failed: {exc}")
        if "throughput" in only:
            say("throughput: direct vs relayed ...")
            try:
                tp, marks = throughput_scenario(args, a, url_a, b, url_b)
                table = throughput_table(tp, marks)
                report["throughput"] = tp
                out += [f"### Relayed event throughput ({args.streams} sessions \u00d7 "
                        f"{args.window} in flight, {args.seconds:g} s, {args.rounds} rounds)",
                        "", table, ""]  # fmt: skip
            except BenchError as exc:
                status = 1
                say(f"throughput failed: {exc}")
        stack.close()  # the echo nodes go before the voice nodes start
        if "migrate" in only:
            say("migrate: drain of a node with voice sessions ...")
            try:
                runs = migrate_scenario(args, store)
                report["migrate"] = runs
                out += [f"### Migration on drain ({args.sessions} voice sessions, "
                        f"{args.drains} drain(s))", "", migrate_table(runs), ""]  # fmt: skip
                if any(r["violations"] for r in runs):
                    status = 2
            except BenchError as exc:
                status = 1
                say(f"migrate failed: {exc}")
    report["background"] = meter.read()
    bg = report["background"]
    out.append(
        f"Background: {bg['other_share'] * 100:.0f} % of the machine used by other processes, "
        f"{bg['steal_share'] * 100:.0f} % stolen; {bg['wall_s']:.0f} s; niceness "
        f"{report['niceness']} (load generator +{args.load_nice})."
    )
    print("\n".join(out))
    path = args.out or ROOT / "benchmarks" / "results" / time.strftime(
        "cluster-%Y%m%dT%H%M%SZ.json", time.gmtime()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    say(f"results: {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
