"""What ``frame`` and ``audio_frame`` write: OpenAI's events, valid to the SDK, with our
extensions only where a client asked for them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from openai.types.realtime import RealtimeErrorEvent, SessionCreatedEvent

from trio_duplex.core import events
from trio_duplex.core.events import ErrorCode, Reason
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects.binary import output_message
from trio_duplex.dialects.openai import OPENAI
from trio_duplex.dialects.openai.config import defaults

from .reference import validate

Event = dict[str, Any]
LIMITS = {"max_message_bytes": 1 << 20}


def created(config: Event) -> Any:
    return validate(OPENAI.frame(events.created("sess_1", config, "tok_secret", 2, LIMITS)))


def test_session_created_is_openais_session_with_our_resume_object() -> None:
    model = created(defaults("gpt-realtime"))
    assert isinstance(model, SessionCreatedEvent)
    session: Any = model.session
    assert session.type == "realtime" and session.model == "gpt-realtime"
    assert session.output_modalities == ["audio"]
    assert session.audio.input.format.type == session.audio.output.format.type == "audio/pcm"
    assert session.audio.input.format.rate == 24000
    assert session.model_extra == {"object": "realtime.session", "id": "sess_1"}
    assert session.audio.model_extra == {}  # no wire extension unless asked for
    assert (model.model_extra or {})["resume"] == {
        "session_id": "sess_1",
        "resume_token": "tok_secret",
        "attachment_generation": 2,
        "limits": LIMITS,
    }
    assert model.event_id.startswith("event_x")


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ({"format": "pcm16", "rate": 24000}, {"type": "audio/pcm", "rate": 24000}),
        ({"format": "g711_ulaw", "rate": 8000}, {"type": "audio/pcmu"}),
        ({"format": "g711_alaw", "rate": 8000}, {"type": "audio/pcma"}),
    ],
)
def test_each_format_is_written_as_openai_names_it(ours: Event, theirs: Event) -> None:
    audio = {"wire": "binary", "input": ours, "output": ours}
    model = created({**defaults(), "audio": audio})
    for direction in (model.session.audio.input, model.session.audio.output):
        assert direction.format.model_dump(exclude_none=True) == theirs
    assert model.session.audio.model_extra == {"wire": "binary"}


def test_opus_is_our_extension_format() -> None:
    opus = {"format": "opus", "rate": 48000}
    config = {**defaults(), "audio": {"wire": "json", "input": opus, "output": opus}}
    data = json.loads(OPENAI.frame(events.created("s", config, "t", 1, {})))
    assert data["session"]["audio"]["input"]["format"] == {"type": "audio/opus", "rate": 48000}


def test_the_settings_are_written_back_where_openai_has_them() -> None:
    config = {
        **defaults("m"),
        "instructions": "hi",
        "voice": {"id": "voice_1"},
        "speed": 1.25,
        "turn_detection": {"type": "semantic_vad", "eagerness": "low"},
        "input_audio_transcription": {"model": "whisper-1", "language": "en"},
        "input_audio_noise_reduction": {"type": "near_field"},
        "output_modalities": ["text"],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": "none",
        "max_output_tokens": 100,
        "tracing": "auto",
        "truncation": "disabled",
        "include": ["item.input_audio_transcription.logprobs"],
        "engine_private": 1,  # no OpenAI field maps to it: left out
    }
    session = created(config).session
    assert session.instructions == "hi" and session.output_modalities == ["text"]
    assert session.audio.output.voice.id == "voice_1" and session.audio.output.speed == 1.25
    assert session.audio.input.turn_detection.eagerness == "low"
    assert session.audio.input.transcription.model == "whisper-1"
    assert session.audio.input.noise_reduction.type == "near_field"
    assert session.tools[0].name == "f" and session.tool_choice == "none"
    assert session.max_output_tokens == 100 and session.tracing == "auto"
    assert session.truncation == "disabled"
    assert session.include == ["item.input_audio_transcription.logprobs"]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ProtocolError(ErrorCode.BAD_EVENT, "item must be an object", param="item"), None),
        (ProtocolError(ErrorCode.UNKNOWN_EVENT, "no", param="type"), None),
        (ProtocolError(ErrorCode.INVALID_JSON, "frame is not valid JSON"), None),
        (ProtocolError.unexpected_client_seq(4, 9), None),
        (ProtocolError(ErrorCode.ENGINE_ERROR, "broke"), "server_error"),
        (ProtocolError(ErrorCode.RESOURCE_EXHAUSTED, "full"), None),
    ],
)
def test_errors_are_nested_as_openai_nests_them(error: ProtocolError, kind: str | None) -> None:
    cause = {"type": "response.create", "event_id": "evt_client_7", "client_event_seq": 9}
    model = validate(OPENAI.frame(error.to_event(cause)))
    assert isinstance(model, RealtimeErrorEvent)
    nested: Any = model.error
    assert nested.type == (kind or "invalid_request_error")
    assert (nested.code, nested.message, nested.param) == (error.code, error.message, error.param)
    assert nested.event_id == "evt_client_7"  # the client event it answers
    assert nested.model_extra["retryable"] is error.retryable
    assert nested.model_extra["client_event_seq"] == 9
    if error.code == ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ:
        assert nested.model_extra["expected_client_event_seq"] == 4


def test_an_error_answering_nothing_has_a_null_event_id() -> None:
    model = validate(OPENAI.frame(events.error("invalid_json", "bad")))
    assert model.error.event_id is None and model.error.param is None


CONTROL = [
    events.resumed("s", defaults(), "t2", 3, 7, 5),
    events.input_consumed(4),
    events.replaced("s", 4),
    events.resync_required("journal_gap", 9),
    events.heartbeat_ack("s"),
    events.going_away(1000, migrating=True),
    events.ended("s", Reason.CLIENT_CLOSE, {"events_in": 1}),
    events.ended("s", Reason.IDLE_EXPIRED),
]


@pytest.mark.parametrize("event", CONTROL, ids=lambda e: str(e["type"]))
def test_our_control_events_keep_their_names_and_fields(event: Event) -> None:
    data = json.loads(OPENAI.frame(dict(event)))
    assert data.pop("event_id").startswith("event_x")
    if event["type"] == "session.resumed":
        assert data.pop("session")["type"] == "realtime"  # OpenAI's session object
        event = {k: v for k, v in event.items() if k != "session"}
    assert data == json.loads(json.dumps(event))


def test_unjournaled_event_ids_are_unique_and_journaled_ones_are_their_seq() -> None:
    ids = {json.loads(OPENAI.frame(events.heartbeat_ack("s")))["event_id"] for _ in range(50)}
    assert len(ids) == 50
    journaled = {"type": "conversation.item.deleted", "item_id": "i", "server_event_seq": 12}
    assert OPENAI.frame(dict(journaled)) == OPENAI.frame(dict(journaled))
    model = validate(OPENAI.frame(journaled))
    assert model.event_id == "event_12" and model.item_id == "i"


def test_conversation_events_pass_through_valid() -> None:
    item: Event = {
        "id": "item_u",
        "type": "message",
        "role": "user",
        "object": "realtime.item",
        "status": "completed",
        "content": [{"type": "input_text", "text": "hi"}],
    }
    sent: list[Event] = [
        {"type": "conversation.item.added", "item": item, "previous_item_id": "item_p"},
        {"type": "conversation.item.done", "item": item},
        {"type": "conversation.item.retrieved", "item": item},
        {
            "type": "conversation.item.truncated",
            "item_id": "item_a",
            "content_index": 0,
            "audio_end_ms": 1500,
        },
        {"type": "conversation.item.deleted", "item_id": "item_a"},
        {"type": "input_audio_buffer.cleared"},
    ]
    for n, event in enumerate(sent, start=1):
        shaped = OPENAI.shaper(defaults()).shape({**event, "server_event_seq": n})
        assert validate(OPENAI.frame(shaped[0])).type == event["type"]


def test_output_audio_as_json_and_on_the_binary_lane() -> None:
    compact = {"type": "response.output_audio.delta", "response_id": "resp_1", "audio": b"x"}
    model = validate(OPENAI.audio_frame(8, b"\x00\x01", compact))
    assert base64.b64decode(model.delta) == b"\x00\x01"
    assert (model.response_id, model.item_id, model.event_id) == (
        "resp_1",
        "item_resp_1",
        "event_8",
    )
    assert OPENAI.audio_frame(8, b"\x00\x01", None) == output_message(8, b"\x00\x01")
