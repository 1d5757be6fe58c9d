"""The race catalogue: the ways an open, a resume or an ending can interleave with a
lost connection, a cancellation, a timer or another client, each driven to one chosen
interleaving (gates on the transport, ``wait_all_tasks_blocked``, the mock clock,
``CancelAtStep``) and checked at the end: slots held, terminal events decided and sent
(exactly one, after the slot is free), what each client received, and whether the
session can be resumed.

``running_server`` also checks, after every scheduler step, that slots never exceed
``max_sessions`` and that no session has two attached connections, and at the end that
every terminal event was queued only once its slot was free (see trio_duplex.testing).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any
from unittest.mock import ANY

import pytest
import trio
import trio.testing
import trio_websocket
from wsproto.events import CloseConnection

from trio_duplex import EngineFactory, ServerConfig
from trio_duplex import testing as kit
from trio_duplex.core.session import Session, State
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.testing import (
    CancelAtStep,
    FaultyStream,
    Probe,
    ScriptedEngine,
    SimClient,
    Simulation,
    all_tasks,
    resume_event,
    settle,
)

UPDATE: dict[str, Any] = {"type": "session.update", "session": {}}
GRACE = 30.0


def running_server(
    config: ServerConfig | None = None, engine_factory: EngineFactory = EchoEngine
) -> AbstractAsyncContextManager[Simulation]:
    """The kit's, bounded: a scenario waiting for what never comes fails in a virtual
    hour instead of hanging."""
    return kit.running_server(config, engine_factory, fail_after_s=3600)


def text(value: str, seq: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "input.text.append", "text": value}
    if seq is not None:
        event["client_event_seq"] = seq
    return event


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in events if "server_event_seq" in e]


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def only_session(sim: Simulation) -> Session:
    (session,) = sim.server.sessions.registry.sessions.values()
    return session


def probe(sim: Simulation) -> Probe:
    assert sim.probe is not None
    return sim.probe


@pytest.fixture
def detaches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, float]]]:
    """Every report of a lost connection that detached a session: (id, time)."""
    seen: list[tuple[str, float]] = []
    original = Session.detach

    def detach(self: Session, generation: int, now: float) -> bool:
        detached = original(self, generation, now)
        if detached:
            seen.append((self.id, now))
        return detached

    monkeypatch.setattr(Session, "detach", detach)
    yield seen


async def start_client(nursery: trio.Nursery, sim: Simulation, **kwargs: Any) -> list[SimClient]:
    """Connect in the background (the handshake may be held); the client lands in the
    returned list once connected."""
    box: list[SimClient] = []

    async def connect() -> None:
        box.append(await sim.connect(**kwargs))

    nursery.start_soon(connect)
    await settle()
    return box


async def assert_resumable(sim: Simulation, created: dict[str, Any]) -> SimClient:
    client, answer = await sim.resume(created["session_id"], created["resume_token"])
    assert answer["type"] == "session.resumed", answer
    return client


async def close_session(client: SimClient) -> list[dict[str, Any]]:
    await client.send({"type": "session.close"})
    events = await client.receive_until_closed()
    assert events[-1]["type"] == "session.closed", events
    return events


# -- 1-3: the handshake rule -----------------------------------------------------------


async def test_01_created_send_raises(autojump_clock: Any) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        client = await sim.connect()
        client.transport.break_writes()
        start = trio.current_time()
        await client.send(UPDATE)
        assert await client.receive_until_closed() == []
        assert client.close_code == 1006
        (session_id,) = probe(sim).decided
        assert probe(sim).reasons(session_id) == ["session_created_undelivered"]
        assert probe(sim).queued_for(session_id) == []  # nobody to tell
        assert sim.server.slots_held == 0
        # Not detached: the slot is free at once, for the next open.
        await sim.open_session()
        assert trio.current_time() == start
        _, answer = await sim.resume(session_id, "never-delivered")
        assert answer["code"] == "session_resume_expired"


def hold_all(transport: FaultyStream) -> None:
    transport.hold()


@pytest.mark.parametrize(
    ("path", "fault"), [("first_message", "fin"), ("first_message", "cut"), ("autostart", "fin")]
)
async def test_02_connection_gone_before_created_is_sent(
    autojump_clock: Any, path: str, fault: str
) -> None:
    """The peer goes before the session.created send is made: its first message and
    then its FIN (or the loss of the whole connection) are queued behind an answer the
    server is still writing.

    After a FIN the server finds the end of the stream before it writes session.created
    (it reads the connection during the open, and looks once more just before the
    write): the session is undelivered and its slot free at once, although the peer
    could still have read. After a cut the first message is never read: nothing was
    admitted and no slot is held. (More orderings: test_handshake_race.py.)"""
    async with running_server(ServerConfig(max_sessions=1)) as sim, trio.open_nursery() as n:
        start = trio.current_time()
        if path == "autostart":
            # Hold the handshake's answer; the peer's FIN arrives meanwhile.
            box = await start_client(n, sim, path="/v1/duplex?autostart=1", setup=hold_all)
            transport = sim.listener.streams[-1]
            await transport.wait_held()
            transport.end_reads()
            await settle()
            transport.release()
            await settle()
            (client,) = box
        else:
            # A bad first message is answered by a send we hold; meanwhile the real first
            # message arrives and then the peer's FIN, or the connection is lost.
            client = await sim.connect()
            client.transport.hold()
            await client.send_raw("not json")
            await client.transport.wait_held()
            await client.send(UPDATE)
            if fault == "cut":
                await client.transport.cut()
            else:
                await client.transport.fin()
            await settle()
            client.transport.release()
        events = await client.receive_until_closed()
        await settle()
        if fault == "cut":
            assert events == []
            assert probe(sim).decided == {}  # the update was never read: nothing admitted
        else:
            assert types(events) == ([] if path == "autostart" else ["error"])
            (session_id,) = probe(sim).decided
            assert probe(sim).reasons(session_id) == ["session_created_undelivered"]
            _, answer = await sim.resume(session_id, "never-delivered")
            assert answer["code"] == "session_resume_expired"
        assert sim.server.slots_held == 0
        await sim.open_session()
        assert trio.current_time() == start


@pytest.mark.parametrize("disconnect", ["fin", "close_frame"])
async def test_03_peer_goes_while_created_is_in_flight_and_the_send_is_cut(
    autojump_clock: Any, raw_ws: Any, disconnect: str
) -> None:
    """The server reads while session.created is being written: a FIN or close frame
    that arrives before the write has completed cuts it, and the session never opens."""
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        raw = await raw_ws(sim)
        transport = sim.listener.streams[-1]
        transport.hold()
        await raw.send(UPDATE)
        await transport.wait_held()  # session.created is in flight
        session = only_session(sim)
        start = trio.current_time()
        if disconnect == "fin":
            transport.end_reads()
        else:
            await raw.send_bytes(raw.ws.send(CloseConnection(code=1000)))
        await settle()
        assert session.state is State.CLOSED
        assert probe(sim).reasons(session.id) == ["session_created_undelivered"]
        assert sim.server.slots_held == 0
        transport.release()  # (the cut write never completes)
        assert types(await raw.receive_until_closed()) == []
        await sim.open_session()
        assert trio.current_time() == start
        _, answer = await sim.resume(session.id, "never-delivered")
        assert answer["code"] == "session_resume_expired"


@pytest.mark.parametrize("fault", ["break_writes", "cut"])
async def test_03_peer_goes_while_created_is_in_flight_then_the_send_fails(
    autojump_clock: Any, fault: str
) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        client = await sim.connect()
        client.transport.hold()
        await client.send(UPDATE)
        await client.transport.wait_held()
        session = only_session(sim)
        start = trio.current_time()
        if fault == "cut":
            await client.transport.cut()  # the held send fails
        else:
            client.transport.end_reads()
            await settle()
            client.transport.break_writes()
            client.transport.release()
        await settle()
        assert session.state is State.CLOSED
        assert probe(sim).reasons(session.id) == ["session_created_undelivered"]
        assert sim.server.slots_held == 0
        assert await client.receive_until_closed() == []
        await sim.open_session()
        assert trio.current_time() == start
        _, answer = await sim.resume(session.id, "never-delivered")
        assert answer["code"] == "session_resume_expired"


# -- 4: one loss, one detach -----------------------------------------------------------


@pytest.mark.parametrize("fault", ["send_fails", "cut_mid_send", "ping_unanswered"])
async def test_04_send_failure_after_handshake_detaches_once(
    autojump_clock: Any, detaches: list[tuple[str, float]], fault: str
) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=GRACE)) as sim:
        client, created = await sim.open_session()
        await client.send_and_receive({"type": "session.heartbeat"})  # the whole grace
        session_id = created["session_id"]
        session = sim.session(session_id)
        assert session is not None
        runner = sim.runner(session_id)
        conn = sim.connection_of(client)
        assert conn is not None
        if fault == "send_fails":
            client.transport.break_writes()
            await client.send(text("lost"))  # its echo is the send that fails
        elif fault == "cut_mid_send":
            client.transport.hold()
            await client.send(text("lost"))
            await client.transport.wait_held()
            await client.transport.cut()  # the pump's send fails as the reader sees EOF
        else:
            client.transport.stall_reads()  # no pong will be read
            await trio.sleep(sim.server.config.ping_interval_s + sim.server.config.ping_timeout_s)
        await settle()
        assert [session for session, _ in detaches] == [session_id]
        lost_at = detaches[0][1]
        assert session.state is State.DETACHED
        assert session.grace_deadline == lost_at + GRACE
        # A second, late report of the same loss changes nothing.
        await trio.sleep(10)
        runner.connection_lost(conn)
        assert len(detaches) == 1
        assert session.grace_deadline == lost_at + GRACE
        await trio.sleep_until(lost_at + GRACE - 0.5)
        assert session.state is State.DETACHED
        await trio.sleep_until(lost_at + GRACE)
        await settle()
        assert probe(sim).reasons(session_id) == ["disconnect_grace_expired"]
        assert sim.server.slots_held == 0


# -- 5-6: admission --------------------------------------------------------------------


def _is_handler(task: trio.lowlevel.Task) -> bool:
    return task.name.endswith("Door._handle_stream")


def _only_conn_scope(sim: Simulation) -> trio.CancelScope | None:
    conns = list(sim.server.connections)
    return conns[0].cancel_scope if len(conns) == 1 else None


def _scope_of(conn: Connection) -> trio.CancelScope | None:
    return conn.cancel_scope


@pytest.mark.parametrize("path", ["first_message", "autostart"])
async def test_05_open_cancelled_at_every_await_point(autojump_clock: Any, path: str) -> None:
    """Cancel the connection's scope (the caller of the open) before its k-th scheduler
    step after the connection is set up, for k = 1, 2, ... until the open completes
    untouched. Every time: no slot leaks, and a delivered session.created means a
    resumable session."""
    outcomes = []
    for step in itertools.count(1):
        assert step < 50, "the open path never completed"
        async with running_server(ServerConfig(max_sessions=1)) as sim:
            canceller = CancelAtStep(_is_handler, functools.partial(_only_conn_scope, sim), step)
            trio.lowlevel.add_instrument(canceller)
            try:
                if path == "autostart":
                    client = await sim.connect("/v1/duplex?autostart=1")
                else:
                    client = await sim.connect()
                    await settle()
                    # The cancellation may already have closed the connection.
                    with contextlib.suppress(trio_websocket.ConnectionClosed):
                        await client.send(UPDATE)
                await settle()
            finally:
                trio.lowlevel.remove_instrument(canceller)
            if not canceller.fired:
                created = await client.receive()
                assert created["type"] == "session.created"
                assert only_session(sim).state is State.ATTACHED
                await close_session(client)
                break
            events = await client.receive_until_closed()
            if events:  # session.created got out before the cancellation
                assert types(events) == ["session.created"]
                assert only_session(sim).state is State.DETACHED
                resumed = await assert_resumable(sim, events[0])
                await close_session(resumed)
                outcomes.append("resumable")
            else:
                reasons = [t.reason for ts in probe(sim).decided.values() for t in ts]
                assert reasons in ([], ["session_created_undelivered"])
                outcomes.append("undelivered" if reasons else "not admitted")
            assert sim.server.slots_held == 0
    # Every cancellation that hit the open left no session behind. (None landed after
    # the bytes of session.created were written: nothing awaits between that send and
    # the session becoming resumable.)
    assert outcomes and set(outcomes) <= {"not admitted", "undelivered", "resumable"}, outcomes


async def test_05_open_cancelled_while_created_is_held(autojump_clock: Any) -> None:
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        client = await sim.connect()
        client.transport.hold()
        await client.send(UPDATE)
        await client.transport.wait_held()
        assert sim.server.slots_held == 1
        conn = sim.connection_of(client)
        assert conn is not None
        conn.lost()
        await settle()
        assert sim.server.slots_held == 0
        client.transport.release()
        assert await client.receive_until_closed() == []
        # The cancelled write may have left half a frame: no close frame can follow it.
        assert client.close_code == 1006
        await sim.open_session()


@pytest.mark.parametrize("held", [False, True], ids=["free_running", "created_held"])
async def test_06_concurrent_opens_at_the_limit(autojump_clock: Any, held: bool) -> None:
    limit, contenders = 3, 10
    async with running_server(ServerConfig(max_sessions=limit)) as sim:
        clients = [await sim.connect() for _ in range(contenders)]
        if held:  # winners stay OPENING, refusals stay queued, until all have arrived
            for client in clients:
                client.transport.hold()
        answers: dict[int, list[dict[str, Any]]] = {}

        async def open_one(index: int, client: SimClient) -> None:
            await client.send(UPDATE)
            answers[index] = [await client.receive()]

        async with trio.open_nursery() as nursery:
            for index, client in enumerate(clients):
                nursery.start_soon(open_one, index, client)
            await settle()
            assert sim.server.slots_held == limit
            for client in clients:
                client.transport.release()
        winners = [i for i, a in answers.items() if a[0]["type"] == "session.created"]
        losers = [i for i, a in answers.items() if a[0]["type"] == "error"]
        assert len(winners) == limit and len(losers) == contenders - limit
        for index in losers:
            assert answers[index][0]["code"] == "resource_exhausted"
            assert answers[index][0]["retryable"] is True
            assert await clients[index].receive_until_closed() == []
            assert clients[index].close_code == 1013
        assert probe(sim).max_slots_seen == limit
        # A slot given back is taken at once by the next open.
        start = trio.current_time()
        await close_session(clients[winners[0]])
        await sim.open_session()
        assert trio.current_time() == start
        assert sim.server.slots_held == limit


# -- 7-10: resume ----------------------------------------------------------------------


async def open_with_events(
    sim: Simulation, count: int
) -> tuple[SimClient, dict[str, Any], list[dict[str, Any]]]:
    """Open a session and receive ``count`` echoed events (seqs 1..count)."""
    client, created = await sim.open_session()
    events = []
    for i in range(1, count + 1):
        events.append(await client.send_and_receive(text(f"e{i}", i)))
    assert seqs(events) == list(range(1, count + 1))
    return client, created, events


async def start_resume(
    sim: Simulation, created: dict[str, Any], last_seq: int = 0, *, hold_after: int = 0
) -> SimClient:
    """A new connection sends session.resume; its sends are held after ``hold_after``
    (0: session.resumed itself, 1: the replay, written in batches of up to 64 frames).
    Returns once held."""
    client = await sim.connect()
    client.transport.hold(after=hold_after)
    await client.send(resume_event(created["session_id"], created["resume_token"], last_seq))
    await client.transport.wait_held()
    return client


@pytest.mark.parametrize("how", ["cancelled", "failed"])
@pytest.mark.parametrize("before", ["detached", "attached"])
@pytest.mark.parametrize("phase", ["activation", "replay"])
async def test_07_resume_cancelled_half_way(
    autojump_clock: Any, phase: str, before: str, how: str
) -> None:
    """Activation: while session.resumed is being sent; replay: while a journaled event
    is. Either way the resume has begun (token rotated, timers frozen) and not
    committed; undoing it must leave the session exactly as it was."""
    async with running_server(ServerConfig(disconnect_grace_s=GRACE)) as sim:
        old, created, _ = await open_with_events(sim, 3)
        session = only_session(sim)
        if before == "detached":
            await old.transport.cut()
            await settle()
            await trio.sleep(5)  # some of the grace is used up
        was = (session.state, session.generation, session.grace_deadline, session.journal.head)
        new = await start_resume(sim, created, 0, hold_after=0 if phase == "activation" else 1)
        assert session.resume is not None
        if how == "cancelled":
            conn = sim.connection_of(new)
            assert conn is not None
            conn.lost()
        else:
            await new.transport.cut()
        await settle()
        assert session.resume is None
        assert (
            session.state,
            session.generation,
            session.grace_deadline,
            session.journal.head,
        ) == was
        assert sim.server.slots_held == 1
        assert probe(sim).decided == {}
        new.transport.release()
        got = await new.receive_until_closed()
        assert types(got) == ([] if phase == "activation" else ["session.resumed"])
        if before == "attached":
            # Still attached to the old connection, which still works.
            assert sim.runner(session.id).conn is sim.connection_of(old)
            assert seqs([await old.send_and_receive(text("e4", 4))]) == [4]
        # The token it presented is still good: resume again and get every event once.
        again, answer = await sim.resume(session.id, created["resume_token"], 0)
        assert answer["type"] == "session.resumed"
        assert answer["attachment_generation"] == was[1] + 1
        head = session.journal.head
        assert seqs([await again.receive() for _ in range(head)]) == list(range(1, head + 1))
        await close_session(again)
        assert probe(sim).reasons(session.id) == ["client_close"]


@pytest.mark.parametrize("before", ["detached", "attached"])
async def test_07_resume_cancelled_at_every_await_point(autojump_clock: Any, before: str) -> None:
    """Cancel the resuming connection before its k-th scheduler step after the resume
    arrives, k = 1, 2, ... until the resume completes untouched. Before the commit: the
    session is exactly as it was. After it: the resume won and its loss detaches the
    session like any other. One slot, no terminal event, every time."""
    outcomes = []
    for step in itertools.count(1):
        assert step < 100, "the resume path never completed"
        async with running_server(ServerConfig(disconnect_grace_s=GRACE)) as sim:
            old, created, _ = await open_with_events(sim, 3)
            session = only_session(sim)
            if before == "detached":
                await old.transport.cut()
                await settle()
            was = (session.state, session.generation, session.grace_deadline)
            handlers = {t for t in all_tasks() if _is_handler(t)}
            new = await sim.connect()
            await settle()
            new_conn = sim.connection_of(new)
            assert new_conn is not None
            (task,) = {t for t in all_tasks() if _is_handler(t)} - handlers
            canceller = CancelAtStep(
                functools.partial(operator.is_, task), functools.partial(_scope_of, new_conn), step
            )
            trio.lowlevel.add_instrument(canceller)
            try:
                await new.send(resume_event(session.id, created["resume_token"], 0))
                await settle()
            finally:
                trio.lowlevel.remove_instrument(canceller)
            assert session.resume is None and sim.server.slots_held == 1
            assert probe(sim).decided == {}
            if not canceller.fired:
                assert session.generation == 2 and session.state is State.ATTACHED
                break
            if session.generation == was[1]:
                assert (session.state, session.generation, session.grace_deadline) == was
                outcomes.append("as it was")
            else:
                assert session.state is State.DETACHED and session.generation == 2
                assert session.grace_deadline == trio.current_time() + GRACE
                outcomes.append("resumed, then lost")
            again, answer = await sim.resume(session.id, created["resume_token"], 0)
            assert answer["type"] == "session.resumed"
            assert seqs([await again.receive() for _ in range(3)]) == [1, 2, 3]
            await close_session(again)
    assert "as it was" in outcomes, outcomes


@pytest.mark.parametrize("before", ["detached", "attached"])
@pytest.mark.parametrize("contenders", [2, 10])
async def test_08_concurrent_resumes_one_winner(
    autojump_clock: Any, contenders: int, before: str
) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=GRACE)) as sim:
        old, created, _ = await open_with_events(sim, 2)
        session = only_session(sim)
        if before == "detached":
            await old.transport.cut()
            await settle()
        clients = [await sim.connect() for _ in range(contenders)]
        for client in clients:  # nobody's answer goes out until every resume has arrived
            client.transport.hold()
        first: dict[int, dict[str, Any]] = {}

        async def resume(index: int, client: SimClient) -> None:
            await client.send(resume_event(session.id, created["resume_token"], 0))
            first[index] = await client.receive()

        async with trio.open_nursery() as nursery:
            for index, client in enumerate(clients):
                nursery.start_soon(resume, index, client)
            await settle()
            assert session.resume is not None  # exactly one in progress, the others refused
            for client in clients:
                client.transport.release()
        winners = [i for i, answer in first.items() if answer["type"] == "session.resumed"]
        assert len(winners) == 1, first
        (winner,) = winners
        for index, answer in first.items():
            if index != winner:
                assert (answer["code"], answer["retryable"]) == ("session_resume_conflict", True)
                assert await clients[index].receive_until_closed() == []
                assert clients[index].close_code == 4001
        assert first[winner]["attachment_generation"] == 2
        won = clients[winner]
        assert seqs([await won.receive(), await won.receive()]) == [1, 2]
        assert session.state is State.ATTACHED and session.generation == 2
        if before == "attached":
            assert types(await old.receive_until_closed()) == ["session.replaced"]
            assert old.close_code == 4000
        # One arriving after the winner finished, with a still valid token, takes over.
        late, answer = await sim.resume(session.id, created["resume_token"], 2)
        assert answer["attachment_generation"] == 3
        assert await won.receive_until_closed() == [
            {"type": "session.replaced", "session_id": session.id, "attachment_generation": 3}
        ]
        assert won.close_code == 4000
        assert sim.server.slots_held == 1
        await close_session(late)


ORDERINGS = [
    "resume_before_deadline",
    "resume_at_deadline",
    "resume_after_deadline",
    "resume_straddles_deadline_commits",
    "resume_straddles_deadline_fails",
    "resume_fails_before_deadline",
]


@pytest.mark.parametrize("ordering", ORDERINGS)
async def test_09_resume_racing_grace_expiry(autojump_clock: Any, ordering: str) -> None:
    async with running_server(ServerConfig(disconnect_grace_s=GRACE)) as sim:
        old, created, _ = await open_with_events(sim, 1)
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        deadline = session.grace_deadline
        resumer: SimClient
        expect_expired_at: float | None = None
        if ordering in ("resume_before_deadline", "resume_at_deadline", "resume_after_deadline"):
            offset = {"resume_before": -1e-3, "resume_at": 0.0, "resume_after": 1.0}
            await trio.sleep_until(deadline + offset[ordering.removesuffix("_deadline")])
            resumer, answer = await sim.resume(session.id, created["resume_token"], 1)
            if ordering != "resume_before_deadline":
                expect_expired_at = deadline
        else:
            start = deadline - (2 if ordering == "resume_fails_before_deadline" else 1)
            await trio.sleep_until(start)
            resumer = await start_resume(sim, created, 1)
            if ordering == "resume_fails_before_deadline":
                await trio.sleep(1)
                await resumer.transport.cut()
                await trio.sleep_until(deadline)
                expect_expired_at = deadline  # the grace was not restarted
            else:
                await trio.sleep_until(deadline + 5)
                assert session.state is State.DETACHED  # a resume in progress holds the timer
                if ordering == "resume_straddles_deadline_fails":
                    await resumer.transport.cut()
                    expect_expired_at = deadline + 5  # the moment it failed
                else:
                    resumer.transport.release()
            await settle()
            answer = await resumer.receive() if expect_expired_at is None else {}
        await settle()
        reasons = probe(sim).reasons(session.id)
        if expect_expired_at is None:  # resumed, and nothing expired
            assert answer["type"] == "session.resumed"
            assert reasons == []
            assert session.state is State.ATTACHED and sim.server.slots_held == 1
            await trio.sleep(GRACE * 2)  # no stale grace timer fires
            assert session.state is State.ATTACHED
            await close_session(resumer)
            assert probe(sim).reasons(session.id) == ["client_close"]
        else:  # expired, and not resumed
            assert reasons == ["disconnect_grace_expired"]
            assert probe(sim).decided_at[session.id] == expect_expired_at
            assert sim.server.slots_held == 0
            rest = [answer] if answer else []
            rest += await resumer.receive_until_closed()
            assert "session.resumed" not in types(rest)
            if ordering in ("resume_at_deadline", "resume_after_deadline"):
                assert [e.get("code") for e in rest] == ["session_resume_expired"]
                assert resumer.close_code == 4001


@pytest.mark.parametrize("old_pump", ["send_completes", "send_fails", "send_never_completes"])
async def test_10_takeover_while_old_pump_mid_send(
    autojump_clock: Any, detaches: list[tuple[str, float]], old_pump: str
) -> None:
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(disconnect_grace_s=GRACE), factory) as sim:
        old, created = await sim.open_session()
        engine = factory.last
        old_got = []
        for i in range(1, 4):
            await engine.emit(f"e{i}")
            old_got.append(await old.receive())
        old.transport.hold()
        await engine.emit("e4")
        await old.transport.wait_held()  # the old pump is mid-send of seq 4
        old_conn = sim.connection_of(old)
        new = await start_resume(sim, created, 3, hold_after=1)  # replay of seq 4 held
        await engine.emit("e5")  # during the takeover: to the old attachment and the journal
        new.transport.release()
        await settle()
        session = only_session(sim)
        assert session.generation == 2 and sim.runner(session.id).conn is not old_conn
        await engine.emit("e6")
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await old.send(text("stale"))  # a late event from the old connection...
        await settle()
        assert "stale" not in [e["text"] for e in engine.received]  # ...is fenced off
        if old_pump == "send_completes":
            old.transport.release()
        elif old_pump == "send_fails":
            old.transport.break_writes()
            old.transport.release()
        else:
            await trio.sleep(sim.server.close_timeout_s + 1)  # abort_after cuts it
        old_got += await old.receive_until_closed()
        await settle()
        # The old connection is gone and could not detach the new attachment.
        assert detaches == []
        assert session.state is State.ATTACHED and session.generation == 2
        assert old_conn is not None
        sim.runner(session.id).connection_lost(old_conn)  # a late report, too
        assert session.state is State.ATTACHED
        # Nothing lost, nothing twice: the old stream is 1, 2, 3 (and 4 if its send
        # completed), then replaced; the new one carries on right after seq 3.
        old_seqs = seqs(old_got)
        assert old_seqs == list(range(1, len(old_seqs) + 1))
        if old_pump == "send_completes":
            assert old_seqs == [1, 2, 3, 4]
            assert types(old_got)[-1] == "session.replaced" and old.close_code == 4000
        new_got = [await new.receive() for _ in range(4)]
        assert types(new_got)[0] == "session.resumed"
        assert seqs(new_got) == [4, 5, 6]
        assert seqs([await new.send_and_receive(text("e7", 1))]) == [7]
        await close_session(new)
        assert probe(sim).reasons(session.id) == ["client_close"]


async def test_10_old_connection_lost_during_takeover(
    autojump_clock: Any, detaches: list[tuple[str, float]]
) -> None:
    """Before the commit the old connection is still the attachment, so its loss does
    detach the session (once); the takeover then completes from DETACHED."""
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(disconnect_grace_s=GRACE), factory) as sim:
        old, created = await sim.open_session()
        engine = factory.last
        for i in range(1, 3):
            await engine.emit(f"e{i}")
            assert seqs([await old.receive()]) == [i]
        new = await start_resume(sim, created, 1, hold_after=1)  # replay of seq 2 held
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        assert [session_id for session_id, _ in detaches] == [session.id]
        assert session.state is State.DETACHED and session.resume is not None
        await engine.emit("e3")
        new.transport.release()
        got = [await new.receive() for _ in range(3)]
        assert types(got)[0] == "session.resumed" and seqs(got) == [2, 3]
        await settle()
        # mypy keeps the narrowing of session.state from before the awaits that change it.
        assert session.state is State.ATTACHED and session.generation == 2  # type: ignore[comparison-overlap]
        assert len(detaches) == 1
        assert await old.receive_until_closed() == []  # gone: no session.replaced to send
        assert seqs([await new.send_and_receive(text("e4", 1))]) == [4]
        await close_session(new)


# -- 11-14: endings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "order",
    list(itertools.permutations(["client_close", "engine_finish", "idle_expiry"])),
    ids="-then-".join,
)
async def test_11_client_close_engine_finish_expiry(
    autojump_clock: Any, order: tuple[str, ...]
) -> None:
    """The three endings arrive in each order. The engine takes a while to tear down
    once cancelled, so the later two arrive while the first one's teardown is running."""
    factory = ScriptedEngine.factory(hold_teardown=True)
    # A slow teardown, not a stuck one: it is held past the idle TTL, never abandoned.
    config = ServerConfig(idle_ttl_s=60, engine_stop_timeout_s=3600)
    async with running_server(config, factory) as sim:
        client, _ = await sim.open_session()
        session = only_session(sim)
        engine = factory.last
        idle_deadline = session.idle_deadline
        teardown_done = engine.teardown_gate
        assert teardown_done is not None
        expected = {
            "client_close": "client_close",
            "engine_finish": "engine_finished",
            "idle_expiry": "idle_ttl_expired",
        }[order[0]]
        for trigger in order:
            if trigger == "client_close":
                try:
                    await client.send({"type": "session.close"})
                except trio_websocket.ConnectionClosed:
                    pass  # the session already ended and closed the connection
            elif trigger == "engine_finish":
                engine.finish()
            else:
                await trio.sleep_until(max(idle_deadline, trio.current_time()))
            await settle()
            assert probe(sim).reasons(session.id) == [expected]
            if engine.tearing_down.is_set() and not teardown_done.is_set():
                # Teardown running: the slot is held and nothing terminal was sent yet.
                assert sim.server.slots_held == 1
                assert probe(sim).queued_for(session.id) == []
        engine.release_teardown()
        events = await client.receive_until_closed()
        terminals = [e for e in events if e["type"] in ("session.closed", "session.expired")]
        assert len(terminals) == 1 and terminals[0]["reason"] == expected, events
        assert client.close_code == 1000
        (queued,) = probe(sim).queued_for(session.id)
        assert queued.slots_held == 0 and not queued.session_registered
        assert sim.server.slots_held == 0


