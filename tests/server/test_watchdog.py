"""The loop-lag watchdog (``--loop-lag-warning``): a blocked event loop is reported once,
with the session whose engine blocked it and the line it is blocked at.

No test sleeps to wait for the watchdog: an engine blocks the loop until the watchdog's
warning exists (a log handler releases it), so the loop is blocked exactly as long as it
takes the watchdog to say so.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock
from websockets.sync.client import connect

from trio_duplex import Engine, EngineSession, Event, ServerConfig
from trio_duplex.server.sessions import watchdog
from trio_duplex.server.sessions.watchdog import THREAD_NAME
from trio_duplex.testing import SimClient, running_server

from ..helpers import Serve, echo

THRESHOLD = 0.05
WATCHED = ServerConfig(loop_lag_warning_s=THRESHOLD)


class Released(logging.Handler):
    """Releases one blocked call per warning that names ``marker`` (the blocking code), so
    a stall lasts until the watchdog has reported it."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.reports = threading.Semaphore(0)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("event loop blocked") and self.marker in message:
            self.reports.release()

    def block(self, then_s: float = 0.0) -> None:
        """Block the calling thread (the loop's) until the watchdog has reported it."""
        assert self.reports.acquire(timeout=10), "no watchdog report within 10 s"  # HERE
        time.sleep(then_s)  # a stall that goes on after the report


@pytest.fixture(autouse=True)
def every_stall_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "QUIET_S", 0.0)  # (the rate has a test of its own)


@pytest.fixture
def released() -> Iterator[Released]:
    handler = Released(f"in {Released.block.__qualname__}")
    logger = logging.getLogger("trio_duplex")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def block_line() -> str:
    """Where ``Released.block`` waits, as the watchdog names it."""
    lines, first = inspect.getsourcelines(Released.block)
    line = first + next(i for i, text in enumerate(lines) if "# HERE" in text)
    return f"{Released.block.__code__.co_filename}:{line} in {Released.block.__qualname__}"


class Blocking(Engine):
    """Echoes ``input.text.append``. An event with ``"block": s`` blocks the loop first,
    until the watchdog has reported it and ``s`` seconds more: in ``run``, in a task of
    the engine's own, or in ``check`` (which runs in the connection's reader)."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, released: Released, place: str) -> None:
        self.released = released
        self.place = place

    def check(self, event: Event) -> None:
        if self.place == "check" and "block" in event:
            self.released.block(event["block"])

    async def run(self, session: EngineSession) -> None:
        send, receive = trio.open_memory_channel[Event](10)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._speak, session, receive)
            async with send:
                async for event in session:
                    if self.place == "run" and "block" in event:
                        self.released.block(event["block"])
                    await send.send(event)

    async def _speak(
        self, session: EngineSession, events: trio.MemoryReceiveChannel[Event]
    ) -> None:
        async for event in events:
            if self.place == "task" and "block" in event:
                self.released.block(event["block"])
            await session.send({"type": "response.output_text.delta", "text": event["text"]})


def blocking(released: Released, place: str) -> Callable[[Mapping[str, Any]], Engine]:
    return lambda config: Blocking(released, place)


async def blocking_echo(client: SimClient, then_s: float = 0.0) -> None:
    """An echo whose engine blocks the loop until reported, then ``then_s`` more."""
    event = {"type": "input.text.append", "text": "stall", "block": then_s}
    assert (await client.send_and_receive(event))["text"] == "stall"


def watchdog_lines(caplog: pytest.LogCaptureFixture, about: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage().startswith("event loop ") and about in r.getMessage()
    ]


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.mark.parametrize("place", ["run", "task", "check"])
async def test_a_blocked_loop_is_reported_once_with_the_session_and_the_line(
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
    released: Released,
    place: str,
) -> None:
    async with running_server(WATCHED, blocking(released, place)) as sim:
        bystander, _ = await sim.open_session()
        client, created = await sim.open_session()
        await blocking_echo(client)  # the loop is blocked until the watchdog reported
        await echo(bystander, "and the others go on")
    # The server has stopped: the watchdog's thread is joined, its lines all written.
    lines = watchdog_lines(caplog, block_line())
    assert len(lines) == 2  # one stall, one report (and one line when it ended)
    first, last = (r.getMessage() for r in lines)
    who = f"by the engine of session {created['session_id']}, at {block_line()}"
    assert first.startswith(f"event loop blocked for over {THRESHOLD}s {who} (inside ")
    assert re.search(r" \(inside .*threading\.py:\d+ in \S+\)$", first), first
    assert re.match(rf"event loop unblocked after \d+\.\d+s {re.escape(who)} ", last), last
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in lines)
    assert [getattr(r, "session_id", None) for r in lines] == [created["session_id"]] * 2
    assert "Traceback" not in caplog.text


async def test_a_long_stall_is_reported_once_and_its_length_when_it_ends(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, released: Released
) -> None:
    async with running_server(WATCHED, blocking(released, "run")) as sim:
        client, created = await sim.open_session()
        # Eight polls' worth after the report: still one report for that stall.
        await blocking_echo(client, 4 * THRESHOLD)
        await echo(client)  # no stall: no report
        await blocking_echo(client)  # a second stall: a second report
    lines = [r.getMessage() for r in watchdog_lines(caplog, block_line())]
    assert [line.split()[2] for line in lines] == ["blocked", "unblocked"] * 2
    assert all(f"session {created['session_id']}," in line for line in lines)
    # Counted from the unanswered probe: at least the threshold, then the 4 more.
    match = re.match(r"event loop unblocked after (\d+\.\d+)s", lines[1])
    assert match is not None
    assert float(match.group(1)) >= 5 * THRESHOLD


async def test_a_stall_outside_any_session_names_the_code_that_runs(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, released: Released
) -> None:
    async with running_server(WATCHED) as sim:
        client, _ = await sim.open_session()
        released.block()  # this test's own task blocks the loop
        await echo(client)
    where = block_line()
    assert [getattr(r, "session_id", None) for r in watchdog_lines(caplog, where)] == [None] * 2
    lines = [r.getMessage() for r in watchdog_lines(caplog, where)]
    assert len(lines) == 2
    assert lines[0].startswith(f"event loop blocked for over {THRESHOLD}s in task ")
    assert "engine of session" not in lines[0]
    assert f", at {where} (inside " in lines[0]


async def test_zero_turns_the_watchdog_off(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(loop_lag_warning_s=0)):
        assert watchdog_threads() == []
    async with running_server():  # on by default
        assert len(watchdog_threads()) == 1
    assert ServerConfig().loop_lag_warning_s == 0.1


async def test_the_thread_ends_with_the_server(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        [thread] = watchdog_threads()
        await sim.shutdown()  # drained: run has returned
        assert not thread.is_alive()
    async with running_server() as sim:
        [thread] = watchdog_threads()
    # running_server cancels the server's nursery: the watchdog stops on cancellation too
    assert not thread.is_alive()
    assert watchdog_threads() == []


BLOCKY = """
import time
from trio_duplex import Engine


