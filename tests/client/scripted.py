"""A scripted WebSocket server in memory for the client's tests (trio-websocket on
``trio_duplex.testing``'s ``MemoryListener``): each connection runs a script, for the
answers a correct server never gives or gives only in a race; ``receive_json`` and
``send_json`` are what a script reads and writes."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio
from trio_websocket import ConnectionClosed as WsClosed
from trio_websocket import WebSocketConnection, WebSocketRequest, WebSocketServer

from trio_duplex.testing import MemoryListener

from .helpers import Event

Script = Callable[[WebSocketConnection, int], Awaitable[None]]
StreamOpener = Callable[[], Awaitable[trio.abc.Stream]]


@asynccontextmanager
async def scripted_server(
    script: Script, subprotocol: Callable[[WebSocketRequest], str | None] | None = None
) -> AsyncIterator[StreamOpener]:
    """A WebSocket server in memory that runs ``script(ws, n)`` for its n-th connection,
    accepting each upgrade with the subprotocol ``subprotocol(request)`` chooses."""
    listener = MemoryListener.create()
    counter = itertools.count()

    async def handler(request: WebSocketRequest) -> None:
        chosen = subprotocol(request) if subprotocol is not None else None
        ws = await request.accept(subprotocol=chosen)
        with contextlib.suppress(WsClosed):
            await script(ws, next(counter))

    server = WebSocketServer(handler, [listener])  # type: ignore[list-item]
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)

        async def open_stream() -> trio.abc.Stream:
            client, _ = await listener.connect()
            return client

        yield open_stream
        nursery.cancel_scope.cancel()


async def receive_json(ws: WebSocketConnection) -> Event:
    result: Event = json.loads(await ws.get_message())
    return result


async def send_json(ws: WebSocketConnection, *events: Event) -> None:
    for event in events:
        await ws.send_message(json.dumps(event))
