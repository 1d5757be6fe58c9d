"""One WebSocket connection: its outbox, the pump that drains it, and its keepalive.

Everything the server says to a client goes through ``Connection.push``, which never
awaits, so the session core can answer from synchronous code. When nothing is queued
and no write is in progress, push writes the frame at once with a non-blocking write on
the socket (no task switch; nothing to cancel half-way). Otherwise the frame joins the
outbox, and a single pump task (started with the connection's first queued frame) sends
the outbox in order, in batched writes. A send that fails or is cancelled ends the
connection (half a frame may have been written): the pump raises and the connection's
nursery is cancelled.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import attrs
import trio

from .timers import Timers
from .websocket import ConnectionClosed, WebSocket

log = logging.getLogger("trio_duplex")

BATCH = 64


@attrs.define(eq=False)
class Connection:
    ws: WebSocket
    high_water: int
    generation: int = 0
    """The attachment generation this connection holds (0: none)."""
    close_code: int | None = None
    """Set once the connection must close after its outbox is sent."""
    scope: trio.CancelScope | None = None
    nursery: trio.Nursery | None = None
    """The connection's nursery while it is open: the pump runs in it."""
    outbox: deque[str] = attrs.field(factory=deque)
    _pumping: bool = False
    _wake: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _drained: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def push(self, frame: str, *, coalesce: bool = False) -> None:
        """Send ``frame`` after those pushed before.

        Nothing queued, the socket free and no ``coalesce``: it is written now, from the
        caller's task, with no task switch. Otherwise (or for the tail of a frame the
        socket took only part of) the pump sends it, with whatever else queued up by
        then, in one write. ``coalesce`` says more frames follow at once.
        """
        if self.close_code is None:
            ws = self.ws
            if coalesce or self.outbox or not ws.send_now(frame) or ws.broken:
                # (On a broken socket the pump's first write raises and ends the
                # connection, even if its reader has not noticed yet.)
                self.outbox.append(frame)
            elif not ws.unsent:
                return
            if self._wake:
                self._wake.unpark()
            else:
                self.start_pump()

    def finish(self, frames: list[str], close_code: int, *, flush: bool = True) -> None:
        """Send ``frames`` after (or, without ``flush``, instead of) what is queued, then
        close with ``close_code``. The first call decides."""
        if self.close_code is not None:
            return
        if not flush:
            self.outbox.clear()
        self.outbox.extend(frames)
        self.close_code = close_code
        self._wake.unpark_all()
        self._drained.unpark_all()
        self.start_pump()

    def start_pump(self) -> None:
        """Start the pump, unless it runs or the connection's nursery is gone.

        It starts with the first frame, not with the connection: a connection that has
        said nothing since its handshake (an idle session) holds no pump task."""
        nursery = self.nursery
        if nursery is not None and not self._pumping:
            self._pumping = True
            nursery.start_soon(self._pump_then_end, nursery.cancel_scope)

    async def _pump_then_end(self, connection_scope: trio.CancelScope) -> None:
        try:
            await self.pump()
        finally:
            connection_scope.cancel()  # however the pump ends, so does the connection

    def abort_after(self, seconds: float) -> None:
        """Give the pump ``seconds`` to finish, then cut the connection regardless."""
        if self.scope is not None:
            self.scope.deadline = min(self.scope.deadline, trio.current_time() + seconds)

    @property
    def congested(self) -> bool:
        return len(self.outbox) > self.high_water

    async def wait_drained(self) -> None:
        await self._drained.park()

    def release_waiters(self) -> None:
        self._drained.unpark_all()

    async def pump(self) -> None:
        """Send the outbox in order; return once closing and empty.

        Frames that queued up while the previous write was in flight go out together in
        one write: under load this saves a syscall and a lock round per frame.
        """
        outbox, ws = self.outbox, self.ws
        low_water = self.high_water // 2
        while True:
            if outbox:
                if len(outbox) == 1:
                    await ws.send_message(outbox.popleft())
                else:
                    count = min(len(outbox), BATCH)
                    await ws.send_many([outbox.popleft() for _ in range(count)])
                if self._drained and len(outbox) <= low_water:
                    self._drained.unpark_all()
            elif ws.unsent:
                await ws.flush()
            elif self.close_code is not None:
                return
            else:
                await self._wake.park()


@attrs.define(eq=False)
class Keepalive:
    """Pings one connection every ``interval``; no pong within ``patience`` ends it.

    Driven by the server's timer heap: between pings it holds no task, and each ping
    runs in a short task of ``nursery`` that lives until its pong.
    """

    conn: Connection
    timers: Timers
    nursery: trio.Nursery
    interval: float
    patience: float
    due: float = math.inf
    next_ping: float = math.inf

    def start(self) -> None:
        self.next_ping = trio.current_time() + self.interval
        self.timers.schedule(self)

    def next_deadline(self) -> float:
        return self.next_ping

    def fire(self, now: float) -> None:
        self.next_ping = math.inf  # the next one is set when the pong arrives
        self.nursery.start_soon(self._ping)

    async def _ping(self) -> None:
        with trio.move_on_after(self.patience):
            try:
                await self.conn.ws.ping()
            except ConnectionClosed:
                if self.conn.ws.broken and self.conn.scope is not None:
                    self.conn.scope.cancel()  # lost: the session detaches now
                return
            self.start()
            return
        log.info("connection %s: no pong within %ss", self.conn.ws, self.patience)
        if self.conn.scope is not None:
            self.conn.scope.cancel()  # the connection is lost: its session detaches
