"""One WebSocket connection: its lifetime, its outbox, the pump that drains it, and its
keepalive.

``Connection.open`` is the connection's whole life in one ``async with``: the block's
body is the reader (the task that opened it), and the connection's nursery holds its
other tasks: the pump (started by the first frame that has to wait) and a ping waiting
for its pong. Leaving the block cancels them, stops the keepalive, and closes the
WebSocket with a bounded close.

Everything the server says to a client goes through ``push`` or ``finish``, which never
await, so the session core can answer from synchronous code. When nothing is queued and
no write is in progress, ``push`` writes the frame at once (``WebSocket.write_now``: no
task switch, nothing to cancel half-way). Otherwise the frame joins the outbox, and the
pump sends the outbox in order, in batched writes. A send that fails or is cancelled
ends the connection (half a frame may have been written): the pump's end cancels the
connection.

The outbox is bounded in bytes (``max_output_bytes``, counted as the frames' length in
characters, which is their UTF-8 length for ASCII): an engine's ``send`` waits once it
holds half of that (``congested``), and a connection whose outbox goes past it anyway
(the server's own answers to a client that sends but does not read: errors, heartbeat
acks) is cut with 4003 at once; its session detaches, and what the engine sent since is
in the journal for a resume. With the WebSocket's write timeout, nothing waits for ever
on a peer that does not read.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Protocol

import attrs
import trio

from ...core.frames import BATCH, CloseCode, Encoded
from ...dialects import NATIVE, Dialect
from .timers import Entry, Timers
from .transport import MessageTransport
from .websocket import ConnectionClosed

log = logging.getLogger("trio_duplex")


class FinishWatcher(Protocol):
    def terminal_queued(self, conn: Connection, frames: list[str | bytes]) -> None: ...


class WriteSampler(Protocol):
    def observe(self, seconds: float) -> None: ...


@attrs.define(eq=False)
class Connection:
    ws: MessageTransport
    """Its transport: a WebSocket, or a WebRTC call's channel (transport.py)."""
    high_water: int
    """Frames queued before an engine's ``send`` waits (see ``congested``)."""
    max_output_bytes: float = math.inf
    """The outbox's bound in bytes: past it the connection is cut."""
    generation: int = 0
    """The attachment generation this connection holds (0: none)."""
    close_code: int | None = None
    """Set once the connection must close after its outbox is sent."""
    outbox: deque[str | bytes] | tuple[()] = ()
    """The frames waiting for the pump: a deque once the first one waits (an empty
    deque is 760 bytes, and a connection that never has to wait, an idle one, needs
    none)."""
    queued: int = 0
    """The outbox's size: the sum of its frames' lengths."""
    bundled: int = 0
    """Frames in the outbox beyond one per item (``push_frames``'s, several to an
    item): what ``len(outbox)`` leaves out of the count ``high_water`` bounds."""
    watchers: Sequence[FinishWatcher] = ()
    """Told of every ``finish`` (the server's observers)."""
    dialect: Dialect = NATIVE
    """How its messages are spelled: what decodes them (``decode``/``decode_large``)."""
    _nursery: trio.Nursery | None = None
    """Open while the connection is: the pump and pings run in it."""
    _pumping: bool = False
    _wake: trio.lowlevel.ParkingLot | None = None
    """Where the pump waits for frames (made by the pump: until then, None)."""
    _drained: trio.lowlevel.ParkingLot | None = None
    """Where engines wait for a congested outbox (made by the first to wait)."""
    _keepalive: Keepalive | None = None
    _written: int = 0
    """Frames the pump has taken from the outbox to write (direct writes not counted)."""
    _sample: tuple[int, float, WriteSampler] | None = None
    """A sampled frame's place (``_written`` once it is out), send time, and sampler."""

    @classmethod
    def open(
        cls,
        ws: MessageTransport,
        high_water: int,
        *,
        close_timeout: float,
        max_output_bytes: float = math.inf,
        watchers: Sequence[FinishWatcher] = (),
        dialect: Dialect = NATIVE,
    ) -> Lifetime:
        """The connection's lifetime, an ``async with`` whose block is given the
        connection. The body reads; once it has nothing more to read for, it ends with
        ``await conn.send_rest()``. On the way out the pump and any ping are cancelled
        and the WebSocket is closed within ``close_timeout``: with ``close_code`` if one
        was set, 1011 after an error of ours, else 1001."""
        conn = cls(ws, high_water, max_output_bytes, watchers=watchers, dialect=dialect)
        return Lifetime(conn, close_timeout)

    def watch_opening(self, gone: Callable[[], None]) -> None:
        """While a session opens on this connection, keep reading it (``WebSocket.watch``)
        and call ``gone`` as soon as the peer's end (close frame, FIN, reset) arrives.
        ``ws.stop_watching()`` ends it."""
        if self._nursery is not None:
            self.ws.start_watching()
            self._nursery.start_soon(self.ws.watch, gone)

    def start_keepalive(self, timers: Timers, interval: float, patience: float) -> None:
        """Ping every ``interval``; no pong within ``patience`` ends the connection."""
        assert self._keepalive is None
        self._keepalive = Keepalive(self, timers, interval, patience)
        self._keepalive.start()

    def push(self, frame: str | bytes, *, coalesce: bool = False) -> None:
        """Send ``frame`` (a text message, or binary for ``bytes``) after those pushed
        before.

        Nothing queued, the socket free and no ``coalesce``: it is written now, from the
        caller's task, with no task switch. Otherwise (or for the tail of a frame the
        socket took only part of) the pump sends it, with whatever else queued up by
        then, in one write. ``coalesce`` says more frames follow at once.
        """
        if self.close_code is not None:
            return
        ws = self.ws
        if coalesce or self.outbox or not ws.can_write_now():
            self._open_outbox().append(frame)
            if not self._count(len(frame)):
                return
        else:
            ws.write_now(frame)
            if not ws.unsent and not ws.broken:
                return
            # A tail to finish, or a broken socket: the pump's write finishes the frame,
            # or raises and ends the connection even if its reader has not noticed yet.
        self._to_pump()

    def push_many(self, frames: list[str | bytes], *, coalesce: bool = False) -> None:
        """``push`` each of ``frames``, in order: with nothing queued, the socket free
        and no ``coalesce``, all of them in one write from the caller's task; otherwise
        to the outbox, for the pump (the bound as ``push``'s)."""
        if self.close_code is not None:
            return
        ws = self.ws
        if coalesce or self.outbox or not ws.can_write_now():
            self._open_outbox().extend(frames)
            if not self._count(sum(map(len, frames))):
                return
        else:
            ws.write_many_now(frames)
            if not ws.unsent and not ws.broken:
                return
        self._to_pump()

    def push_frames(self, frames: bytes, count: int) -> None:
        """Send ``frames``, ``count`` whole frames already encoded as a server sends them
        (the pooled relay's front passes its home's on: nothing decoded, nothing
        encoded again), after what was pushed before, as ``push_many`` would: written
        now with nothing queued and the socket free, else queued for the pump (one
        item, ``count`` frames of the bounds: ``congested``, ``max_output_bytes``)."""
        if self.close_code is not None:
            return
        ws = self.ws
        if self.outbox or not ws.can_write_now():
            self._open_outbox().append(Encoded(frames, count))
            self.bundled += count - 1
            if not self._count(len(frames)):
                return
        else:
            ws.write_frames_now(frames)
            if not ws.unsent and not ws.broken:
                return
        self._to_pump()

    def _open_outbox(self) -> deque[str | bytes]:
        """The outbox, a deque from the first frame that has to wait."""
        outbox = self.outbox
        if isinstance(outbox, tuple):
            outbox = self.outbox = deque()
        return outbox

    def _count(self, size: int) -> bool:
        """Count ``size`` more queued; False once that is past the bound (the connection
        is then cut: ``_not_reading``)."""
        self.queued += size
        if self.queued > self.max_output_bytes:
            self._not_reading()
            return False
        return True

    def _to_pump(self) -> None:
        """Leave the rest to the pump: wake it, or start it."""
        if self._wake:
            self._wake.unpark()
        else:
            self.start_pump()

    def room(self) -> tuple[int, float]:
        """How many more frames, and characters, could be queued without congesting it."""
        frames = len(self.outbox) + self.bundled
        return self.high_water - frames, self.max_output_bytes / 2 - self.queued

    def finish(self, frames: list[str | bytes], close_code: int, *, flush: bool = True) -> None:
        """Send ``frames`` after (or, without ``flush``, instead of) what is queued, then
        close with ``close_code``. The first call decides."""
        if self.close_code is not None:
            return
        if not flush:
            self._drop_outbox()
        self._open_outbox().extend(frames)
        self.queued += sum(map(len, frames))
        self.close_code = close_code
        for watcher in self.watchers:
            watcher.terminal_queued(self, frames)
        if self._wake is not None:
            self._wake.unpark_all()
        self.release_waiters()
        self.start_pump()

    async def send_rest(self) -> None:
        """Send what is queued, and what ``finish`` adds (a resumer may still be owed a
        terminal event), then end the connection: never returns, the pump's end
        cancels the connection."""
        self.start_pump()
        await trio.sleep_forever()

    def start_pump(self) -> None:
        """Start the pump, unless it runs or the connection has ended.

        It starts with the first frame that has to wait, not with the connection: a
        connection that has said nothing since its handshake (an idle session) holds no
        pump task."""
        nursery = self._nursery
        if nursery is not None and not self._pumping:
            self._pumping = True
            nursery.start_soon(self._pump_then_end)

    def abort_after(self, seconds: float) -> None:
        """Give the pump ``seconds`` to finish, then cut the connection regardless."""
        if self._nursery is not None:
            scope = self._nursery.cancel_scope
            scope.deadline = min(scope.deadline, trio.current_time() + seconds)

    @property
    def cancel_scope(self) -> trio.CancelScope | None:
        """The connection's scope while it is open: cancelling it cuts the connection."""
        return None if self._nursery is None else self._nursery.cancel_scope

    def lost(self) -> None:
        """The peer is gone (no pong): end the connection now."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    @property
    def congested(self) -> bool:
        outbox = self.outbox  # (empty, the common case: one test)
        return bool(outbox) and (
            len(outbox) + self.bundled > self.high_water or self.queued * 2 > self.max_output_bytes
        )

    def _not_reading(self) -> None:
        """The outbox went past its bound: the client sends but does not read. Cut it."""
        self.ws.report_fault(f"over {self.max_output_bytes} bytes queued, not reading: cut")
        self.finish([], CloseCode.NOT_READING, flush=False)
        if self._nursery is not None:  # the close frame may never get out: don't wait
            self.abort_after(0)

    def _drop_outbox(self) -> None:
        if isinstance(self.outbox, deque):
            self.outbox.clear()  # (in place: the pump holds it)
        self.queued = self.bundled = 0
        self._sample = None

    def sample_write(self, since: float, sampler: WriteSampler) -> None:
        """Report to ``sampler`` how long after ``since`` the last frame pushed is
        written: now if it was written directly, else once the pump has written it."""
        if self.outbox:
            self._sample = (self._written + len(self.outbox), since, sampler)
        else:
            sampler.observe(trio.current_time() - since)

    def _sampled(self) -> None:
        sample = self._sample
        if sample is not None and self._written >= sample[0]:
            self._sample = None
            sample[2].observe(trio.current_time() - sample[1])

    async def wait_drained(self) -> None:
        if self._drained is None:
            self._drained = trio.lowlevel.ParkingLot()
        await self._drained.park()

    def release_waiters(self) -> None:
        if self._drained is not None:
            self._drained.unpark_all()

    async def _pump_then_end(self) -> None:
        try:
            await self._pump()
        finally:
            self.lost()  # however the pump ends, so does the connection

    async def _pump(self) -> None:
        """Send the outbox in order; return once closing and empty.

        Frames that queued up while the previous write was in flight go out together in
        one write: under load this saves a syscall and a lock round per frame.
        """
        outbox = self.outbox
        if isinstance(outbox, tuple):
            outbox = self.outbox = deque()
        ws = self.ws
        self._wake = wake = trio.lowlevel.ParkingLot()
        low_water = self.high_water // 2
        low_bytes = self.max_output_bytes / 4
        while True:
            if outbox:
                if len(outbox) == 1:
                    frame = outbox.popleft()
                    self.queued -= len(frame)
                    self._written += 1  # counted once taken: see sample_write
                    if self.bundled and isinstance(frame, Encoded):
                        self.bundled -= frame.frames - 1
                    await ws.send_message(frame)
                else:
                    count = min(len(outbox), BATCH)
                    frames = [outbox.popleft() for _ in range(count)]
                    self.queued -= sum(map(len, frames))
                    self._written += count
                    if self.bundled:
                        self.bundled -= sum(f.frames - 1 for f in frames if isinstance(f, Encoded))
                    await ws.send_many(frames)
                if self._sample is not None:
                    self._sampled()
                if (
                    self._drained
                    and len(outbox) + self.bundled <= low_water
                    and self.queued <= low_bytes
                ):
                    self._drained.unpark_all()
            elif ws.unsent or ws.broken:
                await ws.flush()  # finishes a direct write's tail, or raises
            elif self.close_code is not None:
                return
            else:
                await wake.park()

    def _start_ping(self, keepalive: Keepalive) -> None:
        if self._nursery is not None:  # (a ping due while the connection ends: none)
            self._nursery.start_soon(keepalive.ping)


@attrs.define(eq=False)
class Keepalive:
    """Pings one connection every ``interval``; no pong within ``patience`` ends it.

    Driven by the server's timer heap: between pings it holds no task; each ping runs in
    a task of the connection's nursery that lives until its pong.
    """

    conn: Connection
    timers: Timers
    interval: float
    patience: float
    timer: Entry | None = None
    next_ping: float = math.inf

    def start(self) -> None:
        self.next_ping = trio.current_time() + self.interval
        self.timers.schedule(self)

    def stop(self) -> None:
        self.timers.forget(self)

    def next_deadline(self) -> float:
        return self.next_ping

    def fire(self, now: float) -> None:
        self.next_ping = math.inf  # the next one is set when the pong arrives
        self.conn._start_ping(self)

    async def ping(self) -> None:
        conn = self.conn
        with trio.move_on_after(self.patience):
            try:
                await conn.ws.ping()
            except ConnectionClosed:
                if conn.ws.broken:
                    conn.lost()  # lost: the session detaches now
                return
            self.start()
            return
        log.info("connection %s: no pong within %ss", conn.ws, self.patience)
        conn.lost()  # the connection is lost: its session detaches


async def decode_large(dialect: Dialect, message: str | bytes) -> dict[str, Any]:
    """``dialect.decode``, with a checkpoint between slices of the work
    (``decode_steps``): a large message lets other sessions run while it is decoded."""
    steps = dialect.decode_steps(message)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            event: dict[str, Any] = done.value
            return event
        await trio.lowlevel.checkpoint()


class Lifetime:
    """``Connection.open``'s ``async with``: the connection's nursery around the block,
    then its bounded close. (A class, not an ``asynccontextmanager``: an idle session's
    stack holds it for the session's whole life, and a generator's frame and its context
    manager cost ~0.5 KB more.)"""

    __slots__ = ("_close_timeout", "_conn", "_nursery_manager")

    def __init__(self, conn: Connection, close_timeout: float) -> None:
        self._conn = conn
        self._close_timeout = close_timeout
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] | None = None

    async def __aenter__(self) -> Connection:
        manager = self._nursery_manager = trio.open_nursery()
        self._conn._nursery = await manager.__aenter__()
        return self._conn

    async def __aexit__(
        self,
        etype: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        conn = self._conn
        manager = self._nursery_manager
        assert manager is not None
        close_code: int = CloseCode.GOING_AWAY
        try:
            conn._nursery = None  # ending: nothing more starts in it
            try:
                suppressed = await manager.__aexit__(etype, exc, tb)
            except BaseException as raised:  # the block's error, or its tasks' (grouped)
                if not _only_cancelled(raised):
                    close_code = CloseCode.INTERNAL_ERROR
                raise
            if exc is not None and not suppressed and not _only_cancelled(exc):
                close_code = CloseCode.INTERNAL_ERROR  # (the block's own, passed on as is)
            return suppressed
        finally:
            if conn._keepalive is not None:
                conn._keepalive.stop()
            if conn.close_code is not None:
                close_code = conn.close_code
            deadline = trio.current_time() + self._close_timeout
            with trio.CancelScope(shield=True, deadline=deadline):
                try:
                    await conn.ws.aclose(close_code)
                except Exception:  # the peer may already be gone; nothing left to save
                    pass
            conn._drop_outbox()  # frames it never sent are freed now, not at a collection


def _only_cancelled(exc: BaseException) -> bool:
    """Did the connection end by cancellation or by the peer, not by our own error?"""
    benign = (trio.Cancelled, ConnectionClosed, trio.BrokenResourceError)
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(benign)[1] is None
    return isinstance(exc, benign)
