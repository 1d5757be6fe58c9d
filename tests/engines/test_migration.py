"""Migration of the echo and voice engines: snapshot, restore, and nothing lost or repeated.

Each engine is stopped at every cut point of a few scripts (``migration.py``: every send,
before and after its event is recorded, every receive, half way through every 20 ms
sleep), and the outputs of all its nodes together must be those of a run never cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.engines.api import Engine, EngineSession, Event, can_migrate, engine_problem
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import FRAME_BYTES, VoiceEngine, frame_count, speech_frames

from .migration import FRAME, Cut, Script, Trace, audio, cancel, drive, sweep, text

# -- the API ------------------------------------------------------------------------------


class Plain(Engine):
    accepts = frozenset({"input.text.append"})

    async def run(self, session: EngineSession) -> None:
        await trio.sleep_forever()


class Duck:  # an engine by its shape only, as load_engine_factory allows
    accepts = frozenset({"input.text.append"})


class Snapshots(Plain):
    def snapshot(self) -> bytes:
        return b"state"


def test_an_engine_that_does_not_snapshot_cannot_migrate() -> None:
    engine = Plain()
    assert not can_migrate(engine)
    assert engine.snapshot() is None
    with pytest.raises(NotImplementedError, match="Plain cannot restore"):
        engine.restore({})
    assert not can_migrate(Duck())  # type: ignore[arg-type]


def test_an_engine_that_overrides_snapshot_can_migrate() -> None:
    assert can_migrate(Snapshots())
    assert can_migrate(EchoEngine())
    assert can_migrate(VoiceEngine({}))


def test_an_engine_with_snapshot_and_no_restore_is_refused_at_load() -> None:
    assert engine_problem(Snapshots()) == (
        "which implements 'snapshot' but not 'restore': its sessions could not migrate"
    )

    class Both(Snapshots):
        def restore(self, state: bytes | dict[str, Any]) -> None:
            pass

    assert engine_problem(Both()) is None
    assert engine_problem(Plain()) is None


# -- echo ---------------------------------------------------------------------------------

PCM = bytes(range(256)) * 3 + b"\xff\x00"  # 770 bytes, not valid UTF-8: base64 in the state
ECHO_SCRIPT: Script = [
    (0, text("one")),
    (0, audio(PCM)),
    (0, text("two")),
    (2, text("three \ud800")),  # a lone surrogate: JSON escapes it, and back
    (3, audio(PCM[::-1])),
    (5, text("")),
]


async def test_echo_uninterrupted(autojump_clock: trio.testing.MockClock) -> None:
    trace = await drive(EchoEngine, ECHO_SCRIPT)
    assert trace.outputs == [
        {"type": "response.output_text.delta", "text": "one"},
        {"type": "response.output_audio.delta", "audio": PCM},
        {"type": "response.output_text.delta", "text": "two"},
        {"type": "response.output_text.delta", "text": "three \ud800"},
        {"type": "response.output_audio.delta", "audio": PCM[::-1]},
        {"type": "response.output_text.delta", "text": ""},
    ]


@pytest.mark.parametrize("cut", sweep(ECHO_SCRIPT, 6, 0), ids=str)
async def test_echo_migrated_anywhere_answers_each_input_once(
    autojump_clock: trio.testing.MockClock, cut: Cut
) -> None:
    expected = (await drive(EchoEngine, ECHO_SCRIPT)).outputs
    assert (await drive(EchoEngine, ECHO_SCRIPT, [cut])).outputs == expected


async def test_echo_answers_after_restore_what_it_took_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trace = await drive(EchoEngine, ECHO_SCRIPT, [Cut("send", 2)], pause=1.0)
    [state] = trace.states
    assert state["unanswered"]["type"] == "input_audio_buffer.append"
    assert [e.get("text", e.get("audio")) for e in trace.outputs[:3]] == ["one", PCM, "two"]


ECHO_BATCH: list[Event] = [
    text("a"),
    audio(PCM),
    {"type": "response.create"},  # not an echo: it splits the batch's answers in two
    text("b"),
    text("c"),
]
ECHO_AFTER: Script = [(6, text("d"))]


async def test_echo_answers_a_batch_in_order(autojump_clock: trio.testing.MockClock) -> None:
    trace = await drive(EchoEngine, ECHO_AFTER, queued=ECHO_BATCH)
    assert [e["type"].split(".")[-1] for e in trace.outputs] == [
        "delta", "delta", "created", "done", "delta", "delta", "delta"
    ]  # fmt: skip
    assert [e.get("text", e.get("audio")) for e in trace.outputs if "response_id" not in e] == [
        "a", PCM, "b", "c", "d"
    ]  # fmt: skip


@pytest.mark.parametrize("cut", sweep(ECHO_AFTER, 7, 0), ids=str)
async def test_echo_migrated_anywhere_in_a_batch_answers_each_input_once(
    autojump_clock: trio.testing.MockClock, cut: Cut
) -> None:
    expected = (await drive(EchoEngine, ECHO_AFTER, queued=ECHO_BATCH)).outputs
    assert (await drive(EchoEngine, ECHO_AFTER, [cut], queued=ECHO_BATCH)).outputs == expected


async def test_echo_keeps_a_batch_it_took_in_its_snapshot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    trace = await drive(EchoEngine, ECHO_AFTER, [Cut("send", 1)], queued=ECHO_BATCH)
    [state] = trace.states
    assert state["state"] == "echo/3"
    assert [e["type"] for e in state["unanswered"]] == [
        "input.text.append", "input_audio_buffer.append"
    ]  # fmt: skip
    assert [e["event"]["type"] for e in state["taken"]] == [
        "response.create", "input.text.append", "input.text.append"
    ]  # fmt: skip
    # One unanswered event and nothing else taken: echo/2, as an older node writes it.
    trace = await drive(EchoEngine, ECHO_SCRIPT, [Cut("send", 2)])
    assert trace.states[0]["state"] == "echo/2"


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (b"\x00", "not a snapshot of the echo engine"),
        ({"state": "echo/3", "unanswered": None, "taken": []}, "must be lists"),
        ({"state": "echo/3", "unanswered": [], "taken": [{"type": "x"}]}, "not an event"),
        ({"state": "echo/3", "unanswered": [], "taken": [{"event": {"type": "x"}}]},
         "has no 'bytes'"),
        ({"state": "echo/3", "unanswered": [],
          "taken": [{"event": {"type": "x"}, "bytes": {"audio": "a!"}}]}, "not base64"),
        ({"state": "voice/1"}, "not a snapshot of the echo engine"),
        ({"state": "echo/1", "unanswered": {"type": "response.cancel"}}, "not an input event"),
        ({"state": "echo/1", "unanswered": ["input.text.append"]}, "not an input event"),
        ({"state": "echo/1", "unanswered": {"type": "input.text.append"}}, "has no text"),
        ({"state": "echo/1", "unanswered": {"type": "input_audio_buffer.append",
                                            "audio_base64": "a!"}}, "not base64"),
    ],
)  # fmt: skip
def test_echo_refuses_a_state_of_another_shape(state: bytes | dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EchoEngine().restore(state)


def readme_echo() -> Callable[[], Engine]:
    """The README's migration example (its echo engine), as its reader would write it."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("### Migration: snapshot and restore")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "README.md", "exec"), namespace)
    return namespace["Echo"]  # type: ignore[no-any-return]


