"""``ClientSession`` against a real ``DuplexServer`` on 127.0.0.1 (real TCP sockets, real
time), through ``proxy.py``'s ``FaultyProxy``, which cuts connections at seeded random
points (mid-handshake, mid-frame; FIN or RST).
"""

from __future__ import annotations

import random

import pytest
import trio

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.client import (
    Attached,
    ClientOptions,
    ConnectionChange,
    HeartbeatPolicy,
    ReconnectPolicy,
    connect,
)
from trio_duplex.engines.api import EngineSession
from trio_duplex.engines.echo import EchoEngine

from .helpers import Event, text, texts
from .proxy import FaultPlan, FaultyProxy


class RecordingEcho(EchoEngine):
    inputs: list[Event] = []  # shared per test: reset in the test

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            RecordingEcho.inputs.append(event)
            await session.send({"type": "response.output_text.delta", "text": event["text"]})


@pytest.mark.parametrize("seed", range(5))
async def test_exactly_once_through_a_cutting_proxy(seed: int) -> None:
    RecordingEcho.inputs = []
    sent = [f"event {i}" for i in range(200)]
    options = ClientOptions(
        reconnect=ReconnectPolicy(initial_delay=0.01, max_delay=0.2, max_attempts=50, deadline=20),
        heartbeat=HeartbeatPolicy(interval=1.0, timeout=1.0),
        open_timeout=2.0,
        close_timeout=2.0,
    )
    grace = 1.0
    config = ServerConfig(host="127.0.0.1", port=0, disconnect_grace_s=grace)
    changes: list[ConnectionChange] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = DuplexServer(config, RecordingEcho)
            port = await nursery.start(server.run_tcp)
            plan = FaultPlan(seed=seed, max_cuts=4 + 2 * seed, max_lifetime=0.3)
            proxy = FaultyProxy(port, plan)
            proxy_port = await nursery.start(proxy.run)
            url = f"ws://127.0.0.1:{proxy_port}/v1/duplex"
            async with connect(
                url, options=options, on_change=changes.append, rng=random.Random(seed)
            ) as session:
                async with trio.open_nursery() as inner:

                    async def sender() -> None:
                        for i, value in enumerate(sent):
                            await session.send(text(value))
                            if i % 20 == 19:
                                await session.confirm()  # pace: the engine's input is bounded

                    inner.start_soon(sender)
                    got = await texts(session, len(sent))
            assert [e["text"] for e in got] == sent
            seqs = [e["server_event_seq"] for e in got]
            assert seqs == list(range(1, len(sent) + 1))
            assert [e["text"] for e in RecordingEcho.inputs] == sent
            # docs/protocol.md: the slot is free before session.closed is sent.
            assert session.session_id not in server.sessions.registry.sessions
            # A cut between the server's send of session.created and the client's read of
            # it leaves a session nobody can resume: it must go after its grace.
            with trio.fail_after(grace + 5):
                while server.slots_held or server.sessions.registry.sessions:
                    await server.wait_changed()
            nursery.cancel_scope.cancel()
    assert min(plan.max_cuts, 4) <= len(proxy.cuts) <= plan.max_cuts
    assert sum(isinstance(c, Attached) for c in changes) >= 1
