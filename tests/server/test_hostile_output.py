"""A client that sends but does not read cannot make the server hold its output.

The outbox is bounded in bytes (``max_output_bytes``) whoever fills it, the server's own
answers included, and a write the client does not take in ``write_timeout_s`` ends the
connection. Either way the session detaches and a resume replays what the engine sent.
"""

from __future__ import annotations

import json
import logging
import tracemalloc
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.testing import SimClient, Simulation, running_server, settle

from ..helpers import echo, state_of

HEARTBEAT = {"type": "session.heartbeat"}


async def flood(
    client: SimClient,
    message: str,
    count: int,
    conn: Connection | None = None,
    seen: list[int] | None = None,
) -> int:
    """Send ``message`` up to ``count`` times, reading nothing; returns how many went
    before the server ended the connection. ``seen`` gets ``conn``'s outbox size after
    each."""
    sent = 0
    with trio.move_on_after(60):
        try:
            for _ in range(count):
                await client.send_raw(message)
                sent += 1
                await settle()
                if seen is not None and conn is not None:
                    seen.append(conn.queued)
        except Exception:  # the server cut us: that is the point
            pass
    return sent


def server_side(sim: Simulation, client: SimClient) -> Connection:
    conn = sim.connection_of(client)
    assert conn is not None
    return conn


@pytest.mark.parametrize(
    ("message", "kind"),
    [(json.dumps(HEARTBEAT), "heartbeat"), ("{not json", "invalid_json")],
)
async def test_answers_to_a_client_that_does_not_read_are_bounded_then_cut(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, message: str, kind: str
) -> None:
    # Was: heartbeat acks and error replies were queued without bound (892 MB in 20 s).
    bound = 4096
    config = ServerConfig(max_output_bytes=bound)
    async with running_server(config) as sim:
        client, created = await sim.open_session()
        sid, token = created["session_id"], created["resume_token"]
        await echo(client, "before")
        conn = server_side(sim, client)
        client.transport.hold()  # from now on the client reads nothing
        seen: list[int] = []
        sent = await flood(client, message, 2000, conn, seen)
        await settle()
        assert sent < 2000  # cut: its later messages found the connection gone
        assert conn.close_code == 4003
        assert max(seen) <= bound  # (a push over the bound empties the outbox)
        assert conn.queued == 0  # freed at once, not when the connection is collected
        assert state_of(sim, sid) == "detached"
        again, resumed = await sim.resume(sid, token, 1)
        assert resumed["type"] == "session.resumed"
        assert (await echo(again, "after"))["text"] == "after"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_the_process_does_not_grow_with_a_non_reader(autojump_clock: MockClock) -> None:
    # Memory as Python accounts it, not the bookkeeping: after 20,000 heartbeats that the
    # client never reads, the server holds less than one bound's worth more.
    bound = 64 * 1024
    async with running_server(ServerConfig(max_output_bytes=bound)) as sim:
        client, _ = await sim.open_session()
        client.transport.hold()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await flood(client, json.dumps(HEARTBEAT), 20_000)
            await settle()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 4 * bound, grown  # was ~3 MB here: 150 bytes an ack, for ever


async def test_engine_output_waits_at_half_the_bound_and_a_stuck_write_is_cut(
    autojump_clock: MockClock,
) -> None:
    # Was: 2 MiB echoes to a client that did not read piled up frame by frame (950 MB).
    bound = 64 * 1024
    config = ServerConfig(max_output_bytes=bound, write_timeout_s=15.0)
    async with running_server(config) as sim:
        client, created = await sim.open_session()
        sid, token = created["session_id"], created["resume_token"]
        conn = server_side(sim, client)
        client.transport.hold()
        big = "x" * 8000
        seen: list[int] = []
        for i in range(30):
            await client.send({"type": "input.text.append", "text": f"{i}:{big}"})
            await settle()
            seen.append(conn.queued)
        # The engine waits once half the bound is queued: the outbox never passes it.
        assert conn.close_code is None
        assert max(seen) <= bound
        assert bound / 2 < conn.queued <= bound / 2 + 9000
        start = trio.current_time()
        await client.transport.wait_held()
        await trio.sleep(16)
        await settle()
        # The pump's write waited 15 s for a client that does not read: cut.
        assert state_of(sim, sid) == "detached"
        assert trio.current_time() - start == 16
        again, resumed = await sim.resume(sid, token, 0)
        assert resumed["type"] == "session.resumed"
        replayed: list[dict[str, Any]] = [await again.receive() for _ in range(30)]
        assert [e["text"].split(":")[0] for e in replayed] == [str(i) for i in range(30)]


async def test_an_engine_frame_larger_than_half_the_bound_still_goes_out(
    autojump_clock: MockClock,
) -> None:
    # The bound is on what waits, not on one message: a client that reads gets it.
    async with running_server(ServerConfig(max_output_bytes=4096)) as sim:
        client, _ = await sim.open_session()
        reply = await client.send_and_receive({"type": "input.text.append", "text": "y" * 3000})
        assert reply["text"] == "y" * 3000
        assert (await echo(client, "next"))["text"] == "next"
