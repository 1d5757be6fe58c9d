"""docs/protocol.md, Resume, through the shell: a resume end to end on the wire, a refusal
written and closed 4001, a takeover's ``session.replaced`` delivered and its connection
closed 4000, frames still arriving on a replaced connection, output racing a takeover, and
resumes whose write is held or cut mid-way.

The rules themselves (every refusal and the order of the checks, token rotation, what is
replayed, journal_gap, generations, a half-way resume's grace, ``session.resume``
mid-session) are tested on the core with time as a number: tests/core/test_resume.py
(through tests/core/driving.py), tests/core/test_session.py and tests/core/test_replay.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, SimClient, Simulation, running_server

from ..helpers import RESUMED_FIELDS, echo, resume_event, state_of


async def refused(
    client: SimClient, code: str, *, retryable: bool = False, close_code: int = 4001
) -> dict[str, Any]:
    """The client's only frame is ``error{code}``, then the server closes ``close_code``."""
    events = await client.receive_until_closed()
    assert len(events) == 1, events
    (error,) = events
    assert error["type"] == "error"
    assert error["code"] == code, error
    assert error["retryable"] is retryable
    assert client.close_code == close_code
    return error


async def detached_session(sim: Simulation, events: int = 0) -> dict[str, Any]:
    """Open a session, echo ``events`` times, drop the connection."""
    client, created = await sim.open_session()
    for n in range(events):
        await echo(client, f"e{n + 1}")
    await client.transport.cut()
    await trio.testing.wait_all_tasks_blocked()
    return created


# -- refusals -----------------------------------------------------------------------------------


async def test_unknown_session_is_session_resume_expired(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send(resume_event("sess_does_not_exist", "token", 0, event_id="r1"))
        error = await refused(client, "session_resume_expired")
        assert error["event_id"] == "r1"


# -- success ------------------------------------------------------------------------------------


async def test_resumed_fields_then_replay_then_live(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"voice": "v"})
        for n in range(1, 5):
            await client.send({"type": "input.text.append", "text": f"e{n}", "client_event_seq": n})
            await client.receive()
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert set(resumed) == RESUMED_FIELDS
        assert resumed["type"] == "session.resumed"
        assert resumed["session_id"] == created["session_id"]
        assert resumed["session"] == {"voice": "v"}
        assert resumed["attachment_generation"] == 2
        assert resumed["last_received_client_event_seq"] == 4
        assert resumed["consumed_client_event_seq"] == 0  # no report due yet (128 events)
        assert isinstance(resumed["resume_token"], str)
        assert resumed["resume_token"] != created["resume_token"]
        assert "server_event_seq" not in resumed
        replay = [await client2.receive() for _ in range(3)]
        assert [(e["text"], e["server_event_seq"]) for e in replay] == [
            ("e2", 2),
            ("e3", 3),
            ("e4", 4),
        ]
        assert (await echo(client2, "live"))["server_event_seq"] == 5


async def test_resume_reports_the_updated_configuration(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"a": 1})
        await client.send_and_receive({"type": "session.update", "session": {"b": 2}})
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["session"] == {"a": 1, "b": 2}


# -- takeover -----------------------------------------------------------------------------------


async def test_takeover_replaces_the_live_connection(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        old, created = await sim.open_session()
        await echo(old, "one")
        new, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["type"] == "session.resumed"
        assert resumed["attachment_generation"] == 2
        events = await old.receive_until_closed()
        assert events == [
            {
                "type": "session.replaced",
                "session_id": created["session_id"],
                "attachment_generation": 2,
            }
        ]
        assert old.close_code == 4000
        # The old connection's loss does not detach what the new one owns.
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, created["session_id"]) == "attached"
        assert (await echo(new, "two"))["server_event_seq"] == 2


async def test_late_frames_and_loss_of_the_replaced_connection_are_fenced_off(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        old, created = await sim.open_session()
        await echo(old, "one")
        old.transport.hold()  # the old connection can no longer be written to
        new, took_over = await sim.resume(created["session_id"], created["resume_token"], 1)
        # Frames still arriving on the old connection are ignored.
        await old.send({"type": "input.text.append", "text": "ghost", "client_event_seq": 7})
        await old.send({"type": "session.close"})
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, created["session_id"]) == "attached"
        reply = await echo(new, "two")
        assert reply["server_event_seq"] == 2
        # Eventually the old connection is cut; that late loss detaches nothing.
        await trio.sleep(10)
        assert state_of(sim, created["session_id"]) == "attached"
        assert (await echo(new, "three"))["server_event_seq"] == 3
        await new.transport.cut()
        _, resumed = await sim.resume(created["session_id"], took_over["resume_token"], 3)
        assert resumed["last_received_client_event_seq"] == 0  # "ghost" never counted


