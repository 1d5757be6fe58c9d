"""What the speech engine needs from the machine: its share of the CPU, and what it says
when a part is missing (``_choose.py`` looks for the parts).

Recognition runs in the shared pool of recogniser processes (``_pool.py``), one per core
this process may use; the resampling of synthesised audio (in a worker thread) goes
through one ``trio.CapacityLimiter`` per server (a ``RunVar``: one per ``trio.run``),
sized to the same cores.
"""

from __future__ import annotations

import os
from typing import Final

import trio

SAMPLE_RATE: Final = 16_000
"""Whisper and Silero VAD hear 16 kHz mono PCM16: the engine's ``audio_rate``."""
BYTES_PER_SECOND: Final = SAMPLE_RATE * 2

SESSIONS_PER_CORE: Final = 6
"""Speech sessions one core holds (docs/speech.md, "Capacity"): the benchmark held 8 in
real time on one quiet core, with Piper and with flite (docs/benchmarks.md, "The speech
engine"); 6 leaves room for a core that is not quiet, and for Piper's onnxruntime thread
that runs on another core whatever the affinity."""

INSTALL: Final = "pip install 'trio-duplex[speech]'"

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("speech_limiter")


class SpeechUnavailable(RuntimeError):
    """A part the speech engine needs is missing: faster-whisper, the model, or the voice
    asked for. The message says what to install."""


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def default_max_sessions() -> int:
    """``--max-sessions`` for ``--engine speech`` when none is given."""
    return SESSIONS_PER_CORE * cores()


def shared_limiter() -> trio.CapacityLimiter:
    """This server's limiter of CPU work in threads at once: one per core."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(cores())
        _LIMITER.set(limiter)
        return limiter
