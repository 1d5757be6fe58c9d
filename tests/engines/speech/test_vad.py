"""Silero VAD in this process: the probabilities of a stream do not depend on how its audio
was chunked, equal faster-whisper's own run of the model, are high in speech and low in
silence and white noise; the model is shared; batches are capped."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from trio_duplex.engines.speech._capacity import SpeechUnavailable
from trio_duplex.engines.speech._vad import (
    MAX_BATCH,
    WINDOW,
    WINDOW_BYTES,
    SileroVad,
    VadStream,
    model_path,
    vad_model,
)

from .listening import BYTES_PER_MS, needs_voices, noise, said, sentences, silence, span_ms

pytestmark = needs_voices


def _speech() -> bytes:
    return np.concatenate(
        [silence(0.5), said("espeak-ng", sentences(1)[0]), silence(0.5)]
    ).tobytes()


def _chunked(pcm: bytes, size: int) -> list[float]:
    stream = VadStream(vad_model())
    probs: list[float] = []
    for at in range(0, len(pcm), size):
        probs.extend(stream.feed(pcm[at : at + size]))
    return probs


def test_the_chunking_changes_nothing() -> None:
    pcm = _speech()
    whole = _chunked(pcm, len(pcm))
    assert len(whole) == len(pcm) // WINDOW_BYTES
    for size in (1, 641, 32_000):
        assert _chunked(pcm, size) == whole


def test_the_same_as_faster_whispers_run_of_the_model() -> None:
    from faster_whisper.vad import SileroVADModel

    pcm = _speech()
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
    theirs = SileroVADModel(str(model_path()))(samples[: len(samples) // WINDOW * WINDOW])
    np.testing.assert_allclose(_chunked(pcm, 640), np.asarray(theirs).reshape(-1), atol=1e-6)


@pytest.mark.parametrize("voice", ["espeak-ng", "flite"])
def test_speech_is_likely_and_silence_is_not(voice: str) -> None:
    spoken = said(voice, sentences(1)[0])
    start, end = span_ms(spoken)
    probs = VadStream(vad_model()).feed(np.concatenate([spoken, silence(1.0)]).tobytes())
    window_ms = WINDOW_BYTES / BYTES_PER_MS
    inside = [p for i, p in enumerate(probs) if start <= i * window_ms < end - window_ms]
    after = probs[int(end // window_ms) + 4 :]
    assert np.median(inside) > 0.9
    assert max(after) < 0.1


@pytest.mark.parametrize("dbfs", [-54.0, -40.0])
def test_white_noise_is_not_speech(dbfs: float) -> None:
    probs = VadStream(vad_model()).feed(noise(10.0, dbfs, seed=1).tobytes())
    assert max(probs) < 0.2


def test_one_model_per_process() -> None:
    assert vad_model() is vad_model()


def test_the_part_of_a_window_waits() -> None:
    stream = VadStream(vad_model())
    assert stream.feed(bytes(WINDOW_BYTES - 1)) == []
    assert len(stream.feed(bytes(1))) == 1
    assert stream.windows == 1


class _Counting(SileroVad):
    def __init__(self) -> None:
        super().__init__(model_path())
        self.batches: list[int] = []

    def run(self, windows: Any, h: Any, c: Any) -> Any:
        self.batches.append(len(windows))
        return super().run(windows, h, c)


def test_batches_are_capped() -> None:
    model = _Counting()
    windows = 3 * MAX_BATCH + 5
    assert len(VadStream(model).feed(bytes(windows * WINDOW_BYTES))) == windows
    assert model.batches == [MAX_BATCH, MAX_BATCH, MAX_BATCH, 5]


def test_without_faster_whisper_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "faster_whisper" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(SpeechUnavailable, match=r"pip install 'trio-duplex\[speech\]'"):
        model_path()
