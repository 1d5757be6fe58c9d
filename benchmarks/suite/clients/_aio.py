"""What the `websockets` (asyncio) load generators share: a log line, a connection as
they all open it, a session opened and closed, and one JSON event read."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._workload import SESSION_CLOSE, SESSION_UPDATE

Event = dict[str, Any]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def dial(url: str, max_queue: int = 64) -> ClientConnection:
    return await connect(
        url,
        compression=None,
        max_size=None,
        ping_interval=None,  # the server pings; an idle client costs nothing on its own
        open_timeout=30,
        close_timeout=2,
        max_queue=max_queue,
    )


async def recv_event(ws: ClientConnection) -> Event:
    """The next JSON event, skipping protocol v2's flow reports (``input.consumed``)."""
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            raise RuntimeError("unexpected binary message")
        event: Event = json.loads(message)
        if event["type"] != "input.consumed":
            return event


async def open_session(ws: ClientConnection, update: str = SESSION_UPDATE) -> Event:
    await ws.send(update)
    created = await recv_event(ws)
    if created.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {created}")
    return created


async def close_session(ws: ClientConnection) -> None:
    """``session.close``, then its answer (binary audio still arriving is skipped), then
    the close; within 3 s, else the connection is aborted."""
    try:
        async with asyncio.timeout(3):
            await ws.send(SESSION_CLOSE)
            while True:
                message = await ws.recv()
                if isinstance(message, str) and json.loads(message).get("type") in (
                    "session.closed",
                    "error",
                ):
                    break
            await ws.close()
    except (TimeoutError, ConnectionClosed):
        ws.transport.abort()
