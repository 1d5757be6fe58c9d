"""The ``voice`` engine, driven directly through an EngineSession under the mock clock."""

from __future__ import annotations

import io
import itertools
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.engines.api import BadEvent, EngineSession, Event, Inbox
from trio_duplex.engines.conversation import EVENTS
from trio_duplex.engines.voice import (
    FRAME_BYTES,
    SAMPLE_RATE,
    VoiceEngine,
    frame_count,
    pcm16_to_wav,
    speech_frames,
    word_pitch,
)

FRAME = 0.02
# "hello world": two five-letter words of 15 frames each, with a 4-frame gap between.
HELLO_WORLD_FRAMES = 34
WORLD_START = 19

Hook = Callable[["Harness", Event], Awaitable[None]]


@attrs.define
class Harness:
    engine: VoiceEngine
    inbox: Inbox
    on_emit: Hook | None = None
    before_emit: Hook | None = None
    events: list[Event] = attrs.Factory(list)
    times: list[float] = attrs.Factory(list)

    async def emit(self, event: Event) -> None:
        # before_emit may block like a session waiting for room in the journal; then the
        # event is recorded (journaled, given its seq); then on_emit may block like a
        # slow client.
        if self.before_emit is not None:
            await self.before_emit(self, event)
        self.events.append({**event, "server_event_seq": len(self.events) + 1})
        self.times.append(trio.current_time())
        if self.on_emit is not None:
            await self.on_emit(self, event)

    async def put(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, **fields}
        self.engine.check(event)
        self.inbox.put_nowait(event)
        await trio.lowlevel.checkpoint()

    def of(self, kind: str) -> list[tuple[float, Event]]:
        return [(t, e) for t, e in zip(self.times, self.events, strict=True) if e["type"] == kind]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def audio(self, response_id: str = "resp_1") -> bytes:
        return b"".join(
            e["audio"]
            for _, e in self.of("response.output_audio.delta")
            if e["response_id"] == response_id
        )


@asynccontextmanager
async def running(
    engine: VoiceEngine | None = None,
    on_emit: Hook | None = None,
    before_emit: Hook | None = None,
) -> AsyncIterator[Harness]:
    inbox = Inbox(100)
    h = Harness(engine or VoiceEngine({}), inbox, on_emit, before_emit)
    session = EngineSession("sess_test", {}, inbox=inbox, emit=h.emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.engine.run, session)
        yield h
        nursery.cancel_scope.cancel()


