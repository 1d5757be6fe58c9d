"""Load generator on `websockets` (asyncio): the efficient client for the load scenarios.

Modes: ``throughput`` (scenario 1), ``voice`` (3), ``idle`` (4), ``handshake`` (5) and
``resume`` (6). Each drives trio-duplex (``--proto duplex``) and a bare echo server
(``--proto bare``) with the same library, so a ratio measures the server.

Speaks the stdout protocol of ``_procs.run_client``: ``@mark NAME`` lines, then one
``@result {json}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import math
import random
import time
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._stats import percentile, percentiles
from benchmarks.suite._workload import (
    AUDIO_DELTA,
    BINARY_HEADER,
    FRAME_PERIOD_S,
    OUTPUT_AUDIO_KIND,
    SESSION_UPDATE,
    SESSION_UPDATE_BINARY,
    TEXT_DELTA,
    TEXT_FRAME,
    VOICE_BINARY,
    VOICE_JSON,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
    resume,
)
from benchmarks.suite.clients._aio import (
    cancel_all,
    close_session,
    dial,
    first_due,
    log,
    open_session,
    ramp,
)

now = time.perf_counter


# ----------------------------------------------------------------- scenario 1: throughput
async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    duplex = args.proto == "duplex"
    errors: collections.Counter[str] = collections.Counter()
    received = 0
    ws = await dial(args.url, max_queue=args.window * 2 + 16)
    if duplex:
        await open_session(ws)
    credit = asyncio.Semaphore(args.window)

    async def sender() -> None:
        while True:
            await credit.acquire()
            await ws.send(TEXT_FRAME)

    async def receiver() -> None:
        nonlocal received
        async for message in ws:
            if duplex:
                event = json.loads(message)
                if event["type"] != TEXT_DELTA:
                    errors[event.get("code", event["type"])] += 1
                    if event["type"] == "error":
                        credit.release()
                    continue
                seq = event["server_event_seq"]
                if seq % args.ack_every == 0:
                    await ws.send(ack(seq))
            received += 1
            credit.release()

    tasks = [asyncio.create_task(sender()), asyncio.create_task(receiver())]
    await asyncio.sleep(args.warmup)
    emit("mark", "window_start")
    n0, c0, t0 = received, cpu_seconds(), now()
    await asyncio.sleep(args.duration)
    n1, c1, t1 = received, cpu_seconds(), now()
    emit("mark", "window_end")
    await cancel_all(tasks)
    if duplex:
        await close_session(ws)
    else:
        ws.transport.abort()  # measured already; a graceful close here only waits
    return {
        "events": n1 - n0,
        "seconds": t1 - t0,
        "rate": (n1 - n0) / (t1 - t0),
        "client_cpu": c1 - c0,
        "errors": dict(errors),
    }


# ---------------------------------------------------------------------- scenario 3: voice
class Voice:
    """N sessions, each sending a 20 ms frame every 20 ms, on a staggered phase.

    ``--lane json`` (v1): base64 audio in JSON text, echoed as JSON text. ``--lane
    binary`` (protocol v2, trio-duplex only): the session opens with ``session.audio.wire
    "binary"``, sends kind-1 binary messages and reads kind-2 replies by their header."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.duplex = args.proto == "duplex"
        self.binary = args.lane == "binary"
        if self.binary and not self.duplex:
            raise SystemExit("--lane binary is trio-duplex's lane: use it with --proto duplex")
        self.frame: str | bytes = VOICE_BINARY if self.binary else VOICE_JSON
        self.sessions: list[VoiceSession] = []
        self.samples: list[float] = []
        self.lateness: list[float] = []
        self.measuring = False
        self.stopping = False
        self.errors: collections.Counter[str] = collections.Counter()
        self.rng = random.Random(3)
        self.epoch = asyncio.get_running_loop().time()


