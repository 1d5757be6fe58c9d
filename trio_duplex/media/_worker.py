"""The media worker: WebRTC calls under aiortc, in a process of its own (issue 28).

Run as ``[sys.executable, "-P", this file, CONFIG_JSON]`` by ``media/link.py``, never
imported by the server: aiortc imports PyAV, whose PyPI wheels link GPL x264/x265
(docs/plans/webrtc.md §0.1), so only this process maps them. It imports the standard
library, aiortc/aioice/av, and ``wire.py`` (loaded by its path: ``-P`` keeps the package
off ``sys.path``); never trio nor the package.

Frames (``wire``) come on stdin and go out on stdout; logs go to stderr (never an SDP: its
ICE ufrag/pwd and DTLS fingerprint are the call's credentials). One asyncio loop serves
every call. Each call's life, as the server sees it:

- ``OFFER`` (JSON: ``sdp`` and the call's settings) -> ``ANSWER`` (the answer's SDP, with
  its host candidates) or ``FAILED`` (why); the data channel ``oai-events`` -> ``DC_OPEN``,
  ``DC_TEXT`` both ways, ``DC_DRAINED`` (credits), ``DC_CLOSED``; the peer's audio ->
  ``MIC`` (48 kHz mono PCM16 chunks); ``AUDIO`` (Opus packets) -> RTP, paced at 20 ms, with
  ``PLAYED`` reports; ``CLEAR``; ``STATE`` (connected, failed, closed).
- Every call ends with exactly one ``CLOSED``, once its peer connection is closed: after
  ``CLOSE``, after a failure (``FAILED`` first), or when the peer connection failed or
  closed by itself. ``CLOSE`` of a call the worker does not know is answered ``CLOSED``.
- One call's exception is logged and ends that call only (``FAILED``, ``CLOSED``).
- ``SHUTDOWN``, or the end of stdin, closes every call and the worker exits 0; a framing
  fault on stdin exits 2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fractions
import functools
import importlib.util
import ipaddress
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aioice.ice
import av
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.exceptions import InvalidAccessError, InvalidStateError, OperationError
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcconfiguration import RTCBundlePolicy

if TYPE_CHECKING:
    from . import wire
else:

    def _load_wire() -> Any:
        name = "_trio_duplex_media_wire"
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("wire.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    wire = _load_wire()

Kind = wire.Kind

log = logging.getLogger("trio_duplex.media.worker")

SAMPLE_RATE: Final = 48_000
PACKET_S: Final = 0.020
PACKET_SAMPLES: Final = 960
TIME_BASE: Final = fractions.Fraction(1, SAMPLE_RATE)
PLAYED_EVERY_S: Final = 0.100
MAX_QUEUED_PACKETS: Final = 12_000
"""A safety bound on a call's play queue (240 s): the server's credits keep it at 120 s."""
MIC_DROP_BYTES: Final = 4 * 1024 * 1024
"""Past this much unwritten output, MIC frames are dropped (counted)."""
MAX_UNWRITTEN_BYTES: Final = 32 * 1024 * 1024
"""Past this much, the server has stopped reading: the worker gives up (exit 3)."""
LABEL: Final = "oai-events"


# -- settings -----------------------------------------------------------------------------


class Settings:
    """The worker's settings (CONFIG_JSON; ``ice_servers`` from the environment, as they
    may hold TURN credentials, which a command line shows to every user)."""

    def __init__(self, raw: dict[str, Any], ice_servers: list[dict[str, Any]]) -> None:
        hosts = raw.get("hosts", ["127.0.0.1"])
        self.hosts: list[str] | None = None if hosts is None else [str(h) for h in hosts]
        ports = raw.get("udp_ports")
        self.udp_ports: tuple[int, int] | None = (
            None if ports is None else (int(ports[0]), int(ports[1]))
        )
        self.allow_peers = [
            ipaddress.ip_network(str(n), strict=False) for n in raw.get("allow_peers", [])
        ]
        self.consent_interval_s = float(raw.get("consent_interval_s", 2.0))
        self.consent_failures = int(raw.get("consent_failures", 3))
        self.close_timeout_s = float(raw.get("close_timeout_s", 2.0))
        self.log_level = str(raw.get("log_level", "WARNING"))
        self.ice_servers = [
            RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
            for s in ice_servers
        ]

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one Settings per process)
    def allowed(self, host: str) -> bool:
        if not self.allow_peers:
            return True
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return False
        return any(address in net for net in self.allow_peers)


class CallSettings:
    """One call's settings, from its OFFER (beside ``sdp``)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.max_event_bytes = min(
            int(raw.get("max_event_bytes", wire.MAX_PAYLOAD)), wire.MAX_PAYLOAD
        )
        chunk_ms = int(raw.get("input_chunk_ms", 20))
        if not 10 <= chunk_ms <= 200 or chunk_ms % 10:
            raise ValueError(f"input_chunk_ms {chunk_ms} (10 to 200, a multiple of 10)")
        self.mic_chunk_bytes = SAMPLE_RATE * chunk_ms // 1000 * 2
        self.stats = bool(raw.get("stats", False))


