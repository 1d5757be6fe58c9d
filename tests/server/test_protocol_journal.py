"""docs/protocol.md, Events and the journal: seqs, control events, session.update, acks, the
byte and TTL bounds with their notices, client_event_seq and input_backpressure, through a
server. What a client event means by itself (ack and seq rules, session.update's shape) is
tested on the protocol machine: tests/core/test_protocol.py."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.core.journal import Journal
from trio_duplex.testing import (
    ScriptedEngine,
    ScriptedFactory,
    SimClient,
    Simulation,
    running_server,
)

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


def frame_size(text: str, seq: int) -> int:
    """Compact-JSON UTF-8 size of the echo engine's answer to ``text`` as event ``seq``."""
    event = {"type": "response.output_text.delta", "text": text, "server_event_seq": seq}
    return len(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())


def text(seq: int, text: str = "x") -> dict[str, Any]:
    return {"type": "input.text.append", "text": text, "client_event_seq": seq}


def append(text: str = "x") -> dict[str, Any]:
    """An event without ``client_event_seq``."""
    return {"type": "input.text.append", "text": text}


async def next_is_heartbeat_ack(client: SimClient) -> None:
    """Prove nothing else was queued: the very next frame answers a heartbeat."""
    ack = await client.send_and_receive({"type": "session.heartbeat"})
    assert ack["type"] == "session.heartbeat_ack", ack


async def receive_skipping_overflow(client: SimClient, dropped_through: int) -> dict[str, Any]:
    """The next engine event. A journal_overflow notice may come first (the journal may
    still hold entries from before a gap); if it does, it must name ``dropped_through``."""
    event = await client.receive()
    if event["type"] == "session.resync_required":
        assert event == {
            "type": "session.resync_required",
            "reason": "journal_overflow",
            "dropped_through_seq": dropped_through,
        }
        event = await client.receive()
    return event


def scripted_factory(engines: list[ScriptedEngine], **kwargs: Any) -> ScriptedFactory:
    return ScriptedFactory(kwargs, engines)  # every engine it builds lands in ``engines``


# -- sequence numbers ----------------------------------------------------------------------


