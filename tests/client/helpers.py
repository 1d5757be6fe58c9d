"""Helpers shared by the client's tests (``tests/client/test_*.py``).

* Events: ``text`` (an application event), and the server's answers ``created``,
  ``resumed`` and ``out`` as a scripted server or a ``SessionState`` test feeds them.
* The in-memory harness: ``sim_server`` runs the real server on ``trio_duplex.testing``'s
  listener, ``Net`` opens (or refuses) the client's streams to it and cuts them,
  ``Engines`` keeps every engine the server made, ``client_for`` connects through
  ``Net`` with fast policies (``FAST``); ``rng_starting_at`` fixes which of several URLs
  ``connect`` tries first.
* Reading: ``next_of`` (the next event of a type), ``texts`` (the next echoed texts).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import attrs
import trio

from trio_duplex import ServerConfig
from trio_duplex.client import (
    ClientOptions,
    ClientSession,
    ConnectionChange,
    HeartbeatPolicy,
    ReconnectPolicy,
    ResumeState,
    connect,
)
from trio_duplex.engines.api import EngineFactory
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import FaultyStream, ScriptedEngine, Simulation, running_server

Event = dict[str, Any]
URL = "ws://sim/v1/duplex"
FAST = ClientOptions(
    reconnect=ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=100, deadline=25),
    heartbeat=HeartbeatPolicy(interval=5, timeout=2),
)
"""Quick retries and heartbeats (virtual time makes them cheap)."""


# -- events ------------------------------------------------------------------------------


def text(value: str) -> Event:
    return {"type": "input.text.append", "text": value}


def created(**limits: float) -> Event:
    """``session.created`` of session ``s1``, token ``secret-1``, generation 1."""
    return {
        "type": "session.created",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": "secret-1",
        "attachment_generation": 1,
        "limits": {"idle_ttl_s": 300, "journal_max_bytes": 8 << 20, **limits},
    }


def resumed(received: int, generation: int = 2) -> Event:
    """``session.resumed`` of ``s1`` with token ``secret-<generation>``."""
    return {
        "type": "session.resumed",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": f"secret-{generation}",
        "attachment_generation": generation,
        "last_received_client_event_seq": received,
    }


def out(seq: int) -> Event:
    """An engine event the server journaled as ``seq``."""
    return {"type": "out", "server_event_seq": seq}


# -- the real server in memory -----------------------------------------------------------


@attrs.define
class Engines:
    """An engine factory that keeps every engine it made (``gated``: they answer only
    what the test releases)."""

    gated: bool = False
    made: list[ScriptedEngine] = attrs.field(factory=list)

    def __call__(self, config: Mapping[str, Any]) -> ScriptedEngine:
        engine = ScriptedEngine(dict(config), gated=self.gated)
        self.made.append(engine)
        return engine


@attrs.define
class Net:
    """The in-memory network: each connection's server side is a FaultyStream."""

    sim: Simulation
    down: bool = False
    streams: list[FaultyStream] = attrs.field(factory=list)

    async def open_stream(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise OSError("network is down")
        client, faulty = await self.sim.listener.connect()
        self.streams.append(faulty)
        return client

    async def cut(self) -> None:
        await self.streams[-1].cut()


@asynccontextmanager
async def sim_server(
    config: ServerConfig | None = None, engines: EngineFactory = EchoEngine
) -> AsyncIterator[tuple[Simulation, Net]]:
    async with running_server(config, engines) as sim:
        yield sim, Net(sim)


def client_for(
    net: Net,
    *,
    options: ClientOptions = FAST,
    session: Mapping[str, Any] | None = None,
    resume: ResumeState | None = None,
    detach_on_exit: bool = False,
    on_change: Callable[[ConnectionChange], None] | None = None,
    rng: random.Random | None = None,
) -> AbstractAsyncContextManager[ClientSession]:
    """``connect`` to the simulated server through ``net``."""
    return connect(
        URL,
        session,
        resume=resume,
        options=options,
        detach_on_exit=detach_on_exit,
        on_change=on_change,
        open_stream=net.open_stream,
        rng=rng,
    )


def rng_starting_at(index: int, count: int) -> random.Random:
    """A seeded rng whose first choice among ``count`` URLs (``connect``'s first attempt)
    is the ``index``-th."""
    for seed in range(1000):
        if random.Random(seed).randrange(count) == index:
            return random.Random(seed)
    raise AssertionError("no seed found")


# -- reading -----------------------------------------------------------------------------


async def next_of(session: ClientSession, kind: str) -> Event:
    """The next event of type ``kind`` (the ones before it are skipped)."""
    async for event in session:
        if event["type"] == kind:
            return event
    raise AssertionError(f"session ended before {kind}")


async def texts(session: ClientSession, count: int) -> list[Event]:
    """The next ``count`` echoed texts (``response.output_text.delta``)."""
    return [await next_of(session, "response.output_text.delta") for _ in range(count)]