class VoiceSession:
    def __init__(self, voice: Voice) -> None:
        self.voice = voice
        self.sent: collections.deque[float] = collections.deque()
        self.ws: ClientConnection | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.dead = False

    async def open(self) -> None:
        voice = self.voice
        self.ws = await dial(voice.args.url)
        if voice.duplex:
            await open_session(self.ws, SESSION_UPDATE_BINARY if voice.binary else SESSION_UPDATE)
        phase = voice.rng.random() * FRAME_PERIOD_S
        self.tasks = [
            asyncio.create_task(self.sender(phase)),
            asyncio.create_task(self.receiver()),
        ]

    async def sender(self, phase: float) -> None:
        assert self.ws is not None
        loop = asyncio.get_running_loop()
        voice = self.voice
        frame = voice.frame
        due = first_due(voice.epoch, phase, loop.time())
        try:
            while not voice.stopping:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if voice.measuring:
                    voice.lateness.append(loop.time() - due)
                self.sent.append(now())
                await self.ws.send(frame)
                due += FRAME_PERIOD_S
        except ConnectionClosed:
            self.dead = True

    async def receiver(self) -> None:
        assert self.ws is not None
        voice = self.voice
        received = 0
        try:
            async for message in self.ws:
                t = now()
                if isinstance(message, bytes):  # the binary lane: a kind-2 header
                    kind, _, _, seq = BINARY_HEADER.unpack_from(message)
                    if kind != OUTPUT_AUDIO_KIND:
                        voice.errors[f"binary kind {kind}"] += 1
                        continue
                    received += 1
                    if received % voice.args.ack_every == 0:
                        await self.ws.send(ack(seq))
                    sent = self.sent.popleft()
                    if voice.measuring:
                        voice.samples.append(t - sent)
                    continue
                event = json.loads(message)  # both sides parse: equal client work
                if voice.duplex:
                    if event["type"] != AUDIO_DELTA:
                        voice.errors[event.get("code", event["type"])] += 1
                        if event["type"] == "error" and self.sent:
                            self.sent.popleft()
                        continue
                    received += 1
                    if received % voice.args.ack_every == 0:
                        await self.ws.send(ack(event["server_event_seq"]))
                sent = self.sent.popleft()
                if voice.measuring:
                    voice.samples.append(t - sent)
        except ConnectionClosed:
            pass
        self.dead = True

    async def stop(self) -> None:
        await cancel_all(self.tasks)
        if self.ws is not None:
            self.ws.transport.abort()


async def measure_step(v: Voice, n: int, mark: str) -> dict[str, Any]:
    """One measured window at n sessions: latency percentiles, backlog, client load."""
    args = v.args
    v.samples, v.lateness, v.errors = [], [], collections.Counter()
    v.measuring = True
    emit("mark", f"start_{mark}")
    c0, t0 = cpu_seconds(), now()
    await asyncio.sleep(args.measure)
    v.measuring = False
    t1, c1 = now(), cpu_seconds()
    emit("mark", f"end_{mark}")
    # Frames still unanswered count with their age so far: a backlog is latency.
    backlog = [t1 - s for session in v.sessions for s in session.sent]
    lat = v.samples + backlog
    step: dict[str, Any] = {
        "sessions": n,
        "mark": mark,
        "samples": len(v.samples),
        "expected": round(n * args.measure / FRAME_PERIOD_S),
        "backlog": len(backlog),
        "client_cpu_util": (c1 - c0) / (t1 - t0),
        "lateness_p99_ms": percentile(v.lateness, 99) * 1000 if v.lateness else math.nan,
        "errors": dict(v.errors),
        "dead": sum(session.dead for session in v.sessions),
    }
    if lat:
        step.update({k + "_ms": x * 1000 for k, x in percentiles(lat, (50, 99)).items()})
        step["max_ms"] = max(lat) * 1000
    else:
        step.update(p50_ms=math.nan, p99_ms=math.nan, max_ms=math.nan)
    log(
        f"voice {args.proto} n={n} p50={step['p50_ms']:.2f}ms p99={step['p99_ms']:.2f}ms "
        f"client_cpu={step['client_cpu_util']:.0%} late_p99={step['lateness_p99_ms']:.2f}ms"
    )
    return step


async def voice(args: argparse.Namespace) -> dict[str, Any]:
    v = Voice(args)
    limit = asyncio.Semaphore(args.open_concurrency)

    async def add_one() -> None:
        session = VoiceSession(v)
        v.sessions.append(session)
        async with limit:
            await session.open()

    try:
        measure = functools.partial(measure_step, v)
        steps = await ramp(
            args, v.sessions, add_one, measure, name="voice", confirm=bool(args.confirm)
        )
    finally:
        v.stopping = True
        await asyncio.gather(*(s.stop() for s in v.sessions), return_exceptions=True)
    return {"steps": steps, "threshold_ms": args.threshold_ms}