async def test_the_readme_echo_migrates_anywhere(autojump_clock: trio.testing.MockClock) -> None:
    expected = (await drive(EchoEngine, ECHO_SCRIPT)).outputs
    for cut in sweep(ECHO_SCRIPT, 6, 0):
        assert (await drive(readme_echo(), ECHO_SCRIPT, [cut])).outputs == expected, str(cut)
    with pytest.raises(ValueError, match="not a snapshot of the echo engine"):
        readme_echo()().restore(VoiceEngine({}).snapshot())


# -- voice --------------------------------------------------------------------------------

# "hello big world": 15 + 4 + 9 + 4 + 15 frames.
SENTENCE: Script = [(0, text("hello big world"))]
SENTENCE_FRAMES = 47
# max_queued 1: "gh" is held by the reader, "ij" waits unread, while "ab cd" is spoken.
QUEUED: Script = [(0, text("ab cd")), (0, text("ef")), (0, text("gh")), (0, text("ij"))]
# resp_1 cancelled after 8 frames (output 10); resp_2 ("bye now") after 7 (output 20); a
# stale cancel of resp_1 while resp_2 speaks is ignored; then "ok" is spoken whole.
BARGE_IN: Script = [
    (0, text("hello world")),
    (0, audio(PCM)),
    (0, text("bye now")),
    (10, cancel()),
    (14, audio(PCM[:100])),
    (16, cancel("resp_1")),
    (20, cancel("resp_2")),
    (21, text("ok")),
]
# name: script, max_queued, and the outputs and 20 ms frames of a run never cut
# A cancel read while resp_1's response.done is being sent is too late: ignored. One read
# while resp_2's response.created is: that is sent whole, then response.cancelled.
HELD: Script = [(0, text("hello big")), (0, text("world")), (-32, cancel()), (-33, cancel())]
VOICE = {
    "sentence": (SENTENCE, 16, 52, SENTENCE_FRAMES),
    "queued": (QUEUED, 1, 47, 34),
    "barge_in": (BARGE_IN, 16, 30, 21),
    "held": (HELD, 16, 34, 28),
}


