"""The pooled relay (cluster/pool/), in memory: a front's peer connection to a home
that is a whole simulated server (its real session code), many relayed client
connections on it, flow control, and what a broken or silent peer connection does.

Everything runs on trio's MockClock (autojump): nothing sleeps, nothing is timed.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from trio_duplex.cluster.pool import (
    MAX_FRAME,
    SLACK,
    WINDOW,
    BadFrame,
    Home,
    Link,
    Pool,
    ServerFrames,
    client_frame,
    relay,
)
from trio_duplex.cluster.relay import RelayKeys
from trio_duplex.core.frames import Opcode, binary_frame, close_frame, text_frame
from trio_duplex.core.opening import Grant
from trio_duplex.dialects import Dialect
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.server.sessions.websocket import ConnectionClosed, WebSocket
from trio_duplex.testing.simulation import Simulation, running_server

from .conftest import SECRET

KEYS = RelayKeys.derive(SECRET)
URL = "ws://home.invalid:1/v1/duplex"
Event = dict[str, Any]


def text(seq: int, words: str) -> Event:
    return {"type": "input.text.append", "client_event_seq": seq, "text": words}


def resume(created: Event, last: int) -> Event:
    return {
        "type": "session.resume",
        "session_id": created["session_id"],
        "resume_token": created["resume_token"],
        "last_received_server_event_seq": last,
    }


@attrs.define(eq=False)
class Peer:
    """The pool, its one peer connection, and the home's side of it."""

    pool: Pool
    link: Link
    home: Home
    home_stream: trio.abc.Stream
    home_scope: trio.CancelScope


@asynccontextmanager
async def pooled(sim: Simulation) -> AsyncIterator[Peer]:
    """A pool whose one peer connection (in memory) reaches ``sim``'s session code."""
    front_stream, home_stream = trio.testing.memory_stream_pair()
    home = Home(sim.server.opener.serve, 1 << 16, 5.0)
    link = Link(front_stream, "home", 5.0, front=True)
    pool = Pool("front", KEYS, 5.0, 5.0)
    pool.links[("home", URL)] = [link]
    async with trio.open_nursery() as nursery:
        home_scope = trio.CancelScope()

        async def serve_home() -> None:
            with home_scope:
                await home.accept(home_stream, "front")

        nursery.start_soon(serve_home)
        nursery.start_soon(link.run)
        yield Peer(pool, link, home, home_stream, home_scope)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def scene() -> AsyncIterator[tuple[Simulation, Peer, trio.Nursery]]:
    """A home (its whole session code, bounded in clock time), the pool, a nursery."""
    async with running_server(fail_after_s=120) as sim, pooled(sim) as peer:
        async with trio.open_nursery() as nursery:
            yield sim, peer, nursery


@attrs.define(eq=False)
class Client:
    """A client of the front, speaking raw frames on its end of the connection."""

    stream: trio.abc.Stream
    frames: ServerFrames = attrs.field(factory=ServerFrames)
    items: deque[tuple[int, bytes]] = attrs.field(factory=deque)
    relayed: list[bool] = attrs.field(factory=list)
    """What ``relay`` returned."""
    done: trio.Event = attrs.field(factory=trio.Event)

    async def send(self, event: Event) -> None:
        await self.stream.send_all(client_frame(Opcode.TEXT, json.dumps(event).encode()))

    async def item(self) -> tuple[int, bytes]:
        while not self.items:
            data = await self.stream.receive_some(65536)
            if not data:
                return (Opcode.CLOSE, b"")
            self.items.extend(self.frames.feed(bytes(data)))
        return self.items.popleft()

    async def event(self) -> Event:
        opcode, payload = await self.item()
        assert opcode == Opcode.TEXT, (opcode, payload)
        event: Event = json.loads(payload)
        return event

    async def close_code(self) -> int | None:
        """Read to the front's close: its code (None: the connection ended without)."""
        while True:
            opcode, payload = await self.item()
            if opcode == Opcode.CLOSE:
                return int.from_bytes(payload[:2], "big") if payload else None


