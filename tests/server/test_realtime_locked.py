"""A session a client secret (or client token) locked: opened by the upgrade on
``/v1/realtime`` with the locked configuration, and what a later ``session.update`` does
there (OpenAI's clients restate their configuration right after connecting) and natively.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openai.types.realtime import RealtimeSessionCreateRequest
from trio.testing import MockClock
from wsproto.events import AcceptConnection, Request

from trio_duplex import ServerConfig
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.testing import Simulation, running_server

from ..helpers import RawClient, RawClosed, RawHttp

KEY = "k-acme-123"
LOCKED = {"type": "realtime", "instructions": "be brief", "output_modalities": ["text"]}


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(f"acme: {KEY}\n")
    return str(path)


def post(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: sim\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def secret(sim: Simulation, raw_http: RawHttp, session: dict[str, Any]) -> str:
    answer = await raw_http(sim, post("/v1/realtime/client_secrets", {"session": session}))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer
    value: str = json.loads(body)["value"]
    return value


async def upgrade(sim: Simulation, target: str, value: str) -> RawClient:
    stream, _ = await sim.listener.connect()
    client = RawClient(stream)
    protocols: Sequence[str] = ["realtime", f"openai-insecure-api-key.{value}"]
    request = Request(host="sim", target=target, subprotocols=list(protocols))
    await client.send_bytes(client.ws.send(request))
    assert isinstance(await client.next_event(), AcceptConnection)
    return client


async def closed_with(client: RawClient) -> int | None:
    with pytest.raises(RawClosed):
        while True:
            await client.receive()
    return client.close_code


async def test_a_client_secret_opens_its_locked_session_on_the_upgrade(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    # Was: error config_locked and close 1008 (the upgrade's own defaults and ?model=
    # were judged against the lock as if the client had asked for them).
    async with running_server(ServerConfig(api_key_file=key_file), EchoEngine) as sim:
        value = await secret(sim, raw_http, LOCKED)
        client = await upgrade(sim, "/v1/realtime?model=gpt-realtime", value)
        created = await client.receive()
        assert created["type"] == "session.created", created
        assert created["session"]["instructions"] == "be brief"
        assert created["session"]["output_modalities"] == ["text"]
        assert "model" not in created["session"]  # a lock that sets none: ?model= ignored
        opened = sim.session(created["resume"]["session_id"])
        assert opened is not None and opened.config_locked
        await client.send({"type": "session.close"})


async def test_under_a_locked_model_the_upgrade_asks_for_that_model_or_none(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file), EchoEngine) as sim:
        for query, opens in (("?model=gpt-a", True), ("", True), ("?model=gpt-b", False)):
            value = await secret(sim, raw_http, LOCKED | {"model": "gpt-a"})
            client = await upgrade(sim, "/v1/realtime" + query, value)
            first = await client.receive()
            if opens:
                assert first["type"] == "session.created", first
                assert first["session"]["model"] == "gpt-a"
                await client.send({"type": "session.close"})
            else:
                assert first["type"] == "error"
                assert first["error"]["code"] == "config_locked"
                assert first["error"]["param"] == "model"
                assert await closed_with(client) == 1008


RESTATED = {
    "type": "realtime",
    "instructions": "be brief",
    "output_modalities": ["text"],
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}},
}


async def test_a_locked_session_takes_an_update_that_restates_it_and_refuses_a_change(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    # Was: any session.update of a locked session was config_locked and closed 1008.
    async with running_server(ServerConfig(api_key_file=key_file), EchoEngine) as sim:
        client = await upgrade(sim, "/v1/realtime", await secret(sim, raw_http, LOCKED))
        created = await client.receive()
        assert created["type"] == "session.created", created
        await client.send({"type": "session.update", "session": RESTATED})
        updated = await client.receive()
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["instructions"] == "be brief"
        changed = RESTATED | {"instructions": "be evil"}
        await client.send({"type": "session.update", "event_id": "e1", "session": changed})
        error = (await client.receive())["error"]
        assert (error["code"], error["param"], error["event_id"]) == (
            "config_locked",
            "session.instructions",
            "e1",
        )
        # OpenAI's rule: the connection goes on after an error; nothing changed.
        await client.send({"type": "session.update", "session": {"type": "realtime"}})
        again = await client.receive()
        assert again["type"] == "session.updated"
        assert again["session"]["instructions"] == "be brief"
        opened = sim.session(created["resume"]["session_id"])
        assert opened is not None and opened.config["instructions"] == "be brief"
        await client.send({"type": "session.close"})


async def test_natively_a_locked_update_that_changes_a_field_still_closes_1008(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file), EchoEngine) as sim:
        answer = await raw_http(sim, post("/v1/client_tokens", {"session": {"voice": "a"}}))
        token = json.loads(answer.partition(b"\r\n\r\n")[2])["token"]
        stream, _ = await sim.listener.connect()
        client = RawClient(stream)
        auth = [(b"Authorization", f"Bearer {token}".encode())]
        request = Request(host="sim", target="/v1/duplex", extra_headers=auth)
        await client.send_bytes(client.ws.send(request))
        assert isinstance(await client.next_event(), AcceptConnection)
        await client.send({"type": "session.update", "session": {}})
        assert (await client.receive())["type"] == "session.created"
        await client.send({"type": "session.update", "session": {"voice": "a"}})
        assert (await client.receive())["type"] == "session.updated"  # a restatement
        await client.send({"type": "session.update", "session": {"voice": "b"}})
        error = await client.receive()
        assert (error["code"], error["param"]) == ("config_locked", "session.voice")
        assert await closed_with(client) == 1008


async def test_a_locked_audio_restated_is_compared_as_negotiated(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    locked = {"audio": {"input": {"format": "pcm16"}}}  # the rest at its defaults
    async with running_server(ServerConfig(api_key_file=key_file), VoiceEngine) as sim:
        answer = await raw_http(sim, post("/v1/client_tokens", {"session": locked}))
        token = json.loads(answer.partition(b"\r\n\r\n")[2])["token"]
        stream, _ = await sim.listener.connect()
        client = RawClient(stream)
        auth = [(b"Authorization", f"Bearer {token}".encode())]
        await client.send_bytes(client.ws.send(Request(host="sim", target="/v1/duplex",
                                                       extra_headers=auth)))  # fmt: skip
        assert isinstance(await client.next_event(), AcceptConnection)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        assert created["session"]["audio"] != locked["audio"]  # negotiated: whole
        await client.send({"type": "session.update", "session": locked})
        assert (await client.receive())["type"] == "session.updated"  # the same audio
        other = {"audio": {"input": {"format": "g711_ulaw"}}}
        await client.send({"type": "session.update", "session": other})
        error = await client.receive()
        assert (error["code"], error["param"]) == ("config_locked", "session.audio")
        assert await closed_with(client) == 1008


def sdk_session(shown: dict[str, Any]) -> dict[str, Any]:
    """What an OpenAI client sends back of a session object it was shown: the Python
    SDK's own ``RealtimeSessionCreateRequest`` (every field shown, nulls too)."""
    fields = {key: value for key, value in shown.items() if key not in ("object", "id")}
    request = RealtimeSessionCreateRequest.model_validate(fields)
    dumped: dict[str, Any] = request.model_dump(mode="json", exclude_unset=True)
    return dumped


