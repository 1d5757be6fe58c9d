"""docs/protocol.md, input flow control (protocol v2): ``input.consumed`` reports, sent
when consumption since the last one reaches half a bound, never per event; refusals for
good count as consumed; clients that number nothing get no reports."""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import ScriptedEngine, SimClient, running_server, settle


def text(seq: int, value: str = "x") -> dict[str, Any]:
    return {"type": "input.text.append", "text": value, "client_event_seq": seq}


def consumed(seq: int) -> tuple[str, int]:
    return ("input.consumed", seq)


async def stream(client: SimClient) -> list[tuple[str, Any]]:
    """What arrived before a heartbeat's answer: (type, its seq or text or code)."""
    await client.send({"type": "session.heartbeat"})
    seen: list[tuple[str, Any]] = []
    while (event := await client.receive())["type"] != "session.heartbeat_ack":
        value = event.get("consumed_client_event_seq", event.get("text", event.get("code")))
        seen.append((event["type"], value))
    return seen


async def test_consumption_is_reported_every_half_bound_and_when_drained(
    autojump_clock: MockClock,
) -> None:
    factory = ScriptedEngine.factory(gated=True)
    async with running_server(ServerConfig(max_pending_input=8), factory) as sim:
        client, _ = await sim.open_session()
        for seq in range(1, 9):  # 1 is taken at once, 2-8 wait: the bound is reached
            await client.send(text(seq, str(seq)))
        await settle()
        factory.last.release(8)
        await settle()
        delta = "response.output_text.delta"
        assert await stream(client) == [
            *[(delta, "1"), (delta, "2"), (delta, "3")],
            consumed(4),  # 4 taken: half the bound
            *[(delta, "4"), (delta, "5"), (delta, "6"), (delta, "7")],
            consumed(8),
            (delta, "8"),
        ]
        # Two reports for eight events; and the window is back: 8 more are taken.
        for seq in range(9, 17):
            await client.send(text(seq))
        factory.last.release(8)
        await settle()
        assert [e for e in await stream(client) if e[0] != delta] == [consumed(12), consumed(16)]


async def test_reports_count_bytes_too(autojump_clock: MockClock) -> None:
    factory = ScriptedEngine.factory(gated=True)
    config = ServerConfig(max_pending_input=256, max_input_bytes=20_000)
    async with running_server(config, factory) as sim:
        client, _ = await sim.open_session()
        for seq in range(1, 5):
            await client.send(text(seq, "b" * 5000))
        factory.last.release(4)
        await settle()
        # 10,000 bytes (half the bound) are reached by the second ~5 KB event.
        assert [e for e in await stream(client) if e[0] == "input.consumed"] == [
            consumed(2),
            consumed(4),
        ]


async def test_a_refusal_for_good_takes_its_seq_and_counts_as_consumed(
    autojump_clock: MockClock,
) -> None:
    async with running_server(ServerConfig(max_pending_input=2)) as sim:  # a report each
        client, _ = await sim.open_session()
        bad = {"type": "no.such.event", "client_event_seq": 1}
        assert await client.send_and_receive(bad) == {
            "type": "error",
            "code": "unknown_event",
            "message": "event type 'no.such.event' is not accepted",
            "retryable": False,
            "param": "type",
            "client_event_seq": 1,
        }
        assert await client.receive() == {"type": "input.consumed", "consumed_client_event_seq": 1}
        assert (await client.send_and_receive(text(2)))["type"] == "input.consumed"
        assert (await client.receive())["text"] == "x"


async def test_a_client_that_numbers_nothing_gets_no_reports(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_pending_input=2)) as sim:
        client, _ = await sim.open_session()
        for _ in range(6):
            await client.send({"type": "input.text.append", "text": "v1"})
        await settle()
        assert [kind for kind, _ in await stream(client)] == ["response.output_text.delta"] * 6


async def test_after_a_backpressure_refusal_nothing_overtakes_the_refused_event(
    autojump_clock: MockClock,
) -> None:
    factory = ScriptedEngine.factory(gated=True)
    async with running_server(ServerConfig(max_pending_input=1), factory) as sim:
        client, created = await sim.open_session()
        await client.send(text(1, "a"))  # taken: the engine waits for a permit
        await client.send(text(2, "b"))  # queued: the bound is reached
        await client.send(text(3, "c"))  # refused: backpressure
        await client.send(text(4, "d"))  # refused: 3 is expected
        assert await stream(client) == [
            consumed(1),
            ("error", "input_backpressure"),
            ("error", "unexpected_client_event_seq"),
        ]
        factory.last.release(4)
        await settle()
        for seq, value in [(3, "c"), (4, "d")]:  # the resend, from the refused seq
            await client.send(text(seq, value))
            await settle()
        assert [e["text"] for e in factory.last.received] == ["a", "b", "c", "d"]
        await client.transport.cut()
        _, resumed = await sim.resume(created["session_id"], created["resume_token"], 0)
        assert resumed["last_received_client_event_seq"] == 4
        assert resumed["consumed_client_event_seq"] == 4
