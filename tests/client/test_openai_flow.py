"""Input flow control over ``/v1/realtime`` (``dialect="openai"``), against the real server
in memory with an engine slower than the client, as test_flow.py does on ``/v1/duplex``:
paced by ``session.created``'s ``resume.limits`` and ``input.consumed``, a client
streaming flat out is never refused; against a server whose bound is smaller than it
says, it is refused (OpenAI's nested ``error``), rewinds and resends from the refused
seq, and no error reaches the application. Every event reaches the engine once, in
order, either way.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from trio_duplex import ServerConfig
from trio_duplex.client import ClientSession, connect

from .helpers import FAST, Net, OneSlow, Slow, advertise_more, sim_server

Event = dict[str, Any]
URL = "ws://sim/v1/realtime"


@attrs.define(eq=False)
class RealtimeSlow(Slow):
    """``Slow`` taking OpenAI's items (an OpenAI session has audio)."""

    accepts = frozenset({"conversation.item.create"})
    audio_rate = 24_000


def item(i: int) -> Event:
    content = [{"type": "input_text", "text": f"{i:08}"}]
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": content},
    }


async def flood(session: ClientSession, engine: Slow, count: int) -> list[Event]:
    delivered: list[Event] = []
    engine.expect = count

    async def collect() -> None:
        async for event in session:
            assert event["type"] != "error", event  # a refusal reached the application
            delivered.append(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        for i in range(count):
            await session.send(item(i))
        with trio.fail_after(count * 1.0):
            await engine.all_in.wait()
        nursery.cancel_scope.cancel()
    return delivered


def opened(net: Net) -> Any:
    return connect(URL, options=FAST, open_stream=net.open_stream, dialect="openai")


def assert_exactly_once_in_order(engine: Slow, count: int) -> None:
    assert [e["client_event_seq"] for e in engine.received] == list(range(1, count + 1))
    texts = [int(e["item"]["content"][0]["text"]) for e in engine.received]
    assert texts == list(range(count))


async def test_a_client_streaming_flat_out_is_never_refused(autojump_clock: trio.abc.Clock) -> None:
    factory = OneSlow(RealtimeSlow())
    count = 400
    async with sim_server(ServerConfig(max_pending_input=8), factory) as (_sim, net):
        async with opened(net) as session:
            assert session.limits.max_pending_input == 8  # from the resume object
            delivered = await flood(session, factory.engine, count)
            assert [e for e in delivered if e["type"] == "error"] == []
            assert session.state.rewinds == 0
    assert_exactly_once_in_order(factory.engine, count)


async def test_a_smaller_bound_than_advertised_makes_the_client_resend(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    advertise_more(monkeypatch, 64)
    factory = OneSlow(RealtimeSlow())
    count = 300
    async with sim_server(ServerConfig(max_pending_input=8), factory) as (_sim, net):
        async with opened(net) as session:
            assert session.limits.max_pending_input == 64
            delivered = await flood(session, factory.engine, count)
            assert [e for e in delivered if e["type"] == "error"] == []
            assert session.state.rewinds > 0  # refused (nested error), rewound, resent
    assert_exactly_once_in_order(factory.engine, count)
