"""``/v1/realtime`` speaks the OpenAI dialect, over real sockets with ``websockets``.

A real DuplexServer on a TCP port, its default ``--realtime-path``; every server event
the client reads is validated by the ``openai`` package's own models
(tests/dialects/openai/reference.py). The engine here answers ``response.create`` with
a scripted response so that the shaping of text and audio, the encoder's tail and a
cancel are seen end to end; the built-in engines' answers are the engines' tests.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from trio_duplex.core.events import ErrorCode
from trio_duplex.dialects.openai import OPENAI
from trio_duplex.engines.api import Engine, EngineSession
from trio_duplex.server.config import ServerConfig
from trio_duplex.server.server import DuplexServer

from ..dialects.openai.reference import validate

Event = dict[str, Any]
TIMEOUT_S = 10.0
SAMPLES = 1000  # PCM16 at 24 kHz the engine answers with
PCMU = {"format": {"type": "audio/pcmu"}}


class Scripted(Engine):
    """``response.create`` → created, one text or audio delta, and the end: ``done``,
    or ``cancelled`` when the request's metadata asks (``{"end": "cancel"}``)."""

    accepts = frozenset({"response.create", "input_audio_buffer.append"})
    audio_rate: int | None = 24_000

    def __init__(self, config: Any = None) -> None:
        self.n = 0

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            if event["type"] != "response.create":
                continue
            self.n += 1
            rid = f"resp_{self.n}"
            request = event.get("response") or {}
            audio = request.get("output_modalities") == ["audio"]
            await session.send(
                {"type": "response.created", "response_id": rid, "output_modalities": ["audio"]}
                if audio
                else {"type": "response.created", "response_id": rid}
            )
            if audio:
                pcm = struct.pack(f"<{SAMPLES}h", *([1000] * SAMPLES))
                await session.send(
                    {"type": "response.output_audio.delta", "response_id": rid, "audio": pcm}
                )
            else:
                await session.send(
                    {"type": "response.output_text.delta", "response_id": rid, "text": "hi"}
                )
            if (request.get("metadata") or {}).get("end") == "cancel":
                await session.send({"type": "response.cancelled", "response_id": rid})
            else:
                await session.send({"type": "response.done", "response_id": rid})


class Shout(Engine):
    """An engine that knows no audio format (no ``audio_rate``): text in, text out."""

    accepts = frozenset({"input.text.append", "response.create"})

    def __init__(self, config: Any = None) -> None:
        pass

    async def run(self, session: EngineSession) -> None:
        async for _event in session:
            await session.send({"type": "response.created", "response_id": "resp_1"})
            await session.send({"type": "response.done", "response_id": "resp_1"})


@asynccontextmanager
async def serving(
    config: ServerConfig | None = None, engine: type[Engine] = Scripted
) -> AsyncIterator[str]:
    server = DuplexServer(config or ServerConfig(port=0), engine)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, listeners)
        with trio.fail_after(TIMEOUT_S):
            yield f"ws://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


async def receive(ws: ClientConnection) -> Event:
    """The next server event, as the SDK reads it (validated strictly)."""
    message = await ws.recv()
    assert isinstance(message, str)
    validate(message)
    event: Event = json.loads(message)
    return event


async def until(ws: ClientConnection, kind: str) -> list[Event]:
    """Events up to and including the first of ``kind``."""
    seen = [await receive(ws)]
    while seen[-1]["type"] != kind:
        seen.append(await receive(ws))
    return seen


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(json.dumps(event))


async def test_the_upgrade_opens_an_openai_session() -> None:
    async with (
        serving() as url,
        connect(f"{url}/v1/realtime?model=gpt-realtime", subprotocols=["realtime"]) as ws,  # type: ignore[list-item]
    ):
        assert ws.subprotocol == "realtime"
        created = await receive(ws)  # the server spoke first
        assert created["type"] == "session.created"
        session = created["session"]
        assert (session["type"], session["model"]) == ("realtime", "gpt-realtime")
        assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert set(created["resume"]) >= {"session_id", "resume_token", "attachment_generation"}

        await send(ws, type="response.create", response={"output_modalities": ["text"]})
        shaped = await until(ws, "response.done")
        kinds = [e["type"] for e in shaped]
        assert kinds[0] == "response.created"
        assert "response.output_text.delta" in kinds
        assert kinds.index("response.output_text.done") < kinds.index("response.done")
        assert shaped[-1]["response"]["status"] == "completed"
        seqs = [e["server_event_seq"] for e in shaped]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # each shaped event its own

        await send(ws, type="no.such.event", event_id="evt_1")
        error = await receive(ws)  # and the connection goes on
        assert error["type"] == "error"
        assert error["error"]["event_id"] == "evt_1"
        await send(ws, type="response.create")
        assert (await until(ws, "response.done"))[-1]["type"] == "response.done"