RELEASES = {"in_drain": 1.0, "after_drain": 5.5, "never": None}
"""When the held send is let through, in seconds after begin_shutdown (drain_timeout_s
is 5, close_timeout_s 2): during the drain, after it (sessions already ended), never."""


@pytest.mark.parametrize("release", list(RELEASES))
async def test_12_shutdown_while_open_in_progress(autojump_clock: Any, release: str) -> None:
    config = ServerConfig(drain_timeout_s=5)
    async with running_server(config) as sim:
        client = await sim.connect()
        client.transport.hold()
        await client.send(UPDATE)
        await client.transport.wait_held()
        session = only_session(sim)
        start = trio.current_time()
        delay = RELEASES[release]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.shutdown)
            await settle()
            if delay is not None:
                await trio.sleep(delay)
                client.transport.release()
        events = await client.receive_until_closed()
        assert sim.server.slots_held == 0
        if delay is not None:  # it opened during the shutdown, so it ends with the others
            assert types(events) == ["session.created", "session.going_away", "session.closed"]
            left = max(0.0, config.drain_timeout_s - delay)
            assert events[1]["time_left_ms"] == round(left * 1000)
            assert events[2]["reason"] == "server_shutdown"
            assert client.close_code == 1001
            ended = start + max(delay, config.drain_timeout_s)
            assert probe(sim).decided_at[session.id] == ended
            assert probe(sim).reasons(session.id) == ["server_shutdown"]
        else:  # never delivered: it never was a session anyone could hold
            assert events == []
            assert probe(sim).reasons(session.id) == ["session_created_undelivered"]


