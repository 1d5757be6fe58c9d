"""The shaper: an engine's compact events become OpenAI's full response structure, each
event valid to the SDK; its state survives JSON and continues identically."""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.realtime import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    ConversationItemInputAudioTranscriptionFailedEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    RealtimeConversationItemAssistantMessage,
    ResponseDoneEvent,
    SessionUpdatedEvent,
)

from trio_duplex.core import events
from trio_duplex.core.conversation import assistant_item_id
from trio_duplex.dialects.jsonwire import encode
from trio_duplex.dialects.openai import OPENAI, OpenAIShaper
from trio_duplex.dialects.openai.config import defaults
from trio_duplex.dialects.openai.shaper import MAX_OPEN, MAX_TEXT

from .reference import shaped_frames, validate

Event = dict[str, Any]


def response(rid: str, *, audio: bool, end: Event | None = None) -> list[Event]:
    created: Event = {"type": "response.created", "response_id": rid}
    if audio:
        created["output_modalities"] = ["audio"]
    body: list[Event] = [
        created,
        {"type": "response.output_text.delta", "response_id": rid, "text": "Hel"},
    ]
    if audio:
        body.append(
            {"type": "response.output_audio.delta", "response_id": rid, "audio": b"\x01\x00" * 8}
        )
    body.append({"type": "response.output_text.delta", "response_id": rid, "text": "lo"})
    body.append(end or {"type": "response.done", "response_id": rid})
    return body


TEXT_TYPES = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
AUDIO_TYPES = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def test_a_text_response_is_openais_structure_event_by_event() -> None:
    frames = shaped_frames(OPENAI.shaper(defaults()), response("resp_1", audio=False))
    models = [validate(f) for f in frames]
    assert [m.type for m in models] == TEXT_TYPES
    item_id = assistant_item_id("resp_1")
    assert models[4].delta == "Hel" and models[4].item_id == item_id
    assert models[6].text == "Hello"
    assert models[7].part.type == "text" and models[7].part.text == "Hello"
    done = models[-1]
    assert isinstance(done, ResponseDoneEvent)
    assert done.response.status == "completed" and done.response.id == "resp_1"
    assert done.response.output_modalities == ["text"]
    assert done.response.usage is not None and done.response.usage.total_tokens == 0
    [item] = done.response.output or []
    assert isinstance(item, RealtimeConversationItemAssistantMessage)
    assert item.id == item_id and item.status == "completed"
    assert [(c.type, c.text) for c in item.content] == [("output_text", "Hello")]
    # each journaled event's id is its seq: the same text is journaled and replayed
    assert [m.event_id for m in models] == [f"event_{n}" for n in range(1, len(models) + 1)]


def test_an_audio_response_carries_its_text_as_the_transcript() -> None:
    frames = shaped_frames(OPENAI.shaper(defaults()), response("resp_2", audio=True))
    models = [validate(f) for f in frames]
    assert [m.type for m in models] == AUDIO_TYPES
    audio = models[5]
    assert base64.b64decode(audio.delta) == b"\x01\x00" * 8
    assert audio.item_id == "item_resp_2"
    assert json.loads(frames[5])["server_event_seq"] == 6
    assert models[8].transcript == "Hello"
    assert models[9].part.type == "audio" and models[9].part.transcript == "Hello"
    done = models[-1]
    assert done.response.output_modalities == ["audio"]
    [item] = done.response.output or []
    assert [(c.type, c.transcript) for c in item.content] == [("output_audio", "Hello")]


@pytest.mark.parametrize(
    ("end", "status", "details"),
    [
        ({"type": "response.done", "status": "completed"}, "completed", None),
        ({"type": "response.done", "status": "incomplete"}, "incomplete", ("incomplete", None)),
        (
            {"type": "response.done", "status": "incomplete", "reason": "max_output_tokens"},
            "incomplete",
            ("incomplete", "max_output_tokens"),
        ),
        ({"type": "response.done", "status": "failed"}, "failed", ("failed", None)),
        ({"type": "response.cancelled"}, "cancelled", ("cancelled", "client_cancelled")),
        (
            {"type": "response.cancelled", "reason": "turn_detected"},
            "cancelled",
            ("cancelled", "turn_detected"),
        ),
    ],
)
def test_each_end_gives_its_status(
    end: Event, status: str, details: tuple[str, str | None] | None
) -> None:
    end = {**end, "response_id": "resp_3"}
    frames = shaped_frames(OPENAI.shaper(defaults()), response("resp_3", audio=True, end=end))
    models = [validate(f) for f in frames]
    assert [m.type for m in models] == AUDIO_TYPES  # the same closing events every time
    done = models[-1].response
    assert done.status == status
    item_status = "completed" if status == "completed" else "incomplete"
    assert models[-3].item.status == models[-2].item.status == item_status
    assert done.output[0].status == item_status
    if details is None:
        assert done.status_details is None
    else:
        assert (done.status_details.type, done.status_details.reason) == details
        if status == "failed":
            assert done.status_details.error.type == "server_error"


