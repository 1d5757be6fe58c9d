"""Starting, watching and always stopping the server and load-generator processes.

Every process is started in its own process group and registered with the module's
reaper; ``Proc.stop`` (called from ``finally`` blocks and, as a last resort, at exit and
on SIGINT/SIGTERM) ends it by its id: SIGTERM, a short wait, then SIGKILL.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
URL_RE = re.compile(r"ws://127\.0\.0\.1:(\d+)(/\S*)?")

_live: dict[int, Proc] = {}
_live_lock = threading.Lock()


class BenchError(RuntimeError):
    """A run that could not be measured (a process died, timed out or said no)."""


def pinned(argv: Sequence[str], cpu: str | None) -> list[str]:
    """``taskset -c CPU argv`` where taskset exists and the machine has the core."""
    if cpu is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return list(argv)
    return ["taskset", "-c", cpu, *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A started child process with its output drained by a thread (so it never blocks)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        stdout_lines: bool = False,
        on_stdout: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        self.popen = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_lines else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        with _live_lock:
            _live[self.popen.pid] = self
        self.ps = psutil.Process(self.popen.pid)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout_q: queue.Queue[str | None] = queue.Queue()
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self._on_stdout = on_stdout
        if stdout_lines:
            threading.Thread(target=self._drain_stdout, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _drain_stderr(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.stderr_tail.append(line.rstrip())
            self.lines.put(line)
        self.lines.put(None)

    def _drain_stdout(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if self._on_stdout is not None:
                self._on_stdout(line)
            self.stdout_q.put(line)
        self.stdout_q.put(None)

    def snapshot(self) -> dict[str, float]:
        """CPU seconds (user + system) and RSS bytes of the process, now."""
        try:
            with self.ps.oneshot():
                cpu = self.ps.cpu_times()
                mem = self.ps.memory_info()
        except psutil.Error as exc:
            raise BenchError(f"{self.name} is gone: {exc}\n{self.tail()}") from None
        return {"t": time.monotonic(), "cpu": cpu.user + cpu.system, "rss": float(mem.rss)}

    def tail(self, n: int = 15) -> str:
        return "\n".join(list(self.stderr_tail)[-n:])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; idempotent."""
        try:
            if self.popen.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.popen.wait(grace)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.popen.wait(5)
        finally:
            # Anything this child started in its own group goes too (taskset execs, so
            # normally there is nothing).
            self._signal(signal.SIGKILL, group_only=True)
            with _live_lock:
                _live.pop(self.popen.pid, None)

    def _signal(self, sig: int, group_only: bool = False) -> None:
        pid = self.popen.pid
        try:
            os.killpg(pid, sig)  # its own group, made by start_new_session
        except (ProcessLookupError, PermissionError):
            if not group_only:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def start_server(
    name: str, argv: Sequence[str], *, timeout: float = 20.0, probe: str | None = None
) -> tuple[Proc, str]:
    """Start a server and wait for the line holding its ``ws://127.0.0.1:PORT/...`` URL.

    With ``probe`` (the URL it will serve), a server that logs no such line (a quieter log
    level) counts as ready once its port accepts a TCP connection.
    """
    proc = Proc(name, argv)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{name} did not report ready in {timeout:.0f}s\n{proc.tail()}")
            try:
                line = proc.lines.get(timeout=min(left, 0.1 if probe else 0.5))
            except queue.Empty:
                if probe and port_open(int(URL_RE.search(probe).group(1))):  # type: ignore[union-attr]
                    return proc, probe
                continue
            if line is None:
                proc.popen.wait(5)
                raise BenchError(
                    f"{name} exited ({proc.popen.returncode}) before ready:\n{proc.tail()}"
                )
            match = URL_RE.search(line)
            if match:
                return proc, match.group(0)
    except BaseException:
        proc.stop()
        raise


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def run_client(
    name: str,
    argv: Sequence[str],
    *,
    watch: Proc | None,
    timeout: float,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Run a load generator to its end; return its ``@result`` and the server snapshots.

    At each ``@mark NAME`` line the watched server's CPU and RSS are sampled at once (in the
    reader thread, so the sample is taken within a millisecond of the mark).
    """
    marks: dict[str, dict[str, float]] = {}

    def on_mark(mark: str) -> None:
        if watch is not None:
            try:
                marks[mark] = watch.snapshot()
            except BenchError:
                pass  # the server died: the main loop reports it

    result = run_to_result(name, argv, on_mark=on_mark, timeout=timeout, watch=watch)
    return result, marks


def run_to_result(
    name: str,
    argv: Sequence[str],
    *,
    on_mark: Callable[[str], None],
    timeout: float,
    watch: Proc | None = None,
    echo: bool = False,
) -> dict[str, Any]:
    """Run a load generator to its end and return its ``@result``; ``on_mark(NAME)`` is
    called in the reader thread at each ``@mark NAME`` line. ``watch``: a server whose
    death ends the run; ``echo``: its other lines go to stderr."""
    result: dict[str, Any] = {}

    def on_line(line: str) -> None:
        if line.startswith("@mark "):
            on_mark(line[6:].strip())

    proc = Proc(name, argv, stdout_lines=True, on_stdout=on_line)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{name} ran past its {timeout:.0f}s bound\n{proc.tail()}")
            try:
                line = proc.stdout_q.get(timeout=min(left, 0.5))
            except queue.Empty:
                if watch is not None and not watch.alive():
                    raise BenchError(f"server {watch.name} died\n{watch.tail()}") from None
                continue
            if line is None:
                break
            if line.startswith("@result "):
                result = json.loads(line[8:])
            elif echo and not line.startswith("@mark "):
                print(line.rstrip(), file=sys.stderr)
        proc.popen.wait(max(1.0, deadline - time.monotonic()))
        if proc.popen.returncode != 0 or not result:
            raise BenchError(
                f"{name} exited {proc.popen.returncode} without a result:\n{proc.tail()}"
            )
        return result
    finally:
        proc.stop(grace=2.0)


def stop_all() -> None:
    with _live_lock:
        procs = list(_live.values())
    for proc in procs:
        proc.stop(grace=2.0)


def _on_signal(signum: int, frame: object) -> None:
    stop_all()
    raise KeyboardInterrupt


def install_reaper() -> None:
    """Stop every child at exit and on SIGTERM/SIGINT, whatever else failed."""
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def http_get_json(port: int, path: str, timeout: float = 5.0) -> Any:
    """GET a JSON document from a local server (the Node peer's /gc)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return json.loads(resp.read())


class LoadMeter:
    """CPU the rest of the machine used while we ran: busy time in /proc/stat, less our own.

    Our own is this process plus every child it has waited for (all of them: each is
    stopped and reaped). Steal is what the hypervisor took from this VM.
    """

    def __init__(self) -> None:
        self.t0, self.busy0, self.steal0, self.ours0 = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        import resource

        tick = os.sysconf("SC_CLK_TCK")
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            fields = [0] * 8
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        busy = (user + nice + system + irq + softirq) / tick
        ours = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            ru = resource.getrusage(who)
            ours += ru.ru_utime + ru.ru_stime
        return time.monotonic(), busy, steal / tick, ours

    def read(self) -> dict[str, float]:
        t1, busy1, steal1, ours1 = self._read()
        wall = max(t1 - self.t0, 1e-9)
        cores = os.cpu_count() or 1
        other = max(0.0, (busy1 - self.busy0) - (ours1 - self.ours0))
        return {
            "wall_s": round(wall, 1),
            "other_cpu_s": round(other, 1),
            "other_share": round(other / (wall * cores), 3),
            "steal_share": round((steal1 - self.steal0) / (wall * cores), 3),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


def machine_info() -> dict[str, Any]:
    import platform

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    versions = {}
    for mod in ("trio", "trio_websocket", "websockets", "wsproto", "psutil"):
        try:
            versions[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            versions[mod] = None
    info["versions"] = versions
    node = shutil.which("node")
    if node:
        try:
            info["node"] = subprocess.run(
                [node, "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["node"] = None
    return info


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis() -> Iterator[tuple[Proc, str]]:
    """A ``redis-server`` of the cluster benchmarks: no persistence, a free loopback port;
    its process and ``redis://`` URL for the block, stopped after it."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise BenchError("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = Proc("redis-server", argv)
    try:
        deadline = time.monotonic() + 10
        while not _answers_ping(port):
            if not proc.alive() or time.monotonic() > deadline:
                raise BenchError(f"redis-server did not answer PING\n{proc.tail()}")
            time.sleep(0.02)  # polling a starting subprocess
        yield proc, f"redis://127.0.0.1:{port}/0"
    finally:
        proc.stop()
