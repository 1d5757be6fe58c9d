"""The handshake rule for every ordering of a client's disconnect and the server's write
of ``session.created`` (docs/protocol.md, "Delivery rule").

A close frame, a FIN (an end of stream with no close frame: no RFC 6455 client
half-closes, so its connection is gone) or a reset that reaches the server before its
write of ``session.created`` has completed, while the engine prepares, already queued
behind the first message, or while the write waits, leaves the session undelivered:
its slot is free at once (the next open on a ``max_sessions=1`` server is admitted with
no clock time passing), the engine's ``prepare`` is cancelled and its ``run`` never
starts, and nobody can resume it. One that arrives after the write has completed may
come from a client that read the token: that session is resumable, for the unconfirmed
grace.

Each ordering is driven deterministically on the simulated transport (held sends, an
engine whose ``prepare`` waits for the test, ``wait_all_tasks_blocked``, the mock clock);
the last tests run ``trio-duplex serve`` as a subprocess with raw sockets.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked
from websockets.sync.client import connect
from wsproto.events import AcceptConnection, CloseConnection, Ping, Pong, Request

from trio_duplex import EngineSession, ServerConfig
from trio_duplex.core.session import Session, State
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.sessions.owner import PREPARE_TIMEOUT_S
from trio_duplex.server.sessions.websocket import OPENING_READ_AHEAD, RECEIVE_SIZE, WebSocket
from trio_duplex.testing import FaultyStream, Probe, Simulation, running_server, settle
from trio_duplex.testing.transport import MemoryListener

from ..helpers import RawClient, RawWs, Serve

UPDATE: dict[str, Any] = {"type": "session.update", "session": {}}
DISCONNECTS = ["fin", "close_frame", "reset"]


class Gated(EchoEngine):
    """Echo, after a ``prepare`` that, for the first session of a test, waits until
    cancelled (as an upstream that never answers); later sessions prepare at once."""

    instances: ClassVar[list[Gated]] = []

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.preparing = False
        self.prepare_cancelled = False
        self.ran = False
        self.hold = not Gated.instances
        Gated.instances.append(self)

    async def prepare(self, nursery: trio.Nursery) -> None:
        if self.hold:
            self.preparing = True
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.prepare_cancelled = True
                raise
        await trio.lowlevel.checkpoint()

    async def run(self, session: EngineSession) -> None:
        self.ran = True
        await super().run(session)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    Gated.instances = []
    yield
    Gated.instances = []


def probe(sim: Simulation) -> Probe:
    assert sim.probe is not None
    return sim.probe


def only_session(sim: Simulation) -> Session:
    (session,) = sim.server.sessions.registry.sessions.values()
    return session


async def disconnect(raw: RawClient, transport: FaultyStream, how: str) -> None:
    """The client goes: its FIN (it can still read), a close frame, or a reset (both
    halves gone, no close frame)."""
    if how == "fin":
        assert isinstance(raw.stream, trio.StapledStream)
        await raw.stream.send_stream.aclose()
    elif how == "close_frame":
        await raw.send_bytes(raw.ws.send(CloseConnection(code=1000)))
    else:
        await transport.cut()


async def assert_freed_at_once(sim: Simulation, raw: RawClient, session: Session) -> None:
    """The session never opened: undelivered, its slot free with no clock time passed
    (a next open is admitted), not resumable, and its client got no session.created."""
    start = trio.current_time()
    await settle()
    assert probe(sim).reasons(session.id) == ["session_created_undelivered"]
    assert session.state is State.CLOSED
    assert sim.server.slots_held == 0
    assert sim.server.sessions.runners() == []  # no engine ran
    assert [e["type"] for e in await raw.receive_until_closed()] == []
    await sim.open_session()  # max_sessions=1: admitted, not resource_exhausted
    assert trio.current_time() == start
    _, answer = await sim.resume(session.id, "any-token")
    assert answer["code"] == "session_resume_expired"


# -- while the engine prepares -----------------------------------------------------------


@pytest.mark.parametrize("how", DISCONNECTS)
async def test_gone_while_the_engine_prepares(
    autojump_clock: MockClock, raw_ws: RawWs, how: str
) -> None:
    async with running_server(ServerConfig(max_sessions=1), Gated) as sim:
        raw = await raw_ws(sim)
        await raw.send(UPDATE)
        await settle()
        (engine,) = Gated.instances
        assert engine.preparing and sim.server.slots_held == 1
        session = only_session(sim)
        await disconnect(raw, sim.listener.streams[-1], how)
        await assert_freed_at_once(sim, raw, session)
        assert engine.prepare_cancelled and not engine.ran


# -- already queued behind the first message, before the write ----------------------------


async def test_fin_queued_behind_the_first_message(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    """The FIN is there before session.created is written, with nothing awaited in
    between (no prepare): the look at the socket just before the write finds it."""
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        raw = await raw_ws(sim)
        transport = sim.listener.streams[-1]
        # A bad first message is answered by a send held at the gate; meanwhile the real
        # first message and the FIN are queued behind it.
        transport.hold()
        await raw.send_bytes(raw.frame("not json"))
        await transport.wait_held()
        await raw.send(UPDATE)
        await disconnect(raw, transport, "fin")
        await settle()
        transport.release()
        await settle()
        (session_id,) = probe(sim).decided
        assert probe(sim).reasons(session_id) == ["session_created_undelivered"]
        assert sim.server.slots_held == 0
        assert [e["type"] for e in await raw.receive_until_closed()] == ["error"]
        start = trio.current_time()
        await sim.open_session()
        assert trio.current_time() == start


async def test_fin_before_an_autostart_session_is_created(autojump_clock: MockClock) -> None:
    """``?autostart=1``: the session opens as the handshake ends; a FIN queued while the
    handshake's answer was being written is found before session.created is."""
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        stream, transport = await sim.listener.connect()
        raw = RawClient(stream)
        transport.hold()
        await raw.send_bytes(raw.ws.send(Request(host="sim", target="/v1/duplex?autostart=1")))
        await transport.wait_held()  # the 101 is held
        await disconnect(raw, transport, "fin")
        await settle()
        transport.release()
        await settle()
        assert isinstance(await raw.next_event(), AcceptConnection)
        (session_id,) = probe(sim).decided
        assert probe(sim).reasons(session_id) == ["session_created_undelivered"]
        assert sim.server.slots_held == 0
        assert [e["type"] for e in await raw.receive_until_closed()] == []
        start = trio.current_time()
        await sim.open_session()
        assert trio.current_time() == start


