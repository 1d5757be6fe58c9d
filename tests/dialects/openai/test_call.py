"""The ``openai-call`` dialect (dialects/openai/call.py): OpenAI's dialect as a WebRTC
call speaks it. Its opening, its reading of ``session.update`` and of a JSON append, the
session objects it writes, its events against the ``openai`` package's own models
(reference.py), its bound on text, that no WebSocket upgrade selects it, and a resume
through the server's runner that replays the transcript and not the audio."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pydantic
import pytest
import trio
import trio.testing
from openai.types.realtime import RealtimeSessionCreateRequest, SessionCreatedEvent
from trio.testing import MockClock
from websockets.datastructures import Headers
from websockets.http11 import Request

from trio_duplex.cluster.pool import ServerFrames, client_frame
from trio_duplex.core import events
from trio_duplex.core.events import ErrorCode
from trio_duplex.core.frames import Opcode
from trio_duplex.core.opening import OPEN, Grant
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import CALLS_ONLY, NATIVE, by_name
from trio_duplex.dialects.binary import OUTPUT_AUDIO, input_message, parse
from trio_duplex.dialects.jsonwire import LARGE
from trio_duplex.dialects.openai import OPENAI
from trio_duplex.dialects.openai.call import CALL_AUDIO, MAX_TEXT, OPENAI_CALL, call_session
from trio_duplex.dialects.openai.config import defaults
from trio_duplex.server.config import ServerConfig
from trio_duplex.server.front.metrics import exposition
from trio_duplex.server.front.router import DIALECT_HEADER, Router, Upgrade
from trio_duplex.server.server import dialects_of
from trio_duplex.server.sessions.websocket import ConnectionClosed, WebSocket
from trio_duplex.testing import Simulation, running_server

from .reference import validate

Event = dict[str, Any]
LIMITS = {"max_message_bytes": 1 << 20}
PCM_24K = {"type": "audio/pcm", "rate": 24000}
DC_MAX_MESSAGE = 262144
"""aiortc's and Chrome's SCTP max-message-size: the most a data channel message holds."""

# What @openai/agents-realtime's OpenAIRealtimeWebRTC sends once the channel is open
# (docs/plans/webrtc.md §3.2): its formats are OpenAI's default, not the call's.
AGENTS_UPDATE: Event = {
    "type": "session.update",
    "event_id": "evt_sdk_1",
    "session": {
        "type": "realtime",
        "model": "gpt-realtime",
        "instructions": "be brief",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "noise_reduction": None,
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {"type": "semantic_vad"},
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "ash", "speed": 1},
        },
        "tool_choice": "auto",
    },
}


# -- the dialect object --------------------------------------------------------------------


def test_it_is_found_by_name_and_replays_no_audio() -> None:
    assert by_name("openai-call") is OPENAI_CALL
    assert OPENAI_CALL.name == "openai-call" and "openai-call" in CALLS_ONLY
    assert OPENAI_CALL.replays_audio is False
    assert NATIVE.replays_audio is True and OPENAI.replays_audio is True
    assert OPENAI_CALL.binary_lane and OPENAI_CALL.speaks_first
    assert OPENAI_CALL.subprotocol is None  # no WebSocket speaks it
    assert OPENAI_CALL.config_locked_closes is False


# -- the opening ---------------------------------------------------------------------------


def test_a_new_call_opens_with_the_calls_audio() -> None:
    event = OPENAI_CALL.opening({"model": ["gpt-realtime"]}, None)
    assert event == {
        "type": "session.update",
        "session": {**defaults("gpt-realtime"), "audio": dict(CALL_AUDIO)},
    }
    assert event["session"]["audio"] == {
        "wire": "binary",
        "input": {"format": "pcm16", "rate": 48000},
        "output": {"format": "opus", "rate": 48000},
    }
    again = OPENAI_CALL.opening({}, None)  # each opening its own copy
    again["session"]["audio"]["input"]["rate"] = 1
    assert OPENAI_CALL.opening({}, None)["session"]["audio"]["input"]["rate"] == 48000


def test_a_resume_opens_as_openais_does() -> None:
    query = {"resume": ["sess_1"], "last_received_server_event_seq": ["7"]}
    assert OPENAI_CALL.opening(query, "tok") == OPENAI.opening(query, "tok")
    with pytest.raises(ProtocolError) as refused:
        OPENAI_CALL.opening({"resume": ["sess_1"]}, None)
    assert refused.value.code == ErrorCode.INVALID_RESUME_TOKEN


# -- reading ------------------------------------------------------------------------------


def test_session_update_formats_are_accepted_and_ignored() -> None:
    event = OPENAI_CALL.decode(json.dumps(AGENTS_UPDATE))
    assert event["type"] == "session.update" and event["event_id"] == "evt_sdk_1"
    config = event["session"]
    assert "audio" not in config  # the call's audio stays what the track carries
    assert config["turn_detection"] == {"type": "semantic_vad"}
    assert config["input_audio_transcription"] == {"model": "gpt-4o-mini-transcribe"}
    assert config["input_audio_noise_reduction"] is None
    assert (config["voice"], config["speed"], config["instructions"]) == ("ash", 1, "be brief")
    # OPENAI would set the whole audio from those formats: JSON at 24 kHz.
    assert OPENAI.decode(json.dumps(AGENTS_UPDATE))["session"]["audio"]["wire"] == "json"


@pytest.mark.parametrize(
    "audio",
    [
        {"wire": "json"},
        {"output": {"format": {"type": "audio/pcmu"}}},
        {"input": {"format": {"type": "audio/opus", "rate": 48000}}},
    ],
)
def test_any_valid_format_or_wire_is_ignored(audio: Event) -> None:
    update = {"type": "session.update", "session": {"type": "realtime", "audio": audio}}
    assert OPENAI_CALL.decode(json.dumps(update))["session"] == {}


def test_a_format_openai_would_refuse_is_still_refused() -> None:
    update = {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "x"}}}}}
    with pytest.raises(ProtocolError) as refused:
        OPENAI_CALL.decode(json.dumps(update))
    assert refused.value.code == ErrorCode.UNSUPPORTED_AUDIO_FORMAT


def test_a_large_session_update_is_read_in_steps_with_the_same_rules() -> None:
    update = {**AGENTS_UPDATE, "session": {**AGENTS_UPDATE["session"], "instructions": "x" * LARGE}}
    steps = OPENAI_CALL.decode_steps(json.dumps(update))
    slices = 0
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
            slices += 1
    assert slices > 0
    assert "audio" not in done.value.value["session"]


@pytest.mark.parametrize("large", [False, True])
def test_a_json_append_is_refused_naming_audio(large: bool) -> None:
    audio = "AAAA" * (LARGE // 4 if large else 1)
    message = json.dumps({"type": "input_audio_buffer.append", "event_id": "a1", "audio": audio})
    with pytest.raises(ProtocolError) as refused:
        if large:
            steps = OPENAI_CALL.decode_steps(message)
            while True:
                next(steps)
        else:
            OPENAI_CALL.decode(message)
    error = refused.value
    assert (error.code, error.param, error.event_id) == (ErrorCode.BAD_EVENT, "audio", "a1")
    assert "media track" in error.message
    assert error.close_code is None  # the call goes on


def test_the_tracks_audio_arrives_on_the_binary_lane() -> None:
    assert OPENAI_CALL.decode_binary(input_message(0, b"\x01\x02")) == {
        "type": "input_audio_buffer.append",
        "audio": b"\x01\x02",
    }


# -- the session objects it writes ---------------------------------------------------------

CALL_CONFIG: Event = {**defaults("gpt-realtime"), "audio": dict(CALL_AUDIO), "voice": "ash"}


def test_session_created_shows_openais_default_format_and_no_wire() -> None:
    frame = OPENAI_CALL.frame(events.created("sess_1", CALL_CONFIG, "tok", 1, LIMITS))
    model = validate(frame)
    assert isinstance(model, SessionCreatedEvent)
    session: Any = model.session
    assert session.audio.model_extra == {}  # no wire
    data = json.loads(str(frame))["session"]
    assert data["audio"]["input"]["format"] == data["audio"]["output"]["format"] == PCM_24K
    assert "wire" not in data["audio"]
    assert data["audio"]["output"]["voice"] == "ash"
    assert data["model"] == "gpt-realtime"
    # OPENAI shows the same configuration as it is: the binary lane, Opus out.
    theirs = json.loads(str(OPENAI.frame(events.created("sess_1", CALL_CONFIG, "tok", 1, LIMITS))))
    assert theirs["session"]["audio"]["wire"] == "binary"
    assert theirs["session"]["audio"]["output"]["format"] == {"type": "audio/opus", "rate": 48000}


def test_session_resumed_and_updated_show_the_same_session_object() -> None:
    expected = call_session(CALL_CONFIG, "sess_1")
    resumed = json.loads(
        str(OPENAI_CALL.frame(events.resumed("sess_1", CALL_CONFIG, "tok", 2, 0, 0)))
    )
    assert resumed["session"] == expected
    pydantic.TypeAdapter(RealtimeSessionCreateRequest).validate_python(resumed["session"])
    shaper = OPENAI_CALL.shaper(CALL_CONFIG)
    [updated] = shaper.shape(events.updated("sess_1", CALL_CONFIG))
    updated["server_event_seq"] = 3
    model = validate(OPENAI_CALL.frame(updated))
    assert model.type == "session.updated"
    assert json.loads(str(OPENAI_CALL.frame(updated)))["session"] == expected
    # Unshaped (as the core writes it), the same.
    plain = json.loads(str(OPENAI_CALL.frame(events.updated("sess_1", CALL_CONFIG))))
    assert plain["session"] == expected
    restored = OPENAI_CALL.restore_shaper(CALL_CONFIG, shaper.state())
    [again] = restored.shape(events.updated("sess_1", CALL_CONFIG))
    assert again["session"] == expected


# -- a response's events, against the SDK's models ------------------------------------------


def shaped(shaper: Any, engine: list[Event]) -> list[str | bytes]:
    """Each engine event through the call's shaper, sequenced, written as the runner
    writes a call's (output audio on the binary lane)."""
    frames: list[str | bytes] = []
    seq = 0
    for event in engine:
        for out in shaper.shape(event):
            seq += 1
            if out["type"] == "response.output_audio.delta":
                frames.append(OPENAI_CALL.audio_frame(seq, b"opus", None))
            else:
                out["server_event_seq"] = seq
                frames.append(OPENAI_CALL.frame(out))
    return frames


