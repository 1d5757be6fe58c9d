"""Turn detection on real speech: the outside set's first sentences said by espeak-ng and
flite, with silence or white noise around them. Where speech really starts and ends is
measured from the clean audio's energy, not from the VAD under test."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_duplex.engines.speech._detector import (
    LEAD_IN_MS,
    MAX_AUDIO_S,
    TAIL_MS,
    Detected,
    Kind,
    TurnDetector,
    TurnSettings,
)
from trio_duplex.engines.speech._vad import WINDOW_BYTES, WINDOW_MS, VadStream, vad_model

from .listening import (
    BYTES_PER_MS,
    VOICES,
    Pcm,
    needs_voices,
    noise,
    said,
    sentences,
    silence,
    span_ms,
)

pytestmark = needs_voices

N = 8  # sentences per voice: the first N of the outside set
LEAD_S = 1.0


def _detector(**overrides: float) -> TurnDetector:
    return TurnDetector(TurnSettings(**overrides), VadStream(vad_model()))  # type: ignore[arg-type]


def _run(detector: TurnDetector, pcm: bytes, chunk: int = 640) -> list[tuple[Detected, float]]:
    """Each detection, with the stream time at which ``feed`` returned it."""
    out: list[tuple[Detected, float]] = []
    for at in range(0, len(pcm), chunk):
        out.extend((d, detector.fed_ms) for d in detector.feed(pcm[at : at + chunk]))
    return out


def _trimmed(voice: str, text: str) -> Pcm:
    spoken = said(voice, text)
    start, end = span_ms(spoken)
    return spoken[int(start * 16) : int(end * 16)]


def _stream(
    parts: Sequence[Pcm], floor_dbfs: float = -50.0
) -> tuple[Pcm, list[tuple[float, float]]]:
    """``parts`` end to end, and the real (start_ms, end_ms) of each odd-numbered part (the
    speech between the fillers), where it is louder than ``floor_dbfs``."""
    spans: list[tuple[float, float]] = []
    at = 0.0
    for i, part in enumerate(parts):
        if i % 2:
            start, end = span_ms(part, floor_dbfs)
            spans.append((at + start, at + end))
        at += len(part) / 16
    return np.concatenate(parts), spans


def _check_turns(
    found: list[tuple[Detected, float]],
    spans: list[tuple[float, float]],
    silence_ms: int,
    early: float = TAIL_MS,
    late: float = 4 * WINDOW_MS,
    start_late: float = 200,
) -> None:
    """One turn per span, started and stopped where the speech really did: the first quiet
    window from ``early`` before its real end (a soft ending Silero does not call speech: the
    turn's audio still holds it) to ``late`` after it."""
    kinds = [d.kind for d, _ in found]
    assert kinds == [Kind.STARTED, Kind.STOPPED] * len(spans)
    quiet_ms = math.ceil(silence_ms / WINDOW_MS) * WINDOW_MS
    for (started, heard), (stopped, ended), (start, end) in zip(
        found[::2], found[1::2], spans, strict=True
    ):
        # Within 0.2 s of the speech's start (Silero hears an opening "s" as noise: the
        # turn's audio holds it, from prefix_padding_ms before).
        assert start - WINDOW_MS <= started.at_ms <= start + start_late
        assert heard - started.at_ms <= 2 * 3 * WINDOW_MS + 20  # (3 speech windows in 6)
        assert end - early <= stopped.at_ms <= end + late
        # The turn's audio holds all of its speech.
        audio_from = stopped.at_ms + min(TAIL_MS, quiet_ms) - len(stopped.audio) / BYTES_PER_MS
        assert audio_from <= start
        # Returned once the silence rule is met: at the window completing it (+ one chunk).
        assert stopped.at_ms + quiet_ms <= ended <= stopped.at_ms + quiet_ms + 20
        assert silence_ms - early <= ended - end <= silence_ms + late + 2 * WINDOW_MS


@pytest.mark.parametrize("voice", VOICES)
def test_each_sentence_is_one_turn(voice: str) -> None:
    for text in sentences(3 * N):
        spoken = said(voice, text)
        pcm, spans = _stream([silence(LEAD_S), spoken, silence(1.5)])
        found = _run(_detector(), pcm.tobytes())
        _check_turns(found, spans, 300)
        started, stopped = found[0][0], found[1][0]
        # The turn's audio: prefix padding before its onset, TAIL_MS of silence after its end.
        last = int((stopped.at_ms + TAIL_MS) * BYTES_PER_MS)
        first = last - len(stopped.audio)
        assert stopped.audio == pcm.tobytes()[first:last]
        assert started.at_ms - 300 - LEAD_IN_MS <= first / BYTES_PER_MS <= started.at_ms - 300


@pytest.mark.parametrize("silence_ms", [100, 300, 700])
def test_the_silence_rule(silence_ms: int) -> None:
    texts = sentences(4)
    parts = [silence(LEAD_S)]
    for voice in VOICES:
        for text in texts:
            parts += [said(voice, text), silence(silence_ms / 1000 + 1.0)]
    pcm, spans = _stream(parts)
    _check_turns(_run(_detector(silence_duration_ms=silence_ms), pcm.tobytes()), spans, silence_ms)


@pytest.mark.parametrize("voice", VOICES)
def test_a_200_ms_pause_ends_a_turn_at_100_ms_not_at_300(voice: str) -> None:
    texts = sentences(2 * 3)
    for first, second in zip(texts[::2], texts[1::2], strict=True):
        a, b = _trimmed(voice, first), _trimmed(voice, second)
        pcm = np.concatenate([silence(LEAD_S), a, silence(0.2), b, silence(1.5)]).tobytes()
        whole = [d for d, _ in _run(_detector(silence_duration_ms=300), pcm)]
        assert [d.kind for d in whole] == [Kind.STARTED, Kind.STOPPED]
        split = [d for d, _ in _run(_detector(silence_duration_ms=100), pcm)]
        assert [d.kind for d in split] == [Kind.STARTED, Kind.STOPPED] * 2
        second_at = (LEAD_S + 0.2) * 1000 + len(a) / 16
        assert abs(split[2].at_ms - second_at) <= 150
        # The second turn's prefix padding never reaches back into the first turn's audio.
        first_audio, second_audio = split[1].audio, split[3].audio
        end_of_first = int((split[0].at_ms - 300) * BYTES_PER_MS) + len(first_audio)
        assert pcm[end_of_first : end_of_first + len(second_audio)] == second_audio


@pytest.mark.parametrize("dbfs", [-54.0, -40.0])
@pytest.mark.parametrize("voice", VOICES)
def test_white_noise_neither_starts_nor_holds_a_turn(voice: str, dbfs: float) -> None:
    parts: list[Pcm] = [noise(LEAD_S + 2.0, dbfs, seed=0)]
    for i, text in enumerate(sentences(N)):
        parts += [said(voice, text), noise(3.0, dbfs, seed=i + 1)]
    pcm, spans = _stream(parts)
    # After noise Silero may hover near the threshold for up to ~0.5 s of a voice it hears
    # poorly (flite), so the start may come later (its audio still holds the speech's start).
    _check_turns(_run(_detector(), pcm.tobytes()), spans, 300, start_late=500)
    # Noise under the speech as well as between it (which hides the speech's quieter end:
    # its real end is where it is louder than the noise).
    parts = [silence(LEAD_S)]
    for text in sentences(N):
        parts += [said(voice, text), silence(1.5)]
    clean, spans = _stream(parts, floor_dbfs=max(-50.0, dbfs + 6))
    noisy = clean.astype(np.int32) + noise(len(clean) / 16_000, dbfs, seed=99)
    mixed = np.clip(noisy, -32768, 32767).astype(np.int16)
    found = _run(_detector(), mixed.tobytes())
    _check_turns(found, spans, 300, late=8 * WINDOW_MS)


def test_a_turn_longer_than_max_turn_s_is_cut_and_goes_on() -> None:
    parts = [silence(LEAD_S)]
    for text in sentences(N):  # one long turn: 100 ms pauses, about 17 s of speech
        parts += [_trimmed("flite", text), silence(0.1)]
    parts.append(silence(1.5))
    pcm = np.concatenate(parts).tobytes()
    found = [d for d, _ in _run(_detector(max_turn_s=5.0), pcm)]
    kinds = [d.kind for d in found]
    assert kinds == [Kind.STARTED, Kind.STOPPED] * (len(kinds) // 2)
    assert len(kinds) >= 2 * 3
    max_ms = math.floor(5000 / WINDOW_MS) * WINDOW_MS
    for started, stopped in zip(found[:-2:2], found[1:-2:2], strict=True):
        assert stopped.at_ms == started.at_ms + max_ms  # cut at max_turn_s
    for stopped, started in zip(found[1:-2:2], found[2::2], strict=True):
        assert stopped.at_ms <= started.at_ms <= stopped.at_ms + 200  # and goes on
    # The turns' audio follows on, with nothing lost or heard twice at a cut.
    joined = b"".join(d.audio for d in found[1::2])
    first = int(found[1].at_ms * BYTES_PER_MS) - len(found[1].audio)
    assert pcm[first : first + len(joined) - TAIL_MS * BYTES_PER_MS] == joined[: -TAIL_MS * 32]


def test_a_turns_audio_fits_the_recogniser_at_the_longest_settings() -> None:
    parts = [silence(LEAD_S)]
    for text in sentences(3 * N):  # about 45 s of speech, 100 ms pauses
        parts += [_trimmed("espeak-ng", text), silence(0.1)]
    pcm = np.concatenate([*parts, silence(1.0)]).tobytes()
    longest = TurnSettings(prefix_padding_ms=1_000, max_turn_s=MAX_AUDIO_S - 1.512)
    found = _detector(**attrs.asdict(longest)).feed(pcm)
    stopped = [d for d in found if d.kind is Kind.STOPPED]
    assert len(stopped) >= 2
    assert max(len(d.audio) for d in stopped) <= MAX_AUDIO_S * 32_000
    assert len(stopped[0].audio) > (MAX_AUDIO_S - 1) * 32_000


def test_feeding_nothing_changes_nothing() -> None:
    detector = _detector()
    assert detector.feed(b"") == []
    assert (detector.fed_ms, detector.in_turn, detector.held()) == (0.0, False, b"")


@cache
def _two_turns() -> bytes:
    texts = sentences(2)
    parts = [silence(0.7), said("espeak-ng", texts[0]), silence(0.6), said("flite", texts[1])]
    return np.concatenate([*parts, silence(0.8)]).tobytes()


def _chunked(pcm: bytes, sizes: Sequence[int]) -> list[Detected]:
    detector = _detector()
    found: list[Detected] = []
    at = 0
    while at < len(pcm):
        for size in sizes:
            found += detector.feed(pcm[at : at + size])
            at += size
    return found


def test_any_chunking_gives_the_same_turns() -> None:
    pcm = _two_turns()
    whole = _detector().feed(pcm)
    assert [d.kind for d in whole] == [Kind.STARTED, Kind.STOPPED] * 2
    for size in (1, 640, 32_000):
        assert _chunked(pcm, [size]) == whole


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 20_000), min_size=1, max_size=8))
def test_any_chunking_gives_the_same_turns_drawn(sizes: list[int]) -> None:
    pcm = _two_turns()
    assert _chunked(pcm, sizes) == _detector().feed(pcm)


