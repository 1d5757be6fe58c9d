"""The front's side of a relayed connection: a channel that feeds a client connection
(``FrontChannel``) and the relay itself (``relay``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

from ...core.frames import CloseCode, Opcode
from ...server.sessions.connection import Connection
from ...server.sessions.websocket import ConnectionClosed as ClientGone
from ...server.sessions.websocket import WebSocket
from ..relay import relay as per_resume_relay
from ..relay import sign
from .channel import Channel
from .framing import K_OPEN
from .link import Link
from .peers import OldHome, Pool, Refused
from .ws_frames import BadFrame, ServerFrames, client_frame, message_frame, message_frames

log = logging.getLogger("trio_duplex")

# -- the front's side: a channel feeds a client connection ----------------------------


class FrontChannel(Channel):
    """A channel as the front sees it: what the home sends is checked, not decoded
    (``ServerFrames.scan``), and handed to ``deliver``: the whole message frames as they
    came (to pass on to the client verbatim), how many, and the control frames among
    them. The channel's credit is given back once delivered, unless ``deliver`` says
    the client is behind (then ``wait_drained`` first)."""

    __slots__ = (
        "_controls",
        "_count",
        "_draining",
        "_frames",
        "_held",
        "_pending",
        "_pending_bytes",
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
        deliver: Callable[[bytes, int, list[tuple[int, bytes]]], bool],
        nursery: trio.Nursery,
    ) -> None:
        super().__init__(link, cid)
        self.deliver = deliver
        """Hands what the home sent on; True if the client is behind (hold the credit)."""
        self.nursery = nursery
        self._frames = ServerFrames()
        self._held = 0
        # What the read the link is dispatching brought, for ``flush``:
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._count = 0
        self._controls: list[tuple[int, bytes]] = []
        self._draining: Callable[[], Awaitable[None]] | None = None
        self.closed_by_home: int | None = None
        """The close code in the home's close frame, once it came."""
        self.done = trio.Event()
        """Set once the home's side has ended (a close, EOF, RESET, or the link broke)."""
        self.on_done: Callable[[], None] | None = None

    def received(self, data: bytes) -> None:
        """Checked now; handed on once the link has handled the whole read (``flush``):
        the frames of all its DATA for this channel in one write to the client."""
        if self.done.is_set():
            return
        try:
            frames, count, controls = self._frames.scan(data)
        except BadFrame as exc:
            log.warning("relay: node %s sent a bad frame (%s); relay cut", self.link.peer, exc)
            self._pending.clear()  # (nothing of the read that brought it)
            self.finished()
            self.end(reset=True)
            return
        if not self._pending_bytes:
            self.link.defer(self)
        self._pending_bytes += len(data)
        if count:
            self._pending.append(frames)
            self._count += count
        if controls:
            self._controls += controls

    def flush(self) -> None:
        size, self._pending_bytes = self._pending_bytes, 0
        if self.done.is_set() or not size:
            return
        pending, count, controls = self._pending, self._count, self._controls
        self._count = 0
        if count or controls:
            self._pending, self._controls = [], []
            frames = pending[0] if len(pending) == 1 else b"".join(pending)
            behind = self.deliver(frames, count, controls)
        else:
            behind = False
        if behind and self._draining is not None:
            self._held += size
            if self._held == size:
                self.nursery.start_soon(self._drain)
        elif self._held:
            self._held += size
        else:
            self.consumed(size)

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
        if self._pending_bytes:
            # What came before the end in the same read (the home's close frame, as a
            # rule) is handed on first: once done, the link's deferred flush drops it.
            self.flush()
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
    the home's close code, or 1001 if the home's side broke (the client resumes again).

    A home of a release before the pool (``OldHome``: it refused the pooled upgrade as
    one does) is relayed to per resume instead (relay.py's ``relay``, whose request and
    proof are the resume's own), so that a rolling deploy relays throughout."""
    try:
        link = await pool.link_to(home, url)
    except OldHome as exc:
        log.log(exc.level, "relay to node %s at %s %s", home, url, exc)
        signed = sign(pool.keys, pool.node_id, home, session_id, time.time())
        return await per_resume_relay(
            conn,
            first,
            home=home,
            url=url,
            signed=signed,
            connect_timeout_s=pool.connect_timeout_s,
            write_timeout_s=pool.write_timeout_s,
            ssl_context=pool.ssl_context,
            dialect=dialect,
        )
    except Refused as exc:
        log.log(exc.level, "relay to node %s at %s %s", home, url, exc)
        return False
    delivered = False
    ws = conn.ws

    def deliver(frames: bytes, count: int, controls: list[tuple[int, bytes]]) -> bool:
        # The home's frames go to the client as they came (checked by the scan, never
        # decoded and encoded again): a server's frames either way.
        nonlocal delivered
        if count:
            delivered = True
            conn.push_frames(frames, count)
        for opcode, payload in controls:
            if opcode == Opcode.PING:
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
                link.put(K_OPEN, cid, f"{session_id} {dialect}".encode("ascii"))
                try:
                    await channel.send(message_frame(first))
                    # What the client sent after its resume in the read that brought
                    # it (parsed already, or part of a frame or message held) goes as
                    # messages, encoded again; once the parser holds nothing, the
                    # client's frames go as they came (checked, not decoded: the
                    # home's WebSocket decodes them). What one read brought, as one
                    # write to the home, either way. (A transport that has no
                    # frames of its own, as a call will not, goes as messages.)
                    get = ws.get_messages
                    if isinstance(ws, WebSocket):
                        while not ws.parsed_all:
                            await channel.send(message_frames(await get()))
                        get_frames = ws.get_frames
                        while True:
                            frames, _ = await get_frames()
                            await channel.send(frames)
                    while True:
                        await channel.send(message_frames(await get()))
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