async def _front(
    pool: Pool, stream: trio.abc.Stream, first: Event, session_id: str, client: Client
) -> None:
    """What the front node does with a client's resume (placement.py, less the store)."""
    ws = WebSocket(stream, 1 << 20)
    try:
        async with Connection.open(ws, 8, close_timeout=1.0, max_output_bytes=4 << 20) as conn:
            relayed = await relay(
                pool, conn, json.dumps(first), home="home", url=URL, session_id=session_id
            )
            client.relayed.append(relayed)
            if not relayed:
                conn.finish(['{"type":"error","code":"unreachable"}'], 1013)
            await conn.send_rest()
    except ConnectionClosed:
        pass
    finally:
        client.done.set()


async def relayed_client(
    nursery: trio.Nursery,
    pool: Pool,
    first: Event,
    *,
    session_id: str | None = None,
    lockstep: bool = False,
) -> Client:
    """A client whose ``first`` message (a resume) the front relays over ``pool``."""
    pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    client_end, server_end = pair()
    client = Client(client_end)
    sid = first["session_id"] if session_id is None else session_id
    nursery.start_soon(_front, pool, server_end, first, sid, client)
    return client


async def opened(sim: Simulation, count: int = 0) -> tuple[Event, list[int]]:
    """A session opened on the home directly, ``count`` echoes received (never acked),
    then its client gone (the session detached): its ``session.created``, and the
    server_event_seq of each echo."""
    client, created = await sim.open_session()
    seqs = []
    for n in range(1, count + 1):
        await client.send(text(n, f"word {n}"))
        seqs.append((await client.receive())["server_event_seq"])
    await client.ws.aclose()
    await trio.testing.wait_all_tasks_blocked()
    return created, seqs


async def test_a_resume_relayed_over_the_pool_replays_and_goes_on_exactly_once(
    autojump_clock: MockClock,
) -> None:
    async with scene() as (sim, peer, nursery):
        created, seqs = await opened(sim, 3)
        client = await relayed_client(nursery, peer.pool, resume(created, seqs[0]))
        resumed = await client.event()
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["last_received_client_event_seq"] == 3
        replayed = [(await client.event())["server_event_seq"] for _ in seqs[1:]]
        assert replayed == seqs[1:]  # what the client lacked, once, in order
        # A resend of what the session already has is not taken again; new input is.
        await client.send(text(3, "word 3"))
        await client.send(text(4, "word 4"))
        echo = await client.event()
        assert echo["server_event_seq"] == seqs[-1] + 1 and echo["text"] == "word 4", echo
        # The client goes; the session detaches at home and resumes directly there.
        await client.stream.aclose()
        await client.done.wait()
        await trio.testing.wait_all_tasks_blocked()
        token = resumed["resume_token"]
        direct, answer = await sim.resume(created["session_id"], token, seqs[0])
        assert answer["type"] == "session.resumed", answer
        assert answer["last_received_client_event_seq"] == 4
        again = [(await direct.receive())["server_event_seq"] for _ in range(3)]
        assert again == [*seqs[1:], seqs[-1] + 1]
        assert client.relayed == [True]


async def test_many_sessions_are_relayed_over_one_peer_connection(
    autojump_clock: MockClock,
) -> None:
    async with scene() as (sim, peer, nursery):
        sessions = [(await opened(sim))[0] for _ in range(40)]
        clients = [await relayed_client(nursery, peer.pool, resume(c, 0)) for c in sessions]
        for client in clients:
            assert (await client.event())["type"] == "session.resumed"
        await trio.testing.wait_all_tasks_blocked()
        assert len(peer.link.channels) == 40
        assert len(peer.home.links) == 1 and len(next(iter(peer.home.links)).channels) == 40
        for n, client in enumerate(clients):
            await client.send(text(1, f"session {n}"))
        for n, (client, created) in enumerate(zip(clients, sessions, strict=True)):
            echo = await client.event()
            assert echo["text"] == f"session {n}", echo  # each its own, none crossed
            attached = sim.session(created["session_id"])
            assert attached is not None and attached.generation == 2
        for client in clients:
            await client.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert not peer.link.channels  # each channel gone with its client
        assert peer.pool.links == {("home", URL): [peer.link]}  # and still just the one


