"""An engine factory's ``warm()``: called once, inside the server's run, when it starts
serving (``speech`` starts its model processes then, not at its first session)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.engines.api import Engine
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import MemoryListener, SimClient, Simulation

from ..helpers import echo


@attrs.define(eq=False)
class Warmed:
    """The echo engine's factory, with a ``warm`` that notes when it ran."""

    warmed: list[bool] = attrs.Factory(list)
    sessions: int = 0

    def __call__(self, config: Mapping[str, Any]) -> Engine:
        self.sessions += 1
        return EchoEngine(config)

    def warm(self) -> None:
        # Inside the server's trio.run (a system task may be spawned here), before any session.
        self.warmed.append(self.sessions == 0 and trio.lowlevel.current_root_task() is not None)


async def test_a_factory_s_warm_runs_once_as_the_server_starts_serving() -> None:
    factory = Warmed()
    server = DuplexServer(ServerConfig(), factory)
    listener = MemoryListener.create()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [listener])
        assert factory.warmed == [True]
        sim = Simulation(server, listener, nursery)
        client: SimClient
        client, _ = await sim.open_session()
        await echo(client)
        nursery.cancel_scope.cancel()
    assert factory.warmed == [True] and factory.sessions == 1


async def test_a_factory_without_warm_is_served_as_before() -> None:
    server = DuplexServer(ServerConfig(), EchoEngine)
    listener = MemoryListener.create()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, [listener])
        client, _ = await Simulation(server, listener, nursery).open_session()
        await echo(client)
        nursery.cancel_scope.cancel()
