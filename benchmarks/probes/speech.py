"""The speech engine on one core: sessions held in real time, the time from the
end of speech to the reply, turn ends in background noise, memory, and admission.

    python -m benchmarks.speech [--steps 0,1,2,4,6,8,12,16] [--rounds 2] [--measure 30]

The server (``trio-duplex serve``, its own process) is pinned to core 0 with ``taskset``
(its recogniser pool and voice processes inherit that core: one of each), the load
generator (``benchmarks.probes.clients.speech_load``, one asyncio process) to core 1.
The test sentences are the first ``--sentences`` of the outside set
(``benchmarks/data/slurp_test_first100.txt``, in file order) said by ``--voice``
(espeak-ng by default) at the start, at the engine's 16 kHz; session i starts at
sentence i and goes on in order, cycling. Each speech session streams them at real-time
pace, with white noise between them (peaks of ``--noise-peak``, 64: -54 dBFS), and
waits for each reply before the next sentence (see the load generator). Sessions name
``turn_detection: {"type": "server_vad"}`` (the engine's defaults), so that turns come
as OpenAI's do, with ``speech_stopped``; ``--plain`` leaves it out.

1. **The ramp.** For each N of ``--steps`` a fresh server (``--max-sessions`` raised out
   of the way) serves N speech sessions and one neighbour: a session of the echo engine
   on the same server, sending a 20 ms frame every 20 ms and timing each echo. The server
   runs one engine, so it runs ``--engine benchmarks.probes.speech:route``, which builds an
   ``EchoEngine`` for a session configured ``{"bench_engine": "echo"}`` and a
   ``SpeechEngine`` for any other. A step holds if the neighbour's p99 frame delay and
   the speech replies' p99 frame delay are at most ``--threshold-ms`` (20), with every
   turn answered, no error and no session lost. The steps go on past the first that
   fails, to show how latency degrades; ``--rounds`` ramps, interleaved.
2. **Noise.** One session (and the neighbour) per ``--noise-peaks`` level: how long the
   turn detector holds a turn open after the speech (end of speech → ``speech_stopped``),
   and the turns it starts against the sentences sent.
3. **Memory.** A fresh server per ``--rss-steps`` N (no neighbour): the RSS (and PSS) of
   the server process and of its children (the recogniser pool's workers, the voice's
   processes) at the end of the window, and the slope per extra session.
4. **Admission.** ``--engine speech`` with ``--max-sessions`` at its default (from the
   cores the server may use: one here), offered twice that many sessions: how many are
   refused (``resource_exhausted``), and the latency of those admitted.

Figures go to stdout as markdown tables (and ``--json FILE``). The machine is shared
with other work: each step records what other processes took of it (/proc/stat, less
the server's and its children's CPU) and the load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.probes.speech_tables import (
    admission_table,
    holds,
    memory_table,
    noise_table,
    pooled,
    ramp_table,
)
from benchmarks.probes.speech_turns import noise_turn_ends, trim
from benchmarks.probes.speech_turns import table as detector_table
from benchmarks.speech_wer import VOICES, sentences, voice_missing
from benchmarks.suite._procs import (
    PY,
    BenchError,
    LoadMeter,
    Proc,
    free_port,
    install_reaper,
    machine_info,
    pinned,
    run_to_result,
    start_server,
)
from trio_duplex.engines.api import Engine

SERVER_CPU, CLIENT_CPU = "0", "1"


VOICE_ENV = "BENCH_SPEECH_VOICE"
"""The route's ``--speech-voice`` (``serve`` takes that flag only with ``--engine speech``)."""


class _Route:
    """The ramp's engine factory: ``echo`` for the neighbour, ``speech`` for the rest (its
    parts chosen once, as ``--engine speech`` chooses them, the voice from ``VOICE_ENV``)."""

    def __init__(self) -> None:
        self._speech: Any = None

    def __call__(self, config: Mapping[str, Any]) -> Engine:
        if config.get("bench_engine") == "echo":
            from trio_duplex.engines.echo import EchoEngine

            return EchoEngine(config)
        if self._speech is None:
            from trio_duplex.engines.speech import SpeechFactory

            self._speech = SpeechFactory.choose(None, os.environ.get(VOICE_ENV, "auto"), None)
        engine: Engine = self._speech(config)
        return engine

    @staticmethod
    def default_max_sessions() -> int:
        from trio_duplex.engines.speech import default_max_sessions

        return default_max_sessions()


