"""What OpenAI would refuse is refused with a typed error naming the field, and the
error says which client event it answers (test_fuzz.py: nothing else escapes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

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
