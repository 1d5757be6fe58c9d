"""Bytes on the wire per second of audio, both directions, per lane and format.

    python -m benchmarks.wire_bytes [--seconds 1] [--server-cmd "trio-duplex serve"]

Counted, not timed: one ``trio-duplex serve --engine echo`` (a subprocess) and, per lane
(``json``: base64 in JSON text, v1; ``binary``: protocol v2's 12-byte header) and format,
one session of ``trio_duplex.client`` whose TCP stream is wrapped to keep every byte it
sends and receives. The client streams N seconds of audio (50 frames a second, 20 ms
each: a 1 kHz sine at 24 kHz, encoded client-side into the session's input format) and
reads the echo (the server decodes it to the engine's 24 kHz PCM16 and encodes it back
into the output format). The recorded bytes are then split into WebSocket frames (the
HTTP upgrade aside) and each message classified by what it carries, so the figures are
whole frames: the WebSocket header (2-4 bytes, plus the client's 4-byte mask) and the
JSON envelope or 12-byte header included.

The table gives, per second of audio: audio message bytes client -> server and server ->
client, the raw audio payload in them, the overhead of the lane (bytes / payload), and the
SDK's own control messages over the same stretch (acks, heartbeats: the client acks every
32 events by default) per second.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from typing import Any

import attrs
import numpy as np
import trio

from benchmarks.suite._procs import PY, free_port, start_server
from benchmarks.suite._stats import TIMES
from benchmarks.suite._suite import duplex_flags
from trio_duplex.audio import AudioFormat, Encoder, opus_available
from trio_duplex.client import connect

ENGINE_RATE = 24_000
FORMATS: list[tuple[str, AudioFormat]] = [
    ("pcm16 24k", AudioFormat("pcm16", 24000)),
    ("pcm16 16k", AudioFormat("pcm16", 16000)),
    ("g711_ulaw 8k", AudioFormat("g711_ulaw", 8000)),
    ("opus 48k", AudioFormat("opus", 48000)),
]
LANES = ("json", "binary")
AUDIO_IN = "input_audio_buffer.append"
AUDIO_OUT = "response.output_audio.delta"
CONTROL = frozenset(
    {
        "session.event_ack",
        "session.heartbeat",
        "session.heartbeat_ack",
        "input.consumed",
        "ping",
        "pong",
    }
)


class CountingStream(trio.abc.Stream):
    """A stream that keeps a copy of every byte sent and received."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sent = bytearray()
        self.received = bytearray()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.sent += data

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.received += data
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.frozen
class Frame:
    opcode: int
    fin: bool
    size: int  # the whole frame on the wire: header, mask and payload
    payload: bytes  # unmasked


