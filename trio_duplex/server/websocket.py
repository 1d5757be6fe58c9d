"""The server side of a WebSocket on a trio stream, with no task of its own.

websockets' sans-IO ``ServerProtocol`` answers the HTTP upgrade; after the 101 the
frames are ours (core/frames.py: the per-message path, measured there).

trio-websocket, which the server used at first, runs a reader task per connection and
hands each message over a memory channel: one more task switch per message and one more
task's memory per connection. Here the task that wants a message reads it:
``get_message`` reads the socket and parses, answering pings and echoing a close as it
goes, so someone must keep calling it while the connection is open (the server's reader
does). Writes from several tasks (the pump, a ping, the reader's pong) take turns in
arrival order; a write that fails or is cancelled may have left half a frame on the
wire, so it ends the connection: every later write raises ``ConnectionClosed``.
``write_now`` writes without awaiting at all when the socket is free (``DirectWrite``;
see Connection.push).

A write the peer does not take within ``write_timeout`` (it stopped reading, and the
socket's buffers are full) ends the connection like any failed write: nothing queued for
a peer that does not read waits for ever.

While a session opens on the connection (its engine prepares, its ``session.created``
is written) ``watch`` reads in a task of its own, and ``read_now`` reads what the socket
holds without awaiting, so that a client gone before ``session.created`` was handed over
is seen (the handshake rule, docs/protocol.md). Neither runs once the session is open.

Closing follows RFC 6455 for a server: after sending a close it reads until the client's
close, after receiving one it echoes it; then it half-closes the stream (the server ends
the TCP connection first), and the caller closes it.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

import trio
from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from .._pace import Pace
from ..core.events import SUBPROTOCOL
from ..core.frames import (
    Close,
    CloseCode,
    Control,
    FrameReader,
    Opcode,
    binary_frame,
    close_frame,
    control_frame,
    text_frame,
)
from .auth import OPEN, TOKENS_PATH, Grant
from .faults import FAULTS
from .http import Endpoints, origin_allowed
from .throttle import Throttled

RECEIVE_SIZE = 65536
OPENING_READ_AHEAD = RECEIVE_SIZE
"""While a session opens, reading pauses once messages of this many characters wait."""
_MAX_REQUEST_BYTES = 16384

# websockets logs each handshake at INFO; that is the server's business to say.
_quiet = logging.getLogger("trio_duplex.websocket")
_quiet.setLevel(logging.WARNING)


class ConnectionClosed(Exception):
    """The WebSocket is closed (or broken): nothing more can be read or sent on it."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class State(enum.Enum):
    """Where a WebSocket is in its life (RFC 6455, server side)."""

    OPEN = "open"
    """Reading and writing."""
    READ_ENDED = "read_ended"
    """The peer ended its half (TCP FIN) without a close frame; we may still write."""
    CLOSING = "closing"
    """We sent a close and read on until the peer's close; no more messages go out."""
    CLOSED = "closed"
    """Both closes are done (or we closed after a framing error): nothing more either way."""
    BROKEN = "broken"
    """A write failed or was cancelled, or the stream broke: nothing more either way."""


_READABLE = frozenset({State.OPEN, State.CLOSING})
_WRITABLE = frozenset({State.OPEN, State.READ_ENDED})


@runtime_checkable
class ReadsNow(Protocol):
    """A stream that can be read without awaiting (as the testing transport can)."""

    def receive_now(self, max_bytes: int) -> bytes | bytearray | None:
        """At most ``max_bytes`` of what has arrived; b"" at the end; None: nothing yet."""


