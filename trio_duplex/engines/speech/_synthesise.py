"""Synthesis: eSpeak NG as a subprocess, one per clause, and the reply cut into clauses.

``espeak-ng --stdout`` writes a WAV of mono PCM16 (22.05 kHz); it is read whole (a clause
is at most ``MAX_CLAUSE_CHARS`` characters, about 15 s of speech, under 700 KB), its
header skipped, and resampled to the engine's 16 kHz with the audio layer's resampler.
The process is killed at once if the response ends while it runs (cancellation), and
given ``SYNTH_TIMEOUT_S`` at most.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Final

import numpy as np
import trio

from ...audio._resample import Resampler
from ._recognise import SAMPLE_RATE

ESPEAK: Final = "espeak-ng"
MAX_CLAUSE_CHARS: Final = 200
SYNTH_TIMEOUT_S: Final = 10.0
MAX_WAV_BYTES: Final = 4 * 1024 * 1024  # far above what MAX_CLAUSE_CHARS gives

# A clause ends after . ! ? ; : or , followed by a space (or the text's end).
_CLAUSE_END = re.compile(r"(?<=[.!?;:,])\s+")


class SynthesisError(Exception):
    """espeak-ng failed, timed out, or wrote something that is not its WAV."""


def espeak_path() -> str | None:
    return shutil.which(ESPEAK)


def clauses(text: str) -> tuple[list[str], str]:
    """Cut ``text`` into whole clauses and the rest (not yet ended: more may follow).

    A clause longer than ``MAX_CLAUSE_CHARS`` is cut at its last space before the limit
    (or at the limit), so that no synthesis is unbounded."""
    done: list[str] = []
    parts = _CLAUSE_END.split(text)
    rest = parts.pop()
    for part in parts:
        done.extend(_bounded(part))
    while len(rest) > MAX_CLAUSE_CHARS:
        head, rest = _cut(rest)
        done.append(head)
    return [c for c in done if c.strip()], rest


def _bounded(clause: str) -> Iterator[str]:
    while len(clause) > MAX_CLAUSE_CHARS:
        head, clause = _cut(clause)
        yield head
    yield clause


def _cut(text: str) -> tuple[str, str]:
    space = text.rfind(" ", 1, MAX_CLAUSE_CHARS)
    at = space if space > 0 else MAX_CLAUSE_CHARS
    return text[:at], text[at:].lstrip()


async def _kill(process: trio.Process) -> None:
    process.kill()  # a synthesis nobody will hear: no grace period


async def synthesise(
    text: str, voice: str, words_per_minute: int, limiter: trio.CapacityLimiter
) -> bytes:
    """``text`` spoken by espeak-ng: 16 kHz mono PCM16. Raises SynthesisError."""
    command = [ESPEAK, "-v", voice, "-s", str(words_per_minute), "--stdout"]
    try:
        with trio.fail_after(SYNTH_TIMEOUT_S):
            # The text on stdin, not in argv: a text starting with "-" is no option.
            done = await trio.run_process(
                command,
                stdin=text.encode("utf-8", "replace"),
                capture_stdout=True,
                capture_stderr=True,
                deliver_cancel=_kill,
            )
    except trio.TooSlowError:
        raise SynthesisError(f"espeak-ng took over {SYNTH_TIMEOUT_S:g}s") from None
    except OSError as exc:
        raise SynthesisError(f"cannot run espeak-ng: {exc}") from None
    except Exception as exc:  # CalledProcessError: it failed
        raise SynthesisError(f"espeak-ng failed: {exc}") from None
    wav = done.stdout
    if len(wav) > MAX_WAV_BYTES:
        raise SynthesisError("espeak-ng wrote more audio than a clause can hold")
    return await trio.to_thread.run_sync(_to_engine_rate, wav, limiter=limiter)


def _to_engine_rate(wav: bytes) -> bytes:
    """espeak-ng's streamed WAV (its sizes unknown: 0x7ffff000) to 16 kHz PCM16."""
    at = wav.find(b"data", 12)
    if not wav.startswith(b"RIFF") or wav[8:16] != b"WAVEfmt " or at < 0:
        raise SynthesisError("espeak-ng did not write a WAV")
    channels = int.from_bytes(wav[22:24], "little")
    rate = int.from_bytes(wav[24:28], "little")
    if channels != 1 or not 8_000 <= rate <= 48_000:
        raise SynthesisError(f"espeak-ng wrote {channels} channel(s) at {rate} Hz")
    pcm = wav[at + 8 :]
    pcm = pcm[: len(pcm) - len(pcm) % 2]
    resampler = Resampler(rate, SAMPLE_RATE)
    samples = np.frombuffer(pcm, dtype=np.int16)
    out = np.concatenate([resampler.process(samples), resampler.drain()])
    return out.astype(np.int16).tobytes()