async def test_known_text_gives_whole_20ms_frames(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as h:
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    frames = [e["audio"] for _, e in h.of("response.output_audio.delta")]
    assert all(type(f) is bytes for f in frames)  # PCM16 bytes: the server encodes them
    assert len(frames) == HELLO_WORLD_FRAMES == frame_count("hello world")
    assert all(len(f) == FRAME_BYTES == 960 for f in frames)
    # The silent gap between the words is digital silence; the words are not.
    assert all(f == bytes(960) for f in frames[15:WORLD_START])
    assert all(any(f) for f in frames[:15] + frames[WORLD_START:])
    assert h.types()[0] == "response.created" and h.types()[-1] == "response.done"
    assert {e["response_id"] for e in h.events} == {"resp_1"}


async def test_frames_are_paced_by_absolute_deadlines(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow_client(h: Harness, event: Event) -> None:
        # Each send takes 5 ms: relative sleeps would drift to 25 ms per frame.
        if event["type"] == "response.output_audio.delta":
            await trio.sleep(0.005)

    async with running(on_emit=slow_client) as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    times = [t for t, _ in h.of("response.output_audio.delta")]
    assert times == pytest.approx([t0 + k * FRAME for k in range(HELLO_WORLD_FRAMES)], abs=1e-9)
    # Done when the last frame has played, 20 ms after it was due.
    [(done_at, _)] = h.of("response.done")
    assert done_at == pytest.approx(t0 + HELLO_WORLD_FRAMES * FRAME, abs=1e-9)


async def test_late_frames_catch_up_to_the_schedule(autojump_clock: trio.testing.MockClock) -> None:
    async def stall_once(h: Harness, event: Event) -> None:
        if len(h.of("response.output_audio.delta")) == 4:
            await trio.sleep(0.11)  # backpressure from 60 to 170 ms

    async with running(on_emit=stall_once) as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    times = [t - t0 for t, _ in h.of("response.output_audio.delta")]
    assert times[:4] == pytest.approx([0, 0.02, 0.04, 0.06], abs=1e-9)
    assert times[4:9] == pytest.approx([0.17] * 5, abs=1e-9)  # due 80 to 160 ms: sent at once
    assert times[9:] == pytest.approx([k * FRAME for k in range(9, 34)], abs=1e-9)


async def test_text_deltas_start_with_their_words(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="  hello \n world ")
        await trio.sleep(5)
    deltas = h.of("response.output_text.delta")
    assert [e["text"] for _, e in deltas] == ["hello", " world"]
    assert [t - t0 for t, _ in deltas] == pytest.approx([0, WORLD_START * FRAME], abs=1e-9)
    # Each delta comes just before the audio frame on which its word starts.
    for _, delta in deltas:
        after = h.events[delta["server_event_seq"]]
        assert after["type"] == "response.output_audio.delta"
    types = h.types()
    assert types[:3] == ["response.created", "response.output_text.delta",
                         "response.output_audio.delta"]  # fmt: skip
    assert types[-1] == "response.done"
    assert len(types) == 1 + 2 + HELLO_WORLD_FRAMES + 1


async def test_text_without_words_is_an_empty_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        await h.put("input.text.append", text=" \t")
        await trio.sleep(1)
    assert h.events == [
        {"type": "response.created", "response_id": "resp_1", "server_event_seq": 1},
        {"type": "response.done", "response_id": "resp_1", "server_event_seq": 2},
    ]


async def test_texts_queue_behind_the_response_speaking(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await trio.sleep(0.1)
        await h.put("input.text.append", text="again")
        await trio.sleep(5)
    marks = [(e["type"], e["response_id"], t - t0) for t, e in zip(h.times, h.events, strict=True)
             if e["type"] in ("response.created", "response.done")]  # fmt: skip
    end_1 = HELLO_WORLD_FRAMES * FRAME
    assert marks == [
        ("response.created", "resp_1", 0),
        ("response.done", "resp_1", pytest.approx(end_1)),
        ("response.created", "resp_2", pytest.approx(end_1)),
        ("response.done", "resp_2", pytest.approx(end_1 + 15 * FRAME)),
    ]
    assert len(h.audio("resp_2")) == 15 * FRAME_BYTES


async def test_audio_input_is_read_while_speaking(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        chunk = bytes(range(256)) * 3 + b"xy"  # 770 bytes of PCM16, as the server decoded
        for _ in range(30):
            await trio.sleep(0.01)
            await h.put("input_audio_buffer.append", audio=chunk)
            await trio.testing.wait_all_tasks_blocked()
            # Counted on arrival, mid-response, not after it.
            assert h.of("response.done") == []
        assert h.engine.audio_bytes_received == 30 * 770
        await h.put("session.update", session={"voice": "x"})
        await trio.sleep(5)
    # Audio input is never answered, and did not disturb the pacing.
    assert {e["type"] for e in h.events} == {
        "response.created", "response.output_text.delta", "response.output_audio.delta",
        "session.updated", "response.done",
    }  # fmt: skip
    times = [t for t, _ in h.of("response.output_audio.delta")]
    assert times == pytest.approx([t0 + k * FRAME for k in range(HELLO_WORLD_FRAMES)], abs=1e-9)
    [(updated_at, _)] = h.of("session.updated")
    assert updated_at == pytest.approx(t0 + 0.3)


async def test_cancel_stops_audio_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await trio.sleep(0.11)
        await h.put("response.cancel")
        await trio.sleep(5)
    assert len(h.of("response.output_audio.delta")) == 6  # frames at 0, 20, ... 100 ms
    assert h.types()[-1] == "response.cancelled"
    [(cancelled_at, cancelled)] = h.of("response.cancelled")
    assert cancelled_at == pytest.approx(t0 + 0.11)
    assert cancelled["response_id"] == "resp_1"
    assert h.of("response.done") == []


async def test_no_frame_after_a_cancel_read_between_wakeup_and_send(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The cancel is read while the speaker is past its sleep but not yet at a checkpoint."""
    processed: list[int] = []

    async def cancel_during_world(h: Harness, event: Event) -> None:
        if event.get("text") == " world":
            h.inbox.put_nowait({"type": "response.cancel"})
            # Uncancellable, like a journal write: the speaker resumes normally after it.
            with trio.CancelScope(shield=True):
                await trio.testing.wait_all_tasks_blocked()
            processed.append(len(h.events))

    async with running(on_emit=cancel_during_world) as h:
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    assert processed
    assert h.types()[processed[0] :] == ["response.cancelled"]
    assert len(h.of("response.output_audio.delta")) == WORLD_START


async def test_cancel_interrupts_a_send_blocked_by_backpressure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def stuck_client(h: Harness, event: Event) -> None:
        if len(h.of("response.output_audio.delta")) == 4:
            h.inbox.put_nowait({"type": "response.cancel", "response_id": "resp_1"})
            await trio.sleep(60)

    async with running(on_emit=stuck_client) as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    # The fourth frame was journaled before the cancel; nothing follows it but the end.
    assert len(h.of("response.output_audio.delta")) == 4
    assert h.types()[-1] == "response.cancelled"
    assert h.of("response.cancelled")[0][0] == pytest.approx(t0 + 3 * FRAME)


@pytest.mark.parametrize("blocks", ["before_emit", "on_emit"])
async def test_cancel_while_created_is_sent_gives_no_audio(
    autojump_clock: trio.testing.MockClock, blocks: str
) -> None:
    """created is sent whole even if the cancel comes before it is journaled."""

    async def cancel_at_created(h: Harness, event: Event) -> None:
        if event["type"] == "response.created":
            h.inbox.put_nowait({"type": "response.cancel"})
            await trio.testing.wait_all_tasks_blocked()

    hooks = {blocks: cancel_at_created}
    async with running(on_emit=hooks.get("on_emit"), before_emit=hooks.get("before_emit")) as h:
        await h.put("input.text.append", text="hello world")
        await trio.sleep(5)
    assert h.types() == ["response.created", "response.cancelled"]


async def test_cancel_with_nothing_speaking_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        await h.put("response.cancel")
        await trio.sleep(1)
        assert h.events == []
        await h.put("input.text.append", text="hi")
        await trio.sleep(1)
        await h.put("response.cancel", response_id="resp_1")  # ended already
        await trio.sleep(1)
    assert h.types()[-1] == "response.done"
    assert h.of("response.cancelled") == []


async def test_cancel_naming_another_response_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        await h.put("input.text.append", text="hello world")
        await trio.sleep(0.1)
        await h.put("response.cancel", response_id="resp_0")
        await trio.sleep(5)
    assert len(h.of("response.output_audio.delta")) == HELLO_WORLD_FRAMES
    assert h.types()[-1] == "response.done"


async def test_cancel_stops_only_the_current_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        t0 = trio.current_time()
        await h.put("input.text.append", text="hello world")
        await h.put("input.text.append", text="again")
        await trio.sleep(0.05)
        await h.put("response.cancel", response_id="resp_1")
        await trio.sleep(5)
    ends = [(e["type"], e["response_id"]) for _, e in h.of("response.cancelled")
            + h.of("response.done")]  # fmt: skip
    assert ends == [("response.cancelled", "resp_1"), ("response.done", "resp_2")]
    [(created_2, _)] = [(t, e) for t, e in h.of("response.created") if e["response_id"] == "resp_2"]
    assert created_2 == pytest.approx(t0 + 0.05)
    assert len(h.audio("resp_1")) == 3 * FRAME_BYTES
    assert len(h.audio("resp_2")) == 15 * FRAME_BYTES


async def test_queue_is_bounded_by_backpressure(autojump_clock: trio.testing.MockClock) -> None:
    async with running(VoiceEngine({}, max_queued=1)) as h:
        for word in ("one", "two", "three", "four"):
            await h.put("input.text.append", text=word)
        await trio.testing.wait_all_tasks_blocked()
        # Speaking "one", "two" queued, the reader holding "three": "four" waits unread.
        assert len(h.inbox) == 1
        await trio.sleep(10)
        assert len(h.inbox) == 0
    done = [e["response_id"] for _, e in h.of("response.done")]
    assert done == ["resp_1", "resp_2", "resp_3", "resp_4"]


async def test_run_returns_after_speaking_once_input_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    inbox = Inbox(10)
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    t0 = trio.current_time()
    inbox.put_nowait({"type": "input.text.append", "text": "hello world"})
    inbox.close()
    await VoiceEngine({}).run(EngineSession("s", {}, inbox=inbox, emit=emit))
    assert trio.current_time() - t0 == pytest.approx(HELLO_WORLD_FRAMES * FRAME)
    assert events[-1] == {"type": "response.done", "response_id": "resp_1"}


async def test_same_text_gives_same_audio(autojump_clock: trio.testing.MockClock) -> None:
    runs = []
    for _ in range(2):
        async with running() as h:
            await h.put("input.text.append", text="Hello world")
            await trio.sleep(5)
        runs.append(h.audio())
    assert runs[0] == runs[1] == b"".join(f for _, f in speech_frames("Hello world"))
    assert len(runs[0]) == HELLO_WORLD_FRAMES * FRAME_BYTES


def test_each_word_has_its_own_pitch() -> None:
    assert word_pitch("hello") != word_pitch("world")
    assert word_pitch("Hello") == word_pitch("hello")
    hello = b"".join(f for _, f in speech_frames("hello"))
    samples = memoryview(hello).cast("h")
    crossings = sum(1 for a, b in itertools.pairwise(samples) if (a < 0) != (b < 0))
    measured = crossings / 2 / (len(samples) / SAMPLE_RATE)
    assert measured == pytest.approx(word_pitch("hello"), rel=0.03)


def test_lone_surrogates_do_not_break_synthesis() -> None:
    frames = list(speech_frames("a\ud800b c"))
    assert [w for w, _ in frames if w is not None] == ["a\ud800b", "c"]
    assert 180 <= word_pitch("\udfff") <= 810


@given(st.text(max_size=60))
def test_frames_for_any_text(text: str) -> None:
    frames = list(speech_frames(text))
    assert len(frames) == frame_count(text)
    assert all(len(f) == FRAME_BYTES for _, f in frames)
    assert [w for w, _ in frames if w is not None] == text.split()


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "input.text.append"}, "text"),
        ({"type": "input.text.append", "text": 5}, "text"),
        ({"type": "input.text.append", "text": None}, "text"),
        ({"type": "response.cancel", "response_id": 1}, "response_id"),
        ({"type": "response.cancel", "response_id": None}, "response_id"),
    ],
)
def test_check_refuses_malformed_fields(event: Event, param: str) -> None:
    with pytest.raises(BadEvent) as info:
        VoiceEngine({}).check(event)
    assert info.value.code == "bad_event"
    assert info.value.param == param


@pytest.mark.parametrize(
    "event",
    [
        {"type": "input.text.append", "text": ""},
        {"type": "input_audio_buffer.append", "audio": b""},
        {"type": "input_audio_buffer.append", "audio": b"\0\0"},
        {"type": "response.cancel"},
        {"type": "response.cancel", "response_id": "resp_1"},
    ],
)
def test_check_accepts_wellformed_events(event: Event) -> None:
    VoiceEngine({}).check(event)


def test_voice_engine_is_the_registered_factory() -> None:
    from trio_duplex.engines.api import load_engine_factory

    engine = load_engine_factory("voice")({"a": 1})
    assert isinstance(engine, VoiceEngine)
    native = {"input.text.append", "input_audio_buffer.append", "response.cancel", "input.dtmf"}
    assert engine.accepts == native | EVENTS | {"response.create"}


def test_wav_round_trips_through_the_wave_module() -> None:
    pcm = b"".join(f for _, f in speech_frames("hello world"))
    data = pcm16_to_wav(pcm)
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[44:] == pcm
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == len(pcm) // 2
        assert w.readframes(w.getnframes()) == pcm


def test_wav_of_other_rates_and_channels() -> None:
    with wave.open(io.BytesIO(pcm16_to_wav(bytes(8), sample_rate=16000, channels=2))) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 16000, 2)
    with wave.open(io.BytesIO(pcm16_to_wav(b""))) as w:
        assert w.getnframes() == 0


@pytest.mark.parametrize(("pcm", "channels"), [(b"\x00", 1), (bytes(6), 2)])
def test_wav_refuses_partial_frames(pcm: bytes, channels: int) -> None:
    with pytest.raises(ValueError, match="whole"):
        pcm16_to_wav(pcm, channels=channels)
