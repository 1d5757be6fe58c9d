"""The speech engine on one core: sessions held in real time, the time from the
end of speech to the reply, and what happens past capacity.

    python -m benchmarks.speech [--steps 1,2,3,4,6,8] [--rounds 2] [--measure 30]

The server (``trio-duplex serve``, its own process) is pinned to core 0 with ``taskset``,
the load generator (``benchmarks.probes.clients.speech_load``, one asyncio process) to core 1.
Test sentences are synthesised by espeak-ng at the start and resampled to the engine's
16 kHz. Each speech session streams them at real-time pace, with faint noise between
them, and waits for each reply before the next sentence (see the load generator).

1. **The ramp.** For each N of ``--steps`` a fresh server (``--max-sessions`` raised out
   of the way) serves N speech sessions and one neighbour: a session of the echo engine
   on the same server, sending a 20 ms frame every 20 ms and timing each echo. The server
   runs one engine, so it runs ``--engine benchmarks.probes.speech:route``, which builds an
   ``EchoEngine`` for a session configured ``{"bench_engine": "echo"}`` and a
   ``SpeechEngine`` for any other. A step holds if the neighbour's p99 frame delay and
   the speech replies' p99 frame delay are at most ``--threshold-ms`` (20), with every
   turn answered, no error and no session lost. The steps go on past the first that
   fails, to show how latency degrades; ``--rounds`` ramps, interleaved.
2. **Admission.** ``--engine speech`` with ``--max-sessions`` at its default (from the
   cores the server may use: one here), offered twice that many sessions: how many are
   refused (``resource_exhausted``), and the latency of those admitted.

Figures go to stdout as markdown tables (and ``--json FILE``). The machine is shared
with other work: each step records what other processes took of it (/proc/stat).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.suite._procs import (
    PY,
    BenchError,
    LoadMeter,
    free_port,
    install_reaper,
    machine_info,
    pinned,
    run_client,
    start_server,
)
from benchmarks.suite._stats import percentiles
from trio_duplex.engines.api import Engine

SENTENCES = (
    "hello world this is a test of the speech engine",
    "what is the weather like today",
    "please turn on the lights in the kitchen",
    "how many sessions can one core hold",
)
SERVER_CPU, CLIENT_CPU = "0", "1"


class _Route:
    """The ramp's engine factory: ``echo`` for the neighbour, ``speech`` for the rest."""

    def __call__(self, config: Mapping[str, Any]) -> Engine:
        if config.get("bench_engine") == "echo":
            from trio_duplex.engines.echo import EchoEngine

            return EchoEngine(config)
        from trio_duplex.engines.speech import SpeechEngine

        return SpeechEngine(config)

    @staticmethod
    def default_max_sessions() -> int:
        from trio_duplex.engines.speech import default_max_sessions

        return default_max_sessions()


route = _Route()


def synthesise(directory: Path) -> list[str]:
    """The test sentences as 16 kHz mono PCM16 WAV files (espeak-ng, then soxr)."""
    from trio_duplex.audio import Resampler

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise BenchError("espeak-ng is not installed (apt-get install -y espeak-ng)")
    paths = []
    for i, text in enumerate(SENTENCES):
        raw = directory / f"raw{i}.wav"
        subprocess.run([espeak, "-v", "en-us", "-w", str(raw), text], check=True, timeout=30)
        with wave.open(str(raw)) as wav:
            rate = wav.getframerate()
            samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        resampler = Resampler(rate, 16_000)
        out = np.concatenate((resampler.process(samples), resampler.drain()))
        path = directory / f"sentence{i}.wav"
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16_000)
            wav.writeframes(out.astype("<i2").tobytes())
        paths.append(str(path))
    return paths


def niced(argv: list[str], nice: int) -> list[str]:
    return argv if nice == 0 else ["nice", "-n", str(nice), *argv]


def run_step(
    engine: str,
    sessions: int,
    utterances: list[str],
    args: argparse.Namespace,
    *,
    neighbour: bool,
    max_sessions: int | None,
) -> dict[str, Any]:
    """One server, one load: the load generator's result, plus the server's CPU share in
    the window and what the rest of the machine took meanwhile."""
    port = free_port()
    argv = [PY, "-m", "trio_duplex", "serve", "--engine", engine, "--port", str(port)]
    if max_sessions is not None:
        argv += ["--max-sessions", str(max_sessions)]
    server, url = start_server(
        f"serve {engine}",
        niced(pinned(argv, SERVER_CPU), args.nice),
        timeout=60,
        probe=f"ws://127.0.0.1:{port}/v1/duplex",
    )
    try:
        meter = LoadMeter()
        load = [PY, "-m", "benchmarks.probes.clients.speech_load", url, "--sessions", str(sessions)]
        load += [x for path in utterances for x in ("--utterance", path)]
        load += ["--measure", str(args.measure), "--warmup", str(args.warmup)]
        load += ["--tail", str(args.tail)]
        if neighbour:
            load.append("--neighbour")
        timeout = 120 + args.measure + sessions * 3
        result, marks = run_client(
            "speech_load", niced(pinned(load, CLIENT_CPU), args.nice), watch=server, timeout=timeout
        )
        result["machine"] = meter.read()
        if "start" in marks and "end" in marks:
            a, b = marks["start"], marks["end"]
            result["server_cpu_share"] = round((b["cpu"] - a["cpu"]) / (b["t"] - a["t"]), 3)
            result["server_rss_mib"] = round(b["rss"] / 2**20, 1)
    finally:
        server.stop()
    return result