def test_an_audio_responses_events_are_openais_and_its_audio_binary() -> None:
    rid = "resp_1"
    engine: list[Event] = [
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 0},
        {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900},
        {"type": "input_audio_buffer.committed"},
        {"type": "input_audio.transcript.done", "text": "what is the capital of france"},
        {"type": "response.created", "response_id": rid, "output_modalities": ["audio"]},
        {"type": "response.output_text.delta", "response_id": rid, "text": "Paris"},
        {"type": "response.output_audio.delta", "response_id": rid, "audio": b"\x00\x00" * 480},
        {"type": "response.output_text.delta", "response_id": rid, "text": "."},
        {"type": "response.done", "response_id": rid},
    ]
    frames = shaped(OPENAI_CALL.shaper(CALL_CONFIG), engine)
    kinds = []
    for frame in frames:
        if isinstance(frame, bytes):
            kind, _, payload = parse(frame)
            assert (kind, payload) == (OUTPUT_AUDIO, b"opus")
            kinds.append("audio")
            continue
        kinds.append(validate(frame).type)
    assert kinds.count("audio") == 1
    assert "response.output_audio_transcript.delta" in kinds
    assert kinds[-1] == "response.done"
    done = json.loads(str(frames[-1]))
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Paris."


def test_every_text_event_is_bounded_to_fit_a_data_channel_message() -> None:
    """A delta longer than MAX_TEXT goes out as several, in order; the done events keep
    MAX_TEXT characters. Written in characters of 4 UTF-8 bytes, the worst a printable
    text can be, each event still fits 256 KiB."""
    rid = "resp_1"
    text = "\U0001f600" * (MAX_TEXT + 1234)
    engine: list[Event] = [
        {"type": "response.created", "response_id": rid, "output_modalities": ["audio"]},
        {"type": "response.output_text.delta", "response_id": rid, "text": text},
        {"type": "response.done", "response_id": rid},
        {"type": "input_audio.transcript.delta", "text": text},
        {"type": "input_audio.transcript.done", "text": text},
    ]
    frames = shaped(OPENAI_CALL.shaper(CALL_CONFIG), engine)
    for frame in frames:
        assert isinstance(frame, str)
        assert len(frame.encode()) <= DC_MAX_MESSAGE, json.loads(frame)["type"]
        validate(frame)
    data = [json.loads(frame) for frame in frames]
    deltas = [e["delta"] for e in data if e["type"] == "response.output_audio_transcript.delta"]
    assert [len(d) for d in deltas] == [MAX_TEXT, 1234]
    assert "".join(deltas) == text
    (done,) = [e for e in data if e["type"] == "response.output_audio_transcript.done"]
    assert done["transcript"] == text[:MAX_TEXT]
    heard = [e for e in data if e["type"].startswith("conversation.item.input_audio_trans")]
    assert [len(e.get("delta", e.get("transcript"))) for e in heard] == [MAX_TEXT, 1234, MAX_TEXT]
    # OPENAI's bound is its own, far larger: the same delta goes out whole.
    openai_frames = shaped(OPENAI.shaper(defaults()), engine[:2])
    assert len(json.loads(str(openai_frames[-1]))["delta"]) == len(text)


