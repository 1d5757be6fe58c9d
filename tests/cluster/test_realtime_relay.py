"""An OpenAI session's resume on another node is relayed to its home, across real nodes.

Real ``trio-duplex serve`` processes and a real redis-server (tests/cluster/conftest.py),
``websockets`` as the client: a session opened on node a's ``/v1/realtime`` and resumed
by its query and bearer on node b's is relayed to a, which speaks the OpenAI dialect on
the relayed connection (the relay names it) and replays exactly what was missed; the
same resume on b's native path is refused, as a session resumes on its own path only.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest
import trio
from websockets.trio.client import ClientConnection

from trio_duplex.cluster.store import Store

from ..helpers import ServerProcess
from .test_relay import drop, receive, send, ws_to
from .test_serve import TIMEOUT

pytestmark = pytest.mark.integration


def realtime(node: ServerProcess, query: str = "") -> str:
    return node.url.replace("/v1/duplex", "/v1/realtime") + query


async def heard_until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    seen = [await receive(ws)]
    while seen[-1]["type"] != kind:
        seen.append(await receive(ws))
    return seen


async def text_turn(ws: ClientConnection, seq: int, text: str) -> list[dict[str, Any]]:
    """A user's text message and ``response.create`` (client events ``seq``, ``seq + 1``):
    every event heard until the echo's ``response.done``."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await send(ws, {"type": "conversation.item.create", "item": item, "client_event_seq": seq})
    await send(ws, {"type": "response.create", "client_event_seq": seq + 1})
    return await heard_until(ws, "response.done")


@pytest.mark.parametrize("relay_port", [False, True])
async def test_an_openai_resume_is_relayed_to_its_home(
    nodes: Callable[..., list[ServerProcess]], store: Store, relay_port: bool
) -> None:
    a, b = nodes("ab", *(("--relay-port", "0") if relay_port else ()))
    async with ws_to(realtime(a)) as on_a:
        created = await receive(on_a)
        assert created["type"] == "session.created"
        first = await text_turn(on_a, 1, "hello")  # the echo's answer, shaped
        drop(on_a)
    resume = created["resume"]
    home = await store.locate(resume["session_id"], "observer")
    assert (home.kind, home.node_id) == ("home", "a")

    async with ws_to(b.url) as native:  # its resume on the native path: refused
        await send(
            native,
            {
                "type": "session.resume",
                "session_id": resume["session_id"],
                "resume_token": resume["resume_token"],
            },
        )
        refused = await receive(native)
        assert (refused["type"], refused["code"]) == ("error", "invalid_session_resume")

    query = f"?resume={resume['session_id']}&last_received_server_event_seq=0"
    async with ws_to(realtime(b, query), resume["resume_token"]) as on_b:
        resumed = await receive(on_b)
        assert resumed["type"] == "session.resumed", resumed
        assert resumed["last_received_client_event_seq"] == 2
        replayed = [await receive(on_b) for _ in first]
        assert replayed == first  # replayed as a wrote it, in OpenAI's spelling
        await send(on_b, {"type": "session.heartbeat"})
        assert (await receive(on_b))["type"] == "session.heartbeat_ack"
        await send(on_b, {"type": "session.close"})
        closed = await heard_until(on_b, "session.closed")
        assert json.dumps(closed[-1]).count("client_close") == 1


def append(seq: int) -> dict[str, object]:
    return {
        "type": "input_audio_buffer.append",
        "audio": "AAAAAAAAAAAAAAAA",
        "client_event_seq": seq,
    }


async def test_an_openai_session_handed_over_by_a_drain_resumes_on_another_node(
    nodes: Callable[..., list[ServerProcess]], store: Store
) -> None:
    a, b = nodes("ab", "--relay-port", "0")
    async with ws_to(realtime(a)) as on_a:
        created = await receive(on_a)
        heard = await text_turn(on_a, 1, "one")
        drop(on_a)
    a.proc.send_signal(signal.SIGTERM)  # detached: handed over to the cluster
    assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
    assert "handed over to the cluster" in a.log
    resume = created["resume"]
    last = heard[0]["server_event_seq"]
    query = f"?resume={resume['session_id']}&last_received_server_event_seq={last}"
    async with ws_to(realtime(b, query), resume["resume_token"]) as on_b:
        resumed = await receive(on_b)
        assert resumed["type"] == "session.resumed", resumed
        replayed = [await receive(on_b) for _ in heard[1:]]
        assert replayed == heard[1:]  # the journal moved, in OpenAI's spelling
        later = await text_turn(on_b, 3, "two")  # the restored engine and shaper go on
        assert later[0]["server_event_seq"] == heard[-1]["server_event_seq"] + 1
        assert all(e["event_id"] == f"event_{e['server_event_seq']}" for e in later)
        assert [e["type"] for e in later] == [e["type"] for e in heard]
        assert later[-1]["response"]["id"] != heard[-1]["response"]["id"]
    home = await store.locate(resume["session_id"], "observer")
    assert (home.kind, home.node_id) == ("home", "b")
