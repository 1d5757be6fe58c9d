"""Load generator of ``benchmarks.speech``: N speech sessions talking, one echo neighbour.

Each speech session streams 16 kHz PCM16 on the binary lane, one 20 ms frame every 20 ms
as a microphone does, without pause: white noise (``--noise-peak``: peaks of 64 by
default, -54 dBFS, a quiet room), then one of the ``--utterance`` files (sentences of
the outside set), then noise again until the engine's reply has been heard
(``response.done``), a short gap, the next sentence, and so on. It records, for each
turn, the time from the last frame of the sentence (the end of speech) to the first
frame of the reply's audio, to ``speech_stopped`` (the turn end delay: how long the
turn detector held the turn open after the speech) and to ``transcript.done``; for every
reply frame its delay: how much later than the reply's 20 ms grid it arrived, the grid
anchored at the reply's earliest frame so far. It counts the turns the engine started
(``speech_started``) against the sentences sent, and the turns it ended before a
sentence's end (``splits``).

The neighbour (``--neighbour``) is a session of the echo engine on the same server (the
benchmark's router engine picks it by the session's configuration): it sends a 20 ms
frame of 24 kHz PCM16 every 20 ms and times each echo; frames still unanswered at the
window's end count with their age.

Speaks the stdout protocol of ``_procs.run_client``: ``@mark NAME`` lines, then one
``@result {json}`` line. Only turns whose speech ended inside the measured window, and
frames that arrived in it, are counted.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import json
import math
import random
import time
import wave
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from benchmarks.suite._stats import percentiles
from benchmarks.suite._workload import (
    BINARY_HEADER,
    FRAME_PERIOD_S,
    INPUT_AUDIO_KIND,
    OUTPUT_AUDIO_KIND,
    VOICE_BINARY,
    ack,
    cpu_seconds,
    emit,
)

now = time.monotonic
RATE = 16_000
FRAME_BYTES = RATE * 2 // 50
HEADER = BINARY_HEADER.pack(INPUT_AUDIO_KIND, 0, 0, 0)
PCM16 = {"format": "pcm16", "rate": RATE}
SPEECH_AUDIO = {"audio": {"wire": "binary", "input": PCM16, "output": PCM16}}
SPEECH_UPDATE = json.dumps({"type": "session.update", "session": SPEECH_AUDIO})
CONVERSE_UPDATE = json.dumps(
    {
        "type": "session.update",
        "session": {**SPEECH_AUDIO, "turn_detection": {"type": "server_vad"}},
    }
)
"""``--converse``: turns as OpenAI's sessions have them (``speech_stopped``, items), the
engine's default turn detection settings."""
NEIGHBOUR_UPDATE = json.dumps(
    {"type": "session.update", "session": {"audio": {"wire": "binary"}, "bench_engine": "echo"}}
)
ACK_EVERY = 32


