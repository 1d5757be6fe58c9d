"""``Engine.prepare``: an engine that gets ready before its client hears
``session.created`` (the realtime proxy connects its upstream there). What it refuses,
raises or never finishes refuses the open with no session and no slot held; what it
starts in its nursery lives exactly as long as the session's engine."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from trio_duplex import EngineSession, Event, ProtocolError, ServerConfig
from trio_duplex.core.events import ErrorCode
from trio_duplex.engines.api import prepares
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.sessions.owner import PREPARE_TIMEOUT_S
from trio_duplex.testing import Simulation, running_server

from ..helpers import echo


class Readying(EchoEngine):
    """Echo, after a ``prepare`` that does what the test set: refuse, raise, hang, or
    start a background task in its nursery that runs until cancelled."""

    instances: list[Readying] = []  # (per test: reset by the fixture)
    mode = "ok"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.prepared = False
        self.background_running = False
        self.background_cancelled = trio.Event()
        self.prepare_cancelled = False
        self.ran = False
        Readying.instances.append(self)

    async def prepare(self, nursery: trio.Nursery) -> None:
        if self.mode == "refuse":
            raise ProtocolError.not_ready("the model is busy")
        if self.mode == "raise":
            raise ZeroDivisionError("in prepare")
        if self.mode == "hang":
            try:
                await trio.sleep_forever()
            finally:
                self.prepare_cancelled = True
        if self.mode == "crash later":
            nursery.start_soon(self._crash)
        nursery.start_soon(self._background)
        await trio.lowlevel.checkpoint()
        self.prepared = True

    async def _background(self) -> None:
        self.background_running = True
        try:
            await trio.sleep_forever()
        finally:
            self.background_running = False
            self.background_cancelled.set()

    async def _crash(self) -> None:
        await trio.sleep(1)
        raise OSError("the prepared connection broke")

    async def run(self, session: EngineSession) -> None:
        assert self.prepared and self.background_running  # ready before run
        self.ran = True
        await super().run(session)


@pytest.fixture(autouse=True)
def fresh() -> None:
    Readying.instances = []
    Readying.mode = "ok"


async def refused_open(sim: Simulation, close_code: int) -> Event:
    """Open a session that is refused: its one event (an error), the close code checked,
    and no slot held afterwards."""
    client = await sim.connect()
    await client.send({"type": "session.update", "session": {}})
    events = await client.receive_until_closed()
    assert [e["type"] for e in events] == ["error"]
    assert client.close_code == close_code
    assert sim.server.slots_held == 0
    return events[0]


def test_prepares_says_which_engines_override_prepare() -> None:
    assert prepares(Readying({}))
    assert not prepares(EchoEngine({}))


async def test_what_prepare_starts_lives_until_the_session_ends(
    autojump_clock: MockClock,
) -> None:
    async with running_server(engine_factory=Readying) as sim:
        client, _ = await sim.open_session()
        (engine,) = Readying.instances
        assert engine.ran
        await echo(client, "hello")
        await trio.sleep(1)  # later on: the prepared task still runs with the session
        assert engine.background_running
        await client.send({"type": "session.close"})
        await client.receive_until_closed()
        with trio.fail_after(5):
            await engine.background_cancelled.wait()
        assert sim.server.slots_held == 0


async def test_a_refusing_prepare_refuses_the_open_retryable_and_holds_no_slot(
    autojump_clock: MockClock,
) -> None:
    Readying.mode = "refuse"
    async with running_server(ServerConfig(max_sessions=1), Readying) as sim:
        refused = await refused_open(sim, 1013)
        assert (refused["code"], refused["retryable"]) == (ErrorCode.RESOURCE_EXHAUSTED, True)
        assert refused["message"] == "the model is busy; try again"
        assert not Readying.instances[0].ran
        Readying.mode = "ok"
        again, _ = await sim.open_session()  # max_sessions=1: the slot came back
        await echo(again)


async def test_a_prepare_that_raises_refuses_the_open_as_engine_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    Readying.mode = "raise"
    async with running_server(ServerConfig(max_sessions=1), Readying) as sim:
        assert (await refused_open(sim, 1011))["code"] == "engine_error"
        Readying.mode = "ok"
        bystander, _ = await sim.open_session()
        await echo(bystander)
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "engine failed in its prepare; no session opened"
    assert record.exc_info is not None and isinstance(record.exc_info[1], ZeroDivisionError)


async def test_a_prepare_that_never_finishes_is_refused_after_the_timeout(
    autojump_clock: MockClock,
) -> None:
    Readying.mode = "hang"
    async with running_server(ServerConfig(max_sessions=1), Readying) as sim:
        start = trio.current_time()
        refused = await refused_open(sim, 1013)
        assert trio.current_time() - start == pytest.approx(PREPARE_TIMEOUT_S)
        assert (refused["code"], refused["retryable"]) == ("resource_exhausted", True)
        assert Readying.instances[0].prepare_cancelled


async def test_a_client_gone_during_prepare_cancels_it_and_frees_the_slot(
    autojump_clock: MockClock,
) -> None:
    Readying.mode = "hang"
    async with running_server(ServerConfig(max_sessions=1), Readying) as sim:
        client = await sim.connect()
        await client.send({"type": "session.update", "session": {}})
        await wait_all_tasks_blocked()
        assert sim.server.slots_held == 1  # admitted, preparing
        await client.aclose()
        with trio.fail_after(5):
            while sim.server.slots_held:
                await sim.server.wait_changed()
        assert Readying.instances[0].prepare_cancelled
        assert not Readying.instances[0].ran


async def test_a_failure_of_what_prepare_started_is_contained(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    Readying.mode = "crash later"
    async with running_server(engine_factory=Readying) as sim:
        client, _ = await sim.open_session()
        await trio.sleep(2)  # the crash (at 1 s) has happened
        assert "what an engine started in its prepare failed" in caplog.text
        # The server and the session go on: its engine finds out for itself (this one
        # did not need what crashed).
        assert (await echo(client, "still here"))["server_event_seq"] == 1
        Readying.mode = "ok"
        other, _ = await sim.open_session()
        await echo(other)
