"""The media worker's own parts, in this process (importing ``_worker`` imports aiortc,
as only tests may): the loop's peer filter and port range, the offer's candidates."""

from __future__ import annotations

import asyncio
import inspect
import socket
from array import array
from fractions import Fraction

import av
import pytest

from trio_duplex.media import _worker, wire
from trio_duplex.media._worker import Settings, _MediaLoop, downmix, strip_candidates
from trio_duplex.media.wire import Kind


class Recorder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[tuple[bytes, str]] = []
        self.changed = asyncio.Event()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.got.append((data, addr[0]))
        self.changed.set()


def in_media_loop(settings: Settings, main: object) -> None:
    with asyncio.Runner(loop_factory=_MediaLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, _MediaLoop)
        loop.settings = settings
        runner.run(main)  # type: ignore[arg-type]


def test_datagrams_from_outside_the_allowed_peers_are_dropped() -> None:
    settings = Settings({"allow_peers": ["127.0.0.2/32"]}, [])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, recorder = await loop.create_datagram_endpoint(
            Recorder, local_addr=("127.0.0.1", 0)
        )
        address = transport.get_extra_info("sockname")
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b,
        ):
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.2", 0))
            a.sendto(b"from .1", address)  # (queued first on loopback)
            b.sendto(b"from .2", address)
            async with asyncio.timeout(10):
                while not recorder.got:
                    recorder.changed.clear()
                    await recorder.changed.wait()
        transport.close()
        assert recorder.got == [(b"from .2", "127.0.0.2")]

    in_media_loop(settings, main())


def test_sockets_bind_in_the_port_range_and_fail_when_it_is_full() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    settings = Settings({"udp_ports": [base, base + 1]}, [])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transports = []
        for _ in range(2):
            transport, _ = await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
            )
            transports.append(transport)
        ports = {t.get_extra_info("sockname")[1] for t in transports}
        assert ports == {base, base + 1}
        with pytest.raises(OSError, match=f"no free UDP port in {base}-{base + 1}"):
            await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
            )
        for transport in transports:
            transport.close()

    in_media_loop(settings, main())


def test_offers_lose_mdns_and_disallowed_candidates() -> None:
    settings = Settings({"allow_peers": ["127.0.0.0/8"]}, [])
    offer = (
        "v=0\r\n"
        "a=candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host\r\n"
        "a=candidate:2 1 udp 2122260223 0b5e-4e.local 50001 typ host\r\n"
        "a=candidate:3 1 udp 2122260223 10.1.2.3 50002 typ host\r\n"
        "a=end-of-candidates\r\n"
    )
    kept = strip_candidates(offer, settings).splitlines()
    assert kept == [
        "v=0",
        "a=candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host",
        "a=end-of-candidates",
    ]
    anyone = Settings({}, [])
    assert "10.1.2.3" in strip_candidates(offer, anyone)
    assert ".local" not in strip_candidates(offer, anyone)


def test_the_worker_sets_aioices_globals() -> None:
    import aioice.ice

    before = (
        aioice.ice.get_host_addresses,
        aioice.ice.CONSENT_INTERVAL,
        aioice.ice.CONSENT_FAILURES,
    )
    # What the worker relies on (docs/plans/webrtc.md §1.4): aioice 0.13's defaults, read
    # as module globals when used. An upgrade that changes this fails here.
    assert before[1:] == (5, 6)
    source = inspect.getsource(aioice.ice.Connection)
    assert "CONSENT_INTERVAL *" in source and "failures >= CONSENT_FAILURES" in source
    assert "addresses = get_host_addresses(" in source
    try:
        _worker.configure(Settings({"hosts": ["127.0.0.1"], "consent_interval_s": 2.0}, []))
        assert aioice.ice.get_host_addresses(True, False) == ["127.0.0.1"]
        assert (aioice.ice.CONSENT_INTERVAL, aioice.ice.CONSENT_FAILURES) == (2.0, 3)
    finally:
        (
            aioice.ice.get_host_addresses,
            aioice.ice.CONSENT_INTERVAL,
            aioice.ice.CONSENT_FAILURES,
        ) = before


def test_the_peers_stereo_frames_are_downmixed_to_mono_pcm16() -> None:
    mono = av.AudioResampler(format="s16", layout="mono", rate=48_000)
    for n in range(3):
        frame = av.AudioFrame(format="s16", layout="stereo", samples=960)
        frame.planes[0].update(array("h", [1000, 3000] * 960).tobytes())  # L, R interleaved
        frame.sample_rate = 48_000
        frame.pts = 960 * n
        frame.time_base = Fraction(1, 48_000)
        pcm = downmix(mono, frame)
        assert len(pcm) == 1920
        assert set(array("h", pcm)) == {2000}


class FakePipe:
    """A write transport whose buffer holds ``unwritten`` bytes."""

    def __init__(self, unwritten: int) -> None:
        self.unwritten = unwritten
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.unwritten

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_past_4_mib_unwritten_mic_frames_are_dropped_and_counted() -> None:
    pipe = FakePipe(_worker.MIC_DROP_BYTES)
    out = _worker.Output(pipe)  # type: ignore[arg-type]
    out.send(_worker.Kind.MIC, 1, b"\x00" * 1920)
    assert len(pipe.written) == 1 and out.mic_dropped == 0  # (at the bound: still written)
    pipe.unwritten += 1
    out.send(_worker.Kind.MIC, 1, b"\x00" * 1920)
    out.send(_worker.Kind.DC_TEXT, 1, b"{}")  # (everything else is still written)
    assert out.mic_dropped == 1
    assert [wire.Reader().feed(w)[0].kind for w in pipe.written] == [Kind.MIC, Kind.DC_TEXT]
