"""OpenAI's session object and the canonical session configuration, both ways. Pure.

The canonical configuration (``session.config``) is flat: ``audio`` as the native
dialect has it (``{wire, input: {format, rate}, output: {format, rate}}``), and OpenAI's
settings under flat keys (``turn_detection`` for ``audio.input.turn_detection``,
``input_audio_transcription`` for ``audio.input.transcription``, ``voice`` for
``audio.output.voice``...). ``to_config`` reads a client's ``session`` object into the
fields it sets, refusing what OpenAI would refuse (an unknown field too: OpenAI refuses
unknown parameters); ``to_session`` writes the live configuration back as OpenAI's
session object.

Audio: an update that names any format or the wire sets the whole ``audio``, a
direction it leaves out being OpenAI's default (``audio/pcm`` at 24 kHz) and the wire
``json`` unless ``audio.wire`` (our extension) says ``binary``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ...audio import RATES
from ...core.events import ErrorCode
from ...core.wire import ProtocolError

Event = dict[str, Any]
Check = Callable[[object], bool]

DEFAULT_RATE: Final = 24000
OUTPUT_MODALITIES: Final = ("text", "audio")


def default_audio() -> Event:
    """An OpenAI session's audio: pcm16 at 24 kHz both ways, as JSON."""
    pcm = {"format": "pcm16", "rate": DEFAULT_RATE}
    return {"wire": "json", "input": dict(pcm), "output": dict(pcm)}


def defaults(model: str | None = None) -> Event:
    """The configuration an OpenAI session opens with (``opening``)."""
    config: Event = {"audio": default_audio(), "output_modalities": ["audio"]}
    if model is not None:
        config["model"] = model
    return config


def _bad(message: str, param: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_EVENT, message, param=param)


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _obj(value: object) -> bool:
    return isinstance(value, dict)


def _str(value: object) -> bool:
    return isinstance(value, str)


def _modalities(value: object) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= 2
        and all(v in OUTPUT_MODALITIES for v in value)
        and len(set(value)) == len(value)
    )


def _max_tokens(value: object) -> bool:
    return value == "inf" or (type(value) is int and 1 <= value <= 4096)


def _tools(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= 128
        and all(isinstance(t, dict) and t.get("type") in ("function", "mcp") for t in value)
    )


def _one_of(*choices: str, objects: bool = False, null: bool = False) -> Check:
    def check(value: object) -> bool:
        if value is None:
            return null
        if isinstance(value, dict):
            return objects
        return isinstance(value, str) and value in choices

    return check


def _nullable(check: Check) -> Check:
    return lambda value: value is None or check(value)


# session.X: (canonical key, check). The checks are OpenAI's types, loosely.
_TOP: Final[Mapping[str, tuple[str, Check]]] = {
    "model": ("model", _str),
    "instructions": ("instructions", _str),
    "output_modalities": ("output_modalities", _modalities),
    "tools": ("tools", _tools),
    "tool_choice": ("tool_choice", lambda v: isinstance(v, str | dict)),
    "max_output_tokens": ("max_output_tokens", _max_tokens),
    "tracing": ("tracing", _one_of("auto", objects=True, null=True)),
    "truncation": ("truncation", _one_of("auto", "disabled", objects=True)),
    "prompt": ("prompt", _nullable(_obj)),
    "include": ("include", _str_list),
    "parallel_tool_calls": ("parallel_tool_calls", lambda v: type(v) is bool),
    "reasoning": ("reasoning", _obj),
}
_TURN_FIELDS: Final[Mapping[str, Mapping[str, Check]]] = {
    "server_vad": {
        "create_response": lambda v: type(v) is bool,
        "interrupt_response": lambda v: type(v) is bool,
        "idle_timeout_ms": _nullable(_is_int),
        "prefix_padding_ms": _is_int,
        "silence_duration_ms": _is_int,
        "threshold": _is_number,
    },
    "semantic_vad": {
        "create_response": lambda v: type(v) is bool,
        "interrupt_response": lambda v: type(v) is bool,
        "eagerness": _one_of("low", "medium", "high", "auto"),
    },
}
_TRANSCRIPTION: Final[Mapping[str, Check]] = {
    "model": _str,
    "language": _str,
    "languages": _str_list,
    "prompt": _str,
    "keywords": _str_list,
    "delay": _one_of("minimal", "low", "medium", "high", "xhigh"),
}
_NOISE: Final[Mapping[str, Check]] = {
    "type": _one_of("near_field", "far_field"),
    "strength": _is_number,
}
# OpenAI's format type: (our format, its fixed rate, or None where a rate may be given).
_FORMATS: Final[Mapping[str, tuple[str, int | None]]] = {
    "audio/pcm": ("pcm16", None),
    "audio/pcmu": ("g711_ulaw", 8000),
    "audio/pcma": ("g711_alaw", 8000),
    "audio/opus": ("opus", None),  # our extension
}
_DEFAULT_RATES: Final = {"pcm16": DEFAULT_RATE, "opus": 48000}


