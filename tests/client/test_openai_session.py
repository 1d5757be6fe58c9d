"""``ClientSession`` with ``dialect="openai"`` against a scripted WebSocket server in
memory (virtual time): what each upgrade asks for (path, query, subprotocol,
credential), that the client waits for the server to speak, and that it resumes by the
upgrade's query with the resume token as its bearer credential.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
from trio_websocket import WebSocketConnection, WebSocketRequest

from trio_duplex.client import ServerRefused, connect

from .helpers import FAST, Event, resumed
from .scripted import Script, StreamOpener, receive_json, scripted_server, send_json
from .test_openai_state import created, error

URL = "ws://sim/v1/realtime?model=gpt-realtime"


@attrs.frozen
class Upgrade:
    path: str
    query: dict[str, str]
    subprotocols: list[str]
    authorization: str | None


@asynccontextmanager
async def scripted(script: Script, upgrades: list[Upgrade]) -> AsyncIterator[StreamOpener]:
    """A scripted server (``scripted_server``) that selects ``realtime`` when offered and
    records each upgrade."""

    def record(request: WebSocketRequest) -> str | None:
        parts = urllib.parse.urlsplit(request.path)
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        offered = list(request.proposed_subprotocols)
        upgrades.append(
            Upgrade(
                parts.path,
                dict(urllib.parse.parse_qsl(parts.query)),
                offered,
                headers.get("authorization"),
            )
        )
        return "realtime" if "realtime" in offered else None

    async with scripted_server(script, record) as open_stream:
        yield open_stream


def out(seq: int) -> Event:
    return {"type": "response.output_text.delta", "server_event_seq": seq, "delta": f"t{seq}"}


async def test_the_server_speaks_first_then_a_cut_resumes_by_the_query(
    autojump_clock: trio.abc.Clock,
) -> None:
    upgrades: list[Upgrade] = []
    firsts: list[Event] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        if n == 0:
            # Nothing comes before session.created: the client waits for the server.
            with trio.move_on_after(1) as waited:
                firsts.append(await receive_json(ws))
            assert waited.cancelled_caught
            await send_json(ws, created())
            firsts.append(await receive_json(ws))  # the configuration, as event 1
            await send_json(ws, out(1), out(2))
            await ws.get_message()  # (whatever comes next) then the connection is cut
            return
        await send_json(ws, {**resumed(1), "event_id": "event_x1"}, out(2), out(3))
        await send_json(ws, {"type": "session.closed", "event_id": "e", "reason": "client_close"})
        await ws.get_message()

    options = attrs.evolve(FAST, api_key="sk-test")
    async with scripted(script, upgrades) as open_stream:
        async with connect(
            URL, {"instructions": "hi"}, options=options, open_stream=open_stream, dialect="openai"
        ) as session:
            assert session.dialect.name == "openai" and session.session_id == "s1"
            await session.send({"type": "response.create"})
            got = [event async for event in session]
    assert [e.get("server_event_seq", e["type"]) for e in got] == [1, 2, 3, "session.closed"]
    assert session.duplicates_dropped == 1
    assert firsts[0] == {
        "type": "session.update",
        "session": {"type": "realtime", "instructions": "hi"},
        "client_event_seq": 1,
    }
    first, second = upgrades
    assert first == Upgrade(
        "/v1/realtime", {"model": "gpt-realtime"}, ["realtime"], "Bearer sk-test"
    )
    assert second == Upgrade(
        "/v1/realtime",
        {"model": "gpt-realtime", "resume": "s1", "last_received_server_event_seq": "2"},
        ["realtime"],
        "Bearer secret-1",
    )


async def test_a_refused_upgrade_is_the_nested_error(autojump_clock: trio.abc.Clock) -> None:
    async def script(ws: WebSocketConnection, n: int) -> None:
        await send_json(ws, error("unauthorized", retryable=False))
        await ws.aclose(1008)

    async with scripted(script, []) as open_stream:
        with pytest.raises(ServerRefused) as caught:
            async with connect(URL, open_stream=open_stream, dialect="openai"):
                raise AssertionError("not reached")
    assert caught.value.code == "unauthorized" and not caught.value.retryable


async def test_native_offers_no_subprotocol_and_sends_first(
    autojump_clock: trio.abc.Clock,
) -> None:
    upgrades: list[Upgrade] = []

    async def script(ws: WebSocketConnection, n: int) -> None:
        first = await receive_json(ws)
        assert first == {"type": "session.update", "session": {}}
        native = {**created()["resume"], "type": "session.created", "session": {}}
        await send_json(ws, native)
        await receive_json(ws)
        await send_json(ws, {"type": "session.closed", "reason": "client_close"})

    async with scripted(script, upgrades) as open_stream:
        async with connect("ws://sim/v1/duplex", open_stream=open_stream) as session:
            assert [e["type"] async for e in session] == ["session.closed"]
    assert upgrades == [Upgrade("/v1/duplex", {}, [], None)]


async def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="dialect"):
        async with connect(URL, dialect="klingon"):  # type: ignore[arg-type]
            raise AssertionError("not reached")
