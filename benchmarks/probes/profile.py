"""Where the time and the memory go: py-spy on a loaded server, tracemalloc on idle sessions.

    python -m benchmarks.profile cpu --workload throughput [--server duplex|bare_trio]
    python -m benchmarks.profile cpu --workload handshake
    python -m benchmarks.profile cpu --workload voice --sessions 40
    python -m benchmarks.profile memory --sessions 2000

``cpu`` samples the server with py-spy (``--nonblocking``: the server is never paused)
while the usual load generator drives it, then prints self and inclusive time by function
and self time by package. ``memory`` runs the server under tracemalloc, opens N idle
sessions and prints what the Python heap grew by, per session, by source line.
Output also goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import shutil
import signal
import sys
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path

from benchmarks.suite._procs import (
    PY,
    Proc,
    free_port,
    install_reaper,
    pinned,
    run_client,
    start_server,
)
from benchmarks.suite._suite import CLIENT_CPU, SERVER_CPU, duplex_flags
from benchmarks.suite._workload import raise_nofile

RESULTS = Path(__file__).resolve().parents[1] / "results"
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def server_argv(kind: str, port: int, traced: bool = False) -> list[str]:
    if kind == "duplex":
        head = [PY, "-m", "benchmarks.probes.profile", "_traced-serve"] if traced else [
            PY, "-m", "trio_duplex", "serve"
        ]  # fmt: skip
        return pinned([*head, *duplex_flags(port)[:-1], "info"], SERVER_CPU)
    return pinned([PY, "-m", f"benchmarks.suite.servers.{kind}", "--port", str(port)], SERVER_CPU)


def client_argv(workload: str, url: str, proto: str, seconds: float, sessions: int) -> list[str]:
    base = [
        PY,
        "-m",
        "benchmarks.suite.clients.asyncio_ws",
        workload,
        "--url",
        url,
        "--proto",
        proto,
    ]
    if workload == "throughput":
        extra = ["--warmup", "1", "--duration", str(seconds + 1)]
    elif workload == "handshake":
        extra = ["--warmup", "1", "--duration", str(seconds + 1), "--concurrency", "8"]
    elif workload == "voice":
        extra = ["--steps", str(sessions), "--settle", "1", "--measure", str(seconds + 1)]
        extra += ["--threshold-ms", "1e9", "--ack-every", "50"]
    elif workload == "resume":  # K=100 resume trials, back to back, trio-duplex only
        base = [
            PY,
            "-m",
            "benchmarks.suite.clients.asyncio_ws",
            "resume",
            "--target",
            f"duplex={url}",
        ]
        extra = ["--k", "100", "--trials", "100000", "--trial-time", str(seconds + 1)]
    elif workload == "idle":
        extra = ["--count", str(sessions), "--open-concurrency", "50", "--settle", "3"]
    else:
        raise ValueError(workload)
    return pinned([*base, *extra, "--max-time", str(seconds + 120)], CLIENT_CPU)


# ------------------------------------------------------------------------------ cpu
def parse_frame(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return m["func"], m["file"]


def bucket(file: str) -> str:
    """The package a leaf frame's file belongs to (our own modules one by one)."""
    attrs_prefix = "<attrs generated methods "  # attrs-made __init__ etc.: the class's module
    if file.startswith(attrs_prefix):
        parts = file.removeprefix(attrs_prefix).rstrip(">").split(".")
        return bucket("/".join(parts[:-1]) + ".py") if len(parts) > 1 else "attrs"
    if file.startswith("outcome/"):
        return "trio"  # trio's Outcome objects, made on every task switch
    for key in ("trio_duplex", "trio_websocket", "wsproto", "h11", "websockets"):
        if f"{key}/" in file or file.startswith(key):
            return key if key != "trio_duplex" else "trio_duplex/" + Path(file).name
    if "/trio/" in file or file.startswith("trio/"):
        return "trio"
    if "json" in file:
        return "json"
    if "logging" in file:
        return "logging"
    return "stdlib/other: " + Path(file).name if file else "other"


