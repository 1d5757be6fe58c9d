"""A broken engine ends only its own session: whatever it raises from ``run`` or
``check``, BaseException subclasses included (an engine wrapping asyncio model code can
raise asyncio.CancelledError or KeyboardInterrupt), the server and the other sessions go
on. So does an engine that breaks before its session exists (its factory, its check of
the first message), and one that ignores its cancellation (abandoned after
``engine_stop_timeout_s``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any
from unittest.mock import ANY

import attrs
import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from trio_duplex import BadEvent, Engine, EngineSession, Event, ServerConfig
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import ScriptedEngine, ScriptedFactory, running_server

from ..helpers import echo


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "error",
    [
        KeyboardInterrupt(),
        asyncio.CancelledError(),
        SystemExit(3),
        BaseExceptionGroup("from the engine's own nursery", [KeyboardInterrupt()]),
    ],  # an ordinary Exception: test_protocol_ending.py
    ids=lambda e: type(e).__name__,
)
async def test_whatever_run_raises_ends_only_that_session(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    factory = ScriptedFactory({})
    async with running_server(engine_factory=factory) as sim:
        bystander, _ = await sim.open_session()
        victim, created = await sim.open_session()
        factory.last.fail(error)
        events = await victim.receive_until_closed()
        assert [(e["type"], e["reason"]) for e in events] == [("session.closed", "engine_error")]
        assert victim.close_code == 1011
        assert (await echo(bystander, "unharmed"))["server_event_seq"] == 1
        again, _ = await sim.open_session()
        await echo(again)
    assert errors_logged(caplog) == [f"engine of session {created['session_id']} failed"]


class BrokenCheck(Engine):
    """An engine whose ``check`` fails on the text it is given."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.inner = ScriptedEngine(config)

    def check(self, event: Event) -> None:
        text = event.get("text")
        if text == "refuse":
            raise BadEvent("refused by the engine", param="text")
        if text == "keyboard":
            raise KeyboardInterrupt
        if text == "crash":
            raise ZeroDivisionError("division by zero in check")

    async def run(self, session: EngineSession) -> None:
        await self.inner.run(session)


@pytest.mark.parametrize("text", ["crash", "keyboard"])
async def test_a_check_that_crashes_ends_the_session_as_engine_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    # Was: the exception escaped the connection's reader: close 1011, no event.
    async with running_server(engine_factory=BrokenCheck) as sim:
        bystander, _ = await sim.open_session()
        client, created = await sim.open_session()
        refused = await client.send_and_receive({"type": "input.text.append", "text": "refuse"})
        assert (refused["type"], refused["code"]) == ("error", "bad_event")  # BadEvent: fine
        await client.send({"type": "input.text.append", "text": text})
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
        assert sim.server.slots_held == 1
        assert (await echo(bystander))["server_event_seq"] == 1
    assert errors_logged(caplog) == [f"engine of session {created['session_id']} failed in check"]


# -- an engine that breaks before its session exists ------------------------------------


@attrs.define
class BreakableFactory:
    """Builds echo engines, or raises ``error`` while it is set."""

    error: BaseException | None = None

    def __call__(self, config: Mapping[str, Any]) -> Engine:
        if self.error is not None:
            raise self.error
        return EchoEngine(config)


FIRST_MESSAGES: dict[str, tuple[str, Event | None]] = {
    "update": ("/v1/duplex", {"type": "session.update", "session": {}, "event_id": "e1"}),
    "engine event": ("/v1/duplex", {"type": "input.text.append", "text": "hi", "event_id": "e1"}),
    "autostart": ("/v1/duplex?autostart=1", None),
}


@pytest.mark.parametrize(
    "error",
    [ZeroDivisionError("in the factory"), KeyboardInterrupt(), asyncio.CancelledError()],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("first", list(FIRST_MESSAGES))
async def test_a_factory_that_raises_answers_engine_error_and_holds_no_slot(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, error: BaseException, first: str
) -> None:
    # Was: close 1011 and no error event; a BaseException took the whole server down.
    factory = BreakableFactory()
    path, message = FIRST_MESSAGES[first]
    async with running_server(ServerConfig(max_sessions=1), factory) as sim:
        factory.error = error
        client = await sim.connect(path)
        if message is not None:
            await client.send(message)
        events = await client.receive_until_closed()
        expected: dict[str, Any] = {
            "type": "error",
            "code": "engine_error",
            "message": "the engine failed; no session was opened",
            "retryable": False,
        }
        if message is not None:
            expected["event_id"] = "e1"
        assert events == [expected]
        assert client.close_code == 1011
        assert sim.server.slots_held == 0
        factory.error = None
        again, _ = await sim.open_session()  # max_sessions=1: the slot was never taken
        await echo(again)
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "engine failed in its factory; no session opened"
    assert record.exc_info is not None and record.exc_info[1] is error


@pytest.mark.parametrize("text", ["crash", "keyboard"])
async def test_a_check_that_crashes_on_the_first_message_answers_engine_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    async with running_server(ServerConfig(max_sessions=1), BrokenCheck) as sim:
        client = await sim.connect()
        await client.send({"type": "input.text.append", "text": text, "event_id": "e2"})
        events = await client.receive_until_closed()
        assert [(e["type"], e["code"], e["retryable"], e["event_id"]) for e in events] == [
            ("error", "engine_error", False, "e2")
        ]
        assert client.close_code == 1011
        assert sim.server.slots_held == 0
        await sim.open_session()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (
        record.getMessage() == "engine failed in its check of the first message; no session opened"
    )
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ZeroDivisionError | KeyboardInterrupt)


