"""How long one client's large message stalls another session: the fairness figure.

    python -m benchmarks.stall                     # this tree
    python -m benchmarks.stall --tree ../other     # and another checkout, to compare

A server (``trio-duplex serve``, echo engine, its own process) holds two sessions. The
neighbour sends a heartbeat every 20 ms (a voice session's frame pace) and times each
round trip. Meanwhile another process sends ``--messages`` messages of ``--mib`` MiB
(an event type the engine does not take, so the server's work is reading and decoding
it, then a short ``error``). Reported: the neighbour's round trips while the large
messages flow (median, 99th percentile, max) and, for reference, while nothing else
happens. A stall of the event loop shows as the max.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from websockets.sync.client import connect

from ._procs import free_port

PACE_S = 0.02


def _serve(tree: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_duplex",
            "serve",
            "--port",
            str(port),
            "--max-event-bytes",
            str(16 << 20),
            "--log-level",
            "warning",
        ],
        cwd=tree,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with connect(f"ws://127.0.0.1:{port}/v1/duplex", open_timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)  # polling a starting subprocess: a benchmark, not a test
    proc.kill()
    raise RuntimeError(f"no server from {tree}")


def _attack(port: int, mib: int, messages: int, done: multiprocessing.synchronize.Event) -> None:
    text = json.dumps({"type": "large.unknown", "audio": "QUJD" * (mib << 18)})
    with connect(
        f"ws://127.0.0.1:{port}/v1/duplex", max_size=None, open_timeout=10, close_timeout=5
    ) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        ws.recv()
        for _ in range(messages):
            ws.send(text)
            ws.recv()  # its error: one at a time
    done.set()


def _neighbour(port: int, stop: threading.Event, rtts: list[tuple[float, float]]) -> None:
    with connect(f"ws://127.0.0.1:{port}/v1/duplex") as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        ws.recv()
        beat = json.dumps({"type": "session.heartbeat"})
        next_at = time.monotonic()
        while not stop.is_set():
            sent = time.monotonic()
            ws.send(beat)
            ws.recv()
            rtts.append((sent, time.monotonic() - sent))
            next_at += PACE_S
            time.sleep(max(0.0, next_at - time.monotonic()))  # the pace of a voice client


def measure(tree: Path, mib: int, messages: int) -> dict[str, float]:
    port = free_port()
    proc = _serve(tree, port)
    try:
        stop = threading.Event()
        rtts: list[tuple[float, float]] = []
        neighbour = threading.Thread(target=_neighbour, args=(port, stop, rtts))
        neighbour.start()
        time.sleep(2.0)  # the quiet reference
        quiet_until = time.monotonic()
        done = multiprocessing.Event()
        attacker = multiprocessing.Process(target=_attack, args=(port, mib, messages, done))
        attacker.start()
        attacker.join(300)
        loud_until = time.monotonic()
        stop.set()
        neighbour.join(10)
        if not done.is_set():
            raise RuntimeError("the large messages did not all get through")
    finally:
        proc.terminate()
        proc.wait(10)
    quiet = sorted(r for t, r in rtts if t < quiet_until)
    loud = sorted(r for t, r in rtts if quiet_until + 0.5 <= t < loud_until)
    return {
        "quiet_p50_ms": statistics.median(quiet) * 1e3,
        "quiet_max_ms": quiet[-1] * 1e3,
        "loud_p50_ms": statistics.median(loud) * 1e3,
        "loud_p99_ms": loud[int(0.99 * (len(loud) - 1))] * 1e3,
        "loud_max_ms": loud[-1] * 1e3,
        "round_trips": len(loud),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", default=[])
    parser.add_argument("--mib", type=int, default=14)
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    trees = [Path.cwd(), *args.tree]
    print(f"neighbour heartbeat round trips (ms) while {args.messages} x {args.mib} MiB arrive")
    print("| tree | quiet p50 | quiet max | loaded p50 | loaded p99 | loaded max | n |")
    print("|---|---|---|---|---|---|---|")
    for tree in trees:
        r = measure(tree, args.mib, args.messages)
        print(
            f"| {tree} | {r['quiet_p50_ms']:.2f} | {r['quiet_max_ms']:.2f} | "
            f"{r['loud_p50_ms']:.2f} | {r['loud_p99_ms']:.2f} | {r['loud_max_ms']:.2f} | "
            f"{r['round_trips']:.0f} |"
        )


if __name__ == "__main__":
    main()