def summarize_collapsed(lines: Iterable[str], top: int = 25) -> str:
    """Self time, inclusive time and self time by package from py-spy's raw output."""
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    pkg: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if "(" in f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        names = []
        for frame in frames:
            func, file = parse_frame(frame)
            names.append((f"{func} ({Path(file).name})" if file else func, file))
        self_t[names[-1][0]] += count
        pkg[bucket(names[-1][1])] += count
        for name in {n for n, _ in names}:
            incl[name] += count
    if total == 0:
        return "no samples"

    def table(title: str, counter: collections.Counter[str]) -> str:
        rows = [f"{title} ({total} samples)"]
        rows += [f"  {100 * c / total:5.1f}%  {name}" for name, c in counter.most_common(top)]
        return "\n".join(rows)

    return "\n\n".join(
        [
            table("self time by package (leaf frame)", pkg),
            table("self time by function", self_t),
            table("inclusive time by function", incl),
        ]
    )


def profile_cpu(args: argparse.Namespace) -> str:
    if shutil.which("py-spy") is None and not Path(PY).with_name("py-spy").exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    pyspy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    proc, url = start_server(args.server, server_argv(args.server, free_port()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    raw = RESULTS / f"profile-{args.workload}-{args.server}-{stamp}.collapsed"
    spy = None
    try:
        proto = "duplex" if args.server == "duplex" else "bare"
        argv = client_argv(args.workload, url, proto, args.seconds, args.sessions)
        spy = Proc(
            "py-spy",
            [pyspy, "record", "--pid", str(proc.pid), "--duration", str(int(args.seconds)),
             "--rate", "250", "--format", "raw", "--output", str(raw),
             *([] if args.blocking else ["--nonblocking"])],
        )  # fmt: skip
        result, _ = run_client("load generator", argv, watch=proc, timeout=args.seconds + 150)
        spy.popen.wait(args.seconds + 30)
    finally:
        if spy is not None:
            spy.stop()
        proc.stop()
    head = f"{args.workload} against {args.server}: client result {trim(result)}"
    return head + "\n\n" + summarize_collapsed(raw.read_text().splitlines()) + f"\n\nraw: {raw}"


def trim(result: dict[str, object]) -> str:
    return str({k: v for k, v in result.items() if not isinstance(v, list | dict)})[:300]


# --------------------------------------------------------------------------- memory
def profile_memory(args: argparse.Namespace) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    out = RESULTS / f"profile-memory-{stamp}.txt"
    os.environ["BENCH_TRACEMALLOC_OUT"] = str(out)
    os.environ["BENCH_TRACEMALLOC_N"] = str(args.sessions)
    proc, url = start_server("duplex", server_argv("duplex", free_port(), traced=True))
    try:
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)  # the "before" snapshot
        time.sleep(1.0)

        def on_line(line: str) -> None:
            if line.startswith("@mark settled"):
                os.kill(proc.pid, signal.SIGUSR1)  # the "after" snapshot, sessions still open

        argv = client_argv("idle", url, "duplex", 480, args.sessions)  # tracemalloc is slow
        client = Proc("load generator", argv, stdout_lines=True, on_stdout=on_line)
        deadline = time.monotonic() + 600
        while client.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        client.stop()
        for _ in range(1500):  # the traced server needs a while to diff its snapshots
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.2)
    finally:
        proc.stop()
    return out.read_text() if out.exists() else f"no snapshot written\n{proc.tail()}"


def traced_serve(argv: list[str]) -> int:
    """Run ``trio-duplex serve`` under tracemalloc; SIGUSR1 takes a snapshot (twice: a diff)."""
    tracemalloc.start(12)
    snaps: list[tracemalloc.Snapshot] = []
    rss: list[int] = []
    tasks: list[collections.Counter[str]] = []

    imported = False

    def on_usr1(signum: int, frame: object) -> None:
        if not imported:
            print("traced-serve: SIGUSR1 before the server was imported; ignored", file=sys.stderr)
            return
        try:
            tasks.append(task_census())
            snaps.append(tracemalloc.take_snapshot())
            rss.append(psutil.Process().memory_info().rss)
            if len(snaps) == 2:
                write_diff(snaps[0], snaps[1], rss[1] - rss[0], tasks[1] - tasks[0])
        except Exception:  # a profiler must not take the server down
            import traceback

            traceback.print_exc()

    signal.signal(signal.SIGUSR1, on_usr1)
    import psutil
    import trio  # noqa: F401 - task_census needs it whole

    from trio_duplex.cli import main as cli_main

    imported = True
    return cli_main(["serve", *argv])


