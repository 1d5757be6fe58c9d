"""Instructions the server spends per event, counted by callgrind: repeatable where
wall-clock and CPU-time figures are not (a shared machine's steal and frequency change
move those by 10-30 % between runs; an instruction count by a few per cent, as batching
follows timing: compare medians of ``--runs 3``).

    python -m benchmarks.instructions                      # this tree
    python -m benchmarks.instructions --tree ../other      # another checkout, to compare
    python -m benchmarks.instructions --events 2000 --runs 2
    python -m benchmarks.instructions --turns text --dialect openai   # per turn, /v1/realtime
    python -m benchmarks.instructions --turns voice --dialect native  # the same, /v1/duplex
    python -m benchmarks.instructions --handshakes 300 [--bare]  # per session opened+closed

The server runs under ``valgrind --tool=callgrind`` on the echo engine; a client in this
process opens one session and sends ``N`` then ``2N`` 100-byte ``input.text.append``
events, ``--window`` at a time, reading every echo. Per event = (count at 2N - count at N) / N, so
start-up, the handshake and the shutdown cancel out. Needs ``valgrind`` (Debian's
package) and is slow (~1 min a run): a measuring tool, not part of the suite.

``--turns text|voice`` counts scenario 8's conversation instead (its client events,
``benchmarks/suite/clients/dialects.py``), per turn, on ``--dialect native`` (``/v1/duplex``)
or ``openai`` (``/v1/realtime``): a text turn is ``conversation.item.create`` and
``response.create``, a voice turn ten 20 ms ``input_audio_buffer.append``, a commit and
``response.create``; a turn ends with its ``response.done``, and the client acks every
100 server events. ``--events`` is then the turns N (default 500) and ``--window`` the
turns in flight. The figure is per turn, and per server event of the turn beside it.

``--handshakes N`` counts a session instead: ``N`` then ``2N`` sequential loops of
connect, ``session.update``, ``session.created``, ``session.close``, ``session.closed``,
close (scenario 5's); with ``--bare``, the bare trio-websocket server's (connect, 2 echo
round trips, close). User-space instructions only: the kernel's accept, epoll and close
are not counted, and are about the same for both servers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from websockets.sync.client import ClientConnection, connect

from benchmarks.suite._workload import VOICE_JSON
from benchmarks.suite.clients.dialects import COMMIT, ITEM, OPEN_NATIVE, RESPONSE

READY = re.compile(r"(?:serving|echo on) (ws://\S+)")
TEXT = "x" * 60  # with the envelope, a ~100-byte message each way


def count(tree: Path, events: int, drive: Callable[[str, int], object], bare: bool = False) -> int:
    """Instructions of one server process that served ``drive(url, events)``: echoes,
    turns, or sessions opened and closed (``bare``: the bare trio-websocket server's)."""
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
            drive(url, events)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
        totals = re.search(r"^(?:totals|summary): (\d+)", out.read_text(), re.M)
        assert totals is not None, "no totals in the callgrind output"
        return int(totals.group(1))


def drive_echo(url: str, events: int, window: int) -> None:
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


TURN_FRAMES = 10  # a voice turn: 200 ms of 20 ms appends, as scenario 8's


def _realtime(url: str) -> str:
    """The server's ``/v1/realtime`` URL (scenario 8's ``dialect_url``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/v1/realtime", "model=bench", ""))


def drive_turns(url: str, turns: int, window: int, kind: str, dialect: str) -> int:
    """Scenario 8's conversation, ``turns`` turns, ``window`` in flight; the server
    events read."""
    if dialect == "openai":
        url = _realtime(url)
    turn = [ITEM, RESPONSE] if kind == "text" else [VOICE_JSON] * TURN_FRAMES + [COMMIT, RESPONSE]
    with connect(url, max_size=None, open_timeout=120, close_timeout=120) as ws:
        if dialect == "native":
            ws.send(OPEN_NATIVE)
        assert json.loads(ws.recv(timeout=120))["type"] == "session.created"
        sent = done = events = 0
        while done < turns:
            while sent < turns and sent - done < window:
                for message in turn:
                    ws.send(message)
                sent += 1
            event = json.loads(ws.recv(timeout=120))
            events += 1
            if event["type"] == "response.done":
                done += 1
            elif event["type"] == "error":
                raise SystemExit(f"the server answered an error: {event}")
            seq = event.get("server_event_seq")
            if seq is not None and seq % 100 == 0:
                ws.send(f'{{"type":"session.event_ack","server_event_seq":{seq}}}')
        _close(ws)
        return events


def _close(ws: ClientConnection) -> None:
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
    tree: Path, events: int, drive: Callable[[str, int], object], bare: bool = False
) -> float:
    small = count(tree, events, drive, bare)
    large = count(tree, 2 * events, drive, bare)
    return (large - small) / events


def server_events_per_turn(kind: str, dialect: str) -> int:
    """The server events of one turn of ``kind`` (scenario 8's counts): what the per
    turn figure is divided by for the per event one."""
    return {("text", "native"): 5, ("text", "openai"): 12,
            ("voice", "native"): 7, ("voice", "openai"): 15}[kind, dialect]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="checkout to measure")
    parser.add_argument("--events", type=int, help="N (default 2000 events; 500 turns)")
    parser.add_argument("--runs", type=int, default=1, help="repeat and show each (1)")
    parser.add_argument(
        "--window",
        type=int,
        default=1,
        help="events in flight (1: round trips, every event takes the same path and the "
        "count repeats; 64: pipelined, batching varies with timing, about ±4 %%)",
    )
    parser.add_argument(
        "--turns",
        choices=["text", "voice"],
        help="count scenario 8's conversation per turn instead of the echo",
    )
    parser.add_argument(
        "--dialect",
        choices=["native", "openai"],
        default="native",
        help="with --turns: /v1/duplex (native) or /v1/realtime (openai)",
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
    if args.turns is None and args.dialect != "native":
        raise SystemExit("the echo is native events: --dialect openai needs --turns")
    tree = args.tree.resolve()
    n = args.events or (2000 if args.turns is None else 500)
    window, turns, dialect, bare = args.window, args.turns, args.dialect, args.bare
    drive: Callable[[str, int], object]
    if args.handshakes:
        n, concurrency = args.handshakes, args.concurrency
        drive = functools.partial(drive_handshakes, bare=bare, concurrency=concurrency)
        who = "bare trio-websocket" if bare else str(tree)
        unit = f"session opened+closed, {concurrency} at a time"
    elif turns is None:
        drive = functools.partial(drive_echo, window=window)
        who, unit = str(tree), f"event, window {window}"
    else:
        drive = functools.partial(drive_turns, window=window, kind=turns, dialect=dialect)
        who, unit = str(tree), f"{turns} turn ({dialect}), window {window}"
    for _ in range(args.runs):
        figure = per_event(tree, n, drive, bare)
        extra = ""
        if turns is not None and not args.handshakes:
            per = figure / server_events_per_turn(turns, dialect)
            extra = f" ({per:,.0f} per server event)"
        print(f"{who}: {figure:,.0f} instructions per {unit}{extra}", flush=True)


if __name__ == "__main__":
    main()