def voice(max_queued: int) -> Callable[[], VoiceEngine]:
    return lambda: VoiceEngine({}, max_queued=max_queued)


def summary(outputs: list[Event]) -> list[str]:
    return [f"{e['type'].removeprefix('response.')}:{e['response_id']}" for e in outputs]


async def test_voice_uninterrupted_runs(autojump_clock: trio.testing.MockClock) -> None:
    for name, (script, max_queued, outputs, frames) in VOICE.items():
        trace = await drive(voice(max_queued), script)
        assert len(trace.outputs) == outputs, name
        assert sum(e["type"] == "response.output_audio.delta" for e in trace.outputs) == frames
    sentence = (await drive(voice(16), SENTENCE)).outputs
    assert frame_count("hello big world") == SENTENCE_FRAMES
    assert [e["text"] for e in sentence if "text" in e] == ["hello", " big", " world"]
    assert b"".join(e["audio"] for e in sentence if "audio" in e) == b"".join(
        frame for _, frame in speech_frames("hello big world")
    )
    queued = (await drive(voice(1), QUEUED)).outputs
    assert [e["response_id"] for e in queued if e["type"] == "response.done"] == [
        "resp_1", "resp_2", "resp_3", "resp_4"
    ]  # fmt: skip
    trace = await drive(voice(16), BARGE_IN)
    ends = [s for s in summary(trace.outputs) if not s.startswith("output")]
    assert ends == ["created:resp_1", "cancelled:resp_1", "created:resp_2", "cancelled:resp_2",
                    "created:resp_3", "done:resp_3"]  # fmt: skip
    assert summary(trace.outputs).count("output_audio.delta:resp_1") == 8
    assert summary(trace.outputs).count("output_audio.delta:resp_2") == 7
    assert isinstance(trace.engine, VoiceEngine)
    assert trace.engine.audio_bytes_received == len(PCM) + 100
    held = (await drive(voice(16), HELD)).outputs
    assert summary(held)[-3:] == ["done:resp_1", "created:resp_2", "cancelled:resp_2"]


_base: dict[str, Trace] = {}


async def migrate(name: str, cuts: Sequence[Cut], pause: float = 0.0) -> tuple[Trace, Trace]:
    """The run of scenario ``name`` never cut (computed once), and one cut at ``cuts``."""
    script, max_queued, _, _ = VOICE[name]
    if name not in _base:
        _base[name] = await drive(voice(max_queued), script)
    return _base[name], await drive(voice(max_queued), script, cuts, pause=pause)


def assert_same(base: Trace, migrated: Trace) -> None:
    marks = summary(migrated.outputs)
    for response_id in {e["response_id"] for e in migrated.outputs}:
        assert marks.count(f"created:{response_id}") == 1
        assert marks.count(f"done:{response_id}") + marks.count(f"cancelled:{response_id}") == 1
    assert marks == summary(base.outputs)
    assert migrated.outputs == base.outputs  # every field: texts, each frame's bytes
    assert isinstance(base.engine, VoiceEngine) and isinstance(migrated.engine, VoiceEngine)
    assert migrated.engine.audio_bytes_received == base.engine.audio_bytes_received


@pytest.mark.parametrize(
    ("name", "cut"),
    [
        (name, cut)
        for name, (script, _, outputs, frames) in VOICE.items()
        for cut in sweep(script, outputs, frames)
    ],
    ids=str,
)
async def test_voice_migrated_anywhere_says_everything_once(
    autojump_clock: trio.testing.MockClock, name: str, cut: Cut
) -> None:
    assert_same(*await migrate(name, [cut]))


