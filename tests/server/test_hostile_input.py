"""What a client sends is bounded in bytes: fragments, a connection's first message, the
engine's input queue and the session's configuration."""

from __future__ import annotations

import json
from typing import Any

import trio
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.core.limits import FIRST_MESSAGE_ENVELOPE
from trio_duplex.testing import ScriptedEngine, running_server, settle

from ..helpers import RawWs, echo

UPDATE = "session.update"


# -- fragments -----------------------------------------------------------------------------


async def test_endless_empty_fragments_in_a_session_end_in_1009(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    # Was: empty continuation frames were kept and never counted: ~32 MB/s, for ever,
    # while the pings between them were answered.
    async with running_server(ServerConfig(max_event_bytes=600)) as sim:
        client = await raw_ws(sim)
        await client.send({"type": UPDATE, "session": {}})
        assert (await client.receive())["type"] == "session.created"
        await client.send_bytes(client.frame("{", fin=False))
        sent = 0
        try:
            for _ in range(1000):
                await client.send_bytes(client.frame("", fin=False))
                sent += 1
                await settle()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        assert await client.receive_until_closed() == []
        assert client.close_code == 1009
        assert sent < 110  # 600 bytes of 6-byte headers


# -- the first message ---------------------------------------------------------------------


async def test_a_first_message_past_the_config_bound_is_1009(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    # Was: a connection with no session could buffer up to max_event_bytes (15 MiB).
    config = ServerConfig(max_config_bytes=1000)
    async with running_server(config) as sim:
        client = await raw_ws(sim)
        big = "a" * (1000 + FIRST_MESSAGE_ENVELOPE)
        await client.send({"type": "input.text.append", "text": big})
        assert await client.receive_until_closed() == []
        assert client.close_code == 1009
        assert sim.server.slots_held == 0


async def test_once_open_a_connection_takes_messages_up_to_max_event_bytes(
    autojump_clock: MockClock,
) -> None:
    config = ServerConfig(max_config_bytes=1000)
    async with running_server(config) as sim:
        client, _ = await sim.open_session()
        text = "b" * 20_000  # far over the first-message bound, under max_event_bytes
        assert (await echo(client, text))["text"] == text


# -- the input queue -----------------------------------------------------------------------


async def test_the_input_queue_is_bounded_in_bytes(autojump_clock: MockClock) -> None:
    # Was: 256 events whatever their size (256 x 15 MiB waiting for a slow engine).
    factory = ScriptedEngine.factory(gated=True)  # takes one event, then waits for us
    config = ServerConfig(max_input_bytes=16_000, max_pending_input=256)
    async with running_server(config, factory) as sim:
        client, _ = await sim.open_session()
        engine = factory.last
        await client.send({"type": "input.text.append", "text": "0" * 5000})
        await settle()  # the engine holds it; the queue is empty again
        for i in range(1, 6):
            await client.send({"type": "input.text.append", "text": f"{i}" * 5000})
        await client.send({"type": "session.heartbeat"})
        answers: list[dict[str, Any]] = []
        while (event := await client.receive())["type"] != "session.heartbeat_ack":
            answers.append(event)
        # The queue takes an event while it holds fewer than 16,000 bytes (protocol v2:
        # was "while the event fits", which a client pacing by the bound cannot know):
        # three ~5 KB events hold 15,090, so a fourth is taken; the fifth is refused.
        assert [(a["type"], a.get("code")) for a in answers] == [("error", "input_backpressure")]
        assert answers[0]["retryable"] is True
        engine.release(4)
        await settle()
        assert [e["text"][0] for e in engine.received] == ["0", "1", "2", "3", "4"]
        # Taken by the engine: the room is back.
        await client.send({"type": "input.text.append", "text": "5" * 5000})
        engine.release(1)
        await settle()
        assert [e["text"][0] for e in engine.received] == ["0", "1", "2", "3", "4", "5"]


# -- the configuration ---------------------------------------------------------------------


def config_of(size: int) -> dict[str, str]:
    """A configuration whose compact JSON is ``size`` bytes (for size >= 10)."""
    value = "v" * (size - len('{"k":""}'))
    assert len(json.dumps({"k": value}, separators=(",", ":"))) == size
    return {"k": value}


async def test_a_first_configuration_over_the_bound_is_refused_and_the_connection_waits(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(max_config_bytes=1000)) as sim:
        client = await sim.connect()
        refused = await client.send_and_receive({"type": UPDATE, "session": config_of(1002)})
        assert refused["type"] == "error"
        assert refused["code"] == "config_too_large"
        assert refused["param"] == "session"
        assert sim.server.slots_held == 0
        created = await client.send_and_receive({"type": UPDATE, "session": config_of(999)})
        assert created["type"] == "session.created"


async def test_updates_are_bounded_by_the_merged_size_and_cost_their_own(
    autojump_clock: MockClock,
) -> None:
    # Was: every update merged and session.updated echoed the whole configuration:
    # 60 updates of 1 MiB cost 1.83 GB sent back.
    async with running_server(ServerConfig(max_config_bytes=1000)) as sim:
        client, created = await sim.open_session({"a": "x" * 300})
        # Replacing a field many times does not add up: each is measured by itself.
        for i in range(60):
            updated = await client.send_and_receive(
                {"type": UPDATE, "session": {"b": f"{i}" + "y" * 400}}
            )
            assert updated["type"] == "session.updated"
            assert updated["session"] == {"b": f"{i}" + "y" * 400}  # only what it set
        # A field that would take the merged configuration past 1000 bytes is refused;
        # the session goes on, its configuration as it was.
        refused = await client.send_and_receive({"type": UPDATE, "session": {"c": "z" * 300}})
        assert refused["code"] == "config_too_large"
        assert (await echo(client, "still here"))["text"] == "still here"
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 61)
        assert resumed["session"] == {"a": "x" * 300, "b": "59" + "y" * 400}
