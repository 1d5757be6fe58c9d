"""``trio-duplex serve --engine speech`` as a subprocess, with an outside client (the
``websockets`` package) speaking sentences that espeak-ng synthesises at test time.

PocketSphinx hears espeak-ng's voice poorly (docs/speech.md), so the sentences are ones it
gets right, and the checks ask for their key words. It is deterministic: the same audio
gives the same transcript, which the dropped-connection test relies on.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from websockets.trio.client import ClientConnection, connect

from ..helpers import Serve, ServerProcess, Servers, serve_command
from ..speech_audio import DOOR, FRAME, RATE, WEATHER, frames, is_speech, needs_speech, spoken

pytestmark = [pytest.mark.integration, needs_speech]

Event = dict[str, Any]
ENGINE = "tests.server.speech_engines:speech_or_echo"


@pytest.fixture(scope="module")
def speech_server(serve_module: Serve) -> ServerProcess:
    return serve_module("--engine", ENGINE)  # --max-sessions: the engine's default


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def open_session(ws: ClientConnection, config: Event | None = None) -> Event:
    await send(ws, {"type": "session.update", "session": config or {}})
    created: Event = json.loads(await ws.recv())
    assert created["type"] == "session.created", created
    return created


async def close(ws: ClientConnection) -> None:
    """End the session (its slot and its recogniser freed for the next test)."""
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


async def until(ws: ClientConnection, kind: str | set[str], got: list[Event]) -> Event:
    """Receive into ``got`` until an event of type ``kind`` (or of one of them); return
    it. (The server's ``input.consumed`` reports, control events without a seq, are left
    out.)"""
    while True:
        event: Event = json.loads(await ws.recv())
        if event["type"] == "input.consumed":
            continue
        got.append(event)
        if event["type"] == kind or event["type"] in kind:
            return event


def audio_of(got: list[Event], response_id: str) -> bytes:
    return b"".join(
        base64.b64decode(e["audio"])
        for e in got
        if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
    )


async def test_a_sentence_spoken_in_real_time_is_transcribed_and_answered_aloud(
    speech_server: ServerProcess,
) -> None:
    """(The other tests stream their audio as fast as the socket takes it.)"""
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, spoken(DOOR), real_time=True)
            done = await until(ws, "input_audio.transcript.done", got)
            await until(ws, "response.done", got)
            await close(ws)
    words = done["text"].split()
    assert {"open", "door"} <= set(words), done
    kinds = [e["type"] for e in got]
    assert kinds[0] == "input_audio_buffer.speech_started"
    # Deltas (the first pass's firm words, which the final pass may change) come first.
    assert "input_audio.transcript.delta" not in kinds[kinds.index(done["type"]) :]
    created = got[kinds.index("response.created")]
    said = "".join(e["text"] for e in got if e["type"] == "response.output_text.delta")
    assert said == f"you said: {done['text']}."
    audio = audio_of(got, created["response_id"])
    assert all(
        len(base64.b64decode(e["audio"])) == FRAME
        for e in got
        if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) > RATE  # over half a second of reply
    assert is_speech(audio)
    assert not is_speech(bytes(len(audio)))  # (the check can fail)
    seqs = [e["server_event_seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_speech_during_a_reply_cancels_it_barge_in(speech_server: ServerProcess) -> None:
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            seq = await stream(ws, spoken(DOOR), real_time=False)
            await until(ws, "response.output_audio.delta", got)  # the reply plays
            await stream(ws, spoken(WEATHER), real_time=False, seq=seq)
            # Cancelled when the speech starts, not when its turn ends:
            cancelled = await until(ws, {"response.cancelled", "input_audio.transcript.done"}, got)
            assert cancelled["type"] == "response.cancelled", cancelled
            done = await until(ws, "input_audio.transcript.done", got)
            second = await until(ws, "response.created", got)
            for _ in range(25):  # half a second of its reply
                await until(ws, "response.output_audio.delta", got)
            await close(ws)
    assert cancelled["response_id"] == "resp_1"
    assert second["response_id"] == "resp_2"
    assert "weather" in done["text"].split()
    after = got[got.index(cancelled) :]
    assert not [e for e in after if e.get("response_id") == "resp_1"][1:]  # nothing after
    # Speech started (the barge-in) before the cancel; resp_2 answers the second turn.
    started = [i for i, e in enumerate(got) if e["type"] == "input_audio_buffer.speech_started"]
    assert started and started[-1] < got.index(cancelled)
    assert is_speech(audio_of(got, "resp_2"))


async def test_a_client_cancel_stops_the_reply(speech_server: ServerProcess) -> None:
    got: list[Event] = []
    with trio.fail_after(30):
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, spoken(DOOR), real_time=False)
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
    pcm = spoken(WEATHER)
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
    assert done["text"] == whole["text"]
    seqs = [e["server_event_seq"] for e in got]
    assert seqs == list(range(1, len(seqs) + 1))  # none lost, none twice


async def test_a_neighbour_echo_session_keeps_its_frames_while_speech_is_recognised(
    speech_server: ServerProcess,
) -> None:
    pcm = spoken(DOOR)
    transcripts: list[str] = []
    echoed: list[int] = []

    async def talker() -> None:
        async with connect(speech_server.url) as ws:
            await open_session(ws)
            await stream(ws, pcm, real_time=False)  # recognition as fast as it can go
            transcripts.append((await until(ws, "input_audio.transcript.done", []))["text"])
            await close(ws)

    with trio.fail_after(40):
        async with connect(speech_server.url) as echo:
            await open_session(echo, {"engine": "echo"})
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(talker)
                n = 0
                while len(transcripts) < 3:  # round trips all along the recognition
                    n += 1
                    await send(echo, {"type": "input.text.append", "text": str(n)})
                    reply = json.loads(await echo.recv())
                    assert reply["type"] == "response.output_text.delta", reply
                    echoed.append(int(reply["text"]))
            await close(echo)
    assert echoed == list(range(1, len(echoed) + 1))
    assert len(echoed) > 3
    assert all({"open", "door"} <= set(t.split()) for t in transcripts), transcripts


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


def slots_max(server: ServerProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=10) as answer:
        slots: int = json.loads(answer.read())["slots_max"]
    return slots


def test_speech_max_sessions_defaults_to_the_cores(speech_server: ServerProcess) -> None:
    assert slots_max(speech_server) == 4 * len(os.sched_getaffinity(0))


def test_without_pocketsphinx_serve_says_what_to_install() -> None:
    # As if the extra were not installed: an import of None fails (the import system's
    # own way to block a module), and serve runs as its command does.
    code = (
        "import sys; sys.modules['pocketsphinx'] = None; from trio_duplex.cli import main; "
        "sys.exit(main(['serve', '--engine', 'speech', '--port', '0']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result
    assert "pip install 'trio-duplex[speech]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_espeak_ng_serve_says_what_to_install(tmp_path: Any) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # no espeak-ng on it
    result = subprocess.run(
        serve_command("--engine", "speech", "--port", "0"),
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result
    assert "apt-get install espeak-ng" in result.stderr
    assert "Traceback" not in result.stderr


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
    server = servers.start("--engine", "assistant:factory", "--max-sessions", "3")
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
