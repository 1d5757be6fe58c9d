"""The speech engine in process: its clauses, its snapshot refusals, and migration at the
points of a turn where a cut is hardest (real recognition and synthesis, real time: the
engine's threads and subprocesses do not run on a MockClock)."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import pytest
import trio

from trio_duplex.engines.api import BadEvent, Event, Inbox
from trio_duplex.engines.speech import SpeechEngine
from trio_duplex.engines.speech._synthesise import MAX_CLAUSE_CHARS, clauses

from ..speech_audio import DOOR, frames, is_speech, needs_speech, spoken
from .migration import Client, Cut, Node, audio


def test_clauses_are_cut_at_punctuation_and_bounded() -> None:
    assert clauses("you said: hello. And then") == (["you said:", "hello."], "And then")
    assert clauses("no end yet") == ([], "no end yet")
    assert clauses("3.5 is a number, ") == (["3.5 is a number,"], "")  # no space after "."
    long = "word " * 100
    done, rest = clauses(long)
    assert done and all(len(c) <= MAX_CLAUSE_CHARS for c in [*done, rest])
    assert " ".join([*done, rest]).split() == long.split()  # nothing lost at the cuts


async def _never(event: Event) -> None:
    raise AssertionError("Node.send records events itself")


PLAYED = 25  # audio frames of the reply (0.5 s): enough to know it is speech


async def converse(
    pcm: bytes, cuts: list[Cut], state: dict[str, Any] | None = None
) -> tuple[list[Event], list[Any]]:
    """Speak ``pcm`` to a speech engine (restored from ``state`` if given), migrating it
    at each cut, until its response ends or has played ``PLAYED`` frames."""
    client = Client(deque((0, audio(f)) for f in frames(pcm)), {})
    engine = SpeechEngine()
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
            engine = SpeechEngine()
            engine.restore(state)
        nursery.cancel_scope.cancel()
    return client.outputs, states


def turn(outputs: list[Event]) -> list[tuple[str, str]]:
    """The turn as a client sees it, transcript deltas aside (a restored recogniser
    guesses at other moments)."""
    return [
        (e["type"], str(e.get("text", e.get("response_id", ""))))
        for e in outputs
        if e["type"] != "input_audio.transcript.delta"
        and e["type"] != "response.output_audio.delta"
    ]


UNCUT: dict[str, list[Event]] = {}


@needs_speech
@pytest.mark.parametrize("where", ["speech_started", "transcript.done"])
async def test_a_turn_migrated_at_its_hardest_points_loses_nothing(where: str) -> None:
    pcm = spoken(DOOR)
    with trio.fail_after(60):
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
    assert is_speech(b"".join(e["audio"] for e in migrated if "audio" in e))


@needs_speech
async def test_a_response_playing_at_a_migration_ends_cancelled_on_the_new_node() -> None:
    with trio.fail_after(60):
        outputs, states = await converse(spoken(DOOR), [Cut("send", 8, after=True)])
    assert states[0]["speaking"]["created"]
    ends = [e for e in outputs if e["type"] in ("response.done", "response.cancelled")]
    assert [(e["type"], e["response_id"]) for e in ends] == [("response.cancelled", "resp_1")]
    assert outputs[-1] == ends[0]  # nothing after it


@needs_speech
def test_a_typed_turn_is_bounded() -> None:
    engine = SpeechEngine()
    engine.check({"type": "input.text.append", "text": "x" * 2000})
    with pytest.raises(BadEvent, match="over 2000 characters"):
        engine.check({"type": "input.text.append", "text": "x" * 2001})


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
    with trio.fail_after(30):
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
@needs_speech
def test_a_snapshot_of_another_shape_is_refused(change: dict[str, Any]) -> None:
    state = SpeechEngine().snapshot() | change
    with pytest.raises(ValueError, match="snapshot"):
        SpeechEngine().restore(state)


# -- the recogniser's process ----------------------------------------------------------


@needs_speech
async def test_the_recogniser_runs_in_a_child_process_and_is_reaped() -> None:
    # pocketsphinx holds the GIL: in a thread it stopped every session's frames
    # (benchmarks/probes/speech.py --gil-only). Out of process, the event loop stays free.
    import os

    from trio_duplex.engines.speech._recognise import Heard
    from trio_duplex.engines.speech._remote import RemoteRecogniser

    recogniser = await RemoteRecogniser.start(max_turn_bytes=20 * 32000)
    process = recogniser._process
    assert process.pid != os.getpid() and process.returncode is None
    pcm = spoken(DOOR)
    heard = []
    for at in range(0, len(pcm), 16000):
        heard += await recogniser.feed(pcm[at : at + 16000])
    assert recogniser.fed == len(pcm)
    kinds = [h.kind for h in heard]
    assert kinds[0] is Heard.STARTED and kinds[-1] is Heard.DONE
    assert "door" in heard[-1].text.split()
    await recogniser.aclose()
    assert process.returncode == 0  # its stdin closed: it left by itself


@needs_speech
async def test_a_recogniser_process_that_dies_fails_its_feed() -> None:
    from trio_duplex.engines.speech._remote import RecogniserFailed, RemoteRecogniser

    recogniser = await RemoteRecogniser.start(max_turn_bytes=32000)
    recogniser._process.kill()
    await recogniser._process.wait()
    with pytest.raises(RecogniserFailed, match="process ended"):
        await recogniser.feed(bytes(640))
    await recogniser.aclose()


@needs_speech
async def test_a_cancelled_synthesis_kills_its_espeak_ng_at_once() -> None:
    import psutil

    from trio_duplex.engines.speech._synthesise import synthesise

    me = psutil.Process()

    def espeaks() -> list[psutil.Process]:
        return [p for p in me.children() if p.name() == "espeak-ng"]

    text = "a long reply that nobody will hear to its end. " * 10000  # ~30 s of its CPU
    with trio.fail_after(10):  # killed, it is gone at once; left to finish, this fails
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(synthesise, text, "en-us", 160, trio.CapacityLimiter(1))
                while not espeaks():  # noqa: ASYNC110  (polls another process: its start)
                    await trio.sleep(0.005)
                (child,) = espeaks()
                scope.cancel()
    assert scope.cancelled_caught
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert espeaks() == []
