"""Load generator of scenario 8: the same conversation over both dialects.

``--dialect native`` drives ``/v1/duplex``, ``--dialect openai`` drives ``/v1/realtime``,
with the same client events, byte for byte (the canonical events are OpenAI's names), so
that the engine does the same work and only the dialect differs: its decoding, the
shaping of the engine's events into OpenAI's structure, ``event_id``. A native session
opens with ``output_modalities`` in its configuration, so that it converses as an OpenAI
session does (``echo`` buffers audio for a commit).

Modes:

- ``turns``: text turns, pipelined (``--window`` in flight): ``conversation.item.create``
  (100 characters) then ``response.create``; a turn ends with its ``response.done``.
- ``voice``: N sessions each stream a 20 ms frame every 20 ms and end a turn every
  ``--turn-frames`` frames (10: a turn of 200 ms, so that a window holds enough turns
  for a p99) (``input_audio_buffer.commit``, ``response.create``); the echo
  answers with the turn's audio. The latency is ``response.create`` sent →
  ``response.done`` received; frames are not echoed one by one in a conversation.

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
from typing import Any, Final

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._stats import percentiles
from benchmarks.suite._workload import (
    FRAME_PERIOD_S,
    TEXT,
    VOICE_JSON,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
)
from benchmarks.suite.clients._aio import cancel_all, dial, first_due, log, ramp

now = time.perf_counter

OPEN_NATIVE: Final = json.dumps(
    {"type": "session.update", "session": {"output_modalities": ["audio"]}}, separators=(",", ":")
)
ITEM: Final = json.dumps(
    {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": TEXT}],
        },
    },
    separators=(",", ":"),
)
RESPONSE: Final = '{"type":"response.create"}'
COMMIT: Final = '{"type":"input_audio_buffer.commit"}'
DONE: Final = "response.done"


class Session:
    """One session on either dialect: opened, its events counted, acked every N."""

    def __init__(self, ws: ClientConnection, ack_every: int) -> None:
        self.ws = ws
        self.ack_every = ack_every
        self.events = 0  # server events read
        self.errors: collections.Counter[str] = collections.Counter()
        self._unacked = 0

    @classmethod
    async def open(cls, url: str, dialect: str, ack_every: int, max_queue: int = 64) -> Session:
        ws = await dial(url, max_queue=max_queue)
        if dialect == "native":
            await ws.send(OPEN_NATIVE)
        # OpenAI's dialect: the server speaks first, on the upgrade.
        session = cls(ws, ack_every)
        created = await session.next()
        if created["type"] != "session.created":
            raise RuntimeError(f"expected session.created, got {created}")
        return session

    async def next(self) -> dict[str, Any]:
        """The next server event (both sides parse every one: equal client work)."""
        event: dict[str, Any] = json.loads(await self.ws.recv())
        self.events += 1
        kind = event["type"]
        if kind == "error":
            error = event.get("error", event)  # OpenAI's nests it
            self.errors[str(error.get("code"))] += 1
        seq = event.get("server_event_seq")
        if seq is not None:
            self._unacked += 1
            if self._unacked >= self.ack_every:
                self._unacked = 0
                await self.ws.send(ack(seq))
        return event


# ------------------------------------------------------------------------------ turns
async def turns(args: argparse.Namespace) -> dict[str, Any]:
    session = await Session.open(args.url, args.dialect, args.ack_every, args.window * 32 + 64)
    credit = asyncio.Semaphore(args.window)
    done = 0

    async def sender() -> None:
        while True:
            await credit.acquire()
            await session.ws.send(ITEM)
            await session.ws.send(RESPONSE)

    async def receiver() -> None:
        nonlocal done
        while True:
            event = await session.next()
            if event["type"] == DONE:
                done += 1
                credit.release()
            elif event["type"] == "error":
                credit.release()

    tasks = [asyncio.create_task(sender()), asyncio.create_task(receiver())]
    await asyncio.sleep(args.warmup)
    emit("mark", "window_start")
    n0, e0, c0, t0 = done, session.events, cpu_seconds(), now()
    await asyncio.sleep(args.duration)
    n1, e1, c1, t1 = done, session.events, cpu_seconds(), now()
    emit("mark", "window_end")
    await cancel_all(tasks)
    session.ws.transport.abort()  # measured already
    return {
        "turns": n1 - n0,
        "client_events": 2 * (n1 - n0),
        "server_events": e1 - e0,
        "seconds": t1 - t0,
        "client_cpu": c1 - c0,
        "errors": dict(session.errors),
    }


# ------------------------------------------------------------------------------ voice
class Voice:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sessions: list[VoiceSession] = []
        self.samples: list[float] = []
        self.measuring = False
        self.stopping = False
        self.rng = random.Random(3)
        self.epoch = asyncio.get_running_loop().time()


class VoiceSession:
    def __init__(self, voice: Voice) -> None:
        self.voice = voice
        self.session: Session | None = None
        self.asked: collections.deque[float] = collections.deque()  # response.create times
        self.tasks: list[asyncio.Task[None]] = []
        self.dead = False

    async def open(self) -> None:
        args = self.voice.args
        self.session = await Session.open(args.url, args.dialect, args.ack_every)
        phase = self.voice.rng.random() * FRAME_PERIOD_S
        self.tasks = [
            asyncio.create_task(self.sender(phase)),
            asyncio.create_task(self.receiver()),
        ]

    async def sender(self, phase: float) -> None:
        assert self.session is not None
        ws, voice = self.session.ws, self.voice
        loop = asyncio.get_running_loop()
        due = first_due(voice.epoch, phase, loop.time())
        # Each session ends its turns at its own frame, so that turns do not all coincide.
        frame = voice.rng.randrange(voice.args.turn_frames)
        try:
            while not voice.stopping:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send(VOICE_JSON)
                frame += 1
                if frame % voice.args.turn_frames == 0:
                    await ws.send(COMMIT)
                    self.asked.append(now())
                    await ws.send(RESPONSE)
                due += FRAME_PERIOD_S
        except ConnectionClosed:
            self.dead = True

    async def receiver(self) -> None:
        assert self.session is not None
        voice = self.voice
        try:
            while True:
                event = await self.session.next()
                if event["type"] == DONE and self.asked:
                    waited = now() - self.asked.popleft()
                    if voice.measuring:
                        voice.samples.append(waited)
        except ConnectionClosed:
            pass
        self.dead = True

    async def stop(self) -> None:
        await cancel_all(self.tasks)
        if self.session is not None:
            self.session.ws.transport.abort()


async def measure_step(v: Voice, n: int, mark: str) -> dict[str, Any]:
    args = v.args
    v.samples = []
    for s in v.sessions:
        if s.session is not None:
            s.session.errors.clear()
    v.measuring = True
    emit("mark", f"start_{mark}")
    c0, t0 = cpu_seconds(), now()
    await asyncio.sleep(args.measure)
    v.measuring = False
    t1, c1 = now(), cpu_seconds()
    emit("mark", f"end_{mark}")
    # Turns still unanswered count with their age so far: a backlog is latency.
    backlog = [t1 - t for s in v.sessions for t in s.asked]
    errors: collections.Counter[str] = collections.Counter()
    for s in v.sessions:
        if s.session is not None:
            errors.update(s.session.errors)
    lat = v.samples + backlog
    step: dict[str, Any] = {
        "sessions": n,
        "mark": mark,
        "samples": len(v.samples),
        "backlog": len(backlog),
        "client_cpu_util": (c1 - c0) / (t1 - t0),
        "errors": dict(errors),
        "dead": sum(s.dead for s in v.sessions),
    }
    if lat:
        step.update({k + "_ms": x * 1000 for k, x in percentiles(lat, (50, 99)).items()})
    else:
        step.update(p50_ms=math.nan, p99_ms=math.nan)
    log(f"dialect voice {args.dialect} n={n} p50={step['p50_ms']:.2f}ms p99={step['p99_ms']:.2f}ms")
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
        steps = await ramp(args, v.sessions, add_one, measure, name="dialect voice")
    finally:
        v.stopping = True
        await asyncio.gather(*(s.stop() for s in v.sessions), return_exceptions=True)
    return {"steps": steps, "threshold_ms": args.threshold_ms}


async def main(args: argparse.Namespace) -> None:
    raise_nofile()
    run = turns if args.mode == "turns" else voice
    result = await asyncio.wait_for(run(args), args.max_time)
    emit("result", result)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["turns", "voice"])
    parser.add_argument("--url", required=True, help="the dialect's URL (/v1/duplex, /v1/realtime)")
    parser.add_argument("--dialect", choices=["native", "openai"], required=True)
    parser.add_argument("--window", type=int, default=16, help="turns: turns in flight")
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--steps", default="10,20,40")
    parser.add_argument("--turn-frames", type=int, default=50, help="voice: frames per turn")
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--measure", type=float, default=2.0)
    parser.add_argument("--threshold-ms", type=float, default=20.0)
    parser.add_argument("--ramp-time", type=float, default=60.0)
    parser.add_argument("--open-concurrency", type=int, default=50)
    parser.add_argument("--max-time", type=float, default=120.0)
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    cli()