async def test_an_engine_with_no_audio_format_serves_openai_sessions() -> None:
    # The upgrade's opening carries the dialect's default audio, which an engine with no
    # audio_rate cannot take: it is the dialect's, not the client's, and is dropped.
    async with serving(engine=Shout) as url, connect(f"{url}/v1/realtime") as ws:
        created = await receive(ws)
        assert created["type"] == "session.created"
        await send(ws, type="response.create")
        assert (await until(ws, "response.done"))[-1]["response"]["status"] == "completed"


class Listening(Scripted):
    """The scripted engine, declaring that it ends turns itself."""

    turn_detection = {"type": "server_vad", "create_response": True}


@pytest.mark.parametrize(
    ("engine", "shown"),
    [(Scripted, None), (Listening, {"type": "server_vad", "create_response": True})],
)
async def test_the_session_shows_the_turn_detection_its_engine_does(
    engine: type[Engine], shown: Event | None
) -> None:
    # A client that sets none learns from session.created whether the server will end
    # its turns (OpenAI's clients commit themselves only when it will not).
    async with serving(engine=engine) as url, connect(f"{url}/v1/realtime") as ws:
        created = await receive(ws)
        assert created["session"]["audio"]["input"]["turn_detection"] == shown
        await send(ws, type="session.update", session={"type": "realtime"})
        updated = await until(ws, "session.updated")
        assert updated[-1]["session"]["audio"]["input"]["turn_detection"] == shown


def test_the_speech_engine_declares_the_turn_detection_it_does() -> None:
    from trio_duplex.engines.speech import SpeechEngine

    assert SpeechEngine.turn_detection is not None
    validate(json.dumps({
        "type": "session.created", "event_id": "event_1",
        "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": dict(SpeechEngine.turn_detection)}}},
    }))  # fmt: skip


async def test_audio_is_shaped_after_the_encoder_with_its_tail_before_the_end() -> None:
    async with serving() as url, connect(f"{url}/v1/realtime") as ws:
        await receive(ws)
        # Set right after session.created, before any audio: the format changes.
        await send(
            ws,
            type="session.update",
            session={"type": "realtime", "audio": {"input": PCMU, "output": PCMU}},
        )
        updated = await receive(ws)
        assert updated["type"] == "session.updated"
        assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}

        sizes = {}
        for end in ("done", "cancel"):
            await send(
                ws,
                type="response.create",
                response={"output_modalities": ["audio"], "metadata": {"end": end}},
            )
            shaped = await until(ws, "response.done")
            kinds = [e["type"] for e in shaped]
            deltas = [i for i, k in enumerate(kinds) if k == "response.output_audio.delta"]
            assert deltas and max(deltas) < kinds.index("response.output_audio.done")
            assert shaped[-1]["response"]["status"] == (
                "completed" if end == "done" else "cancelled"
            )
            sizes[end] = sum(len(shaped[i]["delta"]) for i in deltas)
        # The tail (the resampler's last samples) went out before the end; a cancel drops it.
        assert sizes["cancel"] < sizes["done"]

        # Audio has passed: another format is refused now, naming the field.
        pcm = {"format": {"type": "audio/pcm", "rate": 24000}}
        await send(
            ws, type="session.update", session={"type": "realtime", "audio": {"output": pcm}}
        )
        refused = await receive(ws)
        assert refused["type"] == "error"
        assert refused["error"]["code"] == ErrorCode.BAD_EVENT