async def test_a_client_that_does_not_read_holds_only_its_own_channel(
    autojump_clock: MockClock,
) -> None:
    async with scene() as (sim, peer, nursery):
        (slow_session, _), (fast_session, _) = await opened(sim), await opened(sim)
        slow = await relayed_client(nursery, peer.pool, resume(slow_session, 0), lockstep=True)
        assert (await slow.event())["type"] == "session.resumed"  # (its channel: the first)
        fast = await relayed_client(nursery, peer.pool, resume(fast_session, 0))
        assert (await fast.event())["type"] == "session.resumed"
        # The slow client asks for 1.2 MB of echoes (many windows) and reads none of it.
        words, count = "x" * 60_000, 20

        async def ask() -> None:
            for n in range(1, count + 1):
                await slow.send(text(n, words))

        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        slow_channel, fast_channel = sorted(peer.link.channels.values(), key=lambda c: c.id)
        # Its channel's window is used up, and nothing more than that crossed over.
        assert -SLACK <= slow_channel.window <= 0
        # The other client goes on meanwhile, round trip after round trip.
        for n in range(1, 21):
            await fast.send(text(n, f"fast {n}"))
            assert (await fast.event())["text"] == f"fast {n}"
        assert fast_channel.window > WINDOW // 2
        assert -SLACK <= slow_channel.window <= 0  # (still held)
        # Once the slow client reads, it gets every echo, once, in order.
        got: list[tuple[int, int]] = []
        while len(got) < count:
            event = await slow.event()
            got.append((event["server_event_seq"], len(event["text"])))
        first = got[0][0]
        assert got == [(first + n, len(words)) for n in range(count)]
        await slow.stream.aclose()
        await fast.stream.aclose()


async def test_a_lost_peer_connection_ends_every_relayed_connection(
    autojump_clock: MockClock,
) -> None:
    async with scene() as (sim, peer, nursery):
        sessions = [(await opened(sim))[0] for _ in range(3)]
        clients = [await relayed_client(nursery, peer.pool, resume(c, 0)) for c in sessions]
        tokens = []
        for client in clients:
            resumed = await client.event()
            assert resumed["type"] == "session.resumed"
            tokens.append(resumed["resume_token"])
            await client.send(text(1, "before"))
            assert (await client.event())["text"] == "before"
        peer.home_scope.cancel()  # the home's end of the peer connection is gone
        for client in clients:
            assert await client.close_code() == 1001  # as when a home dies: resume again
            await client.done.wait()
        assert peer.link.broken and not peer.link.channels
        # Each session detached at home: its client resumes it there, nothing lost.
        await trio.testing.wait_all_tasks_blocked()
        for created, token in zip(sessions, tokens, strict=True):
            direct, answer = await sim.resume(created["session_id"], token, 0)
            assert answer["type"] == "session.resumed"
            assert answer["last_received_client_event_seq"] == 1
            assert (await direct.receive())["text"] == "before"


async def test_a_peer_that_answers_nothing_is_cut_by_its_deadline(
    autojump_clock: MockClock,
) -> None:
    front_stream, silent = trio.testing.memory_stream_pair()
    link = Link(front_stream, "home", 5.0, front=True)
    pool = Pool("front", KEYS, 5.0, 5.0)
    pool.links[("home", URL)] = [link]
    heard = bytearray()

    async def read_only() -> None:  # takes every byte, answers none, never closes
        while data := await silent.receive_some(65536):
            heard.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_only)
        nursery.start_soon(link.run)
        first = {"type": "session.resume", "session_id": "sess_1", "resume_token": "rt_x"}
        client = await relayed_client(nursery, pool, {**first, "last_received_server_event_seq": 0})
        await client.done.wait()
        assert client.relayed == [False]  # nothing came back: the client hears unreachable
        assert (await client.event())["code"] == "unreachable"
        assert link.broken
        assert b"sess_1 native" in heard  # the channel was opened (and the link pinged)
        nursery.cancel_scope.cancel()


async def test_a_channel_resumes_only_the_session_it_names(autojump_clock: MockClock) -> None:
    async with scene() as (sim, peer, nursery):
        (victim, _), (other, _) = await opened(sim), await opened(sim)
        client = await relayed_client(
            nursery, peer.pool, resume(victim, 0), session_id=other["session_id"]
        )
        refused = await client.event()
        assert refused["type"] == "error" and refused["code"] == "unauthorized", refused
        assert await client.close_code() == 1008
        session = sim.session(victim["session_id"])
        assert session is not None and session.generation == 1  # never attached again