async def test_engine_events_are_numbered_1_2_3_and_never_reset_by_resume(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        seqs = [(await echo(client, str(n)))["server_event_seq"] for n in range(3)]
        assert seqs == [1, 2, 3]
        token = created["resume_token"]
        for round_ in range(3):
            await client.transport.cut()
            client, resumed = await sim.resume(created["session_id"], token, 3 + 2 * round_)
            assert resumed["type"] == "session.resumed"
            token = resumed["resume_token"]
            assert (await echo(client))["server_event_seq"] == 4 + 2 * round_
            assert (await echo(client))["server_event_seq"] == 5 + 2 * round_


async def test_each_session_has_its_own_numbering(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        a, _ = await sim.open_session()
        b, _ = await sim.open_session()
        assert (await echo(a))["server_event_seq"] == 1
        assert (await echo(a))["server_event_seq"] == 2
        assert (await echo(b))["server_event_seq"] == 1


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


# -- acks -----------------------------------------------------------------------------------


def journal_of(sim: Simulation, created: dict[str, Any]) -> Journal:
    return sim.server.sessions.registry.sessions[created["session_id"]].journal


async def test_event_ack_frees_entries_up_to_and_including_the_seq(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        for n in range(5):
            await echo(client, str(n))
        journal = journal_of(sim, created)
        assert len(journal) == 5
        await client.send({"type": "session.event_ack", "server_event_seq": 3})
        await next_is_heartbeat_ack(client)  # the ack itself is not answered
        assert len(journal) == 2
        await client.send({"type": "session.event_ack", "server_event_seq": 0})
        await next_is_heartbeat_ack(client)
        assert len(journal) == 2
        await client.send({"type": "session.event_ack", "server_event_seq": 5})
        await next_is_heartbeat_ack(client)
        assert len(journal) == 0
        assert journal.bytes == 0


async def test_acked_events_are_not_replayed(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        for n in range(4):
            await echo(client, str(n))
        await client.send({"type": "session.event_ack", "server_event_seq": 2})
        await next_is_heartbeat_ack(client)
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 2)
        assert resumed["type"] == "session.resumed"
        assert [(await client2.receive())["server_event_seq"] for _ in range(2)] == [3, 4]
        await next_is_heartbeat_ack(client2)


async def test_acked_entries_make_room_so_no_overflow_is_reported(
    autojump_clock: MockClock,
) -> None:
    size = frame_size("x", 1)
    async with running_server(ServerConfig(journal_max_bytes=2 * size + size // 2)) as sim:
        client, _ = await sim.open_session()
        await echo(client)
        await echo(client)
        await client.send({"type": "session.event_ack", "server_event_seq": 2})
        # Without the ack the third event would overflow; with it, no notice comes.
        assert (await echo(client))["server_event_seq"] == 3
        assert (await echo(client))["server_event_seq"] == 4


async def test_ack_of_the_newest_seq_is_valid(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await echo(client)
        await client.send({"type": "session.event_ack", "server_event_seq": 1})
        await next_is_heartbeat_ack(client)


# -- the byte bound ---------------------------------------------------------------------------


async def test_overflow_notice_comes_before_the_event_and_numbering_goes_on(
    autojump_clock: MockClock,
) -> None:
    size = frame_size("x", 1)  # the same for seqs 1-9
    async with running_server(ServerConfig(journal_max_bytes=2 * size + size // 2)) as sim:
        client, created = await sim.open_session()
        assert (await echo(client))["server_event_seq"] == 1
        assert (await echo(client))["server_event_seq"] == 2
        await client.send(append())
        notice = await client.receive()
        assert notice == {
            "type": "session.resync_required",
            "reason": "journal_overflow",
            "dropped_through_seq": 2,
        }
        assert (await client.receive())["server_event_seq"] == 3  # held: 3
        assert (await echo(client))["server_event_seq"] == 4  # held: 3, 4
        await client.send(append())
        assert (await client.receive())["dropped_through_seq"] == 4
        assert (await client.receive())["server_event_seq"] == 5
        assert len(journal_of(sim, created)) == 1
        await next_is_heartbeat_ack(client)


async def test_after_overflow_the_held_events_are_replayed_and_the_dropped_are_a_gap(
    autojump_clock: MockClock,
) -> None:
    size = frame_size("x", 1)
    async with running_server(ServerConfig(journal_max_bytes=2 * size + size // 2)) as sim:
        client, created = await sim.open_session()
        for _ in range(2):
            await echo(client)
        await client.send(append())
        assert (await client.receive())["type"] == "session.resync_required"
        await client.receive()
        await echo(client)  # seq 4; journal holds 3, 4
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 2)
        assert resumed["type"] == "session.resumed"
        assert [(await client2.receive())["server_event_seq"] for _ in range(2)] == [3, 4]
        await next_is_heartbeat_ack(client2)
        await client2.transport.cut()
        # Resume again, with the token client2 was given, and ask for seq 2.
        client3, resumed3 = await sim.resume(created["session_id"], resumed["resume_token"], 1)
        assert resumed3["type"] == "session.resumed"
        gap = await client3.receive()
        assert gap == {
            "type": "session.resync_required",
            "reason": "journal_gap",
            "dropped_through_seq": 2,  # 2 is lost; 3 and 4 are still held
        }
        assert [(await client3.receive())["server_event_seq"] for _ in range(2)] == [3, 4]
        await next_is_heartbeat_ack(client3)
        await client3.send(append())
        assert (await receive_skipping_overflow(client3, 4))["server_event_seq"] == 5


async def test_event_bigger_than_the_journal_is_delivered_with_its_own_seq_dropped(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(journal_max_bytes=120)) as sim:
        client, created = await sim.open_session()
        await echo(client)
        big = "y" * 150
        await client.send(append(big))
        notice = await client.receive()
        assert notice == {
            "type": "session.resync_required",
            "reason": "journal_overflow",
            "dropped_through_seq": 2,
        }
        event = await client.receive()
        assert (event["text"], event["server_event_seq"]) == (big, 2)
        # Not journaled, and the older entries are gone too; the next small one fits.
        assert len(journal_of(sim, created)) == 0
        assert (await echo(client))["server_event_seq"] == 3
        await client.transport.cut()
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 2)
        assert (await client2.receive())["server_event_seq"] == 3
        await next_is_heartbeat_ack(client2)


async def test_first_event_bigger_than_the_journal(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(journal_max_bytes=50)) as sim:
        client, _ = await sim.open_session()
        await client.send(text(1, "z" * 60))
        assert (await client.receive())["dropped_through_seq"] == 1
        assert (await client.receive())["server_event_seq"] == 1


async def test_overflow_while_detached_is_a_gap_to_the_resume_then_the_survivors_follow(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    config = ServerConfig(journal_max_bytes=150)
    async with running_server(config, scripted_factory(engines)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        for n in range(1, 6):
            await engine.emit(f"while away {n}")  # journaled; 1-4 overflow, 5 is held
        assert journal_of(sim, created).floor == 4
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["type"] == "session.resumed"
        gap = await client2.receive()
        assert gap == {
            "type": "session.resync_required",
            "reason": "journal_gap",
            "dropped_through_seq": 4,
        }
        survivor = await client2.receive()
        assert (survivor["text"], survivor["server_event_seq"]) == ("while away 5", 5)
        await next_is_heartbeat_ack(client2)
        await engine.emit("live")
        live = await receive_skipping_overflow(client2, 5)
        assert (live["text"], live["server_event_seq"]) == ("live", 6)


async def test_events_emitted_while_detached_are_replayed_in_order(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []
    async with running_server(engine_factory=scripted_factory(engines)) as sim:
        client, created = await sim.open_session()
        (engine,) = engines
        await client.transport.cut()
        await trio.testing.wait_all_tasks_blocked()
        for n in range(4):
            await engine.emit(str(n))
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 1)
        replayed = [await client2.receive() for _ in range(3)]
        assert [(e["text"], e["server_event_seq"]) for e in replayed] == [
            ("1", 2),
            ("2", 3),
            ("3", 4),
        ]


# -- the TTL ---------------------------------------------------------------------------------


async def test_entries_older_than_the_ttl_are_dropped_quietly(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(journal_ttl_s=10)) as sim:
        client, created = await sim.open_session()
        await echo(client)
        await trio.sleep(11)
        # No notice to the attached client, now or at the next append.
        assert (await echo(client))["server_event_seq"] == 2
        await next_is_heartbeat_ack(client)
        assert len(journal_of(sim, created)) == 1


async def test_a_resume_that_needs_an_expired_entry_gets_a_gap_then_the_fresh_ones(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(journal_ttl_s=10)) as sim:
        client, created = await sim.open_session()
        await echo(client, "old")  # t=0
        await trio.sleep(8)
        await echo(client, "newer")  # t=8
        await client.transport.cut()
        await trio.sleep(3)  # t=11: entry 1 is past the TTL, entry 2 is not
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["type"] == "session.resumed"
        gap = await client2.receive()
        assert gap == {
            "type": "session.resync_required",
            "reason": "journal_gap",
            "dropped_through_seq": 1,  # expired; entry 2 is not
        }
        newer = await client2.receive()
        assert (newer["text"], newer["server_event_seq"]) == ("newer", 2)
        await next_is_heartbeat_ack(client2)


async def test_a_resume_that_needs_only_fresh_entries_is_replayed(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(journal_ttl_s=10)) as sim:
        client, created = await sim.open_session()
        await echo(client, "old")
        await trio.sleep(8)
        await echo(client, "newer")
        await client.transport.cut()
        await trio.sleep(3)
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 1)
        replayed = await client2.receive()
        assert (replayed["text"], replayed["server_event_seq"]) == ("newer", 2)
        await next_is_heartbeat_ack(client2)


async def test_within_the_ttl_everything_is_replayed(autojump_clock: MockClock) -> None:
    async with running_server() as sim:  # journal_ttl_s defaults to 60
        client, created = await sim.open_session()
        await echo(client, "a")
        await client.transport.cut()
        await trio.sleep(25)
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert (await client2.receive())["text"] == "a"


# -- client_event_seq ------------------------------------------------------------------------


async def test_last_received_client_event_seq_is_zero_without_any(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await echo(client)
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["last_received_client_event_seq"] == 0


async def test_client_event_seq_survives_resume_and_resends_are_dropped(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await echo(client, "a", seq=1)
        await echo(client, "b", seq=2)
        await client.transport.cut()
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 2)
        assert resumed["last_received_client_event_seq"] == 2
        # The client resends what it is unsure about: 2 is dropped, 3 is new.
        await client2.send(text(2, "b"))
        await client2.send(text(3, "c"))
        got = await client2.receive()
        assert (got["text"], got["server_event_seq"]) == ("c", 3)


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