async def test_no_event_is_lost_or_repeated_across_a_takeover_during_output(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []

    def factory(config: Mapping[str, Any]) -> ScriptedEngine:
        engines.append(ScriptedEngine(dict(config)))
        return engines[-1]

    async with running_server(engine_factory=factory) as sim:
        old, created = await sim.open_session()
        (engine,) = engines
        received_old: list[int] = []
        received_new: list[int] = []

        async def produce() -> None:
            for n in range(1, 41):
                await engine.emit(str(n))
                await trio.sleep(0.01)

        async def read_old() -> None:
            try:
                while True:
                    event = await old.receive()
                    if event["type"] != "response.output_text.delta":
                        break
                    received_old.append(event["server_event_seq"])
            except Exception:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            nursery.start_soon(read_old)
            await trio.sleep(0.105)
            last = received_old[-1]
            new, resumed = await sim.resume(created["session_id"], created["resume_token"], last)
            assert resumed["type"] == "session.resumed"
            while not received_new or received_new[-1] < 40:
                received_new.append((await new.receive())["server_event_seq"])
        assert 0 < last < 40  # the switch happened mid-stream
        assert old.close_code == 4000
        assert received_new == list(range(last + 1, 41))
        assert received_old == list(range(1, len(received_old) + 1))


# -- concurrent and half-way resumes -----------------------------------------------------------


async def test_concurrent_resume_gets_session_resume_conflict(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=1)
        sid, t0 = created["session_id"], created["resume_token"]
        winner = await sim.connect()
        gate = winner.transport.hold()  # session.resumed is held: the resume is in progress
        await winner.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        loser = await sim.connect()
        await loser.send(resume_event(sid, t0, 0, event_id="late"))
        error = await refused(loser, "session_resume_conflict", retryable=True)
        assert error["event_id"] == "late"
        gate.set()
        resumed = await winner.receive()
        assert resumed["type"] == "session.resumed"
        assert (await winner.receive())["server_event_seq"] == 1
        # Arriving after the winner finished, with a still-valid token: a takeover.
        _third, resumed3 = await sim.resume(sid, t0, 1)
        assert resumed3["type"] == "session.resumed"
        assert resumed3["attachment_generation"] == 3
        assert (await winner.receive_until_closed())[-1]["type"] == "session.replaced"
        assert winner.close_code == 4000


async def test_concurrent_resume_while_attached_never_attaches_two(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        old, created = await sim.open_session()
        sid, t0 = created["session_id"], created["resume_token"]
        resuming = await sim.connect()
        gate = resuming.transport.hold()
        await resuming.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        # Still attached to the old connection only: it is answered, the resumer is not.
        assert (await echo(old, "old still"))["server_event_seq"] == 1
        assert resuming.transport.sends_completed == 1  # only the HTTP handshake answer
        gate.set()
        assert (await resuming.receive())["type"] == "session.resumed"
        assert (await resuming.receive())["server_event_seq"] == 1
        assert (await old.receive_until_closed())[-1]["type"] == "session.replaced"


async def test_resume_failing_half_way_leaves_a_detached_session_detached(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=20)) as sim:
        created = await detached_session(sim, events=2)
        sid, t0 = created["session_id"], created["resume_token"]
        lost_at = trio.current_time()
        await trio.sleep(5)
        half = await sim.connect()
        half.transport.hold()
        await half.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(3)
        await half.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, sid) == "detached"
        # Still inside its original grace, not a new one ...
        await trio.sleep(11.8)
        client, resumed = await sim.resume(sid, t0, 0)
        assert resumed["type"] == "session.resumed"
        assert [(await client.receive())["server_event_seq"] for _ in range(2)] == [1, 2]
        assert trio.current_time() - lost_at == pytest.approx(19.8)


async def test_resume_failing_half_way_leaves_the_old_connection_attached(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        old, created = await sim.open_session()
        sid, t0 = created["session_id"], created["resume_token"]
        await echo(old, "a")
        half = await sim.connect()
        half.transport.hold()
        await half.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        await half.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        assert state_of(sim, sid) == "attached"
        assert (await echo(old, "b"))["server_event_seq"] == 2
        assert old.close_code is None