@pytest.mark.parametrize("release", list(RELEASES))
async def test_12_shutdown_while_resume_in_progress(autojump_clock: Any, release: str) -> None:
    config = ServerConfig(drain_timeout_s=5, disconnect_grace_s=GRACE)
    async with running_server(config) as sim:
        old, created, _ = await open_with_events(sim, 2)
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        new = await start_resume(sim, created, 0)
        start = trio.current_time()
        delay = RELEASES[release]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.shutdown)
            await settle()
            if delay is not None:
                await trio.sleep(delay)
                new.transport.release()
        events = await new.receive_until_closed()
        assert sim.server.slots_held == 0
        assert probe(sim).reasons(session.id) == ["server_shutdown"]
        assert probe(sim).decided_at[session.id] == start + config.drain_timeout_s
        replay = ["session.resumed", "response.output_text.delta", "response.output_text.delta"]
        if release == "in_drain":  # attached during the drain: warned, then closed
            assert types(events) == [*replay, "session.going_away", "session.closed"]
        elif release == "after_drain":  # ended detached meanwhile: it learns how
            assert types(events) == [*replay, "session.closed"]
        else:
            assert events == []
        if delay is not None:
            assert events[-1]["reason"] == "server_shutdown" and new.close_code == 1001


@pytest.mark.parametrize("resumer", ["waits", "leaves"])
async def test_12_shutdown_ends_a_resuming_session_whose_engine_is_slow_to_go(
    autojump_clock: Any, resumer: str
) -> None:
    """The drain ends a detached session mid-resume; its engine takes a while to tear
    down; the resume then reaches its commit. The resumer learns the end, but only once
    the slot is free; if it leaves meanwhile, nothing else changes."""
    factory = ScriptedEngine.factory(hold_teardown=True)
    config = ServerConfig(drain_timeout_s=5, disconnect_grace_s=GRACE)
    async with running_server(config, factory) as sim:
        old, created, _ = await open_with_events(sim, 2)
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        new = await start_resume(sim, created, 0, hold_after=1)  # the replay is held
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.shutdown)
            await trio.sleep(config.drain_timeout_s)
            await settle()
            assert probe(sim).reasons(session.id) == ["server_shutdown"]
            assert factory.last.tearing_down.is_set() and sim.server.slots_held == 1
            new.transport.release()  # the replay goes on and reaches the commit
            await settle()
            early = probe(sim).queued_for(session.id)
            if resumer == "leaves":
                await new.transport.cut()
                await settle()
            factory.last.release_teardown()
        assert early == [], "the terminal event was queued while the slot was still held"
        got = await new.receive_until_closed()
        assert types(got)[:3] == ["session.resumed"] + ["response.output_text.delta"] * 2
        assert sim.server.slots_held == 0
        if resumer == "waits":
            assert got[3:] == [
                {
                    "type": "session.closed",
                    "session_id": session.id,
                    "reason": "server_shutdown",
                    "usage": ANY,
                }
            ]
            assert new.close_code == 1001
            (queued,) = probe(sim).queued_for(session.id)
            assert not queued.session_registered
        else:
            assert got[3:] == []