# -- while the write of session.created waits ---------------------------------------------


@pytest.mark.parametrize("how", ["fin", "close_frame"])
async def test_gone_while_created_is_being_written(
    autojump_clock: MockClock, raw_ws: RawWs, how: str
) -> None:
    """The write has not completed (held at the gate: its bytes are not handed over) when
    the client goes: the write is cut, and the session never opens. (A reset fails the
    held write itself: test_races.test_03_..._then_the_send_fails.)"""
    async with running_server(ServerConfig(max_sessions=1)) as sim:
        raw = await raw_ws(sim)
        transport = sim.listener.streams[-1]
        transport.hold()
        await raw.send(UPDATE)
        await transport.wait_held()  # session.created is being written
        session = only_session(sim)
        await disconnect(raw, transport, how)
        await settle()
        assert sim.server.slots_held == 0  # with the write still held
        transport.release()
        await assert_freed_at_once(sim, raw, session)
        assert transport.sends_completed == 1  # the 101 only


# -- after the write: the client may hold the token ---------------------------------------


@pytest.mark.parametrize("how", DISCONNECTS)
async def test_gone_after_created_was_written_is_resumable(
    autojump_clock: MockClock, raw_ws: RawWs, how: str
) -> None:
    """The boundary of the rule: once the write has completed the client may have read
    the token, so the session detaches and can be resumed, for the unconfirmed grace.
    (A guard against freeing too much: unchanged since 2724841.)"""
    config = ServerConfig(max_sessions=1)
    async with running_server(config) as sim:
        raw = await raw_ws(sim)
        await raw.send(UPDATE)
        created = await raw.receive()
        assert created["type"] == "session.created"
        session = only_session(sim)
        await disconnect(raw, sim.listener.streams[-1], how)
        await settle()
        assert session.state is State.DETACHED
        assert session.grace_deadline == trio.current_time() + config.unconfirmed_grace_s
        client, answer = await sim.resume(created["session_id"], created["resume_token"])
        assert answer["type"] == "session.resumed"
        await client.send({"type": "session.close"})
        assert (await client.receive_until_closed())[-1]["type"] == "session.closed"


