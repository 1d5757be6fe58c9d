"""Client faults reach the log once per connection, at INFO, at a bounded rate."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from trio.testing import MockClock

from trio_duplex.server.sessions.faults import FAULTS, FaultLog
from trio_duplex.testing import running_server, settle

from ..helpers import RawWs


@pytest.fixture(autouse=True)
def fresh_fault_log() -> Iterator[None]:
    FAULTS.reset()  # the bucket is the process's: earlier tests may have drained it
    yield
    FAULTS.reset()


def stall(record: logging.LogRecord) -> bool:
    """The watchdog's report of a loop held up by an overloaded machine: not ours."""
    return record.getMessage().startswith("event loop ")


def fault_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "client fault" in r.getMessage()]


def test_the_rate_is_a_token_bucket_and_says_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    faults = FaultLog(rate=1.0, burst=3.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "trio_duplex")
    for i in range(10):
        faults.report(f"c{i}", "invalid_json")
    assert [r.getMessage() for r in fault_lines(caplog)] == [
        f"client fault on c{i}: invalid_json" for i in range(3)
    ]
    now[0] = 2.0  # two tokens back
    faults.report("c10", "bad_event")
    faults.report("c11", "bad_event")
    faults.report("c12", "bad_event")
    messages = [r.getMessage() for r in fault_lines(caplog)][3:]
    assert messages == [
        "client fault on c10: bad_event (7 more left out for the rate)",
        "client fault on c11: bad_event",
    ]
    assert faults.suppressed == 1


async def test_a_connection_that_keeps_failing_is_one_info_line(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Was: nothing at all for most faults, and a traceback per connection for some.
    caplog.set_level(logging.INFO, "trio_duplex")
    async with running_server() as sim:
        client, _ = await sim.open_session()
        for _ in range(200):
            await client.send_raw("{not json")
            await client.send({"type": "no.such.event"})
        await client.send({"type": "session.heartbeat"})
        answers = []
        while (event := await client.receive())["type"] != "session.heartbeat_ack":
            answers.append(event["code"])
        assert answers == ["invalid_json", "unknown_event"] * 200
    lines = fault_lines(caplog)
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO and lines[0].exc_info is None
    assert "invalid_json" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and not stall(r)]


async def test_a_flood_of_failing_connections_is_rate_limited(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, raw_ws: RawWs
) -> None:
    caplog.set_level(logging.INFO, "trio_duplex")
    async with running_server() as sim:
        for _ in range(100):
            client = await raw_ws(sim)
            await client.send_bytes(b"\x81\x05hello")  # unmasked: 1002
            assert await client.receive_until_closed() == []
            assert client.close_code == 1002
        await settle()
    lines = fault_lines(caplog)
    # One line a connection at most, and the bucket (20, then 10 a second of real time)
    # keeps a flood well under one a connection.
    assert 20 <= len(lines) < 60
    assert all("1002" in r.getMessage() and r.levelno == logging.INFO for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and not stall(r)]
