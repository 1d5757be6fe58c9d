"""The built-in ``echo`` engine: every input comes straight back as output.

It can migrate (``snapshot``, ``restore``): its only state is the event it took and has
not answered yet, if the migration stopped it while that answer was being sent.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from .api import BadEvent, Engine, EngineSession, Event

_FIELD = {"input.text.append": "text", "input_audio_buffer.append": "audio"}
_REPLY = {
    "input.text.append": "response.output_text.delta",
    "input_audio_buffer.append": "response.output_audio.delta",
}
_STATE = "echo/1"  # the shape of the snapshot; a restore refuses any other


class EchoEngine(Engine):
    """``input.text.append {text}`` → ``response.output_text.delta {text}``;
    ``input_audio_buffer.append {audio}`` → ``response.output_audio.delta {audio}``.

    Its audio is 24 kHz PCM16 (``audio_rate``): the client's audio, in whatever format
    the session negotiated, comes back in the session's output format."""

    accepts = frozenset(_FIELD)
    audio_rate: int | None = 24_000

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self._unanswered: Event | None = None  # taken, its answer not yet sequenced

    def check(self, event: Event) -> None:
        # (audio arrives as bytes of PCM16, decoded and checked by the server)
        if event["type"] == "input.text.append" and not isinstance(event.get("text"), str):
            raise BadEvent("text must be a string", param="text")

    async def run(self, session: EngineSession) -> None:
        if self._unanswered is not None:  # restored: answer what the last node could not
            await self._answer(session, self._unanswered)
        async for event in session:
            await self._answer(session, event)

    async def _answer(self, session: EngineSession, event: Event) -> None:
        # Unanswered from the moment it was taken until its answer's send returns: a
        # migration stop that lands in the send leaves it for the next node.
        self._unanswered = event
        field = _FIELD[event["type"]]
        await session.send({"type": _REPLY[event["type"]], field: event[field]})
        self._unanswered = None

    def snapshot(self) -> dict[str, Any]:
        event = self._unanswered
        if event is not None:  # its type and field are all its answer needs
            field = _FIELD[event["type"]]
            value = event[field]
            if isinstance(value, bytes):  # audio as PCM16 bytes: base64 in JSON
                field, value = field + "_base64", base64.b64encode(value).decode("ascii")
            event = {"type": event["type"], field: value}
        return {"state": _STATE, "unanswered": event}

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") != _STATE:
            raise ValueError(f"not a snapshot of the echo engine ({_STATE}): {_short(state)}")
        event = state.get("unanswered")
        if event is None:
            return
        kind = event.get("type") if isinstance(event, dict) else None
        if not isinstance(kind, str) or kind not in _FIELD:
            raise ValueError(f"echo snapshot: 'unanswered' is not an input event: {_short(event)}")
        field = _FIELD[kind]
        value = event.get(field)
        if field + "_base64" in event:
            try:
                value = base64.b64decode(event[field + "_base64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise ValueError(f"echo snapshot: its {field} is not base64") from None
        if not isinstance(value, str | bytes):
            raise ValueError(f"echo snapshot: 'unanswered' has no {field}: {_short(event)}")
        self._unanswered = {"type": kind, field: value}


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
