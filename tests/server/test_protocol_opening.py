"""docs/protocol.md, Opening a session, through a server: what only the session shell
decides. The limits ``ServerConfig`` hands to ``session.created``; a first event handed
to the engine after ``session.created``; what the dialect cannot decode; the config
timeout; ``?autostart=1``; admission of any opening event, autostart, and a slot held
through a slow teardown; the delivery rule when the send of ``session.created`` is held,
cut or fails; concurrent opens.

The opening rules' own tests, no trio: what a first message may be and what it opens
(its configuration, a first event other than ``session.update``, the refused first
messages), admission and slots, and resumability once delivered in
tests/core/test_opening.py; the session's states and slots in tests/core/test_session.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.engines.api import EngineSession
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import SimClient, running_server

UPDATE = {"type": "session.update", "session": {}}


class SlowTeardownEngine(EchoEngine):
    """Echo, but its teardown takes 5 s: the session stays CLOSING that long."""

    async def run(self, session: EngineSession) -> None:
        try:
            await super().run(session)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)


async def expect_refused(client: SimClient, code: str, close_code: int) -> dict[str, Any]:
    events = await client.receive_until_closed()
    assert len(events) == 1, events
    error = events[0]
    assert error["type"] == "error"
    assert error["code"] == code
    assert client.close_code == close_code
    return error


# -- what the first message opens ----------------------------------------------------------


async def test_session_created_fields(autojump_clock: MockClock) -> None:
    config = ServerConfig(
        disconnect_grace_s=12.5,
        idle_ttl_s=99.0,
        journal_max_bytes=4321,
        max_event_bytes=7777,
        max_pending_input=33,
        max_input_bytes=44_444,
    )
    async with running_server(config) as sim:
        _, created = await sim.open_session({"k": "v"})
        assert set(created) == {
            "type",
            "session_id",
            "session",
            "resume_token",
            "attachment_generation",
            "limits",
        }
        assert created["type"] == "session.created"
        assert isinstance(created["session_id"], str) and created["session_id"]
        assert isinstance(created["resume_token"], str) and len(created["resume_token"]) >= 32
        assert created["attachment_generation"] == 1
        assert created["session"] == {"k": "v"}
        assert created["limits"] == {
            "disconnect_grace_s": 12.5,
            "idle_ttl_s": 99.0,
            "journal_max_bytes": 4321,
            "max_event_bytes": 7777,
            "max_config_bytes": 64 * 1024,
            "max_pending_input": 33,  # protocol v2
            "max_pending_input_bytes": 44_444,
        }
        assert "server_event_seq" not in created


async def test_default_limits_in_session_created(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        _, created = await sim.open_session()
        assert created["limits"] == {
            "disconnect_grace_s": 30,
            "idle_ttl_s": 300,
            "journal_max_bytes": 8 * 1024 * 1024,
            "max_event_bytes": 15 * 1024 * 1024,
            "max_config_bytes": 64 * 1024,
            "max_pending_input": 256,  # protocol v2
            "max_pending_input_bytes": 16 * 1024 * 1024,
        }


async def test_other_valid_first_event_opens_default_session_and_is_handled(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send({"type": "input.text.append", "text": "first", "client_event_seq": 1})
        created = await client.receive()
        assert created["type"] == "session.created"
        assert created["session"] == {}
        reply = await client.receive()
        assert reply == {
            "type": "response.output_text.delta",
            "text": "first",
            "server_event_seq": 1,
        }
        # The first input counted as received.
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["last_received_client_event_seq"] == 1


BAD_FIRST: list[tuple[str | bytes, str]] = [
    ("{not json", "invalid_json"),
    (b"binary", "bad_event"),
    ("[1]", "bad_event"),
    ('{"type":5}', "bad_event"),
    ('{"type":"input.text.append","text":5}', "bad_event"),
    ('{"type":"input.text.append","text":"x","client_event_seq":0}', "bad_event"),
    ('{"type":"session.update","session":"x"}', "bad_event"),
    ('{"type":"session.update"}', "bad_event"),
    ('{"type":"no.such.event"}', "unknown_event"),
    ('{"type":"session.event_ack","server_event_seq":1}', "invalid_event_ack"),
    ('{"type":"session.event_ack","server_event_seq":-1}', "invalid_event_ack"),
    ('{"type":"session.event_ack","server_event_seq":"0"}', "invalid_event_ack"),
    ('{"type":"session.event_ack"}', "invalid_event_ack"),
]


SHELL_BAD_FIRST = BAD_FIRST[:5]
"""What the dialect cannot decode, and a text the echo engine's own check refuses (the
rest of the list: tests/core/test_opening.py)."""


@pytest.mark.parametrize(("message", "code"), SHELL_BAD_FIRST)
async def test_bad_first_message_opens_no_session(
    autojump_clock: MockClock, message: str | bytes, code: str
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send_raw(message)
        error = await client.receive()
        assert error["type"] == "error"
        assert error["code"] == code
        assert error["retryable"] is False
        assert sim.server.slots_held == 0
        assert not sim.server.sessions.registry.sessions
        # The connection may still open a session.
        created = await client.send_and_receive(UPDATE)
        assert created["type"] == "session.created"
        assert sim.server.slots_held == 1


async def test_config_timeout_without_a_first_message(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(config_timeout_s=7)) as sim:
        client = await sim.connect()
        start = trio.current_time()
        error = await expect_refused(client, "config_timeout", 4002)
        assert trio.current_time() - start == pytest.approx(7)
        assert error["retryable"] is False
        assert sim.server.slots_held == 0


async def test_config_timeout_default_is_10_seconds(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        start = trio.current_time()
        await trio.sleep(9.9)
        assert client.close_code is None
        await expect_refused(client, "config_timeout", 4002)
        assert trio.current_time() - start == pytest.approx(10)


async def test_bad_first_messages_do_not_restart_the_config_timeout(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(config_timeout_s=10)) as sim:
        client = await sim.connect()
        start = trio.current_time()
        for message, code in BAD_FIRST[:4] + BAD_FIRST[-4:]:
            await trio.sleep(1)
            await client.send_raw(message)
            assert (await client.receive())["code"] == code
        assert trio.current_time() - start == pytest.approx(8)
        await expect_refused(client, "config_timeout", 4002)
        assert trio.current_time() - start == pytest.approx(10)
        assert sim.server.slots_held == 0


async def test_first_message_just_before_the_timeout_opens(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(config_timeout_s=10)) as sim:
        client = await sim.connect()
        await trio.sleep(9.9)
        created = await client.send_and_receive(UPDATE)
        assert created["type"] == "session.created"
        # An open session never gets a config_timeout.
        await trio.sleep(30)
        ack = await client.send_and_receive({"type": "session.heartbeat"})
        assert ack["type"] == "session.heartbeat_ack"


# -- ?autostart=1 ------------------------------------------------------------------------


async def test_autostart_opens_a_default_session_on_connect(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect("/v1/duplex?autostart=1")
        created = await client.receive()  # nothing sent
        assert created["type"] == "session.created"
        assert created["session"] == {}
        assert created["attachment_generation"] == 1
        assert sim.server.slots_held == 1
        reply = await client.send_and_receive({"type": "input.text.append", "text": "a"})
        assert reply["server_event_seq"] == 1


async def test_autostart_session_update_is_an_update(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect("/v1/duplex?autostart=1")
        created = await client.receive()
        updated = await client.send_and_receive({"type": "session.update", "session": {"x": 1}})
        assert updated == {
            "type": "session.updated",
            "session_id": created["session_id"],
            "session": {"x": 1},
            "server_event_seq": 1,
        }


async def test_autostart_session_never_gets_a_config_timeout(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(config_timeout_s=5)) as sim:
        client = await sim.connect("/v1/duplex?autostart=1")
        assert (await client.receive())["type"] == "session.created"
        await trio.sleep(20)
        ack = await client.send_and_receive({"type": "session.heartbeat"})
        assert ack["type"] == "session.heartbeat_ack"


@pytest.mark.parametrize("query", ["?autostart=0", "?autostart=", "?other=1"])
async def test_without_autostart_1_the_server_waits_for_a_first_message(
    autojump_clock: MockClock, query: str
) -> None:
    async with running_server(ServerConfig(config_timeout_s=5)) as sim:
        client = await sim.connect("/v1/duplex" + query)
        await expect_refused(client, "config_timeout", 4002)
        assert sim.server.slots_held == 0


# -- admission -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [
        {"type": "input.text.append", "text": "x"},
        {"type": "session.heartbeat"},
        {"type": "session.close"},
    ],
)
async def test_full_server_refuses_any_opening_event(
    autojump_clock: MockClock, first: dict[str, Any]
) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        await sim.open_session()
        client = await sim.connect()
        await client.send(first)
        await expect_refused(client, "resource_exhausted", 1013)


async def test_full_server_refuses_autostart(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        await sim.open_session()
        client = await sim.connect("/v1/duplex?autostart=1")
        await expect_refused(client, "resource_exhausted", 1013)


async def test_resource_exhausted_echoes_event_id(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        await sim.open_session()
        client = await sim.connect()
        await client.send({**UPDATE, "event_id": "open-1"})
        error = await expect_refused(client, "resource_exhausted", 1013)
        assert error.get("event_id") == "open-1"


async def test_a_closing_session_holds_its_slot_until_teardown_finished(
    autojump_clock: MockClock,
) -> None:
    config = ServerConfig(max_sessions=1, engine_stop_timeout_s=60)  # slow, not stuck
    async with running_server(config, SlowTeardownEngine) as sim:
        first, _ = await sim.open_session()
        await first.send({"type": "session.close"})
        start = trio.current_time()
        await trio.sleep(4)
        client = await sim.connect()
        await client.send(UPDATE)
        await expect_refused(client, "resource_exhausted", 1013)
        closed = await first.receive()
        assert closed["type"] == "session.closed"
        assert trio.current_time() - start == pytest.approx(5)
        assert sim.server.slots_held == 0
        await sim.open_session()


# -- the delivery rule ---------------------------------------------------------------------


async def test_session_is_not_resumable_before_created_is_delivered(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        opening = await sim.connect()
        gate = opening.transport.hold()
        await opening.send(UPDATE)
        await trio.testing.wait_all_tasks_blocked()
        (session_id,) = sim.server.sessions.registry.sessions
        other, answer = await sim.resume(session_id, "any-token")
        assert answer["code"] == "session_resume_expired"
        assert await other.receive_until_closed() == []
        assert other.close_code == 4001
        gate.set()
        created = await opening.receive()
        assert created["session_id"] == session_id


@pytest.mark.parametrize("fault", ["cut", "fail_sends"])
async def test_undelivered_created_closes_the_session_and_frees_the_slot_at_once(
    autojump_clock: MockClock, fault: str
) -> None:
    async with running_server(ServerConfig(max_sessions=1, disconnect_grace_s=30)) as sim:
        opening = await sim.connect()
        gate = opening.transport.hold()
        await opening.send(UPDATE)
        await trio.testing.wait_all_tasks_blocked()
        (session,) = sim.server.sessions.registry.sessions.values()
        start = trio.current_time()
        if fault == "cut":
            await opening.transport.cut()
        else:
            opening.transport.fail_sends = True
            gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sim.server.slots_held == 0
        assert not sim.server.sessions.registry.sessions
        assert session.terminal is not None
        assert session.terminal.reason == "session_created_undelivered"
        assert trio.current_time() - start < 1  # not after the grace period
        # Nobody can ever resume it, and its slot is free for someone else.
        client, answer = await sim.resume(session.id, "whatever")
        assert answer["code"] == "session_resume_expired"
        await client.receive_until_closed()
        assert client.close_code == 4001
        await sim.open_session()


async def test_concurrent_opens_never_overshoot_max_sessions(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_sessions=3)) as sim:
        clients = [await sim.connect() for _ in range(10)]
        answers: list[str] = []

        async def open_one(client: SimClient) -> None:
            await client.send(UPDATE)
            answers.append((await client.receive())["type"])

        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(open_one, client)
        assert sorted(answers) == ["error"] * 7 + ["session.created"] * 3
        assert sim.server.slots_held == 3


async def test_undelivered_created_with_autostart_frees_the_slot_at_once(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        stream, faulty = await sim.listener.connect()
        first_gate = faulty.hold()  # holds the HTTP 101 answer
        await stream.send_all(
            b"GET /v1/duplex?autostart=1 HTTP/1.1\r\nHost: sim\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        await trio.testing.wait_all_tasks_blocked()
        faulty.hold()  # the next send, session.created, waits at a new gate
        first_gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert faulty.sends_completed == 1
        (session,) = sim.server.sessions.registry.sessions.values()
        await faulty.cut()
        await trio.testing.wait_all_tasks_blocked()
        assert session.terminal is not None
        assert session.terminal.reason == "session_created_undelivered"
        assert sim.server.slots_held == 0
        await sim.open_session()
