"""The conversation events (docs/engines.md, "The conversation"): the store, and the echo
and voice engines answering text turns, audio turns and cancels, driven through an
EngineSession under the mock clock (the events a native client gets as they are)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.engines import conversation as conversation_module
from trio_duplex.engines.api import BadEvent, Engine, EngineSession, Event, Inbox
from trio_duplex.engines.conversation import MAX_PENDING_IDS, Conversation, assistant_item_id
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import FRAME_BYTES, VoiceEngine
from trio_duplex.testing import running_server

from .migration import Script, drive, sweep
from .migration import audio as mig_audio

OPENAI = {"output_modalities": ["audio"]}  # a session that converses (as OpenAI's do)
PCM = bytes(range(256)) * 40  # 10240 bytes of "audio"


def user_text(text: str, **item: Any) -> Event:
    content = [{"type": "input_text", "text": text}]
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": content, **item}}  # fmt: skip


@attrs.define
class Harness:
    engine: Engine
    inbox: Inbox
    events: list[Event] = attrs.Factory(list)

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    async def put(self, kind: str, **fields: Any) -> None:
        await self.put_event({"type": kind, **fields})

    async def put_event(self, event: Event) -> None:
        self.engine.check(event)  # as the connection's reader does, before it queues
        self.inbox.put_nowait(event)
        await trio.testing.wait_all_tasks_blocked()

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def take(self) -> list[Event]:
        got, self.events[:] = list(self.events), []
        return got


@asynccontextmanager
async def running(engine: Engine, config: dict[str, Any]) -> AsyncIterator[Harness]:
    h = Harness(engine, Inbox(100))
    session = EngineSession("sess_test", config, inbox=h.inbox, emit=h.emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run, session)
        await trio.testing.wait_all_tasks_blocked()
        yield h
        nursery.cancel_scope.cancel()


# -- the store ---------------------------------------------------------------------------


def test_create_answers_added_then_done_with_its_id_and_status() -> None:
    conversation = Conversation()
    first = conversation.take(user_text("hi"))
    assert [e["type"] for e in first] == ["conversation.item.added", "conversation.item.done"]
    item = first[1]["item"]
    assert item["id"].startswith("item_") and len(item["id"]) == 5 + 24
    assert item["status"] == "completed" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "hi"}]
    second = conversation.take(user_text("again", id="mine"))
    assert second[0]["previous_item_id"] == item["id"] and second[1]["item"]["id"] == "mine"


def test_previous_item_id_places_the_item() -> None:
    conversation = Conversation()
    for name in ("a", "b"):
        conversation.take(user_text(name, id=name))
    first = conversation.take(user_text("x", id="x") | {"previous_item_id": "root"})
    middle = conversation.take(user_text("y", id="y") | {"previous_item_id": "x"})
    assert "previous_item_id" not in first[0] and middle[0]["previous_item_id"] == "x"
    assert [item["id"] for item in conversation.snapshot()["items"]] == ["x", "y", "a", "b"]
    turn = conversation.latest_user()
    assert turn is not None and turn.item_id == "b"


def test_unknown_item_ids_are_bad_events_naming_item_id() -> None:
    conversation = Conversation()
    for kind in ("retrieve", "delete", "truncate"):
        event = {"type": f"conversation.item.{kind}", "item_id": "item_nope",
                 "content_index": 0, "audio_end_ms": 0}  # fmt: skip
        with pytest.raises(BadEvent) as caught:
            conversation.check(event)
        assert caught.value.param == "item_id"


def test_ids_are_judged_in_queue_order_and_a_refused_event_may_come_again() -> None:
    conversation = Conversation()
    create, delete = user_text("hi", id="a"), {"type": "conversation.item.delete", "item_id": "a"}
    conversation.check(create)  # queued, not yet taken: known to the events after it
    conversation.check({"type": "conversation.item.retrieve", "item_id": "a"})
    conversation.check(create)  # (the first one may have met backpressure: sent again)
    conversation.check(delete)
    conversation.check(delete)  # the same
    conversation.take(create)
    with pytest.raises(BadEvent, match="already"):
        conversation.check(create)  # an item holds it now
    assert conversation.take(delete) == [{"type": "conversation.item.deleted", "item_id": "a"}]
    assert conversation.take(delete) == []  # gone meanwhile: answered with nothing
    with pytest.raises(BadEvent) as caught:
        conversation.check({"type": "conversation.item.retrieve", "item_id": "a"})
    assert caught.value.param == "item_id"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ([], "item"),
        ({"type": "note"}, "item.type"),
        ({"type": "message", "role": "robot", "content": []}, "item.role"),
        ({"type": "message", "role": "user", "content": "hi"}, "item"),
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text"}]},
            "item.content[0].text",
        ),
        (
            {"type": "message", "role": "user", "content": [{"type": "image"}]},
            "item.content[0]",
        ),
        ({"type": "message", "role": "user", "content": [], "id": ""}, "item.id"),
    ],
)
def test_a_malformed_item_is_a_bad_event(item: object, param: str) -> None:
    with pytest.raises(BadEvent) as caught:
        Conversation().check({"type": "conversation.item.create", "item": item})
    assert caught.value.param == param


def test_an_empty_commit_is_refused_and_clear_answers_cleared() -> None:
    conversation = Conversation()
    with pytest.raises(BadEvent, match="empty"):
        conversation.check({"type": "input_audio_buffer.commit"})
    conversation.check({"type": "input_audio_buffer.append", "audio": b"\0\0"})
    conversation.check({"type": "input_audio_buffer.commit"})
    conversation.check({"type": "input_audio_buffer.commit"})  # (a resend, or a second)
    assert conversation.take({"type": "input_audio_buffer.commit"}) == []  # nothing appended
    assert conversation.take({"type": "input_audio_buffer.clear"}) == [
        {"type": "input_audio_buffer.cleared"}
    ]


def test_the_store_is_bounded_in_count_and_bytes() -> None:
    conversation = Conversation(max_items=3, max_bytes=10_000, keep_audio=True)
    for n in range(10):
        conversation.take(user_text(f"turn {n}"))
    assert len(conversation) == 3
    assert conversation.latest_user() is not None
    conversation.append_audio(bytes(6000))
    conversation.commit_audio()
    conversation.append_audio(bytes(6000))
    conversation.commit_audio()  # the older audio goes: 12,000 bytes would not fit
    assert len(conversation) == 1 and conversation.size <= 10_000
    big = Conversation(max_buffer_bytes=100, keep_audio=True)
    big.append_audio(bytes(1000))
    assert len(big.buffer) == 100 and big.buffered == 1000


def test_creates_checked_and_never_taken_are_bounded() -> None:
    conversation = Conversation()
    conversation.take(user_text("kept", id="kept"))
    for n in range(5000):  # each refused after its check (backpressure), never taken
        conversation.check(user_text("x", id=f"ghost{n}"))
    assert len(conversation.snapshot()["checked_ids"]) <= 1 + MAX_PENDING_IDS
    conversation.check({"type": "conversation.item.retrieve", "item_id": "kept"})


def test_a_snapshot_restores_the_same_conversation() -> None:
    conversation = Conversation(keep_audio=True)
    conversation.take(user_text("hi", id="a"))
    conversation.append_audio(b"\1\2")
    conversation.commit_audio()
    conversation.append_audio(b"\3\4")
    state = json.loads(json.dumps(conversation.snapshot()))
    again = Conversation(keep_audio=True)
    again.restore(state)
    assert again.snapshot() == conversation.snapshot()
    turn = again.latest_user()
    assert turn is not None and turn.audio == b"\1\2" and not turn.typed
    with pytest.raises(ValueError, match="snapshot"):
        Conversation().restore(state | {"items": [{"type": "message"}]})


# -- echo --------------------------------------------------------------------------------


async def test_echo_answers_a_text_turn_only_on_response_create(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hello there"))
        added, done = h.take()
        assert (added["type"], done["type"]) == (
            "conversation.item.added",
            "conversation.item.done",
        )
        assert done["item"]["status"] == "completed"
        await trio.sleep(1)
        assert h.events == []  # no response until response.create
        await h.put("response.create")
        assert h.take() == [
            {"type": "response.created", "response_id": "resp_1", "output_modalities": ["text"]},
            {"type": "response.output_text.delta", "response_id": "resp_1", "text": "hello there"},
            {"type": "response.done", "response_id": "resp_1"},
        ]
        await h.put("conversation.item.retrieve", item_id=assistant_item_id("resp_1"))
        [retrieved] = h.take()
        assert retrieved["item"]["role"] == "assistant"
        assert retrieved["item"]["content"] == [{"type": "output_text", "text": "hello there"}]


async def test_echo_answers_a_committed_audio_turn_with_that_audio(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put("input_audio_buffer.append", audio=PCM[:5000])
        await h.put("input_audio_buffer.append", audio=PCM[5000:])
        assert h.events == []  # a conversing session's audio waits for its commit
        await h.put("input_audio_buffer.commit")
        committed, added, done = h.take()
        assert committed["type"] == "input_audio_buffer.committed"
        assert committed["item_id"] == added["item"]["id"] == done["item"]["id"]
        assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
        await h.put("response.create")
        events = h.take()
        assert events[0] == {
            "type": "response.created",
            "response_id": "resp_1",
            "output_modalities": ["audio"],
        }
        assert [e["type"] for e in events[1:-1]] == ["response.output_audio.delta"] * 3
        assert b"".join(e["audio"] for e in events[1:-1]) == PCM
        assert events[-1] == {"type": "response.done", "response_id": "resp_1"}


async def test_echo_native_appends_still_echo_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(EchoEngine({}), {}) as h:
        await h.put("input_audio_buffer.append", audio=b"\1\2")
        await h.put("input.text.append", text="hi")
        assert h.take() == [
            {"type": "response.output_audio.delta", "audio": b"\1\2"},
            {"type": "response.output_text.delta", "text": "hi"},
        ]


async def test_echo_clear_retrieve_truncate_delete(autojump_clock: trio.testing.MockClock) -> None:
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put("input_audio_buffer.append", audio=PCM)
        await h.put("input_audio_buffer.clear")
        assert h.take() == [{"type": "input_audio_buffer.cleared"}]
        await h.put("response.create")  # the cleared audio is no turn
        assert [e["type"] for e in h.take()] == ["response.created", "response.done"]
        await h.put_event(user_text("x", id="u1"))
        h.take()
        await h.put("conversation.item.retrieve", item_id="u1")
        await h.put("conversation.item.truncate", item_id="u1", content_index=0, audio_end_ms=5)
        await h.put("conversation.item.delete", item_id="u1")
        assert [e["type"] for e in h.events] == [
            "conversation.item.retrieved",
            "conversation.item.truncated",
            "conversation.item.deleted",
        ]
        assert h.events[1] == {"type": "conversation.item.truncated", "item_id": "u1",
                               "content_index": 0, "audio_end_ms": 5}  # fmt: skip
        with pytest.raises(BadEvent):
            await h.put("conversation.item.retrieve", item_id="u1")


async def test_echo_migrates_mid_response_and_restores_echo_1(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = EchoEngine(OPENAI)
    engine.conversation.take(user_text("hi"))
    engine._start({"type": "response.create"})
    assert engine._response is not None
    engine._response["created"] = True  # created was sequenced on the last node
    state = json.loads(json.dumps(engine.snapshot()))
    fresh = EchoEngine(OPENAI)
    fresh.restore(state)
    async with running(fresh, dict(OPENAI)) as h:
        assert h.types() == ["response.output_text.delta", "response.done"]
    old = EchoEngine()
    old.restore({"state": "echo/1", "unanswered": {"type": "input.text.append", "text": "a"}})
    async with running(old, {}) as h:
        assert h.events == [{"type": "response.output_text.delta", "text": "a"}]


# -- voice -------------------------------------------------------------------------------


async def test_voice_speaks_a_text_turn_on_response_create(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(VoiceEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hello world"))
        h.take()
        await h.put("response.create")
        await trio.sleep(2)
        events = h.take()
    assert events[0] == {
        "type": "response.created",
        "response_id": "resp_1",
        "output_modalities": ["audio"],
    }
    texts = [e["text"] for e in events if e["type"] == "response.output_text.delta"]
    audio = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert "".join(texts) == "hello world" and len(audio) == 34
    assert all(len(e["audio"]) == FRAME_BYTES for e in audio)
    assert events[-1] == {"type": "response.done", "response_id": "resp_1"}


async def test_voice_with_text_output_sends_no_audio(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(VoiceEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hello world"))
        h.take()
        await h.put("response.create", response={"output_modalities": ["text"]})
        await trio.sleep(2)
        assert h.take() == [
            {"type": "response.created", "response_id": "resp_1", "output_modalities": ["text"]},
            {"type": "response.output_text.delta", "response_id": "resp_1", "text": "hello"},
            {"type": "response.output_text.delta", "response_id": "resp_1", "text": " world"},
            {"type": "response.done", "response_id": "resp_1"},
        ]


async def test_voice_cancel_mid_response_ends_it_with_nothing_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(VoiceEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hello world"))
        await h.put("response.create")
        await trio.sleep(0.1)
        await h.put("response.cancel")
        at = len(h.events)
        await trio.sleep(2)
        assert h.events[at - 1] == {"type": "response.cancelled", "response_id": "resp_1"}
        assert len(h.events) == at  # no output of it after
        await h.put("conversation.item.retrieve", item_id="item_resp_1")
        assert h.events[-1]["item"]["status"] == "incomplete"


async def test_voice_commit_makes_an_audio_item_and_clear_answers_cleared(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(VoiceEngine(OPENAI), dict(OPENAI)) as h:
        await h.put("input_audio_buffer.append", audio=bytes(960))
        await h.put("input_audio_buffer.commit")
        assert [e["type"] for e in h.take()] == [
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.done",
        ]
        await h.put("input_audio_buffer.append", audio=bytes(960))
        await h.put("input_audio_buffer.clear")
        assert h.take() == [{"type": "input_audio_buffer.cleared"}]
        assert h.engine.audio_bytes_received == 1920  # type: ignore[attr-defined]


async def test_voice_migrates_a_conversation_and_restores_voice_1(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = VoiceEngine(OPENAI)
    async with running(engine, dict(OPENAI)) as h:
        await h.put_event(user_text("hello world", id="u1"))
        await h.put("response.create", response={"output_modalities": ["text"]})
        await h.put_event(user_text("again"))
        await h.put("response.create")
    state = json.loads(json.dumps(engine.snapshot()))
    assert state["state"] == "voice/2"
    fresh = VoiceEngine(OPENAI)
    fresh.restore(state)
    assert fresh.snapshot() == engine.snapshot()
    old = VoiceEngine()
    old.restore(_voice_1())
    async with running(old, {}) as h:
        await trio.sleep(2)
        assert h.types()[0] == "response.created" and h.events[0] == {
            "type": "response.created",
            "response_id": "resp_2",
        }


def _voice_1() -> dict[str, Any]:
    return {"state": "voice/1", "responses": 1, "speaking": None, "queued": ["hi"],
            "audio_bytes_received": 0, "max_queued": 16}  # fmt: skip


# -- over the native dialect, through a server -------------------------------------------


async def test_a_native_client_converses_and_an_unknown_id_is_a_typed_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_server(engine_factory=EchoEngine, fail_after_s=30) as sim:
        client, _ = await sim.open_session()
        await client.send(user_text("hi", id="u1"))
        added, done = await client.receive(), await client.receive()
        assert (added["type"], done["type"]) == (
            "conversation.item.added",
            "conversation.item.done",
        )
        assert done["item"]["id"] == "u1" and done["item"]["status"] == "completed"
        await client.send({"type": "conversation.item.retrieve", "item_id": "nope"})
        error = await client.receive()
        assert (error["type"], error["code"], error["param"]) == ("error", "bad_event", "item_id")
        await client.send({"type": "response.create"})  # the session goes on
        answer = [await client.receive() for _ in range(3)]
        assert [e["type"] for e in answer] == [
            "response.created",
            "response.output_text.delta",
            "response.done",
        ]
        assert answer[1]["text"] == "hi" and answer[0]["output_modalities"] == ["text"]
        await client.aclose()


# -- migration: a conversation cut anywhere loses and repeats nothing ---------------------


def _ask(**response: Any) -> Event:
    return {"type": "response.create"} | ({"response": response} if response else {})


ECHO_TALK: Script = [
    (0, user_text("one", id="u1")),
    (2, _ask()),
    (5, mig_audio(PCM[:770])),
    (6, {"type": "conversation.item.retrieve", "item_id": "u1"}),
    (7, {"type": "conversation.item.delete", "item_id": "u1"}),
    (8, user_text("two", id="u2")),
    (10, _ask()),
]
VOICE_TALK: Script = [
    (0, user_text("hello big world", id="u1")),
    (2, _ask(output_modalities=["text"])),
    (7, _ask()),
    (59, {"type": "conversation.item.retrieve", "item_id": "item_resp_2"}),
]


@pytest.mark.parametrize(
    ("make", "script", "outputs", "frames"),
    [(EchoEngine, ECHO_TALK, 13, 0), (VoiceEngine, VOICE_TALK, 60, 47)],
    ids=["echo", "voice"],
)
async def test_a_conversation_migrated_anywhere_goes_on_exactly(
    autojump_clock: trio.testing.MockClock,
    make: Callable[[], Engine],
    script: Script,
    outputs: int,
    frames: int,
) -> None:
    base = await drive(make, script)
    assert len(base.outputs) == outputs
    assert base.outputs[-1]["type"] in ("response.done", "conversation.item.retrieved")
    for cut in sweep(script, outputs, frames):
        assert (await drive(make, script, [cut])).outputs == base.outputs, str(cut)


async def test_echo_asked_for_text_answers_an_audio_turn_with_its_transcript_not_its_audio(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Was: the audio echoed, response.created naming ["audio"], whatever was asked.
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put("input_audio_buffer.append", audio=PCM)
        await h.put("input_audio_buffer.commit")
        h.take()
        text_only = {"output_modalities": ["text"]}
        await h.put("response.create", response=text_only)
        assert h.take() == [  # not transcribed: a text response with nothing in it
            {"type": "response.created", "response_id": "resp_1", "output_modalities": ["text"]},
            {"type": "response.done", "response_id": "resp_1"},
        ]
        await h.put("response.create")  # the session's modalities: the audio again
        assert h.take()[0]["output_modalities"] == ["audio"]
        content = [{"type": "input_audio", "audio": "AAAA", "transcript": "hi there"}]
        item = {"type": "message", "role": "user", "content": content}
        await h.put("conversation.item.create", item=item)
        h.take()
        await h.put("response.create", response=text_only)
        assert h.take() == [  # its transcript, written
            {"type": "response.created", "response_id": "resp_3", "output_modalities": ["text"]},
            {"type": "response.output_text.delta", "response_id": "resp_3", "text": "hi there"},
            {"type": "response.done", "response_id": "resp_3"},
        ]


async def test_echo_asked_for_audio_answers_a_text_turn_with_text_having_no_voice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(EchoEngine(OPENAI), dict(OPENAI)) as h:
        await h.put_event(user_text("hello"))
        h.take()
        await h.put("response.create", response={"output_modalities": ["audio"]})
        assert h.take() == [
            {"type": "response.created", "response_id": "resp_1", "output_modalities": ["text"]},
            {"type": "response.output_text.delta", "response_id": "resp_1", "text": "hello"},
            {"type": "response.done", "response_id": "resp_1"},
        ]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _json, max_size=6))
def test_an_item_s_size_is_its_compact_ascii_json_s_length(item: dict[str, Any]) -> None:
    # (the prebuilt encoder: the same text as json.dumps, floats and escapes included)
    assert conversation_module._size(item) == len(json.dumps(item, separators=(",", ":")))


_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add_audio", "update", "audio_part", "begin", "delete", "move"]),
        st.integers(0, 5),
        st.text(max_size=30),
    ),
    max_size=40,
)


@given(_ops)
def test_the_counted_size_is_always_what_the_items_and_their_audio_hold(
    ops: list[tuple[str, int, str]],
) -> None:
    # (each item's size is kept from when it was counted: it must follow every change)
    conversation = Conversation(max_items=4, max_bytes=600, keep_audio=True)
    for op, n, text in ops:
        item_id = f"item_{n}"
        if op in ("add", "add_audio"):
            item = {
                "id": item_id,
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            conversation.add(item, text.encode() if op == "add_audio" else None)
        elif op == "update":
            conversation.update(item_id, status=text)
        elif op == "audio_part":  # (a part that holds audio: never in what events show)
            part = {"type": "input_audio", "audio": text, "transcript": None}
            conversation.update(item_id, content=[part])
        elif op == "begin":  # (a response's announced item, its id of any text)
            conversation.begin_response(f"{n}{text}")
        elif op == "delete":
            conversation.delete(item_id)
        elif item_id in conversation:
            conversation._move_after(item_id, None)  # (first: as previous_item_id "root")
    ids = list(conversation._items)
    items = [conversation._items[k] for k in ids]
    expected = sum(len(json.dumps(i, separators=(",", ":"))) for i in items)
    expected += sum(map(len, conversation._audio.values())) + len(conversation.buffer)
    assert conversation.size == expected
    assert len(conversation) <= 4
    assert [conversation._previous(k) for k in ids] == [None, *ids[:-1]][: len(ids)]
    for item_id, stored in zip(ids, items, strict=True):
        seen = conversation.public(item_id)
        parts = [{k: v for k, v in p.items() if k != "audio"} for p in stored["content"]]
        assert seen == {**stored, "content": parts}
