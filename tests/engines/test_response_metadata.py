"""A ``response.create``'s ``metadata`` comes back in its ``response.created`` (LiveKit
matches its ``generate_reply`` by it), from every built-in engine, across a migration
too; snapshots from before it restore."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from trio_duplex.engines.api import BadEvent, Event
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.speech._snapshot import State
from trio_duplex.engines.voice import VoiceEngine

from ..speech_audio import needs_speech
from .test_conversation import OPENAI, running, user_text
from .test_speech_conversation import ended, talk

META = {"client_event_id": "e1"}
ASK: Event = {"type": "response.create", "response": {"metadata": META}}


def created_of(events: list[Event]) -> Event:
    [created] = [e for e in events if e["type"] == "response.created"]
    return created


async def test_echo_carries_the_metadata_back(autojump_clock: trio.testing.MockClock) -> None:
    # Was: response.created {response_id, output_modalities} alone.
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hi"))
        await h.put_event(dict(ASK))
        await h.put("response.create")  # none asked: none carried
        first, second = [e for e in h.take() if e["type"] == "response.created"]
    assert first == {"type": "response.created", "response_id": "resp_1",
                     "output_modalities": ["text"], "metadata": META}  # fmt: skip
    assert "metadata" not in second


async def test_echo_carries_it_across_a_migration() -> None:
    engine = EchoEngine(OPENAI)
    engine.conversation.take(user_text("hi"))
    engine._start(dict(ASK))
    state = json.loads(json.dumps(engine.snapshot()))
    fresh = EchoEngine(OPENAI)
    fresh.restore(state)
    assert fresh._response is not None and fresh._response["metadata"] == META
    del state["response"]["metadata"]  # a snapshot from before responses carried it
    fresh.restore(state)
    assert fresh._response is not None and fresh._response["metadata"] is None
    with pytest.raises(ValueError, match="metadata"):
        fresh.restore(state | {"response": state["response"] | {"metadata": [1]}})


async def test_voice_carries_the_metadata_back_across_a_migration(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = VoiceEngine(OPENAI)
    async with running(engine, dict(OPENAI)) as h:
        await h.put_event(user_text("hello world"))
        await h.put_event(dict(ASK))  # speaking this one
        await h.put_event({"type": "response.create", "response": {"metadata": {"n": "2"}}})
        await trio.sleep(0.05)
        assert created_of(h.events)["metadata"] == META
        state = json.loads(json.dumps(engine.snapshot()))
    assert state["speaking"]["metadata"] == META
    assert state["queued"][0]["metadata"] == {"n": "2"}
    fresh = VoiceEngine(OPENAI)
    fresh.restore(state)
    async with running(fresh, dict(OPENAI)) as h:
        await trio.sleep(5)
        created = created_of(h.events)
    assert (created["response_id"], created["metadata"]) == ("resp_2", {"n": "2"})
    del state["queued"][0]["metadata"], state["speaking"]["metadata"]  # older snapshots
    fresh.restore(state)
    assert fresh.snapshot()["queued"][0] == {"text": "hello world", "output_modalities": ["audio"]}


def test_metadata_is_checked_as_openai_bounds_it() -> None:
    engine = EchoEngine(OPENAI)
    for metadata in ([1], {"k": 1}, {str(i): "v" for i in range(17)}, {"k" * 65: "v"}):
        with pytest.raises(BadEvent) as caught:
            engine.check({"type": "response.create", "response": {"metadata": metadata}})
        assert caught.value.param == "response.metadata"
    engine.check({"type": "response.create", "response": {"metadata": None}})


def test_the_speech_snapshot_keeps_metadata_and_reads_older_ones() -> None:
    state: dict[str, Any] = {
        "state": "speech/2", "audio": "", "audio_at_ms": 0, "turn_started": False,
        "turn_words": [], "history": [], "responses": 1, "talk": {},
        "queued": ["typed", {"transcript": "asked", "metadata": META}],
        "speaking": {"response_id": "resp_1", "transcript": "t", "created": True,
                     "finished": False, "cancelled": False, "said": [], "metadata": META},
    }  # fmt: skip
    read = State.read(state)
    assert json.loads(json.dumps(read.write())) == state
    assert read.speaking is not None and read.speaking.metadata == META
    del state["speaking"]["metadata"]
    state["queued"] = ["typed"]
    older = State.read(state)
    assert older.speaking is not None and older.speaking.metadata is None
    for bad in ({"transcript": "x"}, {"transcript": "x", "metadata": [1]}, 3):
        with pytest.raises(ValueError, match="snapshot"):
            State.read(state | {"queued": [bad]})


@needs_speech
async def test_speech_carries_the_metadata_back() -> None:
    config = {"output_modalities": ["text"], "turn_detection": None}
    outputs = await talk(config, [user_text("hello"), dict(ASK)], ended)
    assert created_of(outputs)["metadata"] == META
