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
    ``input_audio_buffer.append {audio}`` → ``response.output_audio.delta {audio}``.

    Its audio is 24 kHz PCM16 (``audio_rate``): the client's audio, in whatever format
    the session negotiated, comes back in the session's output format."""

    accepts = frozenset(_FIELD)
    audio_rate: int | None = 24_000

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def check(self, event: Event) -> None:
        # (audio arrives as bytes of PCM16, decoded and checked by the server)
        if event["type"] == "input.text.append" and not isinstance(event.get("text"), str):
            raise BadEvent("text must be a string", param="text")

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            field = _FIELD[event["type"]]
            await session.send({"type": _REPLY[event["type"]], field: event[field]})
