"""Helpers shared by the client's tests (``tests/client/test_*.py``).

* Events: ``text`` (an application event), and the server's answers ``created``,
  ``resumed`` and ``out`` as a scripted server or a ``SessionState`` test feeds them.
* The in-memory harness: ``sim_server`` runs the real server on ``trio_duplex.testing``'s
  listener, ``Net`` opens (or refuses) the client's streams to it and cuts them,
  ``Engines`` keeps every engine the server made, ``client_for`` connects through
  ``Net`` with fast policies (``FAST``); ``rng_starting_at`` fixes which of several URLs
  ``connect`` tries first.
* ``Slow``, an engine slower than the client (``OneSlow``, its factory), for the
  flow-control tests.
* Reading: ``next_of`` (the next event of a type), ``texts`` (the next echoed texts).
* The ``SessionState`` model tests (one per dialect): ``CUT_PLANS`` (random steps and
  cuts), ``ModelJournal`` (the model server's journal) and ``Wire`` (frames in flight,
  lost on a cut) that ``Wire.run`` drives through a plan.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar

import attrs
import pytest
import trio
from hypothesis import strategies as st

from trio_duplex import ServerConfig
from trio_duplex.client import (
    ClientOptions,
    ClientSession,
    ConnectionChange,
    HeartbeatPolicy,
    ReconnectPolicy,
    ResumeState,
    SessionState,
    Verdict,
    connect,
)
from trio_duplex.core.limits import Limits
from trio_duplex.engines.api import Engine, EngineFactory, EngineSession
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.testing import FaultyStream, ScriptedEngine, Simulation, running_server

Event = dict[str, Any]
URL = "ws://sim/v1/duplex"
FAST = ClientOptions(
    reconnect=ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=100, deadline=25),
    heartbeat=HeartbeatPolicy(interval=5, timeout=2),
)
"""Quick retries and heartbeats (virtual time makes them cheap)."""


# -- events ------------------------------------------------------------------------------


def text(value: str) -> Event:
    return {"type": "input.text.append", "text": value}


def created(**limits: float) -> Event:
    """``session.created`` of session ``s1``, token ``secret-1``, generation 1."""
    return {
        "type": "session.created",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": "secret-1",
        "attachment_generation": 1,
        "limits": {"idle_ttl_s": 300, "journal_max_bytes": 8 << 20, **limits},
    }


def resumed(received: int, generation: int = 2) -> Event:
    """``session.resumed`` of ``s1`` with token ``secret-<generation>``."""
    return {
        "type": "session.resumed",
        "session_id": "s1",
        "session": {"voice": "x"},
        "resume_token": f"secret-{generation}",
        "attachment_generation": generation,
        "last_received_client_event_seq": received,
    }


def out(seq: int) -> Event:
    """An engine event the server journaled as ``seq``."""
    return {"type": "out", "server_event_seq": seq}


# -- the real server in memory -----------------------------------------------------------


@attrs.define
class Engines:
    """An engine factory that keeps every engine it made (``gated``: they answer only
    what the test releases)."""

    gated: bool = False
    made: list[ScriptedEngine] = attrs.field(factory=list)

    def __call__(self, config: Mapping[str, Any]) -> ScriptedEngine:
        engine = ScriptedEngine(dict(config), gated=self.gated)
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

    async def outage(self, seconds: float) -> None:
        """The newest connection cut and the network down for ``seconds``."""
        self.down = True
        await self.cut()
        await trio.sleep(seconds)
        self.down = False

    async def chaos(self, rng: random.Random, faults: int = 6) -> None:
        """``faults`` random faults, one at a time, on the newest connection."""
        for _ in range(faults):
            await trio.sleep(rng.uniform(0, 0.4))
            fault, stream = rng.choice(["cut", "fail", "hold", "down"]), self.streams[-1]
            if fault == "cut":
                await stream.cut()
            elif fault == "fail":
                stream.fail_sends = True  # the server's writes fail; reads go on
            elif fault == "hold":
                stream.hold()  # the server goes silent: the heartbeat notices
            else:
                await self.outage(rng.uniform(0, 3))


@asynccontextmanager
async def sim_server(
    config: ServerConfig | None = None, engines: EngineFactory = EchoEngine
) -> AsyncIterator[tuple[Simulation, Net]]:
    async with running_server(config, engines) as sim:
        yield sim, Net(sim)


def client_for(
    net: Net,
    *,
    options: ClientOptions = FAST,
    session: Mapping[str, Any] | None = None,
    resume: ResumeState | None = None,
    detach_on_exit: bool = False,
    on_change: Callable[[ConnectionChange], None] | None = None,
    rng: random.Random | None = None,
) -> AbstractAsyncContextManager[ClientSession]:
    """``connect`` to the simulated server through ``net``."""
    return connect(
        URL,
        session,
        resume=resume,
        options=options,
        detach_on_exit=detach_on_exit,
        on_change=on_change,
        open_stream=net.open_stream,
        rng=rng,
    )


def rng_starting_at(index: int, count: int) -> random.Random:
    """A seeded rng whose first choice among ``count`` URLs (``connect``'s first attempt)
    is the ``index``-th."""
    for seed in range(1000):
        if random.Random(seed).randrange(count) == index:
            return random.Random(seed)
    raise AssertionError("no seed found")


def advertise_more(monkeypatch: pytest.MonkeyPatch, max_pending_input: int) -> None:
    """Servers advertise ``max_pending_input`` whatever they queue (as a proxy rewriting
    the limits would): a client that trusts it overruns them."""
    advertised = Limits.advertised

    def limits(self: Limits) -> dict[str, Any]:
        return {**advertised(self), "max_pending_input": max_pending_input}

    monkeypatch.setattr(Limits, "advertised", limits)


@attrs.define(eq=False)
class Slow(Engine):
    """Takes one event per ``pause`` seconds (virtual) and keeps them; answers nothing."""

    accepts = frozenset({"input.text.append"})
    pause: float = 0.01
    received: list[Event] = attrs.field(factory=list)
    expect: int = 0
    all_in: trio.Event = attrs.field(factory=trio.Event)
    """Set once ``expect`` events were taken."""

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            self.received.append(event)
            if len(self.received) == self.expect:
                self.all_in.set()
            await trio.sleep(self.pause)


@attrs.define
class OneSlow:
    """A factory that makes every session's engine the one ``engine``."""

    engine: Slow = attrs.field(factory=Slow)

    def __call__(self, config: Any) -> Slow:
        return self.engine


# -- reading -----------------------------------------------------------------------------


async def next_of(session: ClientSession, kind: str) -> Event:
    """The next event of type ``kind`` (the ones before it are skipped)."""
    async for event in session:
        if event["type"] == kind:
            return event
    raise AssertionError(f"session ended before {kind}")


async def texts(session: ClientSession, count: int) -> list[Event]:
    """The next ``count`` echoed texts (``response.output_text.delta``)."""
    return [await next_of(session, "response.output_text.delta") for _ in range(count)]


# -- a model server through random cuts (SessionState alone) -----------------------------


CUT_PLANS = st.lists(
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
"""Steps for ``Wire.run``: (``cut``, 1) also loses the first ``session.resumed``."""


@attrs.define
class ModelJournal:
    """A model server's journal: every event it emits is kept until acked or replayed."""

    KIND: ClassVar[str] = "out"
    head: int = 0
    journal: list[tuple[int, str]] = attrs.field(factory=list)

    def emit(self) -> str:
        self.head += 1
        frame = json.dumps({"type": self.KIND, "server_event_seq": self.head})
        self.journal.append((self.head, frame))
        return frame

    def ack(self, seq: int) -> None:
        assert 0 <= seq <= self.head
        self.journal = [entry for entry in self.journal if entry[0] > seq]

    def replay(self, last: int) -> list[str]:
        """What a resume after ``last`` sends again: every event since, none missing."""
        self.ack(last)
        assert [seq for seq, _ in self.journal] == list(range(last + 1, self.head + 1))
        return [frame for _, frame in self.journal]


@attrs.define
class Wire:
    """Frames in flight between a ``SessionState`` and a model server (``handle``)."""

    state: SessionState
    handle: Callable[[str], list[str]]
    now: float = 0.0
    up: list[str] = attrs.field(factory=list)
    down: list[str] = attrs.field(factory=list)
    delivered: list[int] = attrs.field(factory=list)

    def read(self, count: int) -> None:
        for frame in self.down[:count]:
            if self.state.on_event(json.loads(frame), len(frame), self.now) is Verdict.DELIVER:
                self.delivered.append(json.loads(frame)["server_event_seq"])
        del self.down[:count]

    def write(self, count: int) -> None:
        for _ in range(count):
            if (frame := self.state.next_frame(self.now)) is not None:
                assert isinstance(frame, str)  # no audio here: JSON only
                self.up.append(frame)

    def serve(self, count: int) -> None:
        for frame in self.up[:count]:
            self.down.extend(self.handle(frame))
        del self.up[:count]

    def run(
        self,
        plan: list[tuple[str, int]],
        *,
        send: Callable[[], None],
        emit: Callable[[], str],
        resume: Callable[[], list[str]],
    ) -> None:
        """Play ``plan``; a cut loses whatever is in flight and ``resume``s (twice for
        (``cut``, 1): the first answer is lost too)."""
        for step, arg in plan:
            if step == "send":
                send()
            elif step == "emit":
                self.down.append(emit())
            elif step == "write":
                self.write(arg)
            elif step == "serve":
                self.serve(arg)
            elif step == "read":
                self.read(arg)
            elif step == "tick":
                self.now += arg / 4
            else:
                self.up.clear()
                self.down.clear()
                answer = resume()
                if arg:
                    answer = resume()
                self.state.on_handshake(json.loads(answer[0]), self.now)
                self.down.extend(answer[1:])

    def settle(self, tick: float = 0.0) -> None:
        """The end: a barrier heartbeat, then rounds until everything settles."""
        self.state.request_confirm()
        for _ in range(10):
            self.now += tick
            self.write(1000)
            self.serve(len(self.up))
            self.read(len(self.down))
