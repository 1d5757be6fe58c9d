"""The media worker's tests' parts, under asyncio: the real worker process
(``WorkerProcess``: frames in, frames recorded) and an aiortc client (``Client``), as a
browser would be: a candidate-less offer with an ``oai-events`` data channel and a
microphone track (a 440 Hz tone), reaching the worker by peer-reflexive discovery.

Every wait has a deadline (``WAIT_S``) and waits on a condition, never on a sleep."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from array import array
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import aioice.ice
import av
import pytest
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from trio_duplex.media import wire
from trio_duplex.media.wire import Frame, Kind

WAIT_S: Final = 20.0
RATE: Final = 48_000
WORKER: Final = str(Path(wire.__file__).with_name("_worker.py"))
CONFIG: Final = {"hosts": ["127.0.0.1"], "allow_peers": ["127.0.0.0/8"], "log_level": "INFO"}


def loopback_only() -> None:
    """The client's aioice gathers on 127.0.0.1 only (it leaves loopback out by default)."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]


def loopback_for_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``loopback_only`` for one test: aioice's own lookup is put back after it."""
    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)
    loopback_only()


def tone(samples: int, start: int, freq: float = 440.0, amplitude: int = 8000) -> bytes:
    return array(
        "h",
        (
            int(amplitude * math.sin(2 * math.pi * freq * (start + i) / RATE))
            for i in range(samples)
        ),
    ).tobytes()


def rms(pcm: bytes) -> float:
    samples = array("h", pcm)
    return math.sqrt(sum(s * s for s in samples) / len(samples)) if samples else 0.0


def opus_packets(count: int) -> list[bytes]:
    """``count`` 20 ms Opus packets of a tone, by our own codec wrapper."""
    from trio_duplex.audio._opus import OpusEncoder

    encoder = OpusEncoder(RATE, RATE)
    return [encoder.encode(tone(960, 960 * n)) for n in range(count)]