def test_a_response_the_engine_never_announced_is_opened_by_its_first_delta() -> None:
    shaper = OPENAI.shaper(defaults())
    frames = shaped_frames(
        shaper,
        [
            {"type": "response.output_audio.delta", "response_id": "r", "audio": b"\0\0"},
            {"type": "response.done", "response_id": "r"},
        ],
    )
    types = [validate(f).type for f in frames]
    assert types[:5] == [*AUDIO_TYPES[:4], "response.output_audio.delta"]
    assert types[-1] == "response.done"


def test_events_in_openais_shape_already_pass_through() -> None:
    shaper = OPENAI.shaper(defaults())
    full = {"type": "response.created", "response": {"id": "r", "object": "realtime.response"}}
    delta = {
        "type": "response.output_text.delta",
        "response_id": "r",
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
        "delta": "x",
    }
    custom = {"type": "upstream.thing", "x": 1}
    for event in (full, delta, custom):
        assert shaper.shape(event) == [event]
    assert shaper.state()["open"] == []


def test_turns_and_transcripts_get_openais_names_and_ids() -> None:
    shaper = OPENAI.shaper(defaults())
    frames = shaped_frames(
        shaper,
        [
            {"type": "input_audio_buffer.speech_started", "audio_start_ms": 100},
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900},
            {"type": "input_audio_buffer.committed", "item_id": "item_u1"},
            {"type": "input_audio.transcript.delta", "text": "hel"},
            {"type": "input_audio.transcript.done", "text": "hello", "item_id": "item_u1"},
            {"type": "input_audio_buffer.cleared"},
        ],
    )
    started, stopped, committed, delta, done, cleared = (validate(f) for f in frames)
    assert isinstance(started, InputAudioBufferSpeechStartedEvent)
    assert isinstance(stopped, InputAudioBufferSpeechStoppedEvent)
    assert started.item_id == stopped.item_id  # one item heard, named before its commit
    assert started.audio_start_ms == 100 and stopped.audio_end_ms == 900
    assert isinstance(committed, InputAudioBufferCommittedEvent)
    assert committed.item_id == "item_u1"
    assert isinstance(delta, ConversationItemInputAudioTranscriptionDeltaEvent)
    assert (delta.item_id, delta.delta, delta.content_index) == ("item_u1", "hel", 0)
    assert isinstance(done, ConversationItemInputAudioTranscriptionCompletedEvent)
    assert (done.item_id, done.transcript) == ("item_u1", "hello")
    assert cleared.type == "input_audio_buffer.cleared"


def test_a_failed_transcription_gets_openais_name_its_item_and_error() -> None:
    # Was: passed through with its native name, which OpenAI's SDK does not read.
    shaper = OPENAI.shaper(defaults())
    error = {"type": "transcription_failed", "message": "the recogniser died"}
    frames = shaped_frames(
        shaper,
        [
            {"type": "input_audio_buffer.committed", "item_id": "item_u2"},
            {"type": "input_audio.transcript.failed", "item_id": "item_u2", "error": error},
            {"type": "input_audio.transcript.failed", "error": error},  # (no item named)
        ],
    )
    _, failed, unnamed = (validate(f) for f in frames)
    for model in (failed, unnamed):
        assert isinstance(model, ConversationItemInputAudioTranscriptionFailedEvent)
        assert (model.item_id, model.content_index) == ("item_u2", 0)
        assert (model.error.type, model.error.message) == (error["type"], error["message"])


def test_session_updated_is_the_full_session_from_the_live_config() -> None:
    config = defaults("gpt-realtime")
    shaper = OPENAI.shaper(config)
    config.update(
        {
            "instructions": "be brief",
            "voice": "marin",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
        }
    )
    [out] = shaper.shape(events.updated("sess_9", {"instructions": "be brief"}))
    out["server_event_seq"] = 3
    model = validate(OPENAI.frame(out))
    assert isinstance(model, SessionUpdatedEvent)
    session: Any = model.session
    assert session.type == "realtime" and session.model == "gpt-realtime"
    assert session.instructions == "be brief"
    assert session.audio.output.voice == "marin"
    assert session.audio.input.turn_detection.silence_duration_ms == 400
    assert (
        session.audio.input.format.type == "audio/pcm" and session.audio.input.format.rate == 24000
    )
    assert session.model_extra == {"object": "realtime.session", "id": "sess_9"}