@pytest.mark.parametrize("how", ["fin", "close_frame"])
async def test_gone_the_moment_created_is_in_is_resumable(
    autojump_clock: MockClock, raw_ws: RawWs, how: str
) -> None:
    """The client reads session.created and leaves at once, before the server's task
    runs on from its write (a client is another process: it does not wait for that).
    That end came after the delivery: the session is resumable with the token the
    client holds. (Real sockets showed it: a client that read session.created and
    dropped was told session_resume_expired on its resume, about one run in two of
    tests/cluster/test_relay.py's api-key test, when the server looked at the socket
    once more after its write.)"""
    config = ServerConfig(max_sessions=1)
    async with running_server(config) as sim:
        raw = await raw_ws(sim)
        transport = sim.listener.streams[-1]
        assert transport.inbound is not None
        inbound = transport.inbound
        transport.after_send = (
            transport.end_reads
            if how == "fin"
            else lambda: inbound.put(raw.ws.send(CloseConnection(code=1000)))
        )
        await raw.send(UPDATE)
        created = await raw.receive()
        assert created["type"] == "session.created"
        await settle()
        session = only_session(sim)
        assert session.state is State.DETACHED, probe(sim).reasons(session.id)
        assert sim.server.slots_held == 1
        assert session.grace_deadline == trio.current_time() + config.unconfirmed_grace_s
        client, answer = await sim.resume(created["session_id"], created["resume_token"])
        assert answer["type"] == "session.resumed"
        await client.send({"type": "session.close"})
        assert (await client.receive_until_closed())[-1]["type"] == "session.closed"


# -- what the opening read must not disturb ----------------------------------------------


