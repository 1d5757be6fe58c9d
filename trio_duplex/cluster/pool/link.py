"""One peer connection, either side (``Link``): its writer, its reader (frames
dispatched to channels), its keepalive, and its channels."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from .framing import (
    CREDIT_BODY,
    HEAD,
    HEAD_SIZE,
    K_CREDIT,
    K_DATA,
    K_EOF,
    K_OPEN,
    K_PING,
    K_PONG,
    K_RESET,
    MAX_CHANNELS,
    MAX_FRAME,
    MAX_OPEN,
    OUT_LIMIT,
    PING_BODY,
    Broken,
)

if TYPE_CHECKING:
    from .channel import Channel

log = logging.getLogger("trio_duplex")

IDLE_S = 30.0
"""A peer connection with no channel for this long is closed (by the front)."""
PING_INTERVAL_S = 5.0
"""A side that heard nothing for this long pings."""
PEER_TIMEOUT_S = 15.0
"""A peer connection on which nothing was heard for this long is cut."""
READ_SIZE = 256 * 1024


class _Closed(Exception):
    """The peer closed an idle peer connection: nothing to say."""


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
    _deferred: list[Channel] = attrs.field(factory=list)
    """Channels to flush once the frames of the read being dispatched are all handled."""

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
            frame = HEAD.pack(kind, channel, len(payload)) + payload
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
            out += HEAD.pack(kind, channel, len(payload))
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

    def defer(self, channel: Channel) -> None:
        """Call ``channel.flush()`` once every frame of the read now dispatched is handled
        (the front passes all that one read brought for a client on in one write)."""
        self._deferred.append(channel)

    def _dispatch(self, buf: bytes) -> int:
        """Handle every whole frame in ``buf``, then flush the channels that deferred;
        returns where the rest begins."""
        pos = self._frames(buf)
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for channel in deferred:
                channel.flush()
        return pos

    def _frames(self, buf: bytes) -> int:
        n = len(buf)
        pos = 0
        unpack = HEAD.unpack_from
        channels = self.channels
        while n - pos >= HEAD_SIZE:
            kind, cid, length = unpack(buf, pos)
            if length > MAX_FRAME:
                raise Broken(f"a frame of {length} bytes")
            start = pos + HEAD_SIZE
            end = start + length
            if end > n:
                break
            pos = end
            if kind == K_DATA:
                channel = channels.get(cid)
                if channel is not None:  # (else one that ended here: dropped)
                    channel.on_data(buf[start:end])
            elif kind == K_CREDIT:
                channel = channels.get(cid)
                if length != 4:
                    raise Broken("a credit frame of another length")
                if channel is not None:
                    channel.on_credit(CREDIT_BODY.unpack_from(buf, start)[0])
            elif kind == K_EOF or kind == K_RESET:
                channel = channels.get(cid)
                if channel is not None:
                    channel.on_end(kind == K_RESET)
            elif kind == K_OPEN:
                self._opened(cid, buf[start:end])
            elif kind == K_PING:
                if length != PING_BODY.size:  # (so a peer's pings cannot grow our queue)
                    raise Broken("a ping of another length")
                self.put(K_PONG, 0, buf[start:end])
            elif kind == K_PONG:
                pass  # (heard: that is all a pong says)
            else:
                raise Broken(f"an unknown frame kind {kind}")
        return pos

    def _opened(self, cid: int, payload: bytes) -> None:
        if self.front or self.on_open is None:
            raise Broken("a channel opened by the home")
        if cid <= self._last_opened or len(payload) > MAX_OPEN:
            raise Broken("a channel id not above the last, or a long OPEN")
        self._last_opened = cid
        try:
            session_id, dialect = payload.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise Broken("an OPEN that is not SESSION DIALECT") from None
        if len(self.channels) >= MAX_CHANNELS:
            self.put(K_RESET, cid)
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
                self.put(K_PING, 0, PING_BODY.pack(sequence))
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
