"""trio_duplex.engines.aio: an engine written with asyncio has a trio engine's contract.

The echo engine's conformance set runs over both ``EchoEngine`` and ``AsyncioEcho`` (the
same echo, written with an asyncio.Queue, a TaskGroup and asyncio.sleep). Then, for the
asyncio engine only: its session's end cancels it wherever it waits; whatever it raises,
an asyncio.CancelledError of its own included, ends only its session; one that ignores
its cancellation is abandoned; a migration stop leaves a snapshot that matches what
was sequenced. All under MockClock (the session's asyncio loop reads trio's clock).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import sniffio
import trio
from trio.testing import MockClock, wait_all_tasks_blocked
from websockets.sync.client import connect

from trio_duplex import ServerConfig
from trio_duplex.core.events import Reason
from trio_duplex.engines.aio import EVERY, AsyncioEngine, AsyncioSession
from trio_duplex.engines.api import (
    Engine,
    EngineFactory,
    EngineSession,
    Event,
    Inbox,
    engine_problem,
)
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import running_server, settle

from ..helpers import Serve, echo
from .asyncio_engines import STAGES, AsyncioBatchEcho, AsyncioEcho, Busy, Stages, Taker

ECHOES: dict[str, EngineFactory] = {
    "trio": EchoEngine,
    "asyncio": AsyncioEcho,
    "asyncio-batches": AsyncioBatchEcho,  # (receive_batch and send_many, from asyncio)
}


@pytest.fixture(params=list(ECHOES))
def echo_factory(request: pytest.FixtureRequest) -> EngineFactory:
    return ECHOES[request.param]


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def text(value: str) -> dict[str, Any]:
    return {"type": "input.text.append", "text": value}


# -- the echo engine's conformance, over both --------------------------------------------


async def test_echoes_text_and_audio_in_order(
    autojump_clock: MockClock, echo_factory: EngineFactory
) -> None:
    pcm = [bytes([n]) * 480 for n in range(3)]  # 10 ms of 24 kHz PCM16 each
    async with running_server(engine_factory=echo_factory) as sim:
        client, _ = await sim.open_session()
        for n in range(3):
            await client.send(text(f"t{n}"))
            audio = base64.b64encode(pcm[n]).decode()
            await client.send({"type": "input_audio_buffer.append", "audio": audio})
        got = [await client.receive() for _ in range(6)]
        assert [e["server_event_seq"] for e in got] == list(range(1, 7))
        assert [(e["type"], e.get("text")) for e in got[::2]] == [
            ("response.output_text.delta", f"t{n}") for n in range(3)
        ]
        assert [base64.b64decode(e["audio"]) for e in got[1::2]] == pcm
        refused = await client.send_and_receive({"type": "input.text.append", "text": 5})
        assert (refused["code"], refused["param"]) == ("bad_event", "text")  # its check


async def test_resume_replays_what_the_client_missed(
    autojump_clock: MockClock, echo_factory: EngineFactory
) -> None:
    async with running_server(engine_factory=echo_factory) as sim:
        client, created = await sim.open_session()
        await echo(client, "one")
        await client.send(text("two"))
        await client.send(text("three"))
        await settle()  # answered while the client reads nothing more
        await client.transport.cut()
        again, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["type"] == "session.resumed"
        replayed = [await again.receive() for _ in range(2)]
        assert [(e["server_event_seq"], e["text"]) for e in replayed] == [(2, "two"), (3, "three")]
        assert (await echo(again, "four"))["server_event_seq"] == 4


async def test_close_ends_the_session_and_frees_its_slot(
    autojump_clock: MockClock, echo_factory: EngineFactory
) -> None:
    async with running_server(ServerConfig(max_sessions=1), echo_factory) as sim:
        client, created = await sim.open_session()
        await echo(client)
        await client.send({"type": "session.close"})
        assert await client.receive_until_closed() == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "client_close",
                "usage": ANY,
            }
        ]
        assert client.close_code == 1000
        again, _ = await sim.open_session()  # max_sessions=1: the slot is free
        await echo(again)


async def test_send_waits_while_the_connection_is_congested(
    autojump_clock: MockClock, echo_factory: EngineFactory
) -> None:
    bound = 64 * 1024
    async with running_server(ServerConfig(max_output_bytes=bound), echo_factory) as sim:
        client, _ = await sim.open_session()
        conn = sim.connection_of(client)
        assert conn is not None
        gate = client.transport.hold()
        big = "x" * 8000
        for n in range(20):
            await client.send(text(f"{n}:{big}"))
            await settle()
            assert conn.queued <= bound / 2 + 9000  # the engine waits at half the bound
        assert conn.congested and conn.close_code is None
        gate.set()
        client.transport.release()
        got = [await client.receive() for _ in range(20)]
        assert [e["text"].split(":")[0] for e in got] == [str(n) for n in range(20)]


# -- cancellation ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES)
async def test_the_sessions_end_cancels_the_engine_where_it_waits(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, stage: str
) -> None:
    made: list[Stages] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(Stages(config))
        return made[-1]

    config = ServerConfig(max_output_bytes=64 * 1024)
    async with running_server(config, factory) as sim:
        client, created = await sim.open_session()
        engine = made[-1]
        if stage == "send":
            client.transport.hold()  # the client reads nothing: send waits
        await client.send(text(stage))
        await settle()
        assert engine.at == stage and engine.cancelled_at is None
        if stage == "send":
            conn = sim.connection_of(client)
            assert conn is not None and conn.congested
            sent = engine.sent
        await client.send({"type": "session.close"})
        await settle()
        assert engine.cancelled_at == stage  # its asyncio.CancelledError, at that await
        assert sim.session(created["session_id"]) is None  # returned: the slot is free
        if stage == "send":
            assert engine.sent == sent  # cancelled in that send, not after it
            client.transport.release()
        closed = await client.receive_until_closed()
        assert (closed[-1]["type"], closed[-1]["reason"]) == ("session.closed", "client_close")
        engine.release.set()
        await trio.to_thread.run_sync(engine.pool.shutdown)
    assert errors_logged(caplog) == []


@pytest.mark.parametrize(
    ("what", "logged"),
    [("raise-cancelled", "EngineCancelledItself"), ("raise-value", "ValueError")],
)
async def test_what_the_engine_raises_ends_only_its_session_as_engine_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture, what: str, logged: str
) -> None:
    async with running_server(engine_factory=Stages) as sim:
        bystander, _ = await sim.open_session()
        await bystander.send(text("receive"))
        victim, created = await sim.open_session()
        await victim.send(text(what))
        events = await victim.receive_until_closed()
        assert [(e["type"], e["reason"]) for e in events] == [("session.closed", "engine_error")]
        assert victim.close_code == 1011
        await bystander.send({"type": "session.heartbeat"})
        assert (await bystander.receive())["type"] == "session.heartbeat_ack"
        assert sim.server.slots_held == 1
    assert errors_logged(caplog) == [f"engine of session {created['session_id']} failed"]
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.exc_info is not None and type(record.exc_info[1]).__name__ == logged


async def test_an_engine_that_ignores_cancellation_is_abandoned_and_disturbs_no_other(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    made: list[Stages] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(Stages(config))
        return made[-1]

    async with running_server(ServerConfig(), factory) as sim:  # engine_stop_timeout_s 5
        other, _ = await sim.open_session()
        client, created = await sim.open_session()
        stubborn = made[-1]
        await client.send(text("ignore"))
        await settle()
        await client.send({"type": "session.close"})
        start = trio.current_time()
        closed = await client.receive_until_closed()
        assert trio.current_time() - start == pytest.approx(5)
        assert [(e["type"], e["reason"]) for e in closed] == [("session.closed", "client_close")]
        assert stubborn.swallowed == 1 and sim.server.abandoned_engines == 1
        assert (await sim.open_session())[1]["type"] == "session.created"
        await other.send({"type": "session.heartbeat"})
        assert (await other.receive())["type"] == "session.heartbeat_ack"
        stubborn.wake.set()  # it returns at last: nothing is done twice
        await wait_all_tasks_blocked()
        assert sim.server.abandoned_engines == 0
    assert errors_logged(caplog) == [
        f"engine of session {created['session_id']} did not return within 5.0s of its "
        "cancellation; abandoned (its task is left running, the session ends without it)"
    ]


async def test_two_sessions_engines_do_not_disturb_each_other(autojump_clock: MockClock) -> None:
    async with running_server(engine_factory=AsyncioEcho) as sim:
        first, _ = await sim.open_session()
        second, _ = await sim.open_session()
        for n in range(5):
            await first.send(text(f"a{n}"))
            await second.send(text(f"b{n}"))
        assert [(await first.receive())["text"] for _ in range(5)] == [f"a{n}" for n in range(5)]
        await second.send({"type": "session.close"})  # its loop closes; the other's runs on
        assert [(await second.receive())["text"] for _ in range(5)] == [f"b{n}" for n in range(5)]
        closed = await second.receive_until_closed()
        assert [(e["type"], e["reason"]) for e in closed] == [("session.closed", "client_close")]
        assert (await echo(first, "still"))["server_event_seq"] == 6


# -- migration ----------------------------------------------------------------------------


@pytest.mark.parametrize("passes", [0, 1, 3])
async def test_a_migration_stop_leaves_a_snapshot_that_matches_what_was_sequenced(
    autojump_clock: MockClock, passes: int
) -> None:
    made: list[AsyncioEcho] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(AsyncioEcho(config))
        return made[-1]

    config = ServerConfig(max_output_bytes=64 * 1024)
    async with running_server(config, factory, fail_after_s=600) as sim:
        client, created = await sim.open_session()
        client.transport.hold(after=passes)  # the engine's sends wait from there on
        big = "x" * 8000
        sent = [f"{n:02}:{big}" for n in range(12)]
        for value in sent:
            await client.send(text(value))
        await settle()
        runner = sim.runner(created["session_id"])
        frozen = await runner.freeze()
        assert frozen is not None
        answered = runner.session.usage.events_out  # (the engine's events)
        state = frozen.engine_state
        assert isinstance(state, dict)
        unanswered = [value[:3] for value in state["unanswered"]]
        pending = [event["text"][:3] for event, _ in frozen.pending_input]
        # every input is sequenced, or in the snapshot, or still queued: once each, in order
        assert [value[:3] for value in sent[answered:]] == unanswered + pending
        assert 0 < answered < len(sent) and unanswered
        client.transport.release()
        runner.end(Reason.MIGRATED)
        got = [e["text"][:3] for e in await client.receive_until_closed()]
        assert got == [value[:3] for value in sent[: len(got)]] and len(got) <= answered


async def test_a_send_that_a_migration_stop_lets_finish_returns_and_the_cancel_comes_next(
    autojump_clock: MockClock,
) -> None:
    # The engine waits in send for a congested connection; the freeze lets that send
    # return (it was sequenced) and the engine must then stop at its next await.
    made: list[Stages] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(Stages(config))
        return made[-1]

    async with running_server(ServerConfig(max_output_bytes=64 * 1024), factory) as sim:
        client, created = await sim.open_session()
        client.transport.hold()
        await client.send(text("send"))
        await settle()
        runner = sim.runner(created["session_id"])
        start = trio.current_time()
        frozen = await runner.freeze()
        assert trio.current_time() == start  # stopped at once, not at the stop timeout
        assert frozen is not None
        assert frozen.engine_state == {"sent": runner.session.usage.events_out}
        assert made[-1].cancelled_at == "after-send"  # at the await after that send
        client.transport.release()
        runner.end(Reason.MIGRATED)
        await client.receive_until_closed()


# -- loading -------------------------------------------------------------------------------


def test_engine_problem_accepts_an_asyncio_engine_and_refuses_one_without_run() -> None:
    assert engine_problem(AsyncioEcho({})) is None

    class NoRun(AsyncioEngine):
        accepts = frozenset({"input.text.append"})

    assert engine_problem(NoRun()) == "which does not implement 'run'"


async def test_the_asyncio_handle_is_an_engine_session(autojump_clock: MockClock) -> None:
    seen: list[EngineSession] = []

    class Look(AsyncioEngine):
        accepts = frozenset({"input.text.append"})

        async def run(self, session: EngineSession) -> None:
            seen.append(session)
            await session.send({"type": "response.output_text.delta", "text": session.config["x"]})

    async with running_server(engine_factory=lambda config: Look()) as sim:
        client, _ = await sim.open_session({"x": "configured"})
        assert (await client.receive())["text"] == "configured"
    (handle,) = seen
    assert isinstance(handle, AsyncioSession)


# -- through `trio-duplex serve` ------------------------------------------------------------


@pytest.mark.integration
def test_an_asyncio_engine_serves_outside_clients(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    server = serve("--engine", "tests.engines.asyncio_engines:AsyncioEcho")
    with (
        connect(server.url, open_timeout=10) as first,
        connect(server.url, open_timeout=10) as second,
    ):
        clients = [first, second]
        for ws in clients:
            ws.send(json.dumps({"type": "session.update", "session": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for n in range(3):
            for i, ws in enumerate(clients):
                ws.send(json.dumps(text(f"{i}:{n}")))
        for i, ws in enumerate(clients):
            got = [json.loads(ws.recv(timeout=10)) for _ in range(3)]
            assert [(e["server_event_seq"], e["text"]) for e in got] == [
                (n + 1, f"{i}:{n}") for n in range(3)
            ]
        clients[0].send(json.dumps({"type": "session.close"}))
        closed = json.loads(clients[0].recv(timeout=10))
        assert (closed["type"], closed["reason"]) == ("session.closed", "client_close")
        clients[1].send(json.dumps(text("after")))
        assert json.loads(clients[1].recv(timeout=10))["text"] == "after"


# -- the bridge's paths: input taken at once or waited for, sends that wait ----------------


def bare_session(inbox: Inbox, sent: list[Event]) -> EngineSession:
    """A session handle outside a server: its input queued in ``inbox``, its output in
    ``sent`` (never congested)."""

    async def emit(event: Event) -> None:
        sent.append(event)

    return EngineSession("s", {}, inbox, emit)


def queued(count: int) -> Inbox:
    inbox = Inbox(count)
    for n in range(count):
        inbox.put_nowait(text(str(n)))
    return inbox


async def test_queued_input_is_taken_without_starving_other_tasks(
    autojump_clock: MockClock,
) -> None:
    engine, inbox = Taker(), queued(64)
    rounds = 0

    async def count_rounds() -> None:
        nonlocal rounds
        while len(engine.taken) < 64:
            rounds += 1
            await trio.lowlevel.checkpoint()
        inbox.close()  # the engine's `async for` ends

    async with trio.open_nursery() as nursery:
        nursery.start_soon(count_rounds)
        await engine.run_in_trio(bare_session(inbox, []))
    assert engine.taken == [str(n) for n in range(64)]
    # It yields to trio every EVERY events taken at once (Pace's round): the others ran
    # between (without the yields, the 64 would be taken in one step: one round at most).
    assert rounds >= 64 // EVERY - 1


async def test_a_cancel_among_queued_input_takes_each_event_once_or_not_at_all(
    autojump_clock: MockClock,
) -> None:
    engine, inbox = Taker(), queued(40)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_it_has_taken() -> None:
                while not engine.taken:
                    await trio.lowlevel.checkpoint()
                scope.cancel()  # (as the session's end or a migration stop would)

            nursery.start_soon(cancel_once_it_has_taken)
            await engine.run_in_trio(bare_session(inbox, []))
    left = [event["text"] for event, _ in inbox.pending()]
    # What a receive returned, the engine has; what it did not, is still queued.
    assert engine.taken + left == [str(n) for n in range(40)]
    assert engine.taken and left  # cancelled between two of its yields, not at the end


async def test_a_receive_the_engine_cancels_itself_takes_nothing(
    autojump_clock: MockClock,
) -> None:
    made: list[Busy] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(Busy(config, timeout=1.0))
        return made[-1]

    async with running_server(engine_factory=factory) as sim:
        client, _ = await sim.open_session()
        await trio.sleep(2)  # (the clock's: its wait_for gives up after 1 s)
        assert made[-1].timed_out
        reply = await client.send_and_receive(text("echo"))  # the next receive gets it
        assert (reply["server_event_seq"], reply["text"]) == (1, "echo")
        assert (await echo(client, "more"))["text"] == "more"


async def test_other_tasks_of_the_engine_run_while_a_send_waits(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    made: list[Busy] = []

    def factory(config: Mapping[str, Any]) -> Engine:
        made.append(Busy(config))
        return made[-1]

    async with running_server(ServerConfig(max_output_bytes=64 * 1024), factory) as sim:
        client, created = await sim.open_session()
        engine = made[-1]
        client.transport.hold()
        await client.send(text("go"))
        await settle()
        sent, ticks = engine.sent, engine.ticks
        await trio.sleep(10)
        assert engine.sent == sent  # its send still waits...
        assert engine.ticks >= ticks + 9  # ...and its loop goes on: its timers fire
        client.transport.release()
        await client.receive()
        await settle()
        assert engine.sent > sent  # drained: the send returned, and the next ones
        await client.send({"type": "session.close"})
        closed = await client.receive_until_closed()
        assert closed[-1]["reason"] == "client_close"
        assert sim.session(created["session_id"]) is None
    assert errors_logged(caplog) == []


async def test_the_loop_is_asyncios_for_the_engine_and_trio_stays_trios(
    autojump_clock: MockClock,
) -> None:
    seen: dict[str, Any] = {}

    class Look(AsyncioEngine):
        accepts = frozenset({"input.text.append"})

        async def run(self, session: EngineSession) -> None:
            loop = asyncio.get_running_loop()
            seen["library"] = sniffio.current_async_library()
            seen["loop"] = loop
            seen["thread"] = await asyncio.wrap_future(
                concurrent.futures.ThreadPoolExecutor(1).submit(lambda: 42)
            )  # (its result comes back through call_soon_threadsafe)
            seen["to_thread"] = await asyncio.to_thread(lambda: "threaded")
            first, second = socket.socketpair()
            with first, second:
                first.setblocking(False)
                second.setblocking(False)
                reading = asyncio.ensure_future(loop.sock_recv(second, 5))
                await asyncio.sleep(0)  # it waits in the loop's selector
                await loop.sock_sendall(first, b"hello")
                seen["socket"] = await reading
            finalized: list[str] = []

            async def numbers() -> AsyncIterator[int]:
                try:
                    yield 1
                    yield 2
                finally:
                    finalized.append("closed")

            agen = numbers()
            await agen.__anext__()
            del agen  # unexhausted: the loop's own hook closes it, on the loop
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            seen["finalized"] = finalized

    await Look().run_in_trio(bare_session(Inbox(1), []))
    assert seen["library"] == "asyncio"
    assert sniffio.current_async_library() == "trio"
    assert seen["thread"] == 42 and seen["to_thread"] == "threaded"
    assert seen["socket"] == b"hello"
    assert seen["finalized"] == ["closed"]
    assert seen["loop"].is_closed()


# -- real I/O from the engine's own loop -----------------------------------------------------


class AioLookup(AsyncioEngine):
    """Each text is sent, over a TCP connection of asyncio's own (``open_connection``,
    after ``getaddrinfo``, which runs in the loop's executor), to a line server, and its
    reply is the answer: the loop's sockets and executor are real."""

    accepts = frozenset({"input.text.append"})

    def __init__(self, port: int) -> None:
        self.port = port

    async def run(self, session: EngineSession) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo("localhost", self.port, type=socket.SOCK_STREAM)
        host = str(infos[0][4][0])
        reader, writer = await asyncio.open_connection(host, self.port)
        try:
            async for event in session:
                writer.write(event["text"].encode() + b"\n")
                await writer.drain()
                reply = (await reader.readline()).decode().strip()
                await session.send({"type": "response.output_text.delta", "text": reply})
        finally:
            writer.close()


async def test_an_asyncio_engine_does_real_network_io_on_its_loop() -> None:
    async def shout(stream: trio.SocketStream) -> None:
        async with stream:
            pending = b""
            async for data in stream:
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    await stream.send_all(line.upper() + b"!\n")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, shout, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(30):  # real sockets, real time: a bound, not a wait
            async with running_server(engine_factory=lambda _: AioLookup(port)) as sim:
                client, _ = await sim.open_session()
                for word in ("one", "two", "three"):
                    await client.send(text(word))
                got = [await client.receive() for _ in range(3)]
                assert [e["text"] for e in got] == ["ONE!", "TWO!", "THREE!"]
                assert [e["server_event_seq"] for e in got] == [1, 2, 3]
        nursery.cancel_scope.cancel()
