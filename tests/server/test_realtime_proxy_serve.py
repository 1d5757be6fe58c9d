"""``trio-duplex serve --engine realtime-proxy`` as a subprocess, with outside clients
(the ``websockets`` package): against the fake OpenAI Realtime upstream running in this
process, and chained in front of ``trio-duplex serve --engine echo`` as its upstream.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from trio_duplex.engines.realtime_proxy import API_KEY_ENV
from trio_duplex.testing.realtime_upstream import FakeRealtime

from ..helpers import Servers
from .test_serve_cli import run_cli

Event = dict[str, Any]
KEY = "sk-from-the-environment"


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def receive_until(ws: ClientConnection, kind: str) -> list[Event]:
    got = []
    while True:
        got.append(json.loads(await ws.recv()))
        if got[-1]["type"] == kind:
            return got


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--engine", "realtime-proxy"), "--engine realtime-proxy needs --upstream"),
        (("--engine", "echo", "--upstream", "ws://up/v1"), "need --engine realtime-proxy"),
        (("--engine", "realtime-proxy", "--upstream", "http://up/v1"), "ws:// or wss://"),
        (("--engine", "realtime-proxy", "--upstream-header", "no colon"), "NAME: VALUE"),
    ],
)
def test_proxy_flags_refused_exit_2(args: tuple[str, ...], says: str) -> None:
    result = run_cli("serve", *args)
    assert result.returncode == 2, result
    assert says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


async def test_a_turn_and_the_upstream_lost_through_serve(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = FakeRealtime(api_key=KEY, frames=4)
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the subprocess inherits it
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            server = servers.start(
                "--engine",
                "realtime-proxy",
                "--upstream",
                f"ws://127.0.0.1:{port}/v1/realtime?model=fake",
                "--upstream-header",
                "X-Tenant: t1",
            )
            async with connect(server.url) as ws:
                await send(ws, {"type": "response.create"})
                got = await receive_until(ws, "response.done")
                assert got[0]["type"] == "session.created"
                deltas = [e for e in got if e["type"] == "response.output_audio.delta"]
                assert len(deltas) == 4
                assert upstream.headers[0]["Authorization"] == f"Bearer {KEY}"
                assert upstream.headers[0]["X-Tenant"] == "t1"
                upstream.kill()
                closed = json.loads(await ws.recv())
                assert closed["type"] == "session.closed"
                assert closed["reason"] == "upstream_lost"
            nursery.cancel_scope.cancel()
    assert KEY not in server.log  # the key is never logged


async def test_an_upstream_out_of_capacity_refuses_the_open_through_serve(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = FakeRealtime(api_key=KEY, refuse_status=503)
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            server = servers.start(
                "--engine", "realtime-proxy", "--upstream", f"ws://127.0.0.1:{port}/v1/realtime"
            )
            async with connect(server.url) as ws:
                await send(ws, {"type": "response.create"})
                refused = json.loads(await ws.recv())
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
            assert (refused["type"], refused["code"], refused["retryable"]) == (
                "error",
                "resource_exhausted",
                True,
            )
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            upstream.refuse_status = None  # capacity again: the same client gets in
            async with connect(server.url) as ws:
                await send(ws, {"type": "response.create"})
                got = await receive_until(ws, "response.done")
                assert got[0]["type"] == "session.created"
            nursery.cancel_scope.cancel()
    assert "the upstream refused a session: HTTP 503" in server.log
    assert "Traceback" not in server.log


def test_the_proxy_in_front_of_trio_duplex_serve_itself(servers: Servers) -> None:
    """trio-duplex's own server as the upstream: it speaks session.update, audio appends
    and ``response.output_audio.delta`` (in ``audio``), and its refusals come down."""

    async def main() -> None:
        echo = servers.start("--engine", "echo")
        proxy = servers.start("--engine", "realtime-proxy", "--upstream", echo.url)
        audio = struct.pack("<480h", *range(-240, 240))
        with trio.fail_after(30):
            async with connect(proxy.url) as ws:
                opening = {"type": "session.update", "session": {"instructions": "x"}}
                await send(ws, opening)
                got = await receive_until(ws, "upstream.session.created")
                assert [e["type"] for e in got] == ["session.created", "upstream.session.created"]
                assert got[1]["session"] == {"instructions": "x", "type": "realtime"}
                append = {"type": "input_audio_buffer.append"}
                await send(ws, {**append, "audio": base64.b64encode(audio).decode()})
                echoed = (await receive_until(ws, "response.output_audio.delta"))[-1]
                assert base64.b64decode(echoed["audio"]) == audio
                # Its refusal (an item it does not hold) comes down as the upstream's.
                await send(ws, {"type": "conversation.item.retrieve", "item_id": "item_x"})
                error = (await receive_until(ws, "upstream.error"))[-1]
                assert (error["code"], error["param"]) == ("bad_event", "item_id")
                echo.interrupt()  # its drain ends its session: the proxy's upstream is gone
                got = await receive_until(ws, "session.closed")
                assert got[-1]["reason"] == "upstream_lost"
                assert "upstream.session.closed" in [e["type"] for e in got]

    trio.run(main)


def test_openai_clients_through_the_proxy_see_what_trio_duplex_itself_says(
    servers: Servers,
) -> None:
    """An OpenAI client on the proxy's /v1/realtime, the proxy in front of `trio-duplex
    serve --engine echo`'s /v1/realtime: every event reaches the client by the upstream's
    own name, valid by the SDK's own models, the same turn as a client of the upstream
    directly sees, and the upstream's refusal as an OpenAI error."""
    from ..dialects.openai.reference import validate

    audio = struct.pack("<480h", *range(-240, 240))
    turn: list[Event] = [
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "hello"}]}},
        {"type": "response.create"},
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()},
        {"type": "input_audio_buffer.commit"},
        {"type": "response.create"},
    ]  # fmt: skip

    async def converse(url: str) -> list[Event]:
        async def next_event() -> Event:
            message = await ws.recv()
            validate(message)  # strictly, by the SDK's model of its type
            event: Event = json.loads(message)
            return event

        async with connect(url, subprotocols=["realtime"]) as ws:  # type: ignore[list-item]
            got = [await next_event()]
            assert got[0]["type"] == "session.created" and "resume" in got[0]
            for event in turn:
                await send(ws, event)
            while sum(e["type"] == "response.done" for e in got) < 2:
                got.append(await next_event())
            await send(ws, {"type": "conversation.item.retrieve", "item_id": "item_x"})
            got.append(await next_event())
            return got

    async def main() -> None:
        echo = servers.start("--engine", "echo")
        realtime = echo.url.replace("/v1/duplex", "/v1/realtime")
        proxy = servers.start("--engine", "realtime-proxy", "--upstream", realtime)
        with trio.fail_after(30):
            direct = await converse(f"{realtime}?model=gpt-realtime")
            relayed = await converse(proxy.url.replace("/v1/duplex", "/v1/realtime"))
        # The proxy's own session.created, then the upstream's session.updated (the
        # answer to the proxy's first session.update): the rest is the upstream's, as is.
        assert relayed[1]["type"] == "session.updated"
        assert [e["type"] for e in relayed[2:]] == [e["type"] for e in direct[1:]]
        assert not any(e["type"].startswith("upstream.") for e in relayed)
        deltas = [e["delta"] for e in relayed if e["type"] == "response.output_audio.delta"]
        assert base64.b64decode("".join(deltas)) == audio
        text = [e for e in relayed if e["type"] == "response.output_text.done"]
        assert [e["text"] for e in text] == ["hello"]
        error = relayed[-1]
        assert error["type"] == "error"
        assert (error["error"]["code"], error["error"]["param"]) == ("bad_event", "item_id")
        seqs = [e["server_event_seq"] for e in relayed if "server_event_seq" in e]
        assert seqs == list(range(1, len(seqs) + 1))  # journaled, the error too

    trio.run(main)