route = _Route()


def synthesise(directory: Path, voice: str, count: int) -> list[str]:
    """The first ``count`` sentences of the outside set said by ``voice``, as 16 kHz mono
    PCM16 WAV files, trimmed to their speech (espeak-ng ends each with 380 ms of silence,
    which the end of speech would otherwise include)."""
    why = voice_missing(voice)
    if why:
        raise BenchError(f"voice {voice}: {why}")
    paths = []
    for i, said in enumerate(VOICES[voice][1](sentences(count), directory)):
        samples = trim(said)  # its last frame is the end of speech
        path = directory / f"sentence{i}.wav"
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16_000)
            wav.writeframes(samples.astype("<i2").tobytes())
        paths.append(str(path))
    return paths


def niced(argv: list[str], nice: int) -> list[str]:
    return argv if nice == 0 else ["nice", "-n", str(nice), *argv]


def tree(server: Proc) -> dict[str, Any]:
    """CPU seconds and memory of the server and of every process under it, now: RSS and
    PSS (shared pages split between the processes sharing them) by kind."""
    out: dict[str, Any] = {"cpu": 0.0, "procs": {}}
    try:
        root = psutil.Process(server.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                cmd = " ".join(proc.cmdline())
                mem = proc.memory_full_info()
        except psutil.Error:
            continue  # (gone meanwhile)
        kind = "server" if proc.pid == server.pid else _kind(cmd)
        out["cpu"] += cpu.user + cpu.system
        entry = out["procs"].setdefault(kind, {"count": 0, "rss_mib": 0.0, "pss_mib": 0.0})
        entry["count"] += 1
        entry["rss_mib"] = round(entry["rss_mib"] + mem.rss / 2**20, 1)
        entry["pss_mib"] = round(entry["pss_mib"] + getattr(mem, "pss", 0) / 2**20, 1)
    out["rss_mib"] = round(sum(e["rss_mib"] for e in out["procs"].values()), 1)
    out["pss_mib"] = round(sum(e["pss_mib"] for e in out["procs"].values()), 1)
    return out


def _kind(cmdline: str) -> str:
    if "whisper" in cmdline or "_pool" in cmdline or "recognis" in cmdline:
        return "recognisers"
    if "piper" in cmdline or "flite" in cmdline or "espeak" in cmdline:
        return "voice"
    return "other"


class ChildNice:
    """Keeps the server's children as far below it as they are when it runs at niceness 0.

    The benchmark runs the server at ``--nice`` (-10: ahead of the other work on a shared
    machine). The recognisers lower themselves relative to it (``os.nice(5)``: -5), but the
    Piper voice sets an absolute +5, which would put it 15 below its server and below every
    other process on the machine, where in production (a server at 0) it is 5 below, level
    with the recognisers. A thread renices each child at +5 to the server's niceness + 5."""

    def __init__(self, server: Proc, nice: int) -> None:
        self.server, self.target = server, nice + 5
        self.stop = threading.Event()
        self.reniced = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        if nice != 0:
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                children = psutil.Process(self.server.pid).children(recursive=True)
            except psutil.Error:
                return
            for child in children:
                try:
                    if child.nice() == 5 and self.target != 5:
                        child.nice(self.target)
                        self.reniced += 1
                except psutil.Error:
                    pass

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(1)


def run_step(
    engine: str,
    sessions: int,
    utterances: list[str],
    args: argparse.Namespace,
    *,
    neighbour: bool,
    max_sessions: int | None,
    noise_peak: int | None = None,
    measure: float | None = None,
) -> dict[str, Any]:
    """One server, one load: the load generator's result, plus the server's (and its
    children's) CPU share and memory in the window, and what the rest of the machine
    took meanwhile."""
    port = free_port()
    argv = [PY, "-m", "trio_duplex", "serve", "--engine", engine, "--port", str(port)]
    if max_sessions is not None:
        argv += ["--max-sessions", str(max_sessions)]
    if engine == "speech" and args.server_voice != "auto":
        argv += ["--speech-voice", args.server_voice]
    argv += args.server_arg
    loadavg = os.getloadavg()[0]
    os.environ[VOICE_ENV] = args.server_voice  # (the server's environment is ours)
    server, url = start_server(
        f"serve {engine}",
        niced(pinned(argv, SERVER_CPU), args.nice),
        timeout=60,
        probe=f"ws://127.0.0.1:{port}/v1/duplex",
    )
    marks: dict[str, dict[str, Any]] = {}
    keeper = ChildNice(server, args.nice) if args.keep_order else None
    try:
        meter = LoadMeter()
        before = tree(server)
        load = [PY, "-m", "benchmarks.probes.clients.speech_load", url, "--sessions", str(sessions)]
        load += [x for path in utterances for x in ("--utterance", path)]
        load += ["--measure", str(args.measure if measure is None else measure)]
        load += ["--warmup", str(args.warmup), "--tail", str(args.tail)]
        load += ["--noise-peak", str(args.noise_peak if noise_peak is None else noise_peak)]
        if neighbour:
            load.append("--neighbour")
        if not args.plain:
            load.append("--converse")
        timeout = 180 + args.measure + sessions * 3

        def on_mark(name: str) -> None:
            marks[name] = {**tree(server), "t": time.monotonic()}

        result = run_to_result(
            "speech_load", niced(pinned(load, CLIENT_CPU), args.nice),
            on_mark=on_mark, timeout=timeout, watch=server,
        )  # fmt: skip
        after = tree(server)
        machine = meter.read()
        # The server and its children are alive: /proc/stat counted them as others'.
        ours = max(0.0, after["cpu"] - before["cpu"])
        other = max(0.0, machine["other_cpu_s"] - ours)
        cores = os.cpu_count() or 1
        machine.update(
            other_cpu_s=round(other, 1), other_share=round(other / (machine["wall_s"] * cores), 3)
        )
        machine["loadavg_1m_before"] = round(loadavg, 2)
        result["machine"] = machine
        if "start" in marks and "end" in marks:
            a, b = marks["start"], marks["end"]
            result["server_cpu_share"] = round((b["cpu"] - a["cpu"]) / (b["t"] - a["t"]), 3)
            result["memory"] = {k: b[k] for k in ("rss_mib", "pss_mib", "procs")}
        if keeper is not None:
            result["reniced_children"] = keeper.reniced
    finally:
        if keeper is not None:
            keeper.close()
        server.stop()
    return result


def _steps(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps",
        default="0,1,2,4,6,8,12,16",
        help="speech sessions per step (0: the neighbour alone)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", type=float, default=30.0, help="seconds per step")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument(
        "--tail", type=float, default=5.0, help="seconds after a window for its turns' replies"
    )
    parser.add_argument("--threshold-ms", type=float, default=20.0)
    parser.add_argument("--voice", default="espeak-ng", choices=sorted(VOICES))
    parser.add_argument("--sentences", type=int, default=20, help="the first N of the set")
    parser.add_argument("--noise-peak", type=int, default=64, help="64: -54 dBFS")
    parser.add_argument("--noise-peaks", default="4,64,328", help="the noise step's levels")
    parser.add_argument("--rss-steps", default="1,4,16", help="the memory step's sessions")
    parser.add_argument("--rss-measure", type=float, default=15.0)
    parser.add_argument("--admission-rounds", type=int, default=2)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="one more `serve` argument (repeat)"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=-10 if os.geteuid() == 0 else 0,
        help="the server's and the load generator's niceness: ahead of other work on a "
        "shared machine (-10 as root, else 0)",
    )
    parser.add_argument(
        "--server-voice", default="auto", help="the engine's --speech-voice (auto: Piper)"
    )
    parser.add_argument(
        "--no-keep-order",
        dest="keep_order",
        action="store_false",
        help="leave the server's children at the niceness they set (see ChildNice)",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="sessions that name no turn_detection (no speech_stopped: no turn end delay)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args(argv)
    install_reaper()
    steps_n = _steps(args.steps)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report: dict[str, Any] = {"machine": machine_info(), "started": started}
    report["args"] = {**vars(args), "json": str(args.json)}
    report["loadavg_before"] = os.getloadavg()
    steps: list[dict[str, Any]] = []
    noise: list[dict[str, Any]] = []
    detector: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    admission: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="speech-bench-") as tmp:
        utterances = synthesise(Path(tmp), args.voice, args.sentences)
        seconds = [_seconds(p) for p in utterances]
        print(f"{len(seconds)} sentences ({args.voice}): {min(seconds):.2f}-{max(seconds):.2f} s, "
              f"mean {sum(seconds) / len(seconds):.2f} s", file=sys.stderr)  # fmt: skip
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
        if _steps(args.noise_peaks):
            detector = noise_turn_ends([_read(p) for p in utterances], _steps(args.noise_peaks))
        for peak in _steps(args.noise_peaks):
            step = run_step(
                "benchmarks.probes.speech:route",
                1,
                utterances,
                args,
                neighbour=True,
                max_sessions=200,
                noise_peak=peak,
            )
            step["noise_peak"] = peak
            noise.append(step)
            print(noise_table([step]).splitlines()[-1], file=sys.stderr)
        for n in _steps(args.rss_steps):
            step = run_step(
                "benchmarks.probes.speech:route",
                n,
                utterances,
                args,
                neighbour=False,
                max_sessions=200,
                measure=args.rss_measure,
            )
            memory.append(step)
            print(memory_table([step]).splitlines()[-1], file=sys.stderr)
        from trio_duplex.engines.speech import SESSIONS_PER_CORE

        for r in range(args.admission_rounds):
            # Twice the default of a server pinned to one core (or, unpinned, of every core).
            one_core = pinned(["x"], SERVER_CPU) != ["x"]
            offered = 2 * SESSIONS_PER_CORE * (1 if one_core else (os.cpu_count() or 1))
            step = run_step("speech", offered, utterances, args, neighbour=False, max_sessions=None)
            step["round"] = r + 1
            admission.append(step)
            print(json.dumps(step), file=sys.stderr)
    steps.sort(key=lambda s: (s["sessions"], s["round"]))
    report.update(sentences_s=seconds, ramp=steps, noise=noise, memory=memory)
    report["detector"] = [
        {k: (None if v == float("inf") else v) for k, v in r.items()} for r in detector
    ]
    report["admission"] = admission
    report["loadavg_after"] = os.getloadavg()
    print(f"## Ramp ({started}; {args.voice}, noise peak {args.noise_peak}; threshold "
          f"{args.threshold_ms:g} ms)\n")  # fmt: skip
    print(ramp_table(steps, args.threshold_ms))
    held = [
        n
        for n in steps_n
        if n and all(holds(s, args.threshold_ms) for s in steps if s["sessions"] == n)
    ]
    # The largest N such that it and every N below it held in every round.
    most = 0
    for n in sorted(x for x in steps_n if x):
        if n not in held:
            break
        most = n
    print(f"\nLargest N held in every round (and every N below it): {most}")
    for n in sorted({1, 4, 8, most, SESSIONS_PER_CORE} - {0}):
        p = pooled([s for s in steps if s["sessions"] == n])
        if p["n"]:
            print(f"End of speech → first reply audio at N={n}: p50 {p['p50_ms']:.0f} ms, "
                  f"p90 {p['p90_ms']:.0f} ms, p99 {p['p99_ms']:.0f} ms "
                  f"({p['n']} turns, rounds pooled)")  # fmt: skip
    if detector:
        print("\n## Turn ends in background noise: the turn detector alone (stream time)\n")
        print(detector_table(detector))
    if noise:
        print("\n## Turn ends in background noise: one session on the server (wall time)\n")
        print(noise_table(noise))
    if memory:
        print("\n## Memory: the server and its children at the end of the window\n")
        print(memory_table(memory))
    print(f"\n## Admission at the default --max-sessions ({SESSIONS_PER_CORE} per core)\n")
    print(admission_table(admission))
    la = report["loadavg_after"]
    print(f"\nLoad average before {report['loadavg_before'][0]:.2f}, after {la[0]:.2f}")
    report["largest_held"] = most
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _read(path: str) -> Any:
    with wave.open(path) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)


def _seconds(path: str) -> float:
    with wave.open(path) as wav:
        return float(wav.getnframes() / wav.getframerate())


if __name__ == "__main__":
    main()
