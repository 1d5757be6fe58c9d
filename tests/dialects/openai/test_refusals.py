"""What OpenAI would refuse is refused with a typed error naming the field; nothing a
client sends makes ``decode`` raise anything but a ProtocolError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects.openai import OPENAI

OK_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def refused(message: str | bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        OPENAI.decode(message)
    return caught.value


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("{", "invalid_json", None),
        ("[1]", "bad_event", None),
        (b"\x01", "bad_event", None),
        ('{"audio": "AA=="}', "bad_event", "type"),
        ('{"type": 5}', "bad_event", "type"),
        ('{"type": "input_audio_buffer.commit", "event_id": 3}', "bad_event", "event_id"),
        ('{"type": "input.text.append", "text": "native only"}', "unknown_event", "type"),
        ('{"type": "response.made_up"}', "unknown_event", "type"),
    ],
)
def test_malformed_messages(message: str | bytes, code: str, param: str | None) -> None:
    error = refused(message)
    assert (error.code, error.param) == (code, param)


BAD_EVENTS: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "input_audio_buffer.append"}, "bad_event", "audio"),
    ({"type": "input_audio_buffer.append", "audio": 5}, "bad_event", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "", "delta": ""}, "bad_event", "delta"),
    ({"type": "input_audio_buffer.commit", "x": 1}, "bad_event", "x"),
    ({"type": "conversation.item.create"}, "bad_event", "item"),
    ({"type": "conversation.item.create", "item": []}, "bad_event", "item"),
    (
        {"type": "conversation.item.create", "item": {**OK_ITEM, "role": "boss"}},
        "bad_event",
        "item.role",
    ),
    (
        {"type": "conversation.item.create", "item": {**OK_ITEM, "type": "weird"}},
        "bad_event",
        "item.type",
    ),
    (
        {"type": "conversation.item.create", "item": {**OK_ITEM, "extra": 1}},
        "bad_event",
        "item.extra",
    ),
    ({"type": "conversation.item.create", "item": {**OK_ITEM, "id": ""}}, "bad_event", "item.id"),
    (
        {
            "type": "conversation.item.create",
            "item": {**OK_ITEM, "content": [{"type": "input_text", "text": 1}]},
        },
        "bad_event",
        "item.content[0].text",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {**OK_ITEM, "content": [{"type": "output_text", "text": "x"}]},
        },
        "bad_event",
        "item.content[0]",
    ),
    (
        {"type": "conversation.item.create", "item": {"type": "function_call", "name": "f"}},
        "bad_event",
        "item.arguments",
    ),
    (
        {"type": "conversation.item.create", "item": OK_ITEM, "previous_item_id": 3},
        "bad_event",
        "previous_item_id",
    ),
    ({"type": "conversation.item.retrieve"}, "bad_event", "item_id"),
    ({"type": "conversation.item.delete", "item_id": "x" * 65}, "bad_event", "item_id"),
    (
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0},
        "bad_event",
        "audio_end_ms",
    ),
    (
        {
            "type": "conversation.item.truncate",
            "item_id": "i",
            "content_index": -1,
            "audio_end_ms": 0,
        },
        "bad_event",
        "content_index",
    ),
    (
        {
            "type": "conversation.item.truncate",
            "item_id": "i",
            "content_index": 0,
            "audio_end_ms": True,
        },
        "bad_event",
        "audio_end_ms",
    ),
    ({"type": "response.create", "response": "now"}, "bad_event", "response"),
    (
        {"type": "response.create", "response": {"modalities": ["text"]}},
        "bad_event",
        "response.modalities",
    ),
    (
        {"type": "response.create", "response": {"output_modalities": ["video"]}},
        "bad_event",
        "response.output_modalities",
    ),
    (
        {"type": "response.create", "response": {"max_output_tokens": 0}},
        "bad_event",
        "response.max_output_tokens",
    ),
    (
        {"type": "response.create", "response": {"input": [{"type": "message"}]}},
        "bad_event",
        "response.input[0].role",
    ),
    ({"type": "response.cancel", "response_id": 1}, "bad_event", "response_id"),
    ({"type": "session.update"}, "bad_event", "session"),
    ({"type": "session.update", "session": []}, "bad_event", "session"),
    ({"type": "session.update", "session": {"type": "transcription"}}, "bad_event", "session.type"),
    (
        {"type": "session.update", "session": {"modalities": ["text"]}},
        "bad_event",
        "session.modalities",
    ),
    (
        {"type": "session.update", "session": {"instructions": 1}},
        "bad_event",
        "session.instructions",
    ),
    (
        {"type": "session.update", "session": {"output_modalities": []}},
        "bad_event",
        "session.output_modalities",
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/flac"}}}},
        },
        "unsupported_audio_format",
        "session.audio.input.format.type",
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}},
        },
        "unsupported_audio_format",
        "session.audio.input.format.rate",
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 16000}}}},
        },
        "unsupported_audio_format",
        "session.audio.output.format.rate",
    ),
    (
        {"type": "session.update", "session": {"audio": {"wire": "carrier pigeon"}}},
        "unsupported_audio_format",
        "session.audio.wire",
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"turn_detection": {"type": "psychic"}}}},
        },
        "bad_event",
        "session.audio.input.turn_detection.type",
    ),
    (
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": "hi"}}}
            },
        },
        "bad_event",
        "session.audio.input.turn_detection.threshold",
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"model": 1}}}},
        },
        "bad_event",
        "session.audio.input.transcription.model",
    ),
    (
        {"type": "session.update", "session": {"audio": {"output": {"voice": 7}}}},
        "bad_event",
        "session.audio.output.voice",
    ),
    (
        {"type": "session.update", "session": {"audio": {"output": {"speed": 3}}}},
        "bad_event",
        "session.audio.output.speed",
    ),
    (
        {"type": "session.update", "session": {"audio": {"output": {"loud": True}}}},
        "bad_event",
        "session.audio.output.loud",
    ),
    (
        {"type": "session.update", "session": {"max_output_tokens": "lots"}},
        "bad_event",
        "session.max_output_tokens",
    ),
    (
        {"type": "session.update", "session": {"tools": [{"type": "shell"}]}},
        "bad_event",
        "session.tools",
    ),
]


@pytest.mark.parametrize(("event", "code", "param"), BAD_EVENTS, ids=lambda v: str(v)[:60])
def test_each_refusal_names_its_field_and_answers_its_event(
    event: dict[str, Any], code: str, param: str
) -> None:
    error = refused(json.dumps({**event, "event_id": "evt_client_1"}))
    assert (error.code, error.param) == (code, param), error.message
    assert error.event_id == "evt_client_1"  # the error says which event it answers


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
