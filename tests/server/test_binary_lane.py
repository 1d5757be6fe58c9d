"""Protocol v2's binary audio lane and audio negotiation, through the server in memory.

docs/protocol.md, "Audio": a session opened with ``session.audio.wire = "binary"`` carries
audio in binary messages with a 12-byte header; everything else stays JSON.
"""

from __future__ import annotations

import base64
import logging
import random
import struct
from typing import Any

import pytest
from trio.testing import MockClock

from trio_duplex.dialects import binary
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import FRAME_BYTES, VoiceEngine
from trio_duplex.testing import SimClient, Simulation, running_server

BINARY = {"audio": {"wire": "binary"}}
PCM24 = {"format": "pcm16", "rate": 24000}
OPUS_IN = {"wire": "binary", "input": {"format": "opus", "rate": 48000}}


def pcm(n: int, seed: int = 0) -> bytes:
    """``n`` samples of distinguishable PCM16."""
    return struct.pack(f"<{n}h", *(((i * 37 + seed) % 65536) - 32768 for i in range(n)))


async def open_binary(sim: Simulation) -> tuple[SimClient, dict[str, Any]]:
    return await sim.open_session(dict(BINARY))


async def test_session_created_returns_the_effective_audio_configuration(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        _, created = await open_binary(sim)
        assert created["session"]["audio"] == {"wire": "binary", "input": PCM24, "output": PCM24}
        _, plain = await sim.open_session({})
        assert "audio" not in plain["session"]  # a v1 client's session.created is v1's


async def test_input_audio_is_echoed_as_binary_with_its_server_seq(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, _ = await open_binary(sim)
        text = await client.send_and_receive({"type": "input.text.append", "text": "hi"})
        assert text["server_event_seq"] == 1 and "binary" not in text  # text stays JSON
        audio = pcm(480)
        await client.send_audio(audio, seq=1)
        echoed = await client.receive()
        assert echoed == {
            "type": "response.output_audio.delta",
            "audio": audio,
            "server_event_seq": 2,
            "binary": True,
        }
        # A binary message with seq 0 carries no client_event_seq: taken as it comes.
        await client.send_audio(pcm(2, seed=9))
        assert (await client.receive())["audio"] == pcm(2, seed=9)


async def test_a_resent_input_audio_message_is_dropped(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await open_binary(sim)
        await client.send_audio(pcm(10), seq=1)
        await client.send_audio(pcm(10), seq=1)  # a resend: dropped
        await client.send_audio(pcm(10, seed=3), seq=2)
        first, second = await client.receive(), await client.receive()
        assert [first["server_event_seq"], second["server_event_seq"]] == [1, 2]
        assert second["audio"] == pcm(10, seed=3)


async def test_binary_output_is_journaled_and_replayed_as_binary(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await open_binary(sim)
        sent = [pcm(240, seed=n) for n in range(3)]
        for n, audio in enumerate(sent, start=1):
            await client.send_audio(audio, seq=n)
        received = [await client.receive() for _ in sent]
        assert [event["audio"] for event in received] == sent
        await client.aclose()
        resumer, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["type"] == "session.resumed"
        assert resumed["session"]["audio"]["wire"] == "binary"
        replay = [await resumer.receive(), await resumer.receive()]
        assert [(e["server_event_seq"], e["audio"], e["binary"]) for e in replay] == [
            (2, sent[1], True),
            (3, sent[2], True),
        ]


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"", "short"),
        (b"\x01\x00\x00\x00\x00\x00\x00", "short"),
        (b"\x03" + bytes(11) + b"\x00\x00", "kind 3"),
        (b"\x01\x01" + bytes(10) + b"\x00\x00", "flags"),
        (b"\x01\x00\x00\x01" + bytes(8) + b"\x00\x00", "reserved"),
        (binary.output_message(1, b"\x00\x00"), "kind 2 from a client"),
        (binary.input_message(1, b"\x00"), "odd PCM16"),
    ],
)
async def test_a_malformed_binary_message_is_refused_and_the_session_goes_on(
    autojump_clock: MockClock, message: bytes, why: str
) -> None:
    async with running_server() as sim:
        client, _ = await open_binary(sim)
        await client.send_raw(message)
        error = await client.receive()
        assert error["type"] == "error" and error["code"] == "bad_event", why
        assert error["retryable"] is False
        # Nothing was lost: seq 1 is still next, unless the message was well formed and
        # its audio refused for good (odd PCM16): then its seq was taken (flow).
        await client.send_audio(pcm(4), seq=2 if why == "odd PCM16" else 1)
        assert (await client.receive())["audio"] == pcm(4)


async def test_binary_on_a_json_session_is_refused(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session({"audio": {"wire": "json"}})
        await client.send_audio(pcm(4), seq=1)
        error = await client.receive()
        assert error["code"] == "bad_event" and "binary" in error["message"]
        echoed = await client.send_and_receive(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm(4)).decode()}
        )
        assert base64.b64decode(echoed["audio"]) == pcm(4)


