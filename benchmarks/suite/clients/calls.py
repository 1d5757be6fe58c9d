"""Load generator of scenario 9 (``benchmarks/suite/_calls.py``): WebRTC calls (aiortc) or
WebSocket voice sessions, on the ``voice`` engine, ramped on a schedule shared by every
load-generator process of a run.

Each **call** is a browser-like aiortc peer (``tests/media/rtc.py``'s: an ``oai-events``
data channel, a candidate-less offer, host candidates on 127.0.0.1 only) whose microphone
is a 20 ms tone that aiortc encodes to Opus, posted to ``POST /v1/realtime/calls`` as
``application/sdp``. Once ``session.created`` arrives it asks for a long spoken answer
(``conversation.item.create`` + ``response.create``), and another at each
``response.done``. The server's RTP packets are timed as they arrive (aiortc's receiver is
given nothing more: no jitter buffer, no decoding, as the benchmark needs only their
arrival), and the gaps between a call's packets are the figure. Each **session** does
the same over ``/v1/duplex`` on the binary lane: 20 ms PCM frames up, the engine's
audio messages down, their gaps timed.

``--share I/K``: this process holds the I-th of K shares of each step's count. Step j
opens its calls in ``[epoch + j*P, + open)`` (P = open + settle + W x measure), then
measures W windows from ``+ open + settle``, each ``measure`` long (a step holds if one
of them does: scenario 3's rule of measuring a failed step once more, on a schedule):
every process keeps to the same clock
(``CLOCK_MONOTONIC``), so the orchestrator samples the server's CPU at the same edges
without a mark. One ``@result`` line at the end: each step's raw gaps (ms), so that the
orchestrator takes percentiles over every process's calls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import time
import urllib.request
from fractions import Fraction
from typing import Any, Final

from benchmarks.suite._workload import (
    BINARY_HEADER,
    OUTPUT_AUDIO_KIND,
    VOICE_BINARY,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
)
from benchmarks.suite.clients._ramp import Ramp, log

RATE: Final = 48_000
FRAME_S: Final = 0.020
CALLS_PATH: Final = "/v1/realtime/calls"
WORDS: Final = (
    "the quick brown fox jumps over a lazy dog while seven bright birds sing "
    "above quiet rivers and tall green hills under morning light"
).split()


def long_text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def compact(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


class Share:
    """What every call or session of this process reports into."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.measuring = False
        self.gaps: list[float] = []  # ms between a call's consecutive audio packets
        self.lateness: list[float] = []  # ms this client's mic loop was late
        self.errors: collections.Counter[str] = collections.Counter()
        self.text = long_text(args.words)


# ------------------------------------------------------------------------------ calls
_TONE: list[bytes] = []


def tone_frames() -> list[bytes]:
    """A second of the tone (50 frames of 960 samples at 48 kHz), computed once."""
    if not _TONE:
        from tests.media.rtc import tone

        _TONE.extend(tone(960, 960 * n) for n in range(50))
    return _TONE


class CachedTone:
    """``tests/media/rtc.py``'s ToneTrack (a 440 Hz tone, 20 ms frames paced by the wall
    clock) with its second of PCM computed once: 440 Hz repeats every second, and a
    sine per sample per call would make the client, not the server, what is measured."""

    def __init__(self, share: Share) -> None:
        from aiortc.mediastreams import MediaStreamTrack

        frames = tone_frames()
        outer = self

        class Track(MediaStreamTrack):
            kind = "audio"

            def __init__(self) -> None:
                super().__init__()
                self.n = 0
                self.start: float | None = None

            async def recv(self) -> Any:
                import av
                from aiortc.mediastreams import MediaStreamError

                if self.readyState != "live":
                    raise MediaStreamError
                if outer.share.args.idle:  # an idle call: a muted microphone sends nothing
                    await asyncio.Event().wait()
                loop = asyncio.get_running_loop()
                if self.start is None:
                    self.start = loop.time()
                due = self.start + self.n * FRAME_S
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if outer.share.measuring:
                    outer.share.lateness.append((loop.time() - due) * 1000)
                frame = av.AudioFrame(format="s16", layout="mono", samples=960)
                frame.planes[0].update(frames[self.n % 50])
                frame.pts = 960 * self.n
                frame.sample_rate = RATE
                frame.time_base = Fraction(1, RATE)
                self.n += 1
                return frame

        self.share = share
        self.track = Track()


def patch_receiver() -> None:
    """aiortc's RTP receiver: a packet of a receiver given a ``_bench_call`` is timed and
    dropped (the benchmark needs its arrival only; decoding it would load the client)."""
    from aiortc.rtcrtpreceiver import RTCRtpReceiver

    real = RTCRtpReceiver._handle_rtp_packet

    async def handle(self: RTCRtpReceiver, packet: Any, arrival_time_ms: int) -> None:
        call = self.__dict__.get("_bench_call")
        if call is None:
            await real(self, packet, arrival_time_ms)
        else:
            call.packet()

    RTCRtpReceiver._handle_rtp_packet = handle  # type: ignore[method-assign]


