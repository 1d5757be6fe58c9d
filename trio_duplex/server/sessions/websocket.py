"""The server side of a WebSocket on a trio stream, with no task of its own.

After the HTTP upgrade (``front/handshake.py``) the frames are ours (``core/frames.py``:
the per-message path, measured there).

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
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import trio

from ..._pace import Pace
from ...core.frames import (
    ClientFrames,
    Close,
    CloseCode,
    Control,
    Encoded,
    FrameError,
    FrameReader,
    Opcode,
    binary_frame,
    close_frame,
    control_frame,
    frames_of,
    text_frame,
)
from .faults import FAULTS

RECEIVE_SIZE = 65536
OPENING_READ_AHEAD = RECEIVE_SIZE
"""While a session opens, reading pauses once messages of this many characters wait."""


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
        "_full",
        "_messages",
        "_next",
        "_pace",
        "_pings_sent",
        "_pongs",
        "_readable",
        "_reader",
        "_scanner",
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
        self._scanner: ClientFrames | None = None  # (``get_frames``: the relay's front)
        self._messages: list[str | bytes] = []  # from the last read; served up to _next
        self._next = 0
        self._pace = Pace()
        self._close: Close | None = None  # the close received, or the one we failed with
        self._writing = False
        # Writers waiting for their turn: made by the first (an idle connection has none).
        self._turn: trio.lowlevel.ParkingLot | None = None
        self._direct = DirectWrite(stream)
        self._full = False  # the last read filled its buffer: read again at once
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
        if self._scanner is not None:
            self._scanner.max = value

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
        if self._next < len(self._messages) and self._pace.due():
            # Several messages came in one read: serve them at a Pace, so the tasks
            # they feed run in batches and a fast client cannot starve the others (a
            # cancellable scheduler round every EVERY messages, none between: what a
            # cancel cuts short is a connection, whose messages it no longer takes).
            await trio.lowlevel.checkpoint()
        while self._next >= len(self._messages):
            if not self._readable:
                raise self._closed_error()
            self._pace.reset()
            await self._receive()  # a scheduler round
        message = self._messages[self._next]
        self._next += 1
        return message

    async def get_messages(self) -> list[str | bytes]:
        """Every message parsed and not yet served (at least one): those of one read,
        as a batch, for a caller that handles a batch at once (the pooled relay's
        front writes one frame to the home per read, not one per message). Raises
        ``ConnectionClosed`` as ``get_message`` does once none is left. Messages left
        by ``get_message`` come first, after a scheduler round; a read is one anyway,
        so a batch is one round however many messages it holds (at most what one read
        completes: ``RECEIVE_SIZE`` bytes, or one message of up to the bound)."""
        if self._next < len(self._messages):
            await trio.lowlevel.checkpoint()
        while self._next >= len(self._messages):
            if not self._readable:
                raise self._closed_error()
            await self._receive()  # a scheduler round
        messages, start = self._messages, self._next
        self._messages, self._next = [], 0
        self._pace.reset()
        return messages if not start else messages[start:]

    @property
    def parsed_all(self) -> bool:
        """Every message parsed has been served, and the parser holds nothing (no
        incomplete frame, no fragmented message under way): what comes next is whole
        frames, which ``get_frames`` may take from here on."""
        return self._next >= len(self._messages) and self._reader.idle

    async def get_frames(self) -> tuple[bytes, int]:
        """The data frames (TEXT, BINARY, continuations) of the next read that brings
        any, checked and held back whole (``ClientFrames``) but neither unmasked nor
        decoded: the client's frames as it sent them, back to back, and how many, for
        the pooled relay's front to pass on to the home. Control frames are handled
        here as ``get_message`` handles them (a ping answered, a pong to its waiter, a
        close echoed), and so is a broken rule (the same close to the client, the fault
        reported once); then ``ConnectionClosed`` is raised as ``get_message`` does.
        Text is not checked to be UTF-8 (the home does: ``ClientFrames``). Call it only
        once ``parsed_all``, and from then on instead of ``get_message`` (``aclose``
        reads on with it too: a frame the scan holds in part is not a frame's start)."""
        scanner = self._scanner
        if scanner is None:
            assert self.parsed_all and self._watched is None, "messages are still parsed"
            scanner = self._scanner = ClientFrames(self._reader.max)
        while True:
            if not self._readable:
                raise self._closed_error()
            try:
                if self._direct.fd >= 0:
                    data: bytes | bytearray = await self._read_socket()
                else:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self._lost()
                raise self._closed_error() from None
            if not data:  # EOF without a close frame
                self._set(State.CLOSED if self.state is State.CLOSING else State.READ_ENDED)
                continue
            frames, count, controls = scanner.scan(data)
            replies: list[bytes] = []
            for item in controls:
                self._control(item, replies)
            if scanner.error is not None:
                self._fault(scanner.error, replies)
            done = not self._readable and self.state is State.CLOSED
            if replies or done:
                await self._write_out(replies, eof=done)
            if count:
                return frames, count

    async def _receive(self) -> None:
        if self._watched is not None:  # (only while a session opens: see ``watch``)
            await self._watched.wait()
            return  # it may have read messages on its way out: the caller looks again
        try:
            if self._direct.fd >= 0:
                data: bytes | bytearray = await self._read_socket()
            else:
                data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._lost()
            raise self._closed_error() from None
        if not data:  # EOF without a close frame
            self._set(State.CLOSED if self.state is State.CLOSING else State.READ_ENDED)
            return
        if self._next >= len(self._messages):
            self._messages, self._next = [], 0
        # (``_feed``, without its coroutine when there is nothing to answer: most reads)
        replies = self._absorb(data)
        done = not self._readable and self.state is State.CLOSED
        if replies or done:
            await self._write_out(replies, eof=done)

    async def _read_socket(self) -> bytes:
        """What the socket holds, read once it is readable: a wait (the scheduler round)
        and one ``os.read``, where ``receive_some`` first tries a read that, with the
        last message served, mostly finds nothing (a syscall and an exception per
        wake-up). After a read that filled the buffer, more is likely waiting: it reads
        at once, after a checkpoint."""
        fd = self._direct.fd
        stream = self.stream
        assert isinstance(stream, trio.SocketStream)
        if stream.socket.fileno() != fd:  # closed: its number may be another's by now
            raise trio.ClosedResourceError
        if self._full:
            await trio.lowlevel.checkpoint()
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                pass
            else:
                self._full = len(data) == RECEIVE_SIZE
                return data
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:  # (woken, and another read took it: wait again)
                continue
            self._full = len(data) == RECEIVE_SIZE
            return data

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
            else:
                self._control(item, replies)
        if reader.error is not None:
            self._fault(reader.error, replies)
        return replies

    def _control(self, item: Control | Close, replies: list[bytes]) -> None:
        """A control frame read: a ping's pong, or a close's echo, to ``replies``."""
        if isinstance(item, Control):
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

    def _fault(self, error: FrameError, replies: list[bytes]) -> None:
        """The parser found the client broke a rule: reported (once), and closed."""
        if self._readable:
            self.report_fault(f"close {error.code}: {error.reason}")
            self._close = Close(error.code, error.reason)
            if self.state is State.OPEN:
                replies.append(close_frame(error.code, error.reason))
            self._set(State.CLOSED)

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
        if isinstance(message, str):
            await self._write(text_frame(message))
        else:
            await self._write(message if isinstance(message, Encoded) else binary_frame(message))

    async def send_many(self, messages: Iterable[str | bytes]) -> None:
        """Send several messages in one write."""
        self._check_writable()
        await self._write(frames_of(messages))

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

    def write_many_now(self, messages: list[str | bytes]) -> None:
        """``write_now`` for several messages, in one write."""
        if not self._direct.write(frames_of(messages)):
            self._lost()

    def write_frames_now(self, frames: bytes) -> None:
        """``write_now`` for frames already encoded (``Encoded``: a server's, whole),
        as they are."""
        if not self._direct.write(frames):
            self._lost()

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

    def playout_fenced(self, fenced: bool) -> None:
        """A WebSocket plays nothing out: nothing to stop (``MessageTransport``)."""

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
                if self._scanner is not None:  # (the relay's front: its scan read last)
                    await self.get_frames()  # closing: what comes now is dropped
                    continue
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
            if self._turn is None:
                self._turn = trio.lowlevel.ParkingLot()
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


__all__ = ["RECEIVE_SIZE", "ConnectionClosed", "WebSocket"]