@pytest.mark.parametrize("before", ["detached", "attached"])
async def test_13_engine_raises_during_resume_replay(autojump_clock: Any, before: str) -> None:
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(disconnect_grace_s=GRACE), factory) as sim:
        old, created, _ = await open_with_events(sim, 3)
        session = only_session(sim)
        if before == "detached":
            await old.transport.cut()
            await settle()
        new = await start_resume(sim, created, 0, hold_after=1)  # the replay (one write) is held
        factory.last.fail()
        await settle()
        assert probe(sim).reasons(session.id) == ["engine_error"]
        assert sim.server.slots_held == 0
        new.transport.release()
        got = await new.receive_until_closed()
        assert types(got)[0] == "session.resumed"
        replayed = seqs(got)
        assert replayed == list(range(1, len(replayed) + 1))  # in order, none twice
        closed = {
            "type": "session.closed",
            "session_id": session.id,
            "reason": "engine_error",
            "usage": ANY,
        }
        if before == "attached":
            # The attachment that was current gets the terminal event; the resume fails.
            assert await old.receive_until_closed() == [closed]
            assert old.close_code == 1011
            assert got[-1]["code"] == "session_resume_expired" and new.close_code == 4001
        else:
            # It was told session.resumed and is the only client the session has.
            assert got[-1] == closed and new.close_code == 1011
        assert sum(e["type"] == "session.closed" for e in got) <= 1
        # Nobody can resume it any more.
        _, answer = await sim.resume(session.id, created["resume_token"])
        assert answer["code"] == "session_resume_expired"


