"""The ``realtime-proxy`` engine against the fake OpenAI Realtime upstream
(``trio_duplex.testing.realtime_upstream``), both in this process on real sockets: a
``DuplexServer`` with the proxy's factory, clients from the ``websockets`` package and,
through a connection-cutting proxy, the SDK client.
"""

from __future__ import annotations

import base64
import json
import random
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.client import ClientOptions, HeartbeatPolicy, ReconnectPolicy, SessionEnded
from trio_duplex.client import connect as sdk_connect
from trio_duplex.engines.realtime_proxy import (
    API_KEY_ENV,
    RealtimeProxyEngine,
    Upstream,
    parse_header,
    proxy_factory,
)
from trio_duplex.testing.realtime_upstream import FakeRealtime

from ..client.proxy import FaultPlan, FaultyProxy

Event = dict[str, Any]
KEY = "sk-test-123"
SEEDS = 3
AUDIO_TURN = [
    "input_audio_buffer.committed",
    "response.created",
    "response.output_audio.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.done",
]
"""The fake upstream's answer to a committed audio turn (two frames) and a response."""
CLIENT_TURN = [
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "response.create",
]
"""What the upstream receives of that turn, the session's ``session.update`` first."""


@attrs.define
class Rig:
    upstream: FakeRealtime
    server: DuplexServer
    url: str
    port: int


@asynccontextmanager
async def rig(
    monkeypatch: pytest.MonkeyPatch,
    upstream: FakeRealtime | None = None,
    *,
    path: str = "/v1/duplex",
    headers: Sequence[str] = ("OpenAI-Beta: realtime=v1",),
    **config: Any,
) -> AsyncIterator[Rig]:
    """The fake upstream and a server proxying to it; ``url``: the server's ``path``."""
    upstream = upstream or FakeRealtime(api_key=KEY)
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            upstream_port = await nursery.start(upstream.run)
            factory = proxy_factory(f"ws://127.0.0.1:{upstream_port}/v1/realtime", headers)
            server = DuplexServer(ServerConfig(host="127.0.0.1", port=0, **config), factory)
            port = await nursery.start(server.run_tcp)
            yield Rig(upstream, server, f"ws://127.0.0.1:{port}{path}", port)
            nursery.cancel_scope.cancel()


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def receive(ws: ClientConnection) -> Event:
    event: Event = json.loads(await ws.recv())
    return event


async def receive_until(ws: ClientConnection, kind: str) -> list[Event]:
    got = []
    while True:
        got.append(await receive(ws))
        if got[-1]["type"] == kind:
            return got


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def close(a: bytes, b: bytes, tolerance: int = 4) -> bool:
    """Two PCM16 signals equal to within ``tolerance`` per sample."""
    n = len(a) // 2
    return len(a) == len(b) and all(
        abs(x - y) <= tolerance
        for x, y in zip(struct.unpack(f"<{n}h", a), struct.unpack(f"<{n}h", b), strict=True)
    )


def pcm(samples: int, seed: int = 0) -> bytes:
    return struct.pack(f"<{samples}h", *(((i * 37 + seed) % 65536) - 32768 for i in range(samples)))


async def test_a_full_turn_through_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async with rig(monkeypatch) as r, connect(r.url) as ws:
        await send(ws, {"type": "session.update", "session": {"instructions": "be brief"}})
        created = await receive(ws)
        assert created["type"] == "session.created"
        first = await receive(ws)
        assert first["type"] == "upstream.session.created"  # renamed: ours has the name
        updated = await receive(ws)
        assert updated["type"] == "upstream.session.updated"
        assert updated["session"]["instructions"] == "be brief"
        audio = pcm(960)
        append = {"type": "input_audio_buffer.append", "audio": b64(audio), "client_event_seq": 1}
        await send(ws, append)
        await send(ws, {"type": "input_audio_buffer.commit", "client_event_seq": 2})
        await send(ws, {"type": "response.create", "client_event_seq": 3})
        got = await receive_until(ws, "response.done")
        kinds = [e["type"] for e in got]
        assert kinds == AUDIO_TURN
        deltas = [e for e in got if e["type"] == "response.output_audio.delta"]
        assert "delta" not in deltas[0]  # the audio is in our field, ``audio``
        assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == audio  # echoed
        seqs = [e["server_event_seq"] for e in [first, updated, *got]]
        assert seqs == list(range(1, len(seqs) + 1))
        received = r.upstream.received[0]
        assert [e["type"] for e in received] == CLIENT_TURN
        assert received[0]["session"] == {"instructions": "be brief", "type": "realtime"}
        assert "client_event_seq" not in received[2]  # ours: not sent up
        headers = r.upstream.headers[0]
        assert headers["Authorization"] == f"Bearer {KEY}"
        assert headers["OpenAI-Beta"] == "realtime=v1"


