"""Audio formats through the server (protocol v2): the client speaks the negotiated wire
format, the engine hears and speaks 24 kHz PCM16, and the server converts both ways."""

from __future__ import annotations

import base64

import numpy as np
from trio.testing import MockClock

from trio_duplex.audio import MAX_CONVERTED_MS, AudioFormat, Decoder, Encoder
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.testing import SimClient, running_server

from ..audio.helpers import chunks, peak_hz, samples, sine


async def audio_until_text(client: SimClient) -> tuple[list[bytes], list[int]]:
    """Output audio payloads (and every seq) up to the echo of a text marker."""
    payloads: list[bytes] = []
    seqs: list[int] = []
    while True:
        event = await client.receive()
        seqs.append(event["server_event_seq"])
        if event["type"] == "response.output_text.delta":
            return payloads, seqs
        audio = event["audio"]
        payloads.append(audio if isinstance(audio, bytes) else base64.b64decode(audio))


async def test_a_ulaw_phone_call_is_served_by_a_24khz_engine(autojump_clock: MockClock) -> None:
    ulaw = {"format": "g711_ulaw", "rate": 8000}
    async with running_server() as sim:  # the echo engine: 24 kHz PCM16
        client, created = await sim.open_session(
            {"audio": {"wire": "binary", "input": ulaw, "output": ulaw}}
        )
        assert created["session"]["audio"]["output"] == ulaw
        phone = AudioFormat("g711_ulaw", 8000)
        encoder = Encoder(phone, 8000)  # what a telephony bridge sends: 8 kHz μ-law
        sent = [payload for c in chunks(sine(1000, 8000), 8000) for payload in encoder.encode(c)]
        assert all(len(p) == 160 for p in sent)  # 20 ms of μ-law each
        for seq, payload in enumerate(sent, start=1):
            await client.send_audio(payload, seq)
        await client.send({"type": "input.text.append", "text": "end"})
        payloads, seqs = await audio_until_text(client)
    assert seqs == list(range(1, len(seqs) + 1))
    heard = b"".join(Decoder(phone, 8000).decode(p) for p in payloads)
    # Twice through a resampler (8k -> 24k -> 8k): each holds back 10-30 ms.
    assert 8000 - 2 * 240 <= len(heard) // 2 <= 8000
    assert abs(peak_hz(samples(heard), 8000) - 1000) < 10


async def test_the_voice_engine_speaks_alaw_on_the_json_lane(autojump_clock: MockClock) -> None:
    alaw = {"format": "g711_alaw", "rate": 8000}
    async with running_server(engine_factory=VoiceEngine) as sim:
        client, _ = await sim.open_session({"audio": {"output": alaw}})
        await client.send({"type": "input.text.append", "text": "hello"})
        audio = b""
        frames = 0
        while (event := await client.receive())["type"] != "response.done":
            if event["type"] == "response.output_audio.delta":
                assert event["response_id"] == "resp_1"  # the delta's other fields stay
                audio += base64.b64decode(event["audio"])
                frames += 1
    pcm = samples(Decoder(AudioFormat("g711_alaw", 8000), 8000).decode(audio))
    # "hello": 15 frames of tone (300 ms); the resampler's tail is flushed before done.
    assert frames >= 15 and abs(len(pcm) - 15 * 160) <= 160
    assert np.sqrt(np.mean(pcm**2)) > 1000  # a tone, not silence


async def test_opus_both_ways_one_packet_per_20ms(autojump_clock: MockClock) -> None:
    opus = {"format": "opus", "rate": 48000}
    async with running_server() as sim:  # echo: 24 kHz
        client, _ = await sim.open_session(
            {"audio": {"wire": "binary", "input": opus, "output": opus}}
        )
        wire = AudioFormat("opus", 48000)
        encoder = Encoder(wire, 48000)
        packets = [p for c in chunks(sine(440, 48000), 48000) for p in encoder.encode(c)]
        assert len(packets) == 50
        for seq, packet in enumerate(packets, start=1):
            await client.send_audio(packet, seq)
        await client.send({"type": "input.text.append", "text": "end"})
        payloads, _ = await audio_until_text(client)
    assert len(payloads) == 50  # Opus needs no resampler: one packet out per packet in
    decoder = Decoder(wire, 48000)
    heard = b"".join(decoder.decode(p) for p in payloads)
    assert len(heard) == 50 * 960 * 2  # each packet: 20 ms
    assert abs(peak_hz(samples(heard), 48000) - 440) < 10


async def test_a_packet_that_is_not_opus_is_a_bad_event(autojump_clock: MockClock) -> None:
    opus = {"format": "opus", "rate": 48000}
    async with running_server() as sim:
        client, _ = await sim.open_session({"audio": {"wire": "binary", "input": opus}})
        await client.send_audio(b"", 1)
        error = await client.receive()
        assert (error["code"], error["param"]) == ("bad_event", "audio")
        # A refusal for good takes its seq (flow: a resend could only be refused again,
        # and under the next-seq rule nothing after it could be taken otherwise).
        await client.send_audio(b"\xff" * 3, 2)
        error = await client.receive()
        assert (error["code"], error["param"]) == ("bad_event", "audio")
        good = Encoder(AudioFormat("opus", 48000), 24000).encode(bytes(960))
        await client.send_audio(good[0], 3)
        echoed = await client.receive()
        assert echoed["type"] == "response.output_audio.delta"
        assert echoed["server_event_seq"] == 1


async def test_a_message_of_more_audio_than_may_be_resampled_is_refused(
    autojump_clock: MockClock,
) -> None:
    """15 MiB of 8 kHz PCM16 would hold the event loop for a second while resampled."""
    pcm8k = {"format": "pcm16", "rate": 8000}
    async with running_server() as sim:  # echo: 24 kHz
        client, _ = await sim.open_session({"audio": {"wire": "binary", "input": pcm8k}})
        limit = MAX_CONVERTED_MS * 16  # bytes of 8 kHz PCM16
        await client.send_audio(bytes(limit + 2), 1)
        error = await client.receive()
        assert (error["code"], error["param"], error["retryable"]) == ("bad_event", "audio", False)
        assert "2000 ms" in error["message"]
        await client.send_audio(bytes(limit), 2)  # 1 was refused for good: 2 is next
        echoed = await client.receive()
        assert echoed["type"] == "response.output_audio.delta"