async def test_a_ping_while_the_engine_prepares_is_answered_then(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    async with running_server(ServerConfig(max_sessions=1), Gated) as sim:
        raw = await raw_ws(sim)
        await raw.send(UPDATE)
        await settle()
        await raw.send_bytes(raw.ws.send(Ping(payload=b"still here")))
        pong = await raw.next_event()  # while the prepare still waits
        assert isinstance(pong, Pong) and pong.payload == b"still here"
        assert Gated.instances[0].preparing and not Gated.instances[0].prepare_cancelled
        await disconnect(raw, sim.listener.streams[-1], "close_frame")
        await settle()
        assert sim.server.slots_held == 0


class Slow(EchoEngine):
    async def prepare(self, nursery: trio.Nursery) -> None:
        await trio.sleep(1)


async def test_input_sent_while_the_engine_prepares_is_kept_in_order(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    """What arrives while the session opens is kept for it, whatever its size (the
    session's own bound applies, not the first message's). (A guard for the reading
    during the open.)"""
    async with running_server(ServerConfig(max_sessions=1), Slow) as sim:
        raw = await raw_ws(sim)
        big = "x" * (sim.server.config.first_message_bytes + 1)
        await raw.send(UPDATE)
        await settle()
        for text in ("one", big, "three"):
            await raw.send({"type": "input.text.append", "text": text})
        await settle()
        assert sim.server.slots_held == 1
        created = await raw.receive()
        assert created["type"] == "session.created"
        echoed = [(await raw.receive())["text"] for _ in range(3)]
        assert echoed == ["one", big, "three"]


async def test_reading_during_the_open_is_bounded(autojump_clock: MockClock, raw_ws: RawWs) -> None:
    """A client that floods while its engine prepares: reading pauses once about
    ``OPENING_READ_AHEAD`` characters of messages wait; the rest stays in the transport."""
    async with running_server(ServerConfig(max_sessions=1), Gated) as sim:
        raw = await raw_ws(sim)
        transport = sim.listener.streams[-1]
        await raw.send(UPDATE)
        await settle()
        event = {"type": "input.text.append", "text": "x" * 1000}
        sent = 0
        while sent < 4 * OPENING_READ_AHEAD:
            frame = raw.frame(json.dumps(event))
            await raw.send_bytes(frame)
            sent += len(frame)
        await settle()
        assert transport.inbound is not None
        read = sent - transport.inbound.pending
        assert OPENING_READ_AHEAD <= read <= OPENING_READ_AHEAD + RECEIVE_SIZE
        await trio.sleep(PREPARE_TIMEOUT_S)  # then the open is refused, and all is freed
        await settle()
        assert sim.server.slots_held == 0


async def test_a_message_the_opening_read_takes_as_it_stops_is_not_left_behind(
    autojump_clock: MockClock,
) -> None:
    """The opening read is told to stop just as its wait for data has been woken: it
    still takes that data, and the session's reader, waiting for it to finish, must look
    at what it took before reading on (else the message waits for the next one)."""
    _, transport = await MemoryListener.create().connect()
    assert transport.inbound is not None
    ws = WebSocket(transport, max_message_bytes=1024)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            ws.start_watching()
            nursery.start_soon(ws.watch, lambda: None)
            await wait_all_tasks_blocked()  # the watch waits for data
            transport.inbound.put(_frame(0x1, b"hello"))  # wakes it (it has not run yet)
            ws.stop_watching()
            assert await ws.get_message() == "hello"


# -- over real sockets -------------------------------------------------------------------

HOLDING = "tests.server.holding_engine:Holding"


def _upgrade(port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /v1/duplex HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (payloads under 64 KiB)."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + struct.pack("!H", size)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode]) + length + mask + masked


def _text(event: dict[str, Any]) -> bytes:
    return _frame(0x1, json.dumps(event).encode())


CLOSE = _frame(0x8, struct.pack("!H", 1000))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it ends the connection (a reset counts)."""
    received = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not data:
            return received
        received += data


def _second_client_is_admitted(url: str) -> None:
    with connect(url, open_timeout=10) as ws:
        ws.send(json.dumps(UPDATE))
        first = json.loads(ws.recv(timeout=10))
        assert first["type"] == "session.created", first


def _go(sock: socket.socket, how: str) -> None:
    if how == "fin":
        sock.shutdown(socket.SHUT_WR)
    elif how == "close_frame":
        sock.sendall(CLOSE)
    else:  # a reset: close at once, discarding what is unsent
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def test_a_fin_right_after_the_first_message_frees_the_slot(serve: Serve) -> None:
    """The review's case: upgrade and first message in one write, then the FIN at once.
    The server reads the message and, before writing session.created, finds the FIN."""
    server = serve("--max-sessions", "1", "--unconfirmed-grace", "60")
    port = _port(server.url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
        # Corked, the bytes wait for the FIN and leave with it in one segment: the
        # server cannot read the message before the FIN has arrived.
        first.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        first.sendall(_upgrade(port) + _text(UPDATE))
        first.shutdown(socket.SHUT_WR)
        answer = _read_to_end(first)
    assert answer.startswith(b"HTTP/1.1 101 ")
    assert b"session.created" not in answer
    _second_client_is_admitted(server.url)  # at once: no waiting for any grace


def test_a_close_frame_with_the_first_message_frees_the_slot(serve: Serve) -> None:
    """Upgrade, first message and close frame in one write. (A guard: the close frame is
    read with the upgrade, so the server knows before it admits anything; 2724841 kept
    this one right already.)"""
    server = serve("--max-sessions", "1", "--unconfirmed-grace", "60")
    port = _port(server.url)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
        first.sendall(_upgrade(port) + _text(UPDATE) + CLOSE)
        answer = _read_to_end(first)
    assert answer.startswith(b"HTTP/1.1 101 ")
    assert b"session.created" not in answer
    _second_client_is_admitted(server.url)


@pytest.mark.parametrize("how", DISCONNECTS)
def test_gone_while_the_upstream_connects_frees_the_slot_at_once(serve: Serve, how: str) -> None:
    """An engine whose prepare waits on a connection the test holds (an upstream that
    does not answer): the client goes meanwhile, and the prepare is cancelled at once."""
    server = serve("--max-sessions", "1", "--unconfirmed-grace", "60", "--engine", HOLDING)
    port = _port(server.url)
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        upstream.settimeout(10)
        hold = {"type": "session.update", "session": {"hold_port": upstream.getsockname()[1]}}
        first = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            first.sendall(_upgrade(port) + _text(hold))
            held, _ = upstream.accept()  # the prepare has begun: the slot is held
            with held:
                held.settimeout(10)
                _go(first, how)
                assert held.recv(1) == b""  # the prepare was cancelled: its connection closed
        finally:
            first.close()
    _second_client_is_admitted(server.url)
