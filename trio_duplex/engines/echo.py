"""The built-in ``echo`` engine: every input comes straight back as output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .api import BadEvent, Engine, EngineSession, Event

_FIELD = {"input.text.append": "text", "input_audio_buffer.append": "audio"}
_REPLY = {
    "input.text.append": "response.output_text.delta",
    "input_audio_buffer.append": "response.output_audio.delta",
}


class EchoEngine(Engine):
    """``input.text.append {text}`` → ``response.output_text.delta {text}``;
    ``input_audio_buffer.append {audio}`` → ``response.output_audio.delta {audio}``."""

    accepts = frozenset(_FIELD)

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def check(self, event: Event) -> None:
        field = _FIELD[event["type"]]
        if not isinstance(event.get(field), str):
            raise BadEvent(f"{field} must be a string", param=field)

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            field = _FIELD[event["type"]]
            await session.send({"type": _REPLY[event["type"]], field: event[field]})
