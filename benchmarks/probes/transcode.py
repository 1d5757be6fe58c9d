"""Server CPU per echoed 20 ms voice frame, per audio path, with transcoding.

    python -m benchmarks.transcode [--rounds 3] [--sessions 20] [--seconds 3] [--nice -10]

A ``trio-duplex serve --engine echo`` (its audio is 24 kHz PCM16) per run, pinned to CPU
0; the load (``websockets`` asyncio, in this process, pinned to CPU 1) opens N sessions
of one path and sends each a 20 ms frame every 20 ms on a random phase, a fixed load of
50 x N frames a second that the server decodes to the engine's PCM16, echoes, and
encodes back. Server CPU (psutil: user + system) over the measured window, divided by
the frames echoed in it, is the cost of one frame in and out, protocol and codec
included; a window that counted no server CPU (psutil's 10 ms ticks) has no figure
("-"), never a 0 to divide by. Paths: the binary lane with pcm16 24 kHz
(passthrough), G.711 μ-law 8 kHz and Opus 48 kHz; and the JSON lane's pcm16 24 kHz
(base64 both ways). Each round runs every path once, in alternating order, each against
a fresh server; the ratio to passthrough is taken per round, and the table gives medians
(min-max).

The codec share: the same script times the codec calls alone (``benchmarks.codecs``'s
measure: decode + encode of one 20 ms frame, best of three) and divides by the server's
cost per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from benchmarks.probes import codecs
from benchmarks.suite._procs import PY, Proc, free_port, pinned, start_server
from benchmarks.suite._stats import DASH, TIMES, paired_ratios
from benchmarks.suite._suite import duplex_flags
from benchmarks.suite._workload import BINARY_HEADER, INPUT_AUDIO_KIND, raise_nofile
from trio_duplex.audio import AudioFormat, Encoder, opus_available

PATHS: list[tuple[str, str, AudioFormat]] = [
    ("pcm16 24k passthrough (binary)", "binary", AudioFormat("pcm16", 24000)),
    ("g711_ulaw 8k (binary)", "binary", AudioFormat("g711_ulaw", 8000)),
    ("opus 48k (binary)", "binary", AudioFormat("opus", 48000)),
    ("pcm16 24k passthrough (JSON lane)", "json", AudioFormat("pcm16", 24000)),
]


def payloads(fmt: AudioFormat, count: int = 50) -> list[bytes]:
    """``count`` 20 ms payloads in ``fmt``: a 1 kHz sine at the wire rate, encoded."""
    t = np.arange(fmt.rate * count // 50) / fmt.rate
    pcm = (np.sin(2 * np.pi * 1000 * t) * 10_000).astype("<i2").tobytes()
    size = fmt.rate // 50 * 2
    encoder = Encoder(fmt, fmt.rate)
    return [p for i in range(0, len(pcm), size) for p in encoder.encode(pcm[i : i + size])]


def messages(lane: str, fmt: AudioFormat) -> list[str | bytes]:
    if lane == "binary":
        head = BINARY_HEADER.pack(INPUT_AUDIO_KIND, 0, 0, 0)
        return [head + p for p in payloads(fmt)]
    import base64

    return [
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(p).decode()},
                   separators=(",", ":"))
        for p in payloads(fmt)
    ]  # fmt: skip


async def load(
    url: str, proc: Proc, lane: str, fmt: AudioFormat, args: argparse.Namespace
) -> dict[str, Any]:
    frames = messages(lane, fmt)
    audio = {"wire": lane, "input": fmt.as_event(), "output": fmt.as_event()}
    update = {"type": "session.update", "session": {"audio": audio}}
    echoed = 0
    counting = False
    errors: list[str] = []
    stop = asyncio.Event()
    rng = random.Random(5)

    async def session() -> None:
        nonlocal echoed
        async with connect(url, compression=None, max_size=None, ping_interval=None) as ws:
            await ws.send(json.dumps(update))
            created = json.loads(await ws.recv())
            if created.get("type") != "session.created":
                errors.append(str(created))
                return
            loop = asyncio.get_running_loop()

            async def sender() -> None:
                due = loop.time() + rng.random() * 0.020
                i = 0
                while not stop.is_set():
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    await ws.send(frames[i % len(frames)])
                    i += 1
                    due += 0.020

            task = asyncio.create_task(sender())
            try:
                n = 0
                while not stop.is_set():
                    try:
                        message = await asyncio.wait_for(ws.recv(), 0.5)
                    except TimeoutError:
                        continue
                    if isinstance(message, str):
                        event = json.loads(message)
                        if event["type"] == "error":
                            errors.append(event.get("code", "?"))
                            continue
                        seq = event.get("server_event_seq")
                    else:
                        seq = BINARY_HEADER.unpack_from(message)[3]
                    n += 1
                    if counting:
                        echoed += 1
                    if n % 32 == 0:  # ack like trio_duplex.client
                        await ws.send(f'{{"type":"session.event_ack","server_event_seq":{seq}}}')
            finally:
                task.cancel()

    tasks = [asyncio.create_task(session()) for _ in range(args.sessions)]
    await asyncio.sleep(args.warmup)
    counting = True
    a = proc.snapshot()
    await asyncio.sleep(args.seconds)
    b = proc.snapshot()
    counting = False
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return figures(echoed, b["cpu"] - a["cpu"], b["t"] - a["t"], errors)


def figures(echoed: int, cpu: float, wall: float, errors: list[str]) -> dict[str, Any]:
    """One run's figures. psutil counts the server's CPU in clock ticks (10 ms): a short
    window can measure 0 ticks, and then there is no cost per frame (None), never a 0
    that a ratio would divide by."""
    return {
        "frames": echoed,
        "server_cpu_s": cpu,
        "us_per_frame": cpu / echoed * 1e6 if echoed and cpu > 0 else None,
        "server_util": cpu / wall if wall > 0 else None,
        "errors": errors[:5],
    }


def run_one(args: argparse.Namespace, lane: str, fmt: AudioFormat) -> dict[str, Any]:
    port = free_port()
    flags = duplex_flags(port)
    flags[flags.index("--log-level") + 1] = "warning"
    argv = [PY, "-m", "trio_duplex", "serve", *flags]
    if args.nice:
        argv = ["nice", "-n", str(args.nice), *argv]
    probe = f"ws://127.0.0.1:{port}/v1/duplex"
    proc, url = start_server("trio-duplex", pinned(argv, "0"), probe=probe)
    try:
        return asyncio.run(asyncio.wait_for(load(url, proc, lane, fmt, args), args.seconds + 30))
    finally:
        proc.stop()


def shown(x: float | None, spec: str) -> str:
    return "-" if x is None or math.isnan(x) else format(x, spec)


def median_range(xs: list[float], digits: int = 1) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}{DASH}{max(xs):,.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transcode", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=20, help="voice sessions per run")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--nice", type=int, default=0, help="niceness of server and load")
    parser.add_argument("--json", action="store_true", help="also print every run, as JSON")
    args = parser.parse_args(argv)
    raise_nofile()
    if args.nice:
        os.nice(args.nice)
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    paths = [p for p in PATHS if p[2].format != "opus" or opus_available()]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in paths}
    for r in range(args.rounds):
        order = paths if r % 2 == 0 else paths[::-1]
        for name, lane, fmt in order:
            result = run_one(args, lane, fmt)
            runs[name].append(result)
            print(f"  round {r + 1}: {name}: {shown(result['us_per_frame'], '.1f')} µs/frame, "
                  f"server {shown(result['server_util'], '.0%')} busy, {result['frames']} frames"
                  + (f", errors {result['errors']}" if result["errors"] else ""),
                  file=sys.stderr, flush=True)  # fmt: skip
    base = runs[paths[0][0]]
    count = 150
    print(f"Server CPU per echoed 20 ms frame: {args.sessions} sessions x 50 frames/s, "
          f"{args.seconds:g} s windows, {args.rounds} rounds; median (min{DASH}max)")  # fmt: skip
    print("| path | server CPU µs / frame | ratio to passthrough | codec µs / frame "
          "(decode + encode) | codec share of the server's cost |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, _, fmt in paths:
        # A run whose window measured no server CPU has no figure: left out, not divided by.
        per = [x["us_per_frame"] for x in runs[name] if x["us_per_frame"] is not None]
        ratios = paired_ratios([x["us_per_frame"] for x in runs[name]],
                               [b["us_per_frame"] for b in base])  # fmt: skip
        decode, encode = codecs.measure(fmt, count)
        codec = decode + encode
        share = codec / statistics.median(per) if per else None
        ratio = f"{median_range(ratios, 2)}{TIMES}" if ratios else "-"
        print(f"| {name} | {median_range(per)} | {ratio} "
              f"| {shown(codec, '.1f')} ({shown(decode, '.1f')} + {shown(encode, '.1f')}) "
              f"| {shown(share, '.0%')} |")  # fmt: skip
    if args.rounds and args.json:
        print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
