"""OpenAI's client events, built from the SDK's own types, decode into the canonical
events the core and the engines see; what OpenAI would refuse is a typed error."""

from __future__ import annotations

import base64
import json
import typing
from typing import Any

import pytest
from openai._utils import maybe_transform
from openai.types.realtime import (
    ConversationItemCreateEventParam,
    ConversationItemDeleteEventParam,
    ConversationItemRetrieveEventParam,
    ConversationItemTruncateEventParam,
    InputAudioBufferAppendEvent,
    InputAudioBufferAppendEventParam,
    InputAudioBufferClearEventParam,
    InputAudioBufferCommitEventParam,
    RealtimeAudioConfig,
    RealtimeAudioConfigInput,
    RealtimeAudioConfigOutput,
    RealtimeClientEventParam,
    RealtimeResponseCreateParams,
    RealtimeSessionCreateRequest,
    RealtimeSessionCreateRequestParam,
    ResponseCancelEvent,
    ResponseCancelEventParam,
    ResponseCreateEvent,
    ResponseCreateEventParam,
    ResponseCreateEventWithReferencesParam,
    SessionUpdateEvent,
    SessionUpdateEventParam,
)
from openai.types.realtime.realtime_audio_formats import AudioPCMU

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import Dialect
from trio_duplex.dialects.binary import input_message
from trio_duplex.dialects.openai import OPENAI
from trio_duplex.dialects.openai.config import default_audio, defaults, to_session

Event = dict[str, Any]
SENT: Any = RealtimeClientEventParam | ResponseCreateEventWithReferencesParam
AUDIO = base64.b64encode(b"\x00\x01" * 240).decode()


def wire(event: object) -> str:
    """The text the SDK's connection sends for a client event given as its TypedDict
    (``send`` in openai/resources/realtime/realtime.py)."""
    sent = maybe_transform(event, SENT)
    return json.dumps(sent)


def test_it_is_a_dialect() -> None:
    dialect: Dialect = OPENAI
    assert (dialect.name, dialect.subprotocol, dialect.binary_lane) == ("openai", "realtime", True)
    assert OPENAI.speaks_first


def test_every_client_event_type_of_the_sdk_is_read() -> None:
    kinds = []
    for param in typing.get_args(RealtimeClientEventParam):
        [kind] = typing.get_args(typing.get_type_hints(param)["type"])
        kinds.append(kind)
        minimal: dict[str, Any] = {"type": kind}
        try:
            OPENAI.decode(wire(minimal))
        except ProtocolError as exc:  # a required field missing, never an unknown type
            assert exc.code == "bad_event", (kind, exc)
    assert len(kinds) == 11 and "response.cancel" in kinds


def test_input_audio_is_left_as_base64_text_for_the_core() -> None:
    event: InputAudioBufferAppendEventParam = {
        "type": "input_audio_buffer.append",
        "audio": AUDIO,
        "event_id": "evt_1",
    }
    assert OPENAI.decode(wire(event)) == event
    commit: InputAudioBufferCommitEventParam = {"type": "input_audio_buffer.commit"}
    clear: InputAudioBufferClearEventParam = {"type": "input_audio_buffer.clear", "event_id": "e"}
    assert OPENAI.decode(wire(commit)) == commit
    assert OPENAI.decode(wire(clear)) == clear


ITEMS: list[Any] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {
        "id": "item_mine",
        "type": "message",
        "role": "user",
        "object": "realtime.item",
        "status": "completed",
        "content": [{"type": "input_audio", "audio": AUDIO, "transcript": "hello"}],
    },
    {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "rule"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
    {"type": "function_call_output", "call_id": "c1", "output": "42"},
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: f"{i['type']}-{i.get('role')}")
def test_conversation_item_create_keeps_openais_item(item: Any) -> None:
    event: ConversationItemCreateEventParam = {
        "type": "conversation.item.create",
        "item": item,
        "previous_item_id": "item_before",
    }
    assert OPENAI.decode(wire(event)) == event


def test_the_other_conversation_events() -> None:
    retrieve: ConversationItemRetrieveEventParam = {
        "type": "conversation.item.retrieve",
        "item_id": "item_1",
    }
    truncate: ConversationItemTruncateEventParam = {
        "type": "conversation.item.truncate",
        "item_id": "item_resp_1",
        "content_index": 0,
        "audio_end_ms": 1500,
    }
    delete: ConversationItemDeleteEventParam = {
        "type": "conversation.item.delete",
        "item_id": "item_1",
    }
    for event in (retrieve, truncate, delete):
        assert OPENAI.decode(wire(event)) == event
    null_previous = {"type": "conversation.item.create", "item": ITEMS[0], "previous_item_id": None}
    assert "previous_item_id" not in OPENAI.decode(wire(null_previous))


