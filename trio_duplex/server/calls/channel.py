"""``CallChannel``: one WebRTC call as a ``MessageTransport`` (sessions/transport.py).

A call's session is served by the unchanged session shell (``Opener.serve``) over this
channel, as a WebSocket's is over a ``WebSocket``. The call itself, its peer
connection, lives in the media worker, reached through one ``CallPort`` of the media
link (media/port.py); the link hands each frame the worker sends for this call to the
channel (``CallEnd.received``, never blocking), and the channel has no task of its own.

- Reading: the client's data-channel text comes out of ``get_message`` as ``str``;
  its microphone, PCM16 at 48 kHz mono from the worker, as a binary-lane kind-1
  message (docs/protocol.md, "The binary lane": a 12-byte header, seq 0), which the
  runner handles as ``input_audio_buffer.append``. Microphone audio before the
  session's first text is written (``session.created`` or ``session.resumed``) is
  dropped: it was spoken before the session could hear it. The inbox is bounded:
  ``max_texts`` texts unread cut the call (a fault of the client's: nothing reads that
  far behind), and past ``max_mic_s`` of audio unread the oldest is dropped (counted).
- Writing: text goes to the data channel (``DC_TEXT``); a kind-2 binary message (output
  audio, one Opus packet) to the call's track as ``AUDIO(seq, packet)``, unless its
  response was cleared (``Playout``). Two credits bound what the worker holds: data-
  channel bytes not yet sent on (``dc_credit``, returned by ``DC_DRAINED``) and packets
  not yet played (``max_queued_audio_s``, returned by ``PLAYED``). Without credit
  ``can_write_now()`` is False, so the connection's outbox, its ``congested`` and its
  ``NOT_READING`` cut work as on a WebSocket; a write that waits ``write_timeout`` for
  credit breaks the channel (the peer does not take what it is sent). A ``write_now``
  may pass a bound by its one message; nothing is written past it after that
  (``write_many_now`` leaves the rest for ``flush``, as a socket leaves a tail).
- ``Playout`` tells the client of its audio's playback (``output_audio_buffer.*``) and
  clears the worker's queue when it must; what it writes takes no credit (it is sent
  from the link's reader, which cannot wait) but is counted.
- The peer is gone once the worker reports the peer connection ``failed`` or
  ``closed``, the data channel closed, the peer broke a rule (``FAULT``), the call
  failed, or the link broke: ``get_message`` then raises ``ConnectionClosed`` (after
  what was read before), and ``watch`` calls its ``gone``. ``aclose`` sends ``CLOSE``
  and waits (at most ``close_timeout``) for the worker's ``CLOSED``; it also gives the
  call's number back (``CallPort.release``), so the shell must always call it once.
- ``ping`` returns at once: ICE consent is the call's keepalive (the worker's).

Before the session: ``offer`` sends the offer and waits for the worker's answer, and
``wait_open`` for the data channel to open; neither has a timeout of its own (the
caller holds the answer and setup timeouts).
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

import trio

from ..._pace import Pace
from ...core.frames import CloseCode, Encoded, FrameError, messages_of
from ...core.limits import KiB
from ...dialects.binary import OUTPUT_AUDIO, input_message
from ...media.port import CallEnd, CallPort
from ...media.wire import Kind, WireError, unpack_drained, unpack_played, unpack_stats
from ..sessions.faults import FAULTS
from ..sessions.websocket import ConnectionClosed
from .playout import CLIENT_CLEAR, Command, Output, Playout

log = logging.getLogger("trio_duplex")

DC_CREDIT: Final = 256 * KiB
"""Data-channel bytes in flight in the worker at most (aiortc's max-message-size)."""
MAX_QUEUED_AUDIO_S: Final = 120.0
PACKET_S: Final = 0.020
"""Each output packet holds 20 ms (the core's Opus encoder)."""
MAX_TEXTS: Final = 64
MAX_MIC_S: Final = 0.200
MIC_BYTES_PER_S: Final = 48_000 * 2
"""The worker's microphone audio: PCM16 at 48 kHz, mono."""

_CLEAR_NEEDLE: Final = f'"{CLIENT_CLEAR}"'
_GONE_STATES: Final = frozenset({b"failed", b"closed"})


class CallFailed(Exception):
    """The call failed before its session: the worker's reason, or the link's."""


class CallChannel:
    """One call of a media link, as the session shell's transport."""

    __slots__ = (
        "_answer",
        "_arrived",
        "_audio",
        "_changed",
        "_clear_marks",
        "_close_code",
        "_closed",
        "_credit",
        "_dc_inflight",
        "_dc_open",
        "_gone",
        "_inbox",
        "_live",
        "_mic_bytes",
        "_pace",
        "_released",
        "_tail",
        "_texts",
        "_turn",
        "_watch_scope",
        "_writing",
        "audio_muted",
        "close_timeout",
        "dc_credit",
        "fault_reported",
        "max_message_bytes",
        "max_mic_bytes",
        "max_queued_packets",
        "max_texts",
        "mic_dropped",
        "on_stats",
        "peer",
        "playout",
        "port",
        "write_timeout",
    )

    def __init__(
        self,
        open_port: Callable[[CallEnd], CallPort],
        max_message_bytes: int,
        *,
        write_timeout: float = math.inf,
        close_timeout: float = 2.0,
        peer: str | None = None,
        dc_credit: int = DC_CREDIT,
        max_queued_audio_s: float = MAX_QUEUED_AUDIO_S,
        max_texts: int = MAX_TEXTS,
        max_mic_s: float = MAX_MIC_S,
        playout: Playout | None = None,
        on_stats: Callable[[int, int], None] | None = None,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        """Data-channel messages from the client of more bytes cut the call."""
        self.write_timeout = write_timeout
        self.close_timeout = close_timeout
        self.peer = peer
        """The client's IP address (its HTTP request's), if it has one."""
        self.dc_credit = dc_credit
        self.max_queued_packets = max(1, round(max_queued_audio_s / PACKET_S))
        self.max_texts = max_texts
        self.max_mic_bytes = round(max_mic_s * MIC_BYTES_PER_S)
        self.playout = Playout() if playout is None else playout
        self.on_stats = on_stats
        """Given each ``STATS(seq, sent_ns)`` of the worker (asked for by the OFFER's
        ``stats``: ServerConfig.call_media_stats, a benchmark's hook)."""
        self.fault_reported = False
        self.mic_dropped = 0
        """Microphone chunks dropped: before the session, or past ``max_mic_s`` unread."""
        self.audio_muted = 0
        """Output packets dropped after their response was cleared."""
        self._inbox: deque[str | bytes] = deque()
        self._texts = 0
        self._mic_bytes = 0
        self._arrived = trio.lowlevel.ParkingLot()  # get_message waits here
        self._credit = trio.lowlevel.ParkingLot()  # the writer whose turn it is
        self._changed = trio.lowlevel.ParkingLot()  # watch, offer, wait_open
        self._turn: trio.lowlevel.ParkingLot | None = None  # writers after the first
        self._writing = False
        self._pace = Pace()
        self._dc_inflight = 0
        self._tail: deque[str | bytes] = deque()  # what write_many_now had no credit for
        self._audio: deque[int] = deque()  # seqs sent and not yet reported played
        self._clear_marks: deque[int] = deque()  # the last seq sent before each CLEAR
        self._live = False  # a text was written: the session is open on this call
        self._answer: str | None = None
        self._dc_open = False
        self._gone: str | None = None  # why nothing more comes or goes
        self._close_code: int | None = None  # aclose's, once called
        self._closed = trio.Event()  # the worker said CLOSED (or FAILED), or the link broke
        self._released = False
        self._watch_scope: trio.CancelScope | None = None
        self.port = open_port(self)

    def __repr__(self) -> str:
        peer = "" if self.peer is None else f" from {self.peer}"
        state = "open" if self._gone is None else "gone"
        return f"<CallChannel call {self.port.call}{peer} {state}>"

    def report_fault(self, fault: str) -> None:
        """Log a fault of the client's: its first one only, at the fault log's rate."""
        if not self.fault_reported:
            self.fault_reported = True
            FAULTS.report(self, fault)

    # -- before the session ---------------------------------------------------------------

    async def offer(self, payload: bytes) -> str:
        """Send ``OFFER`` (``payload``: the offer and the call's media settings, as
        wire.py says); the answer's SDP. CallFailed if the call failed first."""
        self._send(Kind.OFFER, payload)
        while self._answer is None:
            if self._gone is not None:
                raise CallFailed(self._gone)
            await self._changed.park()
        return self._answer

    async def wait_open(self) -> None:
        """Until the client's data channel is open; CallFailed if the call failed first."""
        while not self._dc_open:
            if self._gone is not None:
                raise CallFailed(self._gone)
            await self._changed.park()

    def inject(self, text: str) -> None:
        """A client event the call's request carried (form B's ``session``, as a
        ``session.update``), read before anything its data channel sends."""
        self._inbox.appendleft(text)
        self._texts += 1
        self._arrived.unpark_all()

    # -- what the worker sends (CallEnd) --------------------------------------------------

    def received(self, kind: Kind, payload: bytes) -> None:
        try:
            if kind is Kind.MIC:
                self._mic_in(payload)
            elif kind is Kind.DC_TEXT:
                self._text_in(payload)
            elif kind is Kind.PLAYED:
                self._played(*unpack_played(payload))
            elif kind is Kind.DC_DRAINED:
                self._dc_inflight = max(0, self._dc_inflight - unpack_drained(payload))
                self._credit.unpark_all()
            elif kind is Kind.STATE:
                if payload in _GONE_STATES:
                    self._lose(f"peer connection {payload.decode('ascii')}")
            elif kind is Kind.DC_OPEN:
                self._dc_open = True
                self._changed.unpark_all()
            elif kind is Kind.ANSWER:
                self._answer = payload.decode("utf-8", "replace")
                self._changed.unpark_all()
            elif kind is Kind.DC_CLOSED:
                self._lose("data channel closed")
            elif kind is Kind.FAULT:
                self.report_fault(payload.decode("utf-8", "replace")[:200])
                self._lose("the client broke a rule of the call")
            elif kind in (Kind.CLOSED, Kind.FAILED):
                why = "closed" if kind is Kind.CLOSED else payload.decode("utf-8", "replace")
                self._lose(why[:200] or "failed")
                self._closed.set()
            elif kind is Kind.STATS:
                if self.on_stats is not None:
                    self.on_stats(*unpack_stats(payload))
            # (anything else is not a worker's frame for a call)
        except WireError as exc:  # a fixed-size payload of the wrong size: the worker's bug
            log.warning("call %d: %s; call cut", self.port.call, exc)
            self._lose("the media worker broke the framing")

    def link_broken(self, why: str) -> None:
        self._lose(f"media link broken: {why}")
        self._closed.set()

    def _text_in(self, payload: bytes) -> None:
        if self._gone is not None:
            return
        if len(payload) > self.max_message_bytes:
            self._cut(
                f"a data-channel message of {len(payload)} bytes (at most {self.max_message_bytes})"
            )
            return
        if self._texts >= self.max_texts:
            self._cut(f"{self._texts} data-channel messages unread: cut")
            return
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            self._cut("a data-channel message that is not UTF-8")
            return
        if _CLEAR_NEEDLE in text and _is_client_clear(text):
            self._act(self.playout.client_clear())  # (the event still goes on to the core)
        self._inbox.append(text)
        self._texts += 1
        self._arrived.unpark_all()

    def _mic_in(self, pcm: bytes) -> None:
        if self._gone is not None:
            return
        if not self._live:
            self.mic_dropped += 1
            return
        inbox = self._inbox
        inbox.append(input_message(0, pcm))
        self._mic_bytes += len(pcm)
        while self._mic_bytes > self.max_mic_bytes:  # drop the oldest chunk unread
            for i, item in enumerate(inbox):
                if isinstance(item, bytes):
                    del inbox[i]
                    self._mic_bytes -= len(item) - 12
                    self.mic_dropped += 1
                    break
        self._arrived.unpark_all()

    def _played(self, seq: int, drained: bool, cleared: bool) -> None:
        audio = self._audio
        upto = seq
        if cleared:  # what was queued when the CLEAR came is gone, played or not
            upto = max(seq, self._clear_marks.popleft() if self._clear_marks else seq)
        while audio and audio[0] <= upto:
            audio.popleft()
        if self._gone is None:
            self._act(self.playout.played(seq))
        self._credit.unpark_all()

    # -- reading --------------------------------------------------------------------------

    @property
    def close_code(self) -> int | None:
        """The code ``aclose`` was given (None: not closed by the server)."""
        return self._close_code

    @property
    def peer_gone(self) -> bool:
        return self._gone is not None

    def _closed_error(self) -> ConnectionClosed:
        if self._close_code is not None:
            return ConnectionClosed(self._close_code, "closed")
        return ConnectionClosed(CloseCode.ABNORMAL, self._gone or "connection lost")

    def _took(self, item: str | bytes) -> None:
        if isinstance(item, str):
            self._texts -= 1
        else:
            self._mic_bytes -= len(item) - 12

    async def get_message(self) -> str | bytes:
        """The next message (text as ``str``, microphone audio as a kind-1 ``bytes``);
        ``ConnectionClosed`` once the peer is gone and what came before is read."""
        inbox = self._inbox
        if inbox and self._pace.due():
            await trio.lowlevel.checkpoint()
        while not inbox:
            if self._gone is not None:
                raise self._closed_error()
            self._pace.reset()
            await self._arrived.park()
        item = inbox.popleft()
        self._took(item)
        return item

    async def get_messages(self) -> list[str | bytes]:
        """Every message not yet read (at least one), after a scheduler round."""
        await trio.lowlevel.checkpoint()
        inbox = self._inbox
        while not inbox:
            if self._gone is not None:
                raise self._closed_error()
            await self._arrived.park()
        items = list(inbox)
        inbox.clear()
        self._texts = self._mic_bytes = 0
        self._pace.reset()
        return items

    # -- while a session opens ------------------------------------------------------------

    def start_watching(self) -> None:
        self._watch_scope = trio.CancelScope()

    async def watch(self, gone: Callable[[], None]) -> None:
        """Until ``stop_watching``: call ``gone`` once the peer is gone. (Everything the
        worker says arrives without this: the link's reader hands it over.)"""
        scope = self._watch_scope
        assert scope is not None, "start_watching first"
        try:
            with scope:
                while self._gone is None:
                    await self._changed.park()
                gone()
        finally:
            self._watch_scope = None

    def stop_watching(self) -> None:
        if self._watch_scope is not None:
            self._watch_scope.cancel()

    def read_now(self) -> list[bytes]:
        """Nothing to read: the link hands each frame over as it arrives."""
        return []

    def reply_now(self, replies: list[bytes]) -> None:
        """A call has no replies of the transport's to write."""

    # -- writing --------------------------------------------------------------------------

    def _has_credit(self) -> bool:
        return self._dc_inflight < self.dc_credit and len(self._audio) < self.max_queued_packets

    def can_write_now(self) -> bool:
        return self._gone is None and not self._writing and not self._tail and self._has_credit()

    def write_now(self, message: str | bytes) -> None:
        """Write ``message`` now (call only when ``can_write_now()``)."""
        if self._gone is None:
            self._write(message)

    def write_many_now(self, messages: list[str | bytes]) -> None:
        """Write ``messages`` while there is credit; the rest is left for ``flush``
        (``unsent``), as a socket leaves the tail of a write."""
        tail = self._tail
        for message in messages:
            if self._gone is not None:
                return
            if tail or not self._has_credit():
                tail.append(message)
            else:
                self._write(message)

    def write_frames_now(self, frames: bytes) -> None:
        """Write the messages in a relayed home's ``frames`` (``Encoded``) now."""
        if self._gone is None:
            self._write(Encoded(frames))

    @property
    def unsent(self) -> bool:
        return bool(self._tail)

    @property
    def broken(self) -> bool:
        """Nothing more can be sent: the peer is gone, the link broke, or a write
        waited too long for credit."""
        return self._gone is not None

    async def flush(self) -> None:
        """Write what ``write_many_now`` left, as credit comes."""
        await self._take_turn()
        try:
            await self._write_tail()
        finally:
            self._end_turn()
        if self._gone is not None:
            raise self._closed_error()

    async def send_message(self, message: str | bytes) -> None:
        """Send one message, after those before it, once there is credit for it."""
        await self._take_turn()
        try:
            await self._write_tail()
            await self._wait_credit()
            self._write(message)
        finally:
            self._end_turn()

    async def send_many(self, messages: Iterable[str | bytes]) -> None:
        """Send several messages, in order, each once there is credit for it."""
        await self._take_turn()
        try:
            await self._write_tail()
            for message in messages:
                await self._wait_credit()
                self._write(message)
        finally:
            self._end_turn()

    async def _write_tail(self) -> None:
        tail = self._tail
        while tail:
            await self._wait_credit()
            self._write(tail.popleft())

    async def ping(self) -> None:
        """At once: the peer connection's ICE consent checks are the call's keepalive."""
        await trio.lowlevel.checkpoint()
        if self._gone is not None:
            raise self._closed_error()

    def playout_fenced(self, fenced: bool) -> None:
        """A call's audio not played when its session moves is dropped anyway (its resume
        replays no audio): nothing to do (``MessageTransport``)."""

    async def aclose(self, code: int, reason: str = "") -> None:
        """``CLOSE`` the call (its data channel carries no close code: ``code`` is
        logged) and wait at most ``close_timeout`` for the worker's ``CLOSED``. Gives the
        call's number back to the link."""
        first = self._close_code is None
        if first:
            self._close_code = code
            log.debug(
                "call %d: closing (%d%s)", self.port.call, code, f" {reason}" if reason else ""
            )
            self._lose("closed by the server")
        try:
            if first and not self._closed.is_set() and not self.port.broken:
                self._send(Kind.CLOSE)
            with trio.move_on_after(self.close_timeout):
                await self._closed.wait()
        finally:
            if not self._released:
                self._released = True
                self.port.release()

    async def _take_turn(self) -> None:
        """Wait for the writers before this one; then a checkpoint, holding the turn
        (taken at once, so that no ``write_now`` goes ahead of what this writes)."""
        if self._writing:
            if self._turn is None:
                self._turn = trio.lowlevel.ParkingLot()
            await self._turn.park()  # woken as the writer: _writing stays True
            return
        self._writing = True
        try:
            await trio.lowlevel.checkpoint()  # (cancelled here, nothing was written)
        except BaseException:
            self._end_turn()
            raise

    def _end_turn(self) -> None:
        if self._turn:
            self._turn.unpark()
        else:
            self._writing = False

    async def _wait_credit(self) -> None:
        if self._gone is None and not self._has_credit():
            with trio.move_on_after(self.write_timeout) as timer:
                while self._gone is None and not self._has_credit():
                    await self._credit.park()
            if timer.cancelled_caught:
                self.report_fault(f"a write not given credit within {self.write_timeout}s: cut")
                self._lose("write timeout")
        if self._gone is not None:
            raise self._closed_error()

    def _write(self, message: str | bytes) -> None:
        """One message to the worker (never awaits)."""
        if isinstance(message, str):
            data = message.encode()
            self._dc_inflight += len(data)
            self._send(Kind.DC_TEXT, data)
            self._live = True
            if message.startswith('{"type":"'):
                self._act(self.playout.sent_text(message))
        elif isinstance(message, Encoded):
            # A home's frames, relayed from another node (the pooled relay's front): the
            # messages in them, each as it would have been written here.
            try:
                messages = messages_of(message)
            except FrameError as exc:
                log.warning(
                    "call %d: relayed frames that are no server's (%s)", self.port.call, exc
                )
                self._lose("bad relayed frames")
                return
            for each in messages:
                if self._gone is not None:
                    return
                self._write(each)
        elif len(message) > 12 and message[0] == OUTPUT_AUDIO:
            seq = int.from_bytes(message[4:12], "big")
            if self.playout.sent_audio(seq):
                self._send(Kind.AUDIO, message[4:])  # (seq and packet: AUDIO's layout)
                self._audio.append(seq)
            else:
                self.audio_muted += 1
        else:
            log.warning(
                "call %d: a binary message that is no output audio; dropped", self.port.call
            )

    def _act(self, outputs: list[Output]) -> None:
        """Do what ``Playout`` says: its events on the data channel, its clears."""
        for out in outputs:
            if self._gone is not None:
                return
            if out is Command.CLEAR:
                self._clear_marks.append(self._audio[-1] if self._audio else 0)
                self._send(Kind.CLEAR)
            else:
                data = out.encode()
                self._dc_inflight += len(data)
                self._send(Kind.DC_TEXT, data)

    def _send(self, kind: Kind, payload: bytes = b"") -> None:
        try:
            self.port.send(kind, payload)
        except trio.BrokenResourceError:
            self.link_broken("send refused")

    # -- the end --------------------------------------------------------------------------

    def _cut(self, fault: str) -> None:
        self.report_fault(fault)
        self._lose("the client broke a rule of the call")

    def _lose(self, why: str) -> None:
        """Nothing more comes or goes: wake every waiter (they see ``_gone``)."""
        if self._gone is None:
            self._gone = why
            if self._close_code is None:
                log.info("call %d: %s", self.port.call, why)
            self._tail.clear()
            self._arrived.unpark_all()
            self._credit.unpark_all()
            self._changed.unpark_all()


def _is_client_clear(text: str) -> bool:
    try:
        event = json.loads(text)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == CLIENT_CLEAR


if TYPE_CHECKING:  # a call's channel is a transport, and the link's end of a call
    from ..sessions.transport import MessageTransport

    _TRANSPORT: type[MessageTransport] = CallChannel
    _END: type[CallEnd] = CallChannel


__all__ = ["DC_CREDIT", "MAX_QUEUED_AUDIO_S", "CallChannel", "CallFailed"]
