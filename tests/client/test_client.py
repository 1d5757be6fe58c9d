"""trio_duplex.client, four ways:

1. ``SessionState`` alone: pure calls, and a model server it is driven against through
   random cuts (hypothesis).
2. The client against the real server in memory (``trio_duplex.testing``), in virtual
   time, with faults injected on the server's side of each connection.
3. The client against a scripted server, for answers a correct server never gives.
4. The client against a real server on 127.0.0.1 behind a fault-injecting TCP proxy.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed as WsClosed
from trio_websocket import WebSocketConnection, WebSocketRequest, WebSocketServer

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.client import (
    AckPolicy,
    Attached,
    ClientOptions,
    ClientSession,
    ConnectionChange,
    Disconnected,
    EventTooLarge,
    HeartbeatPolicy,
    ProtocolViolation,
    ReconnectFailed,
    ReconnectPolicy,
    ResumeRefused,
    ResumeState,
    Retrying,
    ServerRefused,
    SessionEnded,
    SessionReplaced,
    SessionState,
    Verdict,
    connect,
)
from trio_duplex.client import session as client_module
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import FaultyStream, MemoryListener, ScriptedEngine, Simulation
from trio_duplex.testing import running_server as _running_server

from .proxy import FaultPlan, FaultyProxy

Event = dict[str, Any]
URL = "ws://sim/v1/duplex"
FAST = ClientOptions(
    reconnect=ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=100, deadline=25),
    heartbeat=HeartbeatPolicy(interval=5, timeout=2),
)


def text(value: str) -> Event:
    return {"type": "input.text.append", "text": value}


# -- 1. the state machine ----------------------------------------------------------------


def created(**limits: Any) -> Event:
    return {
        "type": "session.created",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": "secret-1",
        "attachment_generation": 1,
        "limits": {"idle_ttl_s": 300, "journal_max_bytes": 8 << 20, **limits},
    }


def resumed(received: int, generation: int = 2) -> Event:
    return {
        "type": "session.resumed",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": f"secret-{generation}",
        "attachment_generation": generation,
        "last_received_client_event_seq": received,
    }


def opened(**policies: Any) -> SessionState:
    state = SessionState({"voice": "x"}, **policies)
    assert json.loads(state.opening_frame()) == {
        "type": "session.update",
        "session": {"voice": "x"},
    }
    state.on_handshake(created(), now=0.0)
    return state


def drain(state: SessionState, now: float = 0.0) -> list[Event]:
    frames = []
    while (frame := state.next_frame(now)) is not None:
        frames.append(json.loads(frame))
    return frames


def test_send_stamps_seqs_and_refuses_what_the_client_owns() -> None:
    state = opened()
    assert state.enqueue(text("a")) == 1
    assert state.enqueue({"type": "session.update", "session": {}}) == 2  # goes to the engine
    for bad in (
        {"type": "session.close"},
        {"type": "session.heartbeat"},
        {"type": "session.resume"},
        {"type": "session.event_ack", "server_event_seq": 0},
        {**text("b"), "client_event_seq": 9},
        {"text": "no type"},
    ):
        with pytest.raises(ValueError):
            state.enqueue(bad)
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2]
    assert state.next_client_seq == 3


def test_too_large_event_is_refused_before_it_is_queued() -> None:
    state = SessionState({})
    state.opening_frame()
    state.on_handshake(created(max_event_bytes=100), now=0.0)
    with pytest.raises(EventTooLarge) as caught:
        state.enqueue(text("x" * 100))
    assert caught.value.limit == 100
    assert state.next_client_seq == 1 and not state.outbox


def test_resume_resends_exactly_what_the_server_did_not_receive() -> None:
    state = opened()
    for i in range(5):
        state.enqueue(text(str(i)))
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2, 3, 4, 5]
    state.on_event({"type": "x", "server_event_seq": 1}, 10, now=0.0)
    state.on_event({"type": "x", "server_event_seq": 2}, 10, now=0.0)
    resume = json.loads(state.opening_frame())
    assert resume == {
        "type": "session.resume",
        "session_id": "s1",
        "resume_token": "secret-1",
        "last_received_server_event_seq": 2,
    }
    change = state.on_handshake(resumed(received=3), now=1.0)
    assert change == Attached("s1", 2, resumed=True, resent=2)
    assert [f["client_event_seq"] for f in drain(state, 1.0)] == [4, 5]
    assert state.resume_token == "secret-2" and state.acked_seq == 2  # the resume acked 2


def test_resume_from_another_process_continues_the_numbering() -> None:
    state = SessionState.for_resume(ResumeState("s1", "secret-1", 7))
    assert json.loads(state.opening_frame())["last_received_server_event_seq"] == 7
    state.on_handshake(resumed(received=12), now=0.0)
    assert state.enqueue(text("next")) == 13


def test_events_with_a_seq_are_deduplicated_control_events_are_not() -> None:
    state = opened()
    seen = [
        state.on_event({"type": "x", "server_event_seq": seq}, 10, now=0.0)
        for seq in (1, 2, 2, 1, 3, 5, 4)
    ]
    assert seen == [Verdict.DELIVER] * 2 + [Verdict.DUPLICATE] * 2 + [Verdict.DELIVER] * 2 + [
        Verdict.DUPLICATE
    ]
    resync = {"type": "session.resync_required", "reason": "journal_gap", "dropped_through_seq": 5}
    assert state.on_event(resync, 10, now=0.0) is Verdict.DELIVER
    assert state.on_event(dict(resync), 10, now=0.0) is Verdict.DELIVER
    assert state.on_event({"type": "session.going_away"}, 10, now=0.0) is Verdict.DELIVER
    assert state.on_event({"type": "session.replaced"}, 10, now=0.0) is Verdict.REPLACED
    assert state.on_event({"type": "session.closed"}, 10, now=0.0) is Verdict.END


def test_acks_go_out_by_count_by_bytes_and_by_time() -> None:
    state = opened(acks=AckPolicy(every_events=3, every_bytes=1000, max_delay=0.5))
    for seq in (1, 2):
        state.on_event({"type": "x", "server_event_seq": seq}, 10, now=0.0)
    assert drain(state) == []
    assert state.next_deadline() == 0.5
    state.on_event({"type": "x", "server_event_seq": 3}, 10, now=0.1)
    assert drain(state, 0.1) == [{"type": "session.event_ack", "server_event_seq": 3}]
    state.on_event({"type": "x", "server_event_seq": 4}, 1000, now=0.2)  # bytes
    assert drain(state, 0.2) == [{"type": "session.event_ack", "server_event_seq": 4}]
    state.on_event({"type": "x", "server_event_seq": 5}, 10, now=1.0)  # time
    assert drain(state, 1.4) == []
    assert drain(state, 1.5) == [{"type": "session.event_ack", "server_event_seq": 5}]


def test_heartbeats_keep_time_confirm_and_trim_the_resend_buffer() -> None:
    state = opened(heartbeat=HeartbeatPolicy(interval=10, timeout=4, confirm_every=3))
    assert state.next_deadline() == 10
    assert drain(state, 10.0) == [{"type": "session.heartbeat"}]
    assert state.heartbeat_overdue(14.0) and not state.heartbeat_overdue(13.9)
    state.on_event({"type": "session.heartbeat_ack"}, 10, now=11.0)
    for i in range(4):
        state.enqueue(text(str(i)))
    kinds = [f["type"] for f in drain(state, 11.0)]
    # After three unconfirmed events a heartbeat goes out as a barrier.
    assert kinds == ["input.text.append"] * 3 + ["session.heartbeat", "input.text.append"]
    assert state.on_event({"type": "session.heartbeat_ack"}, 10, now=11.5) is Verdict.INTERNAL
    assert state.confirmed_seq == 3 and [item.seq for item in state.outbox] == [4]
    target = state.request_confirm()
    assert target == 4 and drain(state, 12.0) == [{"type": "session.heartbeat"}]
    state.on_event({"type": "session.heartbeat_ack"}, 10, now=12.1)
    assert state.confirmed_seq == 4 and not state.outbox and state.outbox_bytes == 0


def test_heartbeat_interval_is_at_most_a_third_of_the_idle_ttl() -> None:
    state = SessionState({})
    state.opening_frame()
    state.on_handshake(created(idle_ttl_s=6), now=100.0)
    assert state.next_deadline() == 102.0


def test_close_goes_out_after_everything_queued() -> None:
    state = opened()
    state.enqueue(text("last words"))
    state.request_close("done")
    frames = drain(state)
    assert [f["type"] for f in frames] == ["input.text.append", "session.close"]
    assert frames[1] == {"type": "session.close", "reason": "done"}
    assert drain(state) == []


def test_the_resume_token_is_never_in_a_repr() -> None:
    state = opened()
    resume = state.resume_state()
    assert resume is not None and resume.resume_token == "secret-1"
    assert "secret" not in repr(resume) and "secret" not in repr(state)


def test_a_benign_websockets_race_is_not_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # websockets wraps the logger it is given in an adapter of its own, as here.
    logger = logging.LoggerAdapter(client_module._WEBSOCKETS_LOG, {"websocket": None})
    try:
        raise EOFError("stream of frames ended")
    except EOFError:
        logger.error("unexpected internal error", exc_info=True)
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        logger.error("unexpected internal error", exc_info=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and errors[0].exc_info[0] is RuntimeError


@given(st.integers(1, 40), st.integers(0, 2**32))
def test_backoff_grows_is_capped_and_jittered_within_bounds(attempt: int, seed: int) -> None:
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=5.0, multiplier=2.0, jitter=0.5)
    base = min(5.0, 0.1 * 2.0 ** (attempt - 1))
    assert base * 0.5 <= policy.delay(attempt, random.Random(seed)) <= base


@attrs.define
class ModelServer:
    """The server side of the protocol, reduced to what the client's guarantees rest on:
    highest-seq dedup, an ordered journal with acks and replay, heartbeat acks in order."""

    client_seq: int = 0
    inputs: list[str] = attrs.field(factory=list)
    head: int = 0
    journal: list[tuple[int, str]] = attrs.field(factory=list)

    def emit(self) -> str:
        self.head += 1
        frame = json.dumps({"type": "out", "server_event_seq": self.head})
        self.journal.append((self.head, frame))
        return frame

    def handle(self, frame: str) -> list[str]:
        event = json.loads(frame)
        if event["type"] == "session.heartbeat":
            return [json.dumps({"type": "session.heartbeat_ack"})]
        if event["type"] == "session.event_ack":
            seq = event["server_event_seq"]
            assert 0 <= seq <= self.head
            self.journal = [entry for entry in self.journal if entry[0] > seq]
            return []
        seq = event["client_event_seq"]
        if seq <= self.client_seq:
            return []
        assert seq == self.client_seq + 1, "the client skipped a seq"
        self.client_seq = seq
        self.inputs.append(event["text"])
        return [self.emit()]

    def resume(self, frame: str) -> list[str]:
        last = json.loads(frame)["last_received_server_event_seq"]
        assert 0 <= last <= self.head
        self.journal = [entry for entry in self.journal if entry[0] > last]
        assert [seq for seq, _ in self.journal] == list(range(last + 1, self.head + 1))
        answer = {**resumed(self.client_seq), "session_id": "s1"}
        return [json.dumps(answer)] + [frame for _, frame in self.journal]


steps = st.lists(
    st.one_of(
        st.just(("send", 0)),
        st.just(("emit", 0)),
        st.tuples(st.just("write"), st.integers(1, 5)),
        st.tuples(st.just("serve"), st.integers(1, 5)),
        st.tuples(st.just("read"), st.integers(1, 5)),
        st.tuples(st.just("tick"), st.integers(0, 20)),
        st.tuples(st.just("cut"), st.integers(0, 1)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_model_every_event_once_in_order_through_any_cuts(plan: list[tuple[str, int]]) -> None:
    state = opened(
        acks=AckPolicy(every_events=2, max_delay=1.0),
        heartbeat=HeartbeatPolicy(interval=5, timeout=100, confirm_every=2),
    )
    server, sent, delivered = ModelServer(), [], []
    up: list[str] = []  # frames on the wire, client to server
    down: list[str] = []  # and server to client
    now = 0.0

    def read(count: int) -> None:
        for frame in down[:count]:
            if state.on_event(json.loads(frame), len(frame), now) is Verdict.DELIVER:
                delivered.append(json.loads(frame)["server_event_seq"])
        del down[:count]

    def write(count: int) -> None:
        for _ in range(count):
            if (frame := state.next_frame(now)) is not None:
                up.append(frame)

    def serve(count: int) -> None:
        for frame in up[:count]:
            down.extend(server.handle(frame))
        del up[:count]

    for step, arg in plan:
        if step == "send":
            sent.append(f"m{len(sent)}")
            state.enqueue(text(sent[-1]))
        elif step == "emit":
            down.append(server.emit())
        elif step == "write":
            write(arg)
        elif step == "serve":
            serve(arg)
        elif step == "read":
            read(arg)
        elif step == "tick":
            now += arg / 4
        else:  # cut: whatever is in flight is lost; arg=1 also loses session.resumed
            up.clear()
            down.clear()
            answer = server.resume(state.opening_frame())
            if arg:
                answer = server.resume(state.opening_frame())
            state.on_handshake(json.loads(answer[0]), now)
            down.extend(answer[1:])
    state.request_confirm()  # the end: a barrier heartbeat, then everything settles
    for _ in range(10):
        write(1000)
        serve(len(up))
        read(len(down))
    assert not up and not down and not state.outbox
    assert server.inputs == sent
    assert delivered == list(range(1, server.head + 1))


# -- 2. the client against the real server, in memory -------------------------------------


@attrs.define
class Engines:
    """An engine factory that keeps every engine it made."""

    options: dict[str, Any] = attrs.field(factory=dict)
    made: list[ScriptedEngine] = attrs.field(factory=list)

    def __call__(self, config: Any) -> ScriptedEngine:
        engine = ScriptedEngine(dict(config), **self.options)
        self.made.append(engine)
        return engine


@attrs.define
class Net:
    """The in-memory network: each connection's server side is a FaultyStream."""

    sim: Simulation
    down: bool = False
    streams: list[FaultyStream] = attrs.field(factory=list)

    async def open_stream(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        if self.down:
            raise OSError("network is down")
        client, faulty = await self.sim.listener.connect()
        self.streams.append(faulty)
        return client

    async def cut(self) -> None:
        await self.streams[-1].cut()


@asynccontextmanager
async def sim_server(
    config: ServerConfig | None = None, engines: Any = EchoEngine
) -> AsyncIterator[tuple[Simulation, Net]]:
    async with _running_server(config, engines) as sim:
        yield sim, Net(sim)


def client_for(net: Net, *, options: ClientOptions = FAST, **kwargs: Any) -> Any:
    return connect(URL, open_stream=net.open_stream, options=options, **kwargs)


async def next_of(session: ClientSession, kind: str) -> Event:
    async for event in session:
        if event["type"] == kind:
            return event
    raise AssertionError(f"session ended before {kind}")


async def texts(session: ClientSession, count: int) -> list[Event]:
    return [await next_of(session, "response.output_text.delta") for _ in range(count)]


async def test_open_send_receive_close(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server() as (sim, net):
        async with client_for(net, session={"voice": "x"}, on_change=changes.append) as session:
            assert session.config == {"voice": "x"} and session.generation == 1
            assert session.status == "attached" and "sess_" in repr(session)
            assert await session.send(text("one")) == 1
            assert await session.send(text("two")) == 2
            got = await texts(session, 2)
            assert [(e["text"], e["server_event_seq"]) for e in got] == [("one", 1), ("two", 2)]
            await session.aclose()
            assert [e["type"] for e in [e async for e in session]] == ["session.closed"]
            with pytest.raises(SessionEnded):
                await session.send(text("too late"))
        assert sim.server.slots_held == 0
    assert changes == [Attached(session.session_id or "", 1, resumed=False, resent=0)]


@pytest.mark.parametrize("seed", range(25))
async def test_random_faults_every_event_exactly_once(
    autojump_clock: trio.abc.Clock, seed: int
) -> None:
    rng = random.Random(seed)
    engines = Engines()
    sent = [f"m{i}" for i in range(60)]
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net, rng=random.Random(seed)) as session:

            async def chaos() -> None:
                for _ in range(6):
                    await trio.sleep(rng.uniform(0, 0.4))
                    fault, stream = rng.choice(["cut", "fail", "hold", "down"]), net.streams[-1]
                    if fault == "cut":
                        await stream.cut()
                    elif fault == "fail":
                        stream.fail_sends = True  # the server's writes fail; reads go on
                    elif fault == "hold":
                        stream.hold()  # the server goes silent: the heartbeat notices
                    else:
                        net.down = True
                        await stream.cut()
                        await trio.sleep(rng.uniform(0, 3))
                        net.down = False

            async def sender() -> None:
                for value in sent:
                    await session.send(text(value))
                    await trio.sleep(rng.uniform(0, 0.03))

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(chaos)
                    nursery.start_soon(sender)
                    got = await texts(session, len(sent))
        assert [e["text"] for e in got] == sent
        seqs = [e["server_event_seq"] for e in got]
        assert seqs == sorted(set(seqs))
        (engine,) = engines.made  # one session, never reopened
        assert [e["text"] for e in engine.received] == sent
        assert [e["client_event_seq"] for e in engine.received] == list(range(1, 61))
        assert sim.server.slots_held == 0


async def test_heartbeats_keep_an_idle_session_alive(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(idle_ttl_s=30)) as (_sim, net):
        async with client_for(net) as session:
            await trio.sleep(600)
            assert session.status == "attached" and session.generation == 1
            await session.send(text("still here"))
            assert (await texts(session, 1))[0]["text"] == "still here"


async def test_a_silent_server_is_noticed_and_the_session_resumed(
    autojump_clock: trio.abc.Clock,
) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server() as (_sim, net):
        async with client_for(net, on_change=changes.append) as session:
            net.streams[-1].hold()  # nothing the server sends arrives any more
            started = trio.current_time()
            await session.send(text("hello?"))
            assert (await texts(session, 1))[0]["text"] == "hello?"
            assert session.generation == 2
            # Found within one heartbeat interval plus its timeout.
            assert trio.current_time() - started <= 5 + 2 + 1
    assert isinstance(changes[1], Disconnected) and "heartbeat" in changes[1].reason


async def test_expired_grace_ends_with_resume_refused(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(disconnect_grace_s=2)) as (sim, net):
        async with client_for(net) as session:
            net.down = True
            await net.cut()
            await trio.sleep(5)
            net.down = False
            with pytest.raises(ResumeRefused) as caught:
                async for _ in session:
                    pass
            assert caught.value.code == "session_resume_expired"
            assert session.status == "failed"
            with pytest.raises(ResumeRefused):
                await session.send(text("x"))
        assert sim.server.slots_held == 0


async def test_reconnecting_gives_up_after_max_attempts(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=1.0, max_attempts=4, deadline=60)
    async with sim_server() as (_sim, net):
        async with client_for(
            net,
            options=ClientOptions(reconnect=policy),
            on_change=changes.append,
            rng=random.Random(1),
        ) as session:
            net.down = True
            await net.cut()
            with pytest.raises(ReconnectFailed) as caught:
                await session.receive()
    assert caught.value.attempts == 4 and "network is down" in caught.value.last_error
    retries = [c for c in changes if isinstance(c, Retrying)]
    assert [r.attempt for r in retries] == [1, 2, 3, 4]
    for retry in retries:
        base = min(1.0, 0.1 * 2 ** (retry.attempt - 1))
        assert base / 2 <= retry.delay <= base


async def test_the_overall_deadline_bounds_reconnecting(autojump_clock: trio.abc.Clock) -> None:
    policy = ReconnectPolicy(initial_delay=1, max_delay=1, max_attempts=1000, deadline=10)
    async with sim_server() as (_sim, net):
        async with client_for(net, options=ClientOptions(reconnect=policy)) as session:
            net.down = True
            await net.cut()
            lost = trio.current_time()
            with pytest.raises(ReconnectFailed) as caught:
                await session.receive()
            assert 10 <= trio.current_time() - lost <= 11
            assert caught.value.elapsed >= 10


async def test_a_wrong_token_is_refused_at_connect(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net, detach_on_exit=True) as session:
            state = session.resume_state()
        with pytest.raises(ResumeRefused) as caught:
            async with client_for(net, resume=attrs.evolve(state, resume_token="forged")):
                raise AssertionError("not reached")
        assert caught.value.code == "invalid_resume_token" and caught.value.close_code == 4001


async def test_a_wrong_path_fails_at_once(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        started = trio.current_time()
        with pytest.raises(ServerRefused) as caught:
            async with connect("ws://sim/nowhere", open_stream=net.open_stream, options=FAST):
                raise AssertionError("not reached")
        assert "HTTP 404" in str(caught.value) and trio.current_time() == started
        assert len(net.streams) == 1  # not retried


async def test_opening_waits_for_a_free_slot(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server(ServerConfig(max_sessions=1)) as (_sim, net):
        async with client_for(net) as first, trio.open_nursery() as nursery:

            async def second() -> None:
                async with client_for(net, on_change=changes.append) as session:
                    await session.send(text("in"))
                    assert (await texts(session, 1))[0]["text"] == "in"

            nursery.start_soon(second)
            await trio.sleep(1)
            await first.aclose()
    assert any(isinstance(c, Retrying) and "resource_exhausted" in c.error for c in changes)


async def test_detach_then_resume_from_a_new_client(autojump_clock: trio.abc.Clock) -> None:
    engines = Engines()
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net, detach_on_exit=True) as session:
            await session.send(text("a"))
            await texts(session, 1)
            await session.confirm()
            state = session.resume_state()
        assert sim.server.slots_held == 1  # detached, not closed
        await engines.made[0].emit("while away")
        async with client_for(net, resume=state) as session:
            assert session.generation == 2
            assert (await texts(session, 1))[0]["text"] == "while away"
            assert await session.send(text("b")) == 2  # numbering goes on from the server's
            assert (await texts(session, 1))[0]["text"] == "b"
        assert [e["client_event_seq"] for e in engines.made[0].received] == [1, 2]
        assert sim.server.slots_held == 0


async def test_explicit_detach_returns_the_resume_state(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        async with client_for(net) as session:
            await session.send(text("a"))
            await texts(session, 1)
            state = await session.detach()
            assert state.last_server_event_seq == 1 and session.status == "ended"
            with pytest.raises(SessionEnded):
                await session.send(text("b"))
        assert sim.server.slots_held == 1
        async with client_for(net, resume=state):
            pass
        assert sim.server.slots_held == 0


async def test_a_takeover_ends_the_older_client(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as first:
            async with client_for(net, resume=first.resume_state()) as second:
                assert await next_of(first, "session.replaced")
                with pytest.raises(SessionReplaced) as caught:
                    await first.receive()
                assert caught.value.generation == 2
                await second.send(text("mine now"))
                assert (await texts(second, 1))[0]["text"] == "mine now"


async def test_server_shutdown_is_surfaced_then_ends(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(drain_timeout_s=3)) as (sim, net):
        async with client_for(net) as session:
            sim.server.begin_shutdown()
            events = [event async for event in session]
            assert [e["type"] for e in events] == ["session.going_away", "session.closed"]
            assert events[0]["time_left_ms"] == 3000 and events[1]["reason"] == "server_shutdown"


async def test_a_journal_gap_is_surfaced_as_resync_required(
    autojump_clock: trio.abc.Clock,
) -> None:
    engines = Engines()
    async with sim_server(ServerConfig(journal_max_bytes=300), engines) as (_sim, net):
        async with client_for(net) as session:
            net.down = True
            await net.cut()
            for i in range(10):
                await engines.made[0].emit(f"lost {i:02}" + "." * 40)
            net.down = False
            resync = await next_of(session, "session.resync_required")
            assert resync["reason"] == "journal_gap" and resync["dropped_through_seq"] == 10
            await session.send(text("after"))
            after = (await texts(session, 1))[0]
            assert (after["text"], after["server_event_seq"]) == ("after", 11)


async def test_cancelled_send_queues_nothing(autojump_clock: trio.abc.Clock) -> None:
    engines = Engines()
    options = attrs.evolve(FAST, max_unconfirmed_events=2)
    async with sim_server(engines=engines) as (_sim, net):
        async with client_for(net, options=options) as session:
            net.down = True
            await net.cut()
            await session.send(text("a"))
            await session.send(text("b"))
            with trio.move_on_after(0.5) as scope:
                await session.send(text("c"))  # the resend buffer is full
            assert scope.cancelled_caught and session.state.next_client_seq == 3
            net.down = False
            await session.confirm()
            assert [e["text"] for e in await texts(session, 2)] == ["a", "b"]
            assert await session.send(text("c")) == 3
            await texts(session, 1)
        assert [e["text"] for e in engines.made[0].received] == ["a", "b", "c"]


async def test_cancelled_receive_loses_nothing(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as session:
            for i in range(20):
                await session.send(text(str(i)))
            got: list[str] = []
            while len(got) < 20:
                with trio.move_on_after(0.0001):
                    got.append((await session.receive())["text"])
            assert got == [str(i) for i in range(20)]


async def test_an_error_in_the_block_comes_out_unchanged(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        with pytest.raises(KeyError):
            async with client_for(net):
                raise KeyError("mine")
        assert sim.server.slots_held == 0  # closed, not left detached


async def test_a_cancelled_block_still_closes_the_session(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        with trio.move_on_after(1) as scope:
            async with client_for(net):
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert sim.server.slots_held == 0


async def test_leaving_is_bounded_when_the_server_is_gone(autojump_clock: trio.abc.Clock) -> None:
    options = attrs.evolve(FAST, close_timeout=3)
    async with sim_server() as (_sim, net):
        async with client_for(net, options=options):
            net.down = True
            await net.cut()
            left = trio.current_time()
        assert trio.current_time() - left <= 3.01
        net.down = False  # the server will expire it after its grace


async def test_confirm_returns_once_the_server_has_read_everything(
    autojump_clock: trio.abc.Clock,
) -> None:
    engines = Engines({"gated": True})  # the engine answers nothing
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net) as session:
            for i in range(5):
                await session.send(text(str(i)))
            await session.confirm()
            assert sim.server.sessions.registry.sessions[session.session_id or ""].client_seq == 5
            assert not session.state.outbox
            engines.made[0].release(5)
            assert len(await texts(session, 5)) == 5


async def test_refused_events_come_back_as_error_events(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as session:
            await session.send({"type": "no.such.event", "event_id": "e1"})
            error = await next_of(session, "error")
            assert (error["code"], error["event_id"]) == ("unknown_event", "e1")
            await session.send(text("fine"))
            assert (await texts(session, 1))[0]["text"] == "fine"


async def test_oversized_event_is_refused_locally(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(max_event_bytes=200)) as (_sim, net):
        async with client_for(net) as session:
            assert session.limits.max_event_bytes == 200
            with pytest.raises(EventTooLarge):
                await session.send(text("x" * 300))
            assert await session.send(text("small")) == 1


# -- 3. a scripted server -------------------------------------------------------------------

Script = Callable[[WebSocketConnection, int], Awaitable[None]]


@asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """A WebSocket server in memory that runs ``script(ws, n)`` for its n-th connection."""
    listener = MemoryListener.create()
    counter = itertools.count()

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        with contextlib.suppress(WsClosed):
            await script(ws, next(counter))

    server = WebSocketServer(handler, [listener])  # type: ignore[list-item]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)

        async def open_stream() -> trio.abc.Stream:
            client, _ = await listener.connect()
            return client

        yield open_stream
        nursery.cancel_scope.cancel()


async def receive_json(ws: WebSocketConnection) -> Event:
    result: Event = json.loads(await ws.get_message())
    return result


async def send_json(ws: WebSocketConnection, *events: Event) -> None:
    for event in events:
        await ws.send_message(json.dumps(event))


def out(seq: int) -> Event:
    return {"type": "out", "server_event_seq": seq}


async def test_a_replay_that_overlaps_is_deduplicated(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            assert first["type"] == "session.update"
            await send_json(ws, created(), out(1), out(2), out(3))
            return  # the connection ends: the client resumes
        assert first["last_received_server_event_seq"] == 3
        await send_json(ws, resumed(0), out(2), out(3), out(4), {"type": "session.going_away"})
        await send_json(ws, out(4), out(5), {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            events = [event async for event in session]
    assert [e.get("server_event_seq", e["type"]) for e in events] == [
        1,
        2,
        3,
        4,
        "session.going_away",
        5,
        "session.closed",
    ]
    assert session.duplicates_dropped == 3


async def test_a_resume_conflict_is_retried(autojump_clock: trio.abc.Clock) -> None:
    tokens: list[str] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        tokens.append(first["resume_token"])
        if n == 1:
            conflict = {"type": "error", "code": "session_resume_conflict", "retryable": True}
            await send_json(ws, {**conflict, "message": "busy"})
            await ws.aclose(4001)
            return
        await send_json(ws, resumed(0), {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            assert [e["type"] async for e in session] == ["session.closed"]
    assert tokens == ["secret-1", "secret-1"]


async def test_a_lost_session_resumed_is_retried_with_the_same_token(
    autojump_clock: trio.abc.Clock,
) -> None:
    tokens: list[str] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        tokens.append(first["resume_token"])
        if n == 1:
            return  # processed, but session.resumed never arrives
        await send_json(ws, resumed(0, generation=3))
        await send_json(ws, {"type": "session.closed", "reason": "engine_finished"})
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            assert [e["type"] async for e in session] == ["session.closed"]
            assert session.generation == 3
    assert tokens == ["secret-1", "secret-1"]


async def test_close_4001_without_an_error_is_terminal(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            await send_json(ws, created())
            return
        await ws.aclose(4001)

    async with scripted_server(script) as open_stream:
        async with connect(URL, open_stream=open_stream, options=FAST) as session:
            with pytest.raises(ResumeRefused) as caught:
                await session.receive()
    assert caught.value.close_code == 4001


async def test_a_first_frame_that_is_not_an_event_is_a_violation(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await ws.send_message("hello")

    async with scripted_server(script) as open_stream:
        with pytest.raises(ProtocolViolation):
            async with connect(URL, open_stream=open_stream, options=FAST):
                raise AssertionError("not reached")


async def test_a_refused_open_is_raised_at_connect(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await send_json(
            ws, {"type": "error", "code": "bad_event", "message": "no", "retryable": False}
        )
        await ws.get_message()

    async with scripted_server(script) as open_stream:
        with pytest.raises(ServerRefused) as caught:
            async with connect(URL, open_stream=open_stream, options=FAST):
                raise AssertionError("not reached")
    assert caught.value.code == "bad_event" and not caught.value.retryable


# -- 4. a real server on 127.0.0.1, through a proxy that cuts connections -------------------


class RecordingEcho(EchoEngine):
    inputs: list[Event] = []  # shared per test: reset in the test

    async def run(self, session: Any) -> None:
        async for event in session:
            RecordingEcho.inputs.append(event)
            await session.send({"type": "response.output_text.delta", "text": event["text"]})


@pytest.mark.parametrize("seed", range(5))
async def test_exactly_once_through_a_cutting_proxy(seed: int) -> None:
    RecordingEcho.inputs = []
    sent = [f"event {i}" for i in range(200)]
    options = ClientOptions(
        reconnect=ReconnectPolicy(initial_delay=0.01, max_delay=0.2, max_attempts=50, deadline=20),
        heartbeat=HeartbeatPolicy(interval=1.0, timeout=1.0),
        open_timeout=2.0,
        close_timeout=2.0,
    )
    grace = 1.0
    config = ServerConfig(host="127.0.0.1", port=0, disconnect_grace_s=grace)
    changes: list[ConnectionChange] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = DuplexServer(config, RecordingEcho)
            port = await nursery.start(server.run_tcp)
            plan = FaultPlan(seed=seed, max_cuts=4 + 2 * seed, max_lifetime=0.3)
            proxy = FaultyProxy(port, plan)
            proxy_port = await nursery.start(proxy.run)
            url = f"ws://127.0.0.1:{proxy_port}/v1/duplex"
            async with connect(
                url, options=options, on_change=changes.append, rng=random.Random(seed)
            ) as session:
                async with trio.open_nursery() as inner:

                    async def sender() -> None:
                        for i, value in enumerate(sent):
                            await session.send(text(value))
                            if i % 20 == 19:
                                await session.confirm()  # pace: the engine's input is bounded

                    inner.start_soon(sender)
                    got = await texts(session, len(sent))
            assert [e["text"] for e in got] == sent
            seqs = [e["server_event_seq"] for e in got]
            assert seqs == list(range(1, len(sent) + 1))
            assert [e["text"] for e in RecordingEcho.inputs] == sent
            # PROTOCOL.md: the slot is free before session.closed is sent.
            assert session.session_id not in server.sessions.registry.sessions
            # A cut between the server's send of session.created and the client's read of
            # it leaves a session nobody can resume: it must go after its grace.
            with trio.fail_after(grace + 5):
                while server.slots_held or server.sessions.registry.sessions:
                    await server.wait_changed()
            nursery.cancel_scope.cancel()
    assert min(plan.max_cuts, 4) <= len(proxy.cuts) <= plan.max_cuts
    assert sum(isinstance(c, Attached) for c in changes) >= 1