class Blocky(Engine):
    accepts = frozenset({"input.text.append"})

    def __init__(self, config):
        pass

    async def run(self, session):
        async for event in session:
            time.sleep(0.5)  # blocks every session
            await session.send({"type": "response.output_text.delta", "text": event["text"]})
"""


@pytest.mark.integration
def test_serve_warns_of_a_blocking_engine(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "blocky.py").write_text(BLOCKY)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = serve("--engine", "blocky:Blocky", "--loop-lag-warning", "0.2")
    with connect(server.url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        session_id = json.loads(ws.recv(timeout=10))["session_id"]
        ws.send(json.dumps({"type": "input.text.append", "text": "hi"}))
        ws.recv(timeout=10)
    line = BLOCKY.splitlines().index("            time.sleep(0.5)  # blocks every session") + 1
    place = re.escape(f"{tmp_path / 'blocky.py'}:{line} in Blocky.run")
    who = f"by the engine of session {session_id}, at {place}"
    server.wait_for_line(rf" WARNING trio_duplex: event loop blocked for over 0\.2s {who}", 10)
    server.wait_for_line(rf" WARNING trio_duplex: event loop unblocked after [\d.]+s {who}", 10)


async def test_stalls_soon_after_a_report_are_counted_not_logged(
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
    released: Released,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An engine that blocks at every frame would write two lines a frame: after a
    # report, the next QUIET_S only count (at DEBUG), and the next report says so.
    caplog.set_level(logging.DEBUG, "trio_duplex")  # the counted ones release the engine too
    monkeypatch.setattr(watchdog, "QUIET_S", 3600.0)
    async with running_server(WATCHED, blocking(released, "run")) as sim:
        client, _ = await sim.open_session()
        for _ in range(3):
            await blocking_echo(client)
        monkeypatch.setattr(watchdog, "QUIET_S", 0.0)  # as if the hour had passed
        await blocking_echo(client, 2 * THRESHOLD)
    lines = watchdog_lines(caplog, block_line())
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    counted = [r for r in lines if r.levelno == logging.DEBUG]
    assert [w.split()[2] for w in warnings] == ["blocked", "unblocked"] * 2
    assert "; 2 more stalls since the last report, the longest " in warnings[2]
    assert len(counted) == 4  # the two quiet stalls, blocked and unblocked each
