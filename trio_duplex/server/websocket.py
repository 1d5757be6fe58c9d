"""The server side of a WebSocket on a trio stream, with no task of its own.

websockets' sans-IO ``ServerProtocol`` answers the HTTP upgrade; after the 101 the
frames are ours (_frames.py: the per-message path, measured there).

trio-websocket, which the server used at first, runs a reader task per connection and
hands each message over a memory channel: one more task switch per message and one more
task's memory per connection. Here the task that wants a message reads it:
``get_message`` reads the socket and parses, answering pings and echoing a close as it
goes, so someone must keep calling it while the connection is open (the server's reader
does). Writes from several tasks (the pump, a ping, the reader's pong) take turns in
arrival order; a write that fails or is cancelled may have left half a frame on the
wire, so it ends the connection: every later write raises ``ConnectionClosed``.
``send_now`` writes without awaiting at all when the socket is free (see Connection.push).

Closing follows RFC 6455 for a server: after sending a close it reads until the client's
close, after receiving one it echoes it; then it half-closes the stream (the server ends
the TCP connection first), and the caller closes it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

import trio
from websockets.http11 import Request
from websockets.server import ServerProtocol

from ..core.frames import (
    PING,
    PONG,
    Close,
    Control,
    FrameReader,
    close_frame,
    control_frame,
    text_frame,
)
from ..engines.api import YIELD_EVERY

RECEIVE_SIZE = 65536
_MAX_REQUEST_BYTES = 16384
_ABNORMAL = 1006

# websockets logs each handshake at INFO; that is the server's business to say.
_quiet = logging.getLogger("trio_duplex.websocket")
_quiet.setLevel(logging.WARNING)


class ConnectionClosed(Exception):
    """The WebSocket is closed (or broken): nothing more can be read or sent on it."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class WebSocket:
    """One accepted server-side WebSocket. Build it with :func:`accept_websocket`."""

    __slots__ = (
        "_broken",
        "_close",
        "_close_sent",
        "_ended",
        "_fd",
        "_messages",
        "_next",
        "_pings_sent",
        "_pongs",
        "_reader",
        "_turn",
        "_unsent",
        "_unyielded",
        "_writing",
        "stream",
    )

    def __init__(self, stream: trio.abc.Stream, max_message_bytes: int) -> None:
        self.stream = stream
        self._reader = FrameReader(max_message_bytes)
        self._messages: list[str | bytes] = []  # from the last read; served up to _next
        self._next = 0
        self._unyielded = 0
        self._close: Close | None = None  # the close received, or the one we failed with
        self._close_sent = False
        self._ended = False  # nothing more will be read
        self._broken = False  # nothing more can be written
        self._writing = False
        self._turn = trio.lowlevel.ParkingLot()
        self._unsent = b""  # the tail of a frame send_now could not write whole
        self._fd = -1  # os.write on a socket's descriptor is POSIX: else the pump sends
        if isinstance(stream, trio.SocketStream) and sys.platform != "win32":
            self._fd = stream.socket.fileno()
        self._pongs: dict[bytes, trio.Event] = {}
        self._pings_sent = 0

    def __repr__(self) -> str:
        state = "closed" if self._broken or self._close_sent or self._ended else "open"
        return f"<WebSocket {id(self):#x} {state}>"

    def _closed_error(self) -> ConnectionClosed:
        if self._close is None:
            return ConnectionClosed(_ABNORMAL, "connection lost")
        return ConnectionClosed(self._close.code, self._close.reason)

    # -- reading -----------------------------------------------------------------------

    async def get_message(self) -> str | bytes:
        """The next message (text as ``str``, binary as ``bytes``); raises
        ``ConnectionClosed`` once the peer has closed or the connection failed."""
        if self._next < len(self._messages):
            # Several messages came in one read. Serve them with a cancellation point
            # each but a scheduler round only every YIELD_EVERY-th, so the tasks they
            # feed run in batches and a fast client cannot starve the others.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._unyielded += 1
            if self._unyielded >= YIELD_EVERY:
                self._unyielded = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
        while self._next >= len(self._messages):
            if self._ended:
                raise self._closed_error()
            self._unyielded = 0
            await self._receive()  # a scheduler round
        message = self._messages[self._next]
        self._next += 1
        return message

    async def _receive(self) -> None:
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
            raise self._closed_error() from None
        if not data:  # EOF without a close frame
            self._ended = True
            self._release_pings()
            return
        if self._next >= len(self._messages):
            self._messages, self._next = [], 0
        await self._feed(data)

    async def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data``, then send what it calls for: pongs, a close, and once the
        closing handshake is done, the end of our half of the TCP connection."""
        replies = self._absorb(data)
        if replies or self._ended:
            await self._write_out(replies, eof=self._ended)

    def _absorb(self, data: bytes | bytearray) -> list[bytes]:
        """Parse ``data``; returns the frames to answer with (pongs, a close)."""
        reader = self._reader
        replies: list[bytes] = []
        messages = self._messages
        for item in reader.receive(data):
            if isinstance(item, (str, bytes)):
                messages.append(item)
            elif isinstance(item, Control):
                if item.opcode == PING:
                    if not self._close_sent:
                        replies.append(control_frame(PONG, item.payload))
                else:
                    waiter = self._pongs.pop(item.payload, None)
                    if waiter is not None:
                        waiter.set()
            else:
                self._close = item
                if not self._close_sent:
                    replies.append(close_frame(item.code))  # echo it
                    self._close_sent = True
                self._ended = True
        error = reader.error
        if error is not None and not self._ended:
            self._close = Close(error.code, error.reason)
            if not self._close_sent:
                replies.append(close_frame(error.code, error.reason))
                self._close_sent = True
            self._ended = True
        if self._ended:
            self._release_pings()
        return replies

    # -- writing -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._broken or self._close_sent:
            raise self._closed_error()

    async def send_message(self, text: str) -> None:
        """Send one text message; returns once its bytes are handed to the stream."""
        self._check_open()
        await self._write(text_frame(text))

    async def send_many(self, texts: Iterable[str]) -> None:
        """Send several text messages in one write."""
        self._check_open()
        await self._write(b"".join([text_frame(text) for text in texts]))

    def send_now(self, text: str) -> bool:
        """Write one text message at once, from any task, without waiting; False if that
        is not possible now (not a socket, another write in progress or unfinished,
        closing): then send it the usual way.

        Nothing awaits, so nothing can be cancelled half-way. If the socket takes only
        part of the frame, the rest is kept and goes out before anything else; ``unsent``
        is then true and someone must call ``flush``.
        """
        if self._fd < 0 or self._writing or self._unsent or self._broken or self._close_sent:
            return False
        data = text_frame(text)
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:  # reset, broken pipe: the reader will see the end too
            self._lost()
            return True
        if sent < len(data):
            self._unsent = data[sent:]
        return True

    @property
    def broken(self) -> bool:
        """A write failed or was cancelled: nothing more can be sent."""
        return self._broken

    @property
    def unsent(self) -> bool:
        return bool(self._unsent)

    async def flush(self) -> None:
        """Finish writing what ``send_now`` left."""
        await self._write(b"")

    async def ping(self) -> None:
        """Send a ping and wait for its pong (which a reader must be there to see)."""
        self._check_open()
        self._pings_sent += 1
        payload = self._pings_sent.to_bytes(4, "big")
        waiter = self._pongs[payload] = trio.Event()
        await self._write(control_frame(PING, payload))
        await waiter.wait()
        if self._ended:  # woken by the end of the connection, not by a pong
            raise self._closed_error()

    async def aclose(self, code: int, reason: str = "") -> None:
        """Send a close with ``code`` (unless one was sent or received) and read until
        the peer's reply. Bound it with a deadline: a dead peer never replies."""
        try:
            if not self._close_sent and not self._ended and not self._broken:
                self._close_sent = True
                await self._write_out([close_frame(code, reason)], eof=False)
            while not self._ended and not self._broken:
                await self._receive()
                self._next = len(self._messages)  # closing: what comes now is dropped
        except ConnectionClosed:
            pass
        finally:
            self._ended = True
            self._release_pings()

    async def _write_out(self, frames: list[bytes], *, eof: bool) -> None:
        if frames:
            await self._write(frames[0] if len(frames) == 1 else b"".join(frames))
        if eof and not self._broken and isinstance(self.stream, trio.abc.HalfCloseableStream):
            await self._write(None)

    async def _write(self, data: bytes | None) -> None:
        """Write ``data`` (None: half-close), after the writes that came first."""
        if self._writing:
            await self._turn.park()  # woken as the writer: _writing stays True
        else:
            self._writing = True
        try:
            if self._broken:
                raise self._closed_error()
            unsent, self._unsent = self._unsent, b""
            try:
                if data is None:
                    assert isinstance(self.stream, trio.abc.HalfCloseableStream)
                    if unsent:
                        await self.stream.send_all(unsent)
                    await self.stream.send_eof()
                elif unsent or data:
                    await self.stream.send_all(unsent + data if unsent else data)
            except BaseException:
                self._lost()  # half a frame may be out: nothing more can go after it
                raise
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._closed_error() from None
        finally:
            if self._turn:
                self._turn.unpark()
            else:
                self._writing = False

    def _lost(self) -> None:
        self._broken = self._ended = True
        self._release_pings()

    def _release_pings(self) -> None:
        if self._pongs:
            pongs, self._pongs = self._pongs, {}
            for waiter in pongs.values():
                waiter.set()


