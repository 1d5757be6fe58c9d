"""Input flow control (protocol v2) end to end: ``ClientSession.send`` paces itself by
``session.created.limits`` and the server's ``input.consumed`` reports, against the real
server in memory, with an engine slower than the client.

* A client streaming as fast as it can is never refused, and the engine gets every
  event once, in order (by event count, and by bytes).
* Against a server whose bound is smaller than it advertises, the client is refused,
  rewinds and resends from the refused seq: still every event once, in order, and no
  error reaches the application.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_duplex import ServerConfig
from trio_duplex.client import ClientSession

from .helpers import OneSlow, Slow, advertise_more, client_for, sim_server

Event = dict[str, Any]


async def flood(session: ClientSession, engine: Slow, count: int, size: int) -> list[Event]:
    """Send ``count`` events as fast as ``send`` lets us while collecting whatever the
    session delivers; returns that once the engine has taken them all."""
    delivered: list[Event] = []
    engine.expect = count

    async def collect() -> None:
        async for event in session:
            delivered.append(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        for i in range(count):
            await session.send({"type": "input.text.append", "text": f"{i:08}".ljust(size, "x")})
        with trio.fail_after(count * 1.0):
            await engine.all_in.wait()
        nursery.cancel_scope.cancel()
    return delivered


def assert_exactly_once_in_order(engine: Slow, count: int) -> None:
    assert [e["client_event_seq"] for e in engine.received] == list(range(1, count + 1))
    assert [int(e["text"][:8]) for e in engine.received] == list(range(count))


@pytest.mark.parametrize(
    ("config", "size"),
    [
        (ServerConfig(max_pending_input=8), 10),  # paced by the event bound
        (ServerConfig(max_pending_input=256, max_input_bytes=20_000), 5000),  # by bytes
        (ServerConfig(max_pending_input=256, max_input_bytes=8000), 5000),  # over half of it
        (ServerConfig(max_pending_input=1, max_input_bytes=1), 10),  # the smallest bounds
    ],
)
async def test_a_client_streaming_flat_out_is_never_refused_and_loses_nothing(
    autojump_clock: trio.abc.Clock, config: ServerConfig, size: int
) -> None:
    count = 2000 if size < 1000 else 300
    factory = OneSlow()
    async with sim_server(config, factory) as (_sim, net):
        async with client_for(net) as session:
            assert session.limits.max_pending_input == config.max_pending_input
            assert session.limits.max_pending_input_bytes == config.max_input_bytes
            delivered = await flood(session, factory.engine, count, size)
            assert [e for e in delivered if e["type"] == "error"] == []
            assert session.state.rewinds == 0
            # Paced by the reports: the last ones came (fewer than a bound is unreported).
            await trio.testing.wait_all_tasks_blocked()
            assert count - session.state.consumed_seq < config.max_pending_input
    assert_exactly_once_in_order(factory.engine, count)


async def test_a_server_with_a_smaller_bound_makes_the_client_resend_from_the_refused_seq(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server queues 8 events but advertises 64 (say, a proxy rewrote the limits):
    # the client overruns it, is refused, and rewinds; nothing is lost or reordered.
    advertise_more(monkeypatch, 64)
    factory = OneSlow()
    count = 500
    async with sim_server(ServerConfig(max_pending_input=8), factory) as (_sim, net):
        async with client_for(net) as session:
            assert session.limits.max_pending_input == 64
            delivered = await flood(session, factory.engine, count, 10)
            assert [e for e in delivered if e["type"] == "error"] == []
            assert session.state.rewinds > 0
    assert_exactly_once_in_order(factory.engine, count)