def test_state_round_trips_through_json_mid_response() -> None:
    engine = [
        *response("resp_5", audio=True),
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 5, "item_id": "item_u"},
        {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 9},
        {"type": "input_audio_buffer.committed"},
        {"type": "input_audio.transcript.done", "text": "hi"},
    ]
    whole = shaped_frames(OPENAI.shaper(defaults()), engine)
    for cut in range(len(engine) + 1):
        first = OPENAI.shaper(defaults())
        before = shaped_frames(first, engine[:cut])
        state = json.loads(json.dumps(first.state()))
        second = OPENAI.restore_shaper(defaults(), state)
        after = shaped_frames(second, engine[cut:], seq=len(before))
        assert before + after == whole, cut


def test_a_restore_continues_the_heard_item() -> None:
    first = OPENAI.shaper(defaults())
    [started] = first.shape({"type": "input_audio_buffer.speech_started", "audio_start_ms": 1})
    second = OpenAIShaper.restore(defaults(), json.loads(json.dumps(first.state())))
    [stopped] = second.shape({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2})
    assert stopped["item_id"] == started["item_id"]
    second.shape({"type": "input_audio_buffer.committed"})
    third = OpenAIShaper.restore(defaults(), json.loads(json.dumps(second.state())))
    [transcript] = third.shape({"type": "input_audio.transcript.done", "text": "hi"})
    assert transcript["item_id"] == started["item_id"]  # the transcript of the item committed


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        {"state": "openai-shaper/0", "open": []},
        {"state": "openai-shaper/1", "open": {}},
        {"state": "openai-shaper/1", "open": [["r", "yes", ""]]},
        {"state": "openai-shaper/1", "open": [["r", True]]},
        {"state": "openai-shaper/1", "open": [["r", True, ""]] * (MAX_OPEN + 1)},
        {"state": "openai-shaper/1", "open": [], "heard": 5},
    ],
)
def test_a_bad_state_is_refused(state: Any) -> None:
    with pytest.raises(ValueError, match="shaper"):
        OPENAI.restore_shaper(defaults(), state)


def test_open_responses_are_bounded() -> None:
    shaper = OPENAI.shaper(defaults())
    for n in range(MAX_OPEN + 5):
        shaper.shape({"type": "response.created", "response_id": f"r{n}"})
    assert [entry[0] for entry in shaper.state()["open"]] == [
        f"r{n}" for n in range(5, MAX_OPEN + 5)
    ]


RIDS = st.sampled_from(["resp_a", "resp_b", "resp_c"])
ENGINE_EVENTS = st.one_of(
    st.builds(
        lambda rid, audio: {
            "type": "response.created",
            "response_id": rid,
            **({"output_modalities": ["audio"]} if audio else {}),
        },
        RIDS,
        st.booleans(),
    ),
    st.builds(
        lambda rid, text: {"type": "response.output_text.delta", "response_id": rid, "text": text},
        RIDS,
        st.text(max_size=5),
    ),
    st.builds(
        lambda rid, audio: {
            "type": "response.output_audio.delta",
            "response_id": rid,
            "audio": audio,
        },
        RIDS,
        st.binary(min_size=2, max_size=8),
    ),
    st.builds(
        lambda rid, status: {"type": "response.done", "response_id": rid, "status": status},
        RIDS,
        st.sampled_from(["completed", "incomplete", "failed"]),
    ),
    st.builds(lambda rid: {"type": "response.cancelled", "response_id": rid}, RIDS),
    st.builds(
        lambda item: {
            "type": "input_audio_buffer.speech_started",
            "audio_start_ms": 0,
            "item_id": item,
        },
        st.sampled_from(["item_1", "item_2"]),
    ),
    st.just({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 10}),
    st.just({"type": "input_audio_buffer.committed"}),
    st.builds(
        lambda done, text: {
            "type": "input_audio.transcript." + ("done" if done else "delta"),
            "text": text,
        },
        st.booleans(),
        st.text(max_size=5),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(ENGINE_EVENTS, max_size=14), st.data())
def test_any_engine_sequence_is_valid_openai_and_survives_a_migration(
    engine: list[Event], data: st.DataObject
) -> None:
    # (the first user item heard is named by the engine: no random id to compare)
    engine = [
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "u"},
        *engine,
    ]
    whole = shaped_frames(OPENAI.shaper(defaults()), [dict(e) for e in engine])
    for frame in whole:
        validate(frame)
    cut = data.draw(st.integers(0, len(engine)))
    first = OPENAI.shaper(defaults())
    before = shaped_frames(first, [dict(e) for e in engine[:cut]])
    second = OPENAI.restore_shaper(defaults(), json.loads(json.dumps(first.state())))
    after = shaped_frames(second, [dict(e) for e in engine[cut:]], len(before))
    assert _named(before + after) == _named(whole)