def test_held_audio_makes_a_new_detector_hear_the_open_turn() -> None:
    pcm = _two_turns()
    original = _detector().feed(pcm)
    for cut_ms in range(500, len(pcm) // BYTES_PER_MS, 300):
        cut = cut_ms * BYTES_PER_MS
        old = _detector()
        before = old.feed(pcm[:cut])
        held = old.held()
        new = TurnDetector(
            old.settings, VadStream(vad_model()), start_ms=old.fed_ms - len(held) / 32
        )
        after = new.feed(held + pcm[cut:])
        if old.in_turn:  # the open turn is heard again: its STARTED comes twice
            assert after[0].kind is Kind.STARTED
            assert abs(after[0].at_ms - before[-1].at_ms) <= WINDOW_MS
            after = after[1:]
        heard = before + after
        assert [d.kind for d in heard] == [d.kind for d in original]
        for mine, theirs in zip(heard, original, strict=True):
            assert abs(mine.at_ms - theirs.at_ms) <= WINDOW_MS
            assert abs(len(mine.audio) - len(theirs.audio)) <= WINDOW_BYTES


def test_what_it_keeps_is_bounded() -> None:
    chunk = 640
    turn = TurnSettings(max_turn_s=3.0)
    parts: list[Pcm] = [noise(20.0, -40.0, seed=5)]
    for text in sentences(N):
        parts += [said("espeak-ng", text), noise(0.15, -40.0, seed=6)]
    pcm = np.concatenate(parts).tobytes()
    detector = TurnDetector(turn, VadStream(vad_model()))
    lead = (turn.prefix_padding_ms + LEAD_IN_MS) * BYTES_PER_MS
    outside = lead + 2 * 3 * WINDOW_BYTES + WINDOW_BYTES + chunk
    inside = lead + turn.max_turn_s * 1000 * BYTES_PER_MS + WINDOW_BYTES
    most_outside = most_inside = 0
    for at in range(0, len(pcm), chunk):
        detector.feed(pcm[at : at + chunk])
        kept = len(detector.held())
        if detector.in_turn:
            most_inside = max(most_inside, kept)
            assert len(detector.turn_audio()) == round(detector.turn_seconds() * 32_000)
        else:
            most_outside = max(most_outside, kept)
    assert 0 < most_outside <= outside
    assert 0 < most_inside <= inside + chunk


def test_from_config_takes_openais_fields() -> None:
    assert TurnSettings.from_config(None) == TurnSettings()
    assert TurnSettings.from_config({"type": "server_vad"}) == TurnSettings()
    taken = TurnSettings.from_config(
        {
            "type": "server_vad",
            "threshold": 0.7,
            "prefix_padding_ms": 500,
            "silence_duration_ms": 200,
            "create_response": True,
            "idle_timeout_ms": None,
        }
    )
    assert taken == TurnSettings(threshold=0.7, prefix_padding_ms=500, silence_duration_ms=200)
    assert TurnSettings.from_config({"threshold": None}) == TurnSettings()


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"threshold": "0.5"}, "threshold"),
        ({"threshold": True}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"prefix_padding_ms": -1}, "prefix_padding_ms"),
        ({"prefix_padding_ms": 300.0}, "prefix_padding_ms"),
        ({"prefix_padding_ms": 60_000}, "prefix_padding_ms"),
        ({"silence_duration_ms": False}, "silence_duration_ms"),
        ({"silence_duration_ms": 20_000}, "silence_duration_ms"),
    ],
)
def test_from_config_refuses_bad_values(config: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"turn_detection\.{field} must be"):
        TurnSettings.from_config(config)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="turn_detection must be an object"):
        TurnSettings.from_config([])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"at most 29\.488 s"):
        TurnSettings(prefix_padding_ms=5_000, max_turn_s=28.0)
    with pytest.raises(ValueError, match="max_turn_s must be"):
        TurnSettings(max_turn_s=0.0)
    used = VadStream(vad_model())
    used.feed(bytes(WINDOW_BYTES))
    with pytest.raises(ValueError, match="no audio was fed"):
        TurnDetector(TurnSettings(), used)


def test_a_detection_does_not_print_its_audio() -> None:
    assert "<64000 bytes>" in repr(Detected(Kind.STOPPED, 0.0, bytes(64_000)))
