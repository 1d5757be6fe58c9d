"""Instructions the server spends per event, counted by callgrind: repeatable where
wall-clock and CPU-time figures are not (a shared machine's steal and frequency change
move those by 10-30 % between runs; an instruction count moves by well under 1 %).

    python -m benchmarks.instructions                      # this tree
    python -m benchmarks.instructions --tree ../other      # another checkout, to compare
    python -m benchmarks.instructions --events 2000 --runs 2
    python -m benchmarks.instructions --handshakes 300 [--bare]  # per session opened+closed

The server runs under ``valgrind --tool=callgrind`` on the echo engine; a client in this
process opens one session and sends ``N`` then ``2N`` 100-byte ``input.text.append``
events, ``--window`` at a time, reading every echo. Per event = (count at 2N - count at N) / N, so
start-up, the handshake and the shutdown cancel out. Needs ``valgrind`` (Debian's
package) and is slow (~1 min a run): a measuring tool, not part of the suite.

``--handshakes N`` counts a session instead: ``N`` then ``2N`` sequential loops of
connect, ``session.update``, ``session.created``, ``session.close``, ``session.closed``,
close (scenario 5's); with ``--bare``, the bare trio-websocket server's (connect, 2 echo
round trips, close). User-space instructions only: the kernel's accept, epoll and close
are not counted, and are about the same for both servers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from websockets.sync.client import connect

READY = re.compile(r"(?:serving|echo on) (ws://\S+)")
TEXT = "x" * 60  # with the envelope, a ~100-byte message each way


def count(
    tree: Path,
    events: int,
    window: int,
    handshakes: bool = False,
    bare: bool = False,
    concurrency: int = 1,
) -> int:
    """Instructions of one server process that served ``events`` echoes (or, with
    ``handshakes``, ``events`` sessions opened and closed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            *(("benchmarks.suite.servers.bare_trio",) if bare else ("trio_duplex", "serve")),
            "--port",
            "0",
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
        # The loop-lag watchdog probes the loop 20 times a second of wall time, and under
        # callgrind each event takes ~50 times longer: its cost would show as a per-event
        # one. It is not on the per-event path; leave it out of this count.
        # (Looked for in the whole package: the setting's module is not the same in every
        # checkout this may compare.)
        package = (tree / "trio_duplex").rglob("*.py")
        if not bare and any("loop_lag_warning_s" in path.read_text() for path in package):
            argv += ["--loop-lag-warning", "0"]
        proc = subprocess.Popen(argv, cwd=tree, env=env, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        url = ""
        for line in proc.stderr:
            match = READY.search(line)
            if match:
                url = match.group(1)
                break
        if not url:
            proc.kill()
            raise SystemExit(f"the server under valgrind did not start ({tree})")
        # A session's log lines (two at INFO) would fill the pipe and stall the server.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        try:
            if handshakes:
                drive_handshakes(url, events, bare, concurrency)
            else:
                drive(url, events, window)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
        totals = re.search(r"^(?:totals|summary): (\d+)", out.read_text(), re.M)
        assert totals is not None, "no totals in the callgrind output"
        return int(totals.group(1))


def drive(url: str, events: int, window: int) -> None:
    with connect(url, max_size=None, open_timeout=120, close_timeout=120) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=120))["type"] == "session.created"
        sent = received = 0
        while received < events:
            while sent < events and sent - received < window:
                ws.send(json.dumps({"type": "input.text.append", "text": TEXT}))
                sent += 1
            reply = json.loads(ws.recv(timeout=120))
            if reply.get("type") == "response.output_text.delta":
                received += 1
        ws.send(json.dumps({"type": "session.close"}))
        while json.loads(ws.recv(timeout=120))["type"] != "session.closed":
            pass


def drive_handshakes(url: str, sessions: int, bare: bool, concurrency: int = 1) -> None:
    """``sessions`` loops in all, ``concurrency`` at a time (threads, as scenario 5's 8)."""
    if concurrency > 1:
        shares = [
            sessions // concurrency + (i < sessions % concurrency) for i in range(concurrency)
        ]
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            for done in [pool.submit(drive_handshakes, url, n, bare) for n in shares]:
                done.result()
        return
    for _ in range(sessions):  # (no permessage-deflate offered, as scenario 5's client)
        with connect(
            url, compression=None, max_size=None, open_timeout=120, close_timeout=120
        ) as ws:
            if bare:
                for _ in range(2):
                    ws.send(json.dumps({"type": "input.text.append", "text": TEXT}))
                    ws.recv(timeout=120)
                continue
            ws.send(json.dumps({"type": "session.update", "session": {}}))
            assert json.loads(ws.recv(timeout=120))["type"] == "session.created"
            ws.send(json.dumps({"type": "session.close"}))
            while json.loads(ws.recv(timeout=120))["type"] != "session.closed":
                pass


def per_event(
    tree: Path,
    events: int,
    window: int,
    handshakes: bool = False,
    bare: bool = False,
    concurrency: int = 1,
) -> float:
    small = count(tree, events, window, handshakes, bare, concurrency)
    large = count(tree, 2 * events, window, handshakes, bare, concurrency)
    return (large - small) / events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="checkout to measure")
    parser.add_argument("--events", type=int, default=2000, help="N (default 2000)")
    parser.add_argument("--runs", type=int, default=1, help="repeat and show each (1)")
    parser.add_argument(
        "--window",
        type=int,
        default=1,
        help="events in flight (1: round trips, every event takes the same path and the "
        "count repeats; 64: pipelined, batching varies with timing, about ±4 %%)",
    )
    parser.add_argument(
        "--handshakes",
        type=int,
        default=0,
        metavar="N",
        help="count per session opened and closed instead, N then 2N of them (scenario 5)",
    )
    parser.add_argument(
        "--bare", action="store_true", help="with --handshakes: the bare trio-websocket server"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="with --handshakes: loops at a time (1; scenario 5 runs 8)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    tree = args.tree.resolve()
    for _ in range(args.runs):
        if args.handshakes:
            figure = per_event(tree, args.handshakes, 1, True, args.bare, args.concurrency)
            who = "bare trio-websocket" if args.bare else str(tree)
            print(
                f"{who}: {figure:,.0f} instructions per session opened+closed, "
                f"{args.concurrency} at a time",
                flush=True,
            )
            continue
        figure = per_event(tree, args.events, args.window)
        print(f"{tree}: {figure:,.0f} instructions per event, window {args.window}", flush=True)


if __name__ == "__main__":
    main()
