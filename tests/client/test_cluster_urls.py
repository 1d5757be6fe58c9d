"""``connect`` with several URLs (docs/client.md): the nodes of a cluster, each a scripted
WebSocket server in memory (``test_session_scripted.scripted_server``), virtual time.

Which URL each attempt uses (``trio_duplex/client/urls.py``), a migration announced by
``session.going_away {migrating: true}`` (resumed at once on the next node, exactly once
and in order), a draining node's refusal, ``node_lost``, and the URL list's checks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import random
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import cast

import attrs
import pytest
import trio
from trio_websocket import WebSocketConnection

from trio_duplex.client import (
    ClientOptions,
    ConnectionChange,
    HeartbeatPolicy,
    ReconnectFailed,
    ReconnectPolicy,
    ResumeRefused,
    Retrying,
    connect,
)
from trio_duplex.client.urls import UrlRing, parse_urls

from .helpers import FAST, Event, created, out, resumed, rng_starting_at, text
from .scripted import Script, StreamOpener, receive_json, scripted_server, send_json

A, B, C = "ws://node-a/v1/duplex", "ws://node-b/v1/duplex", "ws://node-c/v1/duplex"
SLOW_BACKOFF = ClientOptions(
    reconnect=ReconnectPolicy(initial_delay=1.0, jitter=0.0, max_attempts=20, deadline=60),
    heartbeat=HeartbeatPolicy(interval=5, timeout=2),
)
"""A backoff of a whole second, not jittered: an attempt made at once stands out."""
CLOSED = {"type": "session.closed", "session_id": "s1", "reason": "engine_finished"}


@attrs.define
class Cluster:
    """Scripted nodes by URL: ``down`` ones refuse the TCP connection; ``log`` says
    which node each connection reached and its first message's type."""

    openers: dict[str, StreamOpener]
    down: set[str] = attrs.field(factory=set)
    log: list[tuple[str, str]] = attrs.field(factory=list)

    def stream_factories(self) -> dict[str, StreamOpener]:
        def opener(url: str, inner: StreamOpener) -> StreamOpener:
            async def open_stream() -> trio.abc.Stream:
                await trio.lowlevel.checkpoint()
                if url in self.down:
                    raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
                return await inner()

            return open_stream

        return {url: opener(url, inner) for url, inner in self.openers.items()}


@asynccontextmanager
async def cluster(scripts: Mapping[str, Script]) -> AsyncIterator[Cluster]:
    """One scripted server per URL; each script's first message is logged first."""
    nodes = Cluster({})
    async with contextlib.AsyncExitStack() as stack:
        for url, script in scripts.items():

            def logged(script: Script = script, url: str = url) -> Script:
                async def run(ws: WebSocketConnection, n: int) -> None:
                    await script(cast(WebSocketConnection, LoggedSocket(ws, url, nodes.log)), n)

                return run

            nodes.openers[url] = await stack.enter_async_context(scripted_server(logged()))
        yield nodes


@attrs.define
class LoggedSocket:
    """A server-side socket that logs its first message (node, type) as it is read."""

    ws: WebSocketConnection
    url: str
    log: list[tuple[str, str]]
    first: bool = True

    async def get_message(self) -> str | bytes:
        message = await self.ws.get_message()
        if self.first:
            self.first = False
            self.log.append((self.url, receive_type(message)))
        return message

    async def send_message(self, message: str | bytes) -> None:
        await self.ws.send_message(message)

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await self.ws.aclose(code, reason)


def receive_type(message: str | bytes) -> str:
    kind: str = json.loads(message)["type"]
    return kind


async def client_seqs_through(ws: WebSocketConnection, last: int) -> list[tuple[int, str]]:
    """Read until client event ``last`` arrives: the (seq, text) of each text event."""
    seen: list[tuple[int, str]] = []
    while not seen or seen[-1][0] < last:
        event = await receive_json(ws)
        if event["type"] == "input.text.append":
            seen.append((event["client_event_seq"], event["text"]))
    return seen


def seqs(events: list[Event]) -> list[int | str]:
    """Each event's ``server_event_seq``, or its type if it has none."""
    return [e["server_event_seq"] if "server_event_seq" in e else e["type"] for e in events]


