"""docs/protocol.md, Ending and Close codes, as the shell carries them out: the engine task
returning or raising (engine_finished, engine_error), what reaches the client and in which
order, server shutdown with its drain (going_away, its timing, detached sessions ending at
once, resumes and opens racing it), and failures inside one connection that must not take
down the server.

The rules themselves are plain tests of the core (no trio, time as a number): which
terminal event, reason and close code a session ends with, exactly once, to which
attachment, and that the slot is held until release, in tests/core/test_session.py; the
refusals while shutting down (server_shutting_down, 1001, retryable, echoing the
event_id) in tests/core/test_session.py and tests/core/test_event_id.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from unittest.mock import ANY

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.engines.api import Engine, EngineFactory, EngineSession, Event
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.server import DuplexServer
from trio_duplex.testing import (
    MemoryListener,
    ScriptedEngine,
    ScriptedFactory,
    Simulation,
    running_server,
)

from ..helpers import echo


def scripted_factory(engines: list[ScriptedEngine], **kwargs: Any) -> ScriptedFactory:
    return ScriptedFactory(kwargs, engines)  # every engine it builds lands in ``engines``


@asynccontextmanager
async def serving(
    config: ServerConfig, engine_factory: EngineFactory = EchoEngine
) -> AsyncIterator[tuple[Simulation, trio.Event]]:
    """Like ``running_server``, but the test can see when ``DuplexServer.run`` returns."""
    server = DuplexServer(config, engine_factory)
    listener = MemoryListener.create()
    finished = trio.Event()

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await server.run([listener], task_status=task_status)
        finished.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        yield Simulation(server, listener, nursery), finished
        nursery.cancel_scope.cancel()


# -- the engine ends the session ---------------------------------------------------------------


async def test_engine_returning_ends_with_engine_finished_and_1000(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines, finish_on="bye")) as sim:
        client, created = await sim.open_session()
        await echo(client, "hello")
        await client.send({"type": "input.text.append", "text": "bye"})
        events = await client.receive_until_closed()
        assert events == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "engine_finished",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1000
        assert sim.server.slots_held == 0


async def test_engine_raising_ends_with_engine_error_and_1011(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines, fail_on="boom")) as sim:
        client, created = await sim.open_session()
        await echo(client, "fine")
        await client.send({"type": "input.text.append", "text": "boom"})
        events = await client.receive_until_closed()
        assert events == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "engine_error",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1011
        assert sim.server.slots_held == 0
        # Only that session ended.
        other, _ = await sim.open_session()
        await echo(other)


class ControlSender(Engine):
    """An engine that tries to send a control event: the engine API refuses it."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        pass

    async def run(self, session: EngineSession) -> None:
        async for _ in session:
            await session.send({"type": "session.closed", "reason": "forged"})


async def test_engine_cannot_forge_control_events(autojump_clock: MockClock) -> None:
    async with running_server(engine_factory=ControlSender) as sim:
        client, _ = await sim.open_session()
        await client.send({"type": "input.text.append", "text": "x"})
        events = await client.receive_until_closed()
        assert [(e["type"], e["reason"]) for e in events] == [("session.closed", "engine_error")]
        assert client.close_code == 1011


async def test_engine_finishing_while_detached_ends_the_session(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines, finish_on="bye")) as sim:
        client, created = await sim.open_session()
        await client.send({"type": "input.text.append", "text": "bye"})
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        assert sim.server.slots_held == 0
        client2, answer = await sim.resume(created["session_id"], created["resume_token"])
        assert answer["code"] == "session_resume_expired"
        await client2.receive_until_closed()
        assert client2.close_code == 4001


async def test_engine_error_during_output_keeps_earlier_output_first(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines, fail_on="boom")) as sim:
        client, _ = await sim.open_session()
        await client.send({"type": "input.text.append", "text": "a"})
        await client.send({"type": "input.text.append", "text": "b"})
        await client.send({"type": "input.text.append", "text": "boom"})
        events = await client.receive_until_closed()
        assert [e.get("text", e["type"]) for e in events] == ["a", "b", "session.closed"]
        assert [e.get("server_event_seq") for e in events] == [1, 2, None]


