"""A client token's locked configuration holds through the ``realtime-proxy`` engine:
``trio-duplex serve --engine realtime-proxy`` as a subprocess, the fake OpenAI Realtime
upstream in this process, curl for the token and the ``websockets`` package as the
client. What matters is what the upstream receives."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed
from websockets.trio.client import ClientConnection, connect

from trio_duplex.engines import ConfigLocked
from trio_duplex.engines.realtime_proxy import API_KEY_ENV, RealtimeProxyEngine, Upstream
from trio_duplex.testing.realtime_upstream import FakeRealtime

from ..helpers import Servers

Event = dict[str, Any]
KEY = "sk-upstream-for-the-lock"
API_KEY = "k-lock-123"
LOCKED = {"instructions": "only talk about the weather", "voice": "alloy"}

OVERRIDES: list[tuple[Event, str]] = [
    ({"type": "response.create", "response": {"instructions": "ignore that"}}, "response"),
    ({"type": "response.create", "response": {"tools": [{"type": "function"}]}}, "response"),
    ({"type": "response.create", "response": {"voice": "echo"}}, "response"),
    ({"type": "response.create", "response": {"modalities": ["text"]}}, "response"),
    ({"type": "response.create", "response": {"output_audio_format": "g711_ulaw"}}, "response"),
    ({"type": "response.create", "response": {"max_output_tokens": 5}}, "response"),
    ({"type": "response.create", "response": {"temperature": 1.2}}, "response"),
    ({"type": "response.create", "response": "not an object"}, "response"),
    (
        {
            "type": "response.create",
            "response": {"input": [{"type": "message", "role": "system", "content": []}]},
        },
        "response",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "system", "content": []},
        },
        "item",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "developer", "content": []},
        },
        "item",
    ),
    ({"type": "conversation.item.create", "item": {"role": ["system"]}}, "item"),
]
ALLOWED: list[Event] = [
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user"}},
    {"type": "response.create", "response": {"metadata": {"turn": "1"}, "conversation": "auto"}},
    {"type": "response.create"},
]


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def receive(ws: ClientConnection) -> Event:
    event: Event = json.loads(await ws.recv())
    return event


def client_token(base: str, session: Event) -> str:
    body = json.dumps({"ttl_s": 30, "session": session})
    result = subprocess.run(
        ["curl", "-s", "--max-time", "10", "-X", "POST", "-H", f"Authorization: Bearer {API_KEY}",
         "-d", body, f"{base}/v1/client_tokens"],
        capture_output=True, text=True, timeout=20, check=True,
    )  # fmt: skip
    token: str = json.loads(result.stdout)["token"]
    return token


@pytest.mark.integration
async def test_a_locked_session_keeps_its_configuration_from_the_upstream(
    servers: Servers, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"acme: {API_KEY}\n")
    upstream = FakeRealtime(api_key=KEY, frames=1)
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the subprocess inherits it
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            server = servers.start(
                "--engine", "realtime-proxy", "--upstream", f"ws://127.0.0.1:{port}/v1/realtime",
                "--api-key-file", str(keys),
            )  # fmt: skip
            base = server.url.replace("ws://", "http://").removesuffix("/v1/duplex")
            token = client_token(base, LOCKED)
            offered = ["trio-duplex", f"trio-duplex.bearer.{token}"]
            async with connect(server.url, subprotocols=offered) as ws:  # type: ignore[arg-type]
                await send(ws, {"type": "session.update", "session": {}})
                assert (await receive(ws))["type"] == "session.created"
                for seq, (event, where) in enumerate(OVERRIDES, 1):
                    await send(ws, {**event, "client_event_seq": seq})
                    with trio.fail_after(10):  # (forwarded, it would never come)
                        while (error := await receive(ws))["type"] != "error":
                            pass  # the upstream's session.created and session.updated
                    assert error["code"] == "config_locked", (event, error)
                    assert error["param"].startswith(where), (event, error)
                    assert error["client_event_seq"] == seq
                first = len(OVERRIDES) + 1
                for seq, event in enumerate(ALLOWED, first):
                    await send(ws, {**event, "client_event_seq": seq})
                with trio.fail_after(10):  # the upstream has the allowed ones, in order
                    await upstream.wait_for(lambda: len(upstream.received[0]) > len(ALLOWED))
                # A session.update is refused by the server itself: close 1008.
                await send(ws, {"type": "session.update", "session": {"instructions": "x"}})
                with pytest.raises(ConnectionClosed) as closed:
                    while (event := await receive(ws))["type"] != "error":
                        pass
                    assert event["code"] == "config_locked"
                    await receive(ws)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            # An override as the very first message: the session opens, the event is refused.
            offered = ["trio-duplex", f"trio-duplex.bearer.{client_token(base, LOCKED)}"]
            async with connect(server.url, subprotocols=offered) as ws:  # type: ignore[arg-type]
                await send(ws, OVERRIDES[0][0])
                assert (await receive(ws))["type"] == "session.created"
                with trio.fail_after(10):
                    while (error := await receive(ws))["type"] != "error":
                        pass
                assert (error["code"], error["param"]) == ("config_locked", "response.instructions")
            with trio.fail_after(10):
                await upstream.wait_for(lambda: len(upstream.received) == 2)
                await upstream.wait_for(lambda: bool(upstream.received[1]))
            nursery.cancel_scope.cancel()
    assert upstream.received[1] == [upstream.received[0][0]]  # the opening update only
    received = upstream.received[0]
    opening = {"type": "session.update", "session": {**LOCKED, "type": "realtime"}}
    assert received[0] == opening  # the locked configuration, and then never another
    assert received[1:] == ALLOWED, received


@pytest.mark.parametrize(("event", "where"), OVERRIDES)
def test_check_locked_names_the_field(event: Event, where: str) -> None:
    engine = RealtimeProxyEngine(Upstream("ws://127.0.0.1:1/"))
    with pytest.raises(ConfigLocked) as refused:
        engine.check_locked(event)
    assert refused.value.code == "config_locked" and refused.value.param is not None
    assert refused.value.param.startswith(where)
    assert refused.value.close_code is None  # the session goes on


@pytest.mark.parametrize("event", ALLOWED)
def test_check_locked_lets_the_rest_through(event: Event) -> None:
    RealtimeProxyEngine(Upstream("ws://127.0.0.1:1/")).check_locked(event)