def _fields(value: object, checks: Mapping[str, Check], param: str) -> None:
    """``value`` an object whose every field ``checks`` knows and accepts."""
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    for key, field in value.items():
        check = checks.get(key)
        if check is None:
            raise _bad(f"unknown parameter {param}.{key}", f"{param}.{key}")
        if not check(field):
            raise _bad(f"{param}.{key} has an invalid value", f"{param}.{key}")


def _format(value: object, param: str) -> Event:
    """OpenAI's ``{type, rate?}`` as our ``{format, rate}``."""
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    for key in value:
        if key not in ("type", "rate"):
            raise _bad(f"unknown parameter {param}.{key}", f"{param}.{key}")
    kind = value.get("type", "audio/pcm")
    found = _FORMATS.get(kind) if isinstance(kind, str) else None
    if found is None:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            f"{param}.type must be one of {', '.join(_FORMATS)}",
            param=f"{param}.type",
        )
    fmt, fixed = found
    rate = value.get("rate", fixed or _DEFAULT_RATES[fmt])
    if type(rate) is not int or rate not in RATES[fmt] or (fixed is not None and rate != fixed):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            f"{kind} does not come at {rate!r} Hz",
            param=f"{param}.rate",
        )
    return {"format": fmt, "rate": rate}


def _audio(value: object, out: Event, param: str) -> None:
    """``session.audio`` into ``out``: its formats and wire as ``audio``, the rest flat."""
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    audio: Event = {}
    for key, part in value.items():
        where = f"{param}.{key}"
        if key == "wire":
            if part not in ("json", "binary"):
                raise ProtocolError(
                    ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                    f"{where} must be json or binary",
                    param=where,
                )
            audio["wire"] = part
        elif key == "input":
            _input(part, out, audio, where)
        elif key == "output":
            _output(part, out, audio, where)
        else:
            raise _bad(f"unknown parameter {where}", where)
    if audio:
        fallback = default_audio()
        out["audio"] = {name: audio.get(name, fallback[name]) for name in fallback}


def _input(value: object, out: Event, audio: Event, param: str) -> None:
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    for key, part in value.items():
        where = f"{param}.{key}"
        if key == "format":
            audio["input"] = _format(part, where)
        elif key == "turn_detection":
            if part is not None:
                kind = part.get("type") if isinstance(part, dict) else None
                checks = _TURN_FIELDS.get(kind) if isinstance(kind, str) else None
                if checks is None:
                    raise _bad(f"{where}.type must be server_vad or semantic_vad", f"{where}.type")
                _fields(part, {"type": _str, **checks}, where)
            out["turn_detection"] = part
        elif key == "transcription":
            if part is not None:
                _fields(part, _TRANSCRIPTION, where)
            out["input_audio_transcription"] = part
        elif key == "noise_reduction":
            if part is not None:
                _fields(part, _NOISE, where)
            out["input_audio_noise_reduction"] = part
        else:
            raise _bad(f"unknown parameter {where}", where)


