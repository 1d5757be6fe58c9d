"""The simulated wire: an in-memory listener whose server-side streams take faults.

``FaultyStream`` can hold sends at a gate, fail them, break only the write half, end or
stall only the read half, or cut the connection; ``MemoryListener`` hands the server one
per ``connect()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio
import trio.testing


class TransportFault(trio.BrokenResourceError):
    """Raised by a FaultyStream whose send was made to fail."""


@attrs.define(eq=False)
class Inbound(trio.abc.ReceiveStream):
    """The client-to-server bytes of one connection. Like a socket's receive buffer it
    can also be read without awaiting (``receive_now``): the server looks there for a
    peer that is gone before it writes ``session.created`` (WebSocket.read_now)."""

    _data: bytearray = attrs.field(factory=bytearray)
    _eof: bool = False
    _closed: bool = False
    _arrived: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def put(self, data: bytes | bytearray) -> None:
        if self._closed:
            raise trio.BrokenResourceError("the server closed its end")
        self._data += data
        self._arrived.unpark_all()

    @property
    def pending(self) -> int:
        """Bytes sent by the client and not read by the server yet."""
        return len(self._data)

    def put_eof(self) -> None:
        self._eof = True
        self._arrived.unpark_all()

    def receive_now(self, max_bytes: int | None = None) -> bytes | bytearray | None:
        """What has arrived, at most ``max_bytes``; b"" at the end; None: nothing yet."""
        if self._closed:
            raise trio.ClosedResourceError
        if not self._data:
            return b"" if self._eof else None
        size = len(self._data) if max_bytes is None else max_bytes
        chunk = self._data[:size]
        del self._data[:size]
        return chunk

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        await trio.lowlevel.checkpoint()
        while (data := self.receive_now(max_bytes)) is None:
            await self._arrived.park()  # (another reader may take what woke us: look again)
        return data

    async def aclose(self) -> None:
        self._closed = True
        self._data = bytearray()
        self._arrived.unpark_all()
        await trio.lowlevel.checkpoint()


def _client_to_server(inbound: Inbound) -> trio.testing.MemorySendStream:
    sent = trio.testing.MemorySendStream()

    def move() -> None:
        while True:
            try:
                data = sent.get_data_nowait()
            except trio.WouldBlock:
                return
            if not data:  # the client closed its end: EOF, after what it sent
                inbound.put_eof()
                return
            inbound.put(data)

    async def moved() -> None:
        move()

    sent.send_all_hook = moved
    sent.close_hook = move
    return sent


@attrs.define(eq=False)
class FaultyStream(trio.abc.Stream):
    """A stream whose sends can be held, failed or cut, for race tests."""

    inner: trio.abc.Stream
    peer: trio.StapledStream[Any, Any] | None = None
    """The client's end, when the listener made both."""
    inbound: Inbound | None = None
    """What the peer sent, when the listener made both (``receive_now`` reads it)."""
    fail_sends: bool = False
    """Every send from now on raises (the read half keeps working)."""
    gate: trio.Event | None = None
    """While set to an unset Event, each send waits on it before writing."""
    sends_started: int = 0
    sends_completed: int = 0
    held: int = 0
    """Sends waiting at the gate right now."""
    after_send: Callable[[], None] | None = None
    """Called once, synchronously, as the next send completes (then cleared): what the
    peer does the moment the bytes are in, before the sender runs on (another process,
    as a real client is, does not wait for the sender's next step)."""
    _passes: int = 0
    _reads_ended: bool = False
    _read_gate: trio.Event | None = None
    _read_scope: trio.CancelScope | None = None
    _send_started: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _held_changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends_started += 1
        self._send_started.unpark_all()
        gate = self.gate
        if gate is not None and not gate.is_set():
            if self._passes > 0:
                self._passes -= 1
            else:
                self.held += 1
                self._held_changed.unpark_all()
                try:
                    await gate.wait()
                finally:
                    self.held -= 1
        if self.fail_sends:
            raise TransportFault("send made to fail by the test")
        await self.inner.send_all(data)
        self.sends_completed += 1
        after, self.after_send = self.after_send, None
        if after is not None:
            after()

    def hold(self, after: int = 0) -> trio.Event:
        """Hold every send from now on, but the first ``after``, until the returned Event
        is set (or ``release`` is called)."""
        self.gate = trio.Event()
        self._passes = after
        return self.gate

    def release(self) -> None:
        """Let held sends through, and stop holding."""
        if self.gate is not None:
            self.gate.set()

    async def wait_held(self) -> None:
        """Wait until a send is waiting at the gate (at once if one already is)."""
        while not self.held:
            await self._held_changed.park()

    async def wait_send_started(self) -> None:
        """Wait until the next send begins (e.g. to act while it is held at the gate)."""
        await self._send_started.park()

    def break_writes(self) -> None:
        """Break only the write half: every send from now on fails, held ones included
        once released. Reads go on."""
        self.fail_sends = True

    def end_reads(self) -> None:
        """Break only the read half: the server reads end-of-stream (the peer's FIN),
        while its writes still succeed."""
        self._reads_ended = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    async def fin(self) -> None:
        """The peer's FIN, in order: the server reads what the peer already sent, then
        end-of-stream; its writes still succeed (the peer still reads)."""
        assert self.peer is not None, "only for streams made by MemoryListener.connect"
        await self.peer.send_stream.aclose()

    def stall_reads(self) -> trio.Event:
        """The peer goes silent: nothing more is read (pongs included) until the
        returned Event is set."""
        self._read_gate = trio.Event()
        return self._read_gate

    async def cut(self) -> None:
        """Drop the connection: both halves, no close frame (as a lost network does)."""
        self.fail_sends = True
        if self.gate is not None:
            self.gate.set()
        await trio.aclose_forcefully(self.inner)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    def receive_now(self, max_bytes: int | None = None) -> bytes | bytearray | None:
        """What the peer sent, without awaiting (None: nothing now, or reads stalled)."""
        if self._reads_ended:
            return b""
        if self.inbound is None or self._read_gate is not None:
            return None
        return self.inbound.receive_now(max_bytes)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._reads_ended:
            await trio.lowlevel.checkpoint()
            return b""
        with trio.CancelScope() as self._read_scope:
            data = await self.inner.receive_some(max_bytes)
            if self._read_gate is not None:  # stalled: what arrived waits with us
                await self._read_gate.wait()
            return data
        return b""  # end_reads() interrupted the wait

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """A Listener fed by ``connect()``; each server-side stream is a FaultyStream."""

    _send: trio.MemorySendChannel[trio.abc.Stream]
    _receive: trio.MemoryReceiveChannel[trio.abc.Stream]
    streams: list[FaultyStream] = attrs.field(factory=list)

    @classmethod
    def create(cls) -> MemoryListener:
        send, receive = trio.open_memory_channel[trio.abc.Stream](100)
        return cls(send, receive)

    async def accept(self) -> trio.abc.Stream:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self._receive.close()
        await trio.lowlevel.checkpoint()

    async def connect(self) -> tuple[trio.abc.Stream, FaultyStream]:
        inbound = Inbound()
        to_client, from_server = trio.testing.memory_stream_one_way_pair()
        client = trio.StapledStream(_client_to_server(inbound), from_server)
        server = trio.StapledStream(to_client, inbound)
        faulty = FaultyStream(server, peer=client, inbound=inbound)
        self.streams.append(faulty)
        await self._send.send(faulty)
        return client, faulty
