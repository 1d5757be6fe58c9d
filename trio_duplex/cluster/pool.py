"""The pooled relay (docs/cluster.md, "The relay"): long-lived, mutually authenticated
peer connections between nodes, each carrying many relayed client connections.

A front node relays a resume of a session held elsewhere over a *peer connection* to
the session's home: at most ``MAX_LINKS_PER_HOME`` per home node, dialled on first
need, kept while they carry channels and closed once idle for ``IDLE_S``. Each carries
up to ``MAX_CHANNELS`` *channels*, one per relayed client connection.

Authentication. A peer connection is an HTTP upgrade to the home's relay endpoint,
signed once as a relayed resume is (relay.py: ``X-Trio-Duplex-Relay: p1 FROM TO TIME
NONCE MAC``, its own label in the MAC, the nonce never taken twice), and the home's 101
proves it holds the secret (``X-Trio-Duplex-Relay-Proof``) before the front sends
anything. After the 101 both sides speak the framing below on the stream (TCP or TLS),
never WebSocket frames. Each channel names the one session it may resume: the home
serves it with the grant of a relayed resume of that session (``Grant(resume_of=...,
relayed=True)``), whose token it checks as for any resume.

Framing. Every frame is a 9-byte head, ``kind`` (1 byte), ``channel`` (4), ``length``
(4), all big-endian, then ``length`` bytes:

- ``OPEN`` (front to home): ``SESSION DIALECT`` in ASCII; channel ids only increase;
- ``DATA``: bytes of the channel's WebSocket stream, as a client and a server connected
  directly would exchange them after the upgrade (client frames, masked, towards the
  home; the home's frames towards the front), so that the home runs its ordinary
  connection code on the channel (``HomeChannel``, a ``trio.abc.HalfCloseableStream``);
- ``CREDIT``: 4 bytes, more of the channel's window given back;
- ``EOF``: nothing more from the sender on the channel; ``RESET``: the channel is
  abandoned (a broken connection);
- ``PING``, ``PONG`` (channel 0): 8 bytes, the peer connection's keepalive.

Bounds. Each direction of a channel has a window of ``WINDOW`` bytes: the sender sends
no more than the receiver has given credit for, and the receiver gives credit back as
its consumer takes bytes (the home's connection reads them; the front's client is
written to without congestion), so a slow client holds only its own channel's window,
never the peer connection. A peer that sends past a window, or a frame longer than
``MAX_FRAME``, breaks the rules: the peer connection is cut. Bytes queued for one peer
connection are bounded (``OUT_LIMIT``, plus one frame): a sender waits for room; the
writer sends everything queued in one write per wake-up, each write within the write
timeout. A message from the home to a client is at most ``MAX_RELAYED_MESSAGE_BYTES``.

Failure. A peer connection that breaks (the peer died, a write not taken within the
write timeout, nothing heard for ``PEER_TIMEOUT_S`` while pinging every
``PING_INTERVAL_S``, a rule broken) breaks every channel on it: on the front, each
client connection ends 1001 as when a home dies (or, if the home had said nothing yet,
the client is told ``session_home_unreachable``); on the home, each channel's stream
raises ``BrokenResourceError`` and the session detaches as on any lost connection.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import logging
import os
import secrets
import ssl
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import attrs
import trio

from ..core.frames import CloseCode, Opcode
from ..core.opening import Grant
from ..dialects import Dialect, by_name
from ..server.sessions.connection import Connection
from ..server.sessions.websocket import RECEIVE_SIZE, WebSocket
from ..server.sessions.websocket import ConnectionClosed as ClientGone
from .relay import (
    HEADER,
    MAX_RELAYED_MESSAGE_BYTES,
    PROOF_HEADER,
    RELAY_PATH,
    RelayKeys,
    relayable,
    sign_pool,
)

log = logging.getLogger("trio_duplex")

WINDOW = 256 * 1024
"""Bytes one direction of a channel may have in flight (sent, not yet consumed)."""
SLACK = 1024
"""What a sender may go past a window by, for the small control frames it must answer
(a pong to the home's ping, a close's echo) when the window is full."""
MAX_FRAME = 64 * 1024
"""The longest DATA payload (a longer write is sent in several)."""
OUT_LIMIT = 1024 * 1024
"""Bytes queued for one peer connection before senders wait (plus one frame at most)."""
MAX_CHANNELS = 4096
"""Channels one peer connection carries at once; more are refused (RESET)."""
MAX_LINKS_PER_HOME = 4
"""Peer connections a front keeps to one home node."""
IDLE_S = 30.0
"""A peer connection with no channel for this long is closed (by the front)."""
PING_INTERVAL_S = 5.0
"""A side that heard nothing for this long pings."""
PEER_TIMEOUT_S = 15.0
"""A peer connection on which nothing was heard for this long is cut."""
READ_SIZE = 256 * 1024
_MAX_HEAD_BYTES = 16384
_POOL_SESSION = "\x00pool"
"""The session a pool grant "resumes" if it ever reached the session code: none can."""

_HEAD = struct.Struct(">BII")
_HEAD_SIZE = _HEAD.size
_CREDIT = struct.Struct(">I")
_PING = struct.Struct(">Q")
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Kind(enum.IntEnum):
    OPEN = 1
    DATA = 2
    CREDIT = 3
    EOF = 4
    RESET = 5
    PING = 6
    PONG = 7


_OPEN, _DATA, _CREDIT_K, _EOF, _RESET, _PINGK, _PONGK = (
    Kind.OPEN,
    Kind.DATA,
    Kind.CREDIT,
    Kind.EOF,
    Kind.RESET,
    Kind.PING,
    Kind.PONG,
)
_MAX_OPEN = 2 * 128 + 1


class Broken(Exception):
    """The peer connection broke the framing rules (or ended): it is cut."""


class _Closed(Exception):
    """The peer closed an idle peer connection: nothing to say."""


@attrs.frozen(repr=False)
class PoolGrant(Grant):
    """An upgrade that is a pooled peer connection from ``peer`` (placement.py takes it
    aside before the session code; were it ever to reach that code, it may only resume
    a session that cannot exist)."""

    peer: str = ""


def pool_grant(peer: str) -> PoolGrant:
    return PoolGrant(None, resume_of=_POOL_SESSION, relayed=True, peer=peer)


# -- the client side's WebSocket frames (masked with a zero key: the bytes as they are) --

_ZERO_MASK = b"\x00\x00\x00\x00"


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One unfragmented frame as a client sends it (masked, with a key of zeros, which
    leaves the payload as it is: the hop between nodes is not a browser's)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0xFE)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0xFF)) + n.to_bytes(8, "big")
    return head + _ZERO_MASK + payload


def message_frame(message: str | bytes) -> bytes:
    if isinstance(message, str):
        return client_frame(Opcode.TEXT, message.encode())
    return client_frame(Opcode.BINARY, message)


class BadFrame(Exception):
    """The home's WebSocket stream broke the rules (our own server: a bug, not a client)."""


