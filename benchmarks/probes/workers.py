"""``serve --workers 2`` against ``--workers 1`` (docs/cluster.md, "Worker processes"),
both in cluster mode against a local redis-server started here. Three parts, each
honest on a machine whose cores the load generator shares:

    python -m benchmarks.workers [--quick] [--realtime] [--rounds 3]
                                 [--sessions 0,30,60,90] [--own-sessions 30,45]
                                 [--split-sessions 100,400,1000] [--split-rounds 2]
                                 [--capacity-rounds 1] [--parts cpu,own,split,capacity]
                                 [--report JSON]

About 5 minutes with the defaults (5-6 while other work takes most of this 2-core
machine; ``--quick``: about 2). As root, ``--realtime`` is the recommended run.

1. **CPU per voice session** (``cpu``). Scenario 3's load generator
   (``benchmarks.suite.clients.asyncio_ws voice``, protocol v2's binary lane: each
   session sends a 20 ms frame every 20 ms and times its echo) holds a fixed number of
   sessions (``--sessions``, each a measured window of ``--measure`` seconds; 0: the
   workers idle) against ``--workers 1`` and ``--workers 2`` in turn, ``--rounds``
   interleaved rounds (1, 2, then 2, 1, ...), nothing pinned. The figure is the workers'
   CPU (psutil, user + system, summed over the workers; the supervisor's own is shown
   apart) over the window, per session and second of wall time; the ratio 2/1 is taken
   per round (the two servers measured a minute apart at most) and shown as its median
   with min-max. CPU *time* is what the process used, whoever else ran meanwhile, so
   sharing cores moves it less than it moves latency; but an event loop's cost per event
   falls as more events share one wake-up (each worker's context switches per echo are
   recorded), and a loop that is starved of CPU, or carries more sessions, batches more.
   So: the verdict counts only rounds where both servers held p99 ≤ 20 ms (below the
   knee), and a second table compares the same load *per worker* (``--workers 2`` at 2N
   sessions against ``--workers 1`` at N), which is what decides how many sessions a
   worker per core holds.
1b. **A worker on a core of its own** (``own``). What decides how capacity scales: worker
   0 of ``--workers 2`` alone on core 0 (its affinity set once it is up), the other
   worker, the load generator and redis-server on the other core(s), against
   ``--workers 1`` alone on core 0 with the rest elsewhere, in the same interleaved
   rounds. ``--workers 2`` carries 2N sessions (``--own-sessions`` gives N) so that worker
   0 holds about N: its CPU over its own sessions (counted as in part 2) against
   ``--workers 1``'s at as many sessions, read off ``--workers 1``'s steps around N
   (piecewise linear). This is the one comparison here in which both sides have a core
   that neither the load generator nor another worker uses.
2. **The split** (``split``). How many sessions each worker took, read from each worker:
   its established TCP connections on the served port (its file descriptors' sockets
   found established in /proc/net/tcp; each connection carries one session), at every
   measured window of part 1 and in ``--split-rounds`` rounds of ``asyncio_ws idle``
   opening ``--split-sessions`` sessions on one ``--workers 2`` server. The deviation of a
   round is the largest ``|count - N/W|`` over ``N/W``; the verdict is ±10 %. The kernel
   picks a listener by a hash of the connection's addresses and ports (with a per-boot
   secret), so each connection is, in effect, a fair coin: the table shows beside each
   row how often a fair coin per connection lands within ±10 % at that N (exact
   binomial, W = 2), and the pooled share with its z score says whether the hash leans
   towards one worker.
3. **Capacity with cores** (``capacity``). Scenario 3's ramp (the largest N whose p99,
   unanswered frames counted with their age, stays ≤ 20 ms with nothing lost) with the
   load generator (and redis-server) pinned to cores of its own and each
   configuration's workers to the rest: on C cores, ``--workers W`` gets cores
   0..min(W, C - 1) - 1 and the load generator the others. On a 2-core machine both
   configurations get core 0 (one core: what two workers cost where one would do) and
   the figure for two workers on two cores is an extrapolation from the three measured
   figures (one worker's sessions per core, the CPU ratio of part 1, the split's
   deviation), printed and labelled as such. On a machine with more cores than W the
   same command measures it (one load-generator process: about 150 voice sessions are
   its own limit on one core, so watch its CPU column).

As root the servers run at ``--server-nice -10`` and the load generator at
``--client-nice -5`` (both ahead of the rest of the machine; otherwise 0 and 5), and every
part records what other processes took of the machine meanwhile (/proc/stat) and the
1-minute load average.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import queue
import re
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.suite._plan import geometric_steps
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
)
from benchmarks.suite._stats import DASH, TIMES, largest_passing
from benchmarks.suite._suite import duplex_flags

SECRET = "benchmark-cluster-secret-0123456789"
SERVING = re.compile(r"serving (ws://\S+)")
PORT = re.compile(r":(\d+)/")
THRESHOLD_MS = 20.0
CPU_TARGET = 1.10
"""Part 1's target: --workers 2's CPU per session within 10 % of --workers 1's."""
SPLIT_TARGET = 0.10
"""Part 2's target: each worker within ±10 % of an even share."""
NO_THRESHOLD_MS = 10_000.0
"""Part 1 measures at a fixed load: a slow window is recorded, never a reason to stop."""


