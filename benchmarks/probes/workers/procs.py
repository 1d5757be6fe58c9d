"""The processes of ``benchmarks.workers`` (``benchmarks/probes/workers/``): ``serve
--workers W`` in cluster mode, started and read (each worker's CPU seconds and context
switches from psutil, its sessions from /proc), and the load generator's command line at
a niceness, a real-time priority and on cores of its choosing.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from benchmarks.suite._procs import PY, BenchError, Proc, free_port
from benchmarks.suite._suite import duplex_flags

SECRET = "benchmark-cluster-secret-0123456789"
SERVING = re.compile(r"serving (ws://\S+)")
PORT = re.compile(r":(\d+)/")


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


def niced(argv: list[str], nice: int, realtime: int = 0) -> list[str]:
    """At niceness ``nice``; with ``realtime`` (--realtime), under SCHED_FIFO at that
    priority instead, ahead of every ordinary process on the machine."""
    argv = ["nice", "-n", str(nice), *argv] if nice else argv
    return ["chrt", "-f", str(realtime), *argv] if realtime else argv


def pinned(argv: list[str], cpus: Sequence[int] | None) -> list[str]:
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
    proc = Server(f"serve --workers {workers}", pinned(niced(argv, nice, realtime), cpus), workers)
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


def hurry(args: argparse.Namespace) -> None:
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


def voice_client(
    url: str,
    steps: Sequence[int],
    args: argparse.Namespace,
    flags: Sequence[str],
    cpus: Sequence[int] | None,
    realtime: int = 0,
) -> list[str]:
    """The load generator's command line: scenario 3's voice sessions against ``url`` at
    each of ``steps``, with ``flags`` (its windows, its threshold, its time limits), at
    ``--client-nice`` (or real-time priority ``realtime``), on ``cpus``."""
    argv = [
        *(PY, "-m", "benchmarks.suite.clients.asyncio_ws", "voice", "--url", url),
        *("--proto", "duplex", "--lane", args.lane, "--steps", ",".join(map(str, steps))),
        *("--ack-every", "50"),
        *flags,
    ]
    return pinned(niced(argv, args.client_nice, realtime), cpus)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load_avg() -> str:
    return f"load {os.getloadavg()[0]:.2f}"
