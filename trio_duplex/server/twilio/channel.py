"""``TwilioChannel``: one Twilio Media Stream as a ``MessageTransport`` (sessions/transport.py).

A phone call's session is served by the unchanged session shell (``Opener.serve``) over
this channel, as a WebSocket's is over a ``WebSocket`` (docs/plans/telephony.md §0.1,
§3.2, §3.4). The channel wraps the stream's WebSocket and owns everything that is about
*this stream*: its ``streamSid``, Twilio's spelling, pacing and marks.

- Reading (``get_message``): each of Twilio's messages, parsed once
  (dialects/twilio/messages.py), becomes what the ``twilio`` dialect reads: the caller's
  μ-law as binary-lane kind-1 messages (coalesced to ``input_chunk_bytes``), a key as
  ``input.dtmf``, a mark's echo as ``session.event_ack`` of what it proved played
  (``MarkBook``), ``stop`` as ``session.close``. A message that is not one is a fault of
  the peer's, reported once (fixed text) and dropped; an event we do not know is
  counted and dropped.
- Writing: the session's frames go to the ``MarkBook``, which answers with Twilio's
  ``media``/``mark``/``clear`` to send now; a task of the channel's (``run``) sends
  them, so neither the writer nor the reader ever waits on the socket for them. The
  writer's credit is the book's ``may_write`` (audio queued here below
  ``max_queued_s``): without it ``can_write_now()`` is False, so the connection's
  outbox, ``congested`` and ``NOT_READING`` cut work as on a WebSocket, and an awaited
  write that waits ``write_timeout`` for credit breaks the channel (Twilio stopped
  echoing marks). Text frames never reach Twilio: a frame the session writes when
  nothing is unconfirmed is acked at once.
- ``playout_fenced``: a migration's fence sends ``clear`` (the caller stops hearing this
  node now) and freezes the frontier; ``aclose`` waits (at most ``close_timeout``) for
  the audio queued to be played, then closes with 1000, which is what makes Twilio run
  the TwiML's next verb (its ``<Redirect>``).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

import trio

from ...core.frames import CloseCode, FrameError, messages_of
from ...dialects.binary import input_message
from ...dialects.jsonwire import encode
from ...dialects.twilio import INPUT_DTMF
from ...dialects.twilio.messages import (
    MAX_MESSAGE_BYTES,
    Connected,
    Dtmf,
    Mark,
    Media,
    Other,
    Start,
    Stop,
    TwilioMessageError,
    parse,
)
from ..sessions.websocket import ConnectionClosed, WebSocket
from .marks import MarkBook

if TYPE_CHECKING:
    from ..sessions.transport import MessageTransport

log = logging.getLogger("trio_duplex")

INPUT_CHUNK_BYTES: Final = 320
"""The caller's audio per ``input_audio_buffer.append``: 40 ms of μ-law (Twilio sends
20 ms a message; two per append halve the session's per-event work)."""
INBOUND_TRACKS: Final = frozenset({"inbound", "inbound_track"})
_CLOSE: Final = encode({"type": "session.close"})
_CLOSE_S: Final = 0.5
"""What ``aclose`` keeps of its caller's deadline for the close handshake itself."""