def holds(step: Mapping[str, Any], threshold_ms: float) -> bool:
    """Real time held: both frame delays' p99 within the threshold, every turn answered,
    nothing refused, lost or in error."""
    neighbour = step["neighbour_delay"].get("p99_ms", float("inf"))
    reply = step["reply_frame_delay"].get("p99_ms", float("inf"))
    if step["sessions"] == 0:  # the baseline: the neighbour alone
        return bool(neighbour <= threshold_ms and not step["errors"] and step["dead"] == 0)
    return bool(
        neighbour <= threshold_ms
        and reply <= threshold_ms
        and step["turns"] > 0
        and step["unanswered"] == 0
        and not step["errors"]
        and not step["refused"]
        and step["dead"] == 0
    )


def _ms(summary: Mapping[str, Any], key: str) -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def ramp_table(steps: list[dict[str, Any]], threshold_ms: float) -> str:
    lines = [
        "| N | round | neighbour p99 / max (ms) | reply frames p99 (ms) | end of speech → "
        "reply p50 / p99 (ms, turns) | → transcript p50 (ms) | unanswered | server CPU "
        "| others' CPU | holds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        nb, rf, er, et = (
            s["neighbour_delay"],
            s["reply_frame_delay"],
            s["end_to_reply"],
            s["end_to_transcript"],
        )
        lines.append(
            f"| {s['sessions']} | {s['round']} | {_ms(nb, 'p99_ms')} / {_ms(nb, 'max_ms')} "
            f"| {_ms(rf, 'p99_ms')} | {_ms(er, 'p50_ms')} / {_ms(er, 'p99_ms')} ({er['n']}) "
            f"| {_ms(et, 'p50_ms')} | {s['unanswered']} | {s.get('server_cpu_share', 0):.0%} "
            f"| {s['machine']['other_share']:.0%} | {'yes' if holds(s, threshold_ms) else 'no'} |"
        )
    return "\n".join(lines)