class ServerFrames:
    """Parses a server's (unmasked) WebSocket frames from the bytes of a channel."""

    __slots__ = ("_buf", "_parts", "_parts_op", "limit")

    def __init__(self, limit: int = MAX_RELAYED_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._parts: bytearray | None = None
        self._parts_op = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole messages (TEXT or BINARY, joined from fragments) and control frames
        (CLOSE, PING, PONG) in ``data`` and what was held back. BadFrame: not a
        server's framing, or a message over ``limit``."""
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        out: list[tuple[int, bytes]] = []
        n = len(buf)
        pos = 0
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if b1 & 0x80 or b0 & 0x70:
                raise BadFrame("a masked frame, or reserved bits")
            length = b1
            head = pos + 2
            if length == 126:
                if n - head < 2:
                    break
                length = int.from_bytes(buf[head : head + 2], "big")
                head += 2
            elif length == 127:
                if n - head < 8:
                    break
                length = int.from_bytes(buf[head : head + 8], "big")
                head += 8
            if length > self.limit:
                raise BadFrame(f"a frame of {length} bytes")
            end = head + length
            if end > n:
                break
            payload = bytes(buf[head:end])
            pos = end
            opcode = b0 & 0x0F
            if opcode >= 8:
                out.append((opcode, payload))
                continue
            if opcode:  # TEXT or BINARY: a message begins
                if self._parts is not None:
                    raise BadFrame("a message began before the last one ended")
                if b0 & 0x80:
                    out.append((opcode, payload))
                    continue
                self._parts, self._parts_op = bytearray(payload), opcode
                continue
            parts = self._parts
            if parts is None:
                raise BadFrame("a continuation with no message")
            parts += payload
            if len(parts) > self.limit:
                raise BadFrame("a message over the bound")
            if b0 & 0x80:
                out.append((self._parts_op, bytes(parts)))
                self._parts = None
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        return out


# -- one peer connection, either side ------------------------------------------------


@attrs.define(eq=False)
class Link:
    """One peer connection: its writer (everything queued goes out in one write per
    wake-up), its reader (frames dispatched to channels, never waiting on one), its
    keepalive, and its channels."""

    stream: trio.abc.Stream
    peer: str
    """The other node's id."""
    write_timeout_s: float
    front: bool
    """True on the node that dialled (it opens channels), False on the home."""
    channels: dict[int, Channel] = attrs.field(factory=dict)
    broken: bool = False
    closing: bool = False
    """No new channel goes on it (idle, or ending)."""
    _out: bytearray = attrs.field(factory=bytearray)
    _wake: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _room: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _heard: float = attrs.field(factory=trio.current_time)
    _idle_since: float = attrs.field(factory=trio.current_time)
    _next_id: int = 1
    _last_opened: int = 0
    _scope: trio.CancelScope | None = None
    on_open: Callable[[Link, int, str, str], None] | None = None
    """The home's: a channel was opened (id, session, dialect name)."""
    ended: trio.Event = attrs.field(factory=trio.Event)
    _sending: bool = False
    """The writer has a write under way (nothing may be written directly meanwhile)."""
    _fd: int = attrs.field(init=False)
    """The socket's descriptor for direct writes; -1: none (TLS, in memory)."""

    def __attrs_post_init__(self) -> None:
        stream = self.stream
        usable = isinstance(stream, trio.SocketStream) and sys.platform != "win32"
        self._fd = (
            stream.socket.fileno() if isinstance(stream, trio.SocketStream) and usable else -1
        )

    def __repr__(self) -> str:
        side = "to" if self.front else "from"
        return f"<relay link {side} {self.peer} {len(self.channels)} channels>"

    # -- writing -----------------------------------------------------------------------

    def put(self, kind: int, channel: int, payload: bytes = b"") -> None:
        """Queue a frame (never waits: the caller minds ``room``). With nothing queued
        and no write under way, it is written at once from the caller's task (one
        non-blocking ``os.write``: no task switch); what the socket does not take, and
        whatever is queued after it, the writer sends in order."""
        if self.broken:
            return
        out = self._out
        if not out and not self._sending and self._fd >= 0:
            frame = _HEAD.pack(kind, channel, len(payload)) + payload
            try:
                sent = os.write(self._fd, frame)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = 0  # (reset, broken pipe: the writer's send says so and ends it)
            if sent == len(frame):
                return
            out += frame[sent:] if sent else frame
        else:
            out += _HEAD.pack(kind, channel, len(payload))
            if payload:
                out += payload
        if self._wake:
            self._wake.unpark()

    @property
    def full(self) -> bool:
        return len(self._out) >= OUT_LIMIT

    async def room(self) -> None:
        """Wait until the queue has room (or the link broke: the caller checks)."""
        while len(self._out) >= OUT_LIMIT and not self.broken:
            await self._room.park()

    async def _writer(self) -> None:
        stream, wake = self.stream, self._wake
        while True:
            while not self._out:
                await wake.park()
            out, self._out = self._out, bytearray()
            self._sending = True
            with trio.move_on_after(self.write_timeout_s) as timer:
                await stream.send_all(out)
            self._sending = False
            if timer.cancelled_caught:
                raise Broken(f"a write not taken within {self.write_timeout_s}s")
            if self._room:
                self._room.unpark_all()

    # -- reading -----------------------------------------------------------------------

    async def _reader(self, early: bytes) -> None:
        held = b""
        if early:
            pos = self._dispatch(early)
            held = early[pos:]
        stream = self.stream
        while True:
            raw = await stream.receive_some(READ_SIZE)
            data = raw if isinstance(raw, bytes) else bytes(raw)
            if not data:
                if self.channels or held:
                    raise Broken("the peer closed the connection")
                raise _Closed
            self._heard = trio.current_time()
            if held:
                data, held = held + data, b""
            pos = self._dispatch(data)
            if pos < len(data):
                held = data[pos:]

    def _dispatch(self, buf: bytes) -> int:
        """Handle every whole frame in ``buf``; returns where the rest begins."""
        n = len(buf)
        pos = 0
        unpack = _HEAD.unpack_from
        channels = self.channels
        while n - pos >= _HEAD_SIZE:
            kind, cid, length = unpack(buf, pos)
            if length > MAX_FRAME:
                raise Broken(f"a frame of {length} bytes")
            start = pos + _HEAD_SIZE
            end = start + length
            if end > n:
                break
            pos = end
            if kind == _DATA:
                channel = channels.get(cid)
                if channel is not None:  # (else one that ended here: dropped)
                    channel.on_data(buf[start:end])
            elif kind == _CREDIT_K:
                channel = channels.get(cid)
                if length != 4:
                    raise Broken("a credit frame of another length")
                if channel is not None:
                    channel.on_credit(_CREDIT.unpack_from(buf, start)[0])
            elif kind == _EOF or kind == _RESET:
                channel = channels.get(cid)
                if channel is not None:
                    channel.on_end(kind == _RESET)
            elif kind == _OPEN:
                self._opened(cid, buf[start:end])
            elif kind == _PINGK:
                if length != _PING.size:  # (so a peer's pings cannot grow our queue)
                    raise Broken("a ping of another length")
                self.put(_PONGK, 0, buf[start:end])
            elif kind == _PONGK:
                pass  # (heard: that is all a pong says)
            else:
                raise Broken(f"an unknown frame kind {kind}")
        return pos

    def _opened(self, cid: int, payload: bytes) -> None:
        if self.front or self.on_open is None:
            raise Broken("a channel opened by the home")
        if cid <= self._last_opened or len(payload) > _MAX_OPEN:
            raise Broken("a channel id not above the last, or a long OPEN")
        self._last_opened = cid
        try:
            session_id, dialect = payload.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise Broken("an OPEN that is not SESSION DIALECT") from None
        if len(self.channels) >= MAX_CHANNELS:
            self.put(_RESET, cid)
            return
        self.on_open(self, cid, session_id, dialect)

    # -- its life ----------------------------------------------------------------------

    def new_channel_id(self) -> int:
        cid = self._next_id
        self._next_id += 1
        return cid

    def add(self, channel: Channel) -> None:
        self.channels[channel.id] = channel

    def remove(self, channel: Channel) -> None:
        if self.channels.pop(channel.id, None) is not None and not self.channels:
            self._idle_since = trio.current_time()

    async def _keepalive(self) -> None:
        sequence = 0
        while True:
            await trio.sleep(PING_INTERVAL_S / 2)
            now = trio.current_time()
            silent = now - self._heard
            if silent >= PEER_TIMEOUT_S:
                raise Broken(f"nothing heard from the peer for {PEER_TIMEOUT_S}s")
            if silent >= PING_INTERVAL_S:
                sequence += 1
                self.put(_PINGK, 0, _PING.pack(sequence))
            if self.front and not self.channels and now - self._idle_since >= IDLE_S:
                self.closing = True  # no channel can be opened on it from here on
                return

    async def run(self, early: bytes = b"") -> None:
        """Serve the link until it ends (idle, broken, cancelled); then every channel on
        it is broken, and the stream closed."""
        why = "closed"
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._writer)
                nursery.start_soon(self._reader, early)
                await self._keepalive()  # returns once idle (the front's)
                nursery.cancel_scope.cancel()
        except* _Closed:
            pass
        except* Broken as group:
            why = str(group.exceptions[0])
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            why = f"the connection broke ({group.exceptions[0]!r})"
        finally:
            self.broken = self.closing = True
            self._out = bytearray()
            self._room.unpark_all()
            for channel in list(self.channels.values()):
                channel.on_broken()
            self.channels.clear()
            self.ended.set()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
        if why != "closed":
            log.info("relay: the peer connection with node %s ended: %s", self.peer, why)

    def cut(self) -> None:
        if self._scope is not None:
            self._scope.cancel()


