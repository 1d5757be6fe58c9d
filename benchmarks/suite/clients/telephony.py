"""Load generator of scenario 10 (``benchmarks/suite/_telephony.py``): phone calls through
the fake Twilio (``trio_duplex/testing/twilio_provider.py``) or WebSocket voice sessions
on ``/v1/duplex``'s binary lane in G.711 μ-law at 8 kHz, on the ``voice`` engine, ramped on
a schedule shared by every load-generator process of a run (scenario 9's, ``calls.py``).

Both kinds do the same thing, so that the only difference is the dialect and its channel:

- **Up**: 160 bytes of μ-law (20 ms of a 440 Hz tone) every 20 ms in real time, on
  absolute deadlines (a late frame is sent at once and the next ones catch up). A call
  sends them as Twilio does (``media`` JSON, base64; the fake's ``send_audio``); a
  session as binary-lane input frames.
- **A reply**: every ``--every`` seconds (on a random phase per call) a call presses a
  key (``dtmf`` ``5``: the voice engine speaks the digit, 6 frames, 120 ms) and a session
  appends the text ``5`` (``input.text.append``): the same audio.
- **Down**: what arrives is played on a playout clock at 8000 bytes a second from the
  first byte of a run of audio. For a call that is the fake's own (it echoes the
  server's marks when their audio has played, and records ``gaps``: the stretches its
  playout ran dry between two of the server's audio); for a session ``Playout`` here
  does the same from the binary frames' arrival times.
- **An underrun** is a dry stretch *inside* a reply: a gap with no key press (or text)
  between its ends. The gap from one reply's end to the next reply's start is silence
  the caller expects and is not counted. Per window, for the replies asked in it: their
  audio (seconds), the dry milliseconds inside them on the fake's playout (``dry_ms``)
  and on one that starts ``--jitter-ms`` after a reply's first byte (``dry_jb_ms``,
  ``dry_time``: a jitter buffer of one frame, which the fake has not), how many ran dry,
  and each one's wait from the key to its first audio (-1: none yet).

Every process keeps the schedule of ``calls.py`` (``--epoch``, ``--open``, ``--settle``,
``--windows`` x ``--measure``), so that the orchestrator samples the server's CPU at
the same edges. One ``@result`` line at the end.

The fake keeps every message it sent and received; the records are emptied at each
window's start (after what the previous window needed was read), so that a long ramp
holds one window's worth of them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import collections
import json
import math
import os
import random
import time
from typing import Any, Final

from benchmarks.suite._workload import (
    BINARY_HEADER,
    INPUT_AUDIO_KIND,
    OUTPUT_AUDIO_KIND,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
)
from benchmarks.suite.clients._ramp import Ramp, log

RATE: Final = 8000
FRAME_S: Final = 0.020
CHUNK: Final = 160
DIGIT: Final = "5"
ACCOUNT: Final = "AC" + "0" * 32
TOKEN_ENV: Final = "TRIO_DUPLEX_TWILIO_AUTH_TOKEN"
SESSION_UPDATE_ULAW: Final = json.dumps(
    {
        "type": "session.update",
        "session": {
            "audio": {
                "wire": "binary",
                "input": {"format": "g711_ulaw", "rate": RATE},
                "output": {"format": "g711_ulaw", "rate": RATE},
            }
        },
    },
    separators=(",", ":"),
)


_TONE: list[bytes] = []


def ulaw(sample: int) -> int:
    """One 16-bit sample as G.711 μ-law (bias 0x84, clip 32635, bits inverted)."""
    sign = 0x80 if sample < 0 else 0
    magnitude = min(abs(sample), 32635) + 0x84
    exponent = max(0, magnitude.bit_length() - 8)
    return ~(sign | (exponent << 4) | ((magnitude >> (exponent + 3)) & 0x0F)) & 0xFF


def tone_second() -> bytes:
    """A second of a 440 Hz tone as μ-law (8000 bytes: 50 frames), computed once (here:
    the WebSocket side need not import the fake, whose tables take a while to build)."""
    if not _TONE:
        _TONE.append(
            bytes(ulaw(int(8000 * math.sin(2 * math.pi * 440 * n / RATE))) for n in range(RATE))
        )
    return _TONE[0]


def inside(gaps: list[tuple[float, float]], triggers: list[float]) -> list[tuple[float, float]]:
    """The gaps inside a reply: those with no trigger (key, text) between their ends.

    ``triggers`` are sorted. A gap that spans one is the silence between two replies."""
    out = []
    for a, b in gaps:
        i = bisect.bisect_left(triggers, a)
        if i < len(triggers) and triggers[i] <= b:
            continue
        out.append((a, b))
    return out


def dry_time(frames: list[tuple[float, int]], jitter: float) -> list[float]:
    """The dry stretches (seconds) of one reply's audio, ``(arrival, bytes)`` in order, on
    a playout that starts ``jitter`` seconds after its first byte arrived and drains
    8000 bytes a second; audio arriving after it ran dry plays at once. With
    ``jitter=0`` it is the fake's playout (its ``gaps`` inside the reply)."""
    out = []
    ends: float | None = None
    for t, n in frames:
        if ends is None:
            ends = t + jitter
        elif t > ends:
            out.append(t - ends)
            ends = t
        ends += n / RATE
    return out


