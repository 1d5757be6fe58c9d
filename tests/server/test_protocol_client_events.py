"""docs/protocol.md, Other client events (heartbeat, close, engine events and their errors)
and Errors (the shape of every error event), through a server: the codec, the engine and
the socket around the rules. The rules themselves, one each: tests/core/test_protocol.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from unittest.mock import ANY

import pytest
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, running_server

from ..helpers import assert_error_shape, echo

# -- heartbeat -------------------------------------------------------------------------------


async def test_heartbeat_is_answered_with_heartbeat_ack(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        ack = await client.send_and_receive({"type": "session.heartbeat"})
        assert ack == {"type": "session.heartbeat_ack", "session_id": created["session_id"]}
        # Not journaled and it takes no seq from the engine's numbering.
        assert (await echo(client))["server_event_seq"] == 1
        await client.transport.cut()
        client2, _ = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert (await client2.receive())["server_event_seq"] == 1
        ack2 = await client2.send_and_receive({"type": "session.heartbeat"})
        assert ack2["type"] == "session.heartbeat_ack"


# -- session.close ---------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"reason": "done for today"}, {"reason": None}])
async def test_session_close_ends_with_client_close_and_1000(
    autojump_clock: MockClock, extra: dict[str, Any]
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await echo(client)
        await client.send({"type": "session.close", **extra})
        events = await client.receive_until_closed()
        assert events == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "client_close",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1000
        assert sim.server.slots_held == 0


async def test_slot_is_free_when_session_closed_arrives(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        client, _ = await sim.open_session()
        await client.send({"type": "session.close"})
        closed = await client.receive()
        # No await between receiving session.closed and looking.
        assert closed["type"] == "session.closed"
        assert sim.server.slots_held == 0
        assert not sim.server.sessions.registry.sessions
        # So the client may reopen at once.
        _, created = await sim.open_session()
        assert created["type"] == "session.created"


async def test_engine_output_before_the_close_comes_before_session_closed(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []

    def factory(config: Mapping[str, Any]) -> ScriptedEngine:
        engines.append(ScriptedEngine(dict(config)))
        return engines[-1]

    async with running_server(engine_factory=factory) as sim:
        client, _ = await sim.open_session()
        await engines[0].emit("last words")
        await client.send({"type": "session.close"})
        events = await client.receive_until_closed()
        assert [e["type"] for e in events] == ["response.output_text.delta", "session.closed"]
        assert engines[0].cancelled


async def test_closed_session_cannot_be_resumed(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        await client.send({"type": "session.close"})
        await client.receive_until_closed()
        _client2, answer = await sim.resume(created["session_id"], created["resume_token"])
        assert answer["code"] == "session_resume_expired"


# -- events for the engine --------------------------------------------------------------------


async def test_echo_engine_answers_text_and_audio(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        text = await client.send_and_receive({"type": "input.text.append", "text": "héllo"})
        assert text == {
            "type": "response.output_text.delta",
            "text": "héllo",
            "server_event_seq": 1,
        }
        audio = await client.send_and_receive(
            {"type": "input_audio_buffer.append", "audio": "AAECAw=="}
        )
        assert audio == {
            "type": "response.output_audio.delta",
            "audio": "AAECAw==",
            "server_event_seq": 2,
        }


@pytest.mark.parametrize(
    ("event", "param"),
    # (each rule: tests/core/test_protocol.py; here the echo engine's check and its decoder)
    [
        ({"type": "input.text.append", "text": 1}, "text"),
        ({"type": "input_audio_buffer.append"}, "audio"),
    ],
)
async def test_malformed_fields_are_bad_event_from_the_engine_check(
    autojump_clock: MockClock, event: dict[str, Any], param: str
) -> None:
    async with running_server() as sim:
        client, created = await sim.open_session()
        error = await client.send_and_receive({**event, "event_id": "b", "client_event_seq": 1})
        assert_error_shape(error)
        assert error["code"] == "bad_event"
        assert error["param"] == param
        assert error["event_id"] == "b"
        assert error["client_event_seq"] == 1  # v2: which event was refused
        # Non-fatal. Was (v1): the refused event did not count as received. Protocol v2:
        # a refusal for good takes its seq (a resend could only be refused again), so the
        # client's numbering goes on past it under the next-seq rule.
        assert (await echo(client, seq=2))["server_event_seq"] == 1
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["last_received_client_event_seq"] == 2


@pytest.mark.parametrize("message", ["{", "not json", '{"type": "x",}', "", "NaN x"])
async def test_invalid_json_mid_session_is_non_fatal(
    autojump_clock: MockClock, message: str
) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await client.send_raw(message)
        error = await client.receive()
        assert_error_shape(error)
        assert error["code"] == "invalid_json"
        assert (await echo(client))["server_event_seq"] == 1


@pytest.mark.parametrize("escaped", ["\\ud800", "\\udfff", "a\\ud83d", "\\uDC00x"])
async def test_lone_surrogate_escape_is_refused_not_echoed(
    autojump_clock: MockClock, escaped: str
) -> None:
    # Valid UTF-8 on the wire, but a lone surrogate once decoded: it could never be sent
    # back as UTF-8, so it must be refused instead of breaking the connection later.
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await client.send_raw('{"type":"input.text.append","text":"' + escaped + '"}')
        error = await client.receive()
        assert_error_shape(error)
        assert error["code"] == "bad_event"
        assert (await echo(client))["server_event_seq"] == 1


async def test_lone_surrogate_in_event_id_or_config_is_refused(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await client.send_raw('{"type":"nope","event_id":"\\ud800"}')
        error = await client.receive()
        assert error["code"] == "bad_event"
        await client.send_raw('{"type":"session.update","session":{"\\udc00":1}}')
        error = await client.receive()
        assert error["code"] == "bad_event"
        assert (await echo(client))["server_event_seq"] == 1


async def test_escaped_surrogate_pair_is_fine(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await client.send_raw('{"type":"input.text.append","text":"\\ud83d\\ude00"}')
        reply = await client.receive()
        assert reply["text"] == "\U0001f600"


async def test_many_errors_in_a_row_do_not_end_the_session(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        for n in range(100):
            await client.send_raw("{" if n % 2 else '{"type":"nope"}')
        errors = [await client.receive() for _ in range(100)]
        assert {e["code"] for e in errors} == {"invalid_json", "unknown_event"}
        assert (await echo(client))["server_event_seq"] == 1


# -- the shape of every error ---------------------------------------------------------------


async def test_every_error_has_code_message_retryable_and_optional_event_id_param(
    autojump_clock: MockClock,
) -> None:
    engines: list[ScriptedEngine] = []

    def factory(config: Mapping[str, Any]) -> ScriptedEngine:
        engines.append(ScriptedEngine(dict(config), gated=True))
        return engines[-1]

    config = ServerConfig(max_pending_input=1, max_sessions=2)
    async with running_server(config, factory) as sim:
        errors = []
        client, created = await sim.open_session()
        bad_events: list[dict[str, Any]] = [
            {"type": "nope", "event_id": "1"},
            {"type": "input.text.append", "text": "t", "client_event_seq": 0, "event_id": "2"},
            {"type": "session.event_ack", "server_event_seq": 9, "event_id": "3"},
            {"type": "session.resume", "session_id": "x", "resume_token": "y", "event_id": "4"},
        ]
        for event in bad_events:
            errors.append(await client.send_and_receive(event))
        await client.send_raw("{")
        errors.append(await client.receive())
        await client.send({"type": "input.text.append", "text": "a"})
        await client.send({"type": "input.text.append", "text": "b"})
        errors.append(
            await client.send_and_receive(
                {"type": "input.text.append", "text": "c", "event_id": "5"}
            )
        )
        await sim.open_session()
        full = await sim.connect()
        await full.send({"type": "session.update", "session": {}})
        errors.extend(await full.receive_until_closed())
        expired = await sim.connect()
        await expired.send({"type": "session.resume", "session_id": "x", "resume_token": "y"})
        errors.extend(await expired.receive_until_closed())
        wrong = await sim.connect()
        await wrong.send(
            {"type": "session.resume", "session_id": created["session_id"], "resume_token": "y"}
        )
        errors.extend(await wrong.receive_until_closed())
        late = await sim.connect()
        errors.extend(await late.receive_until_closed())  # config_timeout
        codes = [e["code"] for e in errors]
        assert codes == [
            "unknown_event",
            "bad_event",
            "invalid_event_ack",
            "unsupported_session_resume",
            "invalid_json",
            "input_backpressure",
            "resource_exhausted",
            "session_resume_expired",
            "invalid_resume_token",
            "config_timeout",
        ]
        for error in errors:
            assert_error_shape(error)
        assert [e.get("event_id") for e in errors[:4]] == ["1", "2", "3", "4"]
        assert errors[5]["event_id"] == "5"
        assert errors[0]["param"] == "type"
        assert errors[1]["param"] == "client_event_seq"
        assert errors[2]["param"] == "server_event_seq"
        assert errors[5]["retryable"] is True
        assert errors[6]["retryable"] is True
        engines[0].release(2)