# ------------------------------------------------------------------------------ processes
class Server(Proc):
    """``serve --workers W``: the supervisor and its workers (W > 1), or the one process."""

    def __init__(self, name: str, argv: Sequence[str], workers: int) -> None:
        super().__init__(name, argv)
        self.workers = workers
        self.port = 0
        self.worker_ps: list[psutil.Process] = []

    def ready(self, url: str) -> None:
        """After the ``serving`` line: the port, and the worker processes (every one is
        ready by then)."""
        match = PORT.search(url)
        assert match is not None, url
        self.port = int(match.group(1))
        if self.workers == 1:
            self.worker_ps = [self.ps]
        else:
            self.worker_ps = sorted(self.ps.children(), key=lambda p: p.pid)
            if len(self.worker_ps) != self.workers:
                raise BenchError(
                    f"{self.name}: {len(self.worker_ps)} worker processes, not {self.workers}"
                )

    def snapshot(self) -> dict[str, float]:
        """The ramps' sample: CPU and RSS of the supervisor and its workers together."""
        try:
            family = [self.ps, *self.ps.children(recursive=True)]
            cpu = rss = 0.0
            for proc in family:
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu += times.user + times.system
                    rss += proc.memory_info().rss
        except psutil.Error as exc:
            raise BenchError(f"{self.name} is gone: {exc}\n{self.tail()}") from None
        return {"t": time.monotonic(), "cpu": cpu, "rss": rss}

    def worker_cpu(self) -> tuple[list[float], list[float], list[int], float]:
        """CPU seconds (user + system) of each worker, the system part of them, its context
        switches (how often it slept and woke: the batching), and the supervisor's CPU
        seconds (0 for W=1)."""
        try:
            each, system, wakes = [], [], []
            for proc in self.worker_ps:
                with proc.oneshot():
                    times = proc.cpu_times()
                    each.append(times.user + times.system)
                    system.append(times.system)
                    switches = proc.num_ctx_switches()
                    wakes.append(switches.voluntary + switches.involuntary)
            own = _cpu(self.ps) if self.workers > 1 else 0.0
        except psutil.Error as exc:  # a worker exited (and was perhaps restarted): unusable
            raise BenchError(f"{self.name}: a worker is gone: {exc}\n{self.tail()}") from None
        return each, system, wakes, own

    def sessions_by_worker(self, expected: int) -> tuple[list[int], int]:
        """Each worker's established TCP connections on the served port (one session
        each): which worker the kernel gave each connection to; and how many readings of
        the kernel's table that took.

        A worker's sockets are its file descriptors (``/proc/PID/fd``, exact); which of
        them are established connections on the port is in /proc/net/tcp, which the
        kernel hands out page by page while the machine's other connections come and go,
        so one reading may skip some. The table is read again (at most 20 times, 50 ms
        apart) and the readings united, until the counts add up to ``expected``."""
        seen: set[int] = set()
        counts: list[int] = []
        for attempt in range(1, 21):
            seen |= _established(self.port)
            try:
                counts = [len(_socket_inodes(proc.pid) & seen) for proc in self.worker_ps]
            except OSError as exc:
                raise BenchError(f"{self.name}: a worker is gone: {exc}\n{self.tail()}") from None
            if sum(counts) >= expected:
                return counts, attempt
            time.sleep(0.05)  # another reading of the kernel's table, not a wait on a peer
        return counts, 20