async def test_14_journal_overflow_while_detached_then_resume(autojump_clock: Any) -> None:
    factory = ScriptedEngine.factory()
    config = ServerConfig(journal_max_bytes=300, disconnect_grace_s=GRACE)
    async with running_server(config, factory) as sim:
        old, created, _ = await open_with_events(sim, 2)
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        for i in range(3, 13):  # ~70 bytes each: the journal overflows while detached
            await factory.last.emit(f"e{i}")
        lost = session.journal.floor
        assert 2 < lost < 12
        client, answer = await sim.resume(session.id, created["resume_token"], 2)
        assert answer["type"] == "session.resumed"
        gap = await client.receive()
        assert gap == {
            "type": "session.resync_required",
            "reason": "journal_gap",
            "dropped_through_seq": lost,
        }
        held = [await client.receive() for _ in range(12 - lost)]  # what survived
        assert seqs(held) == list(range(lost + 1, 13))
        # Usable: live events follow, numbering goes on, input is taken.
        await factory.last.emit("e13")
        live = await client.receive()
        if live["type"] == "session.resync_required":
            # Appending 13 overflowed: it drops what was replayed, never 13 itself.
            assert live["reason"] == "journal_overflow" and live["dropped_through_seq"] == 12
            live = await client.receive()
        assert seqs([live]) == [13]
        assert seqs([await client.send_and_receive(text("e14", 3))]) == [14]
        assert sim.server.slots_held == 1 and session.state is State.ATTACHED
        await close_session(client)