class TwilioChannel:
    """One call's stream, as the session shell's transport."""

    def __init__(
        self,
        ws: WebSocket,
        start: Start,
        book: MarkBook,
        *,
        write_timeout: float = math.inf,
        close_timeout: float = 5.0,
        input_chunk_bytes: int = INPUT_CHUNK_BYTES,
    ) -> None:
        self.ws = ws
        self.start = start
        self.book = book
        self.write_timeout = write_timeout
        self.close_timeout = close_timeout
        self.input_chunk_bytes = input_chunk_bytes
        ws.max_message_bytes = MAX_MESSAGE_BYTES
        self._inbox: deque[str | bytes] = deque()
        self._audio = bytearray()
        self._out: list[str] = []
        self._wake = trio.lowlevel.ParkingLot()
        self._credit = trio.lowlevel.ParkingLot()
        self._broken = False
        self.stopped = False
        """Twilio's ``stop`` arrived: the call is over (hung up, or the stream stopped)."""
        self.audio_bytes_in = 0
        self.dropped: dict[str, int] = {"track": 0, "unknown_event": 0, "bad_message": 0}

    def __repr__(self) -> str:
        return f"<TwilioChannel {self.start.call_sid} {self.start.stream_sid}>"

    @property
    def peer(self) -> str | None:
        return self.ws.peer

    @property
    def max_message_bytes(self) -> int:
        return self.ws.max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None:
        """Twilio's messages have their own bound (``MAX_MESSAGE_BYTES``), whatever the
        session's ``max_event_bytes``: the shell's setting is not applied."""

    def report_fault(self, fault: str) -> None:
        self.ws.report_fault(fault)

    # -- reading -------------------------------------------------------------------------

    async def get_message(self) -> str | bytes:
        inbox = self._inbox
        while not inbox:
            self._take(await self.ws.get_message())
        return inbox.popleft()

    async def get_messages(self) -> list[str | bytes]:
        inbox = self._inbox
        while not inbox:
            for message in await self.ws.get_messages():
                self._take(message)
        taken = list(inbox)
        inbox.clear()
        return taken

    def _take(self, message: str | bytes) -> None:
        """One of Twilio's messages into what the session reads (the inbox)."""
        try:
            item = parse(message, self.start.stream_sid)
        except TwilioMessageError as exc:
            self.dropped["bad_message"] += 1
            self.ws.report_fault(f"twilio: {exc.reason}")
            return
        if type(item) is Media:
            if item.track not in INBOUND_TRACKS:
                self.dropped["track"] += 1
                return
            self.audio_bytes_in += len(item.payload)
            self._audio += item.payload
            if len(self._audio) >= self.input_chunk_bytes:
                self._flush_audio()
        elif type(item) is Mark:
            self._send(self.book.echoed(item.name))
            self._acks()
            self._credit.unpark_all()
        elif type(item) is Dtmf:
            self._flush_audio()
            self._inbox.append(encode({"type": INPUT_DTMF, "digit": item.digit}))
        elif type(item) is Stop:
            self._flush_audio()
            if not self.stopped:
                self.stopped = True
                self._inbox.append(_CLOSE)
        elif type(item) is Other:
            self.dropped["unknown_event"] += 1
        else:  # Connected or Start: the door read those; a second one is a fault
            assert isinstance(item, Connected | Start)
            self.dropped["bad_message"] += 1
            self.ws.report_fault("twilio: a second connected or start")

    def _flush_audio(self) -> None:
        if self._audio:
            self._inbox.append(input_message(0, bytes(self._audio)))
            self._audio.clear()

    def _acks(self) -> None:
        frontier = self.book.take_acks()
        if frontier is not None:
            self._inbox.append(encode({"type": "session.event_ack", "server_event_seq": frontier}))

    @property
    def peer_gone(self) -> bool:
        return self.ws.peer_gone

    # -- while a session opens: the WebSocket's own

    def start_watching(self) -> None:
        self.ws.start_watching()

    async def watch(self, gone: Callable[[], None]) -> None:
        await self.ws.watch(gone)

    def stop_watching(self) -> None:
        self.ws.stop_watching()

    def read_now(self) -> list[bytes]:
        return self.ws.read_now()

    def reply_now(self, replies: list[bytes]) -> None:
        self.ws.reply_now(replies)

    # -- writing -------------------------------------------------------------------------

    def _feed(self, message: str | bytes) -> None:
        """One frame the session wrote, into the book; what it says to send, sent."""
        book = self.book
        if isinstance(message, str):
            out = book.text(message)
        else:
            from .marks import parse_output_frame

            seq, payload = parse_output_frame(message)
            out = book.queued(seq, payload)
        self._send(out)
        self._acks()

    def _send(self, out: list[str]) -> None:
        if out:
            self._out.extend(out)
            self._wake.unpark()

    async def run(self) -> None:
        """Send what the book says to send, as it says it (the channel's one task; run it
        beside the session, cancel it after ``aclose``)."""
        ws = self.ws
        while True:
            while not self._out:
                await self._wake.park()
            out, self._out = self._out, []
            try:
                await ws.send_many(out)
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                self._break()
                return

    def _break(self) -> None:
        self._broken = True
        self._credit.unpark_all()

    async def _wait_credit(self) -> None:
        if self.broken:
            raise ConnectionClosed(CloseCode.ABNORMAL, "the call's stream is gone")
        if self.book.may_write:
            return
        with trio.move_on_after(self.write_timeout):
            while not self.book.may_write and not self.broken:
                await self._credit.park()
        if not self.book.may_write:
            self._break()  # Twilio stopped taking audio (no echoes): nothing waits for ever
            raise ConnectionClosed(CloseCode.ABNORMAL, "the call's stream took no audio")

    async def send_message(self, message: str | bytes) -> None:
        await self._wait_credit()
        self._feed(message)

    async def send_many(self, messages: Iterable[str | bytes]) -> None:
        for message in messages:
            await self._wait_credit()
            self._feed(message)

    def can_write_now(self) -> bool:
        return not self.broken and self.book.may_write

    def write_now(self, message: str | bytes) -> None:
        self._feed(message)

    def write_many_now(self, messages: list[str | bytes]) -> None:
        for message in messages:
            self._feed(message)

    def write_frames_now(self, frames: bytes) -> None:
        """A relayed home's frames (the session lives on another node): their messages."""
        try:
            messages = messages_of(frames)
        except FrameError:
            self._break()
            return
        for message in messages:
            self._feed(message)

    @property
    def unsent(self) -> bool:
        return False  # (the book takes every frame whole)

    @property
    def broken(self) -> bool:
        return self._broken or self.ws.broken

    async def flush(self) -> None:
        if self.broken:
            raise ConnectionClosed(CloseCode.ABNORMAL, "the call's stream is gone")

    async def ping(self) -> None:
        await self.ws.ping()

    def playout_fenced(self, fenced: bool) -> None:
        """The fence sends ``clear`` at once (``MarkBook.fence``); taken back, the book
        goes on."""
        if fenced:
            self._send(self.book.fence())
        else:
            self._send(self.book.unfence())
        self._credit.unpark_all()

    async def aclose(self, code: int, reason: str = "") -> None:
        """Let the caller hear what is queued, then close with 1000: Twilio then runs the
        TwiML's next verb (the ``<Redirect>``), whatever the session's code (a drain's
        1001 included). The session's reader has ended by now, so this reads the marks'
        echoes itself; the wait is bounded by ``close_timeout`` less the close's own
        half second (the caller's deadline is ``close_timeout`` for all of it)."""
        del code, reason
        ws = self.ws
        self._send(self.book.finish())  # the last audio marked, so that its echo drains it
        with trio.move_on_after(max(0.0, self.close_timeout - _CLOSE_S)):
            try:
                while not self.book.drained and not self.broken:
                    self._take(await ws.get_message())
            except ConnectionClosed:
                pass
            out, self._out = self._out, []
            if out and not self.broken and not ws.peer_gone:
                try:
                    await ws.send_many(out)
                except ConnectionClosed:
                    pass
        await ws.aclose(CloseCode.NORMAL)


if TYPE_CHECKING:  # the channel conforms (mypy checks it here)
    _CHANNEL: type[MessageTransport] = TwilioChannel

__all__ = ["INPUT_CHUNK_BYTES", "TwilioChannel"]