async def test_a_locked_session_takes_back_every_default_its_session_created_shows(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    # Was: config_locked for session.tools (the lock held only audio and
    # output_modalities of OpenAI's defaults, so a restated tools: [] was a change).
    async with running_server(ServerConfig(api_key_file=key_file), VoiceEngine) as sim:
        client = await upgrade(sim, "/v1/realtime", await secret(sim, raw_http, LOCKED))
        created = await client.receive()
        assert created["type"] == "session.created", created
        restated = sdk_session(created["session"])
        assert {"tools", "tool_choice", "tracing", "truncation", "audio"} <= restated.keys()
        await client.send({"type": "session.update", "session": restated})
        updated = await client.receive()
        assert updated["type"] == "session.updated", updated
        assert updated["session"] == created["session"]
        changes: list[tuple[dict[str, Any], str]] = [
            (restated | {"tool_choice": "none"}, "session.tool_choice"),
            (restated | {"max_output_tokens": 100}, "session.max_output_tokens"),
            (restated | {"audio": {"output": {"voice": "verse"}}}, "session.voice"),
        ]
        for changed, param in changes:
            await client.send({"type": "session.update", "session": changed})
            error = (await client.receive())["error"]
            assert (error["code"], error["param"]) == ("config_locked", param)
        await client.send({"type": "session.update", "session": {"type": "realtime"}})
        again = await client.receive()
        assert again["type"] == "session.updated"
        assert again["session"] == created["session"]  # nothing changed
        await client.send({"type": "session.close"})
