"""The media worker (trio_duplex/media/_worker.py) as a real process, driven frame by
frame, with an aiortc client as the browser (UDP on 127.0.0.1 only). Plain functions:
each runs its own asyncio loop."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from trio_duplex.media import wire
from trio_duplex.media.wire import Kind

from .rtc import CONFIG, WAIT_S, Client, WorkerProcess, connected, opus_packets, rms

ROOT = Path(__file__).resolve().parents[2]


def run(test: Callable[[WorkerProcess], Awaitable[None]]) -> None:
    async def main() -> None:
        worker = await WorkerProcess.start()
        try:
            await test(worker)
        finally:
            status = await worker.stop()
        assert status == 0, worker.kinds()

    asyncio.run(main())


def candidates(sdp: str) -> list[list[str]]:
    return [line.split()[4:8] for line in sdp.splitlines() if line.startswith("a=candidate:")]


def test_an_offer_is_answered_with_loopback_host_candidates_only() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = Client()
        worker.offer(1, await client.offer())
        answer = (await worker.next(1, Kind.ANSWER)).payload.decode()
        found = candidates(answer)
        assert found, answer.count("\n")
        for address, _port, typ, kind in found:
            assert (address, typ, kind) == ("127.0.0.1", "typ", "host")
        assert "srflx" not in answer and "relay" not in answer
        codecs = re.findall(r"(?m)^a=rtpmap:\d+ ([^/\s]+)/", answer)
        assert [c.lower() for c in codecs] == ["opus"]  # the answer offers back Opus only
        await client.answer(answer)
        await worker.next(1, Kind.DC_OPEN)
        state = await worker.next(1, Kind.STATE)
        assert state.payload == b"connected"
        await client.close()

    run(test)


def test_data_channel_text_goes_both_ways_and_its_credit_comes_back() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        client.dc.send('{"type":"session.update"}')
        text = await worker.next(1, Kind.DC_TEXT)
        assert text.payload == b'{"type":"session.update"}'
        start = len(worker.frames)
        worker.send(Kind.DC_TEXT, 1, '{"type":"session.created","x":"é"}'.encode())
        await client.until(lambda: bool(client.messages))
        assert client.messages == ['{"type":"session.created","x":"é"}']
        sent = len('{"type":"session.created","x":"é"}'.encode())
        await worker.wait_for(
            lambda f: (
                sum(wire.unpack_drained(d.payload) for d in worker.of(1, Kind.DC_DRAINED)) >= sent
            ),
            start,
        )
        assert sum(wire.unpack_drained(d.payload) for d in worker.of(1, Kind.DC_DRAINED)) == sent
        await client.close()

    run(test)


def test_binary_or_oversize_text_from_the_peer_is_a_fault() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker, max_event_bytes=100)
        client.dc.send(b"\x00\x01")
        fault = await worker.next(1, Kind.FAULT)
        assert b"binary" in fault.payload
        client.dc.send("x" * 101)
        start = len(worker.frames)
        fault = await worker.next(1, Kind.FAULT, start)
        assert b"101 bytes" in fault.payload
        client.dc.send("x" * 100)
        assert (await worker.next(1, Kind.DC_TEXT)).payload == b"x" * 100
        assert not worker.of(1, Kind.FAILED)
        await client.close()

    run(test)


def test_audio_packets_reach_the_peer_paced_and_played_is_reported() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        packets = opus_packets(50)
        for seq, packet in enumerate(packets, 1):
            worker.send(Kind.AUDIO, 1, wire.pack_audio(seq, packet))
        await client.until(lambda: client.loud_frames >= 30)
        # (a drain may be reported earlier too: the first packet can go before the next
        # one has arrived)
        await worker.wait_for(
            lambda f: (
                f.call == 1
                and f.kind == Kind.PLAYED
                and wire.unpack_played(f.payload) == (50, True, False)
            )
        )
        reports = [wire.unpack_played(f.payload) for f in worker.of(1, Kind.PLAYED)]
        seqs = [seq for seq, _, _ in reports]
        assert seqs == sorted(seqs)
        # At most every 100 ms (5 packets), at least one report before the drain.
        assert len(reports) >= 3
        await client.close()

    run(test)


def test_clear_drops_the_queued_packets_and_says_cleared() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        for seq, packet in enumerate(opus_packets(250), 1):  # 5 s of audio
            worker.send(Kind.AUDIO, 1, wire.pack_audio(seq, packet))
        await worker.next(1, Kind.PLAYED)
        worker.send(Kind.CLEAR, 1)
        cleared = await worker.wait_for(
            lambda f: f.call == 1 and f.kind == Kind.PLAYED and wire.unpack_played(f.payload)[2]
        )
        last, drained, _ = wire.unpack_played(cleared.payload)
        assert drained and 1 <= last < 250
        # Nothing queued before the clear goes out after it: the next packet is the next.
        start = len(worker.frames)
        worker.send(Kind.AUDIO, 1, wire.pack_audio(1000, opus_packets(1)[0]))
        after = await worker.wait_for(
            lambda f: f.call == 1 and f.kind == Kind.PLAYED and wire.unpack_played(f.payload)[1],
            start,
        )
        assert wire.unpack_played(after.payload) == (1000, True, False)
        reports = [wire.unpack_played(f.payload) for f in worker.of(1, Kind.PLAYED)]
        after_clear = [seq for seq, _, _ in reports[reports.index((last, True, True)) + 1 :]]
        assert set(after_clear) == {1000}, reports
        await client.close()

    run(test)


def test_the_peers_microphone_arrives_as_48_khz_mono_chunks() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        loud = await worker.wait_for(
            lambda f: f.call == 1 and f.kind == Kind.MIC and rms(f.payload) > 1000
        )
        mic = worker.of(1, Kind.MIC)
        assert {len(f.payload) for f in mic} == {1920}
        assert rms(loud.payload) < 8000  # a tone of amplitude 8000: RMS ~5700
        await client.close()

    run(test)


def test_mic_chunks_follow_the_calls_input_chunk_ms() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker, input_chunk_ms=40)
        await worker.next(1, Kind.MIC)
        assert {len(f.payload) for f in worker.of(1, Kind.MIC)} == {3840}
        await client.close()

    run(test)


def test_the_peer_closing_its_pc_is_state_closed_then_closed() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        await worker.next(1, Kind.STATE)  # connected
        await client.close()
        await worker.next(1, Kind.CLOSED)
        states = [f.payload for f in worker.of(1, Kind.STATE)]
        assert states == [b"connected", b"closed"]
        assert worker.kinds(1)[-1] == "CLOSED"
        # A CLOSE now (the server's, crossing) is answered at once.
        start = len(worker.frames)
        worker.send(Kind.CLOSE, 1)
        await worker.next(1, Kind.CLOSED, start)

    run(test)


def test_close_ends_a_call_and_other_data_channels_are_closed() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker)
        other = client.pc.createDataChannel("other")
        closed = asyncio.Event()
        other.on("close", closed.set)
        async with asyncio.timeout(20):
            await closed.wait()
        worker.send(Kind.CLOSE, 1)
        await worker.next(1, Kind.CLOSED)
        assert worker.of(1, Kind.DC_OPEN) and not worker.of(1, Kind.FAILED)
        await client.until(lambda: client.pc.connectionState == "closed")
        await client.close()

    run(test)


def test_a_bad_offer_fails_that_call_only() -> None:
    async def test(worker: WorkerProcess) -> None:
        worker.send(Kind.OFFER, 7, b"not json")
        failed = await worker.next(7, Kind.FAILED)
        assert b"bad OFFER" in failed.payload
        await worker.next(7, Kind.CLOSED)
        worker.offer(8, "v=0\r\na=ice-pwd:s3cret\r\nnot an offer\r\n")
        refused = (await worker.next(8, Kind.FAILED)).payload
        assert b"refused" in refused and b"s3cret" not in refused
        await worker.next(8, Kind.CLOSED)
        # Another call on the same worker goes on.
        client = await connected(worker, call=9)
        client.dc.send("still here")
        assert (await worker.next(9, Kind.DC_TEXT)).payload == b"still here"
        await client.close()

    run(test)


def test_an_offer_without_opus_is_refused() -> None:
    async def test(worker: WorkerProcess) -> None:
        from aiortc import RTCRtpSender

        client = Client()
        pcmu = [
            c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType == "audio/PCMU"
        ]
        client.pc.getTransceivers()[0].setCodecPreferences(pcmu)
        worker.offer(1, await client.offer())
        failed = await worker.wait_for(lambda f: f.call == 1 and f.kind != Kind.STATE)
        assert failed.kind == Kind.FAILED, worker.kinds(1)
        assert b"refused" in failed.payload
        await worker.next(1, Kind.CLOSED)
        await client.close()

    run(test)


def test_shutdown_closes_every_call_and_exits_0() -> None:
    async def main() -> None:
        worker = await WorkerProcess.start()
        clients = [await connected(worker, call=n) for n in (1, 2)]
        assert await worker.stop() == 0
        assert worker.kinds(1)[-1] == worker.kinds(2)[-1] == "CLOSED"
        for client in clients:
            await client.close()

    asyncio.run(main())


def test_a_framing_fault_ends_the_worker_with_status_2() -> None:
    async def main() -> None:
        worker = await WorkerProcess.start()
        assert worker.process.stdin is not None
        worker.process.stdin.write(b"\xff" + bytes(8))
        async with asyncio.timeout(20):
            assert await worker.process.wait() == 2
        await worker.stop()

    asyncio.run(main())


def test_the_answer_binds_in_the_configured_port_range() -> None:
    async def main() -> None:
        worker = await WorkerProcess.start({**CONFIG, "udp_ports": [41000, 41019]})
        try:
            client = Client()
            worker.offer(1, await client.offer())
            answer = (await worker.next(1, Kind.ANSWER)).payload.decode()
            ports = {int(port) for _, port, _, _ in candidates(answer)}
            assert ports and all(41000 <= p <= 41019 for p in ports), ports
            await client.answer(answer)
            await worker.next(1, Kind.DC_OPEN)
            await client.close()
        finally:
            assert await worker.stop() == 0

    asyncio.run(main())


def test_stats_say_when_each_packet_went_out_when_asked() -> None:
    async def test(worker: WorkerProcess) -> None:
        client = await connected(worker, stats=True)
        for seq, packet in enumerate(opus_packets(5), 1):
            worker.send(Kind.AUDIO, 1, wire.pack_audio(seq, packet))
        await worker.wait_for(
            lambda f: f.call == 1 and f.kind == Kind.STATS and wire.unpack_stats(f.payload)[0] == 5
        )
        stats = [wire.unpack_stats(f.payload) for f in worker.of(1, Kind.STATS)]
        assert [seq for seq, _ in stats] == [1, 2, 3, 4, 5]
        times = [t for _, t in stats]
        assert times == sorted(times)
        await client.close()

    run(test)


def test_the_end_of_its_input_closes_every_call_and_exits_0() -> None:
    async def main() -> None:
        worker = await WorkerProcess.start()
        client = await connected(worker)
        assert worker.process.stdin is not None
        worker.process.stdin.close()
        async with asyncio.timeout(20):
            assert await worker.process.wait() == 0
        await worker.stop()
        assert worker.kinds(1)[-1] == "CLOSED"
        await client.until(lambda: client.pc.connectionState == "closed")
        await client.close()

    asyncio.run(main())


def test_a_peer_that_vanishes_is_closed_by_ice_consent() -> None:
    """docs/plans/webrtc.md §1.4: the worker's consent globals end a silent peer's call
    (here 0.2 s x 2 failures; the server's default is 2 s x 3; aioice's own 5 s x 6 would
    outlast the wait's deadline)."""

    async def main() -> None:
        config = {**CONFIG, "consent_interval_s": 0.2, "consent_failures": 2}
        worker = await WorkerProcess.start(config)
        peer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.media.vanishing_peer",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert peer.stdin is not None and peer.stdout is not None
        try:
            async with asyncio.timeout(WAIT_S):
                worker.offer(1, json.loads(await peer.stdout.readline()))
                answer = (await worker.next(1, Kind.ANSWER)).payload.decode()
                peer.stdin.write(json.dumps(answer).encode() + b"\n")
                assert json.loads(await peer.stdout.readline()) == "open"
            assert (await worker.next(1, Kind.STATE)).payload == b"connected"
            peer.kill()
            await peer.wait()
            await worker.next(1, Kind.CLOSED)
            # Not "failed": aioice closes on consent expiry, aiortc's DTLS transport sees
            # its ICE connection end and closes first, and that closes the pc.
            assert [f.payload for f in worker.of(1, Kind.STATE)] == [b"connected", b"closed"]
        finally:
            if peer.returncode is None:
                peer.kill()
                await peer.wait()
            assert await worker.stop() == 0

    asyncio.run(main())


def test_no_call_credential_is_logged_even_at_debug() -> None:
    """An SDP's ICE ufrag and password and its DTLS fingerprint are the call's credentials:
    the worker's log (stderr, at DEBUG) holds none of the offer's or the answer's, through
    a call, a refused offer and a shutdown."""

    def credentials(sdp: str) -> set[str]:
        found = re.findall(r"(?m)^a=(?:ice-ufrag|ice-pwd|fingerprint:\S+) ?(\S+)\s*$", sdp)
        return {value for value in found if len(value) >= 4}

    async def main() -> None:
        worker = await WorkerProcess.start({**CONFIG, "log_level": "DEBUG"}, capture_log=True)
        client = Client()
        offer = await client.offer()
        worker.offer(1, offer)
        answer = (await worker.next(1, Kind.ANSWER)).payload.decode()
        await client.answer(answer)
        await worker.next(1, Kind.DC_OPEN)
        client.dc.send(b"bytes")  # (a FAULT, logged or not)
        await worker.next(1, Kind.FAULT)
        worker.offer(2, "v=0\r\na=ice-pwd:Zq8s3cretPassw0rd\r\nbroken\r\n")
        await worker.next(2, Kind.CLOSED)
        await client.close()
        await worker.next(1, Kind.CLOSED)
        assert await worker.stop() == 0
        secrets = credentials(offer) | credentials(answer) | {"Zq8s3cretPassw0rd"}
        assert len(secrets) >= 5, secrets
        log = worker.log.decode()
        assert "call 2: the offer was refused" in log  # (the log is there, and at DEBUG)
        assert not [s for s in secrets if s in log]

    asyncio.run(main())
