"""The model and the voice ``--speech-model`` and ``--speech-voice`` name, looked up once
(nothing is loaded or run here: the pools do that); SpeechUnavailable, saying what to
install, for a part that is missing."""

from __future__ import annotations

import importlib.util

from ._capacity import INSTALL, SpeechUnavailable
from ._models import ModelChoice, choose_model
from ._synthesise import Voice, choose_voice


def check_available(
    model: str | None = None, voice: str | None = None
) -> tuple[ModelChoice, Voice]:
    """The model and the voice these specs name (None: the defaults)."""
    return check_model(model), check_voice(voice)


def check_model(spec: str | None) -> ModelChoice:
    """``--speech-model``'s choice (None: the packaged tiny.en)."""
    if importlib.util.find_spec("faster_whisper") is None:
        raise SpeechUnavailable(f"the speech engine needs faster-whisper: {INSTALL}")
    return choose_model(spec)


def check_voice(spec: str | None) -> Voice:
    """``--speech-voice``'s voice (None: ``auto``)."""
    return choose_voice(spec)
