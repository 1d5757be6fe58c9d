"""Reading OpenAI Realtime client events into the core's canonical events. Pure.

JSON is the shared codec's (``jsonwire``: its bounds, its sliced decoding of large
texts). Each client event type has the fields OpenAI gives it (plus ``event_id`` and our
``client_event_seq`` on every one); an unknown field is refused as OpenAI refuses
unknown parameters, ``bad_event`` with ``param`` naming it, and an unknown type is
``unknown_event``. Most events already have the canonical shape and are returned as
they were parsed; ``session.update`` has its OpenAI session object read into the
canonical configuration (config.py). ``input_audio_buffer.append`` keeps ``audio`` as
the base64 text: the core decodes it, as for the native dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, Final

from ...core.conversation import check_item, check_item_id
from ...core.events import ErrorCode
from ...core.wire import ProtocolError
from ..binary import parse_input
from ..jsonwire import LARGE, decode_object, object_steps
from .config import OUTPUT_MODALITIES, to_config

Event = dict[str, Any]
_NOT_OBJECT: Final = "an event must be a JSON object"
_BASE: Final = frozenset({"type", "event_id", "client_event_seq"})


def _keys(*names: str) -> frozenset[str]:
    return _BASE | frozenset(names)


def _bad(message: str, param: str, event: Event) -> ProtocolError:
    event_id = event.get("event_id")
    return ProtocolError(ErrorCode.BAD_EVENT, message, event_id=event_id, param=param)


def _check_keys(event: Event, allowed: frozenset[str]) -> None:
    if not event.keys() <= allowed:
        key = min(event.keys() - allowed)
        raise _bad(f"unknown parameter {key!r}", key, event)


def _append(event: Event) -> Event:
    if type(event.get("audio")) is not str:
        raise _bad("audio must be a base64 string", "audio", event)
    return event


def _plain(event: Event) -> Event:
    return event


def _update(event: Event) -> Event:
    if "session" not in event:
        raise _bad("session is required", "session", event)
    try:
        event["session"] = to_config(event["session"])
    except ProtocolError as exc:
        raise ProtocolError(
            exc.code, exc.message, event_id=event.get("event_id"), param=exc.param
        ) from None
    return event


def _item_id(event: Event, key: str = "item_id", required: bool = True) -> None:
    if key not in event:
        if required:
            raise _bad(f"{key} is required", key, event)
        return
    try:
        check_item_id(event[key], key)
    except ProtocolError as exc:
        raise _bad(exc.message, key, event) from None


def _checked_item(item: object, param: str, event: Event) -> None:
    try:
        check_item(item, param)
    except ProtocolError as exc:
        raise _bad(exc.message, exc.param or param, event) from None


def _create_item(event: Event) -> Event:
    if "item" not in event:
        raise _bad("item is required", "item", event)
    _checked_item(event["item"], "item", event)
    if event.get("previous_item_id", "") is None:
        del event["previous_item_id"]  # null: the end, as if absent
    _item_id(event, "previous_item_id", required=False)
    return event


def _retrieve(event: Event) -> Event:
    _item_id(event)
    return event


def _truncate(event: Event) -> Event:
    _item_id(event)
    for key in ("content_index", "audio_end_ms"):
        value = event.get(key)
        if type(value) is not int or value < 0:
            raise _bad(f"{key} must be a non-negative integer", key, event)
    return event


def _str_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


_RESPONSE: Final[Mapping[str, Callable[[object], bool]]] = {
    "instructions": lambda v: isinstance(v, str),
    "conversation": lambda v: isinstance(v, str),
    "output_modalities": lambda v: (
        isinstance(v, list) and 0 < len(v) <= 2 and all(m in OUTPUT_MODALITIES for m in v)
    ),
    "metadata": lambda v: _str_map(v) and len(v) <= 16,  # type: ignore[arg-type]
    "max_output_tokens": lambda v: v == "inf" or (type(v) is int and 1 <= v <= 4096),
    "audio": lambda v: isinstance(v, dict),
    "input": lambda v: isinstance(v, list),
    "parallel_tool_calls": lambda v: type(v) is bool,
    "prompt": lambda v: isinstance(v, dict),
    "reasoning": lambda v: isinstance(v, dict),
    "tool_choice": lambda v: isinstance(v, str | dict),
    "tools": lambda v: isinstance(v, list),
}


def _response_create(event: Event) -> Event:
    if "response" not in event:
        return event
    response = event["response"]
    if not isinstance(response, dict):
        raise _bad("response must be an object", "response", event)
    unset = []
    for key, value in response.items():
        check = _RESPONSE.get(key)
        if check is None:
            raise _bad(f"unknown parameter response.{key}", f"response.{key}", event)
        if value is None:
            unset.append(key)
        elif not check(value):
            raise _bad(f"response.{key} has an invalid value", f"response.{key}", event)
    for key in unset:  # every field is optional, and null means "not set" (LiveKit sends it)
        del response[key]
    for i, item in enumerate(response.get("input", ())):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            if set(item) - {"type", "id"}:
                raise _bad("an item_reference has type and id", f"response.input[{i}]", event)
            continue
        _checked_item(item, f"response.input[{i}]", event)
    return event


def _cancel(event: Event) -> Event:
    _item_id(event, "response_id", required=False)
    return event


_APPEND: Final = "input_audio_buffer.append"
_APPEND_KEYS: Final = _keys("audio")

# type: (the fields it may carry, its check, which returns the canonical event).
_EVENTS: Final[Mapping[str, tuple[frozenset[str], Callable[[Event], Event]]]] = {
    "input_audio_buffer.append": (_keys("audio"), _append),
    "input_audio_buffer.commit": (_BASE, _plain),
    "input_audio_buffer.clear": (_BASE, _plain),
    "output_audio_buffer.clear": (_BASE, _plain),
    "session.update": (_keys("session"), _update),
    "conversation.item.create": (_keys("item", "previous_item_id"), _create_item),
    "conversation.item.retrieve": (_keys("item_id"), _retrieve),
    "conversation.item.truncate": (_keys("item_id", "content_index", "audio_end_ms"), _truncate),
    "conversation.item.delete": (_keys("item_id"), _retrieve),
    "response.create": (_keys("response"), _response_create),
    "response.cancel": (_keys("response_id"), _cancel),
    # our extensions, as the native dialect has them: the core checks their fields
    "session.event_ack": (_keys("server_event_seq"), _plain),
    "session.heartbeat": (_BASE, _plain),
    "session.close": (_keys("reason"), _plain),
    "session.resume": (
        _keys("session_id", "resume_token", "last_received_server_event_seq"),
        _plain,
    ),
}


def translate(event: Event) -> Event:
    """A parsed JSON object as the canonical client event it stands for."""
    event_id = event.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError(ErrorCode.BAD_EVENT, "event_id must be a string", param="event_id")
    kind = event.get("type")
    if not isinstance(kind, str):
        raise _bad("an event needs a string field 'type'", "type", event)
    spec = _EVENTS.get(kind)
    if spec is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_EVENT,
            f"event type {kind[:64]!r} is not a client event of this API",
            event_id=event_id,
            param="type",
        )
    allowed, check = spec
    if not event.keys() <= allowed:  # (_check_keys inlined: the per-event path)
        _check_keys(event, allowed)
    if check is _append:  # the most frequent event by far: its check inlined
        if type(event.get("audio")) is str:
            return event
    elif check is _plain:
        return event
    return check(event)


def decode(message: str | bytes) -> Event:
    """One client message as a canonical event; ProtocolError (invalid_json, bad_event,
    unknown_event, unsupported_audio_format) if it is not one. Binary messages are
    ``decode_binary``'s."""
    if not isinstance(message, str):
        raise ProtocolError(ErrorCode.BAD_EVENT, "binary frames are not accepted; send JSON text")
    event = decode_object(message, _NOT_OBJECT)
    # The per-event path: an append that is valid is returned as it was parsed, with
    # translate's checks done here (anything else, or an append with a fault, takes
    # translate and its refusals).
    if (
        event.get("type") == _APPEND
        and type(event.get("audio")) is str
        and event.keys() <= _APPEND_KEYS
        and type(event.get("event_id", "")) is str
    ):
        return event
    return translate(event)


def decode_steps(message: str | bytes) -> Generator[None, None, Event]:
    """``decode`` yielding between slices of a large text (``jsonwire.object_steps``)."""
    if not isinstance(message, str) or len(message) < LARGE:
        return decode(message)
    return translate((yield from object_steps(message)))


def decode_binary(data: bytes) -> Event:
    """Our binary lane (``session.audio.wire = "binary"``): input audio, as natively."""
    seq, payload = parse_input(data)
    event: Event = {"type": "input_audio_buffer.append", "audio": payload}
    if seq:
        event["client_event_seq"] = seq
    return event