@pytest.mark.parametrize(
    ("name", "cut", "speaking", "queued"),
    [
        # before response.created
        ("sentence", Cut("send", 1), {"stage": "create", "next_frame": 0}, []),
        # mid-word: "hello"'s text delta is sent, its first frame's audio is not
        ("sentence", Cut("send", 2, after=True),
         {"stage": "speak", "next_frame": 0, "delta_sent": True}, []),
        ("sentence", Cut("send", 3), {"next_frame": 0, "delta_sent": True}, []),
        ("sentence", Cut("time", 0.05), {"next_frame": 3, "delta_sent": False}, []),
        # between words: frames 15 to 18 are the gap after "hello"
        ("sentence", Cut("time", 0.33), {"next_frame": 17, "delta_sent": False}, []),
        # in the final sleep, until the last frame has played
        ("sentence", Cut("time", 0.93), {"stage": "speak", "next_frame": 47}, []),
        ("sentence", Cut("send", 52), {"stage": "end", "next_frame": 47}, []),
        # texts queued: "ef" waits, "gh" is held by the reader over max_queued 1
        ("queued", Cut("time", 0.05), {"response_id": "resp_1", "next_frame": 3},
         ["ef", "gh"]),
        # a cancel read, and the speaker not yet woken by it
        ("barge_in", Cut("receive", 5), {"stage": "speak", "next_frame": 8, "cancelled": True},
         ["bye now"]),
        # a cancel read, and response.cancelled not yet sent
        ("barge_in", Cut("send", 11), {"stage": "end", "next_frame": 8, "cancelled": True},
         ["bye now"]),
        # a cancel read while response.done is sent (at 0.56 s): too late, ignored
        ("held", Cut("time", 0.562), {"stage": "end", "next_frame": 28, "cancelled": False},
         ["world"]),
        # a cancel read while response.created is sent: created, then cancelled
        ("held", Cut("time", 0.566), {"stage": "create", "cancelled": True}, []),
    ],
    ids=str,
)  # fmt: skip
async def test_voice_state_at(
    autojump_clock: trio.testing.MockClock,
    name: str,
    cut: Cut,
    speaking: dict[str, Any],
    queued: list[str],
) -> None:
    base, migrated = await migrate(name, [cut], pause=1.0)
    [state] = migrated.states
    assert state["speaking"].items() >= speaking.items()
    assert state["queued"] == queued
    assert_same(base, migrated)


async def test_voice_resumes_paced_from_the_restore(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Cut while waiting for frame 3 (due at 60 ms), restored 1 s later: frame 3 at once,
    # then one every 20 ms, and done 20 ms after the last.
    base, migrated = await migrate("sentence", [Cut("time", 0.05)], pause=1.0)
    assert_same(base, migrated)
    audio_times = [t for t, e in zip(migrated.times, migrated.outputs, strict=True) if "audio" in e]
    restored = [1.05 + k * FRAME for k in range(SENTENCE_FRAMES - 3)]
    assert audio_times == pytest.approx([k * FRAME for k in range(3)] + restored)
    assert migrated.times[-1] == pytest.approx(1.05 + (SENTENCE_FRAMES - 3) * FRAME)


async def test_voice_mid_frame_sends_the_audio_and_not_the_delta_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Output 22 is frame 19's text delta (" big"); the cut comes right after it.
    base, migrated = await migrate("sentence", [Cut("send", 22, after=True)], pause=1.0)
    assert migrated.outputs[21]["text"] == " big"
    assert migrated.outputs[22]["type"] == "response.output_audio.delta"
    assert migrated.times[21:23] == pytest.approx([19 * FRAME, 19 * FRAME + 1.0])
    assert_same(base, migrated)


async def test_a_cancel_after_restore_stops_the_restored_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = [(0, text("hello big world")), (12, cancel("resp_1"))]
    base = await drive(voice(16), script)
    migrated = await drive(voice(16), script, [Cut("send", 5)], pause=1.0)
    assert migrated.times[4] == pytest.approx(1.0 + 2 * FRAME)  # restored before the cancel
    assert migrated.outputs == base.outputs
    assert summary(migrated.outputs) == [
        "created:resp_1", "output_text.delta:resp_1",
        *["output_audio.delta:resp_1"] * 10, "cancelled:resp_1",
    ]  # fmt: skip


# -- several migrations in one session ----------------------------------------------------

SCENARIOS: dict[str, tuple[Callable[[], Engine], Script, int]] = {
    "echo": (EchoEngine, ECHO_SCRIPT, 6),
    **{name: (voice(max_queued), script, outputs)
       for name, (script, max_queued, outputs, _) in VOICE.items()},
}  # fmt: skip


@st.composite
def send_cuts(draw: st.DrawFn, outputs: int, script: Script) -> list[Cut]:
    racy = {mark for mark, event in script if event["type"] == "response.cancel"}
    points = draw(
        st.lists(
            st.tuples(st.integers(1, outputs), st.booleans()).filter(
                lambda p: not (p[1] and p[0] in racy)
            ),
            max_size=5,
            unique=True,
        )
    )
    return [Cut("send", k, after) for k, after in sorted(points)]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from(sorted(SCENARIOS)), st.sampled_from([0.0, 0.013, 1.0]))