async def accept_websocket(
    stream: trio.abc.Stream, path: str, max_message_bytes: int
) -> tuple[WebSocket, dict[str, list[str]]] | None:
    """Read the HTTP upgrade request and answer it.

    A valid upgrade for ``path`` gets 101 and returns the WebSocket and the query; one
    for another path gets 404, a request that is not an upgrade 400, and anything that
    is not HTTP is dropped: those return None. Bound it with a deadline.
    """
    received = b""
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > _MAX_REQUEST_BYTES:
            end = len(received) - 4  # websockets answers 431 for it below
            break
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        received += data
    # A GET upgrade has no body: frames the client sent at once come right after it.
    head, early = received[: end + 4], received[end + 4 :]
    protocol = ServerProtocol(logger=_quiet)
    protocol.receive_data(head)
    events = protocol.events_received()
    if not events:  # not HTTP, or headers too large (then websockets has an answer)
        answer = b"".join(protocol.data_to_send())
        if answer:
            await stream.send_all(answer)
        return None
    request = events[0]
    assert isinstance(request, Request)
    url = urlsplit(request.path)
    response = protocol.accept(request)
    if response.status_code != 101:
        response = protocol.reject(400, "this endpoint takes WebSocket upgrade requests\n")
    elif url.path != path:
        response = protocol.reject(404, "no such endpoint\n")
    protocol.send_response(response)
    await stream.send_all(b"".join(protocol.data_to_send()))
    if response.status_code != 101:
        return None
    ws = WebSocket(stream, max_message_bytes)
    if early:
        await ws._feed(early)
    return ws, parse_qs(url.query)


__all__ = ["ConnectionClosed", "WebSocket", "accept_websocket"]