# -- channels -----------------------------------------------------------------------


class Channel:
    """One relayed client connection on a link: the credit it may send on, the window
    it has given, and its end."""

    __slots__ = (
        "_credit_lot",
        "credit",
        "ended_by_peer",
        "failed",
        "id",
        "link",
        "sent_eof",
        "unreturned",
        "window",
    )

    def __init__(self, link: Link, cid: int) -> None:
        self.link = link
        self.id = cid
        self.credit = WINDOW
        """What this side may still send."""
        self.window = WINDOW
        """What the peer may still send this side."""
        self.unreturned = 0
        """Bytes consumed here not yet given back as credit."""
        self.failed = False
        self.ended_by_peer = False
        self.sent_eof = False
        self._credit_lot = trio.lowlevel.ParkingLot()

    def on_data(self, data: bytes) -> None:
        self.window -= len(data)
        if self.window < -SLACK:
            raise Broken(f"channel {self.id}: data past its window")
        self.received(data)

    def received(self, data: bytes) -> None:
        raise NotImplementedError

    def consumed(self, n: int) -> None:
        """``n`` bytes were taken by this side's consumer: give credit back, in steps of
        at least half the window (few CREDIT frames)."""
        self.unreturned += n
        if self.unreturned >= WINDOW // 2 and not self.failed:
            given, self.unreturned = self.unreturned, 0
            self.window += given
            self.link.put(_CREDIT_K, self.id, _CREDIT.pack(given))

    def on_credit(self, n: int) -> None:
        self.credit += n
        if self.credit > WINDOW + SLACK:
            raise Broken(f"channel {self.id}: more credit than a window")
        if self._credit_lot:
            self._credit_lot.unpark_all()

    def on_end(self, reset: bool) -> None:
        raise NotImplementedError

    def on_broken(self) -> None:
        self.failed = True
        self._credit_lot.unpark_all()

    async def send(self, data: bytes) -> None:
        """Send ``data`` on the channel within its credit (waiting for more, and for
        room on the link). trio.BrokenResourceError: the channel or its link broke."""
        link = self.link
        while data:
            if self.failed or link.broken:
                raise trio.BrokenResourceError("the relay channel broke")
            if self.credit <= 0:
                await self._credit_lot.park()
                continue
            if link.full:
                await link.room()
                continue
            n = min(len(data), self.credit, MAX_FRAME)
            piece = data if n == len(data) else data[:n]
            data = data[n:] if n < len(data) else b""
            self.credit -= n
            link.put(_DATA, self.id, piece)

    def send_control(self, frame: bytes) -> None:
        """A small frame the peer must get now (a pong, a close's echo), past the window
        by at most ``SLACK``; dropped if even that is used up."""
        if not self.failed and len(frame) <= self.credit + SLACK // 2:
            self.credit -= len(frame)
            self.link.put(_DATA, self.id, frame)

    def end(self, reset: bool) -> None:
        """This side is done with the channel: EOF (if the peer ended its side too, or
        ``reset`` is false) or RESET, and it is forgotten here."""
        if not self.failed:
            self.failed = True
            if reset and not self.ended_by_peer:
                self.link.put(_RESET, self.id)
            elif not self.sent_eof:
                self.sent_eof = True
                self.link.put(_EOF, self.id)
        self._credit_lot.unpark_all()
        self.link.remove(self)