# -- an engine that ignores its cancellation -----------------------------------------------


def abandoned_line(session_id: str, seconds: float) -> str:
    return (
        f"engine of session {session_id} did not return within {seconds}s of its "
        "cancellation; abandoned (its task is left running, the session ends without it)"
    )


async def test_an_engine_that_ignores_cancellation_is_abandoned_after_the_stop_timeout(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Was: the session never ended (no session.closed) and held its slot for ever.
    factory = ScriptedEngine.factory(hold_teardown=True)  # shielded until released
    config = ServerConfig(max_sessions=1)  # engine_stop_timeout_s: 5 by default
    async with running_server(config, factory) as sim:
        client, created = await sim.open_session()
        session_id = created["session_id"]
        stuck = factory.last
        await client.send({"type": "session.close"})
        start = trio.current_time()
        events = await client.receive_until_closed()
        assert trio.current_time() - start == pytest.approx(5)
        assert events == [
            {
                "type": "session.closed",
                "session_id": session_id,
                "reason": "client_close",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1000
        assert stuck.tearing_down.is_set() and not stuck.teardown_gate.is_set()  # type: ignore[union-attr]
        assert sim.server.slots_held == 0
        assert sim.server.sessions.runner(session_id) is None
        assert sim.server.abandoned_engines == 1
        other, _ = await sim.open_session()  # max_sessions=1: the slot is free
        assert errors_logged(caplog) == [abandoned_line(session_id, 5.0)]

        stuck.release_teardown()  # it returns at last: nothing is done twice
        await wait_all_tasks_blocked()
        assert sim.server.abandoned_engines == 0
        assert sim.server.slots_held == 1
        assert len(sim.probe.queued_for(session_id)) == 1  # type: ignore[union-attr]
        assert (await echo(other))["server_event_seq"] == 1  # nothing else arrived there
        factory.last.release_teardown()  # lets the other one end promptly at the exit
    assert errors_logged(caplog) == [abandoned_line(session_id, 5.0)]


@pytest.mark.parametrize("how", ["begin_shutdown", "cancelled"])
async def test_the_server_returns_despite_an_engine_that_ignores_cancellation(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # Was: DuplexServer.run waited for the engine for ever (here: its hour-long shield).
    factory = ScriptedEngine.factory(hold_teardown=True)
    config = ServerConfig(drain_timeout_s=2)  # and engine_stop_timeout_s 5
    got: list[Event] = []
    async with running_server(config, factory) as sim:
        client, created = await sim.open_session()
        session_id = created["session_id"]
        start = trio.current_time()
        if how == "begin_shutdown":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sim.shutdown)
                got = await client.receive_until_closed()
                assert trio.current_time() - start == pytest.approx(2 + 5)
            assert client.close_code == 1001
        # else: leaving the block cancels DuplexServer.run
    assert sim.stopped.is_set()
    # Shut down: the 2 s drain, then 5 s for the engine. Cancelled: the connection's
    # bounded close first (2 s: its client was cancelled too), then 5 s for the engine.
    assert trio.current_time() - start == pytest.approx(2 + 5)
    if how == "begin_shutdown":
        assert got == [
            {"type": "session.going_away", "time_left_ms": 2000},
            {
                "type": "session.closed",
                "session_id": session_id,
                "reason": "server_shutdown",
                "usage": ANY,
            },
        ]
    assert sim.server.slots_held == 0
    assert sim.server.abandoned_engines == 1
    assert errors_logged(caplog) == [abandoned_line(session_id, 5.0)]
    factory.last.release_teardown()
    await wait_all_tasks_blocked()
    assert sim.server.abandoned_engines == 0
