"""A broken engine ends only its own session: whatever it raises from ``run`` or
``check``, BaseException subclasses included (an engine wrapping asyncio model code can
raise asyncio.CancelledError or KeyboardInterrupt), the server and the other sessions go
on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from trio.testing import MockClock

from trio_duplex import BadEvent, Engine, EngineSession, Event
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
            }
        ]
        assert client.close_code == 1011
        assert sim.server.slots_held == 1
        assert (await echo(bystander))["server_event_seq"] == 1
    assert errors_logged(caplog) == [f"engine of session {created['session_id']} failed in check"]