# ----------------------------------------------------------------------- scenario 4: idle
async def idle(args: argparse.Namespace) -> dict[str, Any]:
    duplex = args.proto == "duplex"
    conns: list[ClientConnection] = []
    times: list[float] = []
    failures: collections.Counter[str] = collections.Counter()
    limit = asyncio.Semaphore(args.open_concurrency)
    started = now()

    async def open_one() -> None:
        async with limit:
            if now() - started > args.open_time_limit:
                return  # over the time limit: report how many opened
            t0 = now()
            try:
                ws = await dial(args.url, max_queue=4)
                conns.append(ws)
                if duplex:
                    await open_session(ws)
            except Exception as exc:
                failures[type(exc).__name__] += 1
                return
            times.append(now() - t0)

    await asyncio.sleep(0.2)
    emit("mark", "before_open")
    t0 = started = now()
    await asyncio.gather(*(open_one() for _ in range(args.count)))
    elapsed = now() - t0
    emit("mark", "opened")
    await asyncio.sleep(args.settle)
    emit("mark", "settled")
    result = {
        "count": len(times),
        "wanted": args.count,
        "open_seconds": elapsed,
        "open_rate": len(times) / elapsed,
        "open_p50_ms": percentile(times, 50) * 1000 if times else math.nan,
        "open_p99_ms": percentile(times, 99) * 1000 if times else math.nan,
        "failures": dict(failures),
    }
    for ws in conns:  # drop them all at once; the server is stopped right after
        ws.transport.abort()
    return result


