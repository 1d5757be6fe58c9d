"""The OpenAI Realtime GA dialect (``/v1/realtime``): OpenAI's wire on the core's sessions.

``OPENAI`` is the dialect object (``trio_duplex.dialects.Dialect``): it reads OpenAI's
client events into the core's canonical ones (decode.py, config.py), writes the core's
server events as OpenAI's (spell.py), and gives each session a shaper that expands an
engine's compact response events into OpenAI's full structure (shaper.py). It speaks
first: the upgrade itself opens the session (``opening``). Our extensions (resume and
its ``resume`` object, ``server_event_seq``, ``client_event_seq``, our control events,
Opus and the binary audio lane) are seen only by clients that use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from ...core.events import ErrorCode
from ...core.wire import ProtocolError
from ..jsonwire import LARGE
from .config import defaults, to_config, to_session
from .decode import decode, decode_binary, decode_steps
from .shaper import OpenAIShaper
from .spell import audio_frame, frame

__all__ = ["OPENAI", "OpenAI", "OpenAIShaper", "defaults", "to_config", "to_session"]

MAX_MODEL = 256
"""The longest ``?model=`` accepted (any value is, and stored in config ``model``)."""
_MAX_SEQ = (1 << 63) - 1


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def opening(query: Mapping[str, list[str]], bearer: str | None) -> dict[str, Any]:
    """The client event the upgrade stands for: ``session.update`` with an OpenAI
    session's defaults (and ``?model=``), or ``session.resume`` for ``?resume=ID``
    (``&last_received_server_event_seq=N``, 0 when absent) with the bearer credential as
    its resume token. ProtocolError for a bad query."""
    session_id = _one(query, "resume")
    if session_id is not None:
        if bearer is None:
            raise ProtocolError.resume_refused(
                ErrorCode.INVALID_RESUME_TOKEN,
                "a resume presents its resume token as the bearer credential",
            )
        text = _one(query, "last_received_server_event_seq") or "0"
        if not (text.isascii() and text.isdigit() and int(text) <= _MAX_SEQ):
            raise ProtocolError(
                ErrorCode.BAD_EVENT,
                "last_received_server_event_seq must be a non-negative integer",
                param="last_received_server_event_seq",
            )
        return {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": bearer,
            "last_received_server_event_seq": int(text),
        }
    model = _one(query, "model")
    if model is not None and len(model) > MAX_MODEL:
        raise ProtocolError(
            ErrorCode.BAD_EVENT, f"model may hold at most {MAX_MODEL} characters", param="model"
        )
    return {"type": "session.update", "session": defaults(model)}


def shaper(config: dict[str, Any]) -> OpenAIShaper:
    """The session's shaper, over its live configuration."""
    return OpenAIShaper(config)


def restore_shaper(config: dict[str, Any], state: dict[str, Any]) -> OpenAIShaper:
    """The shaper ``OpenAIShaper.state()`` described (a migration); ValueError if bad."""
    return OpenAIShaper.restore(config, state)


@attrs.frozen
class OpenAI:
    """The OpenAI Realtime dialect. Its methods are the modules' functions themselves:
    binding one costs no call layer per event."""

    name: str = "openai"
    subprotocol: str | None = "realtime"
    large: int = LARGE
    binary_lane: bool = True
    replays_audio: bool = True
    audio_by_transport: bool = False
    resumes_from_ack: bool = False
    speaks_first: bool = True
    config_locked_closes: bool = False  # OpenAI's rule: the connection goes on after an error

    decode = staticmethod(decode)
    decode_steps = staticmethod(decode_steps)
    decode_binary = staticmethod(decode_binary)
    frame = staticmethod(frame)
    audio_frame = staticmethod(audio_frame)
    opening = staticmethod(opening)
    shaper = staticmethod(shaper)
    restore_shaper = staticmethod(restore_shaper)


OPENAI: Final = OpenAI()
"""The OpenAI Realtime dialect: the one ``/v1/realtime`` speaks."""