def _named(frames: list[str]) -> list[str]:
    """Fresh item ids (random) renamed by order of appearance: a restore must reuse the
    ones it knew, and may make new ones only where the first run did."""
    names: dict[str, str] = {}
    return [
        re.sub(r"item_[0-9a-f]{24}", lambda m: names.setdefault(m[0], f"item#{len(names)}"), f)
        for f in frames
    ]


def test_the_text_kept_is_bounded() -> None:
    shaper = OPENAI.shaper(defaults())
    chunk = "x" * (MAX_TEXT // 2 + 1)
    for _ in range(3):
        [delta] = shaper.shape(
            {"type": "response.output_text.delta", "response_id": "r0", "text": chunk}
        )[-1:]
        assert json.loads(OPENAI.frame(delta))["delta"] == chunk  # every delta goes out whole
    [[_, _, kept]] = shaper.state()["open"]
    assert len(kept) == MAX_TEXT
    done = shaper.shape({"type": "response.done", "response_id": "r0"})
    assert len(json.loads(OPENAI.frame(done[0]))["text"]) == MAX_TEXT
    with pytest.raises(ValueError, match="too long"):
        OPENAI.restore_shaper(
            defaults(), {"state": "openai-shaper/1", "open": [["r", False, "x" * (MAX_TEXT + 1)]]}
        )


def test_a_responses_metadata_is_in_its_created_and_done_across_a_migration() -> None:
    # Was: never written (LiveKit matches its generate_reply's response by it).
    meta = {"client_event_id": "e1"}
    engine = response("resp_1", audio=True)
    engine[0] = engine[0] | {"metadata": meta}
    whole = shaped_frames(OPENAI.shaper(defaults()), engine)
    models = [validate(f) for f in whole]
    assert models[0].type == "response.created" and models[0].response.metadata == meta
    assert isinstance(models[-1], ResponseDoneEvent) and models[-1].response.metadata == meta
    for cut in range(1, len(engine)):
        first = OPENAI.shaper(defaults())
        before = shaped_frames(first, engine[:cut])
        state = json.loads(json.dumps(first.state()))
        after = shaped_frames(OPENAI.restore_shaper(defaults(), state), engine[cut:], len(before))
        assert before + after == whole, cut
    plain = shaped_frames(OPENAI.shaper(defaults()), response("resp_2", audio=False))
    assert "metadata" not in json.loads(plain[0])["response"]
    entry: list[Any] = ["resp_3", False, "x"]
    old = {"state": "openai-shaper/1", "open": [entry]}  # before responses had metadata
    [*_, shaped] = OPENAI.restore_shaper(defaults(), old).shape(
        {"type": "response.done", "response_id": "resp_3"}
    )
    done = json.loads(OPENAI.frame(shaped))
    assert "metadata" not in done["response"] and done["response"]["output"][0]["id"]
    with pytest.raises(ValueError, match="shaper"):
        OPENAI.restore_shaper(defaults(), {"state": "openai-shaper/1", "open": [[*entry, [1]]]})


def _reference(
    rid: str, audio: bool, texts: list[str], meta: dict[str, str] | None, end: Event
) -> list[Event]:
    """A response's events as dicts, written out from OpenAI's shapes: what the shaper's
    pre-encoded texts must be, byte for byte."""
    iid = assistant_item_id(rid)
    where = {"response_id": rid, "item_id": iid, "output_index": 0, "content_index": 0}
    mods = ["audio"] if audio else ["text"]
    body: Event = {
        "id": rid, "object": "realtime.response", "status": "in_progress", "output": [],
        "output_modalities": mods, **({} if meta is None else {"metadata": meta}),
    }  # fmt: skip
    item: Event = {"id": iid, "object": "realtime.item", "type": "message",
                   "role": "assistant", "status": "in_progress", "content": []}  # fmt: skip
    empty = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
    out: list[Event] = [
        {"type": "response.created", "response": body},
        {"type": "response.output_item.added", "response_id": rid, "output_index": 0,
         "item": item},
        {"type": "conversation.item.added", "item": item},
        {"type": "response.content_part.added", **where, "part": empty},
    ]  # fmt: skip
    delta = "response.output_audio_transcript.delta" if audio else "response.output_text.delta"
    out += [{"type": delta, **where, "delta": t} for t in texts]
    whole = "".join(texts)
    if audio:
        out.append({"type": "response.output_audio.done", **where})
        out.append({"type": "response.output_audio_transcript.done", **where, "transcript": whole})
        part = {"type": "audio", "transcript": whole}
        content = {"type": "output_audio", "transcript": whole}
    else:
        out.append({"type": "response.output_text.done", **where, "text": whole})
        part = {"type": "text", "text": whole}
        content = {"type": "output_text", "text": whole}
    status = "cancelled" if end["type"] == "response.cancelled" else end.get("status", "completed")
    done = {**item, "status": "completed" if status == "completed" else "incomplete",
            "content": [content]}  # fmt: skip
    out.append({"type": "response.content_part.done", **where, "part": part})
    out.append({"type": "response.output_item.done", "response_id": rid, "output_index": 0,
                "item": done})  # fmt: skip
    out.append({"type": "conversation.item.done", "item": done})
    usage = {"total_tokens": 0, "input_tokens": 0, "output_tokens": 0,
             "input_token_details": {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0},
             "output_token_details": {"text_tokens": 0, "audio_tokens": 0}}  # fmt: skip
    final: Event = {**body, "status": status, "output": [done], "usage": usage}
    if meta is not None:
        final["metadata"] = final.pop("metadata")  # (after usage, as OpenAI's order has it)
    if status != "completed":
        details: Event = {"type": status}
        reason = end.get("reason", "client_cancelled" if status == "cancelled" else None)
        if reason is not None:
            details["reason"] = reason
        if status == "failed":
            details["error"] = {"type": "server_error", "code": end.get("code")}
        final["status_details"] = details
    out.append({"type": "response.done", "response": final})
    return out


_ODD_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=6)  # surrogates


