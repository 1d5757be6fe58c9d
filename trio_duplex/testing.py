"""A simulation kit: run a real DuplexServer in memory, with faults you control.

Everything here runs without sockets, so under pytest-trio's ``autojump_clock`` a grace
period of 30 s passes instantly and exactly. Example::

    from trio_duplex.testing import running_server

    async def test_echo(autojump_clock):
        async with running_server() as sim:
            client, created = await sim.open_session()
            await client.send({"type": "input.text.append", "text": "hi"})
            assert (await client.receive())["text"] == "hi"
        assert sim.server.slots_held == 0

The parts, from the wire up:

* ``FaultyStream`` wraps the server side of each connection: hold sends at a gate, make
  them fail, break only the write half, end or stall only the read half, or cut the
  connection between two steps.
* ``MemoryListener`` / ``Simulation.connect``: an in-memory listener and a JSON client.
* ``ScriptedEngine``: an engine whose output, end, failure and teardown the test decides.
* ``Probe``: installed by ``running_server``; records every terminal event the server
  decides and queues, and checks after every scheduler step that slots never exceed
  ``max_sessions`` and that no session has two attached connections. ``running_server``
  asserts its findings, and that no slot leaked, when the block ends without error.
* ``CancelAtStep``: cancel a scope just before the k-th step of chosen tasks, to visit
  every await point of a path in turn.

The kit reads a few private attributes of the server (registry, runners, connections);
it is versioned with it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from ._config import ServerConfig
from ._connection import Connection
from ._core import Registry, Session, Terminal
from ._engine import Engine, EngineFactory, EngineSession, Event
from ._runner import SessionRunner
from ._server import DuplexServer
from .engines.echo import EchoEngine

__all__ = [
    "CancelAtStep",
    "FaultyStream",
    "MemoryListener",
    "Probe",
    "ScriptedEngine",
    "ScriptedFactory",
    "SimClient",
    "Simulation",
    "TerminalQueued",
    "all_tasks",
    "probing",
    "resume_event",
    "running_server",
    "settle",
]

TERMINAL_TYPES = frozenset({"session.closed", "session.expired"})


async def settle() -> None:
    """Let every task run until all are blocked (no clock time passes)."""
    await trio.testing.wait_all_tasks_blocked()


# -- the transport ---------------------------------------------------------------------


class TransportFault(trio.BrokenResourceError):
    """Raised by a FaultyStream whose send was made to fail."""


@attrs.define(eq=False)
class FaultyStream(trio.abc.Stream):
    """A stream whose sends can be held, failed or cut, for race tests."""

    inner: trio.abc.Stream
    peer: trio.StapledStream[Any, Any] | None = None
    """The client's end, when the listener made both."""
    fail_sends: bool = False
    """Every send from now on raises (the read half keeps working)."""
    gate: trio.Event | None = None
    """While set to an unset Event, each send waits on it before writing."""
    sends_started: int = 0
    sends_completed: int = 0
    held: int = 0
    """Sends waiting at the gate right now."""
    _passes: int = 0
    _reads_ended: bool = False
    _read_gate: trio.Event | None = None
    _read_scope: trio.CancelScope | None = None
    _send_started: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _held_changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends_started += 1
        self._send_started.unpark_all()
        gate = self.gate
        if gate is not None and not gate.is_set():
            if self._passes > 0:
                self._passes -= 1
            else:
                self.held += 1
                self._held_changed.unpark_all()
                try:
                    await gate.wait()
                finally:
                    self.held -= 1
        if self.fail_sends:
            raise TransportFault("send made to fail by the test")
        await self.inner.send_all(data)
        self.sends_completed += 1

    def hold(self, after: int = 0) -> trio.Event:
        """Hold every send from now on, but the first ``after``, until the returned Event
        is set (or ``release`` is called)."""
        self.gate = trio.Event()
        self._passes = after
        return self.gate

    def release(self) -> None:
        """Let held sends through, and stop holding."""
        if self.gate is not None:
            self.gate.set()

    async def wait_held(self) -> None:
        """Wait until a send is waiting at the gate (at once if one already is)."""
        while not self.held:
            await self._held_changed.park()

    async def wait_send_started(self) -> None:
        """Wait until the next send begins (e.g. to act while it is held at the gate)."""
        await self._send_started.park()

    def break_writes(self) -> None:
        """Break only the write half: every send from now on fails, held ones included
        once released. Reads go on."""
        self.fail_sends = True

    def end_reads(self) -> None:
        """Break only the read half: the server reads end-of-stream (the peer's FIN),
        while its writes still succeed."""
        self._reads_ended = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    async def fin(self) -> None:
        """The peer's FIN, in order: the server reads what the peer already sent, then
        end-of-stream; its writes still succeed (the peer still reads)."""
        assert self.peer is not None, "only for streams made by MemoryListener.connect"
        await self.peer.send_stream.aclose()

    def stall_reads(self) -> trio.Event:
        """The peer goes silent: nothing more is read (pongs included) until the
        returned Event is set."""
        self._read_gate = trio.Event()
        return self._read_gate

    async def cut(self) -> None:
        """Drop the connection: both halves, no close frame (as a lost network does)."""
        self.fail_sends = True
        if self.gate is not None:
            self.gate.set()
        await trio.aclose_forcefully(self.inner)


    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._reads_ended:
            await trio.lowlevel.checkpoint()
            return b""
        with trio.CancelScope() as self._read_scope:
            data = await self.inner.receive_some(max_bytes)
            if self._read_gate is not None:  # stalled: what arrived waits with us
                await self._read_gate.wait()
            return data
        return b""  # end_reads() interrupted the wait

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    """A Listener fed by ``connect()``; each server-side stream is a FaultyStream."""

    _send: trio.MemorySendChannel[trio.abc.Stream]
    _receive: trio.MemoryReceiveChannel[trio.abc.Stream]
    streams: list[FaultyStream] = attrs.field(factory=list)

    @classmethod
    def create(cls) -> MemoryListener:
        send, receive = trio.open_memory_channel[trio.abc.Stream](100)
        return cls(send, receive)

    async def accept(self) -> trio.abc.Stream:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self._receive.close()
        await trio.lowlevel.checkpoint()

    async def connect(self) -> tuple[trio.abc.Stream, FaultyStream]:
        client, server = trio.testing.memory_stream_pair()
        faulty = FaultyStream(server, peer=client)
        self.streams.append(faulty)
        await self._send.send(faulty)
        return client, faulty