def strip_candidates(sdp: str, settings: Settings) -> str:
    """The offer without remote candidates aioice must not use: mDNS names (resolving
    them multicasts to 224.0.0.251) and addresses outside ``allow_peers``."""
    lines = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            host = fields[4] if len(fields) > 5 else ""
            if host.endswith(".local") or not settings.allowed(host):
                continue
        lines.append(line)
    return "\r\n".join(lines) + "\r\n"


# -- the loop: bound ports and allowed peers --------------------------------------------------


class _MediaLoop(asyncio.SelectorEventLoop):
    """aioice binds every socket as ``create_datagram_endpoint(..., local_addr=(host, 0))``:
    here the port comes from ``udp_ports`` when set, and datagrams from a source outside
    ``allow_peers`` are dropped before aioice sees them."""

    settings: Settings | None = None

    async def create_datagram_endpoint(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.DatagramProtocol], *args: Any, **kwargs: Any
    ) -> tuple[asyncio.DatagramTransport, asyncio.DatagramProtocol]:
        settings = self.settings
        if settings is None or kwargs.get("sock") is not None:
            return await super().create_datagram_endpoint(protocol_factory, *args, **kwargs)
        factory = protocol_factory
        if settings.allow_peers:
            factory = functools.partial(_filtered, protocol_factory, settings)
        local = kwargs.get("local_addr", args[0] if args else None)
        if settings.udp_ports is None or not isinstance(local, tuple) or local[1] != 0:
            return await super().create_datagram_endpoint(factory, *args, **kwargs)
        lo, hi = settings.udp_ports
        ports = list(range(lo, hi + 1))
        random.shuffle(ports)
        kwargs.pop("local_addr", None)
        rest = args[1:] if args else ()
        error: OSError | None = None
        for port in ports:
            try:
                return await super().create_datagram_endpoint(
                    factory, (local[0], port), *rest, **kwargs
                )
            except OSError as exc:
                error = exc
        raise OSError(f"no free UDP port in {lo}-{hi}") from error


def _filtered(
    factory: Callable[[], asyncio.DatagramProtocol], settings: Settings
) -> asyncio.DatagramProtocol:
    protocol = factory()
    received = protocol.datagram_received

    def datagram_received(data: bytes, addr: tuple[Any, ...]) -> None:
        if settings.allowed(addr[0]):
            received(data, addr)

    protocol.datagram_received = datagram_received  # type: ignore[method-assign]
    return protocol


# -- output -------------------------------------------------------------------------------------


class Output:
    """Frames to the server, through a non-blocking pipe; MIC frames are dropped while
    more than ``MIC_DROP_BYTES`` wait to be written."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self.mic_dropped = 0

    def send(self, kind: wire.Kind, call: int, payload: bytes = b"") -> None:
        if self.transport.is_closing():
            return
        unwritten = self.transport.get_write_buffer_size()
        if unwritten > MAX_UNWRITTEN_BYTES:
            log.error("the server has not read %d bytes of the media worker's output", unwritten)
            os._exit(3)
        if kind == Kind.MIC and unwritten > MIC_DROP_BYTES:
            if not self.mic_dropped % 500:
                log.warning("the server reads slowly: microphone audio dropped")
            self.mic_dropped += 1
            return
        self.transport.write(wire.encode(kind, call, payload))


class _Pipe(asyncio.Protocol):
    """The output pipe's protocol: ``lost`` is done once the transport is closed (after
    ``close()``, once everything buffered has been written) or the server closed it."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


# -- the outbound track ---------------------------------------------------------------------