async def test_a_peer_that_sends_past_a_window_is_cut(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    served: list[Grant] = []

    async def serve(
        ws: WebSocket, query: dict[str, list[str]], grant: Grant, dialect: Dialect, b: str | None
    ) -> None:
        served.append(grant)
        await trio.sleep_forever()  # reads nothing: the window is never given back

    caplog.set_level(logging.INFO, "trio_duplex")
    front, home_stream = trio.testing.memory_stream_pair()
    home = Home(serve, 1 << 16, 5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(home.accept, home_stream, "front")
        await front.send_all(_frame(1, 1, b"sess_1 native"))
        for _ in range(WINDOW // MAX_FRAME):
            await front.send_all(_frame(2, 1, b"\x00" * MAX_FRAME))
        await trio.testing.wait_all_tasks_blocked()
        assert len(home.links) == 1 and served == [Grant(None, resume_of="sess_1", relayed=True)]
        (link,) = home.links
        await front.send_all(_frame(2, 1, b"\x00" * (SLACK + 1)))  # past the window
        await trio.testing.wait_all_tasks_blocked()
        assert link.broken and not link.channels
        assert "data past its window" in caplog.text
        nursery.cancel_scope.cancel()


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return bytes([kind]) + channel.to_bytes(4, "big") + len(payload).to_bytes(4, "big") + payload


def test_server_frames_are_parsed_whole_across_any_split() -> None:
    stream = (
        text_frame("héllo")
        + binary_frame(b"\x00" * 70_000)
        + control_frame_of(Opcode.PING, b"p")
        + b"\x01\x02ab"  # a text message in two fragments
        + b"\x80\x01c"
        + close_frame(1001)
    )
    for size in (1, 2, 3, 7, 1000, len(stream)):
        parser = ServerFrames()
        items: list[tuple[int, bytes]] = []
        for start in range(0, len(stream), size):
            items += parser.feed(stream[start : start + size])
        assert items == [
            (Opcode.TEXT, "héllo".encode()),
            (Opcode.BINARY, b"\x00" * 70_000),
            (Opcode.PING, b"p"),
            (Opcode.TEXT, b"abc"),
            (Opcode.CLOSE, (1001).to_bytes(2, "big")),
        ], size


def control_frame_of(opcode: int, payload: bytes) -> bytes:
    return bytes((0x80 | opcode, len(payload))) + payload


@pytest.mark.parametrize(
    "frames",
    [
        client_frame(Opcode.TEXT, b"masked"),  # a client's frame, not a server's
        b"\xc1\x01a",  # a reserved bit
        b"\x00\x01a",  # a continuation of nothing
        b"\x01\x01a\x01\x01b",  # a new message before the last ended
        b"\x82\x7f" + (1 << 40).to_bytes(8, "big"),  # over the bound, from its header
    ],
)
def test_what_is_not_a_server_s_framing_is_refused(frames: bytes) -> None:
    with pytest.raises(BadFrame):
        ServerFrames().feed(frames)


# -- the front passes the home's frames on as they came (ServerFrames.scan) -------------


def test_server_frames_are_passed_on_whole_and_verbatim_across_any_split() -> None:
    messages = [
        text_frame("héllo"),
        binary_frame(b"\x00" * 70_000),
        b"\x01\x02ab",  # a text message in two fragments
        b"\x80\x01c",
        text_frame("after"),
    ]
    ping = control_frame_of(Opcode.PING, b"p")
    stream = messages[0] + messages[1] + ping + b"".join(messages[2:]) + close_frame(1001)
    stream += text_frame("past the close")
    for size in (1, 2, 3, 7, 1000, len(stream)):
        scanner = ServerFrames()
        passed, count, controls = b"", 0, []
        for start in range(0, len(stream), size):
            out, n, more = scanner.scan(stream[start : start + size])
            passed += out
            count += n
            controls += more
            # Never part of a frame: what was passed on so far is whole frames.
            assert any(passed == b"".join(messages[:k]) for k in range(6)), size
        assert passed == b"".join(messages) and count == len(messages), size
        assert controls == [(Opcode.PING, b"p"), (Opcode.CLOSE, (1001).to_bytes(2, "big"))]


@pytest.mark.parametrize(
    "frames",
    [
        client_frame(Opcode.TEXT, b"masked"),  # a client's frame, not a server's
        b"\xc1\x01a",  # a reserved bit
        b"\x83\x01a",  # an unknown opcode
        b"\x8b\x00",  # an unknown control opcode
        b"\x09\x01p",  # a fragmented control frame
        b"\x89\x7e\x00\x7e" + b"p" * 126,  # a control frame over 125 bytes
        b"\x00\x01a",  # a continuation of nothing
        b"\x01\x01a\x01\x01b",  # a new message before the last ended
        b"\x82\x7f" + (1 << 40).to_bytes(8, "big"),  # over the bound, from its header
        b"\x81\x02\xc3\x28",  # text that is not UTF-8
        b"\x01\x01\xc3\x80\x01\x28",  # nor across its fragments
    ],
)
def test_a_scan_refuses_what_is_not_a_server_s_framing(frames: bytes) -> None:
    with pytest.raises(BadFrame):
        ServerFrames().scan(frames)


def test_a_scan_bounds_a_fragmented_message() -> None:
    scanner = ServerFrames(limit=10)
    scanner.scan(b"\x02\x06" + b"x" * 6)
    with pytest.raises(BadFrame):
        scanner.scan(b"\x00\x05" + b"x" * 5)


@attrs.define(eq=False)
class ScriptedHome:
    """The home's end of a front's peer connection, spoken by the test: it reads the
    front's pool frames and writes its own."""

    stream: trio.abc.Stream
    held: bytes = b""

    async def frame(self) -> tuple[int, int, bytes]:
        while True:
            if len(self.held) >= 9:
                kind, cid, length = (
                    self.held[0],
                    int.from_bytes(self.held[1:5], "big"),
                    int.from_bytes(self.held[5:9], "big"),
                )
                if len(self.held) >= 9 + length:
                    payload = self.held[9 : 9 + length]
                    self.held = self.held[9 + length :]
                    return kind, cid, payload
            data = await self.stream.receive_some(65536)
            assert data, "the front closed the peer connection"
            self.held += data

    async def data(self, cid: int, payload: bytes) -> None:
        await self.stream.send_all(_frame(2, cid, payload))


@asynccontextmanager
async def scripted(
    lockstep: bool = False,
) -> AsyncIterator[tuple[ScriptedHome, Client, Link, trio.Nursery]]:
    """A front's pool whose one peer connection the test speaks as the home, and one
    relayed client on it, whose OPEN and first message the home has read."""
    front_stream, home_stream = trio.testing.memory_stream_pair()
    link = Link(front_stream, "home", 5.0, front=True)
    pool = Pool("front", KEYS, 5.0, 5.0)
    pool.links[("home", URL)] = [link]
    home = ScriptedHome(home_stream)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        first = {"type": "session.resume", "session_id": "sess_1", "resume_token": "rt_x"}
        first["last_received_server_event_seq"] = 0  # type: ignore[assignment]
        client = await relayed_client(nursery, pool, first, lockstep=lockstep)
        assert await home.frame() == (1, 1, b"sess_1 native")
        kind, cid, payload = await home.frame()
        assert (kind, cid) == (2, 1) and b"session.resume" in payload
        yield home, client, link, nursery
        nursery.cancel_scope.cancel()


async def _collect(stream: trio.abc.Stream, into: bytearray) -> None:
    while data := await stream.receive_some(65536):
        into.extend(data)


async def test_the_home_s_frames_reach_the_client_verbatim_never_in_part(
    autojump_clock: MockClock,
) -> None:
    async with scripted() as (home, client, _, nursery):
        got = bytearray()
        nursery.start_soon(_collect, client.stream, got)
        frames = [text_frame('{"type":"session.resumed"}'), binary_frame(b"\x01" * 1000)]
        stream = b"".join(frames)
        await home.data(1, stream[:10])  # part of the first frame: held back
        await trio.testing.wait_all_tasks_blocked()
        assert got == b""
        await home.data(1, stream[10:40])  # the first whole, part of the second
        await trio.testing.wait_all_tasks_blocked()
        assert got == frames[0]
        await home.data(1, stream[40:])
        await trio.testing.wait_all_tasks_blocked()
        assert got == stream  # as the home wrote them, byte for byte


async def test_a_bad_frame_from_the_home_cuts_the_relay(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_duplex")
    async with scripted() as (home, client, link, _):
        await home.data(1, text_frame('{"type":"session.resumed"}'))
        assert (await client.event())["type"] == "session.resumed"
        await home.data(1, text_frame("fine") + client_frame(Opcode.TEXT, b"masked"))
        assert await home.frame() == (5, 1, b"")  # RESET: the front abandons the channel
        assert await client.close_code() == 1001  # after nothing of the bad read
        await client.done.wait()
        assert client.relayed == [True] and not link.channels and not link.broken
        assert "sent a bad frame" in caplog.text


async def test_the_home_s_close_ends_the_relay_with_its_code(autojump_clock: MockClock) -> None:
    async with scripted() as (home, client, _, _):
        ping = control_frame_of(Opcode.PING, b"hi")
        last = text_frame('{"type":"error","code":"x"}')
        await home.data(1, ping + last + close_frame(4001) + text_frame("past the close"))
        assert await home.frame() == (2, 1, client_frame(Opcode.PONG, b"hi"))  # answered
        assert await home.frame() == (2, 1, client_frame(Opcode.CLOSE, (4001).to_bytes(2, "big")))
        assert await home.frame() == (4, 1, b"")  # then EOF
        assert (await client.event())["code"] == "x"
        assert await client.close_code() == 4001  # and nothing past the close
        assert not client.items
        await client.done.wait()


async def test_the_home_s_close_and_its_end_in_one_read_end_the_relay_with_its_code(
    autojump_clock: MockClock,
) -> None:
    """The home's close frame and its channel's EOF arrive in one read of the peer
    connection (as they do when the home closes at once): the close is handed on
    before the end, so the client gets the home's code, not 1001."""
    async with scripted() as (home, client, _, _):
        last = text_frame('{"type":"error","code":"invalid_utf8"}')
        await home.stream.send_all(_frame(2, 1, last + close_frame(1007)) + _frame(4, 1, b""))
        assert (await client.event())["code"] == "invalid_utf8"
        assert await client.close_code() == 1007
        await client.done.wait()


async def test_a_slow_client_holds_the_home_s_credit_until_it_reads(
    autojump_clock: MockClock,
) -> None:
    async with scripted(lockstep=True) as (home, client, link, _):
        (channel,) = link.channels.values()
        frame = text_frame('{"type":"x"}')
        batch = frame * 100  # one DATA frame: 100 frames, over the client's high water (8)
        sent = 0
        while sent + len(batch) <= WINDOW:
            await home.data(1, batch)
            sent += len(batch)
        await trio.testing.wait_all_tasks_blocked()
        # The client reads nothing: no credit comes back, the window stays used (what
        # the client's pump took before the outbox congested, one DATA's worth at most,
        # counts as consumed; the rest is held).
        assert channel.window == WINDOW - sent and channel.unreturned <= len(batch)
        assert not home.held
        # Once it reads, the held credit is given back.
        count = 0
        while count < sent // len(frame):
            await client.item()
            count += 1
        kind, cid, payload = await home.frame()
        assert (kind, cid) == (3, 1) and int.from_bytes(payload, "big") == sent


async def test_what_one_read_brings_for_a_client_goes_to_it_in_one_write(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushed: list[tuple[bytes, int]] = []
    push_frames = Connection.push_frames

    def spy(self: Connection, frames: bytes, count: int) -> None:
        pushed.append((frames, count))
        push_frames(self, frames, count)

    monkeypatch.setattr(Connection, "push_frames", spy)
    async with scripted() as (home, client, _, _):
        one, two, three = text_frame('{"n":1}'), text_frame('{"n":2}'), text_frame('{"n":3}')
        ping = control_frame_of(Opcode.PING, b"p")
        # Three DATA frames in one read, the middle one only a ping: one push of both.
        await home.stream.send_all(_frame(2, 1, one) + _frame(2, 1, ping) + _frame(2, 1, two))
        assert await home.frame() == (2, 1, client_frame(Opcode.PONG, b"p"))
        assert pushed == [(one + two, 2)]
        await home.data(1, three)  # the next read: a push of its own
        assert [(await client.event())["n"] for _ in range(3)] == [1, 2, 3]
        assert pushed == [(one + two, 2), (three, 1)]


# -- the client's frames go to the home as they came (WebSocket.get_frames) -----------


def masked(opcode: int, payload: bytes, key: bytes, *, fin: bool = True) -> bytes:
    """A client's frame masked with ``key`` (not zeros: its bytes are not the payload's)."""
    assert len(payload) < 126
    stream = (key * (len(payload) // 4 + 1))[: len(payload)]
    body = bytes(a ^ b for a, b in zip(payload, stream, strict=True))
    return bytes(((0x80 if fin else 0) | opcode, 0x80 | len(payload))) + key + body


@attrs.define(eq=False)
class ReadingFront:
    """A front that reads the client's resume itself, as placement.py does (so that
    its WebSocket may have read more than the resume), then relays it."""

    client: Client
    ws: WebSocket | None = None

    async def run(self, pool: Pool, stream: trio.abc.Stream) -> None:
        ws = self.ws = WebSocket(stream, 1 << 20)
        try:
            async with Connection.open(ws, 8, close_timeout=1.0, max_output_bytes=4 << 20) as conn:
                first = await ws.get_message()
                assert isinstance(first, str)
                relayed = await relay(pool, conn, first, home="home", url=URL, session_id="sess_1")
                self.client.relayed.append(relayed)
                await conn.send_rest()
        except ConnectionClosed:
            pass
        finally:
            self.client.done.set()


@asynccontextmanager
async def reading_front(
    sent_first: bytes,
) -> AsyncIterator[tuple[ScriptedHome, ReadingFront, Link, trio.Nursery]]:
    """A front (``ReadingFront``) on a peer connection the test speaks as the home; the
    client has sent ``sent_first`` (its resume, maybe more), and the home has read the
    channel's OPEN."""
    front_stream, home_stream = trio.testing.memory_stream_pair()
    link = Link(front_stream, "home", 5.0, front=True)
    pool = Pool("front", KEYS, 5.0, 5.0)
    pool.links[("home", URL)] = [link]
    home = ScriptedHome(home_stream)
    client_end, server_end = trio.testing.memory_stream_pair()
    front = ReadingFront(Client(client_end))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.run)
        await client_end.send_all(sent_first)
        nursery.start_soon(front.run, pool, server_end)
        assert await home.frame() == (1, 1, b"sess_1 native")
        yield home, front, link, nursery
        nursery.cancel_scope.cancel()


RESUME = '{"type":"session.resume","session_id":"sess_1","resume_token":"rt_x"}'
K1, K2, K3 = b"\x11\x22\x33\x44", b"\xa5\x5a\xa5\x5a", b"\x01\x80\x7f\xfe"


async def test_the_client_s_frames_go_to_the_home_as_they_came_once_none_is_held_in_part(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trio_duplex")
    second = masked(Opcode.TEXT, b'{"n":2}', K2)
    # The resume's read brought part of the next frame too: the front's parser holds it.
    async with reading_front(masked(Opcode.TEXT, RESUME.encode(), K1) + second[:5]) as (
        home,
        front,
        link,
        _,
    ):
        client = front.client
        assert await home.frame() == (2, 1, client_frame(Opcode.TEXT, RESUME.encode()))
        assert front.ws is not None and not front.ws.parsed_all
        # The rest of it: parsed as a message, and encoded again (with a key of zeros).
        await client.stream.send_all(second[5:])
        assert await home.frame() == (2, 1, client_frame(Opcode.TEXT, b'{"n":2}'))
        assert front.ws.parsed_all
        # From now on the client's frames go as they came: a fragmented message, with a
        # ping between its fragments (answered by the front, not passed on).
        fragments = [
            masked(Opcode.TEXT, b'{"n":', K3, fin=False),
            masked(Opcode.CONT, b"3", K1, fin=False),
            masked(Opcode.CONT, b"}", K2),
        ]
        ping = masked(Opcode.PING, b"are you there", K3)
        await client.stream.send_all(fragments[0] + ping + b"".join(fragments[1:]))
        assert await home.frame() == (2, 1, b"".join(fragments))  # byte for byte
        assert await client.item() == (Opcode.PONG, b"are you there")
        # The front's own ping is answered by the client's pong.
        ponged = trio.Event()

        async def ping_client() -> None:
            assert front.ws is not None
            await front.ws.ping()
            ponged.set()

        async with trio.open_nursery() as pinging:
            pinging.start_soon(ping_client)
            opcode, payload = await client.item()
            assert opcode == Opcode.PING
            await client.stream.send_all(masked(Opcode.PONG, payload, K2))
        assert ponged.is_set()
        # A frame by no client's rules: the client gets what the front's WebSocket
        # gives for it (1002, its reason), the fault is logged once, at INFO, and the
        # home gets a close, as from a client that closed.
        await client.stream.send_all(masked(Opcode.BINARY, b"ok", K1) + text_frame("unmasked"))
        assert await home.frame() == (2, 1, masked(Opcode.BINARY, b"ok", K1))
        assert await home.frame() == (2, 1, client_frame(Opcode.CLOSE, (1002).to_bytes(2, "big")))
        assert await home.frame() == (4, 1, b"")
        opcode, payload = await client.item()
        assert (
            opcode == Opcode.CLOSE
            and payload == close_frame(1002, "a client's frames must be masked")[2:]
        )
        await client.done.wait()
        assert client.relayed == [True] and not link.channels and not link.broken
        faults = [r for r in caplog.records if "client fault" in r.getMessage()]
        assert len(faults) == 1 and faults[0].exc_info is None
        assert "close 1002: a client's frames must be masked" in faults[0].getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert "rt_x" not in caplog.text  # the resume travelled in frames never logged


async def test_a_client_s_close_after_the_switch_is_echoed_and_ends_the_relay(
    autojump_clock: MockClock,
) -> None:
    async with reading_front(masked(Opcode.TEXT, RESUME.encode(), K1)) as (home, front, _, _):
        client = front.client
        assert await home.frame() == (2, 1, client_frame(Opcode.TEXT, RESUME.encode()))
        last = masked(Opcode.TEXT, b'{"n":2}', K2)
        bye = masked(Opcode.CLOSE, (4000).to_bytes(2, "big") + b"bye", K3)
        await client.stream.send_all(last + bye + masked(Opcode.TEXT, b"past the close", K1))
        assert await home.frame() == (2, 1, last)  # what came before the close, as it came
        assert await home.frame() == (2, 1, client_frame(Opcode.CLOSE, (4000).to_bytes(2, "big")))
        assert await home.frame() == (4, 1, b"")
        assert await client.item() == (Opcode.CLOSE, (4000).to_bytes(2, "big"))  # echoed
        await client.done.wait()
        assert front.ws is not None and front.ws.parsed_all


async def test_the_closing_handshake_after_the_switch_reads_frames_as_the_scan_left_them(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The home closes while the front holds part of a client's frame (and a fragmented
    # message is under way): the front's closing handshake reads on from there, not as
    # if a frame began where the scan stopped (no fault, the client's close awaited).
    caplog.set_level(logging.INFO, "trio_duplex")
    async with reading_front(masked(Opcode.TEXT, RESUME.encode(), K1)) as (home, front, _, _):
        client = front.client
        assert await home.frame() == (2, 1, client_frame(Opcode.TEXT, RESUME.encode()))
        start = masked(Opcode.TEXT, b'{"n":', K2, fin=False)
        rest = masked(Opcode.CONT, b"2}", K3)
        await client.stream.send_all(start + rest[:3])
        assert await home.frame() == (2, 1, start)
        await home.data(1, close_frame(4000))
        assert await client.item() == (Opcode.CLOSE, (4000).to_bytes(2, "big"))
        await client.stream.send_all(rest[3:] + masked(Opcode.PING, b"p", K1))
        await client.stream.send_all(masked(Opcode.CLOSE, (4000).to_bytes(2, "big"), K2))
        await client.done.wait()
        assert await client.item() == (Opcode.CLOSE, b"")  # then the end: no pong
        assert front.ws is not None and front.ws.state.value == "closed"
        assert "client fault" not in caplog.text