def task_census() -> collections.Counter[str]:
    """Live trio tasks by name (the signal handler runs on trio's thread, between steps)."""
    import trio

    counts: collections.Counter[str] = collections.Counter()
    try:
        stack = [trio.lowlevel.current_root_task()]
    except RuntimeError:
        return counts
    while stack:
        task = stack.pop()
        if task is None:
            continue
        counts[task.name.rsplit(".", 2)[-1] if "<" not in task.name else task.name] += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return counts


def ours(tb: tracemalloc.Traceback) -> str:
    """The innermost trio_duplex frame that led to an allocation (else the outermost frame)."""
    for frame in reversed(tb):  # most recent call first
        if "/trio_duplex/" in frame.filename:
            return f"trio_duplex/{Path(frame.filename).name}:{frame.lineno}"
    frame = tb[0]
    return (
        f"(outside trio_duplex, from {Path(frame.filename).parent.name}/"
        f"{Path(frame.filename).name}:{frame.lineno})"
    )


def write_diff(
    before: tracemalloc.Snapshot,
    after: tracemalloc.Snapshot,
    rss_diff: int,
    tasks: collections.Counter[str],
) -> None:
    n = int(os.environ.get("BENCH_TRACEMALLOC_N", "1"))
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    before, after = before.filter_traces(ignore), after.filter_traces(ignore)
    lines = []
    by_line = after.compare_to(before, "lineno")
    heap = sum(s.size_diff for s in by_line)
    lines.append(f"{n} idle sessions: RSS grew {rss_diff / n / 1024:.1f} KB/session, "
                 f"traced Python heap {heap / n / 1024:.1f} KB/session")  # fmt: skip
    lines.append(f"\ntrio tasks per session: {sum(tasks.values()) / n:.2f}")
    for name, count in tasks.most_common(12):
        lines.append(f"  {count / n:5.2f}  {name}")
    lines.append("\nbytes per session by the trio_duplex line that led to them:")
    attributed: collections.Counter[str] = collections.Counter()
    by_trace = after.compare_to(before, "traceback")
    for stat in by_trace:
        attributed[ours(stat.traceback)] += stat.size_diff
    for where, size in attributed.most_common(20):
        lines.append(f"  {size / n:8.0f} B  {where}")
    lines.append("\ntop source lines, bytes per session (count of blocks per session):")
    for s in by_line[:30]:
        frame = s.traceback[0]
        lines.append(f"  {s.size_diff / n:8.0f} B  ({s.count_diff / n:5.1f})  "
                     f"{frame.filename}:{frame.lineno}")  # fmt: skip
    lines.append("\nby file:")
    for s in after.compare_to(before, "filename")[:15]:
        lines.append(f"  {s.size_diff / n:8.0f} B  {s.traceback[0].filename}")
    lines.append("\ntop allocation sites with their callers:")
    for s in by_trace[:4]:
        lines.append(f"  {s.size_diff / n:8.0f} B per session:")
        for entry in s.traceback.format()[-10:]:
            lines.append("      " + entry)
    out = Path(os.environ["BENCH_TRACEMALLOC_OUT"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)  # whole or not at all: the parent polls for it


def main() -> None:
    if sys.argv[1:2] == ["_traced-serve"]:
        raise_nofile()
        sys.exit(traced_serve(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    cpu = sub.add_parser("cpu", help="py-spy on the server under load")
    cpu.add_argument("--workload", choices=["throughput", "handshake", "voice", "resume", "idle"],
                     default="throughput")  # fmt: skip
    cpu.add_argument("--server", choices=["duplex", "bare_trio", "bare_asyncio"], default="duplex")
    cpu.add_argument("--seconds", type=float, default=8.0)
    cpu.add_argument("--sessions", type=int, default=40, help="voice/idle: session count")
    cpu.add_argument(
        "--blocking",
        action="store_true",
        help="let py-spy pause the server for each sample (exact stacks, more overhead)",
    )
    mem = sub.add_parser("memory", help="tracemalloc on N idle sessions")
    mem.add_argument("--sessions", type=int, default=500)
    args = parser.parse_args()
    install_reaper()
    raise_nofile()
    report = profile_cpu(args) if args.what == "cpu" else profile_memory(args)
    print(report)


if __name__ == "__main__":
    main()
