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

import trio

from .api import INPUT_DTMF, BadEvent, Engine, EngineSession, Event, check_dtmf
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

_FIELD = {"input.text.append": "text", "input_audio_buffer.append": "audio", INPUT_DTMF: "digit"}
_REPLY = {
    "input.text.append": "response.output_text.delta",
    "input_audio_buffer.append": "response.output_audio.delta",
    INPUT_DTMF: "response.output_text.delta",
}
_OUT = {INPUT_DTMF: "text"}
"""The reply's field where it is not the input's (a key is echoed as text)."""
_APPEND = "input_audio_buffer.append"
_STATE = "echo/3"  # the shape of a snapshot holding a batch; a restore takes echo/1-3
_ONE_STATE = "echo/2"  # the shape of one holding one unanswered event at most
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
        self._unanswered: list[Event] = []  # native events taken, their answers not sequenced
        # Events taken, not yet looked at: made by the first batch taken (an idle
        # session's engine holds no deque, ~0.7 KB each).
        self._taken: deque[Event] | None = None
        self._outbox: list[Event] = []  # conversation answers not yet sequenced
        self._response: dict[str, Any] | None = None  # the one being sent, and how far

    def check(self, event: Event) -> None:
        # (audio arrives as bytes of PCM16, decoded and checked by the server)
        kind = event["type"]
        if kind == "input.text.append":  # (the conversation checks nothing of these)
            if not isinstance(event.get("text"), str):
                raise BadEvent("text must be a string", param="text")
            return
        if kind == INPUT_DTMF:
            check_dtmf(event)
            return
        if kind in RESPONSE_EVENTS:
            check_response_event(event)
        else:
            self.conversation.check(event)

    async def run(self, session: EngineSession) -> None:
        # Restored: finish what the last node could not, in the order it would have.
        if self._unanswered:
            await self._answer_all(session)
        await self._flush(session)
        if self._response is not None:
            await self._respond(session)
        while True:
            taken = self._taken
            if not taken:
                try:
                    batch = await session.receive_batch()
                except trio.EndOfChannel:
                    return
                if taken is None:
                    taken = self._taken = deque(batch)
                else:
                    taken.extend(batch)
            await self._serve(session, taken)

    async def _serve(self, session: EngineSession, taken: deque[Event]) -> None:
        """Answer the events ``taken`` (the engine's own), in order: a run of echoed
        inputs with one ``send_many``, each other event as it comes."""
        conversation = self.conversation
        converses = conversing(session.config)  # (only a receive applies an update)
        while taken:
            event = taken[0]
            kind = event["type"]
            echoes = kind in _FIELD and not (kind == _APPEND and converses)
            if echoes:
                unanswered = self._unanswered
                while taken:
                    event = taken[0]
                    kind = event["type"]
                    if kind not in _FIELD:
                        break
                    if kind == _APPEND:
                        if converses:
                            break
                        conversation.append_audio(event["audio"])  # counted: a commit makes a turn
                    unanswered.append(taken.popleft())
                await self._answer_all(session)
                continue
            taken.popleft()
            if kind == _APPEND:  # the session converses: kept for a commit
                conversation.keep_audio = True
                conversation.append_audio(event["audio"])
            elif kind in EVENTS:
                self._outbox.extend(conversation.take(event))
                await self._flush(session)
            elif kind == "response.create":
                self._start(event)
                await self._respond(session)
            # response.cancel: nothing is ever being sent when it is read

    async def _answer(self, session: EngineSession, event: Event) -> None:
        """Answer one echoed input (``_answer_all`` of it alone)."""
        self._unanswered.append(event)
        await self._answer_all(session)

    async def _answer_all(self, session: EngineSession) -> None:
        # Unanswered from the moment they were taken until the send of their answers
        # returns: a migration stop that lands in it leaves them all for the next node
        # (``send_many`` sequences all or none of them then).
        unanswered = self._unanswered
        if len(unanswered) == 1:
            event = unanswered[0]
            kind = event["type"]
            field = _FIELD[kind]
            await session.send({"type": _REPLY[kind], _OUT.get(kind, field): event[field]})
        else:
            replies = []
            for event in unanswered:
                kind = event["type"]
                field = _FIELD[kind]
                replies.append({"type": _REPLY[kind], _OUT.get(kind, field): event[field]})
            await session.send_many(replies)
        unanswered.clear()

    async def _flush(self, session: EngineSession) -> None:
        # One batch: a migration stop lands before it (all still owed) or lets it finish.
        if self._outbox:
            await session.send_many(self._outbox)
            self._outbox.clear()

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
        if audio is not None:
            deltas = [audio[at : at + CHUNK_BYTES] for at in range(0, len(audio), CHUNK_BYTES)]
            kind, field = "response.output_audio.delta", "audio"
        else:
            deltas = [response["text"]] if response["text"] else []
            kind, field = "response.output_text.delta", "text"
        # The response.created and the deltas not sent yet, as one batch (a migration
        # stop lands before it, or lets it finish); then what says they were sent.
        batch = [{"type": kind, "response_id": response_id, field: d} for d in deltas]
        del batch[: response["sent"]]
        if not response["created"]:
            batch.insert(0, created(response_id, modalities, response.get("metadata")))
        if batch:
            await session.send_many(batch)
        response["created"] = True
        response["sent"] = len(deltas)
        self.conversation.end_response(response_id, response["text"], modalities, "completed")
        await session.send({"type": "response.done", "response_id": response_id})
        self._response = None

    def snapshot(self) -> dict[str, Any]:
        response = self._response
        if response is not None and response["audio"] is not None:
            response = response | {"audio": base64.b64encode(response["audio"]).decode()}
        state: dict[str, Any] = {"state": _ONE_STATE, "unanswered": None}
        if len(self._unanswered) > 1 or self._taken:
            # A batch: echo/3 (a node that knows only echo/2 refuses it, rather than
            # losing all but one of its events).
            state = {
                "state": _STATE,
                "unanswered": [_portable_input(e) for e in self._unanswered],
                "taken": [_portable(e) for e in self._taken or ()],
            }
        elif self._unanswered:
            state["unanswered"] = _portable_input(self._unanswered[0])
        return state | {
            "outbox": list(self._outbox),
            "response": response,
            "responses": self.responses,
            "conversation": self.conversation.snapshot(),
        }

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") not in _STATES:
            raise ValueError(f"not a snapshot of the echo engine ({_STATE}): {_short(state)}")
        taken: deque[Event] | None = None
        if state["state"] == _STATE:
            unanswered, events = state.get("unanswered"), state.get("taken")
            if not isinstance(unanswered, list) or not isinstance(events, list):
                raise ValueError("echo snapshot: 'unanswered' and 'taken' must be lists")
            answers = [_unanswered(e) for e in unanswered]
            taken = deque(_unportable(e) for e in events) if events else None
        else:
            one = _unanswered(state.get("unanswered"))
            answers = [] if one is None else [one]
        if state["state"] == _OLD_STATE:
            self._unanswered = [a for a in answers if a is not None]
            return
        outbox, responses = state.get("outbox"), state.get("responses")
        if not isinstance(outbox, list) or not all(isinstance(e, dict) for e in outbox):
            raise ValueError("echo snapshot: 'outbox' must be a list of events")
        if type(responses) is not int or responses < 0:
            raise ValueError("echo snapshot: 'responses' is not a count")
        response = _response(state.get("response"))
        conversation = Conversation(keep_audio=self.conversation.keep_audio)
        conversation.restore(state.get("conversation"))
        self._unanswered = [a for a in answers if a is not None]
        self._taken, self._outbox, self._response = taken, list(outbox), response
        self.responses, self.conversation = responses, conversation