def read_utterance(path: str) -> list[bytes]:
    """A 16 kHz mono PCM16 WAV file as 20 ms frames (the last one padded)."""
    with wave.open(path) as wav:
        if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (1, 2, RATE):
            raise SystemExit(f"{path}: not 16 kHz mono PCM16")
        pcm = wav.readframes(wav.getnframes())
    pcm += bytes(-len(pcm) % FRAME_BYTES)
    return [HEADER + pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


def noise_frames(count: int, seed: int, peak: int = 64) -> list[bytes]:
    """White noise peaking at ``peak`` (64: -54 dBFS) as ``count`` distinct frames, sent
    in a cycle (long enough that a detector cannot learn it: a short cycle, 8 frames,
    held PocketSphinx's endpointer open for seconds)."""
    rng = random.Random(seed)
    total = count * FRAME_BYTES // 2
    samples = array.array("h", (rng.randint(-peak, peak) for _ in range(total)))
    pcm = samples.tobytes()  # native order: little-endian, as everywhere we run
    return [HEADER + pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


class Load:
    """What every session shares: the window, the script, the counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.utterances = [read_utterance(p) for p in args.utterance]
        self.noise = noise_frames(250, 5, getattr(args, "noise_peak", 64))
        self.rng = random.Random(args.seed)
        self.epoch = now()
        self.window: tuple[float, float] = (math.inf, math.inf)
        self.stopping = False
        self.turns: list[tuple[float, float | None]] = []  # (end of speech, latency or None)
        self.heard: list[tuple[float, float]] = []  # (end of speech, to transcript.done)
        self.stopped: list[tuple[float, float]] = []  # (end of speech, to speech_stopped)
        self.started: list[float] = []  # speech_started arrivals
        self.sentences: list[float] = []  # when each sentence's first frame went out
        self.splits: list[float] = []  # speech_stopped arrivals mid-sentence
        self.reply_delays: list[tuple[float, float]] = []  # (arrival, delay)
        self.echo_rtts: list[tuple[float, float]] = []  # (sent, round trip)
        self.lateness: list[tuple[float, float]] = []  # (due, how late our send was)
        self.errors: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        self.cancelled = 0
        self.sessions: list[Session] = []

    def in_window(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]


class Session:
    def __init__(self, load: Load, index: int, neighbour: bool) -> None:
        self.load = load
        self.index = index
        self.neighbour = neighbour
        self.ws: ClientConnection | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.dead = False
        self.sent: collections.deque[float] = collections.deque()  # neighbour: send times
        # Speech: the turn in flight.
        self.speech_end: float | None = None  # the last frame of the sentence went out
        self.awaiting_audio = False
        self.in_sentence = False  # its frames are going out
        self.stop_heard = False  # speech_stopped for the sentence last ended
        self.reply_done = asyncio.Event()
        self.reply_anchor: float | None = None  # earliest (arrival - k * 20 ms) so far
        self.reply_frames = 0
        self.received = 0

    async def open(self) -> bool:
        args = self.load.args
        try:
            self.ws = await connect(
                args.url,
                compression=None,
                max_size=None,
                ping_interval=None,
                open_timeout=30,
                close_timeout=2,
                max_queue=256,
            )
            speech = CONVERSE_UPDATE if args.converse else SPEECH_UPDATE
            await self.ws.send(NEIGHBOUR_UPDATE if self.neighbour else speech)
            first = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
        except (OSError, TimeoutError, ConnectionClosed, InvalidStatus) as exc:
            self.load.refused[type(exc).__name__] += 1
            return False
        if first.get("type") != "session.created":
            self.load.refused[str(first.get("code", first.get("type")))] += 1
            await self.ws.close()
            return False
        phase = self.load.rng.random() * FRAME_PERIOD_S
        self.tasks = [
            asyncio.create_task(self.sender(phase)),
            asyncio.create_task(self.receiver()),
        ]
        return True

    def script(self) -> Any:
        """The frames to send, forever: noise, a sentence, noise until the reply ends."""
        load = self.load
        rng = random.Random(self.index)
        noise = load.noise
        count = 0
        for _ in range(rng.randrange(15, 60)):  # 0.3-1.2 s before the first sentence
            count += 1
            yield noise[count % len(noise)], False
        turn = self.index
        while True:
            frames = load.utterances[turn % len(load.utterances)]
            turn += 1
            self.in_sentence = True
            load.sentences.append(now())
            for i, frame in enumerate(frames):
                yield frame, i == len(frames) - 1
            waited = 0
            limit = round(load.args.reply_timeout / FRAME_PERIOD_S)
            while not self.reply_done.is_set() and waited < limit:
                waited += 1
                count += 1
                yield noise[count % len(noise)], False
            if not self.reply_done.is_set() and self.speech_end is not None:
                load.turns.append((self.speech_end, None))  # no reply in time
                self.awaiting_audio = False
            for _ in range(round(load.args.gap / FRAME_PERIOD_S)):
                count += 1
                yield noise[count % len(noise)], False

    async def sender(self, phase: float) -> None:
        assert self.ws is not None
        load = self.load
        due = now() + phase
        frames = ((VOICE_BINARY, False) for _ in iter(int, 1)) if self.neighbour else self.script()
        try:
            for frame, last in frames:
                if load.stopping:
                    break
                delay = due - now()
                if delay > 0:
                    await asyncio.sleep(delay)  # asyncio's clock is time.monotonic too
                t = now()
                load.lateness.append((due, t - due))
                if self.neighbour:
                    self.sent.append(t)
                await self.ws.send(frame)
                if last:  # the end of speech: the turn's reply is awaited from here
                    self.speech_end = t
                    self.in_sentence = False
                    self.stop_heard = False
                    self.awaiting_audio = True
                    self.reply_done.clear()
                due += FRAME_PERIOD_S
        except ConnectionClosed:
            self.dead = True

    async def receiver(self) -> None:
        assert self.ws is not None
        load = self.load
        try:
            async for message in self.ws:
                t = now()
                if isinstance(message, bytes):
                    kind, _, _, seq = BINARY_HEADER.unpack_from(message)
                    if kind != OUTPUT_AUDIO_KIND:
                        load.errors[f"binary kind {kind}"] += 1
                        continue
                    self.received += 1
                    if self.received % ACK_EVERY == 0:
                        await self.ws.send(ack(seq))
                    if self.neighbour:
                        sent = self.sent.popleft()
                        if load.in_window(sent):
                            load.echo_rtts.append((sent, t - sent))
                    else:
                        self.reply_frame(t)
                    continue
                await self.event(json.loads(message), t)
        except ConnectionClosed:
            pass
        self.dead = True

    def reply_frame(self, t: float) -> None:
        load = self.load
        offset = t - self.reply_frames * FRAME_PERIOD_S
        self.reply_anchor = offset if self.reply_anchor is None else min(self.reply_anchor, offset)
        if load.in_window(t):
            load.reply_delays.append((t, offset - self.reply_anchor))
        self.reply_frames += 1
        if self.awaiting_audio and self.speech_end is not None and t > self.speech_end:
            self.awaiting_audio = False
            load.turns.append((self.speech_end, t - self.speech_end))

    async def event(self, event: dict[str, Any], t: float) -> None:
        load = self.load
        kind = event.get("type")
        if kind == "response.created":
            self.reply_anchor, self.reply_frames = None, 0
        elif kind == "response.done":
            if self.speech_end is not None and t > self.speech_end:
                self.reply_done.set()
        elif kind == "response.cancelled":
            load.cancelled += 1
        elif kind == "input_audio_buffer.speech_started":
            load.started.append(t)
        elif kind == "input_audio_buffer.speech_stopped":
            if self.in_sentence:
                load.splits.append(t)
            elif self.speech_end is not None and not self.stop_heard:
                self.stop_heard = True
                load.stopped.append((self.speech_end, t - self.speech_end))
        elif kind == "input_audio.transcript.done":
            if self.speech_end is not None and self.awaiting_audio:
                load.heard.append((self.speech_end, t - self.speech_end))
        elif kind == "error" or kind in ("session.closed", "session.expired"):
            load.errors[str(event.get("code", kind))] += 1
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            self.received += 1
            if self.received % ACK_EVERY == 0 and self.ws is not None:
                await self.ws.send(ack(seq))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.ws is not None:
            self.ws.transport.abort()


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    shown = {k + "_ms": round(v * 1000, 2) for k, v in percentiles(values, (50, 90, 99)).items()}
    return {"n": len(values), **shown, "max_ms": round(max(values) * 1000, 2)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load = Load(args)
    opened = 0
    try:
        if args.neighbour:
            neighbour = Session(load, -1, neighbour=True)
            load.sessions.append(neighbour)
            if not await neighbour.open():
                raise SystemExit(f"the neighbour session was refused: {dict(load.refused)}")
        for i in range(args.sessions):  # one at a time: each loads its model on the server
            session = Session(load, i, neighbour=False)
            load.sessions.append(session)
            opened += await session.open()
            await asyncio.sleep(args.open_gap)
        emit("mark", "opened")
        await asyncio.sleep(args.warmup)
        start = now()
        load.window = (start, start + args.measure)
        emit("mark", "start")
        c0 = cpu_seconds()
        await asyncio.sleep(args.measure)
        c1, end = cpu_seconds(), now()
        emit("mark", "end")
        # Turns whose speech ended in the window may still be answered: wait a little.
        await asyncio.sleep(min(args.reply_timeout, args.tail))
    finally:
        load.stopping = True
        await asyncio.gather(*(s.stop() for s in load.sessions), return_exceptions=True)
    backlog = [end - sent for s in load.sessions if s.neighbour for sent in s.sent if sent >= start]
    turns = [latency for t, latency in load.turns if start <= t < end]
    answered = [x for x in turns if x is not None]
    return {
        "sessions": args.sessions,
        "opened": opened,
        "refused": dict(load.refused),
        "errors": dict(load.errors),
        "dead": sum(s.dead for s in load.sessions),
        "turns": len(turns),
        "unanswered": len(turns) - len(answered),
        "cancelled": load.cancelled,
        "latencies_ms": [round(x * 1000, 1) for x in answered],
        "end_to_reply": summary(answered),
        "end_to_transcript": summary([x for t, x in load.heard if start <= t < end]),
        "turn_end_delay": summary([x for t, x in load.stopped if start <= t < end]),
        "sentences": sum(start <= t < end for t in load.sentences),
        "speech_started": sum(start <= t < end for t in load.started),
        "splits": sum(start <= t < end for t in load.splits),
        "reply_frame_delay": summary([d for _, d in load.reply_delays]),
        "neighbour_delay": summary([r for _, r in load.echo_rtts] + backlog),
        "neighbour_backlog": len(backlog),
        "send_lateness": summary([x for due, x in load.lateness if start <= due < end]),
        "client_cpu_util": round((c1 - c0) / (end - start), 3),
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--sessions", type=int, required=True)
    p.add_argument("--utterance", action="append", required=True, help="16 kHz WAV (repeat)")
    p.add_argument("--neighbour", action="store_true")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--measure", type=float, default=30.0)
    p.add_argument("--tail", type=float, default=5.0, help="after the window, for replies")
    p.add_argument("--open-gap", type=float, default=0.1)
    p.add_argument("--gap", type=float, default=0.5, help="silence after a reply")
    p.add_argument("--reply-timeout", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--noise-peak", type=int, default=64, help="the noise's peak (64: -54 dBFS)")
    p.add_argument(
        "--converse", action="store_true", help="turn_detection server_vad: speech_stopped"
    )
    args = p.parse_args()
    emit("result", asyncio.run(run(args)))


if __name__ == "__main__":
    cli()