# -- the client ------------------------------------------------------------------------


@attrs.define(eq=False)
class SimClient:
    """A WebSocket client of the simulated server that speaks JSON events."""

    ws: WebSocketConnection
    transport: FaultyStream
    """The server side of this connection: inject faults here."""

    async def send(self, event: Event) -> None:
        await self.ws.send_message(json.dumps(event))

    async def send_raw(self, message: str | bytes) -> None:
        await self.ws.send_message(message)

    async def receive(self) -> Event:
        message = await self.ws.get_message()
        result: Event = json.loads(message)
        return result

    async def send_and_receive(self, event: Event) -> Event:
        await self.send(event)
        return await self.receive()

    async def receive_until_closed(self) -> list[Event]:
        """Every event until the server closes; see ``close_code`` afterwards."""
        events = []
        try:
            while True:
                events.append(await self.receive())
        except ConnectionClosed:
            return events

    @property
    def close_code(self) -> int | None:
        reason = self.ws.closed
        return None if reason is None else reason.code

    async def aclose(self, code: int = 1000) -> None:
        await self.ws.aclose(code)


# -- observing the server --------------------------------------------------------------


@attrs.frozen
class TerminalQueued:
    """A terminal frame queued for a connection, and the accounting at that moment."""

    session_id: str
    event: Event
    slots_held: int
    session_registered: bool
    """Whether the session still held its slot when its terminal event was queued."""
    time: float


