"""The suite's shell: which servers exist, how they and the load generators are started.

A scenario asks for ``suite.server(kind)`` (a context manager that always stops the
process) and ``suite.client(...)``; ``suite.interleave`` runs variants A B, B A, ... and
keeps each variant's runs aligned by round, so ratios can be taken pair by pair.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from benchmarks.suite._plan import Plan
from benchmarks.suite._procs import (
    PY,
    ROOT,
    BenchError,
    Proc,
    free_port,
    pinned,
    run_client,
    start_server,
)
from benchmarks.suite._stats import Row

PEER = Path(__file__).resolve().parent / "peer"
SERVER_CPU = "0"
CLIENT_CPU = "1"

NAMES = {
    "duplex": "trio-duplex",
    "bare_trio": "bare trio-websocket",
    "bare_asyncio": "bare websockets",
    "socketio": "Socket.IO 4.8",
}

DEFAULT_DUPLEX_CMD = [PY, "-m", "trio_duplex", "serve"]


def duplex_flags(port: int) -> list[str]:
    """Limits wide enough that the benchmark, not a limit, is what it measures."""
    return [
        "--host", "127.0.0.1",
        "--port", str(port),
        "--engine", "echo",
        "--max-sessions", "20000",
        "--disconnect-grace", "30",
        "--idle-ttl", "600",
        "--journal-max-bytes", str(64 * 2**20),
        "--journal-ttl", "60",
        "--max-event-bytes", str(15 * 2**20),
        "--max-connections", "20000",
        "--max-connections-per-ip", "20000",
        "--config-timeout", "10",
        "--drain-timeout", "1",
        "--log-level", "info",
    ]  # fmt: skip


@attrs.frozen
class Variant:
    """One side of a comparison: a server kind and how to drive it."""

    name: str
    server: str
    run: Callable[[Proc, str], dict[str, Any]]


@attrs.define
class Suite:
    plan: Plan
    duplex_cmd: list[str] = attrs.field(factory=lambda: list(DEFAULT_DUPLEX_CMD))
    pin: bool = True
    log_level: str = "info"
    rows: list[Row] = attrs.field(factory=list)
    raw: dict[str, Any] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    missing: dict[str, str] = attrs.field(factory=dict)  # server kind -> why it cannot run
    deadline: float = float("inf")  # monotonic time by which the current scenario should end

    def begin(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    # ------------------------------------------------------------------ availability
    def check(self) -> None:
        """Find out, once, which servers can run here; say why one cannot."""
        try:
            probe = subprocess.run(
                [*self.duplex_cmd, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30
            )
            if probe.returncode != 0:
                self.missing["duplex"] = (
                    f"`{shlex.join(self.duplex_cmd)} --help` failed: "
                    + (probe.stderr.strip().splitlines() or ["no output"])[-1]
                )
        except (OSError, subprocess.SubprocessError) as exc:
            self.missing["duplex"] = f"cannot run {self.duplex_cmd[0]}: {exc}"
        reason = ensure_peer()
        if reason:
            self.missing["socketio"] = reason
        for kind, why in self.missing.items():
            self.say(f"SKIP {NAMES[kind]}: {why}")

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        self.notes.append(text)

    def available(self, kind: str) -> bool:
        return kind not in self.missing

    # ------------------------------------------------------------------ processes
    def server_argv(self, kind: str, port: int) -> list[str]:
        if kind == "duplex":
            flags = duplex_flags(port)
            flags[flags.index("--log-level") + 1] = self.log_level
            argv = [*self.duplex_cmd, *flags]
        elif kind == "bare_trio":
            argv = [PY, "-m", "benchmarks.suite.servers.bare_trio", "--port", str(port)]
        elif kind == "bare_asyncio":
            argv = [PY, "-m", "benchmarks.suite.servers.bare_asyncio", "--port", str(port)]
        elif kind == "socketio":
            node = shutil.which("node") or "node"
            argv = [node, "--expose-gc", str(PEER / "server.js"), "--port", str(port)]
        else:
            raise ValueError(kind)
        return pinned(argv, SERVER_CPU if self.pin else None)

    @contextlib.contextmanager
    def server(self, kind: str) -> Iterator[tuple[Proc, str]]:
        if kind in self.missing:
            raise BenchError(f"{NAMES[kind]} is not available: {self.missing[kind]}")
        port = free_port()
        quiet = kind == "duplex" and self.log_level not in ("debug", "info")
        probe = f"ws://127.0.0.1:{port}/v1/duplex" if quiet else None
        proc, url = start_server(NAMES[kind], self.server_argv(kind, port), probe=probe)
        try:
            yield proc, url
        finally:
            proc.stop()

    def py_client(self, module: str, args: Sequence[str]) -> list[str]:
        return pinned([PY, "-m", f"benchmarks.suite.clients.{module}", *args], self.client_cpu)

    def node_client(self, args: Sequence[str]) -> list[str]:
        node = shutil.which("node") or "node"
        return pinned([node, str(PEER / "client.js"), *args], self.client_cpu)

    @property
    def client_cpu(self) -> str | None:
        return CLIENT_CPU if self.pin else None

    def client(
        self, argv: Sequence[str], *, watch: Proc | None, timeout: float
    ) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
        script = next((a for a in argv if a.startswith("benchmarks.") or a.endswith(".js")), "")
        name = f"load generator {Path(script).name or argv[0]}"
        return run_client(name, argv, watch=watch, timeout=timeout)

    # ------------------------------------------------------------------ interleaving
    def interleave(
        self, scenario: str, variants: Sequence[Variant], rounds: int
    ) -> dict[str, list[dict[str, Any] | None]]:
        """Run every available variant once per round, A B ... then ... B A (drift cancels).

        A failed run is recorded as None in its round, so pairs stay aligned. A round that
        would not fit in the scenario's time budget (judged by the slowest round so far) is
        not started: a busy machine gets fewer rounds, never a longer suite.
        """
        runnable = [v for v in variants if self.available(v.server)]
        out: dict[str, list[dict[str, Any] | None]] = {v.name: [] for v in variants}
        slowest = 0.0
        done = 0
        for r in range(rounds):
            if r > 0 and self.time_left() < slowest:
                self.say(f"{scenario}: {r} of {rounds} rounds, the rest did not fit its budget")
                break
            r0 = time.monotonic()
            order = runnable if r % 2 == 0 else runnable[::-1]
            for v in order:
                t0 = time.monotonic()
                try:
                    with self.server(v.server) as (proc, url):
                        result = v.run(proc, url)
                except BenchError as exc:
                    self.fail(f"{scenario} / {v.name} round {r + 1}", exc)
                    result = None
                out[v.name].append(result)
                print(
                    f"  {scenario}: {v.name} round {r + 1}/{rounds} "
                    f"({time.monotonic() - t0:.1f}s){'' if result else ' FAILED'}",
                    file=sys.stderr,
                    flush=True,
                )
            slowest = max(slowest, time.monotonic() - r0)
            done += 1
        for v in variants:
            if not self.available(v.server):
                out[v.name] = [None] * done
        self.raw.setdefault(scenario, {}).update(out)
        return out

    def fail(self, what: str, exc: BaseException) -> None:
        detail = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
        text = f"{what}: {detail.strip()}"
        print("ERROR " + text, file=sys.stderr, flush=True)
        self.errors.append(text)


def ensure_peer() -> str | None:
    """Install the Socket.IO peer from its lock file if needed; None, or why it can't run."""
    node = shutil.which("node")
    if node is None:
        return "Node.js (`node`) is not on PATH; install Node >= 18 to compare with Socket.IO"
    if (PEER / "node_modules" / "socket.io" / "package.json").exists() and (
        PEER / "node_modules" / "socket.io-client" / "package.json"
    ).exists():
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not on PATH, so the Socket.IO peer cannot be installed"
    print("installing the Socket.IO peer: npm ci in benchmarks/peer", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=PEER,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"npm ci failed: {exc}"
    if done.returncode != 0:
        return "npm ci failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1]
    return None


def server_cpu(
    result: dict[str, Any], start: str = "window_start", end: str = "window_end"
) -> float:
    """Server CPU seconds between two of the load generator's marks."""
    marks = result["server"]
    return float(marks[end]["cpu"] - marks[start]["cpu"])
