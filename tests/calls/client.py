"""An aiortc client of ``trio-duplex serve --calls``, as a browser running OpenAI's WebRTC
flow is (docs/plans/webrtc.md §3.1): a peer connection with ``iceServers=[]`` (never
Google's STUN), a microphone track, the ``oai-events`` data channel, a candidate-less
offer (as Chromium's ``createOffer().sdp``), ``POST /v1/realtime/calls`` with it, and the
201's SDP set as the answer.

What it records, in arrival order: every data channel message (JSON events, ``events``)
and every inbound audio frame's RMS (``heard``). Every wait is on a condition with a
deadline (``WAIT_S``), never a sleep. Run it under asyncio (``asyncio.run``), after
``tests.media.rtc.loopback_only()``: aioice gathers on 127.0.0.1 only.

The microphone is ``tests.media.rtc.ToneTrack`` (a 440 Hz tone) or ``PcmTrack`` (any
48 kHz PCM16, e.g. espeak-ng's speech from ``speech_pcm``, then silence).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import av
import httpx2
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..media.rtc import RATE, WAIT_S, PacedTrack, ToneTrack, rms

Event = dict[str, Any]

CALLS_PATH: Final = "/v1/realtime/calls"
CALL_ID: Final = re.compile(r"rtc_[0-9a-f]{32}")
FRAME_SAMPLES: Final = 960  # 20 ms at 48 kHz
HELD_BACK: Final = 16
"""Inbound frames a test may miss of what the server sent: aiortc's receiver holds the last
few in its jitter buffer (``JitterBuffer(capacity=16, prefetch=4)``) until more packets
come, and may drop what it holds when it resets; at most its capacity (measured: 4 of a
reply's last frames, 4 to 8 over a resume)."""


def speech_pcm(text: str) -> bytes:
    """``text`` said by espeak-ng (tests/speech_audio.py), with its half second of silence
    before and a second after, as 48 kHz mono PCM16: what a microphone would send."""
    from ..speech_audio import RATE as SPEECH_RATE
    from ..speech_audio import at_rate, spoken

    return at_rate(spoken(text), SPEECH_RATE, RATE)


class PcmTrack(PacedTrack):
    """A microphone playing ``pcm`` (48 kHz mono PCM16) in 20 ms frames paced by the wall
    clock, then silence for as long as the call lasts. With ``held``, it sends silence
    until ``play()``; ``played`` is set once the last frame of ``pcm`` has been sent."""

    def __init__(self, pcm: bytes, *, held: bool = False) -> None:
        super().__init__()
        self._pcm = pcm
        self._at: int | None = None if held else 0  # the frame ``pcm`` starts on
        self.played = asyncio.Event()

    def play(self) -> None:
        """Start ``pcm`` on the next frame."""
        if self._at is None:
            self._at = self._n

    def chunk(self, n: int) -> bytes:
        if self._at is None:
            return b""
        at = (n - self._at) * FRAME_SAMPLES * 2
        if at + FRAME_SAMPLES * 2 >= len(self._pcm):
            self.played.set()
        return self._pcm[at : at + FRAME_SAMPLES * 2]


def candidates(sdp: str) -> list[list[str]]:
    """Each ``a=candidate`` line's address, port, ``typ`` and type."""
    return [line.split()[4:8] for line in sdp.splitlines() if line.startswith("a=candidate:")]


def without_candidates(sdp: str) -> str:
    return "".join(
        line
        for line in sdp.splitlines(keepends=True)
        if not line.startswith(("a=candidate:", "a=end-of-candidates"))
    )


_OPEN: set[CallClient] = set()
"""Every client not closed yet (``close_all``)."""


async def close_all() -> None:
    """Close every client still open: a test's ``finally``, so that a failed test leaves
    no peer connection (nor aiortc task) behind its loop."""
    for call in list(_OPEN):
        await call.close()


class CallClient:
    """One peer connection of a call (a resume is a new ``CallClient``)."""

    def __init__(
        self,
        mic: MediaStreamTrack | None = None,
        *,
        data_channel: bool = True,
    ) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.dc: RTCDataChannel | None = (
            self.pc.createDataChannel("oai-events") if data_channel else None
        )
        self.events: list[Event] = []
        self.binary: list[bytes] = []  # data channel messages that were not text (none expected)
        self.heard: list[float] = []  # each inbound audio frame's RMS, in order
        self.states: list[str] = []
        self.answer_sdp = ""
        self.location = ""
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        _OPEN.add(self)
        self.pc.addTrack(mic if mic is not None else ToneTrack())
        self.pc.on("track", self._track)
        self.pc.on("connectionstatechange", self._state)
        if self.dc is not None:
            self.dc.on("message", self._message)
            self.dc.on("open", self._changed.set)
            self.dc.on("close", self._changed.set)

    # -- what it records ----------------------------------------------------------------

    def _state(self) -> None:
        self.states.append(self.pc.connectionState)
        self._changed.set()

    def _message(self, message: str | bytes) -> None:
        if isinstance(message, str):
            event = json.loads(message)
            assert isinstance(event, dict), message
            self.events.append(event)
        else:
            self.binary.append(message)
        self._changed.set()

    def _track(self, track: MediaStreamTrack) -> None:
        task = asyncio.get_running_loop().create_task(self._listen(track))
        self._tasks.add(task)

    async def _listen(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                # s16 packed: every channel's samples interleaved in the first plane, which
                # may be padded past them (docs/plans/webrtc.md §1.4).
                width = 2 * len(frame.layout.channels)
                self.heard.append(rms(bytes(frame.planes[0])[: frame.samples * width]))
                self._changed.set()
        except MediaStreamError:
            return

    @property
    def types(self) -> list[str]:
        return [str(event.get("type")) for event in self.events]

    def seqs(self) -> list[int]:
        """The ``server_event_seq`` of every event that carries one, in arrival order."""
        return [e["server_event_seq"] for e in self.events if "server_event_seq" in e]

    # -- waiting ------------------------------------------------------------------------

    async def until(self, test: Callable[[], bool], within: float = WAIT_S) -> None:
        async with asyncio.timeout(within):
            while not test():
                self._changed.clear()
                await self._changed.wait()

    async def event(self, kind: str, start: int = 0, within: float = WAIT_S) -> Event:
        """The first event of type ``kind`` from index ``start`` on."""

        def found() -> Event | None:
            return next((e for e in self.events[start:] if e.get("type") == kind), None)

        try:
            await self.until(lambda: found() is not None, within)
        except TimeoutError:
            raise AssertionError(f"no {kind} within {within}s; got {self.types}") from None
        event = found()
        assert event is not None
        return event

    # -- the flow -----------------------------------------------------------------------

    async def offer(self) -> str:
        """The offer as a browser posts it: gathered, then stripped of its candidates."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return without_candidates(self.pc.localDescription.sdp)

    async def answer(self, sdp: str) -> None:
        self.answer_sdp = sdp
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def post(
        self,
        base_url: str,
        bearer: str | None = None,
        query: Mapping[str, str | int] | None = None,
        *,
        sdp: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx2.Response:
        """``POST /v1/realtime/calls`` (form A) with this client's offer (or ``sdp``); on a
        201 the answer is set. The response is returned whatever its status."""
        body = await self.offer() if sdp is None else sdp
        response = await post_offer(base_url, body, bearer, query, headers)
        if response.status_code == 201:
            self.location = response.headers.get("location", "")
            await self.answer(response.text)
        return response

    async def wait_open(self) -> None:
        assert self.dc is not None
        dc = self.dc
        try:
            await self.until(lambda: dc.readyState == "open")
        except TimeoutError:
            raise AssertionError(f"the data channel did not open; pc {self.states}") from None

    def send(self, event: Event) -> None:
        assert self.dc is not None and self.dc.readyState == "open", "no open data channel"
        self.dc.send(json.dumps(event))

    def say(self, text: str) -> None:
        """A user text message, then ``response.create``."""
        self.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            }
        )
        self.send({"type": "response.create"})

    async def all_arrived(self) -> None:
        """Once this returns, every RTP packet the server sent before it has arrived:
        a ``session.heartbeat`` answered on the data channel, which shares the packets'
        UDP socket (max-bundle), and loopback keeps a socket's datagrams in order. (The
        last few may still be in aiortc's jitter buffer: ``HELD_BACK``.)"""
        start = len(self.events)
        self.send({"type": "session.heartbeat"})
        await self.event("session.heartbeat_ack", start)

    async def packets_received(self) -> int:
        """RTP packets of the inbound audio received so far (``inbound-rtp`` stats): what
        arrived, whether or not the jitter buffer has let it out as frames yet."""
        report = await self.pc.getStats()
        return sum(
            int(stats.packetsReceived)
            for stats in report.values()
            if getattr(stats, "type", None) == "inbound-rtp"
        )

    @property
    def call_id(self) -> str:
        return self.location.rsplit("/", 1)[-1]

    async def close(self) -> None:
        _OPEN.discard(self)
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def client(base_url: str) -> httpx2.AsyncClient:
    """An HTTP client for the server on loopback only: ``trust_env=False``, so no proxy of
    the environment is ever asked."""
    return httpx2.AsyncClient(base_url=base_url, trust_env=False, timeout=WAIT_S)


async def post_offer(
    base_url: str,
    sdp: str | bytes,
    bearer: str | None = None,
    query: Mapping[str, str | int] | None = None,
    headers: Mapping[str, str] | None = None,
) -> httpx2.Response:
    sent = {"Content-Type": "application/sdp", **(headers or {})}
    if bearer is not None:
        sent["Authorization"] = f"Bearer {bearer}"
    async with client(base_url) as http:
        return await http.post(
            CALLS_PATH,
            content=sdp.encode() if isinstance(sdp, str) else sdp,
            params=dict(query or {}),
            headers=sent,
        )


async def hang_up(
    base_url: str, call_id: str, bearer: str | None, *, method: str = "DELETE"
) -> httpx2.Response:
    """``DELETE /v1/realtime/calls/{id}``, or with ``method="POST"`` OpenAI's
    ``POST /v1/realtime/calls/{id}/hangup``."""
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    path = f"{CALLS_PATH}/{call_id}" + ("/hangup" if method == "POST" else "")
    async with client(base_url) as http:
        return await http.request(method, path, headers=headers)


__all__ = [
    "CALLS_PATH",
    "CALL_ID",
    "HELD_BACK",
    "CallClient",
    "PcmTrack",
    "candidates",
    "close_all",
    "hang_up",
    "post_offer",
    "speech_pcm",
    "without_candidates",
]