_STATES = (_STATE, _ONE_STATE, _OLD_STATE)


def _portable_input(event: Event) -> Event:
    """An input event taken and not answered, as a snapshot holds it: its type and field
    (audio as base64 in ``audio_base64``) are all its answer needs."""
    field = _FIELD[event["type"]]
    value = event[field]
    if isinstance(value, bytes):  # audio as PCM16 bytes: base64 in JSON
        field, value = field + "_base64", base64.b64encode(value).decode("ascii")
    return {"type": event["type"], field: value}


def _portable(event: Event) -> dict[str, Any]:
    """Any event taken and not looked at yet, for a snapshot: its fields, those of bytes
    (audio) as base64 under ``bytes``."""
    fields = {k: v for k, v in event.items() if not isinstance(v, bytes)}
    binary = {k: base64.b64encode(v).decode("ascii") for k, v in event.items() if k not in fields}
    return {"event": fields, "bytes": binary}


def _unportable(state: object) -> Event:
    event = state.get("event") if isinstance(state, dict) else None
    binary = state.get("bytes") if isinstance(state, dict) else None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ValueError(f"echo snapshot: a 'taken' event is not an event: {_short(state)}")
    if not isinstance(binary, dict):
        raise ValueError(f"echo snapshot: a 'taken' event has no 'bytes': {_short(state)}")
    event = dict(event)
    for key, value in binary.items():
        try:
            event[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ValueError(f"echo snapshot: a taken event's {key} is not base64") from None
    return event


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
