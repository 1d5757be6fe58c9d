"""A resume whose client does not read cannot hold its session for ever."""

from __future__ import annotations

import logging

import pytest
import trio
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import resume_event, running_server, settle

from ..helpers import echo, state_of


async def test_a_replay_not_written_in_time_aborts_the_resume(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Was: the replay write had no bound and the session's timers were frozen meanwhile:
    # one resumer that never read pinned the session and its slot, and every other
    # resume got session_resume_conflict, for ever.
    config = ServerConfig(replay_timeout_s=7.0, disconnect_grace_s=30.0)
    async with running_server(config) as sim:
        client, created = await sim.open_session()
        sid, token = created["session_id"], created["resume_token"]
        for i in range(3):
            await echo(client, f"e{i}")
        await client.transport.cut()
        await settle()
        stuck = await sim.connect()
        stuck.transport.hold()  # nothing it is sent gets through: a client that never reads
        start = trio.current_time()
        await stuck.send(resume_event(sid, token, 0))
        await stuck.transport.wait_held()
        _, conflict = await sim.resume(sid, token, 0)
        assert conflict["code"] == "session_resume_conflict"
        await trio.sleep(7.0)
        await settle()
        assert trio.current_time() - start == 7.0
        assert state_of(sim, sid) == "detached"
        assert sim.server.slots_held == 1
        again, resumed = await sim.resume(sid, token, 0)
        assert resumed["type"] == "session.resumed"
        assert [(await again.receive())["text"] for _ in range(3)] == ["e0", "e1", "e2"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_the_grace_keeps_running_behind_an_aborted_resume(
    autojump_clock: MockClock,
) -> None:
    config = ServerConfig(replay_timeout_s=7.0, disconnect_grace_s=5.0)
    async with running_server(config) as sim:
        client, created = await sim.open_session()
        await client.transport.cut()
        await settle()
        stuck = await sim.connect()
        stuck.transport.hold()
        await stuck.send(resume_event(created["session_id"], created["resume_token"], 0))
        await stuck.transport.wait_held()
        await trio.sleep(7.0)
        await settle()
        # The grace (5 s) ran out while the resume was held: aborted, the session expires.
        assert state_of(sim, created["session_id"]) is None
        assert sim.server.slots_held == 0
        assert sim.probe is not None
        assert sim.probe.reasons(created["session_id"]) == ["disconnect_grace_expired"]
