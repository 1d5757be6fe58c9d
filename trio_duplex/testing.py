"""A simulation kit: run a real DuplexServer in memory, with faults you control.

Everything here runs without sockets, so under pytest-trio's ``autojump_clock`` a grace
period of 30 s passes instantly and exactly. Example::

    from trio_duplex.testing import running_server

    async def test_echo(autojump_clock):
        async with running_server() as sim:
            client = await sim.connect()
            created = await client.send_and_receive({"type": "session.update", "session": {}})
            await client.send({"type": "input.text.append", "text": "hi"})
            assert (await client.receive())["text"] == "hi"
        assert sim.server.slots_held == 0

``FaultyStream`` wraps the server side of each connection: hold the next send at a gate,
make sends fail, break only the write half, or cut the connection between two steps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from ._config import ServerConfig
from ._engine import Engine, EngineFactory, EngineSession, Event
from ._server import DuplexServer
from .engines.echo import EchoEngine

__all__ = [
    "FaultyStream",
    "MemoryListener",
    "ScriptedEngine",
    "SimClient",
    "Simulation",
    "running_server",
]


class TransportFault(trio.BrokenResourceError):
    """Raised by a FaultyStream whose send was made to fail."""


@attrs.define(eq=False)
class FaultyStream(trio.abc.Stream):
    """A stream whose sends can be held, failed or cut, for race tests."""

    inner: trio.abc.Stream
    fail_sends: bool = False
    """Every send from now on raises (the read half keeps working)."""
    gate: trio.Event | None = None
    """While set to an unset Event, each send waits on it before writing."""
    sends_started: int = 0
    sends_completed: int = 0
    _send_started: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends_started += 1
        self._send_started.unpark_all()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_sends:
            raise TransportFault("send made to fail by the test")
        await self.inner.send_all(data)
        self.sends_completed += 1

    async def wait_send_started(self) -> None:
        """Wait until the next send begins (e.g. to act while it is held at the gate)."""
        await self._send_started.park()

    async def wait_send_writable(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def hold(self) -> trio.Event:
        """Hold every send from now on until the returned Event is set."""
        self.gate = trio.Event()
        return self.gate

    async def cut(self) -> None:
        """Drop the connection: both halves, no close frame (as a lost network does)."""
        self.fail_sends = True
        if self.gate is not None:
            self.gate.set()
        await trio.aclose_forcefully(self.inner)


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
        client, server = trio.testing.memory_stream_pair()
        faulty = FaultyStream(server)
        self.streams.append(faulty)
        await self._send.send(faulty)
        return client, faulty


@attrs.define(eq=False)
class SimClient:
    """A WebSocket client of the simulated server that speaks JSON events."""

    ws: WebSocketConnection
    transport: FaultyStream
    """The server side of this connection: inject faults here."""

    async def send(self, event: Event) -> None:
        await self.ws.send_message(json.dumps(event))

    async def send_raw(self, message: str | bytes) -> None:
        await self.ws.send_message(message)

    async def receive(self) -> Event:
        message = await self.ws.get_message()
        result: Event = json.loads(message)
        return result

    async def send_and_receive(self, event: Event) -> Event:
        await self.send(event)
        return await self.receive()

    async def receive_until_closed(self) -> list[Event]:
        """Every event until the server closes; see ``close_code`` afterwards."""
        events = []
        try:
            while True:
                events.append(await self.receive())
        except ConnectionClosed:
            return events

    @property
    def close_code(self) -> int | None:
        reason = self.ws.closed
        return None if reason is None else reason.code

    async def aclose(self, code: int = 1000) -> None:
        await self.ws.aclose(code)


@attrs.define(eq=False)
class Simulation:
    server: DuplexServer
    listener: MemoryListener
    nursery: trio.Nursery

    async def connect(self, path: str = "/v1/duplex") -> SimClient:
        stream, faulty = await self.listener.connect()
        ws = await wrap_client_stream(self.nursery, stream, "sim", path)  # type: ignore[arg-type]
        return SimClient(ws, faulty)

    async def open_session(self, config: dict[str, Any] | None = None) -> tuple[SimClient, Event]:
        """Connect and open a session; returns the client and its ``session.created``."""
        client = await self.connect()
        created = await client.send_and_receive({"type": "session.update", "session": config or {}})
        assert created["type"] == "session.created", created
        return client, created

    async def resume(
        self, session_id: str, token: str, last_seq: int = 0
    ) -> tuple[SimClient, Event]:
        client = await self.connect()
        answer = await client.send_and_receive(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": last_seq,
            }
        )
        return client, answer

    def assert_no_leak(self) -> None:
        """Every session still held is live in the registry, and no slot is unaccounted."""
        registry = self.server.registry
        assert registry.slots_held == len(registry.sessions), (
            registry.slots_held,
            list(registry.sessions),
        )
        assert registry.slots_held <= self.server.config.max_sessions


@asynccontextmanager
async def running_server(
    config: ServerConfig | None = None,
    engine_factory: EngineFactory = EchoEngine,
) -> AsyncIterator[Simulation]:
    """Run a DuplexServer on a MemoryListener; on exit, shut it down and check slots."""
    server = DuplexServer(config or ServerConfig(), engine_factory)
    listener = MemoryListener.create()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [listener])
        sim = Simulation(server, listener, nursery)
        yield sim
        sim.assert_no_leak()
        nursery.cancel_scope.cancel()


Step = Callable[[EngineSession], Awaitable[None]]


class ScriptedEngine(Engine):
    """An engine whose output is gated by the test.

    Each ``input.text.append {text}`` is answered with ``response.output_text.delta`` once
    ``release`` lets it through (``gated=True``), or at once. ``fail_on`` makes the engine
    raise when that text arrives; ``finish_on`` makes it return.
    """

    accepts = frozenset({"input.text.append"})

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        *,
        gated: bool = False,
        fail_on: str | None = None,
        finish_on: str | None = None,
    ) -> None:
        self.config = config or {}
        self.gated = gated
        self.fail_on = fail_on
        self.finish_on = finish_on
        self.received: list[Event] = []
        self.session: EngineSession | None = None
        self.started = trio.Event()
        self.cancelled = False
        self._permits_send, self._permits = trio.open_memory_channel[None](1000)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._permits_send.send_nowait(None)

    async def emit(self, text: str) -> None:
        """Send one output event now, from the test."""
        assert self.session is not None
        await self.session.send({"type": "response.output_text.delta", "text": text})

    async def run(self, session: EngineSession) -> None:
        self.session = session
        self.started.set()
        try:
            async for event in session:
                self.received.append(event)
                text = event.get("text")
                if text == self.fail_on:
                    raise RuntimeError(f"scripted failure on {text!r}")
                if text == self.finish_on:
                    return
                if self.gated:
                    await self._permits.receive()
                await session.send({"type": "response.output_text.delta", "text": text})
        except trio.Cancelled:
            self.cancelled = True
            raise