def split_frames(data: bytes) -> list[Frame]:
    """The WebSocket frames of one direction of a connection, after its HTTP upgrade."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return []
    i, frames = head_end + 4, []
    while i + 2 <= len(data):
        b0, b1 = data[i], data[i + 1]
        n, at = b1 & 0x7F, i + 2
        if n == 126:
            n, at = int.from_bytes(data[at : at + 2], "big"), at + 2
        elif n == 127:
            n, at = int.from_bytes(data[at : at + 8], "big"), at + 8
        mask = b""
        if b1 & 0x80:
            mask, at = data[at : at + 4], at + 4
        if at + n > len(data):
            break  # cut off by the close
        payload = data[at : at + n]
        if mask:
            key = np.resize(np.frombuffer(mask, np.uint8), n)
            payload = (np.frombuffer(payload, np.uint8) ^ key).tobytes()
        frames.append(Frame(b0 & 0x0F, bool(b0 & 0x80), at + n - i, payload))
        i = at + n
    return frames


def classify(frame: Frame) -> str:
    """``audio``, or the event type (text), or ``ping``/``pong``/``close``/``other``."""
    if frame.opcode == 2:
        return "audio" if frame.payload[:1] in (b"\x01", b"\x02") else "binary?"
    if frame.opcode == 1:
        kind = json.loads(frame.payload).get("type", "?")
        return "audio" if kind in (AUDIO_IN, AUDIO_OUT) else str(kind)
    return {8: "close", 9: "ping", 10: "pong"}.get(frame.opcode, "other")


def audio_payload(frame: Frame) -> int:
    """The raw audio bytes a message carries (decoded from base64 on the JSON lane)."""
    if frame.opcode == 2:
        return len(frame.payload) - 12
    audio: str = json.loads(frame.payload)["audio"]
    return len(audio) * 3 // 4 - audio.count("=")


def signal(rate: int, seconds: float) -> list[bytes]:
    """20 ms frames of PCM16 at ``rate``: a 1 kHz sine (as benchmarks.codecs)."""
    t = np.arange(int(rate * seconds)) / rate
    pcm = (np.sin(2 * np.pi * 1000 * t) * 10_000).astype("<i2").tobytes()
    size = rate // 50 * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


def audio_seconds(fmt: AudioFormat, payload: int, messages: int) -> float:
    """How much audio ``payload`` bytes in ``messages`` messages hold: by the format's
    constant byte rate, or (Opus, variable) at 20 ms a packet."""
    if fmt.format == "opus":
        return messages * 0.020
    return payload / (fmt.rate * (2 if fmt.format == "pcm16" else 1))


async def one_session(url: str, lane: str, fmt: AudioFormat, seconds: float) -> dict[str, Any]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    streams: list[CountingStream] = []

    async def open_stream() -> trio.abc.Stream:
        stream = CountingStream(await trio.open_tcp_stream(host, int(port)))
        streams.append(stream)
        return stream

    # Encoded at the wire's own rate (no resampler delay): exactly 50 payloads a second.
    encoder = Encoder(fmt, fmt.rate)
    payloads = [p for pcm in signal(fmt.rate, seconds) for p in encoder.encode(pcm)]
    audio = {"wire": lane, "input": fmt.as_event(), "output": fmt.as_event()}
    got, errors = 0, Counter[str]()
    with trio.fail_after(30):
        async with connect(url, {"audio": audio}, open_stream=open_stream) as session:
            for payload in payloads:
                await session.send_audio(payload)
            # The echo of the last frame may be short of a whole output frame (a
            # resampler's delay): read until the expected count or a quiet 0.5 s.
            while got < len(payloads):
                with trio.move_on_after(0.5) as quiet:
                    event = await session.receive()
                if quiet.cancelled_caught:
                    break
                if event["type"] == AUDIO_OUT:
                    got += 1
                elif event["type"] == "error":
                    errors[event.get("code", "?")] += 1
    (stream,) = streams
    out: dict[str, Any] = {"frames_sent": len(payloads), "frames_echoed": got}
    out["errors"] = dict(errors)
    for direction, data in (("up", stream.sent), ("down", stream.received)):
        count: Counter[str] = Counter()
        size: Counter[str] = Counter()
        raw = 0
        for frame in split_frames(bytes(data)):
            kind = classify(frame)
            count[kind] += 1
            size[kind] += frame.size
            if kind == "audio":
                raw += audio_payload(frame)
        seconds_held = audio_seconds(fmt, raw, count["audio"])
        out[direction] = {"count": dict(count), "bytes": dict(size), "audio_payload": raw,
                          "audio_seconds": seconds_held}  # fmt: skip
    return out


async def run(url: str, seconds: float) -> list[dict[str, Any]]:
    results = []
    for lane in LANES:
        for name, fmt in FORMATS:
            if fmt.format == "opus" and not opus_available():
                print(f"{name}: skipped (no libopus or `opus` extra)", file=sys.stderr)
                continue
            r = await one_session(url, lane, fmt, seconds)
            results.append({"lane": lane, "format": name, **r})
    return results


def table(results: list[dict[str, Any]], seconds: float) -> str:
    """Audio figures per second of the audio each direction carried (the echo's first
    frame can be short by a resampler's delay); control messages per second streamed."""

    def per_s(x: float, held: float = seconds) -> str:
        return f"{x / held:,.0f}"

    lines = [
        "| lane | format | audio payload B/s (up / down) | client → server B/s "
        "| server → client B/s "
        "| lane overhead (up / down) | SDK control B/s (up / down) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        up, down = r["up"], r["down"]
        up_audio, down_audio = up["bytes"].get("audio", 0), down["bytes"].get("audio", 0)
        ctl_up = sum(v for k, v in up["bytes"].items() if k in CONTROL)
        ctl_down = sum(v for k, v in down["bytes"].items() if k in CONTROL)
        held_up, held_down = up["audio_seconds"], down["audio_seconds"]
        lines.append(
            f"| {r['lane']} | {r['format']} | {per_s(up['audio_payload'], held_up)} / "
            f"{per_s(down['audio_payload'], held_down)} | {per_s(up_audio, held_up)} "
            f"| {per_s(down_audio, held_down)} "
            f"| {up_audio / max(1, up['audio_payload']):.3f}{TIMES} / "
            f"{down_audio / max(1, down['audio_payload']):.3f}{TIMES} "
            f"| {per_s(ctl_up)} / {per_s(ctl_down)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wire_bytes", description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="audio per session")
    parser.add_argument("--server-cmd", default=f"{PY} -m trio_duplex serve")
    parser.add_argument("--json", action="store_true", help="print the raw counts as JSON too")
    args = parser.parse_args(argv)
    port = free_port()
    flags = duplex_flags(port)
    flags[flags.index("--log-level") + 1] = "warning"
    probe = f"ws://127.0.0.1:{port}/v1/duplex"
    proc, url = start_server("trio-duplex", [*shlex.split(args.server_cmd), *flags], probe=probe)
    try:
        results = trio.run(run, url, args.seconds)
    finally:
        proc.stop()
    print(f"Bytes on the wire per second of audio ({args.seconds:g} s per session, 20 ms frames)")
    print(table(results, args.seconds))
    for r in results:
        if r["errors"] or r["frames_echoed"] < r["frames_sent"] - 2:
            print(f"note: {r['lane']} {r['format']}: {r['frames_echoed']} of "
                  f"{r['frames_sent']} echoed, errors {r['errors']}")  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
