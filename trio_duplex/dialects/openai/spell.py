"""Writing the core's server events on OpenAI's wire. Pure, plain dicts and jsonwire.

Every event gets an ``event_id``: ``event_<server_event_seq>`` for a journaled one (the
same text is journaled, sent and replayed), else ``event_x<n>`` from a process-wide
counter. ``error`` nests its fields as OpenAI does; ``session.created`` carries the
OpenAI session object and our ``resume`` object (a field OpenAI's clients ignore);
``session.resumed`` keeps its native fields with the session object as OpenAI's; our
other control events keep their native names and fields. Engine events come already
shaped (shaper.py); ``frame`` only adds their ``event_id`` (to a response's events,
which the shaper wrote already, by appending it and the ``server_event_seq`` to their
text: the same bytes as writing the dict).
"""

from __future__ import annotations

import binascii
import itertools
from collections.abc import Callable, Mapping
from typing import Any, Final

from ...core.conversation import assistant_item_id
from ...core.events import ErrorCode
from ...core.spelling import Frame
from ..binary import output_message
from ..jsonwire import encode
from .config import to_session
from .shaper import Shaped, ShapedAudio

Event = dict[str, Any]
_b2a = binascii.b2a_base64
_counter = itertools.count(1)
_AUDIO_DELTA: Final = "response.output_audio.delta"
_SHAPED_AUDIO: Final = frozenset(
    {"type", "response_id", "item_id", "output_index", "content_index", "audio"}
)
_ERROR_KEYS: Final = frozenset({"type", "code", "message", "param", "event_id", "server_event_seq"})


def unjournaled_id() -> str:
    """The ``event_id`` of an event that is not journaled: unique in this process."""
    return f"event_x{next(_counter):x}"


def _error(event: Event) -> Event:
    code = event.get("code")
    error: Event = {
        "type": "server_error" if code == ErrorCode.ENGINE_ERROR else "invalid_request_error",
        "code": code,
        "message": event.get("message", ""),
        "param": event.get("param"),
        "event_id": event.get("event_id"),
    }
    for key, value in event.items():
        if key not in _ERROR_KEYS:
            error[key] = value  # retryable, client_event_seq, expected_client_event_seq...
    out: Event = {"type": "error", "event_id": _event_id(event), "error": error}
    seq = event.get("server_event_seq")
    if seq is not None:  # journaled (an engine's, a proxy's upstream's): acked, replayed
        out["server_event_seq"] = seq
    return out


def _created(event: Event) -> Event:
    session_id = event.get("session_id", "")
    resume = {
        "session_id": session_id,
        "resume_token": event.get("resume_token"),
        "attachment_generation": event.get("attachment_generation"),
        "limits": event.get("limits"),
    }
    return {
        "type": "session.created",
        "event_id": unjournaled_id(),
        "session": to_session(event.get("session") or {}, session_id),
        "resume": resume,
    }


def _with_session(event: Event) -> Event:
    """``session.resumed``: native fields, the configuration as OpenAI's session."""
    out = {**event, "event_id": _event_id(event)}
    config = event.get("session")
    if isinstance(config, dict) and config.get("type") != "realtime":
        out["session"] = to_session(config, event.get("session_id", ""))
    return out


def _event_id(event: Event) -> str:
    seq = event.get("server_event_seq")
    return unjournaled_id() if seq is None else f"event_{seq}"


_SPECIAL: Final[Mapping[str, Callable[[Event], Event]]] = {
    "error": _error,
    "session.created": _created,
    "session.resumed": _with_session,
    "session.updated": _with_session,  # (the shaper's writes the full object already)
}


def frame(event: Event) -> Frame:
    """One server event as OpenAI's JSON text (ValueError/TypeError as ``encode``)."""
    seq = event.get("server_event_seq")
    if type(event) is Shaped:  # the shaper's, written already: the per-event path
        if seq is None:
            return f'{event.head},"event_id":"{unjournaled_id()}"}}'
        n = str(seq)
        return f'{event.head},"server_event_seq":{n},"event_id":"event_{n}"}}'
    special = _SPECIAL.get(event["type"])
    if special is not None:
        return encode(special(event))
    return encode({**event, "event_id": unjournaled_id() if seq is None else f"event_{seq}"})


def audio_frame(seq: int, payload: bytes, fields: Event | None) -> Frame:
    """Output audio journaled as ``seq``: ``response.output_audio.delta`` with the base64
    in ``delta``, or a kind-2 binary message on our binary lane (``fields`` None)."""
    if fields is None:
        return output_message(seq, payload)
    delta = _b2a(payload, newline=False).decode("ascii")
    if type(fields) is ShapedAudio:  # the shaper's delta, its response's fields encoded
        n = str(seq)
        return (
            f'{{"type":"response.output_audio.delta","event_id":"event_{n}",{fields.where},'
            f'"delta":"{delta}","server_event_seq":{n}}}'
        )
    if fields.keys() == _SHAPED_AUDIO:  # the shaper's delta: the per-event path
        return encode(
            {
                "type": _AUDIO_DELTA,
                "event_id": f"event_{seq}",
                "response_id": fields["response_id"],
                "item_id": fields["item_id"],
                "output_index": fields["output_index"],
                "content_index": fields["content_index"],
                "delta": delta,
                "server_event_seq": seq,
            }
        )
    event = {**fields, "event_id": f"event_{seq}"}
    event.pop("audio", None)
    response_id = event.get("response_id")
    if isinstance(response_id, str) and "item_id" not in event:  # an engine's compact delta
        event["item_id"] = assistant_item_id(response_id)
        event["output_index"] = 0
        event["content_index"] = 0
    event["delta"] = delta
    event["server_event_seq"] = seq
    return encode(event)