# -- server shutdown ---------------------------------------------------------------------------


async def test_shutdown_warns_refuses_then_closes_every_session(autojump_clock: MockClock) -> None:
    config = ServerConfig(drain_timeout_s=5, disconnect_grace_s=60)
    async with serving(config) as (sim, finished):
        attached, a = await sim.open_session()
        await echo(attached, "before")
        lost, b = await sim.open_session()
        await lost.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        sim.server.begin_shutdown()

        going = await attached.receive()
        assert going == {"type": "session.going_away", "time_left_ms": 5000}

        # New opens and resumes are refused, retryably, with 1001.
        openings: list[tuple[str, dict[str, Any] | None]] = [
            ("/v1/duplex", {"type": "session.update", "session": {}}),
            ("/v1/duplex", {"type": "input.text.append", "text": "x"}),
            ("/v1/duplex?autostart=1", None),
            (
                "/v1/duplex",
                {
                    "type": "session.resume",
                    "session_id": b["session_id"],
                    "resume_token": b["resume_token"],
                    "event_id": "during-drain",
                },
            ),
        ]
        for path, first in openings:
            refused = await sim.connect(path)
            if first is not None:
                await refused.send(first)
            events = await refused.receive_until_closed()
            assert [(e["type"], e["code"], e["retryable"]) for e in events] == [
                ("error", "server_shutting_down", True)
            ]
            assert refused.close_code == 1001
            if first is not None and "event_id" in first:
                assert events[0]["event_id"] == "during-drain"

        # Attached sessions go on during the drain; the detached one ended at once.
        assert (await echo(attached, "during"))["server_event_seq"] == 2
        assert sim.server.slots_held == 1

        events = await attached.receive_until_closed()
        assert events == [
            {
                "type": "session.closed",
                "session_id": a["session_id"],
                "reason": "server_shutdown",
                "usage": ANY,
            }
        ]
        assert attached.close_code == 1001
        assert trio.current_time() - start == pytest.approx(5)
        assert sim.server.slots_held == 0
        assert not sim.server.sessions.registry.sessions
        with trio.fail_after(3):
            await finished.wait()


async def test_detached_sessions_end_at_once_when_the_drain_begins(
    autojump_clock: MockClock,
) -> None:
    # A detached session cannot resume during the drain: it must not hold it.
    engines: list[ScriptedEngine] = []
    config = ServerConfig(drain_timeout_s=30, disconnect_grace_s=60)
    async with serving(config, scripted_factory(engines)) as (sim, finished):
        client, created = await sim.open_session()
        session = sim.server.sessions.registry.sessions[created["session_id"]]
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        assert session.state.value == "detached"
        start = trio.current_time()
        sim.server.begin_shutdown()
        with trio.fail_after(1):
            await finished.wait()
        assert trio.current_time() - start < 0.1
        assert session.terminal is not None
        assert session.terminal.event == {
            "type": "session.closed",
            "session_id": created["session_id"],
            "reason": "server_shutdown",
            "usage": ANY,
        }
        assert engines[0].cancelled
        assert sim.server.slots_held == 0


async def test_a_session_detaching_during_the_drain_ends_at_once(
    autojump_clock: MockClock,
) -> None:
    config = ServerConfig(drain_timeout_s=30, disconnect_grace_s=60)
    async with serving(config) as (sim, finished):
        client, created = await sim.open_session()
        session = sim.server.sessions.registry.sessions[created["session_id"]]
        sim.server.begin_shutdown()
        assert (await client.receive())["type"] == "session.going_away"
        await trio.sleep(3)
        assert not finished.is_set()  # attached: it may go on until the deadline
        start = trio.current_time()
        await client.transport.cut()
        with trio.fail_after(1):
            await finished.wait()
        assert trio.current_time() - start < 0.1
        assert session.terminal is not None and session.terminal.reason == "server_shutdown"
        assert sim.server.slots_held == 0


