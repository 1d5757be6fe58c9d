"""The shaper: an engine's compact events expanded into OpenAI's full response structure.

One per session (``OpenAIShaper(config)``, ``config`` the session's live configuration).
An engine says ``response.created {response_id, output_modalities?, metadata?}``,
deltas of text or audio, and one end (``response.done {status?}`` or
``response.cancelled``); a client of OpenAI's API expects the response object, its one
assistant item (id ``assistant_item_id(response_id)``, output 0, content part 0)
announced and closed, and
``response.done`` with the whole output. Text of an audio response is its transcript
(``response.output_audio_transcript.*``). The turns heard and the transcripts of the
user's audio get OpenAI's names and fields; ``session.updated`` gets the full session
object. Anything else (and an event already in OpenAI's shape, as a proxy to an OpenAI
upstream sends) passes through as it is.

The ``metadata`` (its ``response.create``'s) is written into the response object of
``response.created`` and ``response.done``.

``max_text`` bounds the text of every event it writes (``MAX_TEXT`` by default; a call's
dialect takes less, so that each event fits a data channel message): a response's
``*.done`` events and items keep at most that many characters of its text, a user's
transcript is cut there too, and a longer delta goes out as several, in order.
``session_object`` writes the session object of ``session.updated`` (``to_session``).

Its state is the open responses (their text so far, their metadata) and the user item
being heard: ``state()`` is JSON, and ``restore`` continues exactly where a migration left it.

A response's events are fixed shapes around a few strings (its id, its item's id, its
text), so the shaper writes them already encoded (``Shaped``): each string is encoded
once (the text once for its five ``*.done`` events, not five times) and spliced into the
shape's text, byte for byte what encoding the event's dict writes (``frame`` appends the
``server_event_seq`` and ``event_id`` as it does to a dict's). A value the templates do
not cover (an engine's text that is not a string, a ``status_details`` holding what JSON
cannot write) takes the dict path, and its errors, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import attrs
import orjson

from ...core.conversation import assistant_item, assistant_item_id, new_item_id
from ..jsonwire import encode
from .config import to_session

Event = dict[str, Any]
STATE_VERSION: Final = "openai-shaper/1"
MAX_OPEN = 16
"""Responses open at once before the oldest is forgotten (an engine that never ends
them must not grow the state without bound)."""

MAX_TEXT = 1 << 20
"""The default ``max_text``: characters of a response's text kept for its ``*.done``
events and its item, the bound on the shaper's memory (beyond it, the deltas still go
out, the whole is cut); and the most characters of text one shaped event carries (a
longer delta goes out as several)."""

_REASONS: Final = frozenset(
    {"turn_detected", "client_cancelled", "max_output_tokens", "content_filter"}
)
_ENDS: Final = frozenset({"completed", "incomplete", "failed", "cancelled"})
_TEXT_DELTA: Final = "response.output_text.delta"
_TRANSCRIPT_DELTA: Final = "response.output_audio_transcript.delta"
_NO_TOKENS: Final = {"type": "tokens", "input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
_AUDIO_DELTA: Final = "response.output_audio.delta"
_dumps = orjson.dumps
_OrjsonError = orjson.JSONEncodeError


class Shaped(dict[str, Any]):
    """A shaped event already written: ``head`` is its JSON text without the closing
    brace, to which ``frame`` appends ``,"server_event_seq":N,"event_id":"event_N"}``,
    exactly as it writes the event's dict. The dict holds the event's ``type`` alone
    (all the runner reads of a shaped event that is not output audio)."""

    __slots__ = ("head",)

    def __init__(self, kind: str, head: str) -> None:
        self["type"] = kind  # (not super().__init__: half the cost, per event)
        self.head = head


class ShapedAudio(dict[str, Any]):
    """The shaper's output audio delta: ``type`` and ``audio`` (the bytes, for the
    runner), and ``where``, its response's ``"response_id":...`` to ``content_index``
    already encoded, for ``audio_frame``."""

    __slots__ = ("where",)

    def __init__(self, audio: bytes, where: str) -> None:
        self["type"] = _AUDIO_DELTA
        self["audio"] = audio
        self.where = where


def _js(text: str) -> str:
    """A string as JSON, as ``encode`` writes it inside an event."""
    try:
        return _dumps(text).decode()
    except _OrjsonError:  # (a lone surrogate: the json module's escapes, as encode's)
        return encode(text)


def _mods(audio: bool) -> str:
    return '["audio"]' if audio else '["text"]'


_USAGE_JS: Final = encode(
    {
        "total_tokens": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "input_token_details": {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": 0, "audio_tokens": 0},
    }
)


@attrs.define(eq=False)
class _Response:
    audio: bool
    item_id: str
    text: list[str] = attrs.field(factory=list)
    kept: int = 0
    """Characters of ``text``: it stops growing at its shaper's ``max_text``."""
    metadata: dict[str, str] | None = None
    """Its ``response.create``'s, written into the response of created and done."""
    rid: str = ""
    """Its id, encoded (set with the rest by ``_Response.of``)."""
    iid: str = ""
    """Its item's id, encoded."""
    where: str = ""
    """``"response_id":...,"item_id":...,"output_index":0,"content_index":0``, encoded."""
    delta: str = _TEXT_DELTA
    """The type of its text deltas: an audio response's text is its transcript."""
    delta_head: str = ""
    """A text delta's text up to its ``delta``'s value."""

    @classmethod
    def of(
        cls,
        response_id: str,
        audio: bool,
        text: list[str] | None = None,
        kept: int = 0,
        metadata: dict[str, str] | None = None,
    ) -> _Response:
        item_id = assistant_item_id(response_id)
        rid, iid = _js(response_id), _js(item_id)
        where = f'"response_id":{rid},"item_id":{iid},"output_index":0,"content_index":0'
        delta = _TRANSCRIPT_DELTA if audio else _TEXT_DELTA
        return cls(
            audio, item_id, [] if text is None else text, kept, metadata,
            rid, iid, where, delta, f'{{"type":"{delta}",{where},"delta":',
        )  # fmt: skip