def test_responses_are_created_and_cancelled() -> None:
    create: ResponseCreateEventParam = {
        "type": "response.create",
        "response": {
            "instructions": "shout",
            "output_modalities": ["text"],
            "conversation": "none",
            "metadata": {"topic": "x"},
            "max_output_tokens": "inf",
            "tool_choice": "auto",
            "tools": [{"type": "function", "name": "f", "parameters": {}}],
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "q"}],
                }
            ],
        },
    }
    cancel: ResponseCancelEventParam = {"type": "response.cancel", "response_id": "resp_1"}
    for event in (create, {"type": "response.create"}, cancel, {"type": "response.cancel"}):
        assert OPENAI.decode(wire(event)) == event


def update(session: RealtimeSessionCreateRequestParam) -> Event:
    event: SessionUpdateEventParam = {"type": "session.update", "session": session}
    decoded = OPENAI.decode(wire(event))
    assert decoded["type"] == "session.update"
    config: Event = decoded["session"]
    return config


def test_session_update_is_read_into_the_canonical_config() -> None:
    config = update(
        {
            "type": "realtime",
            "model": "gpt-realtime",
            "instructions": "be brief",
            "output_modalities": ["text"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcmu"},
                    "transcription": {"model": "whisper-1", "language": "en"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
                    "noise_reduction": {"type": "far_field"},
                },
                "output": {"format": {"type": "audio/pcma"}, "voice": "marin", "speed": 1.1},
            },
            "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
            "tool_choice": "required",
            "max_output_tokens": 512,
            "tracing": "auto",
            "truncation": "disabled",
            "include": ["item.input_audio_transcription.logprobs"],
            "parallel_tool_calls": False,
        }
    )
    assert config == {
        "model": "gpt-realtime",
        "instructions": "be brief",
        "output_modalities": ["text"],
        "audio": {
            "wire": "json",
            "input": {"format": "g711_ulaw", "rate": 8000},
            "output": {"format": "g711_alaw", "rate": 8000},
        },
        "input_audio_transcription": {"model": "whisper-1", "language": "en"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
        "input_audio_noise_reduction": {"type": "far_field"},
        "voice": "marin",
        "speed": 1.1,
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
        "tool_choice": "required",
        "max_output_tokens": 512,
        "tracing": "auto",
        "truncation": "disabled",
        "include": ["item.input_audio_transcription.logprobs"],
        "parallel_tool_calls": False,
    }


def test_audio_formats_and_our_extensions() -> None:
    pcm = update(
        {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}
    )
    assert pcm == {"audio": default_audio()}  # a direction left out is OpenAI's default
    raw: Any = {
        "type": "realtime",
        "audio": {"wire": "binary", "output": {"format": {"type": "audio/opus"}}},
    }
    assert update(raw)["audio"] == {
        "wire": "binary",
        "input": {"format": "pcm16", "rate": 24000},
        "output": {"format": "opus", "rate": 48000},
    }
    semantic = update(
        {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
        }
    )
    assert semantic == {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}
    # null turns either off (OpenAI's reference says so; the SDK's TypedDict has no None)
    nulls: Any = {"turn_detection": None, "transcription": None}
    off = update({"type": "realtime", "audio": {"input": nulls}})
    assert off == {"turn_detection": None, "input_audio_transcription": None}
    assert update({"type": "realtime", "audio": {"output": {"voice": {"id": "voice_1"}}}}) == {
        "voice": {"id": "voice_1"}
    }


def test_our_extensions_pass_as_natively() -> None:
    for event in (
        {"type": "session.event_ack", "server_event_seq": 4},
        {"type": "session.heartbeat"},
        {"type": "session.close", "reason": "bye"},
        {
            "type": "session.resume",
            "session_id": "s",
            "resume_token": "t",
            "last_received_server_event_seq": 3,
        },
        {"type": "input_audio_buffer.append", "audio": AUDIO, "client_event_seq": 7},
        {"type": "response.create", "client_event_seq": 8},
    ):
        assert OPENAI.decode(wire(event)) == event
    assert OPENAI.decode_binary(input_message(5, b"\x01\x02")) == {
        "type": "input_audio_buffer.append",
        "audio": b"\x01\x02",
        "client_event_seq": 5,
    }


def test_a_large_message_decodes_in_steps_to_the_same_event() -> None:
    text = wire({"type": "input_audio_buffer.append", "audio": "A" * (OPENAI.large + 4)})
    steps = OPENAI.decode_steps(text)
    count = 0
    try:
        while True:
            next(steps)
            count += 1
    except StopIteration as done:
        assert done.value == OPENAI.decode(text)
    assert count > 0


def test_the_opening_of_a_new_session_and_of_a_resume() -> None:
    assert OPENAI.opening({"model": ["gpt-realtime"]}, "sk-key") == {
        "type": "session.update",
        "session": defaults("gpt-realtime"),
    }
    assert OPENAI.opening({}, None) == {"type": "session.update", "session": defaults()}
    query = {"resume": ["sess_1"], "last_received_server_event_seq": ["12"]}
    assert OPENAI.opening(query, "tok") == {
        "type": "session.resume",
        "session_id": "sess_1",
        "resume_token": "tok",
        "last_received_server_event_seq": 12,
    }
    assert OPENAI.opening({"resume": ["s"]}, "tok")["last_received_server_event_seq"] == 0


@pytest.mark.parametrize(
    ("query", "bearer", "code", "param"),
    [
        ({"resume": ["s"]}, None, "invalid_resume_token", None),
        (
            {"resume": ["s"], "last_received_server_event_seq": ["-1"]},
            "t",
            "bad_event",
            "last_received_server_event_seq",
        ),
        (
            {"resume": ["s"], "last_received_server_event_seq": ["1e3"]},
            "t",
            "bad_event",
            "last_received_server_event_seq",
        ),
        (
            {"resume": ["s"], "last_received_server_event_seq": [str(1 << 63)]},
            "t",
            "bad_event",
            "last_received_server_event_seq",
        ),
        ({"model": ["m" * 257]}, "k", "bad_event", "model"),
    ],
)
def test_a_bad_opening_query_is_refused(
    query: dict[str, list[str]], bearer: str | None, code: str, param: str | None
) -> None:
    with pytest.raises(ProtocolError) as refused:
        OPENAI.opening(query, bearer)
    assert (refused.value.code, refused.value.param) == (code, param)


def test_the_session_object_written_reads_back_as_the_same_config() -> None:
    config: Event = {
        **defaults("gpt-realtime"),
        "instructions": "hi",
        "voice": "cedar",
        "speed": 1.2,
        "turn_detection": {"type": "server_vad", "threshold": 0.4},
        "input_audio_transcription": {"model": "whisper-1"},
        "input_audio_noise_reduction": None,
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "include": ["item.input_audio_transcription.logprobs"],
    }
    config["audio"]["wire"] = "binary"
    session: Any = to_session(config, "sess_1")
    del session["id"], session["object"]  # OpenAI's own, never a client's to set
    assert update(session) == config


def test_the_sdks_event_models_as_it_sends_them() -> None:
    sent = [
        SessionUpdateEvent(
            type="session.update",
            session=RealtimeSessionCreateRequest(
                type="realtime",
                instructions="be kind",
                audio=RealtimeAudioConfig(
                    input=RealtimeAudioConfigInput(format=AudioPCMU(type="audio/pcmu")),
                    output=RealtimeAudioConfigOutput(voice="ash"),
                ),
            ),
        ),
        InputAudioBufferAppendEvent(type="input_audio_buffer.append", audio=AUDIO),
        ResponseCancelEvent(type="response.cancel"),
    ]
    decoded = [OPENAI.decode(e.to_json(use_api_names=True, exclude_unset=True)) for e in sent]
    assert decoded[0]["session"] == {
        "instructions": "be kind",
        "audio": {
            "wire": "json",
            "input": {"format": "g711_ulaw", "rate": 8000},
            "output": {"format": "pcm16", "rate": 24000},
        },
        "voice": "ash",
    }
    assert decoded[1] == {"type": "input_audio_buffer.append", "audio": AUDIO}
    assert decoded[2] == {"type": "response.cancel"}


def test_a_response_may_name_items_by_reference() -> None:
    event: ResponseCreateEventWithReferencesParam = {
        "type": "response.create",
        "response": {"input": [{"type": "item_reference", "id": "item_1"}]},
    }
    assert OPENAI.decode(wire(event)) == event


def test_a_null_field_of_a_response_is_not_set() -> None:
    # Was: bad_event (response.instructions): LiveKit's generate_reply sends its
    # RealtimeResponseCreateParams with instructions=None set (OpenAI takes it).
    params = RealtimeResponseCreateParams(
        instructions=None,  # as LiveKit builds it
        metadata={"client_event_id": "e1"},
    )
    sent = ResponseCreateEvent(type="response.create", event_id="e1", response=params)
    text = sent.to_json(use_api_names=True, exclude_unset=True)
    assert json.loads(text)["response"]["instructions"] is None
    assert OPENAI.decode(text) == {
        "type": "response.create",
        "event_id": "e1",
        "response": {"metadata": {"client_event_id": "e1"}},
    }
    nulls = {key: None for key in ("instructions", "metadata", "prompt", "tools", "audio")}
    decoded = OPENAI.decode(wire({"type": "response.create", "response": nulls}))
    assert decoded == {"type": "response.create", "response": {}}
    with pytest.raises(ProtocolError) as caught:  # an unknown field is refused, null or not
        OPENAI.decode(wire({"type": "response.create", "response": {"x": None}}))
    assert caught.value.param == "response.x"


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"audio": 5}, "bad_event", "audio"),
        ({"audio": "AAAA", "voice": "x"}, "bad_event", "voice"),
        ({"audio": "AAAA", "event_id": 5}, "bad_event", "event_id"),
        ({"audio": "AAAA", "event_id": None}, None, None),
        ({"audio": "AAAA", "event_id": "e1", "client_event_seq": 3}, None, None),
    ],
)
def test_an_append_takes_the_quick_path_only_when_valid(
    fields: dict[str, Any], code: str | None, param: str | None
) -> None:
    message = json.dumps({"type": "input_audio_buffer.append", **fields})
    if code is None:
        assert OPENAI.decode(message) == json.loads(message)
        return
    with pytest.raises(ProtocolError) as caught:
        OPENAI.decode(message)
    assert (caught.value.code, caught.value.param) == (code, param)
