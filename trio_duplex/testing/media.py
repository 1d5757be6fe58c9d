"""A media link in memory, for tests of the call shell: no worker process, no aiortc.

``FakeMediaLink.open`` is what a ``CallChannel`` is built with (it gives each call a
``FakeCall``, the ``CallPort`` of media/port.py). The test plays the worker: it pushes
what a worker would send for a call (``dc_open``, ``dc_text``, ``mic``, ``state``,
``played``, ...), and reads what the shell sent (``texts``, ``events``,
``audio_seqs``, ``count(Kind.CLEAR)``, or awaits ``next_event``). Every frame passes
through ``media/wire.py``'s encoding and ``Reader`` both ways, so framing and bounds are
the real link's.

Run ``FakeMediaLink.run`` in a nursery and it also answers as a worker would, per call
(each of ``FakeCall``'s flags turns one off, for a test that plays it by hand):
``OFFER`` → ``ANSWER``; each ``DC_TEXT`` → ``DC_DRAINED`` of its size (``drain_text``);
``AUDIO`` is played one packet every 20 ms of the clock, each reported by ``PLAYED``
(``drained`` on the last one queued) (``play_audio``); ``CLEAR`` empties that queue and
answers ``PLAYED(last, drained, cleared)``; ``CLOSE`` → ``CLOSED`` (``answer_close``).
Under ``MockClock(autojump_threshold=0)`` all of it takes no time.
"""

from __future__ import annotations

import json
import math
from collections import deque
from typing import Any

import attrs
import trio

from ..media import wire
from ..media.port import CallEnd
from ..media.wire import Frame, Kind

PACKET_S = 0.020


def _through_wire(kind: Kind, call: int, payload: bytes) -> Frame:
    """``kind``/``payload`` as the real link would carry them (WireError if it could not)."""
    (frame,) = wire.Reader().feed(wire.encode(kind, call, payload))
    return frame