async def test_14_journal_overflow_during_the_replay(autojump_clock: Any) -> None:
    factory = ScriptedEngine.factory()
    config = ServerConfig(journal_max_bytes=300, disconnect_grace_s=GRACE)
    async with running_server(config, factory) as sim:
        old, created, _ = await open_with_events(sim, 3)
        session = only_session(sim)
        await old.transport.cut()
        await settle()
        client = await start_resume(sim, created, 0, hold_after=1)  # the replay (one write) is held
        for i in range(4, 12):  # overflows the journal under the replay
            await factory.last.emit(f"e{i}")
        client.transport.release()
        got = [await client.receive() for _ in range(3)]
        while True:  # the replay, then the report of what it could not replay
            got.append(await client.receive())
            if got[-1]["type"] == "session.resync_required":
                break
        gap = got[-1]
        assert gap["reason"] == "journal_gap"
        rest = [
            await client.receive() for _ in range(session.journal.head - gap["dropped_through_seq"])
        ]
        delivered = seqs(got) + seqs(rest)
        # In order, never twice, and every hole is covered by the report.
        assert delivered == sorted(set(delivered))
        missing = set(range(1, 12)) - set(delivered)
        assert all(seq <= gap["dropped_through_seq"] for seq in missing)
        assert delivered[-1] == 11
        assert seqs([await client.send_and_receive(text("e12", 4))]) == [12]
        await close_session(client)