class DirectWrite:
    """Writes a frame from the caller's task with one non-blocking ``os.write``.

    Invariant: ``tail`` holds the part of the last directly written frame that the
    socket did not take, and while it is non-empty nothing else is written before it:
    a direct write refuses (``ready`` is False) and every awaited write takes the tail
    first (``WebSocket._write``). So frames stay whole and in order on the wire.
    Nothing here awaits, so nothing can be cancelled half-way.
    """

    __slots__ = ("fd", "tail")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.tail = b""
        # os.write on a socket's descriptor is POSIX; elsewhere every frame takes the pump.
        self.fd = -1
        if isinstance(stream, trio.SocketStream) and sys.platform != "win32":
            self.fd = stream.socket.fileno()

    @property
    def ready(self) -> bool:
        return self.fd >= 0 and not self.tail

    def write(self, data: bytes) -> bool:
        """Write ``data``, keeping what the socket did not take in ``tail``. False: the
        socket is broken (reset, broken pipe)."""
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return False
        if sent < len(data):
            self.tail = data[sent:]
        return True

    def take_tail(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


class WebSocket:
    """One accepted server-side WebSocket. Build it with :func:`accept_websocket`."""

    __slots__ = (
        "_close",
        "_direct",
        "_messages",
        "_next",
        "_pace",
        "_pings_sent",
        "_pongs",
        "_readable",
        "_reader",
        "_turn",
        "_watch_scope",
        "_watched",
        "_writable",
        "_writing",
        "fault_reported",
        "peer",
        "state",
        "stream",
        "write_timeout",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        max_message_bytes: int,
        write_timeout: float = math.inf,
        peer: str | None = None,
    ) -> None:
        self.stream = stream
        self.write_timeout = write_timeout
        self.peer = peer
        """The client's IP address, if it has one."""
        self.fault_reported = False
        self.state = State.OPEN
        # Derived from state in _set alone: the per-message paths test a bool, not a
        # frozenset of members (an enum member's hash is a Python call).
        self._readable = self._writable = True
        self._reader = FrameReader(max_message_bytes)
        self._messages: list[str | bytes] = []  # from the last read; served up to _next
        self._next = 0
        self._pace = Pace()
        self._close: Close | None = None  # the close received, or the one we failed with
        self._writing = False
        self._turn = trio.lowlevel.ParkingLot()
        self._direct = DirectWrite(stream)
        self._pongs: dict[bytes, trio.Event] = {}
        self._pings_sent = 0
        self._watched: trio.Event | None = None  # set once ``watch`` has returned
        self._watch_scope: trio.CancelScope | None = None

    def __repr__(self) -> str:
        peer = "" if self.peer is None else f" from {self.peer}"
        return f"<WebSocket {id(self):#x}{peer} {self.state.value}>"

    def report_fault(self, fault: str) -> None:
        """Log a fault of the client's: its first one only, at the fault log's rate."""
        if not self.fault_reported:
            self.fault_reported = True
            FAULTS.report(self, fault)

    def _closed_error(self) -> ConnectionClosed:
        if self._close is None:
            return ConnectionClosed(CloseCode.ABNORMAL, "connection lost")
        return ConnectionClosed(self._close.code, self._close.reason)

    @property
    def max_message_bytes(self) -> int:
        return self._reader.max

    @max_message_bytes.setter
    def max_message_bytes(self, value: int) -> None:
        """Messages read from now on may hold up to ``value`` bytes (more: 1009)."""
        self._reader.max = value

    def _set(self, state: State) -> None:
        self.state = state
        self._readable = state in _READABLE
        self._writable = state in _WRITABLE
        if not self._readable:
            self._release_pings()

    # -- reading -----------------------------------------------------------------------

    async def get_message(self) -> str | bytes:
        """The next message (text as ``str``, binary as ``bytes``); raises
        ``ConnectionClosed`` once the peer has closed or the connection failed."""
        if self._next < len(self._messages):
            # Several messages came in one read: serve them at a Pace, so the tasks
            # they feed run in batches and a fast client cannot starve the others.
            await self._pace.step()
        while self._next >= len(self._messages):
            if not self._readable:
                raise self._closed_error()
            self._pace.reset()
            await self._receive()  # a scheduler round
        message = self._messages[self._next]
        self._next += 1
        return message

    async def _receive(self) -> None:
        if self._watched is not None:  # (only while a session opens: see ``watch``)
            await self._watched.wait()
            return  # it may have read messages on its way out: the caller looks again
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
            raise self._closed_error() from None
        if not data:  # EOF without a close frame
            self._set(State.CLOSED if self.state is State.CLOSING else State.READ_ENDED)
            return
        if self._next >= len(self._messages):
            self._messages, self._next = [], 0
        await self._feed(data)

    async def _feed(self, data: bytes | bytearray) -> None:
        """Parse ``data``, then send what it calls for: pongs, a close, and once the
        closing handshake is done, the end of our half of the TCP connection."""
        replies = self._absorb(data)
        done = not self._readable and self.state is State.CLOSED
        if replies or done:
            await self._write_out(replies, eof=done)

    def _absorb(self, data: bytes | bytearray) -> list[bytes]:
        """Parse ``data``; returns the frames to answer with (pongs, a close)."""
        reader = self._reader
        replies: list[bytes] = []
        messages = self._messages
        for item in reader.receive(data):
            if isinstance(item, (str, bytes)):
                messages.append(item)
            elif isinstance(item, Control):
                if item.opcode == Opcode.PING:
                    if self.state is State.OPEN:
                        replies.append(control_frame(Opcode.PONG, item.payload))
                else:
                    waiter = self._pongs.pop(item.payload, None)
                    if waiter is not None:
                        waiter.set()
            else:
                self._close = item
                if self.state is State.OPEN:
                    replies.append(close_frame(item.code))  # echo it
                self._set(State.CLOSED)
        error = reader.error
        if error is not None and self._readable:
            self.report_fault(f"close {error.code}: {error.reason}")
            self._close = Close(error.code, error.reason)
            if self.state is State.OPEN:
                replies.append(close_frame(error.code, error.reason))
            self._set(State.CLOSED)
        return replies

    # -- while a session opens ----------------------------------------------------------

    @property
    def peer_gone(self) -> bool:
        """Has the peer closed (a close frame, or a framing error of its own), ended its
        half (FIN) or broken the connection, as read so far?"""
        return self.state is not State.OPEN

    def start_watching(self) -> None:
        """A session starts opening on this connection: ``watch`` is about to run (in a
        task of its own), and ``stop_watching`` may end it even before it has begun."""
        self._watched = trio.Event()
        self._watch_scope = trio.CancelScope()

    async def watch(self, gone: Callable[[], None]) -> None:
        """Read on while a session opens (its engine prepares, its ``session.created`` is
        written), so that the peer's end is seen as it arrives: call ``gone`` then, and
        return. Pings are answered; messages are kept for ``get_message``, and reading
        pauses once ``OPENING_READ_AHEAD`` characters of them wait. Call
        ``start_watching`` first; ``stop_watching`` ends it, and until it has returned
        ``get_message`` waits for it."""
        watched, scope = self._watched, self._watch_scope
        assert watched is not None and scope is not None, "start_watching first"
        fd = self._direct.fd
        try:
            with scope:
                while not self.peer_gone:
                    if self._ahead() >= OPENING_READ_AHEAD:
                        await trio.sleep_forever()  # until stopped: the rest waits in the kernel
                    if fd >= 0:
                        await trio.lowlevel.wait_readable(fd)
                        replies = self.read_now()
                    else:
                        replies = self._took(await self.stream.receive_some(RECEIVE_SIZE))
                    if self.peer_gone:
                        gone()  # first: a session.created write under way is cut
                    if replies or self.state is State.CLOSED:
                        # Shielded: a reply cut half-way would break the connection. (The
                        # write timeout still bounds it.)
                        with trio.CancelScope(shield=True):
                            await self._write_out(replies, eof=self.state is State.CLOSED)
                gone()
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            self._lost()
            gone()
        finally:
            self._watched = self._watch_scope = None
            watched.set()

    def stop_watching(self) -> None:
        """End ``watch`` (a reply it is writing is finished first). Never awaits."""
        if self._watch_scope is not None:
            self._watch_scope.cancel()

    def read_now(self) -> list[bytes]:
        """Read what the socket holds now, without awaiting (a socket's descriptor,
        or a stream with ``receive_now``; elsewhere nothing): the peer's end that already
        arrived is seen before a write.
        Returns the frames it calls for (pongs, a close); see ``reply_now``."""
        if self.peer_gone:
            return []
        fd = self._direct.fd
        try:
            if fd >= 0:
                data: bytes | bytearray | None = os.read(fd, RECEIVE_SIZE)
            elif isinstance(self.stream, ReadsNow):
                data = self.stream.receive_now(RECEIVE_SIZE)
            else:
                return []  # (TLS: only what ``watch`` has read counts)
        except BlockingIOError:
            return []
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):  # reset
            self._lost()
            return []
        return [] if data is None else self._took(data)

    def reply_now(self, replies: list[bytes]) -> None:
        """Write ``replies`` (from ``read_now``) without awaiting: directly when the socket
        is free, else after what is being written (``unsent`` then says so)."""
        if not replies:
            return
        frames = b"".join(replies)
        direct = self._direct
        if self._writing or direct.tail or direct.fd < 0:
            direct.tail += frames  # taken first by the next write (DirectWrite's invariant)
        elif not direct.write(frames):
            self._lost()

    def _took(self, data: bytes | bytearray) -> list[bytes]:
        """``data`` was read: parse it (EOF if empty), as ``_receive`` does."""
        if not data:
            self._set(State.CLOSED if self.state is State.CLOSING else State.READ_ENDED)
            return []
        if self._next >= len(self._messages):
            self._messages, self._next = [], 0
        return self._absorb(data)

    def _ahead(self) -> int:
        return sum(map(len, self._messages[self._next :]))

    # -- writing -----------------------------------------------------------------------

    def _check_writable(self) -> None:
        if not self._writable:
            raise self._closed_error()

    async def send_message(self, message: str | bytes) -> None:
        """Send one message (text for ``str``, binary for ``bytes``); returns once its
        bytes are handed to the stream."""
        self._check_writable()
        await self._write(
            text_frame(message) if isinstance(message, str) else binary_frame(message)
        )

    async def send_many(self, messages: Iterable[str | bytes]) -> None:
        """Send several messages in one write."""
        self._check_writable()
        await self._write(
            b"".join([text_frame(m) if isinstance(m, str) else binary_frame(m) for m in messages])
        )

    def can_write_now(self) -> bool:
        """Can ``write_now`` write at once: a socket, no write in progress, no tail left,
        and the connection open for messages?"""
        return self._writable and not self._writing and self._direct.ready

    def write_now(self, message: str | bytes) -> None:
        """Write one message from the caller's task without awaiting; call only
        when ``can_write_now()``. If the socket takes only part of it, ``unsent`` is
        true until someone awaits ``flush``; if the socket is broken, ``broken`` is."""
        frame = text_frame(message) if isinstance(message, str) else binary_frame(message)
        if not self._direct.write(frame):
            self._lost()  # reset, broken pipe: the reader will see the end too

    @property
    def broken(self) -> bool:
        """A write failed or was cancelled: nothing more can be sent."""
        return not self._writable and self.state is State.BROKEN

    @property
    def unsent(self) -> bool:
        return bool(self._direct.tail)

    async def flush(self) -> None:
        """Finish writing what ``write_now`` left; raises if the connection is broken."""
        await self._write(b"")

    async def ping(self) -> None:
        """Send a ping and wait for its pong (which a reader must be there to see)."""
        self._check_writable()
        self._pings_sent += 1
        payload = self._pings_sent.to_bytes(4, "big")
        waiter = self._pongs[payload] = trio.Event()
        await self._write(control_frame(Opcode.PING, payload))
        await waiter.wait()
        if not self._readable:  # woken by the end of the connection, not a pong
            raise self._closed_error()

    async def aclose(self, code: int, reason: str = "") -> None:
        """Send a close with ``code`` (unless one was sent or received) and read until
        the peer's reply. Bound it with a deadline: a dead peer never replies."""
        try:
            if self.state is State.OPEN:
                self._set(State.CLOSING)
                await self._write_out([close_frame(code, reason)], eof=False)
            elif self._direct.tail and not self.broken:  # a reply_now the socket left
                await self._write(b"")
            while self.state is State.CLOSING:
                await self._receive()
                self._next = len(self._messages)  # closing: what comes now is dropped
        except ConnectionClosed:
            pass
        finally:
            if self.state is not State.BROKEN:
                self._set(State.CLOSED)

    async def _write_out(self, frames: list[bytes], *, eof: bool) -> None:
        if frames:
            await self._write(frames[0] if len(frames) == 1 else b"".join(frames))
        if eof and not self.broken and isinstance(self.stream, trio.abc.HalfCloseableStream):
            await self._write(None)

    async def _write(self, data: bytes | None) -> None:
        """Write ``data`` (None: half-close), after the writes that came first and after
        a direct write's tail."""
        if self._writing:
            await self._turn.park()  # woken as the writer: _writing stays True
        else:
            self._writing = True
        try:
            if self.broken:
                raise self._closed_error()
            direct = self._direct
            tail = direct.take_tail()
            if data and direct.fd >= 0:
                # What the socket takes now needs no await, and no timer: only what it
                # leaves (its buffer is full) waits, under the write timeout.
                if not direct.write(tail + data if tail else data):
                    self._lost()  # reset, broken pipe
                    raise self._closed_error()
                tail, data = direct.take_tail(), b""
                if not tail:
                    return
            try:
                with trio.move_on_after(self.write_timeout) as timer:
                    if data is None:
                        assert isinstance(self.stream, trio.abc.HalfCloseableStream)
                        if tail:
                            await self.stream.send_all(tail)
                        await self.stream.send_eof()
                    elif tail or data:
                        await self.stream.send_all(tail + data if tail else data)
            except BaseException:
                self._lost()  # half a frame may be out: nothing more can go after it
                raise
            if timer.cancelled_caught:  # the peer does not read: the same as a failure
                self.report_fault(f"a write not taken within {self.write_timeout}s: cut")
                self._lost()
                if self._close is None:
                    self._close = Close(CloseCode.ABNORMAL, "write timeout")
                raise self._closed_error()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._closed_error() from None
        finally:
            if self._turn:
                self._turn.unpark()
            else:
                self._writing = False

    def _lost(self) -> None:
        self._set(State.BROKEN)

    def _release_pings(self) -> None:
        if self._pongs:
            pongs, self._pongs = self._pongs, {}
            for waiter in pongs.values():
                waiter.set()


