"""docs/protocol.md, Resume: every refusal, success, replay, token rotation, journal_gap,
takeover, concurrent resumes and half-way failures."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, SimClient, Simulation, running_server

from ..helpers import echo, state_of


def resume_event(
    session_id: str, token: str, last: int | None = None, **extra: object
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "session.resume",
        "session_id": session_id,
        "resume_token": token,
    }
    if last is not None:
        event["last_received_server_event_seq"] = last
    return {**event, **extra}


async def next_is_heartbeat_ack(client: SimClient) -> None:
    ack = await client.send_and_receive({"type": "session.heartbeat"})
    assert ack["type"] == "session.heartbeat_ack", ack


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


async def test_closed_session_is_session_resume_expired(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await client.send({"type": "session.close"})
        await client.receive_until_closed()
        client2, answer = await sim.resume(created["session_id"], created["resume_token"])
        assert answer["code"] == "session_resume_expired"
        assert await client2.receive_until_closed() == []
        assert client2.close_code == 4001


async def test_expired_session_is_session_resume_expired(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=5)) as sim:
        created = await detached_session(sim)
        await trio.sleep(6)
        client = await sim.connect()
        await client.send(resume_event(created["session_id"], created["resume_token"]))
        await refused(client, "session_resume_expired")


async def test_idle_expired_session_is_session_resume_expired(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(idle_ttl_s=5)) as sim:
        client, created = await sim.open_session()
        await client.receive_until_closed()
        client2 = await sim.connect()
        await client2.send(resume_event(created["session_id"], created["resume_token"]))
        await refused(client2, "session_resume_expired")


@pytest.mark.parametrize("token", ["wrong", "", "x" * 43])
async def test_wrong_token_is_invalid_resume_token(autojump_clock: MockClock, token: str) -> None:
    async with running_server() as sim:
        created = await detached_session(sim)
        client = await sim.connect()
        await client.send(resume_event(created["session_id"], token, 0, event_id="r2"))
        error = await refused(client, "invalid_resume_token")
        assert error["event_id"] == "r2"
        # A refused attempt changes nothing: the real token still works.
        assert state_of(sim, created["session_id"]) == "detached"
        _, resumed = await sim.resume(created["session_id"], created["resume_token"])
        assert resumed["type"] == "session.resumed"


async def test_token_of_another_session_is_invalid_resume_token(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        a = await detached_session(sim)
        b = await detached_session(sim)
        client = await sim.connect()
        await client.send(resume_event(a["session_id"], b["resume_token"]))
        await refused(client, "invalid_resume_token")


MALFORMED = [
    {"type": "session.resume"},
    {"type": "session.resume", "resume_token": "t"},
    {"type": "session.resume", "session_id": "s"},
    {"type": "session.resume", "session_id": 5, "resume_token": "t"},
    {"type": "session.resume", "session_id": "s", "resume_token": None},
    {"type": "session.resume", "session_id": "s", "resume_token": ["t"]},
]


@pytest.mark.parametrize("event", MALFORMED)
async def test_malformed_resume_is_invalid_session_resume(
    autojump_clock: MockClock, event: dict[str, Any]
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send({**event, "event_id": "r3"})
        error = await refused(client, "invalid_session_resume")
        assert error["event_id"] == "r3"


@pytest.mark.parametrize("last", [-1, "1", 1.5, True, None, [0]])
async def test_malformed_last_seq_is_invalid_session_resume(
    autojump_clock: MockClock, last: object
) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=2)
        client = await sim.connect()
        event = resume_event(created["session_id"], created["resume_token"])
        event["last_received_server_event_seq"] = last
        await client.send(event)
        await refused(client, "invalid_session_resume")
        assert state_of(sim, created["session_id"]) == "detached"


async def test_last_seq_above_the_newest_is_invalid_session_resume(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=2)
        client = await sim.connect()
        await client.send(resume_event(created["session_id"], created["resume_token"], 3))
        error = await refused(client, "invalid_session_resume")
        assert error.get("param", "last_received_server_event_seq") == (
            "last_received_server_event_seq"
        )
        # Refused, not half-done: the token was not rotated away, the session is detached.
        assert state_of(sim, created["session_id"]) == "detached"
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 2)
        assert resumed["type"] == "session.resumed"
        await next_is_heartbeat_ack(client2)


async def test_a_wrong_token_reveals_nothing_about_the_seq(autojump_clock: MockClock) -> None:
    # docs/protocol.md orders the checks: the token before the seq.
    async with running_server() as sim:
        created = await detached_session(sim, events=1)
        client = await sim.connect()
        await client.send(resume_event(created["session_id"], "wrong", 99))
        await refused(client, "invalid_resume_token")


async def test_resume_errors_carry_a_message(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send(resume_event("nope", "nope"))
        error = await refused(client, "session_resume_expired")
        assert isinstance(error["message"], str) and error["message"]
        assert set(error) <= {"type", "code", "message", "retryable", "event_id", "param"}


# -- success ------------------------------------------------------------------------------------


async def test_resumed_fields_then_replay_then_live(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"voice": "v"})
        for n in range(1, 5):
            await client.send({"type": "input.text.append", "text": f"e{n}", "client_event_seq": n})
            await client.receive()
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert set(resumed) == {
            "type",
            "session_id",
            "session",
            "resume_token",
            "attachment_generation",
            "last_received_client_event_seq",
            "consumed_client_event_seq",  # protocol v2
        }
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


async def test_last_seq_defaults_to_zero(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=2)
        client = await sim.connect()
        resumed = await client.send_and_receive(
            resume_event(created["session_id"], created["resume_token"])
        )
        assert resumed["type"] == "session.resumed"
        assert [(await client.receive())["server_event_seq"] for _ in range(2)] == [1, 2]
        await next_is_heartbeat_ack(client)


async def test_resume_at_the_newest_seq_replays_nothing(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=3)
        client, resumed = await sim.resume(created["session_id"], created["resume_token"], 3)
        assert resumed["type"] == "session.resumed"
        await next_is_heartbeat_ack(client)


async def test_the_resume_acks_everything_up_to_its_seq(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=5)
        journal = sim.server.sessions.registry.sessions[created["session_id"]].journal
        assert len(journal) == 5
        client, _resumed = await sim.resume(created["session_id"], created["resume_token"], 3)
        assert [(await client.receive())["server_event_seq"] for _ in range(2)] == [4, 5]
        assert len(journal) == 2


async def test_generation_increments_with_every_resume(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        token = created["resume_token"]
        for generation in range(2, 6):
            await client.transport.cut()
            client, resumed = await sim.resume(created["session_id"], token)
            assert resumed["attachment_generation"] == generation
            token = resumed["resume_token"]


async def test_resume_reports_the_updated_configuration(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"a": 1})
        await client.send_and_receive({"type": "session.update", "session": {"b": 2}})
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["session"] == {"a": 1, "b": 2}


async def test_journal_gap_resumed_then_resync_then_what_is_held_then_live(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        for n in range(3):
            await echo(client, str(n))
        await client.send({"type": "session.event_ack", "server_event_seq": 2})
        await next_is_heartbeat_ack(client)
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["type"] == "session.resumed"
        assert await client2.receive() == {
            "type": "session.resync_required",
            "reason": "journal_gap",
            "dropped_through_seq": 2,  # the last seq the journal no longer holds
        }
        held = await client2.receive()
        assert (held["text"], held["server_event_seq"]) == ("2", 3)  # still held: replayed
        await next_is_heartbeat_ack(client2)
        assert (await echo(client2))["server_event_seq"] == 4


# -- token rotation -------------------------------------------------------------------------------


async def test_the_new_token_works_and_kills_the_old_one(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim)
        sid, t0 = created["session_id"], created["resume_token"]
        client, resumed = await sim.resume(sid, t0)
        t1 = resumed["resume_token"]
        await client.transport.cut()
        client, resumed = await sim.resume(sid, t1)
        assert resumed["type"] == "session.resumed"
        t2 = resumed["resume_token"]
        await client.transport.cut()
        stale, answer = await sim.resume(sid, t0)
        assert answer["code"] == "invalid_resume_token"
        assert await stale.receive_until_closed() == []
        assert stale.close_code == 4001
        _, resumed = await sim.resume(sid, t2)
        assert resumed["type"] == "session.resumed"


async def test_a_lost_session_resumed_leaves_the_presented_token_valid(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        created = await detached_session(sim, events=2)
        sid, t0 = created["session_id"], created["resume_token"]
        # The connection dies before session.resumed reaches the client: it still has t0.
        client = await sim.connect()
        await client.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        client, resumed = await sim.resume(sid, t0, 0)
        assert resumed["type"] == "session.resumed"
        assert [(await client.receive())["server_event_seq"] for _ in range(2)] == [1, 2]
        t_new = resumed["resume_token"]
        # Presenting the newest token kills t0.
        await client.transport.cut()
        client, resumed = await sim.resume(sid, t_new, 2)
        assert resumed["type"] == "session.resumed"
        await client.transport.cut()
        _stale, answer = await sim.resume(sid, t0)
        assert answer["code"] == "invalid_resume_token"


async def resumed_once(sim: Simulation) -> tuple[SimClient, str, str, str]:
    """Open a session, lose its connection and resume it: the resumed client, the
    session id, the token presented (t0) and the one issued (t1)."""
    client, created = await sim.open_session()
    sid, t0 = created["session_id"], created["resume_token"]
    await client.transport.cut()
    client, resumed = await sim.resume(sid, t0)
    return client, sid, t0, resumed["resume_token"]


async def test_presented_token_stays_valid_after_a_committed_resume(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, sid, t0, t1 = await resumed_once(sim)  # t1 issued, maybe lost
        await client.transport.cut()
        client, resumed = await sim.resume(sid, t0)  # t0 again: accepted, t2 issued
        assert resumed["type"] == "session.resumed"
        assert resumed["attachment_generation"] == 3
        t2 = resumed["resume_token"]
        assert len({t0, t1, t2}) == 3
        await client.transport.cut()
        # t1 was never presented and has been replaced by t2: no other old token works.
        _stale, answer = await sim.resume(sid, t1)
        assert answer["code"] == "invalid_resume_token"
        _, resumed = await sim.resume(sid, t2)
        assert resumed["type"] == "session.resumed"


async def test_the_presented_token_dies_with_the_first_event_on_the_resumed_connection(
    autojump_clock: MockClock,
) -> None:
    # Was: the pre-rotation token stayed valid until the next resume, so whoever stole it
    # could take over a live session whose client already held the new token.
    async with running_server() as sim:
        client, sid, t0, t1 = await resumed_once(sim)
        await echo(client, "holds t1")  # the client shows it has session.resumed
        _thief, answer = await sim.resume(sid, t0)
        assert answer["code"] == "invalid_resume_token"
        assert state_of(sim, sid) == "attached"
        assert (await echo(client, "undisturbed"))["server_event_seq"] == 2
        await client.transport.cut()
        _, again = await sim.resume(sid, t1)
        assert again["type"] == "session.resumed"


async def test_until_the_first_event_a_lost_session_resumed_can_be_retried(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, sid, t0, _ = await resumed_once(sim)  # committed, then lost before any event
        await client.transport.cut()
        _, again = await sim.resume(sid, t0)
        assert again["type"] == "session.resumed"


async def test_tokens_are_stored_only_as_digests(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        created = await detached_session(sim)
        sid, t0 = created["session_id"], created["resume_token"]
        _client, resumed = await sim.resume(sid, t0)
        t1 = resumed["resume_token"]
        session = sim.server.sessions.registry.sessions[sid]
        stored = []
        for obj in (session, session.credentials):
            for name in getattr(type(obj), "__slots__", ()) or vars(obj):
                stored.append(getattr(obj, name, None))
        # docs/protocol.md: SHA-256 digests (this also proves the walk sees the store).
        assert hashlib.sha256(t1.encode()).digest() in stored
        for token in (t0, t1):
            for value in stored:
                assert value != token and value != token.encode()
            assert token not in repr(session)
            assert token not in repr(session.credentials)


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


async def test_takeover_of_a_takeover(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        first, created = await sim.open_session()
        second, resumed = await sim.resume(created["session_id"], created["resume_token"])
        third, resumed3 = await sim.resume(created["session_id"], resumed["resume_token"])
        assert resumed3["attachment_generation"] == 3
        assert (await first.receive_until_closed())[0]["attachment_generation"] == 2
        replaced = await second.receive_until_closed()
        assert replaced == [
            {
                "type": "session.replaced",
                "session_id": created["session_id"],
                "attachment_generation": 3,
            }
        ]
        assert second.close_code == 4000
        await next_is_heartbeat_ack(third)


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


async def test_takeover_replays_what_the_old_connection_had_not_acked(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        old, created = await sim.open_session()
        for n in range(3):
            await echo(old, str(n))
        new, _ = await sim.resume(created["session_id"], created["resume_token"], 1)
        replay = [await new.receive() for _ in range(2)]
        assert [e["server_event_seq"] for e in replay] == [2, 3]
        assert (await echo(new, "live"))["server_event_seq"] == 4


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


async def test_grace_is_not_extended_by_a_failed_resume(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=20)) as sim:
        created = await detached_session(sim)
        sid, t0 = created["session_id"], created["resume_token"]
        await trio.sleep(15)
        half = await sim.connect()
        half.transport.hold()
        await half.send(resume_event(sid, t0, 0))
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)
        await half.transport.cut()
        await trio.sleep(4.1)  # 20.1 s after the loss
        assert state_of(sim, sid) is None
        _client, answer = await sim.resume(sid, t0)
        assert answer["code"] == "session_resume_expired"


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


# -- session.resume anywhere else -----------------------------------------------------------------


@pytest.mark.parametrize("own", [True, False], ids=["same-session", "other-session"])
async def test_resume_mid_session_is_unsupported_and_the_session_goes_on(
    autojump_clock: MockClock, own: bool
) -> None:
    async with running_server() as sim:
        other = await detached_session(sim)
        client, created = await sim.open_session()
        await echo(client, "a")
        target = created if own else other
        error = await client.send_and_receive(
            resume_event(target["session_id"], target["resume_token"], 0, event_id="mid")
        )
        assert error["type"] == "error"
        assert error["code"] == "unsupported_session_resume"
        assert error["retryable"] is False
        assert error["event_id"] == "mid"
        assert (await echo(client, "b"))["server_event_seq"] == 2
        assert client.close_code is None
        assert state_of(sim, other["session_id"]) == "detached"