def post_offer(base: str, sdp: str) -> str:
    request = urllib.request.Request(
        base + CALLS_PATH,
        data=sdp.encode(),
        headers={"Content-Type": "application/sdp"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        if response.status != 201:
            raise RuntimeError(f"POST {CALLS_PATH}: {response.status}")
        return str(response.read().decode())


class Call:
    def __init__(self, share: Share) -> None:
        self.share = share
        self.last: float | None = None
        self.dead = False
        self.seq = 0
        self.acked = 0
        self.created = asyncio.Event()
        self.pc: Any = None
        self.packets = 0

    def packet(self) -> None:
        t = time.monotonic()
        self.packets += 1
        if self.last is not None and self.share.measuring:
            self.share.gaps.append((t - self.last) * 1000)
        self.last = t

    def message(self, message: str | bytes) -> None:
        if not isinstance(message, str):
            return
        event = json.loads(message)
        kind = event.get("type")
        seq = event.get("server_event_seq")
        if isinstance(seq, int):
            self.seq = max(self.seq, seq)
        if kind == "session.created":
            self.created.set()
        elif kind == "response.done":
            self.speak()
        elif kind == "error":
            self.share.errors[str(event.get("error", {}).get("code", "error"))] += 1
        if self.seq - self.acked >= 100:  # keep the journal short, as a client acks
            self.acked = self.seq
            self.send(ack(self.seq))

    def send(self, text: str) -> None:
        if self.dc.readyState == "open":
            self.dc.send(text)

    def speak(self) -> None:
        self.send(
            compact({
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": self.share.text}]},
            })
        )  # fmt: skip
        self.send(compact({"type": "response.create"}))

    async def open(self) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.dc = pc.createDataChannel("oai-events")
        self.dc.on("message", self.message)
        pc.addTrack(CachedTone(self.share).track)

        @pc.on("connectionstatechange")
        def state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self.dead = True

        await pc.setLocalDescription(await pc.createOffer())
        offer = "".join(
            line
            for line in pc.localDescription.sdp.splitlines(keepends=True)
            if not line.startswith(("a=candidate:", "a=end-of-candidates"))
        )
        answer = await asyncio.to_thread(post_offer, self.share.args.url, offer)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        for receiver in pc.getReceivers():
            receiver._bench_call = self  # type: ignore[attr-defined]
        async with asyncio.timeout(20):
            await self.created.wait()
        if not self.share.args.idle:
            # On a random phase of the 20 ms grid, as scenario 3's sessions send: the
            # engine paces each answer from its start, and answers started together
            # would all send in the same instant.
            await asyncio.sleep(random.random() * FRAME_S)
            self.speak()

    async def stop(self) -> None:
        if self.pc is not None:
            try:
                async with asyncio.timeout(3):
                    await self.pc.close()
            except Exception:
                pass


# ------------------------------------------------------------------------- WebSockets
class Session:
    """A ``/v1/duplex`` voice session on the binary lane: what a call does, over a
    WebSocket."""

    def __init__(self, share: Share) -> None:
        self.share = share
        self.last: float | None = None
        self.dead = False
        self.tasks: list[asyncio.Task[None]] = []
        self.ws: Any = None
        self.packets = 0

    async def open(self) -> None:
        from benchmarks.suite._workload import SESSION_UPDATE_BINARY
        from benchmarks.suite.clients._aio import dial, open_session

        url = self.share.args.url.replace("http://", "ws://") + "/v1/duplex"
        self.ws = await dial(url)
        await open_session(self.ws, SESSION_UPDATE_BINARY)
        self.tasks = [asyncio.create_task(self.receiver())]
        if not self.share.args.idle:
            await asyncio.sleep(random.random() * FRAME_S)  # a random phase (as Call's)
            await self.speak()
            self.tasks.append(asyncio.create_task(self.sender()))

    async def speak(self) -> None:
        await self.ws.send(compact({"type": "input.text.append", "text": self.share.text}))

    async def sender(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + random.random() * FRAME_S
        try:
            while True:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.share.measuring:
                    self.share.lateness.append((loop.time() - due) * 1000)
                await self.ws.send(VOICE_BINARY)
                due += FRAME_S
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
                        self.packets += 1
                        if self.last is not None and self.share.measuring:
                            self.share.gaps.append((t - self.last) * 1000)
                        self.last = t
                        received += 1
                        if received % 50 == 0:  # as scenario 3's client acks
                            await self.ws.send(ack(seq))
                    continue
                event = json.loads(message)
                if event["type"] == "response.done":
                    await self.speak()
                elif event["type"] == "error":
                    self.share.errors[str(event.get("code", "error"))] += 1
        except Exception:
            pass
        self.dead = True

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.ws is not None:
            self.ws.transport.abort()


# ------------------------------------------------------------------------------ ramp
def p99_of(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else math.nan


async def ramp(args: argparse.Namespace) -> dict[str, Any]:
    share = Share(args)
    if args.epoch <= 0:  # one process alone: its own schedule, from now
        args.epoch = time.monotonic()
    kind = Call if args.kind == "call" else Session
    if args.kind == "call":
        from tests.media.rtc import loopback_only

        loopback_only()
        patch_receiver()
    legs = Ramp(args, lambda: kind(share))
    held: list[Call | Session] = legs.held
    steps: list[dict[str, Any]] = []
    try:
        for j, n in enumerate(legs.steps()):
            open_s = await legs.begin(j, n)
            if open_s is None:
                break
            windows = []
            for w in range(args.windows):
                await legs.until(legs.window_start(j, w))
                share.gaps, share.lateness, share.errors = [], [], collections.Counter()
                packets0 = sum(one.packets for one in held)
                share.measuring = True
                c0 = cpu_seconds()
                await legs.until(legs.window_start(j, w + 1))
                share.measuring = False
                c1 = cpu_seconds()
                windows.append({
                    "packets": sum(one.packets for one in held) - packets0,
                    "gaps_ms": [round(g, 2) for g in share.gaps],
                    "lateness_ms": [round(x, 2) for x in share.lateness],
                    "errors": dict(share.errors),
                    "client_cpu_util": (c1 - c0) / args.measure,
                })  # fmt: skip
            steps.append(legs.step(n, open_s, windows))
            p99 = min((p99_of(window["gaps_ms"]) for window in windows), default=math.nan)
            log(
                f"{args.kind} {args.share} n={n} held={len(held)} gap_p99={p99:.1f}ms "
                f"client_cpu={windows[-1]['client_cpu_util']:.0%} "
                f"failures={dict(legs.failures)}"
            )
            if legs.too_few(n):
                break
            if p99 > 4 * args.gap_ms:  # far past the SLO on this share alone: over
                log(f"{args.kind} {args.share}: gap p99 {p99:.0f} ms at {n}; ramp ends")
                break
        if args.hold:  # the memory phase: keep them open until the orchestrator is done
            await legs.until(args.epoch + args.hold)
    finally:
        await legs.stop()
    return {"steps": steps, "kind": args.kind, "share": args.share}


async def probe(args: argparse.Namespace) -> dict[str, Any]:
    """One call, ``--responses`` short answers, each after ``--idle-s`` of silence from
    the engine: the latency phase (the server stamps; this only asks)."""
    from tests.media.rtc import loopback_only

    loopback_only()
    patch_receiver()
    share = Share(args)
    share.text = "one two"
    call = Call(share)
    done = asyncio.Event()
    heard = call.message

    def message(message: str | bytes) -> None:
        if isinstance(message, str) and '"response.done"' in message:
            done.set()
            return
        heard(message)

    call.message = message  # type: ignore[method-assign]
    try:
        await call.open()  # (its first answer asked for)
        for _ in range(args.responses):
            async with asyncio.timeout(20):
                await done.wait()
            done.clear()
            await asyncio.sleep(args.idle_s)
            call.speak()
        async with asyncio.timeout(20):
            await done.wait()
    finally:
        await call.stop()
    return {"responses": args.responses + 1, "packets": call.packets}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["ramp", "probe"])
    parser.add_argument("--kind", choices=["call", "ws"], default="call")
    parser.add_argument("--url", required=True, help="the server's http://127.0.0.1:PORT")
    parser.add_argument("--responses", type=int, default=50, help="probe: answers to time")
    parser.add_argument("--idle-s", type=float, default=0.3, help="probe: silence before each")
    parser.add_argument("--steps", default="1")
    parser.add_argument("--share", default="0/1")
    parser.add_argument(
        "--epoch",
        type=float,
        default=0.0,
        help="time.monotonic() of step 0; 0: now (one process alone)",
    )
    parser.add_argument("--open", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--measure", type=float, default=2.0)
    parser.add_argument("--windows", type=int, default=2, help="measured windows per step")
    parser.add_argument("--words", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=30.0, help="the gap SLO")
    parser.add_argument("--idle", action="store_true", help="no audio either way")
    parser.add_argument("--hold", type=float, default=0.0, help="hold until epoch + this")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    raise_nofile()
    result = asyncio.run(ramp(args) if args.mode == "ramp" else probe(args))
    emit("result", result)


if __name__ == "__main__":
    main()