def _answer(status: str, text: str, *headers: str) -> bytes:
    body = text.encode()
    extra = "".join(f"{header}\r\n" for header in headers)
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body


_BAD_REQUEST = _answer("400 Bad Request", "HTTP lines must end with CR LF.\n")
_TOO_LARGE = _answer(
    "431 Request Header Fields Too Large", f"The request head exceeds {_MAX_REQUEST_BYTES} bytes.\n"
)
RETRY_AFTER_S = 1
_UNAVAILABLE = _answer(
    "503 Service Unavailable",
    "Too many connections; retry later.\n",
    f"Retry-After: {RETRY_AFTER_S}",
)


def _uncounted(reason: str) -> None:
    pass


_UNAUTHORIZED = _answer(
    "401 Unauthorized", "a credential is required\n", "WWW-Authenticate: Bearer"
)

_SINGLE_HEADERS = ("Host", "Origin", "Authorization")
"""Headers a request may hold once only (which one would be meant?): else 400."""
_TWICE = _answer("400 Bad Request", "Host, Origin and Authorization may be sent once each\n")

_RELAY_FORBIDDEN = _answer(
    "403 Forbidden", "this endpoint takes resumes relayed by the nodes of this cluster only\n"
)


def _throttled(retry_after_s: int) -> bytes:
    return _answer(
        "429 Too Many Requests",
        "too many failed resumes from this address; retry later\n",
        f"Retry-After: {retry_after_s}",
    )