# -- which URL ---------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", ["tcp", "resource_exhausted", "server_shutting_down"])
async def test_an_open_refused_at_one_url_lands_on_the_next(
    autojump_clock: trio.abc.Clock, refusal: str
) -> None:
    async def node_a(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        code, close = (
            ("resource_exhausted", 1013) if refusal == "resource_exhausted" else (refusal, 1001)
        )
        await send_json(ws, {"type": "error", "code": code, "message": "no", "retryable": True})
        await ws.aclose(close)

    async def node_b(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await send_json(ws, created(), CLOSED)
        await ws.get_message()

    async with cluster({A: node_a, B: node_b, C: node_b}) as nodes:
        if refusal == "tcp":
            nodes.down.add(A)
        changes: list[ConnectionChange] = []
        async with connect(
            [A, B, C],
            options=FAST,
            open_stream=nodes.stream_factories(),
            rng=rng_starting_at(0, 3),
            on_change=changes.append,
        ) as session:
            assert session.url == B
            assert [e["type"] async for e in session] == ["session.closed"]
    expected = [] if refusal == "tcp" else [(A, "session.update")]
    assert nodes.log == [*expected, (B, "session.update")]
    assert [type(c).__name__ for c in changes] == ["Retrying", "Attached"]


async def test_without_retry_open_each_url_is_tried_once_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def never(ws: WebSocketConnection, n: int) -> None:
        raise AssertionError("not reached")

    options = ClientOptions(reconnect=ReconnectPolicy(retry_open=False))
    async with cluster({A: never, B: never, C: never}) as nodes:
        nodes.down.update((A, B, C))
        start = trio.current_time()
        with pytest.raises(ReconnectFailed) as caught:
            async with connect([A, B, C], options=options, open_stream=nodes.stream_factories()):
                raise AssertionError("not reached")
    assert caught.value.attempts == 3 and caught.value.last_error == "connection refused"
    assert trio.current_time() == start


async def test_each_failed_attempt_is_one_attempt_of_the_policy_round_robin(
    autojump_clock: trio.abc.Clock,
) -> None:
    tried: list[str] = []

    def refusing(url: str) -> StreamOpener:
        async def open_stream() -> trio.abc.Stream:
            await trio.lowlevel.checkpoint()
            tried.append(url)
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

        return open_stream

    options = ClientOptions(
        reconnect=ReconnectPolicy(initial_delay=1.0, jitter=0.0, max_attempts=5, deadline=60)
    )
    changes: list[ConnectionChange] = []
    start = trio.current_time()
    with pytest.raises(ReconnectFailed) as caught:
        async with connect(
            [A, B, C],
            options=options,
            open_stream={url: refusing(url) for url in (A, B, C)},
            rng=rng_starting_at(1, 3),
            on_change=changes.append,
        ):
            raise AssertionError("not reached")
    assert tried == [B, C, A, B, C]
    assert caught.value.attempts == 5
    # The backoff of one URL, whatever the URLs: 1 + 2 + 4 + 5 (max_delay) seconds.
    assert [c.delay for c in changes if isinstance(c, Retrying)] == [1.0, 2.0, 4.0, 5.0]
    assert trio.current_time() - start == 12.0


async def test_a_lost_connection_is_resumed_at_its_own_url_first(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def node(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            await send_json(ws, created(), out(1))
            return  # an ordinary loss, no going_away
        await send_json(ws, resumed(0), CLOSED)
        await ws.get_message()

    async with cluster({A: node, B: node}) as nodes:
        async with connect(
            [A, B], options=FAST, open_stream=nodes.stream_factories(), rng=rng_starting_at(1, 2)
        ) as session:
            assert seqs([e async for e in session]) == [1, "session.closed"]
    assert nodes.log == [(B, "session.update"), (B, "session.resume")]


# -- migration ---------------------------------------------------------------------------


async def test_going_away_migrating_resumes_on_the_next_node_at_once_exactly_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    times: dict[str, float] = {}
    on_a: list[tuple[int, str]] = []
    on_b: list[tuple[int, str]] = []
    resume: Event = {}

    async def node_a(ws: WebSocketConnection, n: int) -> None:
        assert (await receive_json(ws))["type"] == "session.update"
        await send_json(ws, created(), out(1), out(2))
        on_a.extend(await client_seqs_through(ws, 3))
        going_away = {"type": "session.going_away", "time_left_ms": 5000, "migrating": True}
        await send_json(ws, going_away)
        times["closed"] = trio.current_time()
        await ws.aclose(1001)

    async def node_b(ws: WebSocketConnection, n: int) -> None:
        resume.update(await receive_json(ws))
        times["resume"] = trio.current_time()
        # B holds the session now: it had read client event 1; it replays past seq 2
        # (the 2 overlaps: dropped), and the client resends 2 and 3.
        await send_json(ws, resumed(1), out(2), out(3), out(4))
        on_b.extend(await client_seqs_through(ws, 3))
        await send_json(ws, CLOSED)
        await ws.get_message()

    async def node_c(ws: WebSocketConnection, n: int) -> None:
        raise AssertionError("the next node after A is B")

    changes: list[ConnectionChange] = []
    async with cluster({A: node_a, B: node_b, C: node_c}) as nodes:
        async with connect(
            [A, B, C],
            options=SLOW_BACKOFF,
            open_stream=nodes.stream_factories(),
            rng=rng_starting_at(0, 3),
            on_change=changes.append,
        ) as session:
            for value in ("one", "two", "three"):
                await session.send(text(value))
            events = [e async for e in session]
            assert session.url == B
    assert seqs(events) == [1, 2, "session.going_away", 3, 4, "session.closed"]
    assert events[2]["migrating"] is True  # surfaced as it came
    assert session.duplicates_dropped == 1
    assert resume["type"] == "session.resume" and resume["last_received_server_event_seq"] == 2
    assert resume["resume_token"] == "secret-1"
    assert on_a == [(1, "one"), (2, "two"), (3, "three")]
    assert on_b == [(2, "two"), (3, "three")]
    assert times["resume"] == times["closed"]  # no backoff: not even a virtual instant
    assert [type(c).__name__ for c in changes] == [
        "Attached",
        "Disconnected",
        "Retrying",
        "Attached",
    ]
    retrying = changes[2]
    assert isinstance(retrying, Retrying) and retrying.delay == 0.0


async def test_migrating_with_one_url_resumes_it_again_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    times: list[float] = []

    async def balanced(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        if n == 0:
            await send_json(ws, created(), out(1))
            await send_json(
                ws, {"type": "session.going_away", "time_left_ms": 9, "migrating": True}
            )
            times.append(trio.current_time())
            await ws.aclose(1001)
            return
        times.append(trio.current_time())
        assert first["type"] == "session.resume"
        await send_json(ws, resumed(0), out(2), CLOSED)
        await ws.get_message()

    async with cluster({A: balanced}) as nodes:
        async with connect(
            [A], options=SLOW_BACKOFF, open_stream=nodes.stream_factories()
        ) as session:
            assert seqs([e async for e in session]) == [
                1,
                "session.going_away",
                2,
                "session.closed",
            ]
    assert times[0] == times[1]


async def test_going_away_without_migrating_is_not_resumed_elsewhere(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def node_a(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await send_json(ws, created(), out(1), {"type": "session.going_away", "time_left_ms": 5})
        # The drain ends: today's end of a session.
        await send_json(
            ws, {"type": "session.closed", "session_id": "s1", "reason": "server_shutdown"}
        )
        await ws.aclose(1001)

    async def node_b(ws: WebSocketConnection, n: int) -> None:
        raise AssertionError("no resume elsewhere")

    async with cluster({A: node_a, B: node_b}) as nodes:
        async with connect(
            [A, B], options=FAST, open_stream=nodes.stream_factories(), rng=rng_starting_at(0, 2)
        ) as session:
            events = [e async for e in session]
        assert session.status == "ended"
    assert seqs(events) == [1, "session.going_away", "session.closed"]
    assert events[-1]["reason"] == "server_shutdown"
    assert nodes.log == [(A, "session.update")]


@pytest.mark.parametrize("with_error", [True, False], ids=["server_shutting_down", "bare-1001"])
async def test_a_resume_refused_by_a_draining_node_moves_on(
    autojump_clock: trio.abc.Clock, with_error: bool
) -> None:
    async def node_a(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            await send_json(ws, created(), out(1))
            return  # lost: resumed at A first
        if with_error:
            refusal = {"type": "error", "code": "server_shutting_down", "retryable": True}
            await send_json(ws, {**refusal, "message": "draining"})
        await ws.aclose(1001)

    async def node_b(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        if n == 0:
            # B fails once (as a busy node might); the next URL is C, then A's turn
            # would come, but A is draining: B again.
            busy = {"type": "error", "code": "session_resume_conflict", "retryable": True}
            await send_json(ws, {**busy, "message": "busy"})
            await ws.aclose(4001)
            return
        await send_json(ws, resumed(0), out(2), CLOSED)
        await ws.get_message()

    async def node_c(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await ws.aclose(1013)  # overloaded

    async with cluster({A: node_a, B: node_b, C: node_c}) as nodes:
        async with connect(
            [A, B, C], options=FAST, open_stream=nodes.stream_factories(), rng=rng_starting_at(0, 3)
        ) as session:
            assert seqs([e async for e in session]) == [1, 2, "session.closed"]
    assert nodes.log == [
        (A, "session.update"),
        (A, "session.resume"),
        (B, "session.resume"),
        (C, "session.resume"),
        (B, "session.resume"),
    ]


async def test_node_lost_is_a_terminal_resume_refusal_with_its_reason(
    autojump_clock: trio.abc.Clock,
) -> None:
    nodes_down: set[str] = set()

    async def node_a(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        await send_json(ws, created(), out(1))
        nodes_down.add(A)  # A dies with the session on it

    async def node_b(ws: WebSocketConnection, n: int) -> None:
        await receive_json(ws)
        lost = {"type": "error", "code": "session_resume_expired", "reason": "node_lost"}
        await send_json(ws, {**lost, "message": "the session's node is gone"})
        await ws.aclose(4001)

    async with cluster({A: node_a, B: node_b}) as nodes:
        nodes.down = nodes_down
        async with connect(
            [A, B], options=FAST, open_stream=nodes.stream_factories(), rng=rng_starting_at(0, 2)
        ) as session:
            assert (await session.receive())["server_event_seq"] == 1
            with pytest.raises(ResumeRefused) as caught:
                await session.receive()
        assert session.status == "failed"
    assert caught.value.code == "session_resume_expired"
    assert caught.value.reason == "node_lost"
    assert caught.value.close_code == 4001
    assert "node_lost" in str(caught.value)
    assert nodes.log == [(A, "session.update"), (B, "session.resume")]


# -- the URL list's checks and the ring --------------------------------------------------


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        ([], "at least one URL"),
        ((), "at least one URL"),
        ([A, "wss://node-b/v1/duplex"], "not a mix"),
        ([A, "http://node-b/"], "ws:// or wss://"),
        ([A, "node-b"], "ws:// or wss://"),
    ],
)
async def test_bad_url_lists_are_refused(urls: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        async with connect(urls):
            raise AssertionError("not reached")


async def test_a_tls_context_needs_every_url_wss_and_a_stream_for_each() -> None:
    with pytest.raises(ValueError, match="wss://"):
        async with connect([A, B], ssl_context=ssl.create_default_context()):
            raise AssertionError("not reached")

    async def never() -> trio.abc.Stream:
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="no stream factory"):
        async with connect([A, B], open_stream={A: never}):
            raise AssertionError("not reached")


def test_parse_urls_keeps_one_url_as_it_is() -> None:
    assert parse_urls("anything") == ("anything",)
    assert parse_urls([A, B]) == (A, B)
    assert parse_urls(["WSS://x", "wss://y"]) == ("WSS://x", "wss://y")


def test_the_ring_starts_at_random_and_skips_draining_urls() -> None:
    starts = {UrlRing.start((A, B, C), random.Random(seed)).index for seed in range(30)}
    assert starts == {0, 1, 2}  # a fleet spreads its opens
    one = random.Random(5)
    assert UrlRing.start((A,), one).url == A and one.random() == random.Random(5).random()

    ring = UrlRing((A, B, C))
    assert [ring.advance() for _ in range(4)] == [B, C, A, B]
    ring.mark_draining()  # B
    assert [ring.advance() for _ in range(3)] == [C, A, C]
    ring.mark_draining()  # C too: only A is left
    assert ring.advance() == A
    assert ring.advance() == B and not ring.draining  # none left: the marks are forgotten
    ring.mark_draining()
    ring.advance()
    ring.mark_draining()
    ring.attached()  # attached again: the outage, and its marks, are over
    assert not ring.draining

    assert UrlRing(("wss://u:secret@h:9/p?k=v",)).where == "h:9"
    assert UrlRing(("ws://h/p",)).where == "h"
    single = UrlRing((A,))
    single.mark_draining()
    assert single.advance() == A  # (a load balancer sends it elsewhere)
