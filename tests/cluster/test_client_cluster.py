"""Our client (``trio_duplex.client.connect`` with several URLs) against a cluster of
three real ``trio-duplex serve`` nodes and a real redis-server: through proxies that
cut its connections at seeded random points, and through a node's deploy (SIGTERM), it
delivers every event once and in order in both directions, with nothing for the
application to do.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable

import pytest
import trio

from trio_duplex.client import (
    ClientOptions,
    ClientSession,
    HeartbeatPolicy,
    ReconnectPolicy,
    connect,
)

from ..client.helpers import Event, text
from ..client.proxy import FaultPlan, FaultyProxy
from ..helpers import ServerProcess

pytestmark = pytest.mark.integration

OPTIONS = ClientOptions(
    reconnect=ReconnectPolicy(initial_delay=0.01, max_delay=0.2, max_attempts=50, deadline=30),
    heartbeat=HeartbeatPolicy(interval=1.0, timeout=1.0),
    open_timeout=2.0,
    close_timeout=2.0,
)


async def echoed(session: ClientSession, count: int, seen: list[Event]) -> list[Event]:
    """The next ``count`` echoed texts; every other event the application sees goes to
    ``seen`` (``session.going_away`` is surfaced, as before)."""
    got: list[Event] = []
    while len(got) < count:
        event = await session.receive()
        if event["type"] == "response.output_text.delta":
            got.append(event)
        else:
            seen.append(event)
    return got


async def send_paced(
    session: ClientSession, values: list[str], between: Callable[[int], object]
) -> None:
    for i, value in enumerate(values):
        await session.send(text(value))
        between(i)
        if i % 20 == 19:
            await session.confirm()  # pace: the engine's input is bounded


async def cutting_proxies(
    nursery: trio.Nursery, cluster: list[ServerProcess], seed: int
) -> list[tuple[FaultyProxy, int]]:
    """A proxy before each node that cuts its connections (``seed``'s plans), each with
    its port."""
    proxies = []
    for i, node in enumerate(cluster):
        plan = FaultPlan(seed=seed * 3 + i, max_cuts=4 + seed, max_lifetime=0.3)
        proxy = FaultyProxy(node.port, plan)
        proxies.append((proxy, await nursery.start(proxy.run)))
    return proxies


@pytest.mark.parametrize("seed", range(3))
async def test_exactly_once_through_cutting_proxies_over_three_nodes(
    nodes: Callable[..., list[ServerProcess]], seed: int
) -> None:
    cluster = nodes("abc", "--relay-port", "0", "--disconnect-grace", "5")
    sent = [f"event {i}" for i in range(200)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            proxies = await cutting_proxies(nursery, cluster, seed)
            urls = [f"ws://127.0.0.1:{port}/v1/duplex" for _, port in proxies]
            async with connect(urls, options=OPTIONS, rng=random.Random(seed)) as session:
                async with trio.open_nursery() as inner:
                    inner.start_soon(send_paced, session, sent, lambda i: None)
                    got = await echoed(session, len(sent), [])
                await session.aclose()
            nursery.cancel_scope.cancel()
    assert [e["text"] for e in got] == sent
    assert [e["server_event_seq"] for e in got] == list(range(1, len(sent) + 1))
    assert sum(len(proxy.cuts) for proxy, _ in proxies) >= 4


async def test_a_deploy_moves_the_session_without_the_application_noticing(
    nodes: Callable[..., list[ServerProcess]],
) -> None:
    cluster = nodes("abc", "--relay-port", "0")
    by_url = {node.url: node for node in cluster}
    sent = [f"event {i}" for i in range(300)]
    seen: list[Event] = []
    deployed: list[ServerProcess] = []
    with trio.fail_after(60):
        async with connect(list(by_url), options=OPTIONS, rng=random.Random(7)) as session:
            home = by_url[session.url]

            def deploy_at_100(i: int) -> None:
                if i == 100:
                    home.proc.send_signal(signal.SIGTERM)  # a rolling deploy reaches it
                    deployed.append(home)

            async with trio.open_nursery() as inner:
                inner.start_soon(send_paced, session, sent, deploy_at_100)
                got = await echoed(session, len(sent), seen)
            assert session.url != home.url  # it goes on elsewhere
            await session.aclose()
    assert deployed and await trio.to_thread.run_sync(home.wait, 10) == 0
    assert [e["text"] for e in got] == sent
    assert [e["server_event_seq"] for e in got] == list(range(1, len(sent) + 1))
    going = [e for e in seen if e["type"] == "session.going_away"]
    assert len(going) == 1 and going[0]["migrating"] is True
    assert "handed over to the cluster" in home.log
