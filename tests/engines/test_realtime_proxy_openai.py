"""The ``realtime-proxy`` engine behind ``/v1/realtime``: an OpenAI client, the server,
and the fake OpenAI upstream (``trio_duplex.testing.realtime_upstream``), all on real
sockets in this process. With OpenAI's dialect on both sides the proxy is transparent:
the client sees the upstream's own events by their own names, the upstream the client's,
and a client that uses the resume extension gets it.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.trio.client import connect

from trio_duplex.testing.realtime_upstream import FakeRealtime

from .test_realtime_proxy import (
    AUDIO_TURN,
    CLIENT_TURN,
    KEY,
    Event,
    Rig,
    b64,
    pcm,
    receive,
    receive_until,
    send,
)
from .test_realtime_proxy import rig as proxy_rig


@asynccontextmanager
async def rig(
    monkeypatch: pytest.MonkeyPatch, upstream: FakeRealtime | None = None
) -> AsyncIterator[Rig]:
    """The proxy with no header of its own, behind ``/v1/realtime``."""
    async with proxy_rig(monkeypatch, upstream, path="/v1/realtime", headers=()) as r:
        yield r


def dial(url: str, query: str = "model=gpt-realtime", **kw: Any) -> Any:
    return connect(f"{url}?{query}", subprotocols=["realtime"], **kw)  # type: ignore[list-item]


def without_ours(event: Event) -> Event:
    """An event as the upstream sent it: the server's ``event_id`` and seq removed."""
    return {k: v for k, v in event.items() if k not in ("event_id", "server_event_seq")}


async def test_the_upstreams_events_come_down_by_their_own_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch) as r, dial(r.url) as ws:
        assert ws.subprotocol == "realtime"
        created = await receive(ws)  # the server's own, on the upgrade
        assert created["type"] == "session.created"
        assert created["session"]["type"] == "realtime" and "resume" in created
        updated = await receive(ws)  # the upstream's answer to the proxy's first update
        assert updated["type"] == "session.updated"
        assert updated["event_id"] == f"event_{updated['server_event_seq']}"
        audio = pcm(960)
        await send(ws, {"type": "input_audio_buffer.append", "audio": b64(audio)})
        await send(ws, {"type": "input_audio_buffer.commit", "event_id": "evt_c1"})
        await send(ws, {"type": "response.create"})
        got = await receive_until(ws, "response.done")
        theirs = r.upstream.sent[0][2:]  # after its session.created and session.updated
        assert [e["type"] for e in got] == [e["type"] for e in theirs] == AUDIO_TURN
        for mine, upstream_event in zip(got, theirs, strict=True):
            assert mine["event_id"] == f"event_{mine['server_event_seq']}"
            if mine["type"] != "response.output_audio.delta":
                assert without_ours(mine) == without_ours(upstream_event)
        deltas = [e for e in got if e["type"] == "response.output_audio.delta"]
        assert b"".join(base64.b64decode(e["delta"]) for e in deltas) == audio
        assert deltas[0]["item_id"] == theirs[2]["item_id"]
        received = r.upstream.received[0]
        assert [e["type"] for e in received] == CLIENT_TURN
        assert received[0]["session"]["type"] == "realtime"
        assert "model" not in received[0]["session"]  # the upstream URL's choice
        assert received[2].get("event_id") in (None, "evt_c1")


async def test_an_upstream_error_is_an_openai_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async with rig(monkeypatch) as r, dial(r.url) as ws:
        await receive_until(ws, "session.updated")
        await send(ws, {"type": "response.cancel"})  # nothing to cancel upstream
        error = (await receive_until(ws, "error"))[-1]
        assert error["error"]["code"] == "response_cancel_not_active"
        assert error["error"]["message"] == "no response in progress"
        assert r.upstream.truncations == []


async def test_a_session_update_is_answered_by_the_upstream_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch) as r, dial(r.url) as ws:
        await receive_until(ws, "session.updated")
        update = {
            "type": "realtime",
            "instructions": "be brief",
            "audio": {"output": {"voice": "marin"}},
        }
        await send(ws, {"type": "session.update", "session": update})
        answer = (await receive_until(ws, "session.updated"))[-1]
        assert answer["session"]["instructions"] == "be brief"
        await send(ws, {"type": "response.cancel"})  # a marker: nothing else came between
        assert (await receive(ws))["type"] == "error"
        sent_up = r.upstream.received[0][1]
        assert sent_up["session"]["instructions"] == "be brief"
        assert sent_up["session"]["audio"] == {"output": {"voice": "marin"}}


async def test_a_client_that_resumes_gets_what_the_upstream_said_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with rig(monkeypatch, FakeRealtime(api_key=KEY, frames=3)) as r:
        async with dial(r.url) as ws:
            resume = (await receive(ws))["resume"]
            seq = (await receive(ws))["server_event_seq"]  # the upstream's session.updated
            await send(ws, {"type": "response.create"})
        # Gone before a word of the answer: it waits in the journal, the upstream
        # connection with the session.
        sent = r.upstream.sent[0]
        await r.upstream.wait_for(lambda: sent[-1]["type"] == "response.done")
        query = f"resume={resume['session_id']}&last_received_server_event_seq={seq}"
        headers = {"Authorization": f"Bearer {resume['resume_token']}"}
        async with dial(r.url, query, additional_headers=headers) as ws:
            resumed = await receive(ws)
            assert resumed["type"] == "session.resumed"
            assert resumed["resume_token"] != resume["resume_token"]
            got = await receive_until(ws, "response.done")
        assert [e["server_event_seq"] for e in got] == list(range(seq + 1, seq + 1 + len(got)))
        assert [e["type"] for e in got] == [e["type"] for e in sent[2:]]
        assert r.upstream.closed == 0  # one upstream connection, all along