# -- the home's side: a channel is a stream the connection code runs on --------------


class HomeChannel(Channel, trio.abc.HalfCloseableStream):
    """A channel as the home's connection code sees it: the client's side of a TCP
    connection after its upgrade (a ``trio.abc.HalfCloseableStream`` of its bytes),
    on which ``WebSocket`` and the session code run unchanged."""

    __slots__ = ("_chunks", "_closed", "_eof", "_queued", "_readable")

    def __init__(self, link: Link, cid: int) -> None:
        super().__init__(link, cid)
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._eof = False
        self._closed = False
        self._readable = trio.lowlevel.ParkingLot()

    def received(self, data: bytes) -> None:
        if self._closed:
            return
        self._chunks.append(data)
        self._queued += len(data)
        if self._readable:
            self._readable.unpark()

    def on_end(self, reset: bool) -> None:
        self.ended_by_peer = True
        if reset:
            self.failed = True
            self._credit_lot.unpark_all()
        else:
            self._eof = True
        self._readable.unpark_all()

    def on_broken(self) -> None:
        super().on_broken()
        self._readable.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        chunks = self._chunks
        if chunks:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            while not chunks:
                if self._closed:
                    raise trio.ClosedResourceError("the relay channel was closed")
                if self._eof:
                    return b""
                if self.failed:
                    raise trio.BrokenResourceError("the relay channel broke")
                await self._readable.park()
        if self._closed:
            raise trio.ClosedResourceError("the relay channel was closed")
        limit = RECEIVE_SIZE if max_bytes is None else max_bytes
        if self._queued <= limit:
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:
            first = chunks.popleft()
            if len(first) > limit:
                data = first[:limit]
                chunks.appendleft(first[limit:])
            else:
                parts = [first]
                size = len(first)
                while chunks and size + len(chunks[0]) <= limit:
                    size += len(chunks[0])
                    parts.append(chunks.popleft())
                data = b"".join(parts)
        self._queued -= len(data)
        self.consumed(len(data))
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self.sent_eof:
            raise trio.ClosedResourceError("the relay channel was closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        payload = data if isinstance(data, bytes) else bytes(data)
        n = len(payload)
        if n <= self.credit and n <= MAX_FRAME and not self.link.full and not self.failed:
            self.credit -= n
            self.link.put(_DATA, self.id, payload)  # the common case: whole frames at once
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self.send(payload)

    async def wait_send_all_might_not_block(self) -> None:
        while self.credit <= 0 and not self.failed:
            await self._credit_lot.park()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("the relay channel was closed")
        if not self.sent_eof and not self.failed:
            self.sent_eof = True
            self.link.put(_EOF, self.id)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._chunks.clear()
            self.end(reset=not self._eof)
            self._readable.unpark_all()
        await trio.lowlevel.checkpoint()


# -- the front's side: a channel feeds a client connection ----------------------------


class FrontChannel(Channel):
    """A channel as the front sees it: what the home sends is parsed (``ServerFrames``)
    and handed to ``deliver``; the channel's credit is given back once delivered, unless
    ``congested`` says the client is behind (then ``wait_drained`` first)."""

    __slots__ = (
        "_draining",
        "_frames",
        "_held",
        "closed_by_home",
        "deliver",
        "done",
        "nursery",
        "on_done",
    )

    def __init__(
        self,
        link: Link,
        cid: int,
        deliver: Callable[[list[tuple[int, bytes]]], bool],
        nursery: trio.Nursery,
    ) -> None:
        super().__init__(link, cid)
        self.deliver = deliver
        """Hands what the home sent on; True if the client is behind (hold the credit)."""
        self.nursery = nursery
        self._frames = ServerFrames()
        self._held = 0
        self._draining: Callable[[], Awaitable[None]] | None = None
        self.closed_by_home: int | None = None
        """The close code in the home's close frame, once it came."""
        self.done = trio.Event()
        """Set once the home's side has ended (a close, EOF, RESET, or the link broke)."""
        self.on_done: Callable[[], None] | None = None

    def received(self, data: bytes) -> None:
        if self.done.is_set():
            return
        try:
            items = self._frames.feed(data)
            behind = self.deliver(items) if items else False
        except (BadFrame, UnicodeDecodeError) as exc:
            log.warning("relay: node %s sent a bad frame (%s); relay cut", self.link.peer, exc)
            self.finished()
            self.end(reset=True)
            return
        if behind and self._draining is not None:
            self._held += len(data)
            if self._held == len(data):
                self.nursery.start_soon(self._drain)
        elif self._held:
            self._held += len(data)
        else:
            self.consumed(len(data))

    def waits_on(self, drained: Callable[[], Awaitable[None]]) -> None:
        self._draining = drained

    async def _drain(self) -> None:
        assert self._draining is not None
        await self._draining()
        held, self._held = self._held, 0
        if held:
            self.consumed(held)

    def on_end(self, reset: bool) -> None:
        self.ended_by_peer = True
        self.finished()
        if reset:
            self.failed = True
            self._credit_lot.unpark_all()
        self.end(reset=False)

    def on_broken(self) -> None:
        super().on_broken()
        self.finished()

    def finished(self) -> None:
        if not self.done.is_set():
            self.done.set()
            if self.on_done is not None:
                self.on_done()


# -- the front's pool ---------------------------------------------------------------


class Refused(Exception):
    """The home refused the peer connection (or could not be reached): say why."""

    def __init__(self, message: str, level: int = logging.WARNING) -> None:
        super().__init__(message)
        self.level = level


@attrs.define(eq=False)
class Pool:
    """A front's peer connections, by home node: dialled on first need, at most
    ``MAX_LINKS_PER_HOME`` each, kept while in use (closed once idle)."""

    node_id: str
    keys: RelayKeys = attrs.field(repr=False)
    connect_timeout_s: float
    write_timeout_s: float
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    nursery: trio.Nursery | None = None
    """Where the links run (the placement's, for as long as the node is joined)."""
    links: dict[tuple[str, str], list[Link]] = attrs.field(factory=dict)
    _dialling: dict[tuple[str, str], trio.Lock] = attrs.field(factory=dict)
    dialled: int = 0
    """Peer connections opened so far (tests, metrics)."""

    def _usable(self, key: tuple[str, str]) -> Link | None:
        best: Link | None = None
        for link in self.links.get(key, ()):
            if not link.closing and len(link.channels) < MAX_CHANNELS:
                if best is None or len(link.channels) < len(best.channels):
                    best = link
        return best

    async def link_to(self, home: str, url: str) -> Link:
        """A peer connection to ``home`` at ``url`` that can take a channel. Refused: it
        could not be had (unreachable, refused, did not prove it holds the secret, or
        ``MAX_LINKS_PER_HOME`` full ones)."""
        key = (home, url)
        link = self._usable(key)
        if link is not None:
            return link
        lock = self._dialling.setdefault(key, trio.Lock())
        async with lock:
            link = self._usable(key)
            if link is not None:
                return link
            live = [link for link in self.links.get(key, ()) if not link.closing]
            if len(live) >= MAX_LINKS_PER_HOME:
                raise Refused(f"{MAX_LINKS_PER_HOME} peer connections to it are full")
            link = await self._dial(home, url)
            self.links.setdefault(key, []).append(link)
            self.dialled += 1
            return link

    async def _dial(self, home: str, url: str) -> Link:
        if self.nursery is None:
            raise Refused("the node is leaving the cluster")
        parts = urlsplit(url)
        tls = parts.scheme == "wss"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        signed = sign_pool(self.keys, self.node_id, home, time.time())
        key = base64.b64encode(secrets.token_bytes(16)).decode("ascii")
        request = (
            f"GET {RELAY_PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"{HEADER}: {signed.header}\r\nUser-Agent: trio-duplex-relay\r\n\r\n"
        ).encode("ascii")
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(host, port)
                if tls:
                    context = self.ssl_context or ssl.create_default_context()
                    stream = trio.SSLStream(stream, context, server_hostname=host)
                    await stream.do_handshake()
                await stream.send_all(request)
                status, headers, early = await _read_response(stream)
            if status == 403:
                raise Refused(
                    "refused (403): do the nodes share --cluster-secret, and agree on the "
                    "time within 60s?",
                    logging.ERROR,
                )
            if status != 101:
                raise Refused(f"refused: HTTP {status}")
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            proofs = headers.get(PROOF_HEADER.lower(), [])
            if len(proofs) != 1 or not signed.proven(proofs[0]):
                raise Refused(
                    "refused: it did not prove it holds --cluster-secret; nothing was sent "
                    "to it (a forged directory entry, or a node of another cluster)",
                    logging.ERROR,
                )
            if headers.get("sec-websocket-accept") != [accept]:
                raise Refused("refused: not a WebSocket upgrade")
        except BaseException as exc:
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(stream)
            if isinstance(exc, Refused):
                raise
            if isinstance(exc, (OSError, trio.TooSlowError, trio.BrokenResourceError)):
                why = str(exc) or str(exc.__cause__ or "") or type(exc).__name__
                raise Refused(f"failed: {why}") from None
            raise
        link = Link(stream, home, self.write_timeout_s, front=True)
        self.nursery.start_soon(self._run, link, (home, url), early)
        return link

    async def _run(self, link: Link, key: tuple[str, str], early: bytes) -> None:
        try:
            await link.run(early)
        finally:
            links = self.links.get(key)
            if links is not None and link in links:
                links.remove(link)
                if not links:
                    del self.links[key]

    def close(self) -> None:
        for links in self.links.values():
            for link in links:
                link.cut()


async def _read_response(stream: trio.abc.Stream) -> tuple[int, dict[str, list[str]], bytes]:
    """The status and headers (names in lower case) of an HTTP response head, bounded,
    and the bytes that came after it. Refused: not one."""
    received = bytearray()
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > _MAX_HEAD_BYTES:
            raise Refused("refused: an answer head too large")
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise Refused("failed: the connection closed during the upgrade")
        received += data
    head = bytes(received[:end]).decode("latin-1")
    lines = head.split("\r\n")
    status_line = lines[0].split(" ", 2)
    if (
        len(status_line) < 2
        or not status_line[0].startswith("HTTP/1.")
        or not (status_line[1].isascii() and status_line[1].isdigit() and len(status_line[1]) == 3)
    ):
        raise Refused("refused: not an HTTP answer")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise Refused("refused: a malformed answer header")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(status_line[1]), headers, bytes(received[end + 4 :])


# -- the relay itself, on the front -------------------------------------------------

_UNSENDABLE = frozenset({1005, 1006, 1015})


async def relay(
    pool: Pool,
    conn: Connection,
    first: str,
    *,
    home: str,
    url: str,
    session_id: str,
    dialect: str = "native",
) -> bool:
    """Relay ``conn``, whose first message ``first`` is a ``session.resume`` (native
    JSON, whatever its client speaks: ``dialect``, named to the home), to the home
    ``home`` advertised at ``url``, over a pooled peer connection, until either side
    ends. False: nothing was delivered to the client (the home could not be reached,
    refused, did not prove it holds the secret, or its channel ended before it said
    anything): the caller answers ``unreachable``. Otherwise ``conn`` is finished with
    the home's close code, or 1001 if the home's side broke (the client resumes again)."""
    try:
        link = await pool.link_to(home, url)
    except Refused as exc:
        log.log(exc.level, "relay to node %s at %s %s", home, url, exc)
        return False
    delivered = False
    ws = conn.ws

    def deliver(items: list[tuple[int, bytes]]) -> bool:
        nonlocal delivered
        several = len(items) > 1
        for opcode, payload in items:
            if opcode == Opcode.TEXT:
                delivered = True
                conn.push(payload.decode(), coalesce=several)
            elif opcode == Opcode.BINARY:
                delivered = True
                conn.push(payload, coalesce=several)
            elif opcode == Opcode.PING:
                channel.send_control(client_frame(Opcode.PONG, payload))
            elif opcode == Opcode.CLOSE:
                code: int = CloseCode.NORMAL
                if len(payload) >= 2:
                    code = int.from_bytes(payload[:2], "big")
                    if code in _UNSENDABLE:
                        code = CloseCode.NORMAL
                delivered = True
                channel.closed_by_home = code
                channel.send_control(client_frame(Opcode.CLOSE, payload[:2]))
                channel.finished()
                return False
        return conn.congested and conn.close_code is None

    async def drained() -> None:
        while conn.congested and conn.close_code is None:
            await conn.wait_drained()

    cid = link.new_channel_id()
    client_code: int | None = None
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                channel = FrontChannel(link, cid, deliver, nursery)
                channel.waits_on(drained)
                channel.on_done = scope.cancel
                link.add(channel)
                link.put(_OPEN, cid, f"{session_id} {dialect}".encode("ascii"))
                try:
                    await channel.send(message_frame(first))
                    get = ws.get_message
                    while True:
                        message = await get()
                        await channel.send(message_frame(message))
                except ClientGone as exc:
                    client_code = exc.code
                except trio.BrokenResourceError:
                    pass  # the home's side broke: below
                nursery.cancel_scope.cancel()
        if client_code is not None:
            # The client is gone: its close (or 1000) to the home, which detaches.
            code = client_code if 1000 <= client_code < 5000 else CloseCode.NORMAL
            if code in _UNSENDABLE:
                code = CloseCode.NORMAL
            channel.send_control(client_frame(Opcode.CLOSE, code.to_bytes(2, "big")))
            channel.end(reset=False)
            conn.finish([], CloseCode.GOING_AWAY)  # (its WebSocket is closed already)
            return True
    finally:
        channel.end(reset=channel.closed_by_home is None)
    if channel.closed_by_home is not None:
        conn.finish([], channel.closed_by_home)
        return True
    if not delivered:
        return False
    conn.finish([], CloseCode.GOING_AWAY)
    return True


# -- the home's side of the pool ----------------------------------------------------

Serve = Callable[[WebSocket, dict[str, list[str]], Grant, Dialect, "str | None"], Awaitable[None]]


@attrs.define(eq=False)
class Home:
    """The home's side: peer connections the door took (``accept``), each channel on
    them served as a relayed connection by the session code (``serve``)."""

    serve: Serve
    first_message_bytes: int
    write_timeout_s: float
    links: set[Link] = attrs.field(factory=set)

    async def accept(self, stream: trio.abc.Stream, peer: str) -> None:
        """Serve the peer connection from node ``peer`` (past its upgrade) until it ends,
        and every channel's connection with it."""
        link = Link(stream, peer, self.write_timeout_s, front=False)
        self.links.add(link)
        try:
            async with trio.open_nursery() as nursery:

                def opened(link: Link, cid: int, session_id: str, name: str) -> None:
                    try:
                        dialect = by_name(name)
                    except KeyError:
                        link.put(_RESET, cid)
                        return
                    if not relayable(session_id):
                        link.put(_RESET, cid)
                        return
                    channel = HomeChannel(link, cid)
                    link.add(channel)
                    nursery.start_soon(self._serve_channel, channel, session_id, dialect)

                link.on_open = opened
                await link.run()
        finally:
            self.links.discard(link)

    async def _serve_channel(self, channel: HomeChannel, session_id: str, dialect: Dialect) -> None:
        ws = WebSocket(channel, self.first_message_bytes, self.write_timeout_s)
        try:
            grant = Grant(None, resume_of=session_id, relayed=True)
            await self.serve(ws, {}, grant, dialect, None)
        except* (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except* Exception as group:
            log.error("relayed connection failed: %r", group.exceptions[0], exc_info=group)
        finally:
            with trio.CancelScope(shield=True):
                await channel.aclose()


__all__ = [
    "IDLE_S",
    "MAX_CHANNELS",
    "MAX_FRAME",
    "OUT_LIMIT",
    "PEER_TIMEOUT_S",
    "PING_INTERVAL_S",
    "WINDOW",
    "FrontChannel",
    "Home",
    "HomeChannel",
    "Kind",
    "Link",
    "Pool",
    "PoolGrant",
    "Refused",
    "ServerFrames",
    "client_frame",
    "message_frame",
    "pool_grant",
    "relay",
]