def test_a_restored_shaper_keeps_the_calls_bound() -> None:
    shaper = OPENAI_CALL.shaper(CALL_CONFIG)
    shaper.shape({"type": "response.output_text.delta", "response_id": "r", "text": "x" * 10})
    restored = OPENAI_CALL.restore_shaper(CALL_CONFIG, shaper.state())
    assert restored.max_text == MAX_TEXT
    with pytest.raises(ValueError, match="too long"):
        OPENAI_CALL.restore_shaper(
            CALL_CONFIG, {"state": "openai-shaper/1", "open": [["r", False, "x" * (MAX_TEXT + 1)]]}
        )


# -- no WebSocket upgrade selects it ---------------------------------------------------------


def route(router: Router, path: str, **headers: str) -> Any:
    request = Request(path, Headers({"Host": "example.com", **headers}))
    return router.route(request, urlsplit(request.path), "127.0.0.1")


def test_no_websocket_path_selects_it() -> None:
    router = Router("/v1/duplex", dialects={"/v1/realtime": OPENAI, "/v1/calls": OPENAI_CALL})
    assert route(router, "/v1/realtime") == Upgrade(OPEN, dialect=OPENAI)
    assert route(router, "/v1/calls") == Upgrade(OPEN, ours=False)  # 404, as no path of ours
    # The header a relayed resume names its dialect with means nothing on a client's path.
    assert route(router, "/v1/duplex", **{DIALECT_HEADER: "openai-call"}) == Upgrade(OPEN)
    # The server's own paths never name it.
    assert all(d.name not in CALLS_ONLY for d in dialects_of(ServerConfig()).values())