class PacedOpus(MediaStreamTrack):
    """The server's Opus packets as RTP, one every 20 ms; none while the queue is empty
    (an idle call costs nothing). ``pts`` follows the wall clock across idle gaps, so the
    peer's jitter buffer sees a pause, not a jump."""

    kind = "audio"

    def __init__(self, played: Callable[[int, bool, bool], None]) -> None:
        super().__init__()
        self._played = played
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._ready = asyncio.Event()
        self._due: float | None = None  # when the previous packet went (None: idle)
        self._pts = 0
        self.last_seq = 0
        self._reported = 0.0
        self._playing = False  # packets went since the last drained report
        self.on_sent: Callable[[int], None] | None = None

    def push(self, seq: int, packet: bytes) -> None:
        if len(self._queue) >= MAX_QUEUED_PACKETS:
            self._queue.popleft()
            log.warning("a call's play queue is over its bound: a packet dropped")
        self._queue.append((seq, packet))
        self._ready.set()

    def clear(self) -> None:
        self._queue.clear()
        self._played(self.last_seq, True, True)
        self._playing = False

    async def recv(self) -> av.Packet[Any]:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._playing:
                    self._played(self.last_seq, True, False)
                    self._playing = False
                while not self._queue:
                    if self.readyState != "live":
                        raise MediaStreamError
                    self._ready.clear()
                    await self._ready.wait()
            now = loop.time()
            if self._due is None or now - self._due > 2 * PACKET_S:  # after idle
                if self._due is not None:
                    self._pts += PACKET_SAMPLES * max(0, round((now - self._due) / PACKET_S) - 1)
                due = now
            else:
                due = self._due + PACKET_S
                if due > now:
                    await asyncio.sleep(due - now)
            if not self._queue:  # cleared meanwhile
                self._due = None
                continue
            seq, payload = self._queue.popleft()
            self._due = due
            packet = av.Packet(payload)
            packet.pts = self._pts
            packet.time_base = TIME_BASE
            self._pts += PACKET_SAMPLES
            self.last_seq = seq
            self._playing = True
            if self.on_sent is not None:
                self.on_sent(seq)
            if due - self._reported >= PLAYED_EVERY_S:
                self._reported = due
                self._played(seq, False, False)
            return packet


def downmix(mono: av.AudioResampler, frame: av.AudioFrame) -> bytes:
    """``frame`` (aiortc decodes Opus to s16 stereo) as 48 kHz mono PCM16: each sample
    the mean of its channels (libswresample's stereo -> mono matrix, normalised). The
    resampler's planes are padded (1984 bytes for 960 samples), hence the cut."""
    return b"".join(bytes(f.planes[0])[: f.samples * 2] for f in mono.resample(frame))


# -- a call -------------------------------------------------------------------------------