async def test_every_upstream_event_reaches_the_client_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch, FakeRealtime(api_key=KEY, frames=50)) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.create"})
        await receive(ws)  # session.created
        got = await receive_until(ws, "response.done")
        sent = r.upstream.sent[0]
        assert [e["event_id"] for e in got] == [e["event_id"] for e in sent]


async def test_a_mid_session_update_goes_up_and_is_answered_by_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.cancel"})  # opens the session; nothing to cancel
        await receive(ws)  # session.created
        await receive_until(ws, "upstream.error")  # response_cancel_not_active
        await send(ws, {"type": "session.update", "session": {"voice": "marin"}})
        got = await receive_until(ws, "upstream.session.updated")
        assert [e["type"] for e in got] == ["session.updated", "upstream.session.updated"]
        assert got[1]["session"]["voice"] == "marin"
        assert r.upstream.received[0][-1] == {
            "type": "session.update",
            "session": {"voice": "marin", "type": "realtime"},
        }


@pytest.mark.parametrize(("acked", "audio_end_ms"), [(0, 0), (1, 20), (2, 40), (3, 60)])
async def test_barge_in_cancels_and_truncates_to_the_audio_delivered(
    monkeypatch: pytest.MonkeyPatch, acked: int, audio_end_ms: int
) -> None:
    # Was: truncated to the audio *sent* (60 ms here, whatever the client had received).
    upstream = FakeRealtime(api_key=KEY, frames=3, hold=True)
    async with rig(monkeypatch, upstream) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.create"})
        got: list[Event] = []
        while sum(e["type"] == "response.output_audio.delta" for e in got) < 3:
            got.append(await receive(ws))
        deltas = [e for e in got if e["type"] == "response.output_audio.delta"]
        item = deltas[-1]["item_id"]
        if acked:  # the client confirms the first ``acked`` deltas (20 ms each)
            seq = deltas[acked - 1]["server_event_seq"]
            await send(ws, {"type": "session.event_ack", "server_event_seq": seq})
        await send(ws, {"type": "response.cancel"})
        done = (await receive_until(ws, "response.done"))[-1]
        assert done["response"]["status"] == "cancelled"
        await r.upstream.wait_for(lambda: bool(r.upstream.truncations))
        types = [e["type"] for e in r.upstream.received[0]]
        assert types[-2:] == ["response.cancel", "conversation.item.truncate"]
        assert r.upstream.truncations == [
            {
                "type": "conversation.item.truncate",
                "item_id": item,
                "content_index": 0,
                "audio_end_ms": audio_end_ms,
            }
        ]


async def test_max_sessions_is_the_number_of_upstream_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch, max_sessions=1) as r:
        async with connect(r.url) as first, connect(r.url) as second:
            await send(first, {"type": "response.create"})
            await receive_until(first, "response.done")
            await send(second, {"type": "response.create"})
            refused = await receive(second)
            assert refused["type"] == "error"
            assert refused["code"] == "resource_exhausted" and refused["retryable"]
        assert len(r.upstream.headers) == 1  # one upgrade: the refused open made none


async def test_a_cancel_with_no_audio_sent_truncates_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = FakeRealtime(api_key=KEY, frames=0, hold=True)
    async with rig(monkeypatch, upstream) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.create"})
        await receive_until(ws, "response.created")
        await send(ws, {"type": "response.cancel"})
        done = (await receive_until(ws, "response.done"))[-1]
        assert done["response"]["status"] == "cancelled"
        # Sent up after the cancel (and after a truncate, were there one): once the
        # upstream has answered it, it has read everything before it.
        await send(ws, {"type": "session.update", "session": {"voice": "marin"}})
        await receive_until(ws, "upstream.session.updated")
        types = [e["type"] for e in r.upstream.received[0]]
        assert types[-2:] == ["response.cancel", "session.update"]
        assert r.upstream.truncations == []


async def test_upstream_loss_ends_the_session_upstream_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.create"})
        await receive_until(ws, "response.done")
        r.upstream.kill()
        closed = await receive(ws)
        assert closed["type"] == "session.closed"
        assert closed["reason"] == "upstream_lost"
        with trio.fail_after(10):
            while r.server.slots_held:
                await r.server.wait_changed()


async def test_the_sdk_client_ends_with_upstream_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    async with rig(monkeypatch) as r, sdk_connect(r.url) as session:
        await session.send({"type": "response.create"})
        async for event in session:
            if event["type"] == "response.done":
                break
        r.upstream.kill()
        closed = await session.receive()  # the terminal event, then SessionEnded
        assert closed["type"] == "session.closed" and closed["reason"] == "upstream_lost"
        with pytest.raises(SessionEnded) as ended:
            await session.receive()
        assert ended.value.event == closed