def test_migrating_again_and_again(data: st.DataObject, name: str, pause: float) -> None:
    make, script, outputs = SCENARIOS[name]
    cuts = data.draw(send_cuts(outputs, script))
    if data.draw(st.booleans()):  # or at times instead, each on the node restored last
        times = data.draw(st.lists(st.integers(0, outputs), max_size=5, unique=True))
        cuts, pause = [Cut("time", round((k + 0.5) * FRAME, 3)) for k in sorted(times)], 0.0

    async def main() -> None:
        base = await drive(make, script)
        migrated = await drive(make, script, cuts, pause=pause)
        assert len(migrated.states) == len(cuts)
        assert migrated.outputs == base.outputs

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- states of other shapes ---------------------------------------------------------------


def voice_state(**changes: Any) -> dict[str, Any]:
    state = VoiceEngine({}).snapshot()
    state["speaking"] = {"response_id": "resp_1", "text": "hello", "stage": "speak",
                         "next_frame": 3, "delta_sent": False, "cancelled": False}  # fmt: skip
    for key, value in changes.items():
        if key in state["speaking"]:
            state["speaking"][key] = value
        else:
            state[key] = value
    return state


def test_voice_restores_its_own_state() -> None:
    engine = VoiceEngine({})
    engine.restore(voice_state(queued=["a", "b"], responses=1, max_queued=4))
    assert engine.snapshot() == voice_state(queued=["a", "b"], responses=1, max_queued=4)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (b"voice", "not a snapshot of the voice engine"),
        ({"state": "echo/1", "unanswered": None}, "not a snapshot of the voice engine"),
        (voice_state(state="voice/9"), "not a snapshot of the voice engine"),
        (voice_state(responses=None), "'responses' is not a int"),
        (voice_state(responses=-1), "'responses' is -1, under 0"),
        (voice_state(max_queued=0), "'max_queued' is 0, under 1"),
        (voice_state(audio_bytes_received=True), "'audio_bytes_received' is not a int"),
        (voice_state(queued="ab"), "'queued' is not a list"),
        (voice_state(queued=["a", 1]), "'queued' must be a list of texts"),
        (voice_state(speaking=[]), "'speaking' must be an object"),
        (voice_state(stage="said"), "unknown stage 'said'"),
        (voice_state(next_frame=16), "frame 16 is past the text's end"),
        (voice_state(next_frame=1.0), "'next_frame' is not a int"),
        (voice_state(delta_sent=1), "'delta_sent' is not a bool"),
        (voice_state(response_id=None), "'response_id' is not a str"),
    ],
)
def test_voice_refuses_a_state_of_another_shape(state: bytes | dict[str, Any], match: str) -> None:
    engine = VoiceEngine({})
    with pytest.raises(ValueError, match=match):
        engine.restore(state)
    assert engine.snapshot() == VoiceEngine({}).snapshot()  # nothing half restored


@given(st.text(max_size=40), st.integers(0, 120))
def test_speech_frames_from_any_frame(text: str, first: int) -> None:
    frames = list(speech_frames(text))
    assert list(speech_frames(text, first)) == frames[first:]
    assert all(len(frame) == FRAME_BYTES for _, frame in frames)