@attrs.define(eq=False)
class Probe:
    """What a server decided and sent at the end of its sessions, and invariant checks.

    ``decided[id]`` lists the terminal events ``Session.begin_close`` returned for that
    session (the core promises one); ``queued`` lists every terminal frame handed to a
    connection. ``violations`` collects invariant breaks seen after any scheduler step.
    """

    server: DuplexServer
    decided: dict[str, list[Terminal]] = attrs.field(factory=lambda: defaultdict(list))
    decided_at: dict[str, float] = attrs.field(factory=dict)
    """When each session's (first) terminal event was decided."""
    queued: list[TerminalQueued] = attrs.field(factory=list)
    attached: dict[str, list[Connection]] = attrs.field(factory=lambda: defaultdict(list))
    violations: list[str] = attrs.field(factory=list)
    max_slots_seen: int = 0

    def terminals(self, session_id: str) -> list[Terminal]:
        return self.decided.get(session_id, [])

    def reasons(self, session_id: str) -> list[str]:
        return [terminal.reason for terminal in self.terminals(session_id)]

    def queued_for(self, session_id: str) -> list[TerminalQueued]:
        return [item for item in self.queued if item.session_id == session_id]

    def check(self) -> None:
        """The invariants that must hold between any two scheduler steps."""
        registry = self.server.registry
        held = registry.slots_held
        self.max_slots_seen = max(self.max_slots_seen, held)
        if held > self.server.config.max_sessions:
            self._violate(f"{held} slots held, max_sessions {self.server.config.max_sessions}")
        if held != len(registry.sessions):
            self._violate(f"{held} slots held by {len(registry.sessions)} sessions")
        live = self.server.connections
        for session_id, conns in self.attached.items():
            session = registry.sessions.get(session_id)
            if session is None:
                continue
            current = [c for c in conns if c in live and session.is_current(c.generation)]
            if len(current) > 1:
                self._violate(f"session {session_id} has {len(current)} attached connections")

    def assert_clean(self) -> None:
        assert not self.violations, self.violations
        for session_id, terminals in self.decided.items():
            assert len(terminals) == 1, (session_id, terminals)
        for item in self.queued:
            assert not item.session_registered, f"terminal queued before the slot was freed: {item}"

    def _violate(self, text: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(f"t={trio.current_time():.6f}: {text}")

    # -- fed by the patches below --

    def _on_begin_close(self, session: Session, terminal: Terminal) -> None:
        if session.id in self.server.registry.sessions:
            self.decided[session.id].append(terminal)
            self.decided_at.setdefault(session.id, trio.current_time())

    def _on_queued(self, conn: Connection, frames: list[str]) -> None:
        if conn not in self.server.connections:
            return
        registry = self.server.registry
        for frame in frames:
            if '"session.closed"' not in frame and '"session.expired"' not in frame:
                continue
            event = json.loads(frame)
            if event.get("type") in TERMINAL_TYPES:
                session_id = str(event.get("session_id"))
                self.queued.append(
                    TerminalQueued(
                        session_id,
                        event,
                        registry.slots_held,
                        session_id in registry.sessions,
                        trio.current_time(),
                    )
                )

    def _on_attach(self, runner: SessionRunner, conn: Connection) -> None:
        if runner.server is self.server:
            self.attached[runner.session.id].append(conn)


class _ProbeInstrument(trio.abc.Instrument):
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.probe.check()


_PROBES: list[Probe] = []
_ORIGINALS: dict[tuple[type, str], tuple[Any, Any]] = {}


def _install_patches() -> None:
    begin_close = Session.begin_close
    finish = Connection.finish
    push = Connection.push
    attach = SessionRunner.attach

    def spy_begin_close(self: Session, reason: str, now: float) -> Terminal | None:
        terminal = begin_close(self, reason, now)
        if terminal is not None:
            for probe in _PROBES:
                probe._on_begin_close(self, terminal)
        return terminal

    def spy_finish(
        self: Connection, frames: list[str], close_code: int, *, flush: bool = True
    ) -> None:
        queued = self.close_code is None
        finish(self, frames, close_code, flush=flush)
        if queued:
            for probe in _PROBES:
                probe._on_queued(self, frames)

    def spy_push(self: Connection, frame: str, *, coalesce: bool = False) -> None:
        queued = self.close_code is None
        push(self, frame, coalesce=coalesce)
        if queued:
            for probe in _PROBES:
                probe._on_queued(self, [frame])

    def spy_attach(self: SessionRunner, conn: Connection, commit: Any) -> None:
        for probe in _PROBES:
            probe._on_attach(self, conn)
        attach(self, conn, commit)

    for cls, name, spy in [
        (Session, "begin_close", spy_begin_close),
        (Connection, "finish", spy_finish),
        (Connection, "push", spy_push),
        (SessionRunner, "attach", spy_attach),
    ]:
        _ORIGINALS[(cls, name)] = (cls.__dict__[name], spy)
        setattr(cls, name, spy)


@contextmanager
def probing(server: DuplexServer) -> Iterator[Probe]:
    """Observe ``server`` while the block runs (inside ``trio.run``)."""
    probe = Probe(server)
    if not _PROBES:
        _install_patches()
    _PROBES.append(probe)
    instrument = _ProbeInstrument(probe)
    trio.lowlevel.add_instrument(instrument)
    try:
        yield probe
    finally:
        trio.lowlevel.remove_instrument(instrument)
        _PROBES.remove(probe)
        if not _PROBES:
            for (cls, name), (original, spy) in _ORIGINALS.items():
                if cls.__dict__.get(name) is spy:  # not patched over since: undo ours
                    setattr(cls, name, original)
            _ORIGINALS.clear()


def all_tasks() -> list[trio.lowlevel.Task]:
    """Every task of the current run (to pick one for ``CancelAtStep`` to watch)."""
    found, pending = [], [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        if task is None:
            continue
        found.append(task)
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return found


@attrs.define(eq=False)
class CancelAtStep(trio.abc.Instrument):
    """Cancel ``scope()`` just before the ``at_step``-th step of the tasks ``watch``
    picks, counting only once ``scope()`` returns a scope. Run a scenario for
    ``at_step = 1, 2, ...`` until ``fired`` stays False: every await point of the path
    has then been cancelled once. Install with ``trio.lowlevel.add_instrument``."""

    watch: Callable[[trio.lowlevel.Task], bool]
    scope: Callable[[], trio.CancelScope | None]
    at_step: int
    steps: int = 0
    fired: bool = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.fired or not self.watch(task):
            return
        scope = self.scope()
        if scope is None:
            return
        self.steps += 1
        if self.steps == self.at_step:
            self.fired = True
            scope.cancel()


# -- the simulation --------------------------------------------------------------------


@attrs.define(eq=False)
class Simulation:
    server: DuplexServer
    listener: MemoryListener
    nursery: trio.Nursery
    probe: Probe | None = None
    stopped: trio.Event = attrs.field(factory=trio.Event)
    """Set once ``server.run`` has returned (after ``shutdown``)."""

    async def connect(
        self, path: str = "/v1/duplex", *, setup: Callable[[FaultyStream], object] | None = None
    ) -> SimClient:
        """Open a WebSocket. ``setup`` gets the server-side stream before the handshake
        (to hold or break it from the first byte)."""
        stream, faulty = await self.listener.connect()
        if setup is not None:
            setup(faulty)
        ws = await wrap_client_stream(self.nursery, stream, "sim", path)  # type: ignore[arg-type]
        return SimClient(ws, faulty)

    async def open_session(self, config: dict[str, Any] | None = None) -> tuple[SimClient, Event]:
        """Connect and open a session; returns the client and its ``session.created``."""
        client = await self.connect()
        created = await client.send_and_receive({"type": "session.update", "session": config or {}})
        assert created["type"] == "session.created", created
        return client, created

    async def resume(
        self, session_id: str, token: str, last_seq: int = 0
    ) -> tuple[SimClient, Event]:
        client = await self.connect()
        answer = await client.send_and_receive(resume_event(session_id, token, last_seq))
        return client, answer

    def session(self, session_id: str) -> Session | None:
        """The live session with that id (None once its slot is free)."""
        return self.server.registry.sessions.get(session_id)

    def connection_of(self, client: SimClient) -> Connection | None:
        """The server's Connection for ``client``, while it is open."""
        for conn in self.server.connections:
            if conn.ws.stream is client.transport:
                return conn
        return None

    async def shutdown(self) -> None:
        """``begin_shutdown`` and wait until the server has stopped."""
        self.server.begin_shutdown()
        await self.stopped.wait()

    def assert_no_leak(self) -> None:
        """Every session still held is live in the registry, and no slot is unaccounted."""
        registry: Registry = self.server.registry
        assert registry.slots_held == len(registry.sessions), (
            registry.slots_held,
            list(registry.sessions),
        )
        assert registry.slots_held <= self.server.config.max_sessions


def resume_event(session_id: str, token: str, last_seq: int = 0) -> Event:
    return {
        "type": "session.resume",
        "session_id": session_id,
        "resume_token": token,
        "last_received_server_event_seq": last_seq,
    }


@asynccontextmanager
async def running_server(
    config: ServerConfig | None = None,
    engine_factory: EngineFactory = EchoEngine,
    *,
    probe: bool = True,
    fail_after_s: float | None = None,
) -> AsyncIterator[Simulation]:
    """Run a DuplexServer on a MemoryListener. On a clean exit: check slots, stop the
    server, and (with ``probe``) assert the probe's findings.

    ``fail_after_s`` bounds the block in clock time: under ``autojump_clock`` a scenario that
    waits for what never comes then fails at once (TooSlowError) instead of hanging.
    """
    server = DuplexServer(config or ServerConfig(), engine_factory)
    listener = MemoryListener.create()
    with probing(server) if probe else _nothing() as found:
        async with trio.open_nursery() as nursery:
            sim = Simulation(server, listener, nursery, found)

            async def serve(*, task_status: trio.TaskStatus[None]) -> None:
                try:
                    await server.run([listener], task_status=task_status)
                finally:
                    sim.stopped.set()

            await nursery.start(serve)
            with trio.fail_after(math.inf if fail_after_s is None else fail_after_s):
                yield sim
            sim.assert_no_leak()
            nursery.cancel_scope.cancel()
        if found is not None:
            found.assert_clean()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


# -- the engine ------------------------------------------------------------------------


class ScriptedEngine(Engine):
    """An engine whose output is gated by the test.

    Each ``input.text.append {text}`` is answered with ``response.output_text.delta`` once
    ``release`` lets it through (``gated=True``), or at once. ``fail_on`` makes the engine
    raise when that text arrives; ``finish_on`` makes it return. From the test: ``emit``
    sends output now, ``finish``/``fail`` end the engine now, and with
    ``hold_teardown=True`` a cancelled engine waits (shielded) for ``release_teardown``,
    like one that must free a model slot before it is gone.
    """

    accepts = frozenset({"input.text.append"})

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        gated: bool = False,
        fail_on: str | None = None,
        finish_on: str | None = None,
        hold_teardown: bool = False,
    ) -> None:
        self.config = dict(config or {})
        self.gated = gated
        self.fail_on = fail_on
        self.finish_on = finish_on
        self.received: list[Event] = []
        self.session: EngineSession | None = None
        self.started = trio.Event()
        self.cancelled = False
        self.teardown_gate: trio.Event | None = trio.Event() if hold_teardown else None
        self.tearing_down = trio.Event()
        self._failure: BaseException | None = None
        self._stop = trio.CancelScope()
        self._permits_send, self._permits = trio.open_memory_channel[None](1000)

    @classmethod
    def factory(cls, **options: Any) -> ScriptedFactory:
        """An EngineFactory that builds ScriptedEngines and keeps them in ``engines``."""
        return ScriptedFactory(options)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._permits_send.send_nowait(None)

    async def emit(self, text: str) -> None:
        """Send one output event now, from the test."""
        assert self.session is not None
        await self.session.send({"type": "response.output_text.delta", "text": text})

    def finish(self) -> None:
        """Make ``run`` return now (the session ends with ``engine_finished``)."""
        self._stop.cancel()

    def fail(self, message: str = "scripted failure") -> None:
        """Make ``run`` raise now (the session ends with ``engine_error``)."""
        self._failure = RuntimeError(message)
        self._stop.cancel()

    def release_teardown(self) -> None:
        assert self.teardown_gate is not None
        self.teardown_gate.set()

    async def run(self, session: EngineSession) -> None:
        self.session = session
        self.started.set()
        try:
            with self._stop:
                await self._serve(session)
            if self._failure is not None:
                raise self._failure
        except trio.Cancelled:
            self.cancelled = True
            self.tearing_down.set()
            if self.teardown_gate is not None:
                # Shielded, but bounded: a test that fails before releasing it must not
                # leave the server waiting forever.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 3600):
                    await self.teardown_gate.wait()
            raise

    async def _serve(self, session: EngineSession) -> None:
        async for event in session:
            self.received.append(event)
            text = event.get("text")
            if text == self.fail_on:
                raise RuntimeError(f"scripted failure on {text!r}")
            if text == self.finish_on:
                return
            if self.gated:
                await self._permits.receive()
            await session.send({"type": "response.output_text.delta", "text": text})


@attrs.define(eq=False)
class ScriptedFactory:
    """Builds a ScriptedEngine per session, with the same options; keeps every one."""

    options: dict[str, Any]
    engines: list[ScriptedEngine] = attrs.field(factory=list)

    def __call__(self, config: Mapping[str, Any]) -> ScriptedEngine:
        engine = ScriptedEngine(config, **self.options)
        self.engines.append(engine)
        return engine

    @property
    def last(self) -> ScriptedEngine:
        return self.engines[-1]
