"""``trio-duplex serve --engine speech`` as a subprocess, with outside clients (the
``websockets`` package, native and OpenAI dialects) speaking the outside set's first
sentences (tests/speech_audio.py), said by espeak-ng and flite at test time.

How well speech is heard is judged by pooled word error rate over the first ``COUNT``
sentences in each voice (``WER_BOUND``); a test of one or two sentences (events,
barge-in, resume) asks only that something was heard, since one sentence's rate scatters
far from the set's (the first alone: 0.25 by espeak-ng, 0.5 by flite). A reply is judged
by what the recogniser, run in the test, hears in its audio. Recognition is deterministic
(the same audio gives the same transcript), which the dropped-connection test relies on.
One server serves the module's tests (each server starts a pool of recogniser processes),
warmed by one turn before them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from websockets.trio.client import ClientConnection, connect

from trio_duplex.engines.speech import SESSIONS_PER_CORE, cores

from ..helpers import Serve, ServerProcess, Servers, serve_command
from ..speech_audio import (
    FRAME,
    RATE,
    VOICES,
    at_rate,
    frames,
    is_speech,
    judge,
    judge_reply,
    needs_speech,
    piper_installed,
    recognise,
    reply_to,
    sentences,
    spoken,
    warm_up,
)

pytestmark = [pytest.mark.integration, pytest.mark.media, needs_speech]

Event = dict[str, Any]
ENGINE = "tests.server.speech_engines:speech_or_echo"
COUNT = 16
"""Sentences each voice says in the accuracy tests (32 turns in all): the first ones hold
names and numbers ("mona", "pawel", "ten am"), so a few are no sample of the set. Heard
by the engine (s26-engine, 2026-12-02): the first 8 in both voices 0.22, the first 16 0.15."""
READY_S = 60.0  # a speech server's start: its imports, its voice checked
QUIET = {"turn_detection": {"type": "server_vad", "create_response": False}}
"""A session that announces and transcribes turns but answers none: the accuracy tests
stream sentence after sentence, which replies would only get in the way of."""
OPENAI_RATE = 24_000
TURN_S = 20.0  # the deadline of each wait for a turn's next event
LONG_TURN = " ".join(sentences(2))
"""The real-time tests' turn: the first two sentences said as one, ~5 s. A partial decode
runs every 0.5 s of a turn only while a recogniser is idle, and a word goes out once two
in a row agree on it: a turn of a sentence or two seconds long may firm up no word (on a
loaded machine, or while the pool starts), which is the budget working, not a fault."""


@pytest.fixture(scope="module")
def speech_server(speech_parts: None, serve_module: Serve) -> ServerProcess:
    server = serve_module("--engine", ENGINE, ready_timeout=READY_S)  # --max-sessions: default
    warm_up(server.url)
    return server


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def open_session(ws: ClientConnection, config: Event | None = None) -> Event:
    await send(ws, {"type": "session.update", "session": config or {}})
    created: Event = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    return created


async def close(ws: ClientConnection) -> None:
    """End the session (its slot freed for the next test)."""
    await send(ws, {"type": "session.close"})
    await until(ws, "session.closed", [])


async def stream(ws: ClientConnection, pcm: bytes, *, real_time: bool, seq: int = 0) -> int:
    """Send ``pcm`` as 20 ms appends (numbered after ``seq``), paced or all at once;
    returns the last seq."""
    start = trio.current_time()
    for index, frame in enumerate(frames(pcm)):
        if real_time:
            await trio.sleep_until(start + index * 0.02)
        seq += 1
        append = {"type": "input_audio_buffer.append", "client_event_seq": seq}
        await send(ws, append | {"audio": base64.b64encode(frame).decode()})
    return seq


async def next_event(ws: ClientConnection) -> Event:
    """The next event but the server's ``input.consumed`` reports (control events
    without a seq)."""
    while True:
        event: Event = json.loads(await ws.recv())
        if event["type"] != "input.consumed":
            return event


async def until(ws: ClientConnection, kind: str | set[str], got: list[Event]) -> Event:
    """Receive into ``got`` until an event of type ``kind`` (or of one of them)."""
    while True:
        event = await next_event(ws)
        got.append(event)
        if event["type"] == kind or event["type"] in kind:
            return event


def audio_of(got: list[Event], response_id: str) -> bytes:
    return b"".join(
        base64.b64decode(e["audio"])
        for e in got
        if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
    )


async def turns(
    receive: Callable[[], Awaitable[Event]],
    say: Callable[[bytes], Awaitable[None]],
    pcms: list[bytes],
    kinds: tuple[str, str, str],
    got: list[Event],
) -> list[str]:
    """Say each of ``pcms`` (sent as fast as the socket takes it), and wait, after each,
    until every turn started has its transcript (kinds: the started, done and failed
    events' types); the transcripts, in order (a failed one as "")."""
    started_kind, done_kind, failed_kind = kinds
    started = 0
    heard: list[str] = []
    for pcm in pcms:
        await say(pcm)
        before = started
        while started == before or len(heard) < started:
            event: Event | None = None
            with trio.move_on_after(TURN_S):
                event = await receive()
            if event is None:
                waiting = "a turn to start" if started == before else f"turn {started}'s end"
                last = [e["type"] for e in got[-8:]]
                raise AssertionError(f"waited {TURN_S} s for {waiting}; {heard=}, then {last}")
            got.append(event)
            if event["type"] == started_kind:
                started += 1
            elif event["type"] == done_kind:
                heard.append(str(event.get("text", event.get("transcript"))))
            elif event["type"] == failed_kind:
                heard.append("")
    return heard


async def native_turns(url: str, texts: list[str], voice: str, got: list[Event]) -> list[str]:
    async with connect(url) as ws:
        await open_session(ws, QUIET)
        seq = 0

        async def say(pcm: bytes) -> None:
            nonlocal seq
            seq = await stream(ws, pcm, real_time=False, seq=seq)

        kinds = (
            "input_audio_buffer.speech_started",
            "input_audio.transcript.done",
            "input_audio.transcript.failed",
        )
        pcms = [spoken(text, voice) for text in texts]
        heard = await turns(lambda: next_event(ws), say, pcms, kinds, got)
        await close(ws)
    return heard


async def in_every_voice(talk: Callable[[list[str], str], Awaitable[list[str]]]) -> None:
    """A session per voice at once, each ``talk``ing the first COUNT sentences; what they
    heard judged together (pooled word error rate)."""
    texts = sentences(COUNT)
    heard: dict[str, list[str]] = {}

    async def one(voice: str) -> None:
        heard[voice] = await talk(texts, voice)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for voice in VOICES:
                nursery.start_soon(one, voice)
    judge(texts * len(VOICES), [t for voice in VOICES for t in heard[voice]])


async def test_the_outside_sentences_are_heard_right_in_both_voices(
    speech_server: ServerProcess,
) -> None:
    """Two sessions at once, one a voice, each saying the first COUNT sentences."""
    got: dict[str, list[Event]] = {voice: [] for voice in VOICES}

    async def talk(texts: list[str], voice: str) -> list[str]:
        return await native_turns(speech_server.url, texts, voice, got[voice])

    await in_every_voice(talk)
    for voice in VOICES:
        kinds = [e["type"] for e in got[voice]]
        assert "input_audio.transcript.failed" not in kinds, got[voice]
        assert "response.created" not in kinds  # (create_response: false)
        stopped = [e for e in got[voice] if e["type"] == "input_audio_buffer.speech_stopped"]
        started = [e for e in got[voice] if e["type"] == "input_audio_buffer.speech_started"]
        assert len(stopped) == len(started) >= COUNT
        # Each turn's start and end in the stream's time, in order, none overlapping.
        edges = [x for s, e in zip(started, stopped, strict=True) for x in (s, e)]
        times = [
            float(e["audio_start_ms"] if "audio_start_ms" in e else e["audio_end_ms"])
            for e in edges
        ]
        assert times == sorted(times), times


async def test_a_sentence_spoken_in_real_time_is_transcribed_and_answered_aloud(
    speech_server: ServerProcess,
) -> None:
    """Partial transcripts (deltas) come as the words firm up while the user speaks; the
    reply's audio says the reply's text. (The other tests stream as fast as they can.)"""
    text = LONG_TURN
    got: list[Event] = []
    with trio.fail_after(40):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, spoken(text, "espeak-ng"), real_time=True)
            done = await until(ws, "input_audio.transcript.done", got)
            await until(ws, "response.done", got)
            await close(ws)
    assert done["text"].split(), done
    kinds = [e["type"] for e in got]
    assert kinds[0] == "input_audio_buffer.speech_started"
    deltas = [e["text"] for e in got if e["type"] == "input_audio.transcript.delta"]
    assert deltas, kinds  # heard as it was said
    assert kinds.index("input_audio.transcript.delta") < kinds.index(done["type"])
    assert "input_audio.transcript.delta" not in kinds[kinds.index(done["type"]) :]
    assert "".join(deltas).split(), deltas
    created = got[kinds.index("response.created")]
    said = "".join(e["text"] for e in got if e["type"] == "response.output_text.delta")
    assert said == reply_to(done["text"])
    audio = audio_of(got, created["response_id"])
    assert all(
        len(base64.b64decode(e["audio"])) == FRAME
        for e in got
        if e["type"] == "response.output_audio.delta"
    )
    assert is_speech(audio)
    judge_reply(said, recognise(audio))  # the reply says its text
    seqs = [e["server_event_seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_speech_during_a_reply_cancels_it_barge_in(speech_server: ServerProcess) -> None:
    first, second = sentences(2)
    got: list[Event] = []
    with trio.fail_after(40):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            seq = await stream(ws, spoken(first), real_time=False)
            await until(ws, "response.output_audio.delta", got)  # the reply plays
            await stream(ws, spoken(second), real_time=False, seq=seq)
            # Cancelled when the speech starts, not when its turn ends:
            cancelled = await until(ws, {"response.cancelled", "input_audio.transcript.done"}, got)
            assert cancelled["type"] == "response.cancelled", cancelled
            done = await until(ws, "input_audio.transcript.done", got)
            second_reply = await until(ws, "response.created", got)
            for _ in range(25):  # half a second of its reply
                await until(ws, "response.output_audio.delta", got)
            await close(ws)
    assert cancelled["response_id"] == "resp_1"
    assert second_reply["response_id"] == "resp_2"
    assert done["text"].split(), done
    after = got[got.index(cancelled) :]
    assert not [e for e in after if e.get("response_id") == "resp_1"][1:]  # nothing after
    # Speech started (the barge-in) before the cancel; resp_2 answers the second turn.
    playing = [e["type"] for e in got].index("response.output_audio.delta")
    started = [i for i, e in enumerate(got) if e["type"] == "input_audio_buffer.speech_started"]
    assert [i for i in started if playing < i < got.index(cancelled)], started
    assert is_speech(audio_of(got, "resp_2"))


async def test_a_client_cancel_stops_the_reply(speech_server: ServerProcess) -> None:
    [text] = sentences(1)
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, spoken(text), real_time=False)
            audio = await until(ws, "response.output_audio.delta", got)
            await send(ws, {"type": "response.cancel"})
            cancelled = await until(ws, "response.cancelled", got)
            # The session goes on: a typed turn is answered.
            await send(ws, {"type": "input.text.append", "text": "hello"})
            await until(ws, "response.done", got)
            await close(ws)
    assert cancelled["response_id"] == audio["response_id"] == "resp_1"
    after = got[got.index(cancelled) + 1 : -1]
    assert all(e.get("response_id") == "resp_2" for e in after), after
    said = "".join(e["text"] for e in after if e["type"] == "response.output_text.delta")
    assert said == "you said: hello."


async def test_a_connection_dropped_mid_sentence_resumes_with_nothing_lost(
    speech_server: ServerProcess,
) -> None:
    pcm = spoken(sentences(2)[1], "flite")
    half = len(pcm) // 2 // FRAME * FRAME
    with trio.fail_after(40):
        async with connect(speech_server.url) as ws:  # the same audio, without a drop
            await open_session(ws)
            await stream(ws, pcm, real_time=False)
            whole = await until(ws, "input_audio.transcript.done", [])
            await close(ws)
        got: list[Event] = []
        async with connect(speech_server.url) as ws:
            created = await open_session(ws)
            await stream(ws, pcm[:half], real_time=False)
            await until(ws, "input_audio_buffer.speech_started", got)
        # The socket is gone mid-sentence (the close detaches the session).
        async with connect(speech_server.url) as ws:
            await send(
                ws,
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": got[-1]["server_event_seq"],
                },
            )
            resumed = json.loads(await ws.recv())
            assert resumed["type"] == "session.resumed", resumed
            sent = half // FRAME
            assert resumed["last_received_client_event_seq"] == sent
            await stream(ws, pcm[half:], real_time=False, seq=sent)
            done = await until(ws, "input_audio.transcript.done", got)
            await close(ws)
    assert whole["text"].split(), whole
    assert done["text"] == whole["text"]  # the same samples, the same decode
    seqs = [e["server_event_seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))  # none lost, none twice


async def test_a_neighbour_echo_session_keeps_its_frames_while_speech_is_recognised(
    speech_server: ServerProcess,
) -> None:
    """Three speech sessions decode at once beside an echo session doing round trips:
    the echo's frames keep coming all along (counted: no timing is asserted, the
    benchmark measures the delay)."""
    texts = sentences(3)
    transcripts: dict[int, str] = {}
    echoed: list[int] = []

    async def talker(n: int) -> None:
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, spoken(texts[n], VOICES[n % 2]), real_time=False)
            transcripts[n] = (await until(ws, "input_audio.transcript.done", []))["text"]
            await close(ws)

    with trio.fail_after(60):
        async with connect(speech_server.url) as echo:
            await open_session(echo, {"engine": "echo"})
            async with trio.open_nursery() as nursery:
                for n in range(len(texts)):
                    nursery.start_soon(talker, n)
                n = 0
                while len(transcripts) < len(texts):  # round trips all along the decoding
                    n += 1
                    await send(echo, {"type": "input.text.append", "text": str(n)})
                    reply = json.loads(await echo.recv())
                    assert reply["type"] == "response.output_text.delta", reply
                    echoed.append(int(reply["text"]))
            await close(echo)
    assert echoed == list(range(1, len(echoed) + 1))
    assert len(echoed) > 3 * len(texts), len(echoed)  # more than a few per decode
    assert all(transcripts[n].split() for n in range(len(texts))), transcripts


async def test_a_failing_responder_ends_its_session_only(speech_server: ServerProcess) -> None:
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws, connect(speech_server.url) as other:
            await open_session(ws, {"engine": "broken"})
            await open_session(other)
            await send(ws, {"type": "input.text.append", "text": "hello"})
            got: list[Event] = []
            closed = await until(ws, "session.closed", got)
            await send(other, {"type": "input.text.append", "text": "still there"})
            said = await until(other, "response.output_text.delta", [])
            await close(other)
    assert closed["reason"] == "engine_error"
    assert got[0]["type"] == "response.created"
    assert said["text"] == "you said:"
    speech_server.wait_for_line(r"the model failed on 'hello'", 10)  # logged, once


def maps_of(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(
    not piper_installed() and not os.environ.get("CI"), reason="needs the piper extra"
)
async def test_piper_speaks_from_a_child_process_never_from_the_server(
    speech_server: ServerProcess,
) -> None:
    """The default voice is Piper when its extra is installed, and Piper (GPL-3.0) runs
    only as a child process: its compiled part, ``espeakbridge``, is mapped into the
    child that speaks, never into the server (the check finds it in the child, so it can
    find it in the server)."""
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await send(ws, {"type": "input.text.append", "text": "hello"})
            await until(ws, "response.done", got)
            await close(ws)
    audio = audio_of(got, "resp_1")
    judge_reply("you said: hello.", recognise(audio))
    server = speech_server.proc.pid
    assert "espeakbridge" not in maps_of(server)
    children = psutil.Process(server).children(recursive=True)
    speakers = [c.pid for c in children if "espeakbridge" in maps_of(c.pid)]
    assert speakers, [c.cmdline() for c in children]
    assert all("piper" in psutil.Process(pid).cmdline() for pid in speakers)


@pytest.mark.parametrize("voice", ["flite", "espeak-ng"])
async def test_a_chosen_voice_starts_and_speaks(servers: Servers, voice: str) -> None:
    """The voice asked for speaks the replies (how well tiny.en hears each voice:
    tests/engines/speech/test_voices.py)."""
    server = servers.start(
        "--engine", "speech", "--speech-voice", voice, "--speech-recognisers", "1"
    )
    server.wait_for_line(rf"speech: model .*, voice {re.escape(voice)} \(", 5)
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(server.url) as ws:
            await open_session(ws)
            await send(ws, {"type": "input.text.append", "text": "hello"})
            await until(ws, "response.done", got)
            children = psutil.Process(server.proc.pid).children(recursive=True)
            await close(ws)
    audio = audio_of(got, "resp_1")
    assert is_speech(audio)
    assert len(audio) > RATE  # (over half a second)
    # That voice, not Piper: no Piper process was started.
    assert not [c for c in children if "piper" in c.cmdline()], [c.cmdline() for c in children]


# -- the OpenAI dialect at /v1/realtime ----------------------------------------------------


def realtime_url(server: ServerProcess) -> str:
    return server.url.removesuffix("/v1/duplex") + "/v1/realtime"


async def realtime_session(ws: ClientConnection, turn_detection: Event) -> None:
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    session = {"type": "realtime", "audio": {"input": {"turn_detection": turn_detection}}}
    await send(ws, {"type": "session.update", "session": session})
    updated = json.loads(await ws.recv())
    assert updated["type"] == "session.updated", updated


async def realtime_append(ws: ClientConnection, pcm: bytes, *, real_time: bool) -> None:
    """``pcm`` (16 kHz) sent as OpenAI's default 24 kHz PCM16, 20 ms an append."""
    pcm = at_rate(pcm, RATE, OPENAI_RATE)
    start = trio.current_time()
    for index, at in enumerate(range(0, len(pcm), 960)):
        if real_time:
            await trio.sleep_until(start + index * 0.02)
        chunk = base64.b64encode(pcm[at : at + 960]).decode()
        await send(ws, {"type": "input_audio_buffer.append", "audio": chunk})


async def realtime_event(ws: ClientConnection) -> Event:
    event: Event = json.loads(await ws.recv())
    assert event["type"] != "error", event
    return event


OPENAI_TURN = (
    "input_audio_buffer.speech_started",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
)


async def test_the_openai_dialect_hears_the_outside_sentences(
    speech_server: ServerProcess,
) -> None:
    got: dict[str, list[Event]] = {voice: [] for voice in VOICES}

    async def talk(texts: list[str], voice: str) -> list[str]:
        async with connect(realtime_url(speech_server)) as ws:
            await realtime_session(ws, {"type": "server_vad", "create_response": False})

            async def say(pcm: bytes) -> None:
                await realtime_append(ws, pcm, real_time=False)

            pcms = [spoken(text, voice) for text in texts]
            return await turns(lambda: realtime_event(ws), say, pcms, OPENAI_TURN, got[voice])

    await in_every_voice(talk)
    for voice in VOICES:
        events = got[voice]
        kinds = [e["type"] for e in events]
        assert OPENAI_TURN[2] not in kinds, events
        started = [e for e in events if e["type"] == OPENAI_TURN[0]]
        stopped = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
        completed = [e for e in events if e["type"] == OPENAI_TURN[1]]
        # Each turn one item: started, stopped and its transcript name the same item.
        ids = [e["item_id"] for e in started]
        assert len(set(ids)) == len(ids) >= COUNT
        assert [e["item_id"] for e in stopped] == ids == [e["item_id"] for e in completed]


async def test_the_openai_dialect_streams_a_spoken_turn_and_answers_aloud(
    speech_server: ServerProcess,
) -> None:
    """In real time, with OpenAI's default ``server_vad``: the transcript's deltas, the
    completed transcript, and a reply whose audio says its transcript."""
    text = LONG_TURN
    got: list[Event] = []
    with trio.fail_after(40):
        async with connect(realtime_url(speech_server)) as ws:
            await realtime_session(ws, {"type": "server_vad"})
            await realtime_append(ws, spoken(text, "flite"), real_time=True)
            while not got or got[-1]["type"] != "response.done":
                got.append(await realtime_event(ws))
    kinds = [e["type"] for e in got]
    [completed] = [e for e in got if e["type"] == OPENAI_TURN[1]]
    assert completed["transcript"].split(), completed
    order = [
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.speech_stopped",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_audio.delta",
        "response.done",
    ]
    assert [k for k in dict.fromkeys(kinds) if k in order] == order, kinds
    transcript = "".join(
        e["delta"] for e in got if e["type"] == "response.output_audio_transcript.delta"
    )
    assert transcript == reply_to(completed["transcript"])
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in got if e["type"] == "response.output_audio.delta"
    )
    judge_reply(transcript, recognise(audio, OPENAI_RATE))
    [done] = [e for e in got if e["type"] == "response.done"]
    assert done["response"]["status"] == "completed"


# -- what serve says at start ---------------------------------------------------------------


def slots_max(server: ServerProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=10) as answer:
        slots: int = json.loads(answer.read())["slots_max"]
    return slots


def test_speech_max_sessions_defaults_to_the_cores(speech_server: ServerProcess) -> None:
    assert slots_max(speech_server) == SESSIONS_PER_CORE * cores()


def refused(*flags: str, env: dict[str, str] | None = None) -> str:
    """``serve FLAGS`` exits 2 before it is ready, saying why without a traceback: its
    stderr."""
    result = subprocess.run(
        serve_command(*flags),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "unrecognized arguments" not in result.stderr, result.stderr  # (a flag it knows)
    return result.stderr


# (More of serve's refusals, the missing extra's among them: tests/server/test_speech_cli.py.)


@pytest.mark.parametrize("voice", ["espeak-ng", "flite:no-such-voice"])
def test_a_named_voice_that_is_missing_is_a_startup_error(voice: str, tmp_path: Path) -> None:
    """Never a silent fallback to another voice. (An empty PATH: no program on it.)"""
    env = dict(os.environ, PATH=str(tmp_path)) if ":" not in voice else None
    err = refused("--engine", "speech", "--port", "0", "--speech-voice", voice, env=env)
    assert voice.split(":")[-1] in err, err


def test_a_speech_model_path_that_is_not_there_is_a_startup_error(tmp_path: Path) -> None:
    """A path is never taken for a model name to fetch: it must hold model.bin."""
    path = tmp_path / "no-such-model"
    err = refused("--engine", "speech", "--port", "0", "--speech-model", str(path))
    assert str(path) in err, err
    assert "fetching" not in err


def docs_block(after: str) -> str:
    """The first ```python block of docs/speech.md after the line containing ``after``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "speech.md").read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(after) :], re.S)
    assert match is not None, f"no python block after {after!r}"
    return match.group(1)


async def test_the_docs_responder_streams_its_reply_clause_by_clause(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "assistant.py").write_text(docs_block("## Plugging in a responder"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = servers.start(
        "--engine", "assistant:factory", "--max-sessions", "3", ready_timeout=READY_S
    )
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(server.url) as ws:
            await open_session(ws)
            await send(ws, {"type": "input.text.append", "text": "hello"})
            for _ in range(3):
                await until(ws, "response.output_text.delta", got)
            await close(ws)
    texts = [(i, e["text"]) for i, e in enumerate(got) if e["type"] == "response.output_text.delta"]
    assert [t for _, t in texts] == ["Let me think.", " You said hello,", " I believe."]
    audio = [i for i, e in enumerate(got) if e["type"] == "response.output_audio.delta"]
    # The first clause was spoken while the responder was still producing the second.
    assert texts[0][0] < audio[0] < texts[1][0]
    assert is_speech(audio_of(got, "resp_1"))
    assert slots_max(server) == 3  # the flag wins over the engine's default
