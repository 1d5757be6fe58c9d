"""docs/protocol.md, Events and the journal, through a server: what goes on the wire end
to end (control events carry no seq, across an overflow, a resume, a takeover and a
close), ``session.updated`` as the engine API answers it, and ``input_backpressure`` from
the runner's input queue with its ``input.consumed`` reports.

The journal's rules themselves are tested on the core's objects, no trio: numbering,
acks, the byte and TTL bounds with their notices, what a resume replays and
``client_event_seq`` across a resume in tests/core/test_session_journal.py; the journal
alone in tests/core/test_journal.py; what a client event means (ack and seq rules,
session.update's shape) in tests/core/test_protocol.py."""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, ScriptedFactory, SimClient, running_server

from ..helpers import echo

CONTROL = {
    "session.created",
    "session.resumed",
    "session.replaced",
    "session.resync_required",
    "session.heartbeat_ack",
    "session.going_away",
    "session.closed",
    "session.expired",
    "error",
}


def text(seq: int, text: str = "x") -> dict[str, Any]:
    return {"type": "input.text.append", "text": text, "client_event_seq": seq}


async def next_is_heartbeat_ack(client: SimClient) -> None:
    """Prove nothing else was queued: the very next frame answers a heartbeat."""
    ack = await client.send_and_receive({"type": "session.heartbeat"})
    assert ack["type"] == "session.heartbeat_ack", ack


def scripted_factory(engines: list[ScriptedEngine], **kwargs: Any) -> ScriptedFactory:
    return ScriptedFactory(kwargs, engines)  # every engine it builds lands in ``engines``


# -- control events -----------------------------------------------------------------------


async def test_control_events_carry_no_seq(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(journal_max_bytes=100)) as sim:
        seen = []
        client, created = await sim.open_session()
        seen.append(created)
        seen.append(await client.send_and_receive({"type": "session.heartbeat"}))
        seen.append(await client.send_and_receive({"type": "nope"}))
        await echo(client, "a")
        await client.send({"type": "input.text.append", "text": "y" * 200})  # overflow
        seen.append(await client.receive())
        assert (await client.receive())["server_event_seq"] == 2
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        seen.append(resumed)
        seen.append(await client2.receive())  # journal_gap
        seen.extend(await client.receive_until_closed())  # replaced
        await client2.send({"type": "session.close"})
        seen.extend(await client2.receive_until_closed())
        assert [event["type"] for event in seen] == [
            "session.created",
            "session.heartbeat_ack",
            "error",
            "session.resync_required",
            "session.resumed",
            "session.resync_required",
            "session.replaced",
            "session.closed",
        ]
        for event in seen:
            assert event["type"] in CONTROL
            assert "server_event_seq" not in event, event


# -- session.update after the open -------------------------------------------------------


async def test_session_update_after_open_answers_session_updated_with_a_seq(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session({"a": 1})
        await echo(client)
        updated = await client.send_and_receive({"type": "session.update", "session": {"b": 2}})
        assert updated["type"] == "session.updated"
        assert updated["session_id"] == created["session_id"]
        assert updated["session"]["b"] == 2
        # The fields this update set, not the whole configuration (docs/protocol.md)...
        assert updated["session"] == {"b": 2}
        assert updated["server_event_seq"] == 2
        assert (await echo(client))["server_event_seq"] == 3
        # ...which is their shallow merge, as a resume shows.
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 3)
        assert resumed["session"] == {"a": 1, "b": 2}


async def test_session_updated_is_journaled_and_replayed(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await client.send_and_receive({"type": "session.update", "session": {"v": "x"}})
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["session"] == {"v": "x"}
        replayed = await client2.receive()
        assert replayed["type"] == "session.updated"
        assert replayed["server_event_seq"] == 1


# -- input_backpressure ----------------------------------------------------------------------


async def test_input_backpressure_is_retryable_and_the_refused_event_is_not_received(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(max_pending_input=2)
    async with running_server(config, scripted_factory(engines, gated=True)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        await client.send(text(1, "a"))  # taken by the engine, which waits for a permit
        await client.send(text(2, "b"))  # queued
        await client.send(text(3, "c"))  # queued: the bound is reached
        await client.send({**text(4, "d"), "event_id": "d"})
        # (v2: with a bound of 2, each event the engine takes is reported)
        assert await client.receive() == {"type": "input.consumed", "consumed_client_event_seq": 1}
        error = await client.receive()
        assert error["type"] == "error"
        assert error["code"] == "input_backpressure"
        assert error["retryable"] is True
        assert error["event_id"] == "d"
        assert error["client_event_seq"] == 4  # v2: the refused seq, to resend from
        assert [e["text"] for e in engine.received] == ["a"]
        # The refused event does not count as received.
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["last_received_client_event_seq"] == 3
        assert resumed["consumed_client_event_seq"] == 1
        engine.release(3)
        got = [await client2.receive() for _ in range(5)]
        assert [e.get("consumed_client_event_seq") for e in got] == [None, 2, None, 3, None]
        got = [e for e in got if e["type"] != "input.consumed"]
        assert [(e["text"], e["server_event_seq"]) for e in got] == [("a", 1), ("b", 2), ("c", 3)]
        # The retry with the same seq is accepted, since 4 was never received.
        await client2.send(text(4, "d"))
        engine.release()
        assert (await client2.receive())["consumed_client_event_seq"] == 4
        retried = await client2.receive()
        assert (retried["text"], retried["server_event_seq"]) == ("d", 4)
        assert [e["text"] for e in engine.received] == ["a", "b", "c", "d"]


async def test_input_backpressure_does_not_end_the_session(autojump_clock: MockClock) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(max_pending_input=1)
    async with running_server(config, scripted_factory(engines, gated=True)) as sim:
        client, _ = await sim.open_session()
        (engine,) = engines
        await client.send(text(1, "a"))
        assert (await client.receive())["consumed_client_event_seq"] == 1
        await client.send(text(2, "b"))
        for _ in range(3):
            error = await client.send_and_receive(text(3, "c"))
            assert error["code"] == "input_backpressure"
        await next_is_heartbeat_ack(client)  # control events still work
        engine.release(2)
        assert (await client.receive())["text"] == "a"
        assert (await client.receive())["consumed_client_event_seq"] == 2
        assert (await client.receive())["text"] == "b"
        engine.release()
        assert (await client.send_and_receive(text(3, "c")))["consumed_client_event_seq"] == 3
        assert (await client.receive())["text"] == "c"