@pytest.mark.parametrize(
    ("audio", "why"),
    [("AAA", "truncated"), ("AA AA", "space"), ("é", "not base64"), ("AA==", "odd")],
)
async def test_json_audio_that_is_not_pcm16_base64_is_a_bad_event(
    autojump_clock: MockClock, audio: str, why: str
) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        error = await client.send_and_receive({"type": "input_audio_buffer.append", "audio": audio})
        assert (error["code"], error["param"]) == ("bad_event", "audio"), why


@pytest.mark.parametrize(
    ("audio", "param"),
    [
        ({"wire": "carrier-pigeon"}, "session.audio.wire"),
        ({"input": {"format": "mp3"}}, "session.audio.input.format"),
        ({"output": {"format": "pcm16", "rate": 44100}}, "session.audio.output.rate"),
        ({"input": {"format": "g711_ulaw", "rate": 16000}}, "session.audio.input.rate"),
        ("binary", "session.audio"),
    ],
)
async def test_an_unsupported_audio_request_opens_no_session(
    autojump_clock: MockClock, audio: object, param: str
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        error = await client.send_and_receive(
            {"type": "session.update", "session": {"audio": audio}}
        )
        assert error["type"] == "error"
        assert (error["code"], error["param"]) == ("unsupported_audio_format", param)
        assert sim.sessions() == []
        # The connection may still open a session.
        created = await client.send_and_receive({"type": "session.update", "session": BINARY})
        assert created["type"] == "session.created"


class NoAudioEcho(EchoEngine):
    audio_rate = None


async def test_an_engine_without_audio_rate_takes_no_audio_settings(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=NoAudioEcho) as sim:
        client = await sim.connect()
        error = await client.send_and_receive({"type": "session.update", "session": BINARY})
        assert (error["code"], error["param"]) == ("unsupported_audio_format", "session.audio")


async def test_the_voice_engine_speaks_on_the_binary_lane(autojump_clock: MockClock) -> None:
    async with running_server(engine_factory=VoiceEngine) as sim:
        client, _ = await open_binary(sim)
        await client.send({"type": "input.text.append", "text": "hi"})
        kinds: list[str] = []
        frames: list[bytes] = []
        seqs: list[int] = []
        while (event := await client.receive())["type"] != "response.done":
            kinds.append(event["type"])
            seqs.append(event["server_event_seq"])
            if event.get("binary"):
                frames.append(event["audio"])
        assert seqs == list(range(1, len(seqs) + 1))  # one seq order across both lanes
        assert kinds[0] == "response.created" and frames
        assert all(len(frame) == FRAME_BYTES for frame in frames)


@pytest.mark.parametrize("audio", [{"wire": "binary"}, OPUS_IN], ids=["pcm16", "opus"])
async def test_random_binary_messages_never_break_the_session_nor_log_an_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, audio: dict[str, Any]
) -> None:
    """A fuzz of the binary lane through the server: whatever bytes arrive, each message
    is answered with bad_event or taken as audio; nothing is logged at ERROR and the
    session goes on (its next numbered audio is echoed)."""
    rng = random.Random(11)
    async with running_server() as sim:
        client, _ = await sim.open_session({"audio": audio})
        for n in range(300):
            size = rng.choice([0, 1, 11, 12, 13, 14, 40, 200, 961])
            data = bytearray(rng.randbytes(size))
            if size >= 12 and n % 2:  # half of them with a well-formed header
                data[:12] = binary.input_message(0, b"")
            await client.send_raw(bytes(data))
        await client.send({"type": "input.text.append", "text": "still here"})
        while (event := await client.receive())["type"] != "response.output_text.delta":
            assert event["type"] in ("error", "response.output_audio.delta"), event
            if event["type"] == "error":
                assert (event["code"], event["retryable"]) == ("bad_event", False)
        assert event["text"] == "still here"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
