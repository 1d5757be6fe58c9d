"""A dialect on its own path, over real sockets: the server's side of the dialect layer.

``Speaker`` stands in for any dialect that speaks first and shapes the engine's events
(as OpenAI Realtime's does): it writes native JSON, so only what the wiring adds is
looked at. It is served at ``/v1/speaker`` beside the native ``/v1/duplex`` by a real
DuplexServer on a TCP port, and the ``websockets`` library is the client: the path
picks the dialect and its subprotocol, the upgrade opens or resumes the session
(``Dialect.opening``), every engine event is shaped before it is sequenced, and a
session resumes only on its own dialect's path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Generator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.trio.client import ClientConnection, connect

from trio_duplex.core.events import ErrorCode
from trio_duplex.core.spelling import Frame
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE, Dialect, Shaper, native
from trio_duplex.dialects.jsonwire import LARGE, encode
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.config import ServerConfig
from trio_duplex.server.server import DuplexServer

Event = dict[str, Any]
SPEAKER_PATH = "/v1/speaker"
TIMEOUT_S = 10.0


@attrs.define
class Counting:
    """A shaper that puts a numbered ``shaped.note`` before every engine event."""

    notes: int = 0

    def shape(self, event: Event, /) -> list[Event]:
        self.notes += 1
        return [{"type": "shaped.note", "n": self.notes, "of": event["type"]}, event]

    def state(self) -> dict[str, Any]:
        return {"notes": self.notes}


class Speaker:
    """Native JSON, but the server speaks first and shapes (see the module's docstring)."""

    name = "speaker"
    subprotocol: str | None = "speaker"
    large = LARGE
    binary_lane = False
    replays_audio = True
    audio_by_transport = False
    resumes_from_ack = False
    speaks_first = True
    config_locked_closes = True

    def decode(self, message: str | bytes, /) -> Event:
        return native.decode(message)

    def decode_steps(self, message: str | bytes, /) -> Generator[None, None, Event]:
        return native.decode_steps(message)

    def decode_binary(self, data: bytes, /) -> Event:
        raise ProtocolError(ErrorCode.BAD_EVENT, "speaker: no binary lane")

    def frame(self, event: Event, /) -> Frame:
        return encode(event)

    def audio_frame(self, seq: int, payload: bytes, fields: Event | None, /) -> Frame:
        return native.audio_frame(seq, payload, fields)

    def opening(self, query: Mapping[str, list[str]], bearer: str | None, /) -> Event:
        if "resume" in query:
            last = query.get("last_received_server_event_seq", ["0"])[0]
            if not last.isdigit():
                raise ProtocolError(
                    ErrorCode.BAD_EVENT, "not a seq", param="last_received_server_event_seq"
                )
            return {
                "type": "session.resume",
                "session_id": query["resume"][0],
                "resume_token": bearer,
                "last_received_server_event_seq": int(last),
            }
        return {"type": "session.update", "session": {"model": query.get("model", ["m0"])[0]}}

    def shaper(self, config: Event, /) -> Shaper:
        return Counting()

    def restore_shaper(self, config: Event, state: Event, /) -> Shaper:
        notes = state.get("notes")
        if type(notes) is not int:
            raise ValueError("no notes")
        return Counting(notes)


SPEAKER: Dialect = Speaker()


@asynccontextmanager
async def serving(config: ServerConfig | None = None) -> AsyncIterator[tuple[str, DuplexServer]]:
    """A real DuplexServer on 127.0.0.1 (echo engine) serving SPEAKER at SPEAKER_PATH."""
    server = DuplexServer(config or ServerConfig(port=0), EchoEngine)
    server.door.dialects[SPEAKER_PATH] = SPEAKER
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run, listeners)
        with trio.fail_after(TIMEOUT_S):
            yield f"ws://127.0.0.1:{port}", server
        nursery.cancel_scope.cancel()


async def receive(ws: ClientConnection) -> Event:
    message = await ws.recv()
    assert isinstance(message, str)
    event: Event = json.loads(message)
    return event


async def send(ws: ClientConnection, **event: Any) -> None:
    await ws.send(json.dumps(event))


async def test_the_upgrade_opens_a_session_in_the_path_s_dialect() -> None:
    async with (
        serving() as (url, _),
        connect(f"{url}{SPEAKER_PATH}?model=m7", subprotocols=["speaker"]) as ws,  # type: ignore[list-item]
    ):
        assert ws.subprotocol == "speaker"
        created = await receive(ws)  # nothing was sent: the server spoke first
        assert created["type"] == "session.created"
        assert created["session"]["model"] == "m7"
        await send(ws, type="input.text.append", text="hi", client_event_seq=1)
        note, delta = await receive(ws), await receive(ws)
        assert note == {
            "type": "shaped.note",
            "n": 1,
            "of": "response.output_text.delta",
            "server_event_seq": 1,
        }
        assert delta["text"] == "hi"
        assert delta["server_event_seq"] == 2  # each shaped event is sequenced


async def test_the_native_path_is_unchanged_beside_it() -> None:
    async with (
        serving() as (url, _),
        connect(f"{url}/v1/duplex", subprotocols=["trio-duplex", "speaker"]) as ws,  # type: ignore[list-item]
    ):
        assert ws.subprotocol == "trio-duplex"
        await send(ws, type="session.update", session={})
        assert (await receive(ws))["type"] == "session.created"
        await send(ws, type="input.text.append", text="hi", client_event_seq=1)
        delta = await receive(ws)
        assert (delta["type"], delta["server_event_seq"]) == ("response.output_text.delta", 1)


