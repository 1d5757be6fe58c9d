"""JSON a hostile client may send: refused as it is read, with a typed error, and
nothing else happens (no 1011, no session ended, no traceback in the log)."""

from __future__ import annotations

import logging

import pytest
from trio.testing import MockClock

from trio_duplex.dialects.jsonwire import MAX_DEPTH
from trio_duplex.testing import running_server

from ..helpers import echo, state_of

NAN_UPDATE = '{"type":"session.update","session":{"gain":NaN}}'


async def test_a_first_message_with_nan_is_invalid_json_and_the_connection_stays(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send_raw(NAN_UPDATE)
        error = await client.receive()
        assert (error["type"], error["code"]) == ("error", "invalid_json")
        assert sim.server.slots_held == 0
        created = await client.send_and_receive({"type": "session.update", "session": {}})
        assert created["type"] == "session.created"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize(
    "text",
    [
        NAN_UPDATE,
        '{"type":"session.update","session":{"gain":1e999999}}',
        '{"type":"input.text.append","text":"x","n":-Infinity}',
        '{"type":"session.update","session":{"deep":' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}}",
        '{"type":"input.text.append","text":"x","v":' + "[" * 500 + '"\\ud800"' + "]" * 500 + "}",
    ],
)
async def test_mid_session_the_session_goes_on(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    # Was: NaN in a session.update was merged, then session.updated could not be
    # encoded: the session ended as engine_error.
    async with running_server() as sim:
        client, created = await sim.open_session()
        await client.send_raw(text)
        error = await client.receive()
        assert error["type"] == "error"
        assert error["code"] in ("invalid_json", "bad_event")
        assert state_of(sim, created["session_id"]) == "attached"
        assert (await echo(client, "still here"))["server_event_seq"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
