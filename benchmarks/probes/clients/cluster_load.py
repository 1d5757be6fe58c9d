"""Load generator of ``benchmarks.cluster``, on `websockets` (asyncio).

Modes:

``resume``
    Sessions opened on the home node, each with K unacked echo events in its journal,
    dropped (no close frame) and resumed either on the home itself or on another node
    (which relays it home), alternating which goes first. Per trial: connect time, then
    from sending ``session.resume`` to ``session.resumed``, to the first replayed event
    and to the K-th.
``throughput``
    Echo events (``input.text.append`` with ``client_event_seq``) pipelined on a few
    sessions, direct to the home or through a relaying node (the session resumed there),
    alternating; then a ping-pong (one event in flight) per path. ``@mark`` lines around
    each window let the orchestrator sample both servers' CPU.
``migrate``
    Voice sessions on the home node, each speaking a long text on the binary lane; once
    all stream, the home is sent SIGTERM (``--kill-pid``). Each client that hears
    ``session.going_away`` waits for the close and resumes on one of the other nodes.
    Per session: going_away to close, to ``session.resumed``, to the next audio frame;
    and every server_event_seq checked: gapless and never twice, across the move.

Speaks the stdout protocol of ``_procs.run_client``: ``@mark NAME`` lines, then one
``@result {json}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import time
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._stats import ms_summary
from benchmarks.suite._workload import (
    AUDIO_DELTA,
    BINARY_HEADER,
    OUTPUT_AUDIO_KIND,
    SESSION_CLOSE,
    SESSION_UPDATE_BINARY,
    TEXT,
    TEXT_DELTA,
    ack,
    emit,
    raise_nofile,
    resume,
)
from benchmarks.suite.clients._aio import close_session, dial, log, open_session, recv_event

now = time.perf_counter
Event = dict[str, Any]


def text_frame(seq: int) -> str:
    return json.dumps(
        {"type": "input.text.append", "client_event_seq": seq, "text": TEXT},
        separators=(",", ":"),
    )


# ------------------------------------------------------------------------------- resume
async def fill(ws: ClientConnection, k: int, window: int = 32) -> int:
    """Send k echo inputs (client_event_seq 1..k), read their k replies, never ack."""
    got = last = sent = 0
    while got < k:
        while sent < k and sent - got < window:
            sent += 1
            await ws.send(text_frame(sent))
        event = await recv_event(ws)
        if event["type"] != TEXT_DELTA:
            raise RuntimeError(f"unexpected while filling the journal: {event}")
        got, last = got + 1, event["server_event_seq"]
    return last


async def resume_trial(home: str, target: str, k: int) -> dict[str, float]:
    ws = await dial(home)
    created = await open_session(ws)
    last = await fill(ws, k)
    ws.transport.abort()  # drop the socket, no close frame
    await asyncio.sleep(0.02)  # the home sees the drop: a resume, not a takeover
    t_dial = now()
    ws2 = await dial(target)
    try:
        t0 = now()
        await ws2.send(resume(created["session_id"], created["resume_token"], 0))
        resumed = await recv_event(ws2)
        t_resumed = now()
        if resumed.get("type") != "session.resumed":
            raise RuntimeError(f"expected session.resumed, got {resumed}")
        t_first = 0.0
        seq = 0
        while seq < last:
            event = await recv_event(ws2)
            if event["type"] != TEXT_DELTA or event["server_event_seq"] != seq + 1:
                raise RuntimeError(f"unexpected in replay after seq {seq}: {event}")
            seq = event["server_event_seq"]
            if seq == 1:
                t_first = now()
        t_last = now()
    finally:
        await close_session(ws2)
    return {
        "connect": t0 - t_dial,
        "to_resumed": t_resumed - t0,
        "to_first": t_first - t0,
        "to_last": t_last - t0,
    }


async def warm_up(home: str, other: str) -> None:
    """A resume each way before measuring: imports, caches, the first relay."""
    for target in (home, other, home, other):
        await resume_trial(home, target, 1)


async def resume_mode(args: argparse.Namespace) -> dict[str, Any]:
    paths = {"home": args.home, "relayed": args.other}
    out: dict[str, Any] = {}
    await warm_up(args.home, args.other)
    for k in (int(x) for x in args.k.split(",")):
        rounds = []
        for r in range(args.rounds):
            series: dict[str, dict[str, list[float]]] = {
                p: collections.defaultdict(list) for p in paths
            }
            for i in range(args.sessions):
                order = list(paths) if (i + r) % 2 == 0 else list(paths)[::-1]
                for path in order:
                    for key, value in (await resume_trial(args.home, paths[path], k)).items():
                        series[path][key].append(value)
            rounds.append(
                {p: {key: ms_summary(v) for key, v in s.items()} for p, s in series.items()}
            )
            log(f"resume k={k} round {r + 1}: home p50 "
                f"{rounds[-1]['home']['to_resumed']['p50_ms']:.2f} ms, relayed p50 "
                f"{rounds[-1]['relayed']['to_resumed']['p50_ms']:.2f} ms")  # fmt: skip
        out[str(k)] = rounds
    return {"mode": "resume", "sessions": args.sessions, "rounds": out}


# --------------------------------------------------------------------------- throughput
class Stream:
    """One session pipelining echo events: ``window`` in flight, round trips timed."""

    def __init__(self, ws: ClientConnection, seq: int) -> None:
        self.ws = ws
        self.seq = seq  # the last client_event_seq sent
        self.sent_at: collections.deque[float] = collections.deque()
        self.rtts: list[float] = []
        self.echoed = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.last_server_seq = 0
        self.seq_violations = 0  # a reply whose server_event_seq is not the last + 1

    def check(self, event: Event) -> None:
        seq = event["server_event_seq"]
        if seq != self.last_server_seq + 1:
            self.seq_violations += 1
        self.last_server_seq = seq

    async def run(self, window: int, until: float, ack_every: int) -> None:
        credit = asyncio.Semaphore(window)
        stop = False

        async def sender() -> None:
            while not stop:
                await credit.acquire()
                if stop:
                    return
                self.seq += 1
                self.sent_at.append(now())
                await self.ws.send(text_frame(self.seq))

        task = asyncio.create_task(sender())
        try:
            while now() < until or self.sent_at:
                if now() >= until:
                    stop = True
                event = await asyncio.wait_for(recv_event(self.ws), 10)
                if event["type"] != TEXT_DELTA:
                    self.errors[str(event.get("code", event["type"]))] += 1
                    continue
                t = now()
                self.rtts.append(t - self.sent_at.popleft())
                self.echoed += 1
                self.check(event)
                server_seq = event["server_event_seq"]
                if server_seq % ack_every == 0:
                    await self.ws.send(ack(server_seq))
                credit.release()
        finally:
            stop = True
            task.cancel()


async def ping_pong(stream: Stream, count: int) -> list[float]:
    """One event in flight on one session: the added hop, without queueing."""
    rtts = []
    for _ in range(count):
        stream.seq += 1
        t0 = now()
        await stream.ws.send(text_frame(stream.seq))
        while True:
            event = await asyncio.wait_for(recv_event(stream.ws), 10)
            if event["type"] == TEXT_DELTA:
                stream.check(event)
                break
            stream.errors[str(event.get("code", event["type"]))] += 1
        rtts.append(now() - t0)
        if event["server_event_seq"] % 32 == 0:
            await stream.ws.send(ack(event["server_event_seq"]))
    return rtts


async def session_via(home: str, via: str, n: int) -> tuple[list[ClientConnection], list[int]]:
    """n sessions opened on ``home``, each dropped and resumed on ``via``: the same
    history whichever path (home or relay) is measured."""
    conns, seqs = [], []
    for _ in range(n):
        ws = await dial(home)
        created = await open_session(ws)
        ws.transport.abort()
        await asyncio.sleep(0.02)
        ws2 = await dial(via)
        await ws2.send(resume(created["session_id"], created["resume_token"], 0))
        resumed = await recv_event(ws2)
        if resumed.get("type") != "session.resumed":
            raise RuntimeError(f"expected session.resumed, got {resumed}")
        conns.append(ws2)
        seqs.append(int(resumed["last_received_client_event_seq"]))
    return conns, seqs


async def throughput_mode(args: argparse.Namespace) -> dict[str, Any]:
    paths = {"direct": args.home, "relayed": args.other}
    rounds = []
    await warm_up(args.home, args.other)
    for r in range(args.rounds):
        result: dict[str, Any] = {}
        for path in list(paths) if r % 2 == 0 else list(paths)[::-1]:
            conns, seqs = await session_via(args.home, paths[path], args.streams)
            streams = [Stream(ws, seq) for ws, seq in zip(conns, seqs, strict=True)]
            # warm-up, not counted
            until = now() + args.warmup
            await asyncio.gather(*(s.run(args.window, until, args.ack_every) for s in streams))
            for s in streams:
                s.rtts.clear()
                s.echoed = 0
            emit("mark", f"{path}-{r}-start")
            t0 = now()
            until = t0 + args.seconds
            await asyncio.gather(*(s.run(args.window, until, args.ack_every) for s in streams))
            t1 = now()
            emit("mark", f"{path}-{r}-end")
            echoed = sum(s.echoed for s in streams)
            rtts = [x for s in streams for x in s.rtts]
            pings = await ping_pong(streams[0], args.pings)
            errors = collections.Counter[str]()
            for s in streams:
                errors.update(s.errors)
                await close_session(s.ws)
            result[path] = {
                "events": echoed,
                "window_s": t1 - t0,
                "events_per_s": echoed / (t1 - t0),
                "rtt": ms_summary(rtts),
                "ping": ms_summary(pings),
                "errors": dict(errors),
                "seq_violations": sum(s.seq_violations for s in streams),
            }
        log(f"throughput round {r + 1}: direct {result['direct']['events_per_s']:,.0f}/s, "
            f"relayed {result['relayed']['events_per_s']:,.0f}/s")  # fmt: skip
        rounds.append(result)
    return {"mode": "throughput", "rounds": rounds}


# ------------------------------------------------------------------------------ migrate
class Voice:
    """One voice session: checks every seq, and follows a going_away to another node."""

    def __init__(self, index: int, target: str) -> None:
        self.index = index
        self.target = target
        self.last = 0  # newest server_event_seq received
        self.frames = 0
        self.violations: list[str] = []
        self.created: Event = {}
        self.token = ""
        self.ws: ClientConnection | None = None
        self.t_last_frame = 0.0
        self.t_last_before = 0.0  # the last audio frame heard from the drained node
        self.t_going_away = 0.0
        self.going_away: Event = {}
        self.t_closed = 0.0
        self.close_code: int | None = None
        self.t_resume_sent = 0.0
        self.t_resumed = 0.0
        self.t_frame_after = 0.0
        self.attempts = 0
        self.refusals: collections.Counter[str] = collections.Counter()
        self.resumed: Event = {}
        self.other_events: collections.Counter[str] = collections.Counter()
        self.failed = ""
        self.closing = False  # we sent session.close: its session.closed is expected
        self.terminal: Event = {}  # a session.closed or session.expired we did not ask for

    def seen(self, seq: int) -> None:
        if seq != self.last + 1:
            kind = "gap" if seq > self.last + 1 else "duplicate or backwards"
            self.violations.append(f"session {self.index}: seq {seq} after {self.last} ({kind})")
        self.last = max(self.last, seq)

    async def start(self, home: str, words: str) -> None:
        self.ws = await dial(home)
        self.created = await open_session(self.ws, SESSION_UPDATE_BINARY)
        self.token = self.created["resume_token"]
        await self.ws.send(json.dumps({"type": "input.text.append", "text": words}))

    async def read(self, ws: ClientConnection, migrating: bool, ack_every: int) -> None:
        """Read until the connection closes; note the first audio frame after a resume."""
        async for message in ws:
            t = now()
            if isinstance(message, bytes):
                kind, _flags, _res, seq = BINARY_HEADER.unpack_from(message)
                if kind != OUTPUT_AUDIO_KIND:
                    self.other_events[f"binary kind {kind}"] += 1
                    continue
                self.seen(seq)
                self.frames += 1
                self.t_last_frame = t
                if migrating and not self.t_frame_after:
                    self.t_frame_after = t
            else:
                event = json.loads(message)
                kind_s = event["type"]
                seq = event.get("server_event_seq")
                if seq is not None:
                    self.seen(seq)
                    if kind_s == AUDIO_DELTA and migrating and not self.t_frame_after:
                        self.t_frame_after = t
                if kind_s in ("session.closed", "session.expired") and not self.closing:
                    self.terminal = event
                if kind_s == "session.going_away":
                    if not self.t_going_away:
                        self.t_going_away = t
                        self.going_away = event
                elif seq is None and kind_s != "input.consumed":
                    if not (self.closing and kind_s == "session.closed"):  # our own close
                        self.other_events[kind_s] += 1
            if self.frames and self.last % ack_every == 0:
                await ws.send(ack(self.last))

    async def first_connection(self, ack_every: int) -> None:
        assert self.ws is not None
        try:
            await self.read(self.ws, False, ack_every)
        except ConnectionClosed:
            pass
        self.close_code = self.ws.close_code
        self.t_closed = now()
        self.t_last_before = self.t_last_frame

    async def migrate(self, others: list[str], retries: int, ack_every: int, after: float) -> None:
        """Resume on ``self.target`` (then the other nodes in turn) until resumed."""
        nodes = [self.target, *(o for o in others if o != self.target)]
        while self.attempts < retries:
            url = nodes[self.attempts % len(nodes)]
            self.attempts += 1
            ws = await dial(url)
            self.t_resume_sent = now()
            await ws.send(resume(self.created["session_id"], self.token, self.last))
            try:
                first = await ws.recv()
            except ConnectionClosed as exc:
                self.refusals[f"closed {exc.rcvd.code if exc.rcvd else None}"] += 1
                continue
            event = json.loads(first) if isinstance(first, str) else {"type": "binary"}
            if event["type"] != "session.resumed":
                self.refusals[str(event.get("code", event["type"]))] += 1
                ws.transport.abort()
                if not event.get("retryable"):
                    break  # what a client does: only a retryable refusal is worth a retry
                await asyncio.sleep(0.05)
                continue
            self.t_resumed = now()
            self.resumed = event
            self.token = event["resume_token"]
            reader = asyncio.create_task(self.read(ws, True, ack_every))
            await asyncio.sleep(after)
            if not reader.done():
                self.closing = True
                await ws.send(SESSION_CLOSE)
                try:
                    async with asyncio.timeout(5):
                        await reader
                except (TimeoutError, ConnectionClosed):
                    reader.cancel()
                    ws.transport.abort()
            elif exc_ := reader.exception():
                if not isinstance(exc_, ConnectionClosed):
                    raise exc_
            return
        self.failed = f"not resumed after {self.attempts} attempts: {dict(self.refusals)}"


async def migrate_mode(args: argparse.Namespace) -> dict[str, Any]:
    others = args.others.split(",")
    words = " ".join(f"w{i % 97}ord" for i in range(args.words))
    sessions = [Voice(i, others[i % len(others)]) for i in range(args.sessions)]
    sem = asyncio.Semaphore(20)

    async def start(v: Voice) -> None:
        async with sem:
            await v.start(args.home, words)

    await asyncio.gather(*(start(v) for v in sessions))

    async def life(v: Voice) -> None:
        # Each client resumes as soon as its own connection closes, like a real one.
        await v.first_connection(args.ack_every)
        await v.migrate(others, args.retries, args.ack_every, args.after)

    lives = [asyncio.create_task(life(v)) for v in sessions]
    await asyncio.sleep(args.settle)
    frames_before = sum(v.frames for v in sessions)
    emit("mark", "sigterm")
    t_kill = now()
    os.kill(args.kill_pid, signal.SIGTERM)  # the home node, started by the orchestrator
    _, pending = await asyncio.wait(lives, timeout=args.drain_wait + args.after + 30)
    for task in pending:
        task.cancel()
    crashed = collections.Counter[str]()
    for task in lives:
        if task.cancelled():
            crashed["still running at the end (cancelled)"] += 1
        elif (exc := task.exception()) is not None:
            crashed[repr(exc)[:200]] += 1
    t_end = now()
    violations = [x for v in sessions for x in v.violations]
    refusals = collections.Counter[str]()
    others_seen = collections.Counter[str]()
    for v in sessions:
        refusals.update(v.refusals)
        others_seen.update(v.other_events)
    ok = [v for v in sessions if v.t_resumed and v.t_going_away]
    # A session whose client was told it ended (session.closed) must not resume anywhere.
    revived = [v for v in sessions if v.terminal and v.t_resumed]
    for v in revived:
        violations.append(
            f"session {v.index} ({v.created['session_id']}): resumed on attempt {v.attempts} "
            f"after its client got {json.dumps(v.terminal)}"
        )
    return {
        "mode": "migrate",
        "sessions": len(sessions),
        "frames_before_sigterm": frames_before,
        # Audio frames a session got per second before the SIGTERM: 50 is real time.
        "frame_rate_before": frames_before / (args.settle * max(len(sessions), 1)),
        "going_away": sum(bool(v.t_going_away) for v in sessions),
        "going_away_migrating": sum(bool(v.going_away.get("migrating")) for v in sessions),
        "going_away_examples": [v.going_away for v in sessions[:2]],
        "close_codes": dict(collections.Counter(str(v.close_code) for v in sessions)),
        "resumed": sum(bool(v.t_resumed) for v in sessions),
        "resumed_with_audio_after": sum(bool(v.t_frame_after) for v in sessions),
        "attempts": dict(collections.Counter(v.attempts for v in sessions)),
        "refusals": dict(refusals),
        "client_errors": dict(crashed),
        "failed": [v.failed for v in sessions if v.failed][:10],
        "other_events": dict(others_seen),
        "terminal_events": dict(
            collections.Counter(
                f"{v.terminal['type']} {v.terminal.get('reason')}" for v in sessions if v.terminal
            )
        ),
        "resumed_after_terminal": len(revived),
        "resumed_without_going_away": sum(
            bool(v.t_resumed and not v.t_going_away) for v in sessions
        ),
        "violations": len(violations),
        "violation_examples": violations[:20],
        "frames_total": sum(v.frames for v in sessions),
        "sigterm_to_last_close_ms": (max((v.t_closed for v in ok), default=t_kill) - t_kill) * 1e3,
        "sigterm_to_last_resumed_ms": (max((v.t_resumed for v in ok), default=t_kill) - t_kill)
        * 1e3,
        "run_s": t_end - t_kill,
        "going_away_to_close": ms_summary([v.t_closed - v.t_going_away for v in ok]),
        "going_away_to_resumed": ms_summary([v.t_resumed - v.t_going_away for v in ok]),
        "going_away_to_audio": ms_summary(
            [v.t_frame_after - v.t_going_away for v in ok if v.t_frame_after]
        ),
        "resume_sent_to_resumed": ms_summary([v.t_resumed - v.t_resume_sent for v in ok]),
        "audio_gap": ms_summary([v.t_frame_after - v.t_last_before for v in ok if v.t_frame_after]),
        "sigterm_to_going_away": ms_summary([v.t_going_away - t_kill for v in ok]),
    }


async def main(args: argparse.Namespace) -> None:
    modes = {"resume": resume_mode, "throughput": throughput_mode, "migrate": migrate_mode}
    async with asyncio.timeout(args.max_time):
        result = await modes[args.mode](args)
    emit("result", result)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["resume", "throughput", "migrate"])
    parser.add_argument("--home", required=True, help="the node sessions are opened on")
    parser.add_argument("--other", help="resume, throughput: the relaying node")
    parser.add_argument("--others", help="migrate: the nodes to move to, comma-separated")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--k", default="1,100", help="resume: journal depths, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--ack-every", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--pings", type=int, default=300)
    parser.add_argument("--kill-pid", type=int)
    parser.add_argument("--words", type=int, default=400)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--drain-wait", type=float, default=30.0)
    parser.add_argument("--retries", type=int, default=20)
    parser.add_argument("--after", type=float, default=2.0)
    parser.add_argument("--nice", type=int, default=0, help="raise this process's niceness by")
    parser.add_argument("--max-time", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    raise_nofile()
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
