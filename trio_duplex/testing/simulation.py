"""``Simulation`` and ``running_server``: a real DuplexServer on a MemoryListener.

``running_server`` runs the server with a ``Probe`` and, on a clean exit, checks that no
slot leaked and asserts the probe's findings.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import trio
from trio_websocket import wrap_client_stream

from ..core import events
from ..core.events import EventType
from ..core.session import Registry, Session
from ..engines.api import EngineFactory, Event
from ..engines.echo import EchoEngine
from ..server.config import ServerConfig
from ..server.server import DuplexServer
from ..server.sessions.connection import Connection
from ..server.sessions.runner import SessionRunner
from ..server.sessions.websocket import WebSocket
from .client import SimClient
from .probe import Probe, probing
from .transport import FaultyStream, MemoryListener


@attrs.define(eq=False)
class Simulation:
    server: DuplexServer
    listener: MemoryListener
    nursery: trio.Nursery
    probe: Probe | None = None
    stopped: trio.Event = attrs.field(factory=trio.Event)
    """Set once ``server.run`` has returned (after ``shutdown``)."""

    async def connect(
        self, path: str = "/v1/duplex", *, setup: Callable[[FaultyStream], object] | None = None
    ) -> SimClient:
        """Open a WebSocket. ``setup`` gets the server-side stream before the handshake
        (to hold or break it from the first byte)."""
        stream, faulty = await self.listener.connect()
        if setup is not None:
            setup(faulty)
        ws = await wrap_client_stream(self.nursery, stream, "sim", path)  # type: ignore[arg-type]
        return SimClient(ws, faulty)

    async def open_session(self, config: dict[str, Any] | None = None) -> tuple[SimClient, Event]:
        """Connect and open a session; returns the client and its ``session.created``."""
        client = await self.connect()
        created = await client.send_and_receive(events.update(config or {}))
        assert created["type"] == EventType.CREATED, created
        return client, created

    async def resume(
        self, session_id: str, token: str, last_seq: int = 0
    ) -> tuple[SimClient, Event]:
        client = await self.connect()
        answer = await client.send_and_receive(resume_event(session_id, token, last_seq))
        return client, answer

    def sessions(self) -> list[Session]:
        """Every session that holds a slot (opening, attached, detached or closing)."""
        return list(self.server.sessions.registry.sessions.values())

    def session(self, session_id: str) -> Session | None:
        """The live session with that id (None once its slot is free)."""
        return self.server.sessions.registry.sessions.get(session_id)

    def runner(self, session_id: str) -> SessionRunner:
        """The runner of a live session (its engine task and attachment)."""
        runner = self.server.sessions.runner(session_id)
        assert runner is not None, f"no running session {session_id}"
        return runner

    def connection_of(self, client: SimClient) -> Connection | None:
        """The server's Connection for ``client``, while it is open."""
        for conn in self.server.connections:
            if isinstance(conn.ws, WebSocket) and conn.ws.stream is client.transport:
                return conn
        return None

    async def shutdown(self) -> None:
        """``begin_shutdown`` and wait until the server has stopped."""
        self.server.begin_shutdown()
        await self.stopped.wait()

    def assert_no_leak(self) -> None:
        """Every session still held is live in the registry, and no slot is unaccounted."""
        registry: Registry = self.server.sessions.registry
        assert registry.slots_held == len(registry.sessions), (
            registry.slots_held,
            list(registry.sessions),
        )
        assert registry.slots_held <= self.server.config.max_sessions


def resume_event(session_id: str, token: str, last_seq: int = 0) -> Event:
    return events.resume(session_id, token, last_seq)


@asynccontextmanager
async def running_server(
    config: ServerConfig | None = None,
    engine_factory: EngineFactory = EchoEngine,
    *,
    probe: bool = True,
    fail_after_s: float | None = None,
) -> AsyncIterator[Simulation]:
    """Run a DuplexServer on a MemoryListener. On a clean exit: check slots, stop the
    server, and (with ``probe``) assert the probe's findings.

    ``fail_after_s`` bounds the block in clock time: under ``autojump_clock`` a scenario that
    waits for what never comes then fails at once (TooSlowError) instead of hanging.
    """
    server = DuplexServer(config or ServerConfig(), engine_factory)
    listener = MemoryListener.create()
    with probing(server) if probe else _nothing() as found:
        async with trio.open_nursery() as nursery:
            sim = Simulation(server, listener, nursery, found)

            async def serve(*, task_status: trio.TaskStatus[None]) -> None:
                try:
                    await server.run([listener], task_status=task_status)
                finally:
                    sim.stopped.set()

            await nursery.start(serve)
            with trio.fail_after(math.inf if fail_after_s is None else fail_after_s):
                yield sim
            sim.assert_no_leak()
            nursery.cancel_scope.cancel()
        if found is not None:
            found.assert_clean()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None