def _established(port: int) -> set[int]:
    """The inodes of the established TCP connections whose local port is ``port``."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... inode: "0100007F:1F90 ... 01 ..."
            if len(fields) > 9 and fields[3] == "01" and int(fields[1][-4:], 16) == port:
                found.add(int(fields[9]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _niced(argv: list[str], nice: int, realtime: int = 0) -> list[str]:
    """At niceness ``nice``; with ``realtime`` (--realtime), under SCHED_FIFO at that
    priority instead, ahead of every ordinary process on the machine."""
    argv = ["nice", "-n", str(nice), *argv] if nice else argv
    return ["chrt", "-f", str(realtime), *argv] if realtime else argv


def _pinned(argv: list[str], cpus: Sequence[int] | None) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv] if cpus else argv


def start_server(
    workers: int,
    redis_url: str,
    nice: int,
    cpus: Sequence[int] | None = None,
    realtime: int = 0,
) -> tuple[Server, str]:
    port = free_port()
    argv = [
        *(PY, "-m", "trio_duplex", "serve", *duplex_flags(port)),
        *("--workers", str(workers), "--cluster", redis_url, "--cluster-secret", SECRET),
    ]
    proc = Server(
        f"serve --workers {workers}", _pinned(_niced(argv, nice, realtime), cpus), workers
    )
    deadline = time.monotonic() + 30
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{proc.name} did not report ready\n{proc.tail()}")
            try:
                line = proc.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                raise BenchError(f"{proc.name} exited before ready\n{proc.tail()}")
            match = SERVING.search(line)
            if match:
                proc.ready(match.group(1))
                return proc, match.group(1)
    except BaseException:
        proc.stop()
        raise


_hurried: set[int] = set()


def _hurry(args: argparse.Namespace) -> None:
    """The calling thread (the one reading a load generator's marks and sampling the
    servers then) at the servers' priority, so that on a busy machine a sample is not
    late: a late one would hold the next step's opening handshakes. Linux sets niceness
    and policy per thread, and this thread starts no process."""
    tid = threading.get_native_id()
    if tid in _hurried:
        return
    _hurried.add(tid)
    try:
        if args.server_rt:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.server_rt + 1))
        elif args.server_nice < 0:
            os.setpriority(os.PRIO_PROCESS, tid, args.server_nice)
    except (OSError, AttributeError):
        pass  # not root, or not Linux: sampled at the ordinary priority


def _voice_client(url: str, steps: Sequence[int], args: argparse.Namespace) -> list[str]:
    return [
        *(PY, "-m", "benchmarks.suite.clients.asyncio_ws", "voice", "--url", url),
        *("--proto", "duplex", "--lane", args.lane, "--steps", ",".join(map(str, steps))),
        *("--ack-every", "50"),
    ]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


# ------------------------------------------------------------------ part 1: CPU per session
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
        _hurry(args)
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
        client = [
            *_voice_client(url, steps, args),
            *("--settle", str(args.settle), "--measure", str(args.measure)),
            *("--threshold-ms", str(NO_THRESHOLD_MS), "--confirm", "0"),
            *("--ramp-time", "600", "--max-time", str(args.cpu_timeout)),
        ]
        result = run_to_result(
            "voice load",
            _pinned(_niced(client, args.client_nice, args.client_rt), rest if own_core else None),
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
    _say(
        f"cpu{' (a core of its own)' if own_core else ''} --workers {workers}: {shown}; other "
        f"processes {background['other_share']:.0%}, {_load()}"
    )
    return result


# ---------------------------------------------------------------------------- part 2: split
def split_runs(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """``--split-rounds`` rounds of opening each of ``--split-sessions`` on one
    ``--workers 2`` server: how many each worker took."""
    meter = LoadMeter()
    workers = max(args.counts)
    server, url = start_server(workers, redis_url, args.server_nice)
    samples: list[dict[str, Any]] = []
    try:
        for r in range(args.split_rounds):
            for n in args.split_sessions:
                counts: list[int] = []
                readings: list[int] = []

                def on_mark(
                    mark: str,
                    n: int = n,
                    counts: list[int] = counts,
                    readings: list[int] = readings,
                ) -> None:
                    _hurry(args)
                    if mark == "opened":
                        try:
                            got, tries = server.sessions_by_worker(n)
                        except BenchError:
                            return  # the main loop reports the server's death
                        counts.extend(got)
                        readings.append(tries)

                client = [
                    *(PY, "-m", "benchmarks.suite.clients.asyncio_ws", "idle", "--url", url),
                    # The sessions stay open for 2 s after the mark: the count is taken
                    # meanwhile, by a thread of this (ordinary-priority) process.
                    *("--proto", "duplex", "--count", str(n), "--settle", "2"),
                    *("--open-time-limit", "30", "--max-time", "60"),
                ]
                result = run_to_result(
                    "idle opens", _niced(client, args.client_nice), on_mark=on_mark,
                    timeout=90, watch=server,
                )  # fmt: skip
                if not counts:
                    raise BenchError(f"split: no count at {n} sessions\n{server.tail()}")
                samples.append(
                    {"round": r, "sessions": result["count"], "wanted": n,
                     "sessions_by_worker": counts, "readings": readings[0],
                     "failures": result["failures"]}
                )  # fmt: skip
                _say(f"split {n}: {counts} (opened {result['count']}), {_load()}")
    finally:
        server.stop(grace=10)
        background = meter.read()
    return {"workers": workers, "samples": samples, "background": background}


def deviation(counts: Sequence[int]) -> float:
    """The largest ``|count - N/W| / (N/W)``: 0 for an even split."""
    total = sum(counts)
    if not total:
        return math.nan
    even = total / len(counts)
    return max(abs(c - even) for c in counts) / even


def fair_within(n: int, bound: float) -> float:
    """How often N connections, each a fair coin between two workers, split within
    ``±bound`` of N/2 (exact binomial)."""
    lo, hi = math.ceil(n / 2 * (1 - bound) - 1e-9), math.floor(n / 2 * (1 + bound) + 1e-9)
    hits: int = sum(math.comb(n, k) for k in range(lo, hi + 1))
    return hits / (1 << n)


# ------------------------------------------------------------------------- part 3: capacity
def cores_for(workers: int, cores: int) -> tuple[list[int], list[int]]:
    """The server's cores and the load generator's: the load generator keeps at least one
    core of its own; the workers get as many of the rest as they number."""
    server = list(range(max(1, min(workers, cores - 1))))
    return server, [c for c in range(cores) if c not in server] or [0]


def ramp(
    workers: int, steps: list[int], args: argparse.Namespace, redis_url: str
) -> dict[str, Any]:
    meter = LoadMeter()
    server_cpus, client_cpus = cores_for(workers, args.cores)
    server, url = start_server(workers, redis_url, args.server_nice, server_cpus)
    try:
        client = [
            *_voice_client(url, steps, args),
            *("--settle", str(args.ramp_settle), "--measure", str(args.ramp_measure)),
            *("--threshold-ms", str(THRESHOLD_MS), "--ramp-time", str(args.ramp_time)),
            *("--max-time", str(args.ramp_time + 60)),
        ]
        marks: dict[str, dict[str, float]] = {}

        def on_mark(mark: str) -> None:
            _hurry(args)
            try:
                marks[mark] = server.snapshot()
            except BenchError:
                pass  # the server died: run_to_result reports it

        result = run_to_result(
            "voice load",
            _pinned(_niced(client, args.client_nice), client_cpus),
            on_mark=on_mark,
            watch=server,
            timeout=args.ramp_time + 90,
        )
    finally:
        server.stop(grace=10)
        background = meter.read()
    result["background"] = background
    for step in result["steps"]:
        mark = step.get("mark", step["sessions"])
        a, b = marks.get(f"start_{mark}"), marks.get(f"end_{mark}")
        if a and b:
            step["server_cpu_util"] = (b["cpu"] - a["cpu"]) / (b["t"] - a["t"])
    passing = [(s["sessions"], s["p99_ms"] if not (s["dead"] or s["errors"]) else float("inf"))
               for s in result["steps"]]  # fmt: skip
    result["largest"] = largest_passing(passing, THRESHOLD_MS)
    result.update(workers=workers, server_cpus=server_cpus, client_cpus=client_cpus)
    last = result["steps"][-1] if result["steps"] else {}
    _say(
        f"capacity --workers {workers} on cores {server_cpus} (load generator {client_cpus}): "
        f"{result['largest']} sessions held (stopped at {last.get('sessions')}: p99 "
        f"{last.get('p99_ms', math.nan):.1f} ms, server "
        f"{last.get('server_cpu_util', math.nan):.0%} of a core, load generator "
        f"{last.get('client_cpu_util', math.nan):.0%}, its sends late by "
        f"{last.get('lateness_p99_ms', math.nan):.1f} ms at p99; other processes "
        f"{background['other_share']:.0%}, {_load()})"
    )
    return result


# ------------------------------------------------------------------------------- the report
def _mid(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _range(values: Sequence[float], fmt: str, unit: str = "") -> str:
    if not values:
        return DASH
    shown = f"{_mid(values):{fmt}}{unit}"
    return shown + (f" ({min(values):{fmt}}{DASH}{max(values):{fmt}})" if len(values) > 1 else "")


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
                f"| 0 (idle) | {_range([s['server_cores'] * 100 for s in a], '.2f', ' %')} "
                f"of a core | {_range([s['server_cores'] * 100 for s in b], '.2f', ' %')} "
                f"| {DASH} | {DASH} | {DASH} | {_range(loads, '.2f')} | {DASH} |"
            )
            continue
        ratios, held = _ratios(a, b)
        if not held:
            met = f"not judged (no round below the knee, of {len(ratios)})"
        else:
            met = "met" if _mid(held) <= CPU_TARGET else "not met"
            met += f" ({_mid(held):.3f}{TIMES} over the {len(held)} of {len(ratios)} rounds held)"
        print(
            f"| {n} | {_range([s['cpu_ms_per_session_s'] for s in a], '.2f', ' ms/s')} "
            f"| {_range([s['cpu_ms_per_session_s'] for s in b], '.2f', ' ms/s')} "
            f"| **{_range(ratios, '.3f', TIMES)}** "
            f"| {_mid([s['p99_ms'] for s in a]):.1f} / {_mid([s['p99_ms'] for s in b]):.1f} ms "
            f"| {_mid([s.get('frames_per_wake', math.nan) for s in a]):.2f} / "
            f"{_mid([s.get('frames_per_wake', math.nan) for s in b]):.2f} "
            f"| {_range(loads, '.2f')} | {met} |"
        )
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
        print(
            f"| {n} | {_range([s['cpu_ms_per_session_s'] for s in a], '.2f', ' ms/s')} "
            f"| {_range([s['cpu_ms_per_session_s'] for s in b], '.2f', ' ms/s')} "
            f"| **{_range(ratios, '.3f', TIMES)}** "
            f"| {_mid([s['p99_ms'] for s in a]):.1f} / {_mid([s['p99_ms'] for s in b]):.1f} ms "
            f"| {_mid([s.get('frames_per_wake', math.nan) for s in a]):.2f} / "
            f"{_mid([s.get('frames_per_wake', math.nan) for s in b]):.2f} "
            f"| {len(held)} of {len(ratios)}: {_range(held, '.3f', TIMES)} |"
        )
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
        f"supervisor took {_mid(sup):.1%} of a core besides; redis-server "
        f"{_mid(red[one]):.3f} / {_mid(red[two]):.3f} ms/s per session)\n"
    )
    return summary


def report_split(
    cpu: dict[int, list[dict[str, Any]]], split: dict[str, Any] | None, workers: int
) -> dict[str, Any]:
    # (N, counts, whether its connections are counted in no other sample): a voice run's
    # windows count the same first sessions again, so only its last one is pooled.
    # A count that does not add up to the sessions open (the reading came too late, or a
    # session failed) is left out, and said.
    samples: list[tuple[int, list[int], bool]] = []
    incomplete = 0
    for run in cpu.get(workers, []):
        steps = [s for s in run["steps"] if "sessions_by_worker" in s and s["sessions"]]
        for i, step in enumerate(steps):
            if sum(step["sessions_by_worker"]) != step["sessions"]:
                incomplete += 1
                continue
            samples.append((step["sessions"], step["sessions_by_worker"], i == len(steps) - 1))
    for sample in (split or {}).get("samples", []):
        if sum(sample["sessions_by_worker"]) != sample["sessions"] or not sample["sessions"]:
            incomplete += 1
            continue
        samples.append((sample["sessions"], sample["sessions_by_worker"], True))
    if not samples:
        return {}
    print(f"### Sessions per worker, --workers {workers} (the kernel's SO_REUSEPORT hash)\n")
    print(
        "| sessions | rounds | sessions per worker, each round | largest deviation from "
        f"even: median (min{DASH}max) | rounds within ±10 % | a fair coin per connection: within "
        "±10 % |"
    )
    print("|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    by_n: dict[int, list[list[int]]] = {}
    for n, counts, _ in samples:
        by_n.setdefault(n, []).append(counts)
    for n in sorted(by_n):
        rounds = by_n[n]
        devs = [deviation(c) for c in rounds]
        within = sum(d <= SPLIT_TARGET + 1e-9 for d in devs)
        fair = f"{fair_within(n, SPLIT_TARGET):.0%}" if workers == 2 and n > 0 else DASH
        shown = ", ".join("/".join(map(str, c)) for c in rounds)
        print(
            f"| {n} | {len(rounds)} | {shown} | **{_range(devs, '.1%')}** "
            f"| {within}/{len(rounds)} | {fair} |"
        )
        summary[str(n)] = {"deviations": devs, "within": within, "rounds": len(rounds)}
    total = sum(sum(c) for _, c, alone in samples if alone)
    first = sum(c[0] for _, c, alone in samples if alone)
    z = (first - total / workers) / math.sqrt(total * (1 / workers) * (1 - 1 / workers))
    leaning = (
        "|z| < 2: no sign that the hash favours a worker"
        if abs(z) < 2
        else "|z| >= 2: worker 0 took more (or fewer) than a fair hash would give"
    )
    print(
        f"\nPooled (each connection once: every idle round, each voice run's last window): "
        f"worker 0 took {first:,} of {total:,} sessions ({first / total:.1%}; "
        f"an even share is {1 / workers:.1%}; z = {z:+.2f}, {leaning}). A fair coin per "
        "connection deviates by about 1/√N at W = 2: ±10 % holds for 95 % of rounds only "
        "from about 400 sessions on."
        + (f" {incomplete} count(s) that did not add up were left out." if incomplete else "")
        + "\n"
    )
    summary["pooled"] = {"worker0": first, "total": total, "z": z, "left_out": incomplete}
    return summary


def report_capacity(
    caps: dict[int, list[dict[str, Any]]], counts: list[int], ratio: float, args: argparse.Namespace
) -> dict[str, Any]:
    one, two = counts[0], counts[-1]
    print("### Capacity with cores (load generator and redis-server pinned to their own core)\n")
    print(
        "| --workers | server cores | load generator's | voice sessions held at p99 ≤ 20 ms "
        "| at the stop: server CPU, load generator CPU | load avg |"
    )
    print("|---|---|---|---|---|---|")
    held: dict[int, list[int]] = {}
    for w in counts:
        runs = caps.get(w, [])
        if not runs:
            continue
        # The fine ramps decide; one that failed at its first step (the machine got busier)
        # found nothing and is dropped; if every one did, the coarse ramp's figure stands.
        deciding = [r for r in runs[1:] if r["largest"]] or runs[:1]
        held[w] = [r["largest"] for r in deciding if r["largest"]]
        stops = [r["steps"][-1] for r in deciding if r["steps"]]
        srv = [s.get("server_cpu_util", math.nan) for s in stops]
        cli = [s.get("client_cpu_util", math.nan) for s in stops]
        loads = [r["background"]["loadavg_1m"] for r in runs]
        print(
            f"| {w} | {','.join(map(str, runs[0]['server_cpus']))} "
            f"| {','.join(map(str, runs[0]['client_cpus']))} "
            f"| **{_range([float(h) for h in held[w]], '.0f')}** "
            f"| {_mid(srv):.0%}, {_mid(cli):.0%} | {_range(loads, '.2f')} |"
        )
    summary: dict[str, Any] = {"held": {str(w): h for w, h in held.items()}}
    s1, s2 = cores_for(one, args.cores)[0], cores_for(two, args.cores)[0]
    if not (held.get(one) and held.get(two)):
        print(
            f"\n--workers {two} on {len(s2)} core(s) over --workers {one} on {len(s1)}: not "
            "measured (a ramp held none of its steps)\n"
        )
        return summary
    c1, c2 = _mid(held[one]), _mid(held[two])
    print(
        f"\n--workers {two} on {len(s2)} core(s) over --workers {one} on {len(s1)}: "
        f"**{c2 / c1:.2f}{TIMES}** (measured)"
    )
    summary["measured_ratio"] = c2 / c1
    others = _mid([r["background"]["other_share"] for w in counts for r in caps.get(w, [])])
    if others > 0.2:
        print(
            f"Other processes took {others:.0%} of the machine during the ramps: where they "
            "share the servers' core, the scheduler gives two workers two shares of it and "
            "one worker one, so these figures say more about the machine than the servers "
            "(run them on a quiet machine)."
        )
    if len(s2) < two:
        # The machine cannot give each worker a core of its own beside the load generator:
        # extrapolate from one worker's sessions per core, the CPU ratio and the split.
        per_core = c1 / len(s1)
        # Never below 1: a worker doing one worker's job on its own core is not expected
        # to beat --workers 1 (a figure below 1 is noise or batching).
        r = max(1.0, ratio) if not math.isnan(ratio) else 1.0
        clamped = "" if math.isnan(ratio) or ratio >= 1 else f", {ratio:.3f} taken as 1"
        n = two * per_core / r
        for _ in range(20):  # the busiest worker, at a split 2 sigma off even (W = 2)
            n = two * per_core / r / (1 + 2 * math.sqrt((two - 1) / n))
        print(
            f"Extrapolation (not measured: this machine has {args.cores} cores and the load "
            f"generator needs one): --workers {two} on {two} cores, load from elsewhere, holds "
            f"about {two} {TIMES} {per_core:.0f} / {r:.3f} (the CPU ratio, {args.ratio_source}"
            f"{clamped}) = {two * per_core / r:.0f} sessions with an even split"
            f", or **{n:.0f}** if the busiest worker takes a 2-sigma share of "
            f"the kernel's hash (≈ {2 * math.sqrt((two - 1) / n):.0%} over even at that N): "
            f"{n / c1:.2f}{TIMES} --workers {one}. Capacity scales with the workers, one core "
            "each, as long as each has a core (a worker is one thread; --workers 1 cannot use "
            "a second core) and the cluster store keeps up.\n"
        )
        summary["extrapolated"] = {"sessions": n, "even_split": two * per_core / r}
    else:
        print()
    return summary


def _own_steps(per_worker: Sequence[int], workers: int) -> list[int]:
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
        for run1, run2 in zip(own.get(one, []), own.get(two, []), strict=False):
            curve = [(s["sessions"], s["server_cores"]) for s in run1["steps"] if s["sessions"]]
            for y in run2["steps"]:
                if y["sessions"] != n or key not in y or not curve:
                    continue
                mine = y["own_core_sessions"]
                base = 1000 * interpolate(curve, mine) / mine
                p99_1 = max(s["p99_ms"] for s in run1["steps"] if s["sessions"])
                wake = y.get("frames_per_wake", math.nan)
                rows.append((mine, y[key], base, y[key] / base, p99_1, y["p99_ms"], wake))
        if not rows:  # the kernel gave worker 0 none of the sessions (a small N)
            print(f"| 0 (--workers {two} at {n}) | {DASH} | {DASH} | {DASH} | {DASH} | {DASH} "
                  "| not judged (worker 0 got no session) |")  # fmt: skip
            continue
        ratios = [r[3] for r in rows]
        held = [r[3] for r in rows if max(r[4], r[5]) <= THRESHOLD_MS]
        if not held:
            met = f"not judged (no round below the knee, of {len(ratios)})"
        else:
            met = "met" if _mid(held) <= CPU_TARGET else "not met"
            met += f" ({_mid(held):.3f}{TIMES}, {len(held)} of {len(ratios)} rounds held)"
        fpw_one = _mid(
            [s.get("frames_per_wake", math.nan) for run in own.get(one, []) for s in run["steps"]]
        )
        print(
            f"| {', '.join(str(r[0]) for r in rows)} (--workers {two} at {n}) "
            f"| {_range([r[1] for r in rows], '.2f', ' ms/s')} "
            f"| {_range([r[2] for r in rows], '.2f', ' ms/s')} "
            f"| **{_range(ratios, '.3f', TIMES)}** "
            f"| {_mid([r[4] for r in rows]):.1f} / {_mid([r[5] for r in rows]):.1f} ms "
            f"| {fpw_one:.2f} / {_mid([r[6] for r in rows]):.2f} | {met} |"
        )
        summary[str(n // two)] = {"ratio": ratios, "held": held, "met": met.startswith("met")}
    loads = [run["background"]["loadavg_1m"] for w in (one, two) for run in own.get(w, [])]
    print(
        f"\n(load avg {_range(loads, '.2f')}; echoes per wake-up: all workers together; "
        f"--workers {two}'s p99 covers all its sessions, also those of the worker that shares "
        "its core with the load generator)\n"
    )
    return summary


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
            ratio = _mid(summary["cpu"][best]["held"])
            args.ratio_source = f"the same sessions per worker, {best.removeprefix('per_worker_')}"
        elif at_largest.get("held"):
            ratio = _mid(at_largest["held"])
            args.ratio_source = f"the same sessions in all, {largest}"
    if "own" in parts:
        summary["own"] = report_own(own, args.counts)
        held = [k for k, v in summary["own"].items() if v["held"]]
        if held:  # the figure that decides capacity: a worker on a core of its own
            best = max(held, key=int)
            ratio = _mid(summary["own"][best]["held"])
            args.ratio_source = f"a worker on a core of its own, {best} sessions per worker"
    if parts & {"cpu", "own", "split"}:
        merged = {w: cpu.get(w, []) + own.get(w, []) for w in args.counts}
        summary["split"] = report_split(merged, split, two)
    if "capacity" in parts:
        summary["capacity"] = report_capacity(caps, args.counts, ratio, args)
    return summary


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    _say(f"benchmarks.workers: {args.cores} cores, {_load()} at the start")
    with redis() as (redis_proc, redis_url):
        if "cpu" in parts:
            for i in range(args.rounds):
                for w in args.counts if i % 2 == 0 else args.counts[::-1]:
                    cpu[w].append(cpu_run(w, args, redis_proc, redis_url))
        if "own" in parts:
            redis_proc.ps.cpu_affinity(list(range(1, args.cores)) or [0])  # off core 0
            for i in range(args.rounds):
                for w in args.counts if i % 2 == 0 else args.counts[::-1]:
                    steps = _own_steps(args.own_sessions, w)
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
