"""CPU per 20 ms frame of the audio codecs (trio_duplex.audio), per path and direction.

    python -m benchmarks.codecs [--seconds 2]

Each path runs a 1 kHz sine (a stand-in for speech: the codecs' cost does not depend on
the signal much) through a Decoder (wire -> engine, the client's input) and an Encoder
(engine -> wire, the engine's output) of a 24 kHz engine, 20 ms at a time, and reports
process CPU µs per frame (the best of three rounds, so that a busy neighbour counts
least) and its ratio to the pcm16 24 kHz passthrough.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from trio_duplex.audio import AudioFormat, Decoder, Encoder, opus_available

ENGINE_RATE = 24000
PATHS = [
    ("pcm16 24k passthrough", AudioFormat("pcm16", 24000)),
    ("pcm16 16k <-> 24k", AudioFormat("pcm16", 16000)),
    ("g711_ulaw 8k <-> 24k", AudioFormat("g711_ulaw", 8000)),
    ("opus 48k <-> 24k", AudioFormat("opus", 48000)),
]


def frames(rate: int, count: int) -> list[bytes]:
    t = np.arange(rate * count // 50) / rate
    pcm = (np.sin(2 * np.pi * 1000 * t) * 10_000).astype("<i2").tobytes()
    size = rate // 50 * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


MIN_CPU_S = 0.002
"""Each round repeats its frames until at least this much CPU has passed (up to
MAX_PASSES times): a figure is never a division by a CPU time of 0."""
MAX_PASSES = 64


def cpu_us_per_frame(step: Callable[[bytes], object], inputs: list[bytes]) -> float:
    """CPU µs per call, the best of three rounds; NaN if no round measured any CPU."""
    best = math.nan
    for _ in range(3):
        start = time.process_time()
        passes, spent = 0, 0.0
        while passes < MAX_PASSES and spent < MIN_CPU_S:
            for frame in inputs:
                step(frame)
            passes += 1
            spent = time.process_time() - start
        if spent > 0:
            per = spent / (passes * len(inputs)) * 1e6
            best = per if math.isnan(best) else min(best, per)
    return best


def measure(wire: AudioFormat, count: int) -> tuple[float, float]:
    """(decode, encode) µs per 20 ms frame."""
    engine_frames = frames(ENGINE_RATE, count)
    encode = cpu_us_per_frame(Encoder(wire, ENGINE_RATE).encode, engine_frames)
    # What a client would send: the encoder's own output, one payload per frame.
    source = Encoder(wire, ENGINE_RATE)
    payloads = [p for f in engine_frames for p in source.encode(f)]
    decode = cpu_us_per_frame(Decoder(wire, ENGINE_RATE).decode, payloads)
    return decode, encode


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codecs", description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="audio per round")
    args = parser.parse_args(argv)
    count = int(args.seconds * 50)
    print(f"CPU µs per 20 ms frame, engine pcm16 {ENGINE_RATE} Hz, best of 3 x {count} frames")
    print(f"{'path':<24} {'decode':>8} {'ratio':>7} {'encode':>8} {'ratio':>7}")
    base: tuple[float, float] | None = None
    for name, wire in PATHS:
        if wire.format == "opus" and not opus_available():
            print(f"{name:<24} (no libopus or `opus` extra)")
            continue
        decode, encode = measure(wire, count)
        base = base or (decode, encode)
        print(f"{name:<24} {decode:8.1f} {ratio(decode, base[0])} {encode:8.1f} "
              f"{ratio(encode, base[1])}")  # fmt: skip


def ratio(x: float, base: float) -> str:
    """``x / base`` as the table shows it; ``-`` where either was not measured (NaN)."""
    return f"{x / base:6.0f}x" if base > 0 and not math.isnan(x) else f"{'-':>7}"


if __name__ == "__main__":
    main()