@pytest.mark.parametrize(
    "message",
    [
        b"not json",
        json.dumps({"type": "response.output_audio.delta", "delta": "no base64!"}),
        json.dumps({"type": "response.output_audio.delta", "delta": 7}),
    ],
)
async def test_a_malformed_upstream_message_ends_the_session_upstream_lost(
    monkeypatch: pytest.MonkeyPatch, message: str | bytes
) -> None:
    async with rig(monkeypatch) as r, connect(r.url) as ws:
        await send(ws, {"type": "response.create"})
        await receive_until(ws, "response.done")
        await r.upstream.connections[0].send(message)
        closed = await receive(ws)
        assert closed["type"] == "session.closed"
        assert closed["reason"] == "upstream_lost"


@pytest.mark.parametrize("status", [401, 429, 503])
async def test_an_upstream_that_refuses_refuses_the_open_retryable(
    monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    if status == 401:
        upstream = FakeRealtime(api_key="another key")
    else:
        upstream = FakeRealtime(api_key=KEY, refuse_status=status)
    # Was: session.created, then session.closed {upstream_lost}: a session that never
    # had an upstream, and a client told nothing it could retry on.
    async with rig(monkeypatch, upstream, max_sessions=1) as r:
        async with connect(r.url) as ws:
            await send(ws, {"type": "response.create", "event_id": "e1"})
            refused = await receive(ws)
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert refused == {
            "type": "error",
            "code": "resource_exhausted",
            "message": f"the upstream refused the session (HTTP {status}); try again",
            "retryable": True,
            "event_id": "e1",
        }
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        assert r.server.slots_held == 0
        # Once the upstream takes sessions again, so does the proxy (max_sessions=1:
        # the refused open's slot came back).
        upstream.refuse_status, upstream.api_key = None, KEY
        async with connect(r.url) as ws:
            await send(ws, {"type": "response.create"})
            assert (await receive(ws))["type"] == "session.created"
            await receive_until(ws, "response.done")


async def test_an_upstream_that_cannot_be_reached_refuses_the_open_retryable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with trio.socket.socket() as probe:  # a port that nothing listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = DuplexServer(
        ServerConfig(host="127.0.0.1", port=0), proxy_factory(f"ws://127.0.0.1:{port}/")
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = f"ws://127.0.0.1:{await nursery.start(server.run_tcp)}/v1/duplex"
            async with connect(url) as ws:
                await send(ws, {"type": "response.create"})
                refused = await receive(ws)
            assert (refused["code"], refused["retryable"]) == ("resource_exhausted", True)
            assert refused["message"] == "the upstream cannot be reached; try again"
            assert server.slots_held == 0
            nursery.cancel_scope.cancel()


async def test_output_while_detached_is_journaled_and_the_loss_told_on_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = FakeRealtime(api_key=KEY, frames=20, close_after=1)
    async with rig(monkeypatch, upstream) as r:
        async with connect(r.url) as ws:
            await send(ws, {"type": "response.create"})
            created = await receive(ws)
        # Gone before reading any output: the upstream goes on, its events journaled;
        # then it closes its connection, which ends the session once the client is back.
        await r.upstream.wait_for(lambda: r.upstream.closed == 1)
        resume = {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": 0,
        }
        async with connect(r.url) as ws:
            await send(ws, resume)
            got = await receive_until(ws, "session.closed")
        assert got[0]["type"] == "session.resumed"
        replayed = got[1:-1]
        assert [e["event_id"] for e in replayed] == [e["event_id"] for e in r.upstream.sent[0]]
        assert got[-1]["reason"] == "upstream_lost"


async def test_the_binary_lane_in_g711_ulaw_goes_up_as_pcm16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trio_duplex.audio import AudioFormat, Decoder
    from trio_duplex.dialects import binary

    ulaw = {"format": "g711_ulaw", "rate": 8000}
    audio = {"wire": "binary", "input": ulaw, "output": ulaw}
    rng = random.Random(7)
    chunks = [bytes(rng.randrange(256) for _ in range(160)) for _ in range(3)]
    decoder = Decoder(AudioFormat("g711_ulaw", 8000), 24000)
    expected_up = b"".join(decoder.decode(c) for c in chunks)
    async with rig(monkeypatch) as r, connect(r.url) as ws:
        await send(ws, {"type": "session.update", "session": {"audio": audio}})
        created = await receive(ws)
        assert created["session"]["audio"]["input"] == ulaw
        for seq, chunk in enumerate(chunks, 1):
            await ws.send(binary.input_message(seq, chunk))
        await send(ws, {"type": "input_audio_buffer.commit", "client_event_seq": 4})
        await send(ws, {"type": "response.create", "client_event_seq": 5})
        down = b""
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                down += binary.parse(message)[2]
            elif json.loads(message)["type"] == "response.done":
                break
        received = r.upstream.received[0]
        appends = [e for e in received if e["type"] == "input_audio_buffer.append"]
        up = b"".join(base64.b64decode(e["audio"]) for e in appends)
        # 24 kHz PCM16 as the server's own decoder makes it (the resampler keeps some of
        # the last chunk back), to the resampler's rounding; not the 480 bytes of μ-law
        assert len(up) == len(expected_up) > 2 * 480
        assert close(up, expected_up)
        assert received[0]["session"] == {"type": "realtime"}  # our ``audio`` not sent up
        # The upstream's 24 kHz PCM16 (it echoes ``up``) reaches the client as 8 kHz μ-law:
        # one byte per 3 samples, the resampler's tail flushed at the response's end.
        assert len(down) == len(up) // 6


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_exactly_once_through_a_client_cut_at_random_points(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    options = ClientOptions(
        reconnect=ReconnectPolicy(initial_delay=0.01, max_delay=0.2, max_attempts=50, deadline=20),
        heartbeat=HeartbeatPolicy(interval=1.0, timeout=1.0),
        open_timeout=2.0,
        close_timeout=2.0,
    )
    turns = 5
    upstream = FakeRealtime(api_key=KEY, frames=40, frame_bytes=480)
    async with rig(monkeypatch, upstream, disconnect_grace_s=5.0) as r:
        async with trio.open_nursery() as nursery:
            plan = FaultPlan(seed=seed, max_cuts=4 + 2 * seed, max_lifetime=0.3)
            cutter = FaultyProxy(r.port, plan)
            cut_port = await nursery.start(cutter.run)
            url = f"ws://127.0.0.1:{cut_port}/v1/duplex"
            got: list[Event] = []
            async with sdk_connect(url, options=options, rng=random.Random(seed)) as session:
                for _ in range(turns):
                    await session.send({"type": "response.create"})
                    async for event in session:
                        got.append(event)
                        if event["type"] == "response.done":
                            break
            nursery.cancel_scope.cancel()
        # A cut before the client read session.created leaves a session nobody can
        # resume: the client opens another, with an upstream connection of its own.
        assert got[0]["type"] == "upstream.session.created"
        index = next(
            i for i, s in enumerate(r.upstream.sent) if s and s[0]["event_id"] == got[0]["event_id"]
        )
        sent, received = r.upstream.sent[index], r.upstream.received[index]
        assert [e["event_id"] for e in got] == [e["event_id"] for e in sent]
        assert sum(e["type"] == "response.done" for e in got) == turns
        assert [e["type"] for e in received] == ["session.update"] + ["response.create"] * turns
        assert len(cutter.cuts) >= min(plan.max_cuts, 2)


def test_the_api_key_is_never_shown_and_headers_are_checked() -> None:
    upstream = Upstream("ws://up/v1", (("X-A", "1"),), "sk-secret")
    assert "sk-secret" not in repr(upstream)
    assert ("Authorization", "Bearer sk-secret") in upstream.request_headers()
    assert parse_header("OpenAI-Beta:  realtime=v1 ") == ("OpenAI-Beta", "realtime=v1")
    for bad in ("no colon", ": value", "two words: x"):
        with pytest.raises(ValueError):
            parse_header(bad)
    for url in (None, "", "http://up/v1"):
        with pytest.raises(ValueError, match="upstream"):
            proxy_factory(url)


def test_no_secret_in_the_repr_of_the_upstream_its_engine_or_the_settings() -> None:
    """Header values and URL passwords may be credentials too: never in a repr."""
    upstream = Upstream("wss://u:pw-in-url@up/v1", (("X-Tenant-Key", "tk-in-header"),), KEY)
    engine = RealtimeProxyEngine(upstream, {"instructions": "x"})
    config = ServerConfig(
        upstream="wss://u:pw-in-url@up/v1",
        upstream_header=("X-Tenant-Key: tk-in-header",),
        cluster="redis://:redis-pw-in-url@127.0.0.1:6379/0",
        cluster_secret="cluster-secret-in-settings-000",
    )
    for shown in (repr(upstream), repr(engine), repr(config), str(config)):
        for secret in ("pw-in-url", "tk-in-header", KEY, "cluster-secret-in-settings"):
            assert secret not in shown, shown
    assert "X-Tenant-Key" in repr(upstream) and "X-Tenant-Key" in repr(config)
