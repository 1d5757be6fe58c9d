"""Audio for the turn detector's tests: the outside set's sentences said by espeak-ng and
flite (the first ones in file order, none chosen), silence, white noise, and where speech
really starts and ends (from its energy, not from the VAD under test)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
import wave
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soxr  # type: ignore[import-untyped]

RATE = 16_000
BYTES_PER_MS = 32
SENTENCES = Path(__file__).parents[3] / "benchmarks" / "data" / "slurp_test_first100.txt"
VOICES = ("espeak-ng", "flite")
Pcm = npt.NDArray[np.int16]

needs_voices = pytest.mark.skipif(
    any(shutil.which(voice) is None for voice in VOICES),
    reason="needs espeak-ng and flite (apt-get install espeak-ng flite)",
)


def sentences(n: int) -> list[str]:
    """The first ``n`` sentences of the outside set, in file order."""
    lines = SENTENCES.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")][:n]


def _pcm(wav: bytes) -> Pcm:
    with wave.open(io.BytesIO(wav)) as reader:
        rate = reader.getframerate()
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype=np.int16)
    if rate == RATE:
        return pcm
    resampled: Pcm = soxr.resample(pcm, rate, RATE)
    return np.clip(resampled, -32768, 32767).astype(np.int16)


@cache
def said(voice: str, text: str) -> Pcm:
    """``text`` said by ``voice`` (espeak-ng at 150 wpm, or flite's slt), 16 kHz int16."""
    if voice == "espeak-ng":
        command = ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout", text]
    else:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "said.wav"
            command = ["flite", "-voice", "slt", "-t", text, "-o", str(path)]
            subprocess.run(command, capture_output=True, check=True)
            return _pcm(path.read_bytes())
    return _pcm(subprocess.run(command, capture_output=True, check=True).stdout)


def span_ms(pcm: np.ndarray, floor_dbfs: float = -50.0) -> tuple[float, float]:
    """Where the speech in ``pcm`` really starts and ends: the first and last 10 ms whose
    RMS is above ``floor_dbfs``."""
    frames = pcm[: len(pcm) // 160 * 160].astype(np.float64).reshape(-1, 160)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms > 32768 * 10 ** (floor_dbfs / 20))
    return float(loud[0] * 10), float((loud[-1] + 1) * 10)


def noise(seconds: float, dbfs: float, seed: int) -> Pcm:
    """White noise at ``dbfs`` RMS."""
    rms = 32768 * 10 ** (dbfs / 20)
    samples = np.random.default_rng(seed).normal(0.0, rms, round(seconds * RATE))
    return np.clip(np.round(samples), -32768, 32767).astype(np.int16)


def silence(seconds: float) -> Pcm:
    return np.zeros(round(seconds * RATE), dtype=np.int16)
