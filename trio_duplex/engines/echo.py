"""The built-in ``echo`` engine: every input comes straight back as output.

Native events, as they always were: ``input.text.append {text}`` →
``response.output_text.delta {text}``; ``input_audio_buffer.append {audio}`` →
``response.output_audio.delta {audio}`` at once, unless the session converses
(``conversation.conversing``: an OpenAI session does), when its audio waits in the buffer
for a commit instead.

The conversation (docs/engines.md): ``conversation.item.*`` and
``input_audio_buffer.commit/clear`` are answered by its ``Conversation``; a
``response.create`` answers the latest user message: a text one by its text
(``response.created {response_id, output_modalities: ["text"], metadata?}``, the
``metadata`` being the ``response.create``'s; one
``response.output_text.delta``, ``response.done``), a committed audio one by that audio
(``["audio"]``, ``response.output_audio.delta`` of 100 ms each, ``response.done``;
a native session's appends are echoed at once and not kept, so its commit makes an item
with no audio, answered like no turn);
with no user message, ``response.created`` and ``response.done`` alone. The turn's kind
decides the modality (an echo cannot turn audio into text, nor text into audio), save
that a ``response.create`` asking ``output_modalities: ["text"]`` gets an audio turn's
transcript written (``["text"]``; no content if it has none), never its audio; one
asking ``["audio"]`` of a text turn gets its text (``["text"]``: an echo has no voice).
A response is sent whole
before the next event is read, so a ``response.cancel`` finds nothing to cancel and is
answered with nothing.

It can migrate (``snapshot``, ``restore``): its state is the event it took and has not
answered yet, the conversation answers not yet sent, the response being sent and how far
it got, the response counter and the conversation. ``echo/1`` snapshots (no conversation)
restore too.
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from collections.abc import Mapping
from typing import Any

from .api import BadEvent, Engine, EngineSession, Event
from .conversation import (
    EVENTS,
    RESPONSE_EVENTS,
    Conversation,
    check_response_event,
    conversing,
    created,
    response_metadata,
    response_modalities,
    restored_metadata,
)

_FIELD = {"input.text.append": "text", "input_audio_buffer.append": "audio"}
_REPLY = {
    "input.text.append": "response.output_text.delta",
    "input_audio_buffer.append": "response.output_audio.delta",
}
_STATE = "echo/2"  # the shape of the snapshot; a restore takes this and echo/1
_OLD_STATE = "echo/1"
CHUNK_BYTES = 4800  # 100 ms of 24 kHz PCM16 per audio delta of a response


class EchoEngine(Engine):
    """Echoes text and audio; answers ``response.create`` with the latest user turn.

    Its audio is 24 kHz PCM16 (``audio_rate``): the client's audio, in whatever format
    the session negotiated, comes back in the session's output format."""

    accepts = frozenset({*_FIELD, *EVENTS, *RESPONSE_EVENTS})
    audio_rate: int | None = 24_000

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.conversation = Conversation(keep_audio=conversing(self.config))
        self.responses = 0  # responses started (their ids: resp_1, resp_2, ...)
        self._unanswered: Event | None = None  # a native event taken, its answer not sequenced
        self._outbox: deque[Event] = deque()  # conversation answers not yet sequenced
        self._response: dict[str, Any] | None = None  # the one being sent, and how far

    def check(self, event: Event) -> None:
        # (audio arrives as bytes of PCM16, decoded and checked by the server)
        kind = event["type"]
        if kind == "input.text.append" and not isinstance(event.get("text"), str):
            raise BadEvent("text must be a string", param="text")
        if kind in RESPONSE_EVENTS:
            check_response_event(event)
        else:
            self.conversation.check(event)

    async def run(self, session: EngineSession) -> None:
        # Restored: finish what the last node could not, in the order it would have.
        if self._unanswered is not None:
            await self._answer(session, self._unanswered)
        await self._flush(session)
        if self._response is not None:
            await self._respond(session)
        async for event in session:
            kind = event["type"]
            if kind == "input_audio_buffer.append" and conversing(session.config):
                self.conversation.keep_audio = True
                self.conversation.append_audio(event["audio"])
            elif kind in _FIELD:
                if kind == "input_audio_buffer.append":  # counted: a commit makes a turn
                    self.conversation.append_audio(event["audio"])
                await self._answer(session, event)
            elif kind in EVENTS:
                self._outbox.extend(self.conversation.take(event))
                await self._flush(session)
            elif kind == "response.create":
                self._start(event)
                await self._respond(session)
            # response.cancel: nothing is ever being sent when it is read

    async def _answer(self, session: EngineSession, event: Event) -> None:
        # Unanswered from the moment it was taken until its answer's send returns: a
        # migration stop that lands in the send leaves it for the next node.
        self._unanswered = event
        field = _FIELD[event["type"]]
        await session.send({"type": _REPLY[event["type"]], field: event[field]})
        self._unanswered = None

    async def _flush(self, session: EngineSession) -> None:
        while self._outbox:
            await session.send(self._outbox[0])
            self._outbox.popleft()

    def _start(self, event: Event) -> None:
        # (The turn decides the modality, unless text is asked: see the module docstring.)
        self.responses += 1
        response_id = f"resp_{self.responses}"
        turn = self.conversation.latest_user()
        audio = turn.audio if turn is not None and not turn.typed else None
        if response_modalities(event) == ("text",):
            audio = None  # written: the turn's transcript ("" if it has none)
        self._response = {
            "response_id": response_id,
            "text": turn.text if turn is not None and audio is None else "",
            "audio": audio,
            "created": False,
            "sent": 0,  # the deltas sequenced
            "metadata": response_metadata(event),
        }
        self.conversation.begin_response(response_id)

    async def _respond(self, session: EngineSession) -> None:
        response = self._response
        assert response is not None
        response_id, audio = response["response_id"], response["audio"]
        modalities = ["audio"] if audio is not None else ["text"]
        if not response["created"]:
            await session.send(created(response_id, modalities, response.get("metadata")))
            response["created"] = True
        if audio is not None:
            deltas = [audio[at : at + CHUNK_BYTES] for at in range(0, len(audio), CHUNK_BYTES)]
            kind, field = "response.output_audio.delta", "audio"
        else:
            deltas = [response["text"]] if response["text"] else []
            kind, field = "response.output_text.delta", "text"
        for delta in deltas[response["sent"] :]:
            await session.send({"type": kind, "response_id": response_id, field: delta})
            response["sent"] += 1
        self.conversation.end_response(response_id, response["text"], modalities, "completed")
        await session.send({"type": "response.done", "response_id": response_id})
        self._response = None

    def snapshot(self) -> dict[str, Any]:
        event = self._unanswered
        if event is not None:  # its type and field are all its answer needs
            field = _FIELD[event["type"]]
            value = event[field]
            if isinstance(value, bytes):  # audio as PCM16 bytes: base64 in JSON
                field, value = field + "_base64", base64.b64encode(value).decode("ascii")
            event = {"type": event["type"], field: value}
        response = self._response
        if response is not None and response["audio"] is not None:
            response = response | {"audio": base64.b64encode(response["audio"]).decode()}
        return {
            "state": _STATE,
            "unanswered": event,
            "outbox": list(self._outbox),
            "response": response,
            "responses": self.responses,
            "conversation": self.conversation.snapshot(),
        }

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") not in (_STATE, _OLD_STATE):
            raise ValueError(f"not a snapshot of the echo engine ({_STATE}): {_short(state)}")
        unanswered = _unanswered(state.get("unanswered"))
        if state["state"] == _OLD_STATE:
            self._unanswered = unanswered
            return
        outbox, responses = state.get("outbox"), state.get("responses")
        if not isinstance(outbox, list) or not all(isinstance(e, dict) for e in outbox):
            raise ValueError("echo snapshot: 'outbox' must be a list of events")
        if type(responses) is not int or responses < 0:
            raise ValueError("echo snapshot: 'responses' is not a count")
        response = _response(state.get("response"))
        conversation = Conversation(keep_audio=self.conversation.keep_audio)
        conversation.restore(state.get("conversation"))
        self._unanswered, self._outbox, self._response = unanswered, deque(outbox), response
        self.responses, self.conversation = responses, conversation


