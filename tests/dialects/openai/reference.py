"""The OpenAI SDK's event types as the reference: validate what the dialect writes.

``validate`` parses a frame and validates it strictly with the SDK's pydantic model of
its type (``RealtimeServerEvent``, a union by ``type``); the SDK's models allow extra
fields, so it then walks the result and refuses any field the SDK does not name, except
the extensions the dialect is meant to add (``EXTENSIONS``). A misspelled or misplaced
field therefore fails as surely as a missing one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import pydantic
from openai.types.realtime import RealtimeServerEvent

from trio_duplex.core.spelling import Frame
from trio_duplex.dialects.openai import OPENAI

SERVER_EVENT: Final = pydantic.TypeAdapter(RealtimeServerEvent)

EXTENSIONS: Final[Mapping[str, frozenset[str]]] = {
    # OpenAI's own session object has these; the SDK's request model does not name them.
    "RealtimeSessionCreateRequest": frozenset({"id", "object"}),
    "SessionCreatedEvent": frozenset({"resume", "server_event_seq"}),
    "RealtimeAudioConfig": frozenset({"wire"}),
    "RealtimeError": frozenset({"retryable", "client_event_seq", "expected_client_event_seq"}),
}
_EVERY_EVENT: Final = frozenset({"server_event_seq"})


def _walk(value: object, path: str, top: bool) -> None:
    if isinstance(value, pydantic.BaseModel):
        name = type(value).__name__
        allowed = EXTENSIONS.get(name, frozenset()) | (_EVERY_EVENT if top else frozenset())
        extra = set(value.model_extra or {}) - allowed
        assert not extra, f"{path} ({name}) has fields the SDK does not name: {sorted(extra)}"
        for field in type(value).model_fields:
            _walk(getattr(value, field), f"{path}.{field}", False)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", False)


def validate(frame: Frame) -> Any:
    """The SDK's model of the server event ``frame`` is (AssertionError/ValidationError
    for one the SDK would not read, or with a field it does not know)."""
    assert isinstance(frame, str), "an OpenAI server event is JSON text"
    data = json.loads(frame)
    model = SERVER_EVENT.validate_python(data, strict=True)
    assert isinstance(data.get("event_id"), str) and data["event_id"].startswith("event_")
    _walk(model, data["type"], True)
    return model


def shaped_frames(shaper: Any, events: list[dict[str, Any]], seq: int = 0) -> list[str]:
    """Each engine event through ``shaper``, sequenced from ``seq + 1`` and written as
    the runner does (output audio by ``audio_frame`` with the delta as its fields)."""
    frames: list[str] = []
    for event in events:
        for out in shaper.shape(event):
            seq += 1
            if out["type"] == "response.output_audio.delta" and "audio" in out:
                frame = OPENAI.audio_frame(seq, out["audio"], out)
            else:
                out["server_event_seq"] = seq
                frame = OPENAI.frame(out)
            assert isinstance(frame, str)
            frames.append(frame)
    return frames
