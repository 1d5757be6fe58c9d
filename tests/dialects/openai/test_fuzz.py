"""Fuzzing ``decode``: whatever a client sends, arbitrary or a valid event broken
anywhere, it decodes to an event that can be written again, or is refused with a
ProtocolError, never another exception."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects.openai import OPENAI

NAMES = st.sampled_from(
    [
        "type",
        "event_id",
        "audio",
        "item",
        "item_id",
        "session",
        "response",
        "content",
        "role",
        "text",
        "format",
        "input",
        "output",
        "turn_detection",
        "rate",
        "voice",
        "previous_item_id",
        "content_index",
        "audio_end_ms",
        "response_id",
        "wire",
        "output_modalities",
        "status",
        "tools",
        "metadata",
        "instructions",
        "transcription",
        "noise_reduction",
        "speed",
        "max_output_tokens",
        "tracing",
        "truncation",
        "id",
        "name",
        "arguments",
        "call_id",
        "object",
        "client_event_seq",
        "eagerness",
    ]
)
TYPES = st.sampled_from(
    [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "conversation.item.create",
        "conversation.item.truncate",
        "response.create",
        "response.cancel",
        "message",
        "user",
        "audio/pcm",
        "realtime",
        "input_text",
        "server_vad",
        "function_call",
        "session.event_ack",
    ]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TYPES | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(NAMES, JSON, max_size=6), TYPES)
def test_fuzzed_events_decode_or_are_refused_typed(event: dict[str, Any], kind: str) -> None:
    event.setdefault("type", kind)
    try:
        decoded = OPENAI.decode(json.dumps(event))
    except ProtocolError as exc:
        assert exc.code in (
            "bad_event",
            "unknown_event",
            "unsupported_audio_format",
            "invalid_json",
        )
        return
    assert isinstance(decoded["type"], str)
    json.dumps(decoded)  # what reaches the core can be written again


@settings(max_examples=300, deadline=None)
@given(st.text() | st.binary())
def test_arbitrary_messages_are_refused_typed(message: str | bytes) -> None:
    try:
        OPENAI.decode(message)
    except ProtocolError:
        pass


TEMPLATES: list[dict[str, Any]] = [
    {"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "e"},
    {
        "type": "conversation.item.create",
        "previous_item_id": "p",
        "item": {
            "id": "i",
            "type": "message",
            "role": "user",
            "status": "completed",
            "object": "realtime.item",
            "content": [
                {"type": "input_text", "text": "t"},
                {"type": "input_audio", "audio": "", "transcript": ""},
            ],
        },
    },
    {
        "type": "conversation.item.create",
        "item": {"type": "function_call", "name": "f", "arguments": "{}"},
    },
    {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 5},
    {
        "type": "response.create",
        "response": {
            "output_modalities": ["audio"],
            "metadata": {"k": "v"},
            "instructions": "x",
            "conversation": "none",
            "max_output_tokens": 5,
            "input": [
                {"type": "item_reference", "id": "i"},
                {
                    "type": "message",
                    "role": "system",
                    "content": [{"type": "input_text", "text": "t"}],
                },
            ],
        },
    },
    {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["text"],
            "tools": [{"type": "function"}],
            "tracing": "auto",
            "truncation": "auto",
            "include": ["x"],
            "max_output_tokens": "inf",
            "audio": {
                "wire": "json",
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "m"},
                    "turn_detection": {"type": "server_vad", "threshold": 0.5},
                    "noise_reduction": {"type": "near_field"},
                },
                "output": {"format": {"type": "audio/pcmu"}, "voice": {"id": "v"}, "speed": 1.0},
            },
        },
    },
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        found.extend(_paths(child, (*path, key)))
    return found


@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_events_broken_anywhere_are_refused_typed(data: st.DataObject) -> None:
    event = json.loads(json.dumps(data.draw(st.sampled_from(TEMPLATES))))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(event)[1:]))
        holder = event
        for key in path[:-1]:
            holder = holder[key]
        if data.draw(st.booleans()) or not isinstance(holder, dict):
            holder[path[-1]] = data.draw(JSON)
        else:
            holder[data.draw(NAMES)] = data.draw(JSON)
    try:
        decoded = OPENAI.decode(json.dumps(event))
    except ProtocolError:
        return
    json.dumps(decoded)
