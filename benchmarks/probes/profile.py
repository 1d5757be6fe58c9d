"""Where the time and the memory go: py-spy on a loaded server, tracemalloc on idle sessions.

    python -m benchmarks.profile cpu --workload throughput [--server duplex|bare_trio]
    python -m benchmarks.profile cpu --workload handshake
    python -m benchmarks.profile cpu --workload openai-turns
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
import gc
import itertools
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import tracemalloc
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def client_argv(
    workload: str, url: str, proto: str, seconds: float, sessions: int, settle: float = 3.0
) -> list[str]:
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
    elif workload == "openai-turns":  # scenario 1's OpenAI variant: text turns, 16 in flight
        from benchmarks.suite._dialects import dialect_url

        base = [PY, "-m", "benchmarks.suite.clients.dialects", "turns"]
        base += ["--url", dialect_url(url, "openai"), "--dialect", "openai"]
        extra = ["--warmup", "1", "--duration", str(seconds + 1), "--ack-every", "100"]
    elif workload == "idle":
        extra = ["--count", str(sessions), "--open-concurrency", "100", "--settle", str(settle)]
        extra += ["--open-time-limit", str(seconds)]
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
    """N idle sessions on a server that takes two pictures of itself (``_traced-serve``):
    before they open and once they have (the client holds them ``--settle`` seconds
    after its ``opened`` mark, the picture is taken one second into that). Each
    picture: RSS, trio's tasks by name, Python's objects by type (``gc``), and in the
    second, with ``--frames`` > 0, a tracemalloc snapshot of what was allocated since the
    first and is still alive (tracing starts at the first picture, so the imports'
    allocations are never traced and a snapshot at 10,000 sessions stays small). The
    snapshot is analysed here, in the parent, not in the server."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    work = RESULTS / f"profile-memory-{stamp}"
    work.mkdir()
    os.environ["BENCH_MEM_DIR"] = str(work)
    os.environ["BENCH_MEM_FRAMES"] = str(args.frames)
    proc, url = start_server("duplex", server_argv("duplex", free_port(), traced=True))
    try:
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)  # the "before" picture
        wait_for(work / "before.json", proc, 120)
        opened = threading.Event()

        def on_line(line: str) -> None:
            if line.startswith("@mark opened"):
                opened.set()

        # The client drops every connection at the end of its settle: long enough for the
        # picture to be taken first (a traced server is slow to settle, too).
        argv = client_argv("idle", url, "duplex", 1800, args.sessions, settle=args.settle)
        client = Proc("load generator", argv, stdout_lines=True, on_stdout=on_line)
        while client.alive() and not opened.wait(0.2):
            pass
        if opened.is_set():
            time.sleep(1.0)
            os.kill(proc.pid, signal.SIGUSR1)  # the "after" picture, sessions still open
            wait_for(work / "after.json", proc, 1800)
        client.stop()
    finally:
        proc.stop()
    if not (work / "after.json").exists():
        return f"no picture written\n{proc.tail()}"
    report = memory_report(work, args.sessions)
    (work / "report.txt").write_text(report + "\n")
    return report + f"\n\nfiles: {work}"


