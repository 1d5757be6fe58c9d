"""One WebSocket connection: its outbox, the pump that drains it, and its keepalive.

Everything the server says to a client goes through ``Connection.push``, a plain deque
append, so the session core can answer from synchronous code and a single pump task
writes to the socket in order. A send that fails or is cancelled ends the connection
(trio-websocket may have written half a frame): the pump raises and the connection's
nursery is cancelled.
"""

from __future__ import annotations

import logging
from collections import deque

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

log = logging.getLogger("trio_duplex")


@attrs.define(eq=False)
class Connection:
    ws: WebSocketConnection
    high_water: int
    generation: int = 0
    """The attachment generation this connection holds (0: none)."""
    close_code: int | None = None
    """Set once the connection must close after its outbox is sent."""
    scope: trio.CancelScope | None = None
    outbox: deque[str] = attrs.field(factory=deque)
    _wake: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _drained: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def push(self, frame: str) -> None:
        if self.close_code is None:
            self.outbox.append(frame)
            if self._wake:
                self._wake.unpark()

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
        """Send the outbox in order; return once closing and empty."""
        outbox, send = self.outbox, self.ws.send_message
        low_water = self.high_water // 2
        while True:
            if outbox:
                await send(outbox.popleft())
                if self._drained and len(outbox) <= low_water:
                    self._drained.unpark_all()
            elif self.close_code is not None:
                return
            else:
                await self._wake.park()

    async def keepalive(self, interval: float, patience: float) -> None:
        """Ping every ``interval``; return (connection lost) if a pong takes ``patience``."""
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(patience):
                try:
                    await self.ws.ping()
                except ConnectionClosed:
                    return
                continue
            log.info("connection %s: no pong within %ss", self.ws, patience)
            return