@attrs.define(eq=False)
class FakeCall:
    """One call: the shell's ``CallPort``, and the worker's side for the test."""

    link: FakeMediaLink
    call: int
    end: CallEnd
    drain_text: bool = True
    play_audio: bool = True
    answer_close: bool = True
    answer_offer: bool = True
    sent: list[Frame] = attrs.field(factory=list)
    """Every frame the shell sent for this call, in order."""
    released: bool = False
    closed: bool = False
    """``CLOSED`` (or ``FAILED``) was pushed: nothing more is."""
    queue: deque[int] = attrs.field(factory=deque)
    """The play queue (seqs) of the automatic worker."""
    played_seqs: list[int] = attrs.field(factory=list)
    """What the automatic worker played, in order."""
    _read: int = 0
    _sent_more: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _queued: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _player: bool = False

    # -- the CallPort -------------------------------------------------------------------

    @property
    def broken(self) -> bool:
        return self.link.broken

    def send(self, kind: Kind, payload: bytes = b"") -> None:
        if self.link.broken:
            raise trio.BrokenResourceError("the media link is broken")
        frame = _through_wire(kind, self.call, payload)
        self.sent.append(frame)
        self._sent_more.unpark_all()
        self.link._outgoing.send_nowait((self, frame))

    def release(self) -> None:
        self.released = True

    # -- the worker's side ----------------------------------------------------------------

    def push(self, kind: Kind, payload: bytes = b"") -> None:
        """Hand the shell one frame, as the link's reader would."""
        assert not self.closed, "the worker said CLOSED: it sends nothing more"
        frame = _through_wire(kind, self.call, payload)
        if kind in (Kind.CLOSED, Kind.FAILED):
            self.closed = True
        self.end.received(frame.kind, frame.payload)

    def dc_open(self) -> None:
        self.push(Kind.DC_OPEN)

    def dc_text(self, message: str | dict[str, Any]) -> None:
        text = message if isinstance(message, str) else json.dumps(message)
        self.push(Kind.DC_TEXT, text.encode())

    def mic(self, pcm: bytes) -> None:
        self.push(Kind.MIC, pcm)

    def state(self, state: str) -> None:
        self.push(Kind.STATE, state.encode("ascii"))

    def played(self, seq: int, *, drained: bool = False, cleared: bool = False) -> None:
        self.push(Kind.PLAYED, wire.pack_played(seq, drained=drained, cleared=cleared))

    def dc_drained(self, size: int) -> None:
        self.push(Kind.DC_DRAINED, wire.pack_drained(size))

    def dc_closed(self) -> None:
        self.push(Kind.DC_CLOSED)

    def fault(self, why: str) -> None:
        self.push(Kind.FAULT, why.encode())

    def close(self) -> None:
        """The worker's ``CLOSED``: the peer connection is closed."""
        self.push(Kind.CLOSED)

    # -- what the shell sent --------------------------------------------------------------

    def of_kind(self, kind: Kind) -> list[bytes]:
        return [frame.payload for frame in self.sent if frame.kind is kind]

    def count(self, kind: Kind) -> int:
        return len(self.of_kind(kind))

    def texts(self) -> list[str]:
        """The data-channel texts the shell sent, in order."""
        return [payload.decode() for payload in self.of_kind(Kind.DC_TEXT)]

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self.texts()]

    def audio(self) -> list[tuple[int, bytes]]:
        """The output packets the shell sent (seq, Opus packet), in order."""
        return [wire.unpack_audio(payload) for payload in self.of_kind(Kind.AUDIO)]

    def audio_seqs(self) -> list[int]:
        return [seq for seq, _ in self.audio()]

    async def next_event(self) -> dict[str, Any]:
        """The next data-channel text the shell sends (after those taken before), parsed."""
        while True:
            texts = self.texts()
            if self._read < len(texts):
                self._read += 1
                event: dict[str, Any] = json.loads(texts[self._read - 1])
                return event
            await self._sent_more.park()

    async def event_of_type(self, kind: str) -> dict[str, Any]:
        """The next event sent of type ``kind`` (those before it are passed over)."""
        while True:
            event = await self.next_event()
            if event.get("type") == kind:
                return event

    async def wait_sent(self, kind: Kind, count: int = 1) -> None:
        """Until the shell has sent ``count`` frames of ``kind`` in all."""
        while self.count(kind) < count:
            await self._sent_more.park()

    # -- the automatic worker -------------------------------------------------------------

    def _answer(self, frame: Frame, nursery: trio.Nursery) -> None:
        if self.closed or self.link.broken:
            return
        kind = frame.kind
        if kind is Kind.OFFER and self.answer_offer:
            self.push(Kind.ANSWER, self.link.answer_sdp.encode())
        elif kind is Kind.DC_TEXT and self.drain_text:
            self.dc_drained(len(frame.payload))
        elif kind is Kind.AUDIO and self.play_audio:
            self.queue.append(wire.unpack_audio(frame.payload)[0])
            self._queued.unpark_all()
            if not self._player:
                self._player = True
                nursery.start_soon(self._play)
        elif kind is Kind.CLEAR and self.play_audio:
            self.queue.clear()
            last = self.played_seqs[-1] if self.played_seqs else 0
            self.played(last, drained=True, cleared=True)
        elif kind is Kind.CLOSE and self.answer_close:
            self.close()

    async def _play(self) -> None:
        while not self.closed and not self.link.broken:
            if not self.queue:
                await self._queued.park()
                continue
            await trio.sleep(PACKET_S)
            if not self.queue or self.closed or self.link.broken:
                continue  # (cleared meanwhile)
            seq = self.queue.popleft()
            self.played_seqs.append(seq)
            self.played(seq, drained=not self.queue)


@attrs.define(eq=False)
class FakeMediaLink:
    """A media link with no worker: each call a ``FakeCall``."""

    answer_sdp: str = "v=0\r\n"
    drain_text: bool = True
    play_audio: bool = True
    """``FakeCall``'s flags for the calls opened from now on."""
    calls: dict[int, FakeCall] = attrs.field(factory=dict)
    broken: bool = False
    _next: int = 1
    _outgoing: trio.MemorySendChannel[tuple[FakeCall, Frame]] = attrs.field(init=False)
    _incoming: trio.MemoryReceiveChannel[tuple[FakeCall, Frame]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._outgoing, self._incoming = trio.open_memory_channel(math.inf)

    def open(self, end: CallEnd) -> FakeCall:
        """A new call for ``end`` (what a ``CallChannel`` is built with)."""
        call = self.calls[self._next] = FakeCall(
            self, self._next, end, drain_text=self.drain_text, play_audio=self.play_audio
        )
        self._next += 1
        return call

    def open_call(self, end: CallEnd) -> FakeCall:
        """As ``MediaLink.open_call`` (the calls' door opens calls so)."""
        if self.broken:
            raise trio.BrokenResourceError("the fake media link is broken")
        return self.open(end)

    @property
    def last(self) -> FakeCall:
        """The call opened last."""
        return self.calls[self._next - 1]

    def break_link(self, why: str = "the worker died") -> None:
        """The worker is gone: every call hears ``link_broken``."""
        self.broken = True
        for call in self.calls.values():
            if not call.released:
                call.end.link_broken(why)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer as a worker would (the module's docstring), until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for call, frame in self._incoming:
                call._answer(frame, nursery)


__all__ = ["FakeCall", "FakeMediaLink"]