async def test_a_subprotocol_of_another_dialect_is_not_selected() -> None:
    async with (
        serving() as (url, _),
        connect(f"{url}{SPEAKER_PATH}", subprotocols=["trio-duplex"]) as ws,  # type: ignore[list-item]
    ):
        assert ws.subprotocol is None
        assert (await receive(ws))["type"] == "session.created"


async def test_the_upgrade_resumes_on_its_own_path_only() -> None:
    async with serving() as (url, _):
        async with connect(f"{url}{SPEAKER_PATH}") as ws:
            created = await receive(ws)
            await send(ws, type="input.text.append", text="a", client_event_seq=1)
            await receive(ws)
            await receive(ws)
        session_id, token = created["session_id"], created["resume_token"]

        # Native's resume of it, on the native path: refused, and the token not spent.
        async with connect(f"{url}/v1/duplex") as ws:
            await send(ws, type="session.resume", session_id=session_id, resume_token=token)
            refused = await receive(ws)
            assert refused["type"] == "error"
            assert refused["code"] == ErrorCode.INVALID_SESSION_RESUME

        resume = f"{url}{SPEAKER_PATH}?resume={session_id}&last_received_server_event_seq=1"
        async with connect(resume, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            resumed = await receive(ws)
            assert resumed["type"] == "session.resumed"
            assert resumed["last_received_client_event_seq"] == 1
            replayed = await receive(ws)
            assert (replayed["type"], replayed["server_event_seq"]) == (
                "response.output_text.delta",
                2,
            )
            await send(ws, type="input.text.append", text="b", client_event_seq=2)
            note = await receive(ws)
            assert (note["n"], note["server_event_seq"]) == (2, 3)  # the same shaper


async def test_a_native_session_does_not_resume_on_the_other_path() -> None:
    async with serving() as (url, _):
        async with connect(f"{url}/v1/duplex") as ws:
            await send(ws, type="session.update", session={})
            created = await receive(ws)
        resume = f"{url}{SPEAKER_PATH}?resume={created['session_id']}"
        bearer = {"Authorization": f"Bearer {created['resume_token']}"}
        async with connect(resume, additional_headers=bearer) as ws:
            refused = await receive(ws)
            assert (refused["type"], refused["code"]) == (
                "error",
                ErrorCode.INVALID_SESSION_RESUME,
            )
            with pytest.raises(ConnectionClosed):
                await ws.recv()


async def test_a_bad_opening_query_is_an_error_then_a_close() -> None:
    async with serving() as (url, server):
        async with connect(f"{url}{SPEAKER_PATH}?resume=x&last_received_server_event_seq=z") as ws:
            refused = await receive(ws)
            assert refused["type"] == "error"
            assert refused["param"] == "last_received_server_event_seq"
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        assert server.sessions.slots_held == 0


@pytest.mark.parametrize("path", ["", "/v1/other"])
async def test_realtime_path_names_the_openai_endpoint_or_none(path: str) -> None:
    if path:
        pytest.importorskip("trio_duplex.dialects.openai")
    config = ServerConfig(port=0, realtime_path=path)
    async with serving(config) as (url, server):
        assert set(server.door.dialects) == ({path} if path else set()) | {SPEAKER_PATH}
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"{url}/v1/realtime"):
                pass
        assert refused.value.response.status_code == 404


def test_native_neither_speaks_first_nor_shapes() -> None:
    dialect: Dialect = NATIVE
    assert dialect.speaks_first is False
    assert dialect.opening({"model": ["x"]}, "key") is None
    assert dialect.shaper({}) is None
    assert dialect.restore_shaper({}, {}) is None
    with pytest.raises(ValueError, match="no shaper state"):
        dialect.restore_shaper({}, {"notes": 1})


def test_the_router_gives_each_path_its_dialect_and_a_relay_the_one_it_names() -> None:
    from websockets.datastructures import Headers
    from websockets.http11 import Request

    from trio_duplex.core.opening import OPEN, Grant
    from trio_duplex.dialects.openai import OPENAI
    from trio_duplex.server.front.router import DIALECT_HEADER, Answer, Router, Upgrade

    relayed = Grant(None, resume_of="s", relayed=True)
    router = Router(
        "/v1/duplex",
        dialects={SPEAKER_PATH: SPEAKER},
        relay=("/relay", lambda request: (relayed, {})),
    )

    def route(path: str, *headers: tuple[str, str]) -> Answer | Upgrade:
        request = Request(path, Headers([("Host", "example.com"), *headers]))
        return router.route(request, urlsplit(path), None)

    assert route("/v1/duplex") == Upgrade(OPEN, dialect=NATIVE)
    assert route(SPEAKER_PATH + "?model=x") == Upgrade(OPEN, dialect=SPEAKER)
    assert route("/v1/elsewhere") == Upgrade(OPEN, ours=False)
    assert route("/relay") == Upgrade(relayed, dialect=NATIVE)  # (a node before dialects)
    assert route("/relay", (DIALECT_HEADER, "openai")) == Upgrade(relayed, dialect=OPENAI)
    for bad in ([(DIALECT_HEADER, "klingon")], [(DIALECT_HEADER, "openai")] * 2):
        refused = route("/relay", *bad)
        assert isinstance(refused, Answer)
        assert (refused.raw or b"").startswith(b"HTTP/1.1 400")
