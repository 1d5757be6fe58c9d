"""docs/protocol.md, Disconnect, grace and expiry, through the shell: what loss of a
connection is (a close frame, a cut, a failed send, an unanswered ping), the engine running
on while detached and cancelled at the end, a timer's expiry delivered on the wire, and
timers racing client events and the engine for the one terminal event.

The rules themselves (grace lengths and their restart, the unconfirmed grace and what
earns the whole one, idle expiry and what resets its clock, an expiry at the instant of a
resume) are tested on the core with time as a number: tests/core/test_expiry.py and
tests/core/test_session.py.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, ScriptedFactory, Simulation, running_server

from ..helpers import RawWs, state_of


def scripted_factory(engines: list[ScriptedEngine], **kwargs: Any) -> ScriptedFactory:
    return ScriptedFactory(kwargs, engines)  # every engine it builds lands in ``engines``


# -- what detaches ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["close-frame", "close-frame-4999", "cut"])
async def test_losing_the_connection_detaches_the_session(
    autojump_clock: MockClock, how: str
) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        session_id = created["session_id"]
        if how == "cut":
            await client.transport.cut()
        else:
            await client.aclose(1000 if how == "close-frame" else 4999)
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, session_id) == "detached"
        assert sim.server.slots_held == 1
        # The engine keeps running and its output is journaled.
        assert not engine.cancelled
        await engine.emit("while detached")
        client2, resumed = await sim.resume(session_id, created["resume_token"])
        assert resumed["type"] == "session.resumed"
        replayed = await client2.receive()
        assert (replayed["text"], replayed["server_event_seq"]) == ("while detached", 1)


async def test_a_failed_send_detaches_the_session(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        client.transport.fail_sends = True  # the write half breaks; reads still work
        await engine.emit("lost in transit")
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, created["session_id"]) == "detached"
        client2, _ = await sim.resume(created["session_id"], created["resume_token"])
        replayed = await client2.receive()
        assert (replayed["text"], replayed["server_event_seq"]) == ("lost in transit", 1)


async def test_an_unanswered_ping_detaches_the_session(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    config = ServerConfig(ping_interval_s=5, ping_timeout_s=3, disconnect_grace_s=10)
    async with running_server(config) as sim:
        client = await raw_ws(sim, answer_pings=False)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        await client.send({"type": "session.heartbeat"})  # it spoke: the whole grace
        assert (await client.receive())["type"] == "session.heartbeat_ack"
        start = trio.current_time()
        await trio.sleep(7.9)
        assert state_of(sim, created["session_id"]) == "attached"
        await trio.sleep(0.2)
        assert state_of(sim, created["session_id"]) == "detached"
        # ... and the grace runs from the loss: 8 + 10.
        await trio.sleep(9.8)
        assert state_of(sim, created["session_id"]) == "detached"
        await trio.sleep(0.2)
        assert state_of(sim, created["session_id"]) is None
        assert trio.current_time() - start == pytest.approx(18.1)


async def test_answered_pings_keep_the_session_attached(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    config = ServerConfig(ping_interval_s=5, ping_timeout_s=3)
    async with running_server(config) as sim:
        client = await raw_ws(sim)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        with trio.move_on_after(60):
            await client.receive()  # answers pings while waiting
        assert client.pings >= 11
        assert state_of(sim, created["session_id"]) == "attached"


# -- the grace period, the unconfirmed grace ------------------------------------------------


async def test_engine_is_cancelled_when_the_grace_expires(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(disconnect_grace_s=5)
    async with running_server(config, scripted_factory(engines)) as sim:
        client, _ = await sim.open_session()
        (engine,) = engines
        await client.transport.cut()
        await trio.sleep(4)
        assert not engine.cancelled
        await trio.sleep(2)
        assert engine.cancelled


async def expires_at(sim: Simulation, created: dict[str, Any], seconds: float) -> None:
    """The detached session ends exactly ``seconds`` from now, as a grace expiry."""
    session_id = created["session_id"]
    session = sim.session(session_id)
    assert session is not None and state_of(sim, session_id) == "detached"
    await trio.sleep(seconds - 0.1)
    assert state_of(sim, session_id) == "detached"
    await trio.sleep(0.2)
    assert state_of(sim, session_id) is None  # ended, its slot free
    assert session.terminal is not None
    assert session.terminal.event == {
        "type": "session.expired",
        "session_id": created["session_id"],
        "reason": "disconnect_grace_expired",
        "usage": ANY,
    }
    assert sim.server.slots_held == 0
    _, answer = await sim.resume(created["session_id"], created["resume_token"])
    assert answer["code"] == "session_resume_expired"


@pytest.mark.parametrize(
    "opening", [{"type": "session.heartbeat"}, {"type": "input.text.append", "text": "x"}]
)
async def test_the_message_that_opened_the_session_does_not_count(
    autojump_clock: MockClock, opening: dict[str, Any]
) -> None:
    """It was sent before session.created: it does not show the client received it."""
    async with running_server(ServerConfig(disconnect_grace_s=30)) as sim:
        client = await sim.connect()
        created = await client.send_and_receive(opening)
        assert created["type"] == "session.created"
        await client.receive()  # its answer (heartbeat_ack, or the echo)
        await client.send_raw("{")  # invalid JSON: no event decoded, nothing shown either
        assert (await client.receive())["code"] == "invalid_json"
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        await expires_at(sim, created, 5)


# -- idle expiry -----------------------------------------------------------------------------


async def test_idle_ttl_expires_an_attached_session(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(idle_ttl_s=50)) as sim:
        client, created = await sim.open_session()
        start = trio.current_time()
        events = await client.receive_until_closed()
        assert events == [
            {
                "type": "session.expired",
                "session_id": created["session_id"],
                "reason": "idle_ttl_expired",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1000
        assert trio.current_time() - start == pytest.approx(50)
        assert sim.server.slots_held == 0


async def test_idle_expiry_cancels_the_engine_and_frees_the_slot(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(idle_ttl_s=5, max_sessions=1)
    async with running_server(config, scripted_factory(engines)) as sim:
        client, _ = await sim.open_session()
        await client.receive_until_closed()
        assert engines[0].cancelled
        assert sim.server.slots_held == 0
        await sim.open_session()


# -- exactly one terminal event --------------------------------------------------------------


async def test_close_racing_engine_finish_gives_one_terminal_event(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    factory = scripted_factory(engines, finish_on="stop")
    async with running_server(engine_factory=factory) as sim:
        client, _ = await sim.open_session()
        await client.send({"type": "input.text.append", "text": "stop"})
        await client.send({"type": "session.close"})
        events = await client.receive_until_closed()
        terminal = [e for e in events if e["type"] in {"session.closed", "session.expired"}]
        assert len(terminal) == 1, events
        assert terminal[0]["reason"] in {"engine_finished", "client_close"}
        assert events[-1] is terminal[0]
        assert client.close_code == 1000


async def test_close_at_the_idle_deadline_gives_one_terminal_event(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(idle_ttl_s=10)) as sim:
        client, _ = await sim.open_session()
        await trio.sleep(10)  # the expiry and the close race at the same instant
        await client.send({"type": "session.close"})
        events = await client.receive_until_closed()
        assert len(events) == 1, events
        assert events[0]["type"] in {"session.closed", "session.expired"}
        assert sim.server.slots_held == 0


async def test_engine_blocked_on_a_slow_client_runs_on_once_detached(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(max_pending_output=4)
    async with running_server(config, scripted_factory(engines)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        client.transport.hold()  # the client reads nothing any more
        emitted = 0
        all_emitted = trio.Event()

        async def produce() -> None:
            nonlocal emitted
            for n in range(20):
                await engine.emit(str(n))
                emitted += 1
            all_emitted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await trio.sleep(1)
            assert emitted < 20  # backpressure: the engine waits for the connection
            await client.transport.cut()
            # Detached: the engine keeps running and its output goes to the journal.
            with trio.fail_after(1):
                await all_emitted.wait()
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 0)
        replayed = [(await client2.receive())["server_event_seq"] for _ in range(20)]
        assert replayed == list(range(1, 21))