class Call:
    def __init__(self, worker: Worker, number: int) -> None:
        self.worker = worker
        self.number = number
        self.out = worker.out
        self.pc: RTCPeerConnection | None = None
        self.dc: RTCDataChannel | None = None
        self.track = PacedOpus(self._send_played)
        self.settings: CallSettings | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing: asyncio.Task[None] | None = None
        self.dc_sent = 0  # payload bytes handed to the data channel
        self.dc_reported = 0  # of them, returned as DC_DRAINED

    def send(self, kind: wire.Kind, payload: bytes = b"") -> None:
        self.out.send(kind, self.number, payload)

    def _send_played(self, seq: int, drained: bool, cleared: bool) -> None:
        self.send(Kind.PLAYED, wire.pack_played(seq, drained=drained, cleared=cleared))
        self._report_drained()

    def spawn(self, coro: Any, what: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            if not task.cancelled() and (exc := task.exception()) is not None:
                self.fail(f"{what}: {type(exc).__name__}", exc)

        task.add_done_callback(done)

    def guard(self, fn: Callable[..., None]) -> Callable[..., None]:
        """A pyee callback whose exception ends this call only."""

        def guarded(*args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:
                self.fail(f"{fn.__name__}: {type(exc).__name__}", exc)

        return guarded

    def fail(self, why: str, exc: BaseException | None = None, *, clients: bool = False) -> None:
        """End the call with ``FAILED``. ``clients``: the client's fault (an offer it
        cannot be answered on), told at INFO without a traceback; else ours, an ERROR."""
        if self.closing is not None:
            return
        if clients:
            log.info("call %d: %s", self.number, why)
        else:
            log.error("call %d failed: %s", self.number, why, exc_info=exc)
        self.send(Kind.FAILED, why.encode())
        self.close()

    # -- offer -> answer

    async def answer(self, payload: bytes) -> None:
        try:
            raw = json.loads(payload)
            if not isinstance(raw, dict) or not isinstance(raw.get("sdp"), str):
                raise ValueError("an OFFER is a JSON object with an 'sdp' string")
            self.settings = CallSettings(raw)
        except ValueError as exc:
            self.fail(f"a bad OFFER: {exc}")
            return
        settings = self.worker.settings
        pc = self.pc = RTCPeerConnection(
            RTCConfiguration(
                iceServers=settings.ice_servers, bundlePolicy=RTCBundlePolicy.MAX_BUNDLE
            )
        )
        pc.on("datachannel", self.guard(self._datachannel))
        pc.on("track", self.guard(self._track))
        pc.on("connectionstatechange", self.guard(self._state))
        transceiver = pc.addTransceiver(self.track, direction="sendrecv")
        transceiver.setCodecPreferences(
            [
                c
                for c in RTCRtpSender.getCapabilities("audio").codecs
                if c.mimeType.lower() == "audio/opus"
            ]
        )
        offer = strip_candidates(raw["sdp"], settings)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc refuses an offer with ValueError/OperationError/...
            self.fail(_refusal(exc), clients=True)
            return
        if self.settings.stats:
            self.track.on_sent = self._sent
        if self.closing is None:
            self.send(Kind.ANSWER, pc.localDescription.sdp.encode())

    def _sent(self, seq: int) -> None:
        self.send(Kind.STATS, wire.pack_stats(seq, time.monotonic_ns()))

    def _state(self) -> None:
        assert self.pc is not None
        state = self.pc.connectionState
        if state in ("connected", "failed", "closed"):
            self.send(Kind.STATE, state.encode())
        if state in ("failed", "closed"):
            self.close()

    # -- the data channel

    def _datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != LABEL or self.dc is not None:
            log.info("call %d: a data channel other than %s closed", self.number, LABEL)
            channel.close()
            return
        self.dc = channel
        channel.bufferedAmountLowThreshold = 0
        channel.on("message", self.guard(self._message))
        channel.on("bufferedamountlow", self.guard(self._report_drained))
        channel.on("close", self.guard(self._dc_closed))
        if channel.readyState == "open":
            self.send(Kind.DC_OPEN)
        else:
            channel.on("open", self.guard(lambda: self.send(Kind.DC_OPEN)))

    def _message(self, message: str | bytes) -> None:
        assert self.settings is not None
        if isinstance(message, bytes):
            self.send(Kind.FAULT, b"a binary data-channel message")
            return
        data = message.encode()
        if len(data) > self.settings.max_event_bytes:
            limit = self.settings.max_event_bytes
            self.send(
                Kind.FAULT,
                f"a data-channel message of {len(data)} bytes (at most {limit})".encode(),
            )
            return
        self.send(Kind.DC_TEXT, data)

    def _dc_closed(self) -> None:
        self.send(Kind.DC_CLOSED)
        self.dc_reported = self.dc_sent  # (nothing more will drain: the credit is returned)
        self._report_drained(force=True)

    def send_text(self, payload: bytes) -> None:
        self.dc_sent += len(payload)
        dc = self.dc
        if dc is None or dc.readyState != "open":
            self.dc_reported += len(payload)  # dropped: its credit returns at once
            self.send(Kind.DC_DRAINED, wire.pack_drained(len(payload)))
            return
        dc.send(payload.decode())
        self._report_drained()

    def _report_drained(self, force: bool = False) -> None:
        dc = self.dc
        if dc is None:
            return
        drained = max(self.dc_reported, min(self.dc_sent, self.dc_sent - dc.bufferedAmount))
        if force or drained > self.dc_reported:
            delta, self.dc_reported = drained - self.dc_reported, drained
            if delta:
                self.send(Kind.DC_DRAINED, wire.pack_drained(delta))

    # -- the peer's audio

    def _track(self, track: MediaStreamTrack) -> None:
        self.spawn(self._read(track), f"reading the peer's {track.kind}")

    async def _read(self, track: MediaStreamTrack) -> None:
        """Always reading (aiortc's queue of decoded frames is unbounded)."""
        if track.kind != "audio":
            with contextlib.suppress(MediaStreamError):
                while True:
                    await track.recv()
            return
        assert self.settings is not None
        chunk = self.settings.mic_chunk_bytes
        mono = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        pending = bytearray()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):
                continue
            pending += downmix(mono, frame)
            while len(pending) >= chunk:
                self.send(Kind.MIC, bytes(pending[:chunk]))
                del pending[:chunk]

    # -- the end

    def close(self) -> None:
        if self.closing is None:
            self.closing = asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        try:
            if self.pc is not None:
                try:
                    await asyncio.wait_for(self.pc.close(), self.worker.settings.close_timeout_s)
                except Exception as exc:  # (TimeoutError too: the call ends anyway)
                    log.warning(
                        "call %d: its peer connection did not close cleanly: %r", self.number, exc
                    )
            self.track.stop()
            for task in list(self.tasks):
                task.cancel()
        finally:
            self.send(Kind.CLOSED)
            self.worker.calls.pop(self.number, None)


def _refusal(exc: BaseException) -> str:
    """Why an offer was refused, without a word of the offer: aiortc's own exceptions
    carry fixed messages ("Failed to set remote audio description send parameters"), but
    a parser's ValueError may quote a line of it, and a line may be its ICE password."""
    what = type(exc).__name__
    if isinstance(exc, (OperationError, InvalidAccessError, InvalidStateError)):
        return f"{wire.OFFER_REFUSED}: {what}: {str(exc)[:200]}"
    return f"{wire.OFFER_REFUSED}: {what} (a malformed or unsupported offer)"


# -- the worker ---------------------------------------------------------------------------


class Worker:
    def __init__(self, settings: Settings, out: Output) -> None:
        self.settings = settings
        self.out = out
        self.calls: dict[int, Call] = {}

    def handle(self, frame: wire.Frame) -> bool:
        """One frame from the server; False once it says SHUTDOWN."""
        kind, number, payload = frame
        if kind == Kind.SHUTDOWN:
            return False
        call = self.calls.get(number)
        if kind == Kind.OFFER:
            if call is not None or number == 0:
                self.out.send(Kind.FAILED, number, b"an OFFER for a call already open")
                return True
            call = self.calls[number] = Call(self, number)
            call.spawn(call.answer(payload), "answering the offer")
        elif call is None:
            if kind == Kind.CLOSE:
                self.out.send(Kind.CLOSED, number)
            elif kind == Kind.DC_TEXT:  # its credit returns
                self.out.send(Kind.DC_DRAINED, number, wire.pack_drained(len(payload)))
        elif kind == Kind.AUDIO:
            call.track.push(*wire.unpack_audio(payload))
        elif kind == Kind.DC_TEXT:
            try:
                call.send_text(payload)
            except Exception as exc:
                call.fail(f"sending data-channel text: {type(exc).__name__}", exc)
        elif kind == Kind.CLEAR:
            call.track.clear()
        elif kind == Kind.CLOSE:
            call.close()
        else:
            raise wire.WireError(f"a {kind.name} frame sent to the media worker")
        return True

    async def close_all(self) -> None:
        calls = list(self.calls.values())
        for call in calls:
            call.close()
        closing = [c.closing for c in calls if c.closing is not None]
        if closing:
            await asyncio.wait(closing, timeout=self.settings.close_timeout_s + 1)


async def main(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    if isinstance(loop, _MediaLoop):
        loop.settings = settings
    loop.set_exception_handler(_loop_exception)
    # The frames' pipe is a copy of fd 1; fd 1 itself now goes to stderr, so that nothing
    # a library prints can break the framing.
    wire_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    transport, pipe = await loop.connect_write_pipe(_Pipe, wire_out)
    out = Output(transport)
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    worker = Worker(settings, out)
    frames = wire.Reader()
    out.send(Kind.READY, 0)
    status = 0
    try:
        running = True
        while running:
            data = await reader.read(2**16)
            if not data:
                break
            try:
                for frame in frames.feed(data):
                    if not worker.handle(frame):
                        running = False
                        break
            except wire.WireError as exc:
                log.error("the server broke the media link's framing: %s", exc)
                status = 2
                break
    finally:
        await worker.close_all()
        if out.mic_dropped:
            log.warning("%d microphone frames dropped (the server read slowly)", out.mic_dropped)
        transport.close()  # (it writes what it holds first)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.close_timeout_s):
                await pipe.lost
    return status


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    log.error("media worker: %s", context.get("message"), exc_info=exc)


def configure(settings: Settings) -> None:
    if settings.hosts is not None:
        hosts = list(settings.hosts)
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: list(hosts)
    aioice.ice.CONSENT_INTERVAL = settings.consent_interval_s  # type: ignore[assignment]
    aioice.ice.CONSENT_FAILURES = settings.consent_failures


def run(argv: Iterable[str]) -> int:
    args = list(argv)
    raw = json.loads(args[0]) if args else {}
    ice = json.loads(os.environ.get("DUPLEX_MEDIA_ICE_SERVERS", "[]"))
    settings = Settings(raw, ice)
    logging.basicConfig(
        stream=sys.stderr,
        level=settings.log_level,
        format="media worker %(levelname)s %(name)s: %(message)s",
    )
    for name in ("aioice", "aiortc"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    configure(settings)
    with asyncio.Runner(loop_factory=_MediaLoop) as runner:
        return runner.run(main(settings))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