def _output(value: object, out: Event, audio: Event, param: str) -> None:
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    for key, part in value.items():
        where = f"{param}.{key}"
        if key == "format":
            audio["output"] = _format(part, where)
        elif key == "voice":
            if not isinstance(part, str):
                _fields(part, {"id": _str}, where)
            out["voice"] = part
        elif key == "speed":
            if not _is_number(part) or not 0.25 <= part <= 1.5:
                raise _bad(f"{where} must be a number from 0.25 to 1.5", where)
            out["speed"] = part
        else:
            raise _bad(f"unknown parameter {where}", where)


def to_config(session: object, param: str = "session") -> Event:
    """A client's OpenAI ``session`` object as the canonical fields it sets."""
    if not isinstance(session, dict):
        raise _bad(f"{param} must be an object", param)
    out: Event = {}
    for key, value in session.items():
        if key == "type":
            if value != "realtime":
                raise _bad(f'{param}.type must be "realtime"', f"{param}.type")
        elif key == "audio":
            _audio(value, out, f"{param}.audio")
        else:
            spec = _TOP.get(key)
            if spec is None:
                raise _bad(f"unknown parameter {param}.{key}", f"{param}.{key}")
            name, check = spec
            if not check(value):
                raise _bad(f"{param}.{key} has an invalid value", f"{param}.{key}")
            out[name] = value
    return out


# -- writing ---------------------------------------------------------------------------

_WRITE_FORMAT: Final[Mapping[str, Callable[[int], Event]]] = {
    "pcm16": lambda rate: {"type": "audio/pcm", "rate": rate},
    "g711_ulaw": lambda rate: {"type": "audio/pcmu"},
    "g711_alaw": lambda rate: {"type": "audio/pcma"},
    "opus": lambda rate: {"type": "audio/opus", "rate": rate},
}
_PCM: Final = {"format": "pcm16", "rate": DEFAULT_RATE}
_DEFAULTS: Final[Mapping[str, Any]] = {
    "output_modalities": ["audio"],
    "instructions": "",
    "tools": [],
    "tool_choice": "auto",
    "max_output_tokens": "inf",
    "tracing": None,
    "truncation": "auto",
    "prompt": None,
}
_OPTIONAL: Final = ("include", "parallel_tool_calls", "reasoning")


def _write_format(direction: object) -> Event:
    if not isinstance(direction, dict):
        direction = _PCM
    fmt = direction.get("format")
    rate = direction.get("rate")
    if not isinstance(fmt, str) or fmt not in _WRITE_FORMAT or type(rate) is not int:
        fmt, rate = "pcm16", DEFAULT_RATE
    return _WRITE_FORMAT[fmt](rate)


def to_session(config: Mapping[str, Any], session_id: str) -> Event:
    """The live configuration as OpenAI's session object (``session.created``/
    ``updated``), fields unset there at OpenAI's defaults; keys no OpenAI field maps to
    are left out."""
    audio = config.get("audio")
    if not isinstance(audio, dict):
        audio = {}
    session: Event = {"type": "realtime", "object": "realtime.session", "id": session_id}
    if "model" in config:
        session["model"] = config["model"]
    for key, default in _DEFAULTS.items():
        session[key] = config.get(key, default)
    for key in _OPTIONAL:
        if key in config:
            session[key] = config[key]
    audio_out: Event = {
        "format": _write_format(audio.get("output")),
        "voice": config.get("voice", "alloy"),
        "speed": config.get("speed", 1.0),
    }
    written: Event = {
        "input": {
            "format": _write_format(audio.get("input")),
            "transcription": config.get("input_audio_transcription"),
            "noise_reduction": config.get("input_audio_noise_reduction"),
            "turn_detection": config.get("turn_detection"),
        },
        "output": audio_out,
    }
    if audio.get("wire") == "binary":
        written["wire"] = "binary"  # our extension: only a client that asked sees it
    session["audio"] = written
    return session