def _where(response_id: str) -> Event:
    return {
        "response_id": response_id,
        "item_id": assistant_item_id(response_id),
        "output_index": 0,
        "content_index": 0,
    }


def _part(audio: bool, text: str) -> Event:
    return {"type": "audio", "transcript": text} if audio else {"type": "text", "text": text}


def _usage() -> Event:
    """A response's ``usage``: no tokens (clients that count them find zeros, not null)."""
    return {
        "total_tokens": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "input_token_details": {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": 0, "audio_tokens": 0},
    }


def _metadata(value: object) -> dict[str, str] | None:
    """A response's ``metadata`` as an engine (or a state) gave it: a map of strings."""
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    return None


def _modalities(audio: bool) -> list[str]:
    return ["audio"] if audio else ["text"]


SessionObject = Callable[[Mapping[str, Any], str], Event]
"""The live configuration and the session's id as the session object clients see."""


def _pieces(text: str, size: int) -> Iterator[str]:
    return (text[i : i + size] for i in range(0, len(text), size))


@attrs.define(eq=False)
class OpenAIShaper:
    """``trio_duplex.dialects.Shaper`` for the OpenAI dialect."""

    config: dict[str, Any]
    _open: dict[str, _Response] = attrs.field(factory=dict)
    _heard: str | None = None
    """The id of the user audio item being heard (speech started, not yet committed)."""
    _last_user: str | None = None
    """The id of the last user audio item committed: its transcript's."""
    max_text: int = attrs.field(default=MAX_TEXT, kw_only=True)
    """The most characters of text an event carries (see the module's docstring)."""
    session_object: SessionObject = attrs.field(default=to_session, kw_only=True)
    """How ``session.updated`` shows the session (``to_session``; a call's differs)."""

    def shape(self, event: Event) -> list[Event]:
        handler = _HANDLERS.get(event["type"])
        return [event] if handler is None else handler(self, event)

    # -- responses -------------------------------------------------------------------

    def _begin(
        self, response_id: str, audio: bool, metadata: dict[str, str] | None = None
    ) -> list[Event]:
        while len(self._open) >= MAX_OPEN:
            del self._open[next(iter(self._open))]
        r = self._open[response_id] = _Response.of(response_id, audio, metadata=metadata)
        meta = "" if metadata is None else ',"metadata":' + encode(metadata)
        item = (
            f'{{"id":{r.iid},"object":"realtime.item","type":"message","role":"assistant",'
            '"status":"in_progress","content":[]}'
        )
        part = '{"type":"audio","transcript":""}' if audio else '{"type":"text","text":""}'
        return [
            Shaped(
                "response.created",
                f'{{"type":"response.created","response":{{"id":{r.rid},'
                '"object":"realtime.response","status":"in_progress","output":[],'
                f'"output_modalities":{_mods(audio)}{meta}}}',
            ),
            Shaped(
                "response.output_item.added",
                f'{{"type":"response.output_item.added","response_id":{r.rid},'
                f'"output_index":0,"item":{item}',
            ),
            Shaped("conversation.item.added", f'{{"type":"conversation.item.added","item":{item}'),
            Shaped(
                "response.content_part.added",
                f'{{"type":"response.content_part.added",{r.where},"part":{part}',
            ),
        ]

    def _created(self, event: Event) -> list[Event]:
        response_id = event.get("response_id")
        if not isinstance(response_id, str):
            return [event]  # OpenAI's own shape (a proxy's upstream), or not ours to shape
        modalities = event.get("output_modalities")
        audio = isinstance(modalities, list) and "audio" in modalities
        return self._begin(response_id, audio, _metadata(event.get("metadata")))

    def _response(self, event: Event, audio: bool) -> tuple[str, _Response, list[Event]]:
        """The open response an event is of: opened now if the engine never said so."""
        response_id = event["response_id"]
        response = self._open.get(response_id)
        if response is not None:
            return response_id, response, []
        opened = self._begin(response_id, audio)
        return response_id, self._open[response_id], opened

    def _text(self, event: Event) -> list[Event]:
        # The per-event path: one lookup, one dict.
        response_id = event.get("response_id")
        if type(response_id) is not str or "item_id" in event:
            return [event]
        response = self._open.get(response_id)
        out: list[Event] = []
        if response is None:
            _, response, out = self._response(event, False)
        text = event.get("text", "")
        max_text = self.max_text
        if response.kept < max_text and isinstance(text, str):
            response.text.append(text[: max_text - response.kept])
            response.kept += len(text)
        if type(text) is str:
            if len(text) <= max_text:
                out.append(Shaped(response.delta, response.delta_head + _js(text)))
                return out
            kind, head = response.delta, response.delta_head
            out.extend([Shaped(kind, head + _js(piece)) for piece in _pieces(text, max_text)])
            return out
        out.append(
            {
                "type": response.delta,
                "response_id": response_id,
                "item_id": response.item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
            }
        )
        return out

    def _audio(self, event: Event) -> list[Event]:
        response_id = event.get("response_id")
        if type(response_id) is not str or "item_id" in event:
            return [event]
        response = self._open.get(response_id)
        out: list[Event] = []
        if response is None:
            _, response, out = self._response(event, True)
        audio = event.get("audio")
        if type(audio) is bytes:  # (the runner's: the session's output format)
            out.append(ShapedAudio(audio, response.where))
            return out
        out.append(
            {
                "type": "response.output_audio.delta",
                "response_id": response_id,
                "item_id": response.item_id,
                "output_index": 0,
                "content_index": 0,
                "audio": event.get("audio"),  # for the runner's encoder, and audio_frame
            }
        )
        return out

    def _done(self, event: Event) -> list[Event]:
        status = event.get("status", "completed")
        return self._end(
            event, status if isinstance(status, str) and status in _ENDS else "completed"
        )

    def _cancelled(self, event: Event) -> list[Event]:
        return self._end(event, "cancelled")

    def _end(self, event: Event, status: str) -> list[Event]:
        if not isinstance(event.get("response_id"), str):
            return [event]
        response_id, response, out = self._response(event, False)
        del self._open[response_id]
        details = self._details(event, status)
        if details is None:  # what JSON cannot write: the dicts, and encode's error
            return self._end_events(out, response_id, response, event, status)
        audio, rid, where = response.audio, response.rid, response.where
        text = _js("".join(response.text))
        if audio:
            out.append(
                Shaped(
                    "response.output_audio.done", f'{{"type":"response.output_audio.done",{where}'
                )
            )
            out.append(
                Shaped(
                    "response.output_audio_transcript.done",
                    f'{{"type":"response.output_audio_transcript.done",{where},"transcript":{text}',
                )
            )
            part = f'{{"type":"audio","transcript":{text}}}'
            content = f'[{{"type":"output_audio","transcript":{text}}}]'
        else:
            out.append(
                Shaped(
                    "response.output_text.done",
                    f'{{"type":"response.output_text.done",{where},"text":{text}',
                )
            )
            part = f'{{"type":"text","text":{text}}}'
            content = f'[{{"type":"output_text","text":{text}}}]'
        out.append(
            Shaped(
                "response.content_part.done",
                f'{{"type":"response.content_part.done",{where},"part":{part}',
            )
        )
        item_status = "completed" if status == "completed" else "incomplete"
        item = (
            f'{{"id":{response.iid},"object":"realtime.item","type":"message",'
            f'"role":"assistant","status":"{item_status}","content":{content}}}'
        )
        out.append(
            Shaped(
                "response.output_item.done",
                f'{{"type":"response.output_item.done","response_id":{rid},'
                f'"output_index":0,"item":{item}',
            )
        )
        out.append(
            Shaped("conversation.item.done", f'{{"type":"conversation.item.done","item":{item}')
        )
        meta = "" if response.metadata is None else ',"metadata":' + encode(response.metadata)
        out.append(
            Shaped(
                "response.done",
                f'{{"type":"response.done","response":{{"id":{rid},"object":"realtime.response",'
                f'"status":"{status}","output":[{item}],"output_modalities":{_mods(audio)},'
                f'"usage":{_USAGE_JS}{meta}{details}}}',
            )
        )
        return out

    @staticmethod
    def _status_details(event: Event, status: str) -> Event | None:
        """A response's ``status_details``: None when it completed."""
        if status == "completed":
            return None
        details: Event = {"type": status}
        reason = event.get("reason", "client_cancelled" if status == "cancelled" else None)
        if isinstance(reason, str) and reason in _REASONS:
            details["reason"] = reason
        if status == "failed":
            details["error"] = {"type": "server_error", "code": event.get("code")}
        return details

    def _details(self, event: Event, status: str) -> str | None:
        """``,"status_details":{...}`` encoded ("" when it completed); None if the
        engine's ``code`` is something JSON cannot write."""
        details = self._status_details(event, status)
        if details is None:
            return ""
        try:
            return ',"status_details":' + encode(details)
        except (ValueError, TypeError, RecursionError):
            return None

    def _end_events(
        self, out: list[Event], response_id: str, response: _Response, event: Event, status: str
    ) -> list[Event]:
        """The closing events as dicts: the path of a value the templates do not cover."""
        audio = response.audio
        text = "".join(response.text)
        where = _where(response_id)
        if audio:
            out.append({"type": "response.output_audio.done", **where})
            out.append(
                {"type": "response.output_audio_transcript.done", **where, "transcript": text}
            )
        else:
            out.append({"type": "response.output_text.done", **where, "text": text})
        out.append({"type": "response.content_part.done", **where, "part": _part(audio, text)})
        item_status = "completed" if status == "completed" else "incomplete"
        item = assistant_item(response_id, text, audio=audio, status=item_status)
        out.append(
            {
                "type": "response.output_item.done",
                "response_id": response_id,
                "output_index": 0,
                "item": item,
            }
        )
        out.append({"type": "conversation.item.done", "item": dict(item)})
        body: Event = {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "output": [dict(item)],
            "output_modalities": _modalities(audio),
            "usage": _usage(),
        }
        if response.metadata is not None:
            body["metadata"] = response.metadata
        details = self._status_details(event, status)
        if details is not None:
            body["status_details"] = details
        out.append({"type": "response.done", "response": body})
        return out

    # -- turns heard ----------------------------------------------------------------

    def _user_item(self, event: Event) -> str:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            item_id = self._heard or new_item_id()
        return item_id

    def _speech_started(self, event: Event) -> list[Event]:
        item_id = self._heard = self._user_item(event)
        return [{**event, "item_id": item_id}]

    def _speech_stopped(self, event: Event) -> list[Event]:
        item_id = self._heard = self._user_item(event)
        return [{**event, "item_id": item_id}]

    def _committed(self, event: Event) -> list[Event]:
        item_id = self._last_user = self._user_item(event)
        self._heard = None
        return [{**event, "item_id": item_id}]

    def _transcript_id(self, event: Event) -> str:
        item_id = event.get("item_id")
        if isinstance(item_id, str):
            return item_id
        return self._last_user or self._heard or new_item_id()

    def _transcript_delta(self, event: Event) -> list[Event]:
        item_id = self._transcript_id(event)
        text = event.get("text", "")
        pieces = (
            list(_pieces(text, self.max_text))
            if isinstance(text, str) and len(text) > self.max_text
            else [text]
        )
        return [
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": item_id,
                "content_index": 0,
                "delta": piece,
            }
            for piece in pieces
        ]

    def _transcript_done(self, event: Event) -> list[Event]:
        text = event.get("text", "")
        return [
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": self._transcript_id(event),
                "content_index": 0,
                "transcript": text[: self.max_text] if isinstance(text, str) else text,
                "usage": dict(_NO_TOKENS),  # OpenAI's field is required; we bill no tokens
            }
        ]

    def _transcript_failed(self, event: Event) -> list[Event]:
        error = event.get("error")
        error = error if isinstance(error, dict) else {}
        return [
            {
                "type": "conversation.item.input_audio_transcription.failed",
                "item_id": self._transcript_id(event),
                "content_index": 0,
                "error": {k: error[k] for k in ("type", "code", "message", "param")
                          if isinstance(error.get(k), str)},
            }
        ]  # fmt: skip

    def _updated(self, event: Event) -> list[Event]:
        session_id = event.get("session_id", "")
        session = self.session_object(
            self.config, session_id if isinstance(session_id, str) else ""
        )
        return [{"type": "session.updated", "session": session}]

    # -- migration ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "state": STATE_VERSION,
            "open": [
                [rid, r.audio, "".join(r.text), *([] if r.metadata is None else [r.metadata])]
                for rid, r in self._open.items()
            ],
            "heard": self._heard,
            "last_user": self._last_user,
        }

    @classmethod
    def restore(
        cls,
        config: dict[str, Any],
        state: object,
        *,
        max_text: int = MAX_TEXT,
        session_object: SessionObject = to_session,
    ) -> OpenAIShaper:
        """The shaper ``state()`` described (made with these ``max_text`` and
        ``session_object``); ValueError for anything else."""
        if not isinstance(state, dict) or state.get("state") != STATE_VERSION:
            raise ValueError(f"not a state of the OpenAI shaper ({STATE_VERSION})")
        entries = state.get("open")
        if not isinstance(entries, list) or len(entries) > MAX_OPEN:
            raise ValueError("OpenAI shaper state: 'open' must be a list of open responses")
        shaper = cls(config, max_text=max_text, session_object=session_object)
        for entry in entries:
            if not (
                isinstance(entry, list)
                and len(entry) in (3, 4)  # (4: with its metadata)
                and isinstance(entry[0], str)
                and type(entry[1]) is bool
                and isinstance(entry[2], str)
                and (len(entry) == 3 or _metadata(entry[3]) is not None)
            ):
                raise ValueError(
                    "OpenAI shaper state: an open response is [id, audio, text, metadata?]"
                )
            text = [entry[2]] if entry[2] else []
            if len(entry[2]) > max_text:
                raise ValueError("OpenAI shaper state: a response's text is too long")
            metadata = _metadata(entry[3]) if len(entry) == 4 else None
            shaper._open[entry[0]] = _Response.of(entry[0], entry[1], text, len(entry[2]), metadata)
        for key in ("heard", "last_user"):
            value = state.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"OpenAI shaper state: {key!r} must be an item id or null")
        shaper._heard = state.get("heard")
        shaper._last_user = state.get("last_user")
        return shaper


_HANDLERS: Final[Mapping[str, Callable[[OpenAIShaper, Event], list[Event]]]] = {
    "response.created": OpenAIShaper._created,
    "response.output_text.delta": OpenAIShaper._text,
    "response.output_audio.delta": OpenAIShaper._audio,
    "response.done": OpenAIShaper._done,
    "response.cancelled": OpenAIShaper._cancelled,
    "input_audio_buffer.speech_started": OpenAIShaper._speech_started,
    "input_audio_buffer.speech_stopped": OpenAIShaper._speech_stopped,
    "input_audio_buffer.committed": OpenAIShaper._committed,
    "input_audio.transcript.delta": OpenAIShaper._transcript_delta,
    "input_audio.transcript.done": OpenAIShaper._transcript_done,
    "input_audio.transcript.failed": OpenAIShaper._transcript_failed,
    "session.updated": OpenAIShaper._updated,
}
