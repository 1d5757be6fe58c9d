"""Speech for the speech engine's tests: sentences espeak-ng says at test time, as 16 kHz
PCM16, and a check that audio is speech. PocketSphinx hears espeak-ng's voice poorly
(docs/speech.md), so the sentences are ones it gets right, and tests check key words."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

RATE = 16_000
FRAME = 640  # 20 ms of 16 kHz PCM16
SILENCE = bytes(RATE)  # 0.5 s
DOOR = "open the door please"  # heard right: "open the door please"
WEATHER = "what is the weather like today"  # heard as "what is the weather like to do"

needs_speech = pytest.mark.skipif(
    shutil.which("espeak-ng") is None or importlib.util.find_spec("pocketsphinx") is None,
    reason="needs espeak-ng (apt-get install espeak-ng) and pocketsphinx (the speech extra)",
)


def spoken(text: str) -> bytes:
    """``text`` said by espeak-ng, as 16 kHz PCM16, with half a second of silence before
    and a second after (the endpointer needs the silence to end the turn)."""
    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout"],
        input=text.encode(),
        capture_output=True,
        check=True,
    ).stdout
    rate = int.from_bytes(wav[24:28], "little")
    pcm = np.frombuffer(wav[wav.index(b"data") + 8 :], dtype=np.int16)
    at_16k: bytes = soxr.resample(pcm, rate, RATE).astype(np.int16).tobytes()
    return SILENCE + at_16k + 2 * SILENCE


def frames(pcm: bytes) -> Iterator[bytes]:
    for at in range(0, len(pcm), FRAME):
        yield pcm[at : at + FRAME]


def is_speech(pcm: bytes) -> bool:
    """Loud enough, and crossing zero as a voice does (not silence, not a hum or hiss)."""
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    rms = float(np.sqrt(np.mean(samples**2)))
    crossings = np.count_nonzero(np.diff(np.signbit(samples))) / (len(samples) / RATE)
    return bool(rms > 500 and 100 < crossings < 4000)