def _unanswered(event: object) -> Event | None:
    if event is None:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    if not isinstance(kind, str) or kind not in _FIELD:
        raise ValueError(f"echo snapshot: 'unanswered' is not an input event: {_short(event)}")
    assert isinstance(event, dict)
    field = _FIELD[kind]
    value = event.get(field)
    if field + "_base64" in event:
        try:
            value = base64.b64decode(event[field + "_base64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ValueError(f"echo snapshot: its {field} is not base64") from None
    if not isinstance(value, str | bytes):
        raise ValueError(f"echo snapshot: 'unanswered' has no {field}: {_short(event)}")
    return {"type": kind, field: value}


def _response(state: object) -> dict[str, Any] | None:
    if state is None:
        return None
    if not isinstance(state, dict):
        raise ValueError(f"echo snapshot: 'response' is not a response: {_short(state)}")
    audio = state.get("audio")
    if audio is not None:
        try:
            audio = base64.b64decode(audio, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ValueError("echo snapshot: the response's audio is not base64") from None
    ok = (
        isinstance(state.get("response_id"), str)
        and isinstance(state.get("text"), str)
        and type(state.get("created")) is bool
        and type(state.get("sent")) is int
        and state["sent"] >= 0
    )
    if not ok:
        raise ValueError(f"echo snapshot: 'response' is malformed: {_short(state)}")
    # (A snapshot from before responses carried their metadata has none.)
    return {**state, "audio": audio, "metadata": restored_metadata(state.get("metadata"))}


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