class WorkerProcess:
    """The worker, with every frame it sent recorded in order."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.frames: list[Frame] = []
        self.log = bytearray()  # its stderr, when captured
        self._changed = asyncio.Condition()
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read())
        self._logger = loop.create_task(self._read_log())
        self.ended = False

    @classmethod
    async def start(
        cls, config: dict[str, Any] | None = None, *, capture_log: bool = False
    ) -> WorkerProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            WORKER,
            json.dumps(CONFIG if config is None else config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture_log else None,
            env={k: v for k, v in os.environ.items() if not k.startswith("TRIO_DUPLEX_")},
        )
        worker = cls(process)
        await worker.wait_for(lambda f: f.kind == Kind.READY)
        return worker

    async def _read_log(self) -> None:
        if self.process.stderr is not None:
            while data := await self.process.stderr.read(65536):
                self.log += data

    async def _read(self) -> None:
        reader = wire.Reader()
        assert self.process.stdout is not None
        while data := await self.process.stdout.read(65536):
            frames = reader.feed(data)
            async with self._changed:
                self.frames.extend(frames)
                self._changed.notify_all()
        async with self._changed:
            self.ended = True
            self._changed.notify_all()

    def send(self, kind: Kind, call: int, payload: bytes = b"") -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(wire.encode(kind, call, payload))

    def offer(self, call: int, sdp: str, **settings: Any) -> None:
        self.send(Kind.OFFER, call, json.dumps({"sdp": sdp, **settings}).encode())

    async def wait_for(self, test: Callable[[Frame], bool], start: int = 0) -> Frame:
        """The first frame from index ``start`` on that passes ``test``."""
        async with asyncio.timeout(WAIT_S), self._changed:
            while True:
                for frame in self.frames[start:]:
                    if test(frame):
                        return frame
                if self.ended:
                    raise AssertionError(f"the worker ended; it sent {self.kinds()}")
                await self._changed.wait()

    async def next(self, call: int, kind: Kind, start: int = 0) -> Frame:
        return await self.wait_for(lambda f: f.call == call and f.kind == kind, start)

    def of(self, call: int, kind: Kind) -> list[Frame]:
        return [f for f in self.frames if f.call == call and f.kind == kind]

    def kinds(self, call: int | None = None) -> list[str]:
        return [f.kind.name for f in self.frames if call is None or f.call == call]

    async def stop(self) -> int:
        if self.process.returncode is None:
            with_stdin = self.process.stdin
            if with_stdin is not None and not with_stdin.is_closing():
                self.send(Kind.SHUTDOWN, 0)
                with_stdin.close()
            try:
                async with asyncio.timeout(WAIT_S):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        await self._reader
        await self._logger
        assert self.process.returncode is not None
        return self.process.returncode


class PacedTrack(MediaStreamTrack):
    """A microphone: 20 ms frames (48 kHz mono PCM16) of ``chunk(n)``, paced by the wall
    clock as a real one is (media pacing: the peer's receiver expects real time)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._n = 0
        self._start: float | None = None

    def chunk(self, n: int) -> bytes:
        """Frame ``n``'s samples (shorter: padded with silence)."""
        raise NotImplementedError

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        due = self._start + self._n * 0.020
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        frame = av.AudioFrame(format="s16", layout="mono", samples=960)
        frame.planes[0].update(self.chunk(self._n).ljust(960 * 2, b"\0"))
        frame.pts = 960 * self._n
        frame.sample_rate = RATE
        frame.time_base = Fraction(1, RATE)
        self._n += 1
        return frame


class ToneTrack(PacedTrack):
    """A microphone playing a 440 Hz tone."""

    def chunk(self, n: int) -> bytes:
        return tone(960, 960 * n)


class Client:
    """A browser-like peer: ``oai-events`` + a microphone, the offer posted without
    candidates (as Chromium's ``createOffer().sdp``)."""

    def __init__(self, *, label: str = "oai-events") -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.dc: RTCDataChannel = self.pc.createDataChannel(label)
        self.messages: list[str | bytes] = []
        self.loud_frames = 0  # received audio frames above the RMS threshold
        self.frames = 0
        self.states: list[str] = []
        self._changed = asyncio.Event()
        self.pc.addTrack(ToneTrack())
        self.pc.on("track", self._track)
        self.dc.on("message", self._message)
        self.dc.on("open", self._changed.set)
        self.pc.on("connectionstatechange", self._state)
        self._tasks: set[asyncio.Task[None]] = set()

    def _state(self) -> None:
        self.states.append(self.pc.connectionState)
        self._changed.set()

    def _message(self, message: str | bytes) -> None:
        self.messages.append(message)
        self._changed.set()

    def _track(self, track: MediaStreamTrack) -> None:
        task = asyncio.get_running_loop().create_task(self._listen(track))
        self._tasks.add(task)

    async def _listen(self, track: MediaStreamTrack) -> None:
        with_error = MediaStreamError
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                self.frames += 1
                if rms(bytes(frame.planes[0])[: frame.samples * 4]) > 500:
                    self.loud_frames += 1
                self._changed.set()
        except with_error:
            return

    async def offer(self, *, candidates: bool = False) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        if not candidates:
            sdp = "".join(
                line
                for line in sdp.splitlines(keepends=True)
                if not line.startswith(("a=candidate:", "a=end-of-candidates"))
            )
        return sdp

    async def answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def until(self, test: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not test():
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()


async def connected(worker: WorkerProcess, call: int = 1, **settings: Any) -> Client:
    """A client whose call ``call`` is answered and whose data channel is open."""
    client = Client()
    worker.offer(call, await client.offer(), **settings)
    answer = await worker.next(call, Kind.ANSWER)
    await client.answer(answer.payload.decode())
    await worker.next(call, Kind.DC_OPEN)
    await client.until(lambda: client.dc.readyState == "open")
    return client