def wait_for(path: Path, proc: Proc, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and proc.alive() and time.monotonic() < deadline:
        time.sleep(0.2)


def traced_serve(argv: list[str]) -> int:
    """Run ``trio-duplex serve``; each SIGUSR1 takes a picture of the server (see
    ``profile_memory``) into ``$BENCH_MEM_DIR``: ``before.json``, then ``after.json``
    (and ``after.snap``, a tracemalloc snapshot, if ``$BENCH_MEM_FRAMES`` > 0)."""
    work = Path(os.environ["BENCH_MEM_DIR"])
    frames = int(os.environ.get("BENCH_MEM_FRAMES", "0"))
    pictures: list[str] = []
    imported = False

    def on_usr1(signum: int, frame: object) -> None:
        if not imported:
            print("traced-serve: SIGUSR1 before the server was imported; ignored", file=sys.stderr)
            return
        try:
            name = "before" if not pictures else "after"
            took = {"start": time.perf_counter()}
            gc.collect()
            picture: dict[str, object] = {"rss": psutil.Process().memory_info().rss}
            picture["tasks"] = task_census()
            took["tasks"] = time.perf_counter()
            # (Before the snapshot: the census is slow once a snapshot has been taken;
            # what it leaves, its counts, is a few KB, nothing per session.)
            picture["objects"] = object_census()
            took["objects"] = time.perf_counter()
            if name == "after" and tracemalloc.is_tracing():
                picture["tracemalloc_overhead"] = tracemalloc.get_tracemalloc_memory()
                snapshot = tracemalloc.take_snapshot()
                tracemalloc.stop()
                took["snapshot"] = time.perf_counter()
                snapshot.dump(str(work / "after.snap"))
                del snapshot
                took["dump"] = time.perf_counter()
            picture["seconds"] = {k: round(v - took["start"], 2) for k, v in took.items()}
            tmp = work / f"{name}.tmp"
            tmp.write_text(json.dumps(picture))
            tmp.replace(work / f"{name}.json")  # whole or not at all: the parent polls
            pictures.append(name)
            if name == "before" and frames > 0:
                tracemalloc.start(frames)
        except Exception:  # a profiler must not take the server down
            import traceback

            traceback.print_exc()

    signal.signal(signal.SIGUSR1, on_usr1)
    import psutil
    import trio  # noqa: F401 - task_census needs it whole

    from trio_duplex.cli import main as cli_main

    imported = True
    return cli_main(["serve", *argv])


def task_census() -> dict[str, int]:
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
    return dict(counts)


def kind(obj: object) -> str:
    """An object's kind as the census counts it: its type's qualified name; a class
    whose instances carry a ``__dict__`` is marked, a coroutine (one frame of a task's
    stack), a generator, a frame or a function is named by its code, and a bound method
    by its function."""
    cls = type(obj)
    if cls is types.MethodType:  # (a bound method: named by what it binds)
        func = obj.__func__  # type: ignore[attr-defined]
        return f"method {getattr(func, '__qualname__', '?')}"
    attr = _CODE.get(cls)
    if attr is not None:
        code: types.CodeType = getattr(obj, attr)
        return f"{cls.__name__} {Path(code.co_filename).name}:{code.co_qualname}"
    module = cls.__module__
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
    if cls.__dictoffset__ and module != "builtins" and not isinstance(obj, type):
        name += " (with __dict__)"
    return name


_kinds: dict[type, str] = {}
_CODE = {
    types.CoroutineType: "cr_code",
    types.GeneratorType: "gi_code",
    types.AsyncGeneratorType: "ag_code",
    types.FrameType: "f_code",
    types.FunctionType: "__code__",
}
"""Kinds named by their code: a task's coroutines frame by frame, closures by function."""


def object_census() -> dict[str, Any]:
    """Every object the collector tracks, and the untracked ones they refer to (str,
    bytes, int, float...), by kind: [count, bytes by sys.getsizeof]. A ``__dict__`` is
    counted once it exists (3.11 makes an instance's lazily: its values are then in the
    instance's pre-header, which getsizeof does not see)."""
    counts: dict[str, list[int]] = {}
    tracked = gc.get_objects()  # (first: what the census itself makes is not in it)
    seen: set[int] = set()
    for obj in tracked:
        seen.add(id(obj))
    untracked = []
    for obj in tracked:
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not gc.is_tracked(ref):
                seen.add(id(ref))
                untracked.append(ref)
    largest: list[tuple[int, int, object]] = []
    for obj in itertools.chain(tracked, untracked):
        cls = type(obj)
        if cls in _CODE or cls is types.MethodType:
            name = kind(obj)
        else:
            name = _kinds.get(cls) or _kinds.setdefault(cls, kind(obj))
        entry = counts.get(name)
        if entry is None:
            entry = counts[name] = [0, 0]
        entry[0] += 1
        try:
            size = sys.getsizeof(obj)
        except TypeError:
            continue
        entry[1] += size
        if size > 4096:
            largest.append((size, id(obj), obj))
    largest.sort(key=lambda item: -item[0])
    big = {}
    for size, _, obj in largest[:12]:
        holders = [type(h).__qualname__ for h in gc.get_referrers(obj) if h is not largest]
        big[f"{type(obj).__qualname__} #{id(obj):x}"] = [size, describe(obj), holders[:4]]
    del tracked, untracked, largest
    return {"counts": counts, "largest": big}


def describe(obj: object) -> str:
    """What a large object holds, by type: never its repr (an attrs repr of a runner
    spells out its owner's every runner, quadratic in the sessions)."""
    if isinstance(obj, dict):
        items = [
            f"{type(k).__name__}: {type(v).__qualname__}"
            for k, v in itertools.islice(obj.items(), 3)
        ]
        return f"{len(obj)} items, e.g. {items}"
    if isinstance(obj, set | frozenset | list | tuple | collections.deque):
        return f"{len(obj)} items, e.g. {[type(v).__qualname__ for v in itertools.islice(obj, 3)]}"
    return type(obj).__qualname__


def ours(tb: tracemalloc.Traceback) -> str:
    """The innermost trio_duplex frame that led to an allocation (else the innermost
    frame, by package)."""
    for frame in reversed(tb):  # (a Traceback is oldest first)
        if "/trio_duplex/" in frame.filename:
            return f"trio_duplex/{frame.filename.split('/trio_duplex/')[-1]}:{frame.lineno}"
    frame = tb[-1]
    return (
        f"(outside trio_duplex, from {Path(frame.filename).parent.name}/"
        f"{Path(frame.filename).name}:{frame.lineno})"
    )


def memory_report(work: Path, n: int) -> str:
    before = json.loads((work / "before.json").read_text())
    after = json.loads((work / "after.json").read_text())
    lines = []
    rss = (after["rss"] - before["rss"]) / n / 1024
    overhead = after.get("tracemalloc_overhead")
    note = "" if overhead is None else (
        f" (tracemalloc's own {overhead / n / 1024:.1f} KB/session included: "
        "run with --frames 0 for a clean RSS)"
    )  # fmt: skip
    lines.append(f"{n} idle sessions: RSS grew {rss:.1f} KB/session{note}")
    lines.append(f"(the pictures took {before.get('seconds')} and {after.get('seconds')} s)")
    objs_b, objs_a = before["objects"]["counts"], after["objects"]["counts"]
    diff = {
        k: (v[0] - objs_b.get(k, [0, 0])[0], v[1] - objs_b.get(k, [0, 0])[1])
        for k, v in objs_a.items()
    }
    total = sum(b for _, b in diff.values())
    lines.append(f"Python objects (gc census, sys.getsizeof): {total / n:.0f} B/session")
    tasks = collections.Counter(after["tasks"])
    tasks.subtract(before["tasks"])
    lines.append(f"\ntrio tasks per session: {sum(tasks.values()) / n:.2f}")
    for name, count in tasks.most_common(12):
        lines.append(f"  {count / n:5.2f}  {name}")
    lines.append("\nobjects per session by kind (count, bytes), largest first:")
    ranked = sorted(diff.items(), key=lambda kv: -kv[1][1])
    for name, (count, size) in ranked[:45]:
        if count / n < 0.05 and size / n < 16:
            continue
        lines.append(f"  {size / n:7.0f} B  {count / n:6.2f}  {name}")
    lines.append("\nthe largest objects once the sessions are open (bytes, repr, held by):")
    for name, (size, text, holders) in after["objects"]["largest"].items():
        lines.append(f"  {size:9d} B  {name}  {text[:90]}  held by {holders}")
    snap_path = work / "after.snap"
    if snap_path.exists():
        lines += tracemalloc_report(tracemalloc.Snapshot.load(str(snap_path)), n)
    return "\n".join(lines)


def tracemalloc_report(snap: tracemalloc.Snapshot, n: int) -> list[str]:
    snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = []
    by_trace = snap.statistics("traceback")
    heap = sum(s.size for s in by_trace)
    lines.append(f"\ntraced Python heap allocated since the first picture, still alive: "
                 f"{heap / n:.0f} B/session")  # fmt: skip
    lines.append("\nbytes per session by the trio_duplex line that led to them (blocks):")
    attributed: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for stat in by_trace:
        entry = attributed[ours(stat.traceback)]
        entry[0] += stat.size
        entry[1] += stat.count
    ranked = sorted(attributed.items(), key=lambda kv: -kv[1][0])
    for where, (size, count) in ranked[:30]:
        lines.append(f"  {size / n:8.0f} B  ({count / n:5.1f})  {where}")
    lines.append("\ntop allocation sites (innermost line), bytes per session (blocks):")
    for s in snap.statistics("lineno")[:30]:
        frame = s.traceback[0]
        lines.append(f"  {s.size / n:8.0f} B  ({s.count / n:5.1f})  "
                     f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}")  # fmt: skip
    lines.append("\ntop allocation sites with their callers:")
    for s in by_trace[:6]:
        lines.append(f"  {s.size / n:8.0f} B per session:")
        for text in s.traceback.format(most_recent_first=True)[:16]:
            lines.append("      " + text)
    return lines


def main() -> None:
    if sys.argv[1:2] == ["_traced-serve"]:
        raise_nofile()
        sys.exit(traced_serve(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    cpu = sub.add_parser("cpu", help="py-spy on the server under load")
    workloads = ["throughput", "handshake", "voice", "resume", "idle", "openai-turns"]
    cpu.add_argument("--workload", choices=workloads, default="throughput")
    cpu.add_argument("--server", choices=["duplex", "bare_trio", "bare_asyncio"], default="duplex")
    cpu.add_argument("--seconds", type=float, default=8.0)
    cpu.add_argument("--sessions", type=int, default=40, help="voice/idle: session count")
    cpu.add_argument(
        "--blocking",
        action="store_true",
        help="let py-spy pause the server for each sample (exact stacks, more overhead)",
    )
    mem = sub.add_parser("memory", help="gc and tracemalloc on N idle sessions")
    mem.add_argument("--sessions", type=int, default=500)
    mem.add_argument(
        "--frames",
        type=int,
        default=10,
        help="tracemalloc's frames per allocation (0: no tracemalloc, a clean RSS)",
    )
    mem.add_argument("--settle", type=float, default=10.0, help="seconds the client holds on")
    args = parser.parse_args()
    install_reaper()
    raise_nofile()
    report = profile_cpu(args) if args.what == "cpu" else profile_memory(args)
    print(report)


if __name__ == "__main__":
    main()
