"""The audio a session speaks on the wire, and its negotiation at open (``session.audio``).

``negotiate`` turns the client's request into an ``AudioConfig`` or refuses it with
``unsupported_audio_format`` naming the field at fault; an ``AudioFormat`` that exists is
valid (its rate is one its format allows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from ..core.events import ErrorCode
from ..core.wire import ProtocolError
from . import _opus

FORMATS: Final[tuple[str, ...]] = ("pcm16", "g711_ulaw", "g711_alaw", "opus")
WIRES: Final[tuple[str, ...]] = ("json", "binary")
ENGINE_RATES: Final[tuple[int, ...]] = (8000, 16000, 24000, 48000)
"""The PCM16 mono rates an engine may declare."""

RATES: Final[Mapping[str, tuple[int, ...]]] = {
    "pcm16": ENGINE_RATES,
    "g711_ulaw": (8000,),
    "g711_alaw": (8000,),
    "opus": (8000, 16000, 24000, 48000),
}
_DEFAULT_RATES: Final[Mapping[str, int]] = {"g711_ulaw": 8000, "g711_alaw": 8000, "opus": 48000}
_KEYS: Final = frozenset({"wire", "input", "output"})
_FORMAT_KEYS: Final = frozenset({"format", "rate"})
OPUS_EXTRA: Final = "trio-duplex[opus]"


def _check_rate(instance: AudioFormat, attribute: attrs.Attribute[int], rate: int) -> None:
    if rate not in RATES[instance.format]:
        raise ValueError(f"{instance.format} does not come at {rate} Hz")


@attrs.frozen
class AudioFormat:
    """One direction's audio on the wire: mono, and little-endian for pcm16."""

    format: str = attrs.field(validator=attrs.validators.in_(FORMATS))
    rate: int = attrs.field(validator=_check_rate)

    def as_event(self) -> dict[str, Any]:
        return {"format": self.format, "rate": self.rate}


@attrs.frozen
class AudioConfig:
    """A session's effective audio configuration."""

    wire: str = attrs.field(validator=attrs.validators.in_(WIRES))
    input: AudioFormat
    """What the client sends."""
    output: AudioFormat
    """What the client receives."""

    def as_event(self) -> dict[str, Any]:
        return {"wire": self.wire, "input": self.input.as_event(), "output": self.output.as_event()}


def _refuse(message: str, param: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT, message, param=param)


def _one_of(value: object, allowed: tuple[str, ...], param: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise _refuse(f"{param} must be one of {', '.join(allowed)}", param)
    return value


def _direction(requested: object, engine_rate: int, param: str) -> AudioFormat:
    if not isinstance(requested, dict):
        raise _refuse(f"{param} must be an object", param)
    for key in requested:
        if key not in _FORMAT_KEYS:
            raise _refuse(f"{param} has no field {key!r} (format, rate)", f"{param}.{key}")
    fmt = _one_of(requested.get("format", "pcm16"), FORMATS, f"{param}.format")
    if fmt == "opus" and not _opus.available():
        raise _refuse(
            f"opus needs the optional extra {OPUS_EXTRA} and the system's libopus",
            f"{param}.format",
        )
    rate = requested.get("rate", _DEFAULT_RATES.get(fmt, engine_rate))
    allowed = RATES[fmt]
    # bool is an int to Python, not to JSON.
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in allowed:
        rates = ", ".join(str(r) for r in allowed)
        raise _refuse(f"{fmt} comes at a rate in Hz of {rates}", f"{param}.rate")
    return AudioFormat(fmt, rate)


def negotiate(requested: object, engine_rate: int) -> AudioConfig:
    """The session's audio from the client's ``session.audio`` (None when absent).

    Defaults: wire json, input and output pcm16 at ``engine_rate``; a missing ``rate`` is
    8000 for g711, 48000 for opus, ``engine_rate`` for pcm16. Raises ProtocolError
    (unsupported_audio_format, ``param`` such as ``session.audio.input.rate``) for bad
    types, unknown keys, an unknown format or wire, an unsupported rate, or opus without
    the extra. ``engine_rate`` not one of ENGINE_RATES is the server's bug: ValueError.
    """
    if engine_rate not in ENGINE_RATES:
        raise ValueError(f"an engine's audio rate must be one of {ENGINE_RATES}: {engine_rate}")
    if requested is None:
        requested = {}
    if not isinstance(requested, dict):
        raise _refuse("session.audio must be an object", "session.audio")
    for key in requested:
        if key not in _KEYS:
            raise _refuse(
                f"session.audio has no field {key!r} (wire, input, output)", f"session.audio.{key}"
            )
    return AudioConfig(
        wire=_one_of(requested.get("wire", "json"), WIRES, "session.audio.wire"),
        input=_direction(requested.get("input", {}), engine_rate, "session.audio.input"),
        output=_direction(requested.get("output", {}), engine_rate, "session.audio.output"),
    )
