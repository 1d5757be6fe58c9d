"""A channel, either side: one relayed client connection on a peer connection, with
the credit it may send on, the window it has given, and its end."""

from __future__ import annotations

from typing import Protocol

import trio

from .framing import CREDIT_BODY, K_CREDIT, K_DATA, K_EOF, K_RESET, MAX_FRAME, SLACK, WINDOW, Broken


class Carrier(Protocol):
    """What a channel needs of the peer connection it rides on (a `.link.Link`):
    named here so that the link may import channels and not the other way round."""

    @property
    def peer(self) -> str:
        """The node at the other end (for logs)."""

    @property
    def broken(self) -> bool: ...

    @property
    def full(self) -> bool: ...

    def put(self, kind: int, channel: int, payload: bytes = b"") -> None: ...

    async def room(self) -> None: ...

    def remove(self, channel: Channel) -> None: ...

    def defer(self, channel: Channel) -> None: ...


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

    def __init__(self, link: Carrier, cid: int) -> None:
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

    def flush(self) -> None:
        """Called by the link after the read that called ``link.defer(self)``."""

    def consumed(self, n: int) -> None:
        """``n`` bytes were taken by this side's consumer: give credit back, in steps of
        at least half the window (few CREDIT frames)."""
        self.unreturned += n
        if self.unreturned >= WINDOW // 2 and not self.failed:
            given, self.unreturned = self.unreturned, 0
            self.window += given
            self.link.put(K_CREDIT, self.id, CREDIT_BODY.pack(given))

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
            link.put(K_DATA, self.id, piece)

    def send_control(self, frame: bytes) -> None:
        """A small frame the peer must get now (a pong, a close's echo), past the window
        by at most ``SLACK``; dropped if even that is used up."""
        if not self.failed and len(frame) <= self.credit + SLACK // 2:
            self.credit -= len(frame)
            self.link.put(K_DATA, self.id, frame)

    def end(self, reset: bool) -> None:
        """This side is done with the channel: EOF (if the peer ended its side too, or
        ``reset`` is false) or RESET, and it is forgotten here."""
        if not self.failed:
            self.failed = True
            if reset and not self.ended_by_peer:
                self.link.put(K_RESET, self.id)
            elif not self.sent_eof:
                self.sent_eof = True
                self.link.put(K_EOF, self.id)
        self._credit_lot.unpark_all()
        self.link.remove(self)