def test_a_signed_relayed_resume_between_nodes_may_name_it() -> None:
    """A call's session resumed on another node is relayed to its home over the relay
    path, which takes only what a node signed."""
    grant = Grant(None, resume_of="s", relayed=True)

    def check(request: Request) -> tuple[Grant, dict[str, str]] | None:
        return (grant, {}) if request.headers.get("X-Signed") == "yes" else None

    router = Router("/v1/duplex", relay=("/relay", check))
    signed = route(router, "/relay", **{DIALECT_HEADER: "openai-call", "X-Signed": "yes"})
    assert signed == Upgrade(grant, dialect=OPENAI_CALL)
    unsigned = route(router, "/relay", **{DIALECT_HEADER: "openai-call"})
    assert not isinstance(unsigned, Upgrade)


async def test_a_server_given_a_path_for_it_answers_404(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        sim.server.door.dialects["/v1/calls"] = OPENAI_CALL
        stream, _ = await sim.listener.connect()
        await stream.send_all(
            b"GET /v1/calls HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 404"), answer[:80]
        assert sim.sessions() == []


# -- a resume through the runner: the transcript replayed, the audio not ----------------------


class CallClient:
    """A call's client as the session's shell sees it: its messages over an in-memory
    stream (text as the data channel's, binary as the track's), past any handshake."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.frames = ServerFrames()
        self.items: list[tuple[int, bytes]] = []

    async def send(self, event: Event) -> None:
        await self.stream.send_all(client_frame(Opcode.TEXT, json.dumps(event).encode()))

    async def send_pcm(self, pcm: bytes) -> None:
        await self.stream.send_all(client_frame(Opcode.BINARY, input_message(0, pcm)))

    async def message(self) -> str | bytes:
        while not self.items:
            data = await self.stream.receive_some(65536)
            assert data, "the server closed the connection"
            self.items.extend(self.frames.feed(bytes(data)))
        opcode, payload = self.items.pop(0)
        assert opcode in (Opcode.TEXT, Opcode.BINARY), (opcode, payload)
        return payload.decode() if opcode == Opcode.TEXT else payload

    async def until(self, kind: str) -> list[str | bytes]:
        """Every message up to and including the first event of type ``kind``."""
        got: list[str | bytes] = []
        while True:
            message = await self.message()
            got.append(message)
            if isinstance(message, str) and json.loads(message)["type"] == kind:
                return got


@asynccontextmanager
async def call(
    sim: Simulation, query: dict[str, list[str]], bearer: str | None = None
) -> AsyncIterator[CallClient]:
    """A session of the call's dialect served by the server's own Opener and runner."""
    client_end, server_end = trio.testing.memory_stream_pair()
    ws = WebSocket(server_end, 1 << 20)

    async def serve() -> None:  # as the door serves a connection: a gone peer is no fault
        try:
            await sim.server.opener.serve(ws, query, OPEN, OPENAI_CALL, bearer)
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield CallClient(client_end)
        await client_end.aclose()


def seq_of(message: str | bytes) -> int:
    if isinstance(message, bytes):
        return struct.unpack_from(">Q", message, 4)[0]  # type: ignore[no-any-return]
    seq: int = json.loads(message)["server_event_seq"]
    return seq


def text_turn(text: str) -> list[Event]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [
        {"type": "conversation.item.create", "item": item},
        {"type": "response.create"},
    ]


async def test_a_resume_replays_the_text_after_its_seq_once_and_no_audio(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        async with call(sim, {}) as first:
            created = json.loads(await first.message())
            assert created["type"] == "session.created"
            validate(json.dumps(created))
            assert created["session"]["audio"]["input"]["format"] == PCM_24K
            session_id = created["resume"]["session_id"]
            token = created["resume"]["resume_token"]
            # A text turn the client reads whole: it holds every seq up to its end.
            for event in text_turn("hello"):
                await first.send(event)
            read = await first.until("response.done")
            held = max(seq_of(m) for m in read if isinstance(m, str) and "server_event_seq" in m)
            # A spoken turn, answered with audio: it reaches the client's socket, but the
            # peer connection is lost before any of it is played or read.
            await first.send_pcm(b"\x10\x00" * 9600)  # 200 ms of PCM16 at 48 kHz
            await first.send({"type": "input_audio_buffer.commit"})
            await first.send({"type": "response.create"})
            lost = await first.until("response.done")
        assert any(isinstance(m, bytes) for m in lost)  # its audio was sent live
        await trio.testing.wait_all_tasks_blocked()
        session = sim.session(session_id)
        assert session is not None
        journal = [(e.seq, e.frame) for e in session.journal if e.seq > held]
        text_seqs = [seq for seq, frame in journal if isinstance(frame, str)]
        audio = [seq for seq, frame in journal if isinstance(frame, bytes)]
        assert audio
        assert all(parse(f)[0] == OUTPUT_AUDIO for _, f in journal if isinstance(f, bytes))
        assert [seq_of(m) for m in lost if isinstance(m, str)] == text_seqs

        query = {"resume": [session_id], "last_received_server_event_seq": [str(held)]}
        async with call(sim, query, bearer=token) as second:
            resumed = json.loads(await second.message())
            assert resumed["type"] == "session.resumed", resumed
            assert resumed["session"]["audio"]["output"]["format"] == PCM_24K
            assert "wire" not in resumed["session"]["audio"]
            replayed = [await second.message() for _ in text_seqs]
            assert all(isinstance(m, str) for m in replayed)  # no audio frame
            assert [seq_of(m) for m in replayed] == text_seqs  # each once, in order
            assert replayed == [m for m in lost if isinstance(m, str)]  # the same frames
            for message in replayed:
                validate(message)
            # Then live: the next turn, and nothing of the old audio before it.
            for event in text_turn("again"):
                await second.send(event)
            live = await second.until("response.done")
            assert all(isinstance(m, str) for m in live)
            assert min(seq_of(m) for m in live if "server_event_seq" in str(m)) > max(audio)
            assert json.loads(live[-1])["response"]["output"][0]["content"][0]["text"] == "again"
        totals = sim.server.sessions.totals
        assert totals.replay_audio_dropped == len(audio)
        assert totals.replayed_events == len(text_seqs)
        metrics = exposition(sim.server).decode()
        assert f"trio_duplex_replay_audio_dropped_total {float(len(audio))}" in metrics
