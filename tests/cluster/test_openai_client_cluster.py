"""Our client speaking the OpenAI dialect with its resume extension
(``connect(dialect="openai")`` on ``/v1/realtime``) against real ``trio-duplex serve``
processes, cut at seeded random points by proxies (as test_client_cluster.py does on
``/v1/duplex``): on one node, over a cluster of three on a real redis-server, and
through a deploy (SIGTERM: the home node drains and migrates the session). It loses,
duplicates and reorders nothing either way.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable

import pytest
import trio

from trio_duplex.client import ClientSession, connect
from trio_duplex.client.dialect import text_of

from ..client.helpers import Event
from ..client.proxy import FaultPlan, FaultyProxy
from ..helpers import Serve, ServerProcess
from .test_client_cluster import OPTIONS, cutting_proxies

pytestmark = pytest.mark.integration

CONFIG = {"output_modalities": ["text"]}


def realtime(port: int) -> str:
    return f"ws://127.0.0.1:{port}/v1/realtime?model=echo"


def turn(text: str) -> list[Event]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]


async def answered(session: ClientSession, count: int, seen: list[Event]) -> list[str]:
    """The text of the next ``count`` responses (their deltas joined, at
    ``response.done``); every event the application sees goes to ``seen``."""
    got: list[str] = []
    pending: dict[str, str] = {}
    while len(got) < count:
        event = await session.receive()
        seen.append(event)
        if (text := text_of(event)) is not None:
            key = str(event.get("response_id"))
            pending[key] = pending.get(key, "") + text
        elif event["type"] == "response.done":
            got.append(pending.pop(str(event["response"]["id"]), ""))
    return got


async def send_paced(
    session: ClientSession, values: list[str], between: Callable[[int], object]
) -> None:
    for i, value in enumerate(values):
        for event in turn(value):
            await session.send(event)
        between(i)
        if i % 10 == 9:
            await session.confirm()  # pace: the engine's input is bounded


async def converse(
    session: ClientSession,
    sent: list[str],
    seen: list[Event],
    between: Callable[[int], object] = lambda i: None,
) -> list[str]:
    """Send ``sent``'s turns (paced) while reading the answers: their texts."""
    async with trio.open_nursery() as inner:
        inner.start_soon(send_paced, session, sent, between)
        return await answered(session, len(sent), seen)


def exactly_once(got: list[str], sent: list[str], seen: list[Event]) -> None:
    assert got == sent
    seqs = [e["server_event_seq"] for e in seen if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1))  # none lost, none twice, in order
    assert all(
        e["event_id"] == f"event_{e['server_event_seq']}" for e in seen if "server_event_seq" in e
    )


@pytest.mark.parametrize("seed", range(2))
async def test_exactly_once_through_a_cutting_proxy_on_one_node(serve: Serve, seed: int) -> None:
    node = serve("--disconnect-grace", "5")
    sent = [f"turn {i}" for i in range(60)]
    seen: list[Event] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            proxy = FaultyProxy(node.port, FaultPlan(seed=seed, max_cuts=6, max_lifetime=0.3))
            port = await nursery.start(proxy.run)
            async with connect(
                realtime(port), CONFIG, options=OPTIONS, rng=random.Random(seed), dialect="openai"
            ) as session:
                got = await converse(session, sent, seen)
                await session.aclose()
            nursery.cancel_scope.cancel()
    exactly_once(got, sent, seen)
    assert len(proxy.cuts) >= 3 and session.generation > 1


@pytest.mark.parametrize("seed", range(2))
async def test_exactly_once_through_cutting_proxies_over_three_nodes(
    nodes: Callable[..., list[ServerProcess]], seed: int
) -> None:
    cluster = nodes("abc", "--relay-port", "0", "--disconnect-grace", "5")
    sent = [f"turn {i}" for i in range(80)]
    seen: list[Event] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            proxies = await cutting_proxies(nursery, cluster, seed)
            urls = [realtime(port) for _, port in proxies]
            async with connect(
                urls, CONFIG, options=OPTIONS, rng=random.Random(seed), dialect="openai"
            ) as session:
                got = await converse(session, sent, seen)
                await session.aclose()
            nursery.cancel_scope.cancel()
    exactly_once(got, sent, seen)
    assert sum(len(proxy.cuts) for proxy, _ in proxies) >= 4


async def test_a_deploy_moves_the_session_without_the_application_noticing(
    nodes: Callable[..., list[ServerProcess]],
) -> None:
    cluster = nodes("abc", "--relay-port", "0")
    by_url = {realtime(node.port): node for node in cluster}
    sent = [f"turn {i}" for i in range(120)]
    seen: list[Event] = []
    deployed: list[ServerProcess] = []
    with trio.fail_after(60):
        async with connect(
            list(by_url), CONFIG, options=OPTIONS, rng=random.Random(7), dialect="openai"
        ) as session:
            home = by_url[session.url]

            def deploy_at_40(i: int) -> None:
                if i == 40:
                    home.proc.send_signal(signal.SIGTERM)  # a rolling deploy reaches it
                    deployed.append(home)

            got = await converse(session, sent, seen, deploy_at_40)
            assert session.url != realtime(home.port)  # it goes on elsewhere
            await session.aclose()
    assert deployed and await trio.to_thread.run_sync(home.wait, 10) == 0
    exactly_once(got, sent, seen)
    going = [e for e in seen if e["type"] == "session.going_away"]
    assert len(going) == 1 and going[0]["migrating"] is True
    assert "handed over to the cluster" in home.log