# ------------------------------------------------------------------ scenario 5: handshake
async def handshake(args: argparse.Namespace) -> dict[str, Any]:
    duplex = args.proto == "duplex"
    samples: list[float] = []
    done = 0
    failures: collections.Counter[str] = collections.Counter()
    measuring = False

    async def cycle() -> None:
        nonlocal done
        t0 = now()
        ws = await dial(args.url, max_queue=4)
        try:
            if duplex:
                await open_session(ws)
                t1 = now()
                await close_session(ws)
            else:
                await ws.send(TEXT_FRAME)
                await ws.recv()
                t1 = now()
                await ws.send(TEXT_FRAME)
                await ws.recv()
                await ws.close()
        finally:
            ws.transport.abort()
        if measuring:
            samples.append(t1 - t0)
            done += 1

    async def worker(until: float) -> None:
        while now() < until:
            try:
                await cycle()
            except Exception as exc:
                failures[type(exc).__name__] += 1
                await asyncio.sleep(0.01)

    end = now() + args.warmup + args.duration
    workers = [asyncio.create_task(worker(end)) for _ in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    measuring = True
    emit("mark", "window_start")
    c0, t0 = cpu_seconds(), now()
    await asyncio.sleep(args.duration)
    measuring = False
    t1, c1 = now(), cpu_seconds()
    emit("mark", "window_end")
    await asyncio.gather(*workers)
    result: dict[str, Any] = {
        "cycles": done,
        "seconds": t1 - t0,
        "rate": done / (t1 - t0),
        "client_cpu": c1 - c0,
        "failures": dict(failures),
    }
    if samples:
        result.update({k + "_ms": x * 1000 for k, x in percentiles(samples, (50, 99)).items()})
    return result


# --------------------------------------------------------------------- scenario 6: resume
async def pump(ws: ClientConnection, k: int, window: int) -> int:
    """Send k text inputs and read their k replies, never acking; returns the last seq."""
    credit = asyncio.Semaphore(window)
    wake = asyncio.Event()
    need, got, last = k, 0, 0

    async def sender() -> None:
        nonlocal need
        while True:
            while need > 0:
                await credit.acquire()
                need -= 1
                await ws.send(TEXT_FRAME)
            wake.clear()
            await wake.wait()

    task = asyncio.create_task(sender())
    try:
        while got < k:
            event = json.loads(await ws.recv())
            if event["type"] == TEXT_DELTA:
                got, last = got + 1, event["server_event_seq"]
                credit.release()
            elif event["type"] == "error" and event.get("retryable"):
                need += 1  # refused, not received: send it again
                credit.release()
                wake.set()
            else:
                raise RuntimeError(f"unexpected while filling the journal: {event}")
    finally:
        task.cancel()
    return last


async def resume_duplex(url: str, k: int, window: int) -> dict[str, float]:
    ws = await dial(url)
    created = await open_session(ws)
    last = await pump(ws, k, window)
    ws.transport.abort()  # drop the socket, no close frame
    await asyncio.sleep(0.02)
    t0 = now()
    ws2 = await dial(url, max_queue=1024)
    try:
        await ws2.send(resume(created["session_id"], created["resume_token"], 0))
        resumed = json.loads(await ws2.recv())
        if resumed.get("type") != "session.resumed":
            raise RuntimeError(f"expected session.resumed, got {resumed}")
        t_resumed = now()
        seq = 0
        while seq < last:
            event = json.loads(await ws2.recv())
            if event["type"] != TEXT_DELTA:
                raise RuntimeError(f"unexpected in replay: {event}")
            seq = event["server_event_seq"]
        t1 = now()
    finally:
        await close_session(ws2)
    return {"total": t1 - t0, "to_resumed": t_resumed - t0}


async def resume_bare(url: str, k: int) -> dict[str, float]:
    t0 = now()
    ws = await dial(f"{url}?burst={k}", max_queue=1024)
    try:
        await ws.send(TEXT_FRAME)
        for _ in range(k + 1):  # the K burst frames, then the echo
            json.loads(await ws.recv())
        t1 = now()
    finally:
        ws.transport.abort()
    return {"total": t1 - t0, "to_resumed": math.nan}


async def resume_trials(args: argparse.Namespace) -> dict[str, Any]:
    targets = [t.split("=", 1) for t in args.target]  # proto=url
    out: dict[str, dict[str, list[float]]] = {
        proto: {"total": [], "to_resumed": []} for proto, _ in targets
    }
    deadline = now() + args.trial_time
    for trial in range(args.trials):
        order = targets if trial % 2 == 0 else targets[::-1]  # A B, B A, ...
        for proto, url in order:
            if proto == "duplex":
                r = await resume_duplex(url, args.k, args.window)
            else:
                r = await resume_bare(url, args.k)
            for key, value in r.items():
                out[proto][key].append(value)
        if now() > deadline:
            log(f"resume k={args.k}: stopped after {trial + 1} trials (time bound)")
            break
    result: dict[str, Any] = {"k": args.k}
    for proto, series in out.items():
        totals = series["total"]
        result[proto] = {
            "trials": len(totals),
            "p50_ms": percentile(totals, 50) * 1000,
            "p99_ms": percentile(totals, 99) * 1000,
            "max_ms": max(totals) * 1000,
            "totals_ms": [round(x * 1000, 3) for x in totals],
        }
        if proto == "duplex":
            result[proto]["to_resumed_p50_ms"] = percentile(series["to_resumed"], 50) * 1000
    return result


async def main(args: argparse.Namespace) -> None:
    modes = {
        "throughput": throughput,
        "voice": voice,
        "idle": idle,
        "handshake": handshake,
        "resume": resume_trials,
    }
    async with asyncio.timeout(args.max_time):
        result = await modes[args.mode](args)
    emit("result", result)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["throughput", "voice", "idle", "handshake", "resume"])
    parser.add_argument("--url")
    parser.add_argument("--proto", choices=["duplex", "bare"], default="duplex")
    parser.add_argument(
        "--lane", choices=["json", "binary"], default="json", help="voice: how audio travels"
    )
    parser.add_argument("--target", action="append", default=[], help="resume: PROTO=URL")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--steps", default="10,20,40")
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--measure", type=float, default=2.0)
    parser.add_argument("--threshold-ms", type=float, default=20.0)
    parser.add_argument(
        "--confirm", type=int, default=1, help="voice: re-measure a failing step once (1) or not"
    )
    parser.add_argument("--ramp-time", type=float, default=60.0)
    parser.add_argument("--open-concurrency", type=int, default=50)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--k", type=int, default=0)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--trial-time", type=float, default=60.0, help="resume: no new trial after")
    parser.add_argument(
        "--open-time-limit", type=float, default=60.0, help="idle: no new open after"
    )
    parser.add_argument("--max-time", type=float, default=120.0)
    args = parser.parse_args()
    raise_nofile()
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
