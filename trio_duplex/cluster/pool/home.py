"""The home's side of the pool: the peer connections the door took (``Home``), and a
channel as the home's connection code sees it (``HomeChannel``, a stream)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

import attrs
import trio

from ...core.opening import Grant
from ...dialects import Dialect, by_name
from ...server.sessions.websocket import RECEIVE_SIZE, WebSocket
from ...server.sessions.websocket import ConnectionClosed as ClientGone
from ..relay import (
    relayable,
)
from .channel import Channel
from .framing import K_DATA, K_EOF, K_RESET, MAX_FRAME
from .link import Link

log = logging.getLogger("trio_duplex")

_POOL_SESSION = "\x00pool"
"""The session a pool grant "resumes" if it ever reached the session code: none can."""


@attrs.frozen(repr=False)
class PoolGrant(Grant):
    """An upgrade that is a pooled peer connection from ``peer`` (placement.py takes it
    aside before the session code; were it ever to reach that code, it may only resume
    a session that cannot exist)."""

    peer: str = ""


def pool_grant(peer: str) -> PoolGrant:
    return PoolGrant(None, resume_of=_POOL_SESSION, relayed=True, peer=peer)


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
            self.link.put(K_DATA, self.id, payload)  # the common case: whole frames at once
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
            self.link.put(K_EOF, self.id)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._chunks.clear()
            self.end(reset=not self._eof)
            self._readable.unpark_all()
        await trio.lowlevel.checkpoint()


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
                        link.put(K_RESET, cid)
                        return
                    if not relayable(session_id):
                        link.put(K_RESET, cid)
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
