"""The speech engine's conversation: its detected turns announced as items (a conversing
session), and with ``turn_detection: null`` turns that are the client's commits (real
recognition and synthesis, real time: its subprocesses do not run on a MockClock)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
import trio

from trio_duplex.dialects.openai.config import defaults
from trio_duplex.engines.api import EngineSession, Event, Inbox
from trio_duplex.engines.speech import SpeechEngine
from trio_duplex.engines.speech._snapshot import Asked, State
from trio_duplex.testing.transcripts import normalise

from ..speech_audio import DOOR, frames, needs_speech, spoken
from .migration import Client, Cut, Node
from .test_openai_shapes import check_all


async def talk(
    config: dict[str, Any], inputs: list[Event], until: Callable[[list[Event]], bool]
) -> list[Event]:
    """Run a speech engine on ``inputs`` (checked and queued as the reader would) until
    ``until(outputs)``; then a list of what it sent."""
    engine = SpeechEngine(config)
    inbox = Inbox(10_000)
    outputs: list[Event] = []
    changed = trio.lowlevel.ParkingLot()

    async def emit(event: Event) -> None:
        outputs.append(event)
        changed.unpark_all()

    session = EngineSession("sess_talk", config, inbox=inbox, emit=emit)
    for event in inputs:
        engine.check(event)
        inbox.put_nowait(event)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run, session)
            while not until(outputs):
                await changed.park()
            nursery.cancel_scope.cancel()
    return outputs


def ended(outputs: list[Event]) -> bool:
    return any(e["type"] in ("response.done", "response.cancelled") for e in outputs)


def kinds(outputs: list[Event]) -> list[str]:
    skip = {"input_audio.transcript.delta", "response.output_audio.delta",
            "response.output_text.delta"}  # fmt: skip
    return [e["type"] for e in outputs if e["type"] not in skip]


def audio(pcm: bytes) -> list[Event]:
    return [{"type": "input_audio_buffer.append", "audio": f} for f in frames(pcm)]


@needs_speech
async def test_a_detected_turn_is_an_item_answered_at_once() -> None:
    outputs = await talk({"output_modalities": ["audio"]}, audio(spoken(DOOR)), ended)
    assert kinds(outputs) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "input_audio.transcript.done",
        "conversation.item.done",
        "response.created",
        "response.done",
    ]
    by = {e["type"]: e for e in outputs}
    item_id = by["input_audio_buffer.speech_started"]["item_id"]
    assert item_id.startswith("item_")
    named = ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "input_audio.transcript.done")  # fmt: skip
    assert {by[k].get("item_id") for k in named} == {item_id}
    done = by["conversation.item.done"]["item"]
    assert done["id"] == item_id and done["status"] == "completed"
    assert "door" in normalise(done["content"][0]["transcript"])
    assert by["response.created"]["output_modalities"] == ["audio"]
    assert any(e["type"] == "response.output_audio.delta" for e in outputs)
    # Through the OpenAI dialect's shaper, every frame is one the SDK reads.
    assert "response.done" in check_all(defaults(), outputs)


@needs_speech
async def test_without_turn_detection_a_commit_is_the_turn_and_create_answers_it() -> None:
    config: dict[str, Any] = {"turn_detection": None}
    inputs = [*audio(spoken(DOOR)), {"type": "input_audio_buffer.commit"}]
    outputs = await talk(config, inputs, lambda o: "conversation.item.done" in kinds(o))
    assert kinds(outputs) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "input_audio.transcript.done",
        "conversation.item.done",
    ]  # no speech_started, and no response until response.create
    transcript = outputs[-1]["item"]["content"][0]["transcript"]
    assert "door" in normalise(transcript) and outputs[2]["text"] == transcript
    answered = await talk(config, [*inputs, {"type": "response.create"}], ended)
    assert kinds(answered)[-2:] == ["response.created", "response.done"]
    said = "".join(e["text"] for e in answered if e["type"] == "response.output_text.delta")
    assert "door" in normalise(said)


@needs_speech
def test_a_speech_1_snapshot_restores_and_a_bad_talk_is_refused() -> None:
    state = SpeechEngine().snapshot()
    assert state["state"] == "speech/2"
    old = {k: v for k, v in state.items() if k != "talk"} | {"state": "speech/1"}
    engine = SpeechEngine()
    engine.restore(old)  # (before the conversation: restored with an empty one)
    assert engine.snapshot() == state
    for bad in ({"talk": None}, {"talk": {**state["talk"], "heard": [1]}}):
        with pytest.raises(ValueError, match="speech snapshot"):
            SpeechEngine().restore(state | bad)
    talk = state["talk"] | {"heard": ["open"], "partial": "the do", "turn_item": "item_x"}
    engine.restore(state | {"talk": talk})
    assert engine.snapshot()["talk"] == talk


async def converse_in(config: dict[str, Any], pcm: bytes, cuts: list[Cut]) -> list[Event]:
    """Speak ``pcm`` to a speech engine in a session of ``config``, migrating it at each
    cut, until its response ends (test_speech.converse, for a conversing session)."""
    client = Client(deque((0, {"type": "input_audio_buffer.append", "audio": f})
                          for f in frames(pcm)), {})  # fmt: skip
    engine = SpeechEngine(config)

    async def stop_at_the_end(stop: trio.CancelScope) -> None:
        while not ended(client.outputs):
            await client.progress.park()
        stop.cancel()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.feed)
            for cut in [*cuts, None]:
                with trio.CancelScope() as stop:
                    node = Node("sess_mig", config, Inbox(1), _never, client=client,
                                stop=stop, cut=cut)  # fmt: skip
                    if cut is None:
                        nursery.start_soon(stop_at_the_end, stop)
                    await engine.run(node)
                if cut is None:
                    break
                state = json.loads(json.dumps(engine.snapshot()))
                engine = SpeechEngine(config)
                engine.restore(state)
            nursery.cancel_scope.cancel()
    return client.outputs


async def _never(event: Event) -> None:
    raise AssertionError("Node.send records events itself")


@needs_speech
@pytest.mark.parametrize("where", ["input_audio_buffer.committed", "conversation.item.added"])
async def test_a_turn_announced_is_migrated_mid_announcement_with_nothing_lost(where: str) -> None:
    config = {"output_modalities": ["audio"]}
    pcm = spoken(DOOR)
    whole = await converse_in(config, pcm, [])
    n = 1 + [e["type"] for e in whole].index(where)
    migrated = await converse_in(config, pcm, [Cut("send", n, after=True)])
    assert kinds(migrated) == kinds(whole)
    ids = {e.get("item_id") or e.get("item", {}).get("id") for e in migrated
           if e["type"].startswith(("input_audio", "conversation"))}  # fmt: skip
    assert len(ids) == 1 and None not in ids  # one turn, one item, named alike throughout


@needs_speech
async def test_a_text_only_session_gets_the_reply_written_not_spoken() -> None:
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "open the door"}]}  # fmt: skip
    inputs: list[Event] = [
        {"type": "conversation.item.create", "item": item},
        {"type": "response.create"},
    ]
    outputs = await talk({"output_modalities": ["text"]}, inputs, ended)
    assert kinds(outputs) == [
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "response.done",
    ]
    assert outputs[2]["output_modalities"] == ["text"]
    said = [e["text"] for e in outputs if e["type"] == "response.output_text.delta"]
    assert "".join(said) == "you said: open the door."
    assert not any(e["type"] == "response.output_audio.delta" for e in outputs)


@needs_speech
async def test_a_commit_mid_turn_commits_the_item_speech_started_named() -> None:
    pcm = spoken(DOOR)
    cut = 48_000  # 1.5 s: half a second of silence, then a second of the sentence
    inputs = [*audio(pcm[:cut]), {"type": "input_audio_buffer.commit"}, *audio(pcm[cut:])]
    outputs = await talk(
        {"output_modalities": ["audio"]}, inputs, lambda o: "conversation.item.done" in kinds(o)
    )
    assert kinds(outputs) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "input_audio.transcript.done",
        "conversation.item.done",
    ]  # the client's commit ended the turn: no speech_stopped, no response by itself
    assert outputs[0]["item_id"] == outputs[-1]["item"]["id"]


def typed(text: str) -> Event:
    content = [{"type": "input_text", "text": text}]
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": content}}  # fmt: skip


@needs_speech
async def test_a_response_asked_for_text_is_written_in_an_audio_session() -> None:
    # Was: spoken (response.created naming ["audio"]): only the session's modalities counted.
    ask = {"type": "response.create", "response": {"output_modalities": ["text"]}}
    outputs = await talk({"output_modalities": ["audio"]}, [typed("open the door"), ask], ended)
    created = next(e for e in outputs if e["type"] == "response.created")
    assert created["output_modalities"] == ["text"]
    said = [e["text"] for e in outputs if e["type"] == "response.output_text.delta"]
    assert "".join(said) == "you said: open the door."
    assert not any(e["type"] == "response.output_audio.delta" for e in outputs)
    assert "response.done" in check_all(defaults(), outputs)  # as OpenAI's SDK reads it


@needs_speech
async def test_a_response_asked_for_audio_is_spoken_in_a_text_session() -> None:
    ask = {"type": "response.create", "response": {"output_modalities": ["audio"]}}
    outputs = await talk({"output_modalities": ["text"]}, [typed("open the door"), ask], ended)
    created = next(e for e in outputs if e["type"] == "response.created")
    assert created["output_modalities"] == ["audio"]
    assert any(e["type"] == "response.output_audio.delta" for e in outputs)
    assert "response.done" in check_all(defaults() | {"output_modalities": ["text"]}, outputs)


def test_the_speech_snapshot_keeps_a_response_s_own_modalities_and_reads_older_ones() -> None:
    state: dict[str, Any] = {
        "state": "speech/2", "audio": "", "audio_at_ms": 0, "turn_started": False,
        "turn_words": [], "history": [], "responses": 1, "talk": {},
        "queued": [{"transcript": "asked", "metadata": None, "modalities": ["text"]}],
        "speaking": {"response_id": "resp_1", "transcript": "t", "created": True,
                     "finished": False, "cancelled": False, "said": [], "metadata": None,
                     "modalities": ["audio"]},
    }  # fmt: skip
    read = State.read(state)
    assert json.loads(json.dumps(read.write())) == state
    assert read.queued == (Asked("asked", None, ("text",)),)
    assert read.speaking is not None and read.speaking.modalities == ("audio",)
    del state["speaking"]["modalities"]  # as written before responses had their own
    older = State.read(state)
    assert older.speaking is not None and older.speaking.modalities is None
    assert "modalities" not in older.write()["speaking"]
    for bad in ({"transcript": "x", "metadata": None}, {"transcript": "x", "metadata": None,
                "modalities": ["text", "audio"]}):  # fmt: skip
        with pytest.raises(ValueError, match="snapshot"):
            State.read(state | {"queued": [bad]})
