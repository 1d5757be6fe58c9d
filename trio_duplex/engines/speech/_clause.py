"""One clause of a reply, as text going to a voice and as audio coming back.

What every voice shares (``_synthesise``'s flite and espeak-ng, ``_piper``'s Piper): the
clause made one bounded line of speakable text, the WAV a voice writes checked and
turned into the engine's 16 kHz PCM16 in whole 20 ms frames, and ``SynthesisError``.
It imports nothing of the engine, so that every other part may import it.
"""

from __future__ import annotations

import re
import shutil
import unicodedata
from typing import Final

import numpy as np
import soxr  # type: ignore[import-untyped]
import trio

SAMPLE_RATE: Final = 16_000
FRAME_BYTES: Final = SAMPLE_RATE * 2 // 50  # 20 ms of 16 kHz PCM16
ESPEAK: Final = "espeak-ng"
MAX_TEXT_CHARS: Final = 1_000
"""The longest text a voice takes at once (a clause is at most ``MAX_CLAUSE_CHARS``)."""
SYNTH_TIMEOUT_S: Final = 10.0
MAX_WAV_BYTES: Final = 8 * 1024 * 1024  # far above what MAX_TEXT_CHARS gives at 22 kHz
PIPER_INSTALL: Final = "pip install 'trio-duplex[piper]'"

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_SPEAKABLE = re.compile(r"[^\W_]")  # a letter or a digit: text without one says nothing


class SynthesisError(Exception):
    """A voice failed, timed out, or wrote something that is not a clause's WAV."""


def espeak_path() -> str | None:
    return shutil.which(ESPEAK)


def one_line(text: str, limit: int | None = MAX_TEXT_CHARS) -> str:
    """``text`` as one line of words: control characters (newlines too) become spaces.

    "" when nothing in it is speakable (no letter or digit): such a clause is silence,
    and Piper's process dies on a line that yields no audio. SynthesisError when it is
    longer than ``limit``."""
    line = " ".join(_CONTROL.sub(" ", _NON_ASCII.sub(_numeral, text)).split())
    if limit is not None and len(line) > limit:
        raise SynthesisError(f"a clause of {len(line)} characters (at most {limit})")
    return line if _SPEAKABLE.search(line) else ""


def _numeral(match: re.Match[str]) -> str:
    """A digit of another script (Arabic-Indic, Bengali, circled, mathematical) as ASCII:
    Piper's English voice finds nothing to say in a line of them, and its process dies."""
    char = match[0]
    if unicodedata.category(char) not in ("Nd", "No"):
        return char
    digit = unicodedata.digit(char, None)
    if digit is not None:
        return str(digit)
    compatible = unicodedata.normalize("NFKC", char)
    return compatible if compatible.isascii() else char


def whole_frames(pcm: bytes) -> bytes:
    """``pcm`` with its tail padded with silence to a whole 20 ms frame."""
    return pcm + bytes(-len(pcm) % FRAME_BYTES)


def wav_to_engine_rate(wav: bytes, who: str) -> bytes:
    """A mono PCM16 WAV (a streamed one too: its data size unknown) as 16 kHz PCM16.

    Synchronous and CPU-bound: run it in a worker thread (``to_engine_rate``)."""
    if len(wav) > MAX_WAV_BYTES:
        raise SynthesisError(f"{who} wrote more audio than a clause can hold")
    if not wav.startswith(b"RIFF") or wav[8:12] != b"WAVE":
        raise SynthesisError(f"{who} did not write a WAV")
    at, fmt, pcm = 12, b"", b""
    while at + 8 <= len(wav):
        kind, size = wav[at : at + 4], int.from_bytes(wav[at + 4 : at + 8], "little")
        body = wav[at + 8 : at + 8 + size]  # a streamed WAV's data size runs past its end
        if kind == b"fmt ":
            fmt = body
        elif kind == b"data":
            pcm = body
            break
        at += 8 + size + size % 2
    else:
        raise SynthesisError(f"{who} wrote a WAV without its data")
    if len(fmt) < 16:
        raise SynthesisError(f"{who} wrote a WAV without its format")
    encoding = int.from_bytes(fmt[0:2], "little")
    channels = int.from_bytes(fmt[2:4], "little")
    rate = int.from_bytes(fmt[4:8], "little")
    bits = int.from_bytes(fmt[14:16], "little")
    if (encoding, channels, bits) != (1, 1, 16) or not 8_000 <= rate <= 48_000:
        raise SynthesisError(f"{who} wrote {channels} channel(s) of {bits} bits at {rate} Hz")
    samples = np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], dtype="<i2")
    if rate != SAMPLE_RATE and len(samples):
        # The whole clause at once: soxr's fixed-rate engine, no stream state to keep.
        samples = soxr.resample(samples, rate, SAMPLE_RATE, quality="HQ")
    return whole_frames(samples.astype("<i2").tobytes())


async def to_engine_rate(wav: bytes, who: str, limiter: trio.CapacityLimiter) -> bytes:
    """``wav_to_engine_rate`` in a worker thread, through ``limiter`` (the speech
    engine's shared one, ``_capacity.shared_limiter``)."""
    return await trio.to_thread.run_sync(wav_to_engine_rate, wav, who, limiter=limiter)
