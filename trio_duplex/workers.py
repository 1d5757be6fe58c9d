"""``trio-duplex serve --workers N``: N server processes on one port, supervised.

The supervisor (this module, run by cli.py when ``--workers`` is above 1) serves nothing
itself and never talks to the cluster's store. It

* reserves the port: a socket bound with SO_REUSEPORT, never listening (listen.py), so
  that ``--port 0`` names one port every worker shares, kept for its whole life;
* starts each worker as ``python -m trio_duplex serve <the same arguments> --workers 1
  --reuse-port --relay-port 0 --node-id ID-wI --port PORT`` (restarted: ``ID-wI.1``,
  ``ID-wI.2`` ..., a new node each time): the same command line, so
  the environment (inherited) and the ``--config`` file (named again) reach the workers
  through the same layers, and the later flags override what is worker-specific. Each
  worker is a node of the cluster, with its own relay listener for the resumes that the
  kernel hands to another worker;
* waits until every worker says it is ready (a line on a pipe the worker inherits, the
  hidden ``--ready-fd``), then logs the one ``serving ws://HOST:PORT/PATH`` line;
* restarts a worker that exits unexpectedly, after a backoff that doubles with each
  restart of that worker within the last minute (0.25 s, 0.5 s, ... at most 30 s), so a
  crash loop restarts it about 8 times in its first minute and twice a minute after;
* on SIGTERM or SIGINT sends SIGTERM to every worker, each of which drains its sessions
  and leaves the cluster, and waits for them all, for at most the drain timeout plus the
  engine stop timeout plus a margin, after which it kills the ones left (SIGKILL). It
  exits 0 if every worker did, else with the first non-zero status (128 + N for a
  worker ended by signal N). A second signal is passed on to every worker, which then
  exits at once, as a single server does on a second signal. SIGHUP is passed on too
  (re-read ``--api-key-file``).

How the kernel splits the connections (measured by ``python -m benchmarks.workers``,
2026-12-02, Linux 6.18): each connection goes to the listener its 4-tuple hashes to,
whatever the workers' load, so each is in effect a fair coin. Over 4,500-6,000
connections per run from one client address the first worker took 50.2-50.9 % (|z| < 2:
no lean), and a round of N sessions deviates from an even split by about 1/sqrt(N) for
two workers: within +-10 % in about 95 % of rounds from 400 sessions on, in 60-75 % at
60-100 sessions. Nothing here can make it more even short of a BPF program choosing the
listener (SO_ATTACH_REUSEPORT_EBPF); a new worker (a restart) takes its share of new
connections as soon as it listens, and none of those already held.

The workers run in their own session, so a Ctrl-C at a terminal reaches the supervisor
alone (which then drains them, rather than each worker taking it as its own first
signal and the supervisor's SIGTERM as a second one), and on Linux they are asked to
get SIGTERM if the supervisor dies (PR_SET_PDEATHSIG), so they never outlive it
undrained. Their logs go to the supervisor's stderr, each line naming its node id.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence

import attrs
import trio

from .server.config import ServerConfig
from .server.front.listen import reserve_port

log = logging.getLogger("trio_duplex")

BACKOFF_FIRST_S = 0.25
BACKOFF_MAX_S = 30.0
RESTART_WINDOW_S = 60.0
STOP_MARGIN_S = 5.0
"""Beyond the drain and the engines' stop: the connections' close and leaving the cluster."""
READY = b"ready\n"

_PR_SET_PDEATHSIG = 1


def _on_parent_death() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks for SIGTERM when the supervisor dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell shows it: 128 + N for a process ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _shown(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"status {returncode}"


@attrs.define(eq=False)
class Worker:
    index: int
    base_id: str
    """``ID-wI``: its node id when first started; each restart is a new node,
    ``ID-wI.1``, ``ID-wI.2`` ..., so that the cluster sees the sessions of the process
    that died as lost (their home gone) rather than as held by a live node."""
    starts: int = 0
    proc: subprocess.Popen[bytes] | None = None
    restarts: deque[float] = attrs.field(factory=deque)
    """When it was restarted, within the last RESTART_WINDOW_S."""
    status: int | None = None
    """Its exit status once the supervisor is stopping and it has exited."""

    @property
    def node_id(self) -> str:
        return self.base_id if self.starts <= 1 else f"{self.base_id}.{self.starts - 1}"


@attrs.define(eq=False)
class Supervisor:
    config: ServerConfig
    engine: str
    serve_args: Sequence[str]
    """The ``serve`` command's own arguments, as given to the supervisor."""
    base_id: str
    port: int
    workers: list[Worker] = attrs.field(init=False)
    stopping: bool = False
    exits: list[int] = attrs.field(factory=list)
    """The workers' final exit statuses, in the order they exited."""
    _stop: trio.Event = attrs.field(factory=trio.Event)
    _ready: int = 0
    _all_ready: trio.Event = attrs.field(factory=trio.Event)
    _preexec: Callable[[], None] | None = attrs.field(factory=_on_parent_death)

    def __attrs_post_init__(self) -> None:
        n = self.config.workers
        self.workers = [Worker(i, f"{self.base_id}-w{i}") for i in range(n)]

    # -- one worker ------------------------------------------------------------------------

    def command(self, worker: Worker, ready_fd: int) -> list[str]:
        return [
            *(sys.executable, "-m", "trio_duplex", "serve", *self.serve_args),
            *("--workers", "1", "--reuse-port", "--relay-port", "0"),
            *("--node-id", worker.node_id, "--port", str(self.port)),
            *("--ready-fd", str(ready_fd)),
        ]

    def _spawn(self, worker: Worker) -> trio.lowlevel.FdStream:
        """Start the worker; the stream of its readiness pipe."""
        read, write = os.pipe()
        worker.starts += 1
        try:
            worker.proc = subprocess.Popen(
                self.command(worker, write),
                stdin=subprocess.DEVNULL,
                pass_fds=(write,),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return trio.lowlevel.FdStream(read)

    async def _keep(self, worker: Worker) -> None:
        """Run the worker until the supervisor stops, restarting it when it exits."""
        first = True
        while True:
            ready = self._spawn(worker)
            proc = worker.proc
            assert proc is not None
            async with ready:
                said = b""
                while READY not in said:
                    chunk = await ready.receive_some(64)
                    if not chunk:
                        break
                    said += chunk
            if READY in said:
                log.info("worker %s ready (pid %d)", worker.node_id, proc.pid)
                if first:
                    self._ready += 1
                    if self._ready == len(self.workers):
                        self._all_ready.set()
            returncode = await _wait(proc)
            if self.stopping:
                worker.status = exit_status(returncode)
                self.exits.append(worker.status)
                return
            if first and READY not in said:  # at start: a mistake to report, not to retry
                log.error(
                    "worker %s (pid %d) exited before it was ready (%s); stopping",
                    worker.node_id,
                    proc.pid,
                    _shown(returncode),
                )
                worker.status = exit_status(returncode) or 1
                self.exits.append(worker.status)
                self.begin_stop()
                return
            first = False
            now = trio.current_time()
            while worker.restarts and now - worker.restarts[0] > RESTART_WINDOW_S:
                worker.restarts.popleft()
            delay = min(BACKOFF_FIRST_S * 2 ** len(worker.restarts), BACKOFF_MAX_S)
            worker.restarts.append(now + delay)
            log.warning(
                "worker %s (pid %d) exited unexpectedly (%s); restarting it in %gs "
                "(%d restart(s) of it within the last minute)",
                worker.node_id,
                proc.pid,
                _shown(returncode),
                delay,
                len(worker.restarts),
            )
            with trio.move_on_after(delay):
                await self._stop.wait()
            if self.stopping:
                worker.status = exit_status(returncode)
                self.exits.append(worker.status)
                return

    # -- all of them ---------------------------------------------------------------------------

    def signal_all(self, signum: int) -> None:
        for worker in self.workers:
            proc = worker.proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def begin_stop(self) -> None:
        """SIGTERM to every worker: each drains; bounded by ``_kill_late``."""
        if not self.stopping:
            self.stopping = True
            self._stop.set()
            self.signal_all(signal.SIGTERM)

    @property
    def stop_bound_s(self) -> float:
        config = self.config
        return config.drain_timeout_s + config.engine_stop_timeout_s + STOP_MARGIN_S

    async def _kill_late(self) -> None:
        await self._stop.wait()
        await trio.sleep(self.stop_bound_s)
        left = [w.node_id for w in self.workers if w.proc is not None and w.proc.poll() is None]
        if left:
            log.error(
                "worker(s) %s still running %gs after SIGTERM: killing them",
                ", ".join(left),
                self.stop_bound_s,
            )
            self.signal_all(signal.SIGKILL)

    async def _announce(self) -> None:
        await self._all_ready.wait()
        if self.stopping:
            return
        config = self.config
        host = config.host
        shown = f"[{host}]" if ":" in host else host
        scheme = "ws" if config.tls_cert is None else "wss"
        log.info(
            "serving %s://%s:%d%s (engine %s, %d workers)",
            scheme,
            shown,
            self.port,
            config.path,
            self.engine,
            len(self.workers),
        )
        if config.realtime_path:
            path = config.realtime_path
            log.info("OpenAI Realtime at %s://%s:%d%s", scheme, shown, self.port, path)

    async def run(self) -> int:
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        with trio.open_signal_receiver(*signums) as signals:
            async with trio.open_nursery() as nursery:

                async def keep_all() -> None:
                    async with trio.open_nursery() as workers:
                        for worker in self.workers:
                            workers.start_soon(self._keep, worker)
                    nursery.cancel_scope.cancel()  # every worker has exited for good

                nursery.start_soon(keep_all)
                nursery.start_soon(self._kill_late)
                nursery.start_soon(self._announce)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: passed on to the workers")
                        self.signal_all(signum)
                    elif self.stopping:
                        log.warning("second signal (%s): passed on, the workers exit now", name)
                        self.signal_all(signum)
                    else:
                        log.info(
                            "%s: draining the %d workers (SIGTERM to each)",
                            name,
                            len(self.workers),
                        )
                        self.begin_stop()
        failed = [status for status in self.exits if status != 0]
        log.info("stopped (%s)", "every worker exited 0" if not failed else f"status {failed[0]}")
        return failed[0] if failed else 0


async def _wait(proc: subprocess.Popen[bytes]) -> int:
    """Wait for the process to exit, without blocking trio: its pidfd (Linux ≥ 5.3), else
    a poll every 50 ms."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(proc.pid)
        except OSError:  # already reaped, or not supported by the kernel
            fd = None
        if fd is not None:
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
            return proc.wait()
    while proc.poll() is None:  # noqa: ASYNC110 (no event to wait on: another process)
        await trio.sleep(0.05)
    return proc.wait()


def supervise(config: ServerConfig, engine: str, serve_args: Sequence[str], base_id: str) -> int:
    """Run the workers until signalled; the exit status (see the module's doc)."""
    try:
        reserved = reserve_port(config.host, config.port)
    except OSError as exc:
        print(f"trio-duplex: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    with reserved:
        port: int = reserved.getsockname()[1]
        supervisor = Supervisor(config, engine, serve_args, base_id, port)
        return trio.run(supervisor.run)


__all__ = ["Supervisor", "exit_status", "supervise"]
