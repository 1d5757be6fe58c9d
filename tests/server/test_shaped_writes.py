"""A shaped ``send`` (one engine event, several OpenAI events) goes out in one write, and
still waits for a congested connection.

The OpenAI dialect's shaper turns ``response.created`` into four events and
``response.done`` into five; the runner sequences each, then writes their frames
together (``Connection.push_many``), as ``send_many``'s are written. Over a real socket
(only real sockets are written directly: in-memory streams always take the pump, which
batches whatever queued) every ``os.write`` is counted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from websockets.trio.client import connect

from trio_duplex import ServerConfig
from trio_duplex.engines.api import Engine, EngineSession
from trio_duplex.server.server import DuplexServer
from trio_duplex.server.sessions.websocket import DirectWrite
from trio_duplex.testing import running_server

from ..helpers import TEXT_RESPONSE

Event = dict[str, Any]
SENDS = ("response.created", "response.output_text.delta", "response.done")
SHAPED = TEXT_RESPONSE


class Responder(Engine):
    """Each ``response.create`` is answered ``TURNS`` times: created, one text delta,
    done (three ``send``s each). ``sent`` counts the sends that returned."""

    accepts = frozenset({"response.create"})
    TURNS = 1

    def __init__(self, config: Any = None) -> None:
        self.sent = 0

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            if event["type"] == "response.create":
                for n in range(self.TURNS):
                    await self.respond(session, f"resp_{n}")

    async def respond(self, session: EngineSession, rid: str) -> None:
        await session.send({"type": "response.created", "response_id": rid})
        self.sent += 1
        await session.send({"type": "response.output_text.delta", "response_id": rid, "text": "hi"})
        self.sent += 1
        await session.send({"type": "response.done", "response_id": rid})
        self.sent += 1


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    server = DuplexServer(ServerConfig(port=0), Responder)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, listeners)
        with trio.fail_after(10):
            yield f"ws://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


async def test_each_shaped_send_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    write = DirectWrite.write

    def counted(self: DirectWrite, data: bytes) -> bool:
        writes.append(len(data))
        return write(self, data)

    monkeypatch.setattr(DirectWrite, "write", counted)
    async with serving() as url, connect(f"{url}/v1/realtime") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        writes.clear()
        await ws.send(json.dumps({"type": "response.create"}))
        got = [json.loads(await ws.recv()) for _ in SHAPED]
        written = len(writes)  # (not the close frame on the way out)
    assert [e["type"] for e in got] == SHAPED
    seqs = [e["server_event_seq"] for e in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(SHAPED)))
    # Was one write per shaped event: ten for the three sends.
    assert written == len(SENDS)


class Flood(Responder):
    TURNS = 20


def shaped_of(sends: int) -> int:
    """The events the shaper makes of the engine's first ``sends`` sends."""
    per_send = (4, 1, 5)
    return sum(per_send[n % 3] for n in range(sends))


async def test_a_shaped_send_still_waits_for_a_congested_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ServerConfig(max_pending_output=2, journal_max_bytes=1 << 20)
    async with running_server(config, Flood, fail_after_s=60) as sim:
        client = await sim.connect("/v1/realtime")
        assert (await client.receive())["type"] == "session.created"
        (session,) = sim.sessions()
        engine = sim.runner(session.id).engine
        assert isinstance(engine, Flood)
        before = session.journal.head
        client.transport.hold()  # the pump's next write waits: the outbox fills up
        await client.send({"type": "response.create"})
        await trio.testing.wait_all_tasks_blocked()
        # The engine waits in a send, with what the sends that returned made sequenced,
        # and part or all of what the one it waits in makes; nothing of the next.
        assert engine.sent < 3 * Flood.TURNS
        assert before + shaped_of(engine.sent) < session.journal.head
        assert session.journal.head <= before + shaped_of(engine.sent + 1)
        client.transport.release()
        got = [await client.receive() for _ in range(len(SHAPED) * Flood.TURNS)]
        assert engine.sent == 3 * Flood.TURNS
        await client.aclose()
    assert [e["type"] for e in got] == SHAPED * Flood.TURNS
    assert [e["server_event_seq"] for e in got] == list(range(before + 1, before + len(got) + 1))