@settings(max_examples=150, deadline=None)
@given(
    rid=_ODD_TEXT.map(lambda t: "resp_" + t),
    audio=st.booleans(),
    texts=st.lists(_ODD_TEXT, max_size=3),
    meta=st.none() | st.dictionaries(_ODD_TEXT, _ODD_TEXT, max_size=2),
    end=st.sampled_from(
        [
            {"type": "response.done"},
            {"type": "response.done", "status": "incomplete", "reason": "max_output_tokens"},
            {"type": "response.done", "status": "failed", "code": "engine_error"},
            {"type": "response.done", "status": "failed", "code": 7},
            {"type": "response.cancelled"},
        ]
    ),
)
def test_the_pre_encoded_events_are_the_dicts_encoded_byte_for_byte(
    rid: str, audio: bool, texts: list[str], meta: dict[str, str] | None, end: Event
) -> None:
    created: Event = {"type": "response.created", "response_id": rid}
    if audio:
        created["output_modalities"] = ["audio"]
    if meta is not None:
        created["metadata"] = meta
    engine = [
        created,
        *({"type": "response.output_text.delta", "response_id": rid, "text": t} for t in texts),
        {**end, "response_id": rid},
    ]
    frames = shaped_frames(OPENAI.shaper(defaults()), engine)
    expected = [
        encode({**event, "server_event_seq": n, "event_id": f"event_{n}"})
        for n, event in enumerate(_reference(rid, audio, texts, meta, end), start=1)
    ]
    assert frames == expected


def test_what_the_templates_do_not_cover_takes_the_dict_path() -> None:
    shaper = OPENAI.shaper(defaults())
    shaper.shape({"type": "response.created", "response_id": "r"})
    [delta] = shaper.shape({"type": "response.output_text.delta", "response_id": "r", "text": 5})
    assert type(delta) is dict and delta["delta"] == 5  # an engine's odd text: as it gave it
    delta["server_event_seq"] = 5
    assert json.loads(OPENAI.frame(delta))["delta"] == 5
    # A failed response whose code JSON cannot write: refused by frame, as before.
    *_, done = shaper.shape(
        {"type": "response.done", "response_id": "r", "status": "failed", "code": math.nan}
    )
    assert done["response"]["status_details"]["error"]["code"] is not None
    done["server_event_seq"] = 9
    with pytest.raises(ValueError):
        OPENAI.frame(done)
    assert shaper.state()["open"] == []


def test_a_shaped_event_framed_unjournaled_gets_an_unjournaled_id() -> None:
    [created, *_] = OPENAI.shaper(defaults()).shape(
        {"type": "response.created", "response_id": "r"}
    )
    data = json.loads(OPENAI.frame(created))
    assert "server_event_seq" not in data and data["event_id"].startswith("event_x")
