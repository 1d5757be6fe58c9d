"""The server side of a WebSocket on a trio stream, with no task of its own.

It runs websockets' sans-IO ``ServerProtocol`` (RFC 6455 framing, the HTTP upgrade, the
close handshake, size limits counted in bytes) over any ``trio.abc.Stream``.

trio-websocket, which the server used before, runs a reader task per connection and
hands each message over a memory channel: one more task switch per message and one more
task's memory per connection. Here the task that wants a message reads it:
``get_message`` reads the socket and parses, answering pings and echoing a close as it
goes, so someone must keep calling it while the connection is open (the server's reader
does). Writes from several tasks (the pump, a ping, the reader's pong) take turns in
arrival order; a write that fails or is cancelled may have left half a frame on the
wire, so it ends the connection: every later write raises ``ConnectionClosed``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qs, urlsplit

import trio
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Protocol, State
from websockets.server import ServerProtocol

RECEIVE_SIZE = 65536
_YIELD_EVERY = 16

_OPEN, _CLOSED = State.OPEN, State.CLOSED
_TEXT, _BINARY, _CONT, _PONG = Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.PONG
_ABNORMAL = 1006
_Buffer = bytes | bytearray | memoryview
_INVALID_DATA = 1007

# websockets logs each closed connection at INFO; that is the server's business to say.
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

    def __init__(self, stream: trio.abc.Stream, protocol: ServerProtocol) -> None:
        self.stream = stream
        self._protocol = protocol
        self._messages: list[str | bytes] = []  # from the last read; served up to _next
        self._next = 0
        self._fragments: list[_Buffer] = []
        self._fragments_text = False
        self._writing = False
        self._unsent = b""  # the tail of a frame send_now could not write whole
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._turn = trio.lowlevel.ParkingLot()
        self._broken = False
        self._ended = False
        self._pongs: dict[bytes, trio.Event] = {}
        self._pings_sent = 0
        self._unyielded = 0

    def __repr__(self) -> str:
        return f"<WebSocket {id(self):#x} {self._protocol.state.name.lower()}>"

    @property
    def closed(self) -> bool:
        return self._broken or self._protocol.state is not _OPEN

    def _closed_error(self) -> ConnectionClosed:
        protocol = self._protocol
        close = protocol.close_rcvd or protocol.close_sent
        if close is None or self._broken:
            return ConnectionClosed(_ABNORMAL, "connection lost")
        return ConnectionClosed(close.code, close.reason)

    # -- reading -----------------------------------------------------------------------

    async def get_message(self) -> str | bytes:
        """The next message (text as ``str``, binary as ``bytes``); raises
        ``ConnectionClosed`` once the peer has closed or the connection failed."""
        messages = self._messages
        if self._next < len(messages):
            # Several messages came in one read. Serve them with a cancellation point
            # each but a scheduler round only every _YIELD_EVERY-th, so the tasks they
            # feed run in batches and a fast client cannot starve the others.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._unyielded += 1
            if self._unyielded >= _YIELD_EVERY:
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
        protocol = self._protocol
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
            raise self._closed_error() from None
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        if self._next >= len(self._messages):
            self._messages, self._next = [], 0
        self._absorb(protocol.events_received())
        if protocol.close_rcvd is not None or protocol.parser_exc is not None or (
            protocol.state is _CLOSED
        ):
            self._ended = True
            self._release_pings()
        writes = protocol.data_to_send()
        if writes:
            await self._write_out(writes)

    def _absorb(self, events: Iterable[object]) -> None:
        for frame in events:
            if not isinstance(frame, Frame):
                continue
            opcode = frame.opcode
            if opcode is _TEXT or opcode is _BINARY:
                if frame.fin:
                    self._deliver(frame.data, opcode is _TEXT)
                else:
                    self._fragments = [frame.data]
                    self._fragments_text = opcode is _TEXT
            elif opcode is _CONT:
                self._fragments.append(frame.data)
                if frame.fin:
                    data, self._fragments = b"".join(self._fragments), []
                    self._deliver(data, self._fragments_text)
            elif opcode is _PONG:
                waiter = self._pongs.pop(bytes(frame.data), None)
                if waiter is not None:
                    waiter.set()
            # Pings are answered and closes echoed by the protocol (see data_to_send).

    def _deliver(self, data: _Buffer, text: bool) -> None:
        if self._ended:
            return
        if not text:
            self._messages.append(bytes(data))
            return
        try:
            self._messages.append(str(data, "utf-8"))
        except UnicodeDecodeError:
            if self._protocol.state is _OPEN:
                self._protocol.fail(_INVALID_DATA, "invalid UTF-8 in a text message")
            self._ended = True
            self._release_pings()

    # -- writing -----------------------------------------------------------------------

    async def send_message(self, text: str) -> None:
        """Send one text message; returns once its bytes are handed to the stream."""
        protocol = self._protocol
        if self._broken or protocol.state is not _OPEN:
            raise self._closed_error()
        protocol.send_text(text.encode())
        await self._write_out(protocol.data_to_send())

    def send_now(self, text: str) -> bool:
        """Write one text message at once, from any task, without waiting; False if that
        is not possible now (not a socket, another write in progress or unfinished,
        closing): then send it the usual way.

        Nothing awaits, so nothing can be cancelled half-way. If the socket takes only
        part of the frame, the rest is kept and goes out before anything else; ``unsent``
        is then true and someone must call ``flush``.
        """
        protocol = self._protocol
        if (
            self._fd < 0 or self._writing or self._unsent or self._broken
            or protocol.state is not _OPEN
        ):
            return False
        protocol.send_text(text.encode())
        (data,) = protocol.data_to_send()
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
    def unsent(self) -> bool:
        return bool(self._unsent)

    async def flush(self) -> None:
        """Finish writing what ``send_now`` left."""
        await self._write(b"")

    async def send_many(self, texts: Iterable[str]) -> None:
        """Send several text messages in one write."""
        protocol = self._protocol
        if self._broken or protocol.state is not _OPEN:
            raise self._closed_error()
        send = protocol.send_text
        for text in texts:
            send(text.encode())
        await self._write_out(protocol.data_to_send())

    async def ping(self) -> None:
        """Send a ping and wait for its pong (which a reader must be there to see)."""
        protocol = self._protocol
        if self._broken or protocol.state is not _OPEN:
            raise self._closed_error()
        self._pings_sent += 1
        payload = self._pings_sent.to_bytes(4, "big")
        waiter = self._pongs[payload] = trio.Event()
        protocol.send_ping(payload)
        await self._write_out(protocol.data_to_send())
        await waiter.wait()
        if self._ended:  # woken by the end of the connection, not by a pong
            raise self._closed_error()

    async def aclose(self, code: int, reason: str = "") -> None:
        """Send a close with ``code`` (unless one was sent or received) and read until
        the peer's reply. Bound it with a deadline: a dead peer never replies."""
        protocol = self._protocol
        try:
            if not self._broken and protocol.state is _OPEN:
                protocol.send_close(code, reason)
                await self._write_out(protocol.data_to_send())
            while not self._ended and not self._broken:
                await self._receive()
                self._next = len(self._messages)  # closing: what comes now is dropped
        except ConnectionClosed:
            pass
        finally:
            self._ended = True
            self._release_pings()

    async def _write_out(self, writes: list[bytes]) -> None:
        eof = b"" in writes
        data = writes[0] if len(writes) == 1 else b"".join(writes)
        if data:
            await self._write(data)
        if eof and not self._broken:
            stream = self.stream
            if isinstance(stream, trio.abc.HalfCloseableStream):
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
    protocol = ServerProtocol(max_size=max_message_bytes, logger=_quiet)
    events: Sequence[object] = ()
    while not events:
        data = await stream.receive_some(RECEIVE_SIZE)
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        events = protocol.events_received()
        if not events and (not data or protocol.handshake_exc is not None):
            writes = protocol.data_to_send()  # a 431/414 answer, if it was that
            if any(writes):
                await stream.send_all(b"".join(writes))
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
    if len(events) == 1 and not protocol.reader.buffer:
        # The handshake parser's frame holds the request, all its headers, for as long
        # as the connection lives; a fresh frame parser (nothing is buffered) holds none.
        protocol.parser = Protocol.parse(protocol)
        next(protocol.parser)
    ws = WebSocket(stream, protocol)
    ws._absorb(events[1:])  # frames that came with the request
    return ws, parse_qs(url.query)