async def test_a_resume_begun_before_the_drain_that_fails_ends_the_session_at_once(
    autojump_clock: MockClock,
) -> None:
    config = ServerConfig(drain_timeout_s=30, disconnect_grace_s=60)
    async with serving(config) as (sim, finished):
        old, created = await sim.open_session()
        session = sim.server.sessions.registry.sessions[created["session_id"]]
        await old.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        resuming = await sim.connect()
        resuming.transport.hold()
        await resuming.send(
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
            }
        )
        await resuming.transport.wait_held()
        sim.server.begin_shutdown()
        await trio.sleep(1)
        assert session.terminal is None  # its resume may still complete
        start = trio.current_time()
        await resuming.transport.cut()  # the replay's write fails: detached again
        with trio.fail_after(1):
            await finished.wait()
        assert trio.current_time() - start < 0.1
        assert session.terminal is not None and session.terminal.reason == "server_shutdown"


async def test_going_away_is_sent_once_and_carries_no_seq(autojump_clock: MockClock) -> None:
    async with serving(ServerConfig(drain_timeout_s=3)) as (sim, finished):
        client, _ = await sim.open_session()
        sim.server.begin_shutdown()
        sim.server.begin_shutdown()
        events = await client.receive_until_closed()
        assert [e["type"] for e in events] == ["session.going_away", "session.closed"]
        assert "server_event_seq" not in events[0]
        assert events[0]["time_left_ms"] == 3000
        with trio.fail_after(3):
            await finished.wait()


async def test_shutdown_finishes_early_once_no_session_remains(autojump_clock: MockClock) -> None:
    async with serving(ServerConfig(drain_timeout_s=30)) as (sim, finished):
        client, _ = await sim.open_session()
        start = trio.current_time()
        sim.server.begin_shutdown()
        assert (await client.receive())["type"] == "session.going_away"
        await trio.sleep(2)
        await client.send({"type": "session.close"})
        events = await client.receive_until_closed()
        assert events[-1]["reason"] == "client_close"
        assert client.close_code == 1000
        with trio.fail_after(5):
            await finished.wait()
        # Well before the 30 s drain (the last connection may take close_timeout_s = 2 s).
        assert trio.current_time() - start <= 2 + sim.server.close_timeout_s + 0.1


async def test_shutdown_without_sessions_finishes_at_once(autojump_clock: MockClock) -> None:
    async with serving(ServerConfig(drain_timeout_s=30)) as (sim, finished):
        start = trio.current_time()
        sim.server.begin_shutdown()
        with trio.fail_after(1):
            await finished.wait()
        assert trio.current_time() - start < 1


async def test_shutdown_closes_a_connection_still_waiting_for_its_first_message(
    autojump_clock: MockClock,
) -> None:
    async with serving(ServerConfig(drain_timeout_s=1, config_timeout_s=60)) as (sim, finished):
        waiting = await sim.connect()
        sim.server.begin_shutdown()
        with trio.fail_after(5):
            await finished.wait()
            await waiting.receive_until_closed()
        assert waiting.close_code in {1001, 1006}


@pytest.mark.parametrize("attached", [False, True], ids=["detached", "attached"])
async def test_session_ending_during_a_resume(autojump_clock: MockClock, attached: bool) -> None:
    # docs/protocol.md: if a connection was attached, the terminal event goes to it and the
    # resumer gets session_resume_expired + 4001; if the session was detached, the resumer
    # (which already has session.resumed) gets the terminal event and its close code.
    async with serving(ServerConfig(drain_timeout_s=2)) as (sim, finished):
        old, created = await sim.open_session()
        if not attached:
            await old.transport.cut()
            await trio.testing.wait_all_tasks_blocked()
        resuming = await sim.connect()
        gate = resuming.transport.hold()
        await resuming.send(
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
            }
        )
        await trio.testing.wait_all_tasks_blocked()
        sim.server.begin_shutdown()  # the drain ends while the resume is held
        await trio.sleep(2.5)
        gate.set()
        with trio.fail_after(5):
            await finished.wait()
            events = await resuming.receive_until_closed()
        closed = {
            "type": "session.closed",
            "session_id": created["session_id"],
            "reason": "server_shutdown",
            "usage": ANY,
        }
        if attached:
            assert await old.receive_until_closed() == [
                {"type": "session.going_away", "time_left_ms": 2000},
                closed,
            ]
            assert old.close_code == 1001
            assert [e["type"] for e in events] == ["session.resumed", "error"]
            assert events[-1]["code"] == "session_resume_expired"
            assert resuming.close_code == 4001
        else:
            assert events[0]["type"] == "session.resumed"
            assert events[1:] == [closed]
            assert resuming.close_code == 1001
        assert sim.server.slots_held == 0
        assert not sim.server.sessions.registry.sessions