def pooled(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """End of speech → reply over every turn of these steps (all rounds pooled)."""
    latencies = [x / 1000 for s in steps for x in s["latencies_ms"]]
    if not latencies:
        return {"n": 0}
    p = percentiles(latencies, (50, 99))
    return {"n": len(latencies), "p50_ms": p["p50"] * 1000, "p99_ms": p["p99"] * 1000}


def gil_holds(sentence: str, repeats: int = 3) -> dict[str, dict[str, float]]:
    """How long each kind of PocketSphinx call keeps every other Python thread of the
    process waiting (ms, median and max over the calls): a thread that wakes every
    millisecond times its own gaps while the calls run in another thread, as the engine
    runs them (``trio.to_thread``). A call that released the GIL would leave ~1 ms gaps;
    the event loop is such a thread, so these are stalls of every session's frames."""
    import threading
    import time

    from pocketsphinx import Decoder

    with wave.open(sentence) as wav:
        pcm = wav.readframes(wav.getnframes())
    held: dict[str, list[float]] = {
        "Decoder() (load)": [],
        "process_raw (20 ms)": [],
        "hyp (partial)": [],
        "end_utt": [],
        "hyp (final)": [],
    }
    gaps: list[tuple[float, float]] = []  # (the gap's end, the gap)
    stop = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now, now - last))
            last = now

    def timed(name: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = call(*args, **kwargs)
        end = time.perf_counter()
        time.sleep(0.005)  # the ticker logs the gap this call made when it wakes
        held[name].append(1000 * max((g for t, g in gaps if start < t <= end + 0.005), default=0))
        return result

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        for _ in range(repeats):
            decoder = timed("Decoder() (load)", Decoder, samprate=16_000, loglevel="FATAL")
            decoder.start_utt()
            for at in range(0, len(pcm), 640):  # 20 ms at a time, a partial every 200 ms
                chunk = pcm[at : at + 640]
                timed("process_raw (20 ms)", decoder.process_raw, chunk, False, False)
                if at % 6400 == 0:
                    timed("hyp (partial)", decoder.hyp)
            timed("end_utt", decoder.end_utt)
            timed("hyp (final)", decoder.hyp)
    finally:
        stop.set()
        thread.join()
    return {
        name: {"median_ms": round(statistics.median(v), 1), "max_ms": round(max(v), 1)}
        for name, v in held.items()
    }


def gil_table(holds: Mapping[str, Mapping[str, float]]) -> str:
    lines = [
        "| PocketSphinx call | other threads held off: median (ms) | max (ms) |",
        "|---|---|---|",
    ]
    for name, h in holds.items():
        lines.append(f"| {name} | {h['median_ms']:.1f} | {h['max_ms']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", default="0,1,2,3,4,6,8", help="speech sessions per step (0: the neighbour alone)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", type=float, default=30.0, help="seconds per step")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument(
        "--tail", type=float, default=5.0, help="seconds after a window for its turns' replies"
    )
    parser.add_argument("--gil-repeats", type=int, default=3, help="decoders timed")
    parser.add_argument("--threshold-ms", type=float, default=20.0)
    parser.add_argument("--admission-rounds", type=int, default=2)
    parser.add_argument(
        "--nice",
        type=int,
        default=-10 if os.geteuid() == 0 else 0,
        help="the server's and the load generator's niceness: ahead of other work on a "
        "shared machine (-10 as root, else 0)",
    )
    parser.add_argument(
        "--gil-only", action="store_true", help="only the PocketSphinx calls' GIL holds"
    )
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args(argv)
    install_reaper()
    steps_n = [int(x) for x in args.steps.split(",")]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report: dict[str, Any] = {"machine": machine_info(), "started": started, "args": vars(args)}
    report["args"] = {**vars(args), "json": str(args.json)}
    with tempfile.TemporaryDirectory(prefix="speech-bench-") as tmp:
        utterances = synthesise(Path(tmp))
        seconds = [_seconds(p) for p in utterances]
        print(f"sentences: {', '.join(f'{s:.2f} s' for s in seconds)}", file=sys.stderr)
        report["gil"] = gil_holds(utterances[0], args.gil_repeats)
        print(f"## PocketSphinx calls and the GIL ({started})\n")
        print(gil_table(report["gil"]) + "\n")
        if args.gil_only:
            return
        steps: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = steps_n if r % 2 == 0 else steps_n[::-1]
            for n in order:
                step = run_step(
                    "benchmarks.probes.speech:route",
                    n,
                    utterances,
                    args,
                    neighbour=True,
                    max_sessions=200,
                )
                step["round"] = r + 1
                steps.append(step)
                print(ramp_table([step], args.threshold_ms).splitlines()[-1], file=sys.stderr)
        admission = []
        for r in range(args.admission_rounds):
            from trio_duplex.engines.speech import SESSIONS_PER_CORE

            # Twice the default of a server pinned to one core (or, unpinned, of every core).
            one_core = pinned(["x"], SERVER_CPU) != ["x"]
            offered = 2 * SESSIONS_PER_CORE * (1 if one_core else (os.cpu_count() or 1))
            step = run_step("speech", offered, utterances, args, neighbour=False, max_sessions=None)
            step["round"] = r + 1
            admission.append(step)
            print(json.dumps(step), file=sys.stderr)
    steps.sort(key=lambda s: (s["sessions"], s["round"]))
    report.update(sentences_s=seconds, ramp=steps, admission=admission)
    print(f"## Ramp ({started}; threshold {args.threshold_ms:g} ms)\n")
    print(ramp_table(steps, args.threshold_ms))
    held = [
        n
        for n in steps_n
        if n and all(holds(s, args.threshold_ms) for s in steps if s["sessions"] == n)
    ]
    most = max(held, default=0)
    print(f"\nLargest N held in every round: {most}")
    from trio_duplex.engines.speech import SESSIONS_PER_CORE  # the default on one core

    for n in sorted({1, most, SESSIONS_PER_CORE} - {0}):
        p = pooled([s for s in steps if s["sessions"] == n])
        if p["n"]:
            print(f"End of speech → first reply audio at N={n}: p50 {p['p50_ms']:.0f} ms, "
                  f"p99 {p['p99_ms']:.0f} ms ({p['n']} turns, rounds pooled)")  # fmt: skip
    print("\n## Admission at the default --max-sessions\n")
    print(
        "| round | offered | admitted | refused | reply frames p99 (ms) "
        "| end of speech → reply p50 / p99 (ms) | unanswered |"
    )
    print("|---|---|---|---|---|---|---|")
    for a in admission:
        er = a["end_to_reply"]
        print(
            f"| {a['round']} | {a['sessions']} | {a['opened']} | {a['refused']} "
            f"| {_ms(a['reply_frame_delay'], 'p99_ms')} "
            f"| {_ms(er, 'p50_ms')} / {_ms(er, 'p99_ms')} | {a['unanswered']} |"
        )
    report["largest_held"] = most
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _seconds(path: str) -> float:
    with wave.open(path) as wav:
        return float(wav.getnframes() / wav.getframerate())


if __name__ == "__main__":
    main()
