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


async def heard_until(ws: ClientConnection, kind: str) -> list[dict[str, object]]:
    seen = [await receive(ws)]
    while seen[-1]["type"] != kind:
        seen.append(await receive(ws))
    return seen


@pytest.mark.parametrize("relay_port", [False, True])
async def test_an_openai_resume_is_relayed_to_its_home(
    nodes: Callable[..., list[ServerProcess]], store: Store, relay_port: bool
) -> None:
    a, b = nodes("ab", *(("--relay-port", "0") if relay_port else ()))
    async with ws_to(realtime(a)) as on_a:
        created = await receive(on_a)
        assert created["type"] == "session.created"
        await send(
            on_a,
            {
                "type": "input_audio_buffer.append",
                "audio": "AAAAAAAAAAAAAAAA",
                "client_event_seq": 1,
            },
        )
        first = await receive(on_a)  # the echo engine's answer, shaped
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
        assert resumed["last_received_client_event_seq"] == 1
        assert await receive(on_b) == first  # replayed as a wrote it, in OpenAI's spelling
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
        heard = []
        for seq in (1, 2):
            await send(on_a, append(seq))
            heard.append(await receive(on_a))
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
        assert await receive(on_b) == heard[1]  # the journal moved, in OpenAI's spelling
        await send(on_b, append(3))
        later = await receive(on_b)
        assert later["type"] == heard[1]["type"]
        assert later["server_event_seq"] == heard[1]["server_event_seq"] + 1
        assert str(later["event_id"]) == f"event_{later['server_event_seq']}"
    home = await store.locate(resume["session_id"], "observer")
    assert (home.kind, home.node_id) == ("home", "b")
