"""The conversation's items: their ids, and the shape a client's item must have. Pure.

Items are OpenAI Realtime's (``conversation.item.create``'s ``item``) in every dialect:
``{id?, type: "message", role, content: [...]}``, or a ``function_call``,
``function_call_output`` or ``mcp_approval_response``, which are checked and stored but
never answered by the built-in engines. A response's assistant item has an id derived
from the response's (``assistant_item_id``) and one shape (``assistant_item``), so a
dialect that writes OpenAI's full response structure and an engine's conversation store
name and write it alike. An item without ``type`` is a message.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final

from .events import ErrorCode
from .wire import ProtocolError

MAX_ID = 64
"""The longest item id a client may choose (OpenAI's are 32 characters or fewer)."""

_STATUSES: Final = frozenset({"completed", "incomplete", "in_progress"})
_COMMON: Final = frozenset({"id", "type", "object", "status"})

# The content parts each role may carry, and each part's fields (name: its JSON type).
_STR = (str,)
_PARTS: Final[Mapping[str, Mapping[str, Mapping[str, tuple[type, ...]]]]] = {
    "user": {
        "input_text": {"text": _STR},
        "input_audio": {"audio": _STR, "transcript": _STR},
        "input_image": {"image_url": _STR, "detail": _STR},
    },
    "system": {"input_text": {"text": _STR}},
    "assistant": {
        "output_text": {"text": _STR},
        "text": {"text": _STR},
        "output_audio": {"audio": _STR, "transcript": _STR},
        "audio": {"audio": _STR, "transcript": _STR},
    },
}
_REQUIRED_TEXT: Final = frozenset({"input_text", "output_text", "text"})

# Items other than messages: their fields (required ones marked True).
_OTHER: Final[Mapping[str, Mapping[str, tuple[tuple[type, ...], bool]]]] = {
    "function_call": {"name": (_STR, True), "arguments": (_STR, True), "call_id": (_STR, False)},
    "function_call_output": {"call_id": (_STR, True), "output": (_STR, True)},
    "mcp_approval_response": {"approval_request_id": (_STR, True), "approve": ((bool,), True)},
}
_MAX_PARTS = 64


def assistant_item_id(response_id: str) -> str:
    """The id of the assistant item a response produces: the shaper's and the engines'
    conversation store's, so that truncate or retrieve of it works in every dialect."""
    return "item_" + response_id


def new_item_id() -> str:
    """A fresh item id for an item the client gave none: ``item_`` and 24 hex digits."""
    return "item_" + secrets.token_hex(12)


def assistant_item(
    response_id: str, text: str | None, *, audio: bool, status: str = "completed"
) -> dict[str, Any]:
    """A response's assistant item as OpenAI writes it: one part, its text as
    ``output_text`` or, for an audio response, as the ``output_audio`` transcript; no part
    while ``text`` is None (the item just announced). The OpenAI dialect's shaper writes
    this; an engine's conversation store that holds the same answers retrieve alike."""
    content: list[dict[str, Any]] = []
    if text is not None:
        spoken = {"type": "output_audio", "transcript": text}
        content.append(spoken if audio else {"type": "output_text", "text": text})
    return {
        "id": assistant_item_id(response_id),
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _bad(message: str, param: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_EVENT, message, param=param)


def check_item_id(value: object, param: str) -> str:
    """An item id a client names (``item_id``, ``previous_item_id``, an item's ``id``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID:
        raise _bad(f"{param} must be a string of 1 to {MAX_ID} characters", param)
    return value


def check_item(item: object, param: str = "item") -> None:
    """Refuse an ill-shaped conversation item: ProtocolError(bad_event) with ``param``
    naming the field at fault (``item.content[0].text``). Unknown fields are refused, as
    OpenAI refuses unknown parameters."""
    if not isinstance(item, dict):
        raise _bad(f"{param} must be an object", param)
    kind = item.get("type", "message")
    if "id" in item:
        check_item_id(item["id"], f"{param}.id")
    status = item.get("status")
    if status is not None and (not isinstance(status, str) or status not in _STATUSES):
        raise _bad(
            f"{param}.status must be one of {', '.join(sorted(_STATUSES))}", f"{param}.status"
        )
    if "object" in item and item["object"] != "realtime.item":
        raise _bad(f'{param}.object must be "realtime.item"', f"{param}.object")
    if kind == "message":
        _check_message(item, param)
        return
    fields = _OTHER.get(kind) if isinstance(kind, str) else None
    if fields is None:
        allowed = ", ".join(["message", *_OTHER])
        raise _bad(f"{param}.type must be one of {allowed}", f"{param}.type")
    for key, value in item.items():
        if key in _COMMON:
            continue
        spec = fields.get(key)
        if spec is None:
            raise _bad(f"{param} has no field {key!r}", f"{param}.{key}")
        if not isinstance(value, spec[0]):
            raise _bad(f"{param}.{key} has the wrong type", f"{param}.{key}")
    for key, (_, required) in fields.items():
        if required and key not in item:
            raise _bad(f"{param}.{key} is required", f"{param}.{key}")


def _check_message(item: dict[str, Any], param: str) -> None:
    role = item.get("role")
    parts = _PARTS.get(role) if isinstance(role, str) else None
    if parts is None:
        raise _bad(f"{param}.role must be user, assistant or system", f"{param}.role")
    for key in item:
        if key not in _COMMON and key not in ("role", "content"):
            raise _bad(f"{param} has no field {key!r}", f"{param}.{key}")
    content = item.get("content")
    if not isinstance(content, list) or len(content) > _MAX_PARTS:
        raise _bad(f"{param}.content must be a list of at most {_MAX_PARTS} parts", param)
    for i, part in enumerate(content):
        where = f"{param}.content[{i}]"
        if not isinstance(part, dict):
            raise _bad(f"{where} must be an object", where)
        kind = part.get("type")
        fields = parts.get(kind) if isinstance(kind, str) else None
        if fields is None:
            raise _bad(f"{where}.type must be one of {', '.join(parts)} for {role}", where)
        for key, value in part.items():
            if key == "type":
                continue
            types = fields.get(key)
            if types is None:
                raise _bad(f"{where} has no field {key!r}", f"{where}.{key}")
            if not isinstance(value, types):
                raise _bad(f"{where}.{key} must be a string", f"{where}.{key}")
        if kind in _REQUIRED_TEXT and "text" not in part:
            raise _bad(f"{where}.text is required", f"{where}.text")
