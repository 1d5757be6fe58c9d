"""The call client (client.py) checked against the bare media worker
(tests/media/rtc.py's ``WorkerProcess``), so that what the server's tests measure with it
is known to be measured right: data channel events parsed in order, an inbound tone's RMS
where its amplitude puts it, silence near 0, and the microphone's speech reaching the
worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from trio_duplex.media import wire
from trio_duplex.media.wire import Kind

from ..media.rtc import WorkerProcess, opus_packets, rms
from .client import CallClient, PcmTrack, close_all, speech_pcm

DEADLINE_S = 60.0


def run(test: Callable[[WorkerProcess], Awaitable[None]]) -> None:
    async def main() -> None:
        async with asyncio.timeout(DEADLINE_S):
            worker = await WorkerProcess.start()
            try:
                await test(worker)
            finally:
                await close_all()
                status = await worker.stop()
        assert status == 0, worker.kinds()

    asyncio.run(main())


async def connected(worker: WorkerProcess, client: CallClient) -> None:
    worker.offer(1, await client.offer())
    await client.answer((await worker.next(1, Kind.ANSWER)).payload.decode())
    await worker.next(1, Kind.DC_OPEN)
    await client.wait_open()


def silence_packets(count: int) -> list[bytes]:
    from trio_duplex.audio._opus import OpusEncoder

    encoder = OpusEncoder(48_000, 48_000)
    return [encoder.encode(bytes(1920)) for _ in range(count)]


def test_events_arrive_parsed_in_order_and_the_clients_events_reach_the_worker() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = CallClient()
        await connected(worker, client)
        for n in range(5):
            worker.send(Kind.DC_TEXT, 1, json.dumps({"type": "x", "n": n}).encode())
        await client.until(lambda: len(client.events) == 5)
        assert [e["n"] for e in client.events] == [0, 1, 2, 3, 4]
        assert client.types == ["x"] * 5 and not client.binary
        client.say("hello")
        first = await worker.next(1, Kind.DC_TEXT)
        assert json.loads(first.payload)["item"]["content"][0]["text"] == "hello"
        await client.close()

    run(test)


def test_heard_rms_is_near_0_for_silence_and_where_a_tones_amplitude_puts_it() -> None:
    """A 440 Hz tone of amplitude 8000 has an RMS of 8000/sqrt(2) = 5657; Opus of digital
    silence decodes to (almost) nothing. The server's tests set their thresholds on this."""

    async def test(worker: WorkerProcess) -> None:
        client = CallClient()
        await connected(worker, client)
        for seq, packet in enumerate(silence_packets(50) + opus_packets(50), 1):
            worker.send(Kind.AUDIO, 1, wire.pack_audio(seq, packet))
        await client.until(lambda: sum(1 for r in client.heard if r > 1000) >= 40)
        quiet = client.heard[:40]
        loud = [r for r in client.heard if r > 1000]
        assert max(quiet) < 50, quiet
        assert 5000 < sorted(loud)[len(loud) // 2] < 6300, loud
        await client.close()

    run(test)


def test_the_speech_microphone_reaches_the_worker() -> None:
    async def test(worker: WorkerProcess) -> None:
        pcm = speech_pcm("open the door please")
        assert rms(pcm) > 500
        client = CallClient(PcmTrack(pcm))
        await connected(worker, client)
        # The speech starts after half a second of silence.
        loud = await worker.wait_for(lambda f: f.kind == Kind.MIC and rms(f.payload) > 500)
        assert {len(f.payload) for f in worker.of(1, Kind.MIC)} == {1920}
        assert rms(worker.of(1, Kind.MIC)[0].payload) < 50  # the silence before it
        assert loud.kind == Kind.MIC
        await client.close()

    run(test)
