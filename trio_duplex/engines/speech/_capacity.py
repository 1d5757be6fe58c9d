"""What the speech engine needs from the machine: its programs, and its share of the CPU.

Every recogniser request (to its process) and every resampling of synthesised audio (in a
worker thread) goes through one ``trio.CapacityLimiter`` per server (a ``RunVar``: one
per ``trio.run``), sized to the CPU cores this process may use: more at once would only queue
in the kernel instead of here.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Final

import trio

from ._clause import espeak_path

SESSIONS_PER_CORE: Final = 4
"""Speech sessions one core holds in real time (docs/speech.md, "Capacity"): recognition
costs 0.12-0.16 s of CPU per second of audio (6-8 sessions a core if all talked at
once), and synthesis, the codecs and the event loop take their share."""

INSTALL: Final = "pip install 'trio-duplex[speech]'"

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("speech_limiter")


class SpeechUnavailable(RuntimeError):
    """pocketsphinx is not installed, or espeak-ng is not on PATH."""


def check_available() -> None:
    """Raise SpeechUnavailable, saying what to install, unless both parts are there."""
    if importlib.util.find_spec("pocketsphinx") is None:
        raise SpeechUnavailable(f"the speech engine needs pocketsphinx: {INSTALL}")
    if espeak_path() is None:
        raise SpeechUnavailable(
            "the speech engine needs the espeak-ng program on PATH "
            "(Debian, Ubuntu: apt-get install espeak-ng)"
        )


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
    """This server's limiter of model work at once: one per core."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(cores())
        _LIMITER.set(limiter)
        return limiter