class Playout:
    """The fake Twilio's playout for a session's binary frames: audio drains at 8000
    bytes a second from the first byte of a run; audio arriving after the buffer ran
    dry starts a new run, and the dry stretch is a gap."""

    def __init__(self) -> None:
        self.ends: float | None = None  # when what is buffered will have played
        self.gaps: list[tuple[float, float]] = []

    def arrive(self, t: float, nbytes: int) -> None:
        if self.ends is None or t > self.ends:
            if self.ends is not None:
                self.gaps.append((self.ends, t))
            self.ends = t
        self.ends += nbytes / RATE


class Share:
    """What every call or session of this process reports into."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.errors: collections.Counter[str] = collections.Counter()
        self.lag: list[float] = []  # ms this process's event loop was late (a ticker's)
        self.measuring = False


class Leg:
    """One call or session: its triggers, its audio's arrival times and bytes, its gaps."""

    def __init__(self, share: Share) -> None:
        self.share = share
        self.dead = False
        self.triggers: list[float] = []
        self.arrivals: list[float] = []
        self.audio_bytes: list[int] = []
        self.tasks: list[asyncio.Task[None]] = []

    def gaps(self) -> list[tuple[float, float]]:
        raise NotImplementedError

    def harvest(self, a: float, b: float, jitter: float) -> dict[str, Any]:
        """The replies asked in the window ``[a, b)``: their audio, the underruns inside
        them (``dry_ms``: the fake's gaps for a call, ``Playout``'s for a session; and
        ``dry_jb_ms``: the same audio on a playout that starts ``jitter`` seconds after a
        reply's first byte, ``dry_time``), each one's wait for its first audio."""
        self.pull()
        gaps = [g for g in inside(self.gaps(), self.triggers) if a <= g[0] < b + 1.0]
        triggers = self.triggers
        dry: list[float] = []
        dry_jb: list[float] = []
        waits: list[float] = []
        audio = replies = replies_dry = replies_dry_jb = 0
        for i, t in enumerate(triggers):
            if not a <= t < b:
                continue
            end = triggers[i + 1] if i + 1 < len(triggers) else math.inf
            lo = bisect.bisect_right(self.arrivals, t)
            hi = bisect.bisect_left(self.arrivals, end)
            frames = list(zip(self.arrivals[lo:hi], self.audio_bytes[lo:hi], strict=True))
            replies += 1
            if not frames:
                waits.append(-1.0)  # (none yet: a reply that did not come, or late)
                continue
            waits.append(round((frames[0][0] - t) * 1000, 2))
            audio += sum(n for _, n in frames)
            mine = [g for g in gaps if t <= g[0] < end]
            dry.extend(round((g[1] - g[0]) * 1000, 3) for g in mine)
            replies_dry += bool(mine)
            buffered = dry_time(frames, jitter)
            dry_jb.extend(round(x * 1000, 3) for x in buffered)
            replies_dry_jb += bool(buffered)
        return {
            "audio_s": audio / RATE,
            "dry_ms": dry,
            "dry_jb_ms": dry_jb,
            "replies": replies,
            "replies_dry": replies_dry,
            "replies_dry_jb": replies_dry_jb,
            "wait_ms": waits,
        }

    def forget(self, before: float) -> None:
        keep = bisect.bisect_left(self.arrivals, before)
        del self.arrivals[:keep]
        del self.audio_bytes[:keep]
        self.triggers = [t for t in self.triggers if t >= before - 5.0]
        self.drop_gaps(before - 5.0)

    def pull(self) -> None:
        """Bring ``arrivals``/``audio_bytes`` up to date (a call reads the fake's records)."""

    def drop_gaps(self, before: float) -> None:
        raise NotImplementedError

    async def trigger_loop(self, every: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + random.random() * every
        try:
            while True:
                await asyncio.sleep(max(0.0, due - loop.time()))
                self.triggers.append(time.monotonic())
                await self.trigger()
                due += every
        except Exception:
            self.dead = True

    async def trigger(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# ------------------------------------------------------------------------------ calls
class Phone(Leg):
    """A call through the fake Twilio: ``place_call``, then the tone and the key."""

    def __init__(self, share: Share, twilio: Any) -> None:
        super().__init__(share)
        self.twilio = twilio
        self.call: Any = None
        self.read = 0  # of the fake's ``received``: how many were read into ``arrivals``

    async def open(self) -> None:
        self.call = await self.twilio.place_call()
        if self.call.state != "in-progress":
            raise RuntimeError(f"the call is {self.call.state}: {self.call.failure}")
        await asyncio.sleep(random.random() * FRAME_S)  # a random phase of the 20 ms grid
        self.tasks = [
            asyncio.create_task(self.sender()),
            asyncio.create_task(self.trigger_loop(self.share.args.every)),
        ]

    async def sender(self) -> None:
        """A ``media`` every 20 ms on absolute deadlines, as a session's frames: late ones
        catch up. (The fake's own pacing, ``send_audio(realtime=True)``, starts a new run
        after a stall of more than a frame, so the audio falls behind the wall clock for
        good, and the engine's microphone lateness, measured against the least of the
        last 5 s, would count one stall of the load generator for 5 s.)"""
        second = tone_second()
        chunks = [second[i : i + CHUNK] for i in range(0, len(second), CHUNK)]
        loop = asyncio.get_running_loop()
        due = loop.time()
        n = 0
        try:
            while not self.call.ended:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self.call.send_audio(chunks[n % len(chunks)], realtime=False)
                n += 1
                due += FRAME_S
        except Exception:
            pass
        self.dead = True

    async def trigger(self) -> None:
        await self.call.dtmf(DIGIT)

    def pull(self) -> None:
        received = self.call.received
        for r in received[self.read :]:
            media = r.message.get("media")
            if r.message.get("event") == "media" and isinstance(media, dict):
                payload = media.get("payload", "")
                self.arrivals.append(r.at)
                self.audio_bytes.append(len(base64.b64decode(payload)))
            elif r.message.get("event") not in ("mark", "clear"):
                self.share.errors[f"twilio {r.message.get('event')}"] += 1
        self.read = len(received)
        if self.call.ended and not self.dead:
            self.dead = True
            self.share.errors[f"call {self.call.state}"] += 1

    def gaps(self) -> list[tuple[float, float]]:
        return list(self.call.gaps)

    def drop_gaps(self, before: float) -> None:
        call = self.call
        call.gaps[:] = [g for g in call.gaps if g[1] >= before]
        # The fake's other records: nothing here reads them again.
        del call.received[:]
        self.read = 0
        del call.sent[:]
        del call.played[:]
        del call.marks_echoed[:]

    async def stop(self) -> None:
        await super().stop()
        if self.call is not None:
            try:
                await self.call.stop(timeout=3)
            except Exception:
                pass


# ------------------------------------------------------------------------- WebSockets
class Session(Leg):
    """A ``/v1/duplex`` voice session on the binary lane in μ-law: what a call does."""

    def __init__(self, share: Share) -> None:
        super().__init__(share)
        self.ws: Any = None
        self.playout = Playout()

    async def open(self) -> None:
        from benchmarks.suite.clients._aio import dial, open_session

        url = self.share.args.url.replace("http://", "ws://") + "/v1/duplex"
        self.ws = await dial(url)
        await open_session(self.ws, SESSION_UPDATE_ULAW)
        await asyncio.sleep(random.random() * FRAME_S)
        self.tasks = [
            asyncio.create_task(self.receiver()),
            asyncio.create_task(self.sender()),
            asyncio.create_task(self.trigger_loop(self.share.args.every)),
        ]

    async def trigger(self) -> None:
        await self.ws.send('{"type":"input.text.append","text":"' + DIGIT + '"}')

    async def sender(self) -> None:
        second = tone_second()
        # 20 ms frames, or (``--ws-frame-ms 40``) what a call's channel hands the core: the
        # channel batches two 20 ms ``media`` into one 40 ms append.
        size = round(self.share.args.ws_frame_ms * RATE / 1000)
        period = size / RATE
        frames = [
            BINARY_HEADER.pack(INPUT_AUDIO_KIND, 0, 0, 0) + second[i : i + size]
            for i in range(0, len(second) - size + 1, size)
        ]
        loop = asyncio.get_running_loop()
        due = loop.time()
        n = 0
        try:
            while True:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self.ws.send(frames[n % len(frames)])
                n += 1
                due += period
        except Exception:
            self.dead = True

    async def receiver(self) -> None:
        received = 0
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    kind, _, _, seq = BINARY_HEADER.unpack_from(message)
                    if kind == OUTPUT_AUDIO_KIND:
                        t = time.monotonic()
                        nbytes = len(message) - BINARY_HEADER.size
                        self.arrivals.append(t)
                        self.audio_bytes.append(nbytes)
                        self.playout.arrive(t, nbytes)
                        received += 1
                        if received % 50 == 0:  # as scenario 3's and 9's clients ack
                            await self.ws.send(ack(seq))
                    continue
                event = json.loads(message)
                if event["type"] == "error":
                    self.share.errors[str(event.get("code", "error"))] += 1
        except Exception:
            pass
        self.dead = True

    def gaps(self) -> list[tuple[float, float]]:
        return self.playout.gaps

    def drop_gaps(self, before: float) -> None:
        self.playout.gaps[:] = [g for g in self.playout.gaps if g[1] >= before]

    async def stop(self) -> None:
        await super().stop()
        if self.ws is not None:
            self.ws.transport.abort()


# ------------------------------------------------------------------------------ ramp
def pool(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every leg's window together."""
    return {
        "audio_s": round(sum(p["audio_s"] for p in parts), 3),
        "dry_ms": [x for p in parts for x in p["dry_ms"]],
        "replies": sum(p["replies"] for p in parts),
        "replies_dry": sum(p["replies_dry"] for p in parts),
        "dry_jb_ms": [x for p in parts for x in p["dry_jb_ms"]],
        "replies_dry_jb": sum(p["replies_dry_jb"] for p in parts),
        "wait_ms": [x for p in parts for x in p["wait_ms"]],
    }


async def ticker(share: Share) -> None:
    """This process's event-loop lag: a 10 ms sleep's lateness, while measuring."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + 0.010
        await asyncio.sleep(0.010)
        if share.measuring:
            share.lag.append((loop.time() - due) * 1000)


async def ramp(args: argparse.Namespace) -> dict[str, Any]:
    share = Share(args)
    twilio: Any = None
    if args.kind == "phone":
        from trio_duplex.testing.twilio_provider import FakeTwilio

        # The server's auth token, from the environment (never on a command line).
        twilio = FakeTwilio(args.url, os.environ[TOKEN_ENV], ACCOUNT, timeout=20.0)
    steps: list[dict[str, Any]] = []
    tick = asyncio.create_task(ticker(share))
    tone_second()  # (before the first step: it takes a moment)
    if args.epoch <= 0:  # one process alone: its own schedule, from now (after the imports)
        args.epoch = time.monotonic()

    def make() -> Phone | Session:
        return Phone(share, twilio) if args.kind == "phone" else Session(share)

    legs = Ramp(args, make)
    held: list[Phone | Session] = legs.held
    try:
        for j, n in enumerate(legs.steps()):
            open_s = await legs.begin(j, n)
            if open_s is None:
                break
            windows = []
            for w in range(args.windows):
                a = legs.window_start(j, w)
                await legs.until(a)
                for one in held:
                    one.forget(a)
                share.errors, share.lag = collections.Counter(), []
                share.measuring = True
                c0 = cpu_seconds()
                await legs.until(a + args.measure)
                share.measuring = False
                c1 = cpu_seconds()
                # Replies asked late in the window may not have begun: read them a little
                # later (the next window's start is after this).
                await asyncio.sleep(min(0.3, args.settle))
                b = a + args.measure
                window = pool([one.harvest(a, b, args.jitter_ms / 1000) for one in held])
                lag = sorted(share.lag)
                window.update({
                    "errors": dict(share.errors),
                    "client_cpu_util": (c1 - c0) / args.measure,
                    "client_lag_p99_ms": lag[int(len(lag) * 0.99)] if lag else math.nan,
                })  # fmt: skip
                windows.append(window)
            steps.append(legs.step(n, open_s, windows))
            last = windows[-1] if windows else {}
            log(
                f"{args.kind} {args.share} n={n} held={len(held)} "
                f"audio={last.get('audio_s', 0):.1f}s dry={sum(last.get('dry_ms', [])):.0f}ms "
                f"(buffered {sum(last.get('dry_jb_ms', [])):.0f}ms) "
                f"client_cpu={last.get('client_cpu_util', 0):.0%} "
                f"failures={dict(legs.failures)}"
            )
            if legs.too_few(n):
                break
            audio = min((w["audio_s"] for w in windows), default=0.0)
            dry = min((sum(w["dry_jb_ms"]) for w in windows), default=0.0)
            if audio and dry / 1000 > 0.2 * audio:  # far past the SLO on this share alone
                log(f"{args.kind} {args.share}: {dry:.0f} ms dry at {n}; ramp ends")
                break
    finally:
        tick.cancel()
        await legs.stop()
        if twilio is not None:
            await twilio.aclose()
    return {"steps": steps, "kind": args.kind, "share": args.share}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["ramp"])
    parser.add_argument("--kind", choices=["phone", "ws"], default="phone")
    parser.add_argument("--url", required=True, help="the server's http://127.0.0.1:PORT")
    parser.add_argument("--steps", default="1")
    parser.add_argument("--share", default="0/1")
    parser.add_argument("--epoch", type=float, default=0.0)
    parser.add_argument("--open", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--measure", type=float, default=3.0)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--every", type=float, default=1.5, help="seconds between replies")
    parser.add_argument(
        "--ws-frame-ms", type=float, default=20.0, help="a session's input frames (20, 40)"
    )
    parser.add_argument(
        "--jitter-ms", type=float, default=20.0, help="the modelled playout's start delay"
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    raise_nofile()
    emit("result", asyncio.run(ramp(args)))


if __name__ == "__main__":
    main()