_REFUSAL_REASONS = {404: "not_found"}
"""The ``trio_duplex_handshake_refusals_total`` reason of an upgrade answered so."""


_POST_TOKENS = (f"POST {TOKENS_PATH} ".encode(), f"POST {TOKENS_PATH}?".encode())
MAX_POST_BYTES = 80 * 1024
"""The largest body of a POST by default (a client token's request: a configuration
and a TTL); the server passes its first message's bound (``first_message_bytes``)."""
_DISCARD_BYTES = 1024 * 1024
"""A body over the bound is still read, up to this size, before the 413."""
_CONTENT_LENGTH = re.compile(r"[0-9]{1,16}")
"""ASCII digits only: ``str.isdigit`` takes ``²``, which ``int`` then refuses."""

_PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    413: "Content Too Large",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


async def _post(
    stream: trio.abc.Stream,
    head: bytes,
    body: bytes,
    issue_token: Callable[[Headers, bytes], tuple[int, bytes]],
    where: str,
    origins: tuple[str, ...],
    max_bytes: int,
) -> None:
    """Answer a POST: only ``auth.TOKENS_PATH`` takes one (``issue_token`` answers it).
    Whatever the request holds, the answer is a status and a JSON error, never an
    exception: the fault is logged at INFO, at the fault log's rate."""
    line, *lines = head.decode("latin-1").split("\r\n")
    parts = line.split(" ")
    headers = Headers()  # case-insensitive, as a verifier (--auth) expects
    for header in lines:
        name, sep, value = header.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    lengths = headers.get_all("Content-Length")
    length = int(lengths[0]) if len(lengths) == 1 and _CONTENT_LENGTH.fullmatch(lengths[0]) else -1
    if len(parts) != 3 or parts[1].partition("?")[0] != TOKENS_PATH:
        status, answer = 404, b'{"error": "no such endpoint"}'
    elif not origin_allowed(headers.get_all("Origin"), headers.get_all("Host"), origins):
        status, answer = 403, b'{"error": "origin not allowed"}'
    elif "Transfer-Encoding" in headers or length < 0:
        status, answer = 400, b'{"error": "a body needs one Content-Length, in digits"}'
    elif length > max_bytes:
        status, answer = 413, json.dumps({"error": f"the body exceeds {max_bytes} bytes"}).encode()
        # Read (and drop) a body of moderate size first: closing with unread bytes resets
        # the connection, and the client may then lose the answer.
        left = length - len(body) if length <= _DISCARD_BYTES else 0
        while left > 0:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            left -= len(data)
    else:
        if len(body) < length and headers.get_all("Expect") == ["100-continue"]:
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")  # (curl waits 1 s else)
        while len(body) < length:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            body += data
        status, answer = issue_token(headers, body[:length])
    if status != 200:
        FAULTS.report(where, f"{status} to a POST")
    extra = ["Cache-Control: no-store"]
    if status == 401:
        extra.append("WWW-Authenticate: Bearer")
    if status in (429, 503):
        extra.append(f"Retry-After: {RETRY_AFTER_S}")
    reply = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(answer)}\r\n"
        + "".join(f"{line}\r\n" for line in extra)
        + "Connection: close\r\n\r\n"
    )
    await stream.send_all(reply.encode() + answer)