# -- failures inside one connection ---------------------------------------------------------------


class CheckExplodes(EchoEngine):
    """Its field check raises something that is not a protocol error."""

    def check(self, event: Event) -> None:
        if event.get("text") == "explode":
            raise RuntimeError("a bug in an engine's check")
        super().check(event)


def factory_explodes(config: Mapping[str, Any]) -> EchoEngine:
    if config.get("explode"):
        raise RuntimeError("a bug in the engine factory")
    return EchoEngine(config)


async def test_exception_in_an_engine_check_ends_that_session_only(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=CheckExplodes) as sim:
        bystander, _ = await sim.open_session()
        victim, created = await sim.open_session()
        await victim.send({"type": "input.text.append", "text": "explode"})
        events = await victim.receive_until_closed()
        assert [(e["type"], e["reason"]) for e in events] == [("session.closed", "engine_error")]
        assert victim.close_code == 1011
        assert sim.session(created["session_id"]) is None  # ended, its slot free
        assert (await echo(bystander))["server_event_seq"] == 1
        new, _ = await sim.open_session()
        await echo(new)
        _, refused = await sim.resume(created["session_id"], created["resume_token"])
        assert refused["code"] == "session_resume_expired"


async def test_exception_in_the_engine_factory_does_not_take_down_the_server(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=factory_explodes) as sim:
        client = await sim.connect()
        await client.send({"type": "session.update", "session": {"explode": True}})
        await client.receive_until_closed()
        assert client.close_code == 1011
        assert sim.server.slots_held == 0
        other, _ = await sim.open_session()
        await echo(other)


async def test_many_failing_connections_do_not_take_down_the_server(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=CheckExplodes) as sim:
        for _ in range(20):
            victim, _ = await sim.open_session()
            await victim.send({"type": "input.text.append", "text": "explode"})
            await victim.receive_until_closed()
            assert victim.close_code == 1011
        client, _ = await sim.open_session()
        await echo(client)


@pytest.mark.parametrize("kind", ["open", "resume"])
async def test_client_attached_during_the_drain_gets_going_away(
    autojump_clock: MockClock, kind: str
) -> None:
    async with serving(ServerConfig(drain_timeout_s=5)) as (sim, _finished):
        late = await sim.connect()
        if kind == "open":
            gate = late.transport.hold()  # admitted before the shutdown, delivered after
            await late.send({"type": "session.update", "session": {}})
        else:
            lost, created = await sim.open_session()
            await lost.transport.cut()
            await trio.testing.wait_all_tasks_blocked()
            gate = late.transport.hold()  # resume begun before the shutdown
            await late.send(
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                }
            )
        await trio.testing.wait_all_tasks_blocked()
        sim.server.begin_shutdown()
        await trio.sleep(1)
        gate.set()
        events = await late.receive_until_closed()
        assert [e["type"] for e in events][1:] == ["session.going_away", "session.closed"]
        assert 0 < events[1]["time_left_ms"] <= 5000
        assert events[2]["reason"] == "server_shutdown"
        assert late.close_code == 1001


@pytest.mark.parametrize("ending", ["drain-deadline", "last-session-closes"])
async def test_server_stops_as_soon_as_the_drain_is_over(
    autojump_clock: MockClock, ending: str
) -> None:
    async with serving(ServerConfig(drain_timeout_s=5)) as (sim, finished):
        client, _ = await sim.open_session()
        sim.server.begin_shutdown()
        assert (await client.receive())["type"] == "session.going_away"
        if ending == "last-session-closes":
            await trio.sleep(1)
            await client.send({"type": "session.close"})
        await client.receive_until_closed()  # our client answers the close frame at once
        ended = trio.current_time()
        with trio.fail_after(5):
            await finished.wait()
        # Nothing is left to wait for: not the 2 s close timeout of a finished handshake.
        assert trio.current_time() - ended < 0.5