async def test_a_resume_on_the_realtime_path_replays_what_was_missed() -> None:
    async with serving() as url:
        async with connect(f"{url}/v1/realtime") as ws:
            created = await receive(ws)
            await send(ws, type="response.create", response={"output_modalities": ["text"]})
            first = await until(ws, "response.done")
        resume = created["resume"]
        last = first[1]["server_event_seq"]  # as if the rest never arrived
        target = (
            f"{url}/v1/realtime?resume={resume['session_id']}&last_received_server_event_seq={last}"
        )
        bearer = {"Authorization": f"Bearer {resume['resume_token']}"}
        async with connect(target, additional_headers=bearer) as ws:
            resumed = json.loads(await ws.recv())
            assert resumed["type"] == "session.resumed"
            replayed = [await receive(ws) for _ in first[2:]]
            assert replayed == first[2:]  # the same events, byte for byte the same ids
            await send(ws, type="response.create", response={"output_modalities": ["text"]})
            later = await until(ws, "response.done")
            assert later[0]["server_event_seq"] == first[-1]["server_event_seq"] + 1

        # Its resume on the native path is refused: it resumes on its own path only.
        async with connect(f"{url}/v1/duplex") as ws:
            await send(
                ws,
                type="session.resume",
                session_id=resume["session_id"],
                resume_token=resumed["resume_token"],
            )
            refused = json.loads(await ws.recv())
            assert (refused["type"], refused["code"]) == ("error", "invalid_session_resume")


async def test_a_resume_without_its_token_is_an_error_then_a_close() -> None:
    async with serving() as url, connect(f"{url}/v1/realtime?resume=sess_x") as ws:
        refused = await receive(ws)
        assert refused["type"] == "error"
        with pytest.raises(ConnectionClosed):
            await ws.recv()


async def test_realtime_path_moves_the_endpoint() -> None:
    async with serving(ServerConfig(port=0, realtime_path="/openai")) as url:
        async with connect(f"{url}/openai", subprotocols=["realtime"]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "realtime"
            assert (await receive(ws))["type"] == "session.created"


async def scrape(url: str) -> str:
    """GET /metrics on the server's own listener, as a scraper would."""
    host, port = url.removeprefix("ws://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer.decode()


async def test_metrics_count_sessions_and_events_by_dialect() -> None:
    async with serving() as url:
        async with connect(f"{url}/v1/realtime") as ws:
            await receive(ws)
            await send(ws, type="response.create", response={"output_modalities": ["text"]})
            shaped = await until(ws, "response.done")
            text = await scrape(url)
            assert 'trio_duplex_dialect_sessions{dialect="openai"} 1.0' in text
        async with connect(f"{url}/v1/duplex") as ws:
            await send(ws, type="session.update", session={})
            await ws.recv()
        text = await scrape(url)
        assert 'trio_duplex_dialect_sessions_opened_total{dialect="openai"} 1.0' in text
        assert 'trio_duplex_dialect_sessions_opened_total{dialect="native"} 1.0' in text
        assert "trio_duplex_sessions_opened_total 2.0" in text  # the series of before
        out = (
            f'trio_duplex_dialect_events_total{{dialect="openai",direction="out"}} {len(shaped)}.0'
        )
        assert out in text  # every shaped event counts


async def test_a_client_gone_with_its_upgrade_holds_no_slot() -> None:
    """The upgrade opens the session: a close frame sent with it (read with the upgrade)
    leaves the session undelivered, its slot free at once (the handshake rule)."""
    async with serving(ServerConfig(port=0, max_sessions=1)) as url:
        host, port = url.removeprefix("ws://").split(":")
        upgrade = (
            f"GET /v1/realtime HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        close = bytes([0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xE8 ^ 2])  # masked close 1000
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(upgrade + close)
            answer = b""
            try:
                while chunk := await stream.receive_some():
                    answer += chunk
            except trio.BrokenResourceError:  # a reset ends it too
                pass
        assert answer.startswith(b"HTTP/1.1 101 ")
        assert b"session.created" not in answer
        async with connect(f"{url}/v1/realtime") as ws:  # the one slot is free
            assert (await receive(ws))["type"] == "session.created"


def test_the_openai_dialect_is_a_dialect() -> None:
    from trio_duplex.dialects import Dialect, by_name

    dialect: Dialect = OPENAI  # (mypy checks it implements the whole interface)
    assert by_name("openai") is dialect
    with pytest.raises(KeyError):
        by_name("klingon")