def _refusal_reason(exc: BaseException | None) -> str:
    """Why websockets refused a request head, in a fixed text (never the client's)."""
    cause = exc.__cause__ if exc is not None else None
    if isinstance(cause, NotImplementedError):
        return "transfer codings are not supported"
    if isinstance(cause, ValueError) and "body" in str(cause):
        return "an upgrade request has no body"
    return "not a valid HTTP/1.1 request"


def _select_subprotocol(_: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """``trio-duplex`` if offered, else none (never another: a bearer credential offered
    as ``trio-duplex.bearer.KEY`` must not be echoed back)."""
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


def _bare_line_feed(head: bytes, start: int) -> bool:
    """A line ended by LF alone at or after ``start``: never a valid upgrade, and its
    "\r\n\r\n" may never come."""
    at = head.find(b"\n", start)
    while at >= 0:
        if at == 0 or head[at - 1] != 0x0D:
            return True
        at = head.find(b"\n", at + 1)
    return False


async def refuse_unavailable(stream: trio.abc.Stream) -> None:
    """Answer a request with 503 and ``Retry-After``, once its head has been read.

    Reading it first matters: closing a socket with unread bytes resets the connection,
    and the client may then lose the answer. Nothing is answered if the stream ends or
    the head exceeds the 16 KiB bound first. Bound it with a (short) deadline."""
    head = bytearray()
    while True:
        start = max(0, len(head) - 3)  # a blank line may straddle two reads
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return
        head += data
        if head.find(b"\r\n\r\n", start) >= 0 or head.find(b"\n\n", start) >= 0:
            break
        if len(head) > _MAX_REQUEST_BYTES:
            return
    await stream.send_all(_UNAVAILABLE)


async def accept_websocket(
    stream: trio.abc.Stream,
    path: str | None,
    max_message_bytes: int,
    write_timeout: float = math.inf,
    peer: str | None = None,
    endpoints: Endpoints | None = None,
    *,
    origins: tuple[str, ...] = (),
    authorize: Callable[[Request, str | None], Grant | Throttled | None] | None = None,
    issue_token: Callable[[Headers, bytes], tuple[int, bytes]] | None = None,
    relay: tuple[str, Callable[[Request], tuple[Grant, dict[str, str]] | None]] | None = None,
    max_post_bytes: int = MAX_POST_BYTES,
) -> tuple[WebSocket, dict[str, list[str]], Grant] | None:
    """Read the HTTP upgrade request and answer it.

    A valid upgrade for ``path`` gets 101 and returns the WebSocket and the query; one
    for another path gets 404, one whose Origin header is not allowed 403 (``origins``,
    ``--allow-origin``: those, or any with ``*``; none given: only the origin of the Host
    it names, http.py's ``same_origin``), before its credential is looked at; a request
    that is not an upgrade, or that repeats Host, Origin or Authorization, 400; and
    anything that is not HTTP is dropped: those return None. Bound it with a deadline.
    A path that ``endpoints`` answers (health, metrics: http.py) gets that answer
    instead. With ``authorize``, an upgrade it grants nothing gets 401, and one it
    throttles 429 (auth.py); the grant is returned with the WebSocket. A POST to the
    token path goes to ``issue_token`` (a body of at most ``max_post_bytes``). ``path``
    None: no such endpoint here (a listener for relayed resumes only). With ``relay``
    (cluster mode: its path, and a check of the request's signature), an upgrade for
    that path gets the check's grant and its 101 the check's headers (the relay's
    proof), or 403.
    """
    where = f"a connection from {peer}" if peer else "a connection"
    refused = _uncounted if endpoints is None else endpoints.refused
    received = b""
    checked = 0  # LFs before this were looked at
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > _MAX_REQUEST_BYTES:
            break
        if _bare_line_feed(received, checked):
            FAULTS.report(where, "400: a request line not ended by CR LF")
            refused("bad_request")
            await stream.send_all(_BAD_REQUEST)
            return None
        checked = len(received)
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        received += data
    if end < 0 or end + 4 > _MAX_REQUEST_BYTES:  # the bound counts however the bytes came
        FAULTS.report(where, "431: request head too large")
        refused("head_too_large")
        await stream.send_all(_TOO_LARGE)
        return None
    # A GET upgrade has no body: frames the client sent at once come right after it.
    head, early = received[: end + 4], received[end + 4 :]
    if issue_token is not None and head.startswith(_POST_TOKENS):
        await _post(stream, head, early, issue_token, where, origins, max_post_bytes)
        return None
    if endpoints is not None and endpoints.demo is not None and head.startswith(b"HEAD "):
        await stream.send_all(endpoints.answer_head(head))  # (websockets parses GETs only)
        return None
    protocol = ServerProtocol(select_subprotocol=_select_subprotocol, logger=_quiet)
    protocol.receive_data(head)
    events = protocol.events_received()
    if not events:  # not an HTTP request websockets takes: say why, in our words
        why = _refusal_reason(protocol.handshake_exc)
        FAULTS.report(where, f"400: {why}")
        refused("bad_request")
        await stream.send_all(_answer("400 Bad Request", why + "\n"))
        return None
    request = events[0]
    assert isinstance(request, Request)
    if any(len(request.headers.get_all(name)) > 1 for name in _SINGLE_HEADERS):
        FAULTS.report(where, "400: a header sent twice that may be sent once")
        refused("bad_request")
        await stream.send_all(_TWICE)
        return None
    try:
        url = urlsplit(request.path)
    except ValueError:  # "//[x": an IPv6 host never closed
        FAULTS.report(where, "400: not a valid request target")
        refused("bad_request")
        await stream.send_all(_answer("400 Bad Request", "not a valid request target\n"))
        return None
    if (
        endpoints is not None
        and (answer := endpoints.answer(url.path, request.headers.get("Host"))) is not None
    ):
        await stream.send_all(answer)
        return None
    if not origin_allowed(
        request.headers.get_all("Origin"), request.headers.get_all("Host"), origins
    ):  # before the credential: a page of another origin spends no client token
        FAULTS.report(where, "403: origin not allowed")
        refused("origin")
        protocol.send_response(protocol.reject(403, "origin not allowed\n"))
        await stream.send_all(b"".join(protocol.data_to_send()))
        return None
    grant = OPEN
    answer_headers: dict[str, str] = {}
    relayed = relay is not None and url.path == relay[0]
    if relay is not None and relayed:
        signed = relay[1](request)
        if signed is None:
            FAULTS.report(where, "403: a relay request not signed for this node")
            refused("relay_unsigned")
            await stream.send_all(_RELAY_FORBIDDEN)
            return None
        grant, answer_headers = signed
    elif authorize is not None and url.path == path:
        found = authorize(request, peer)
        if isinstance(found, Throttled):
            FAULTS.report(where, "429: too many failed resumes from its address")
            refused("throttled")
            await stream.send_all(_throttled(found.retry_after_s))
            return None
        if found is None:
            FAULTS.report(where, "401: no valid credential")
            refused("unauthorized")
            await stream.send_all(_UNAUTHORIZED)
            return None
        grant = found
    response = protocol.accept(request)
    if response.status_code != 101:
        response = protocol.reject(400, "this endpoint takes WebSocket upgrade requests\n")
    elif url.path != path and not relayed:
        response = protocol.reject(404, "no such endpoint\n")
    else:
        for name, value in answer_headers.items():
            response.headers[name] = value
    protocol.send_response(response)
    if response.status_code != 101:
        FAULTS.report(where, f"{response.status_code}: {response.reason_phrase}")
        refused(_REFUSAL_REASONS.get(response.status_code, "not_upgrade"))
    await stream.send_all(b"".join(protocol.data_to_send()))
    if response.status_code != 101:
        return None
    ws = WebSocket(stream, max_message_bytes, write_timeout, peer)
    if early:
        await ws._feed(early)
    return ws, parse_qs(url.query), grant


__all__ = [
    "RETRY_AFTER_S",
    "ConnectionClosed",
    "WebSocket",
    "accept_websocket",
    "refuse_unavailable",
]
