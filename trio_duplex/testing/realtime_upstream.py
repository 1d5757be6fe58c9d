"""A fake OpenAI Realtime endpoint: the upstream of the ``realtime-proxy`` engine in tests
and in ``benchmarks/probes/realtime_proxy.py``.

It implements the subset of the OpenAI Realtime WebSocket protocol (GA event names) that
the proxy relies on, as that protocol's public reference describes it:

- the API key in ``Authorization: Bearer KEY``; a wrong or missing one gets HTTP 401, and
  ``refuse_status`` makes every upgrade get that status (429: out of capacity);
- ``session.created`` on connect; ``session.update {session}`` → ``session.updated``;
- ``input_audio_buffer.append {audio}`` (base64 of 24 kHz mono PCM16) accumulates;
  ``input_audio_buffer.commit`` → ``input_audio_buffer.committed {item_id}`` (an empty
  buffer: ``error`` ``input_audio_buffer_commit_empty``);
- ``response.create`` → ``response.created``, then the audio committed last (or
  ``frames`` frames of a ramp if none) as ``response.output_audio.delta {response_id,
  item_id, output_index, content_index, delta}`` of ``frame_bytes`` each, then
  ``response.output_audio.done`` and ``response.done {response: {status: "completed"}}``.
  With ``hold``, a response sends its deltas and then waits for a cancel; with
  ``close_after``, the connection is closed (cleanly) after that many responses;
  ``connections`` holds each connection, for a test to send what it likes;
- ``response.cancel`` → ``response.done {response: {status: "cancelled"}}`` (nothing in
  progress: ``error`` ``response_cancel_not_active``);
- ``conversation.item.truncate {item_id, content_index, audio_end_ms}`` → recorded in
  ``truncations`` and answered ``conversation.item.truncated``;
- anything else, or invalid JSON or base64: ``error {error: {type, code, message}}``.

Everything it received is in ``received`` (per connection, in order), everything it sent
in ``sent``; ``changed`` wakes whoever waits for either. ``kill()`` drops every
connection (the proxy's upstream is lost).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from collections.abc import Callable
from typing import Any

import attrs
import trio
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.trio.server import ServerConnection, serve

Event = dict[str, Any]
FRAME_BYTES = 960  # 20 ms of 24 kHz PCM16


@attrs.define(eq=False)
class FakeRealtime:
    """The fake upstream. Start it with ``port = await nursery.start(upstream.run)``."""

    api_key: str | None = None
    frames: int = 5
    frame_bytes: int = FRAME_BYTES
    hold: bool = False
    refuse_status: int | None = None
    close_after: int | None = None
    """Close each connection (a clean close) once it has finished that many responses."""
    closed: int = 0
    """Connections that have ended."""
    received: list[list[Event]] = attrs.field(factory=list)
    sent: list[list[Event]] = attrs.field(factory=list)
    truncations: list[Event] = attrs.field(factory=list)
    headers: list[Headers] = attrs.field(factory=list)
    connections: list[ServerConnection] = attrs.field(factory=list)
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                server = await nursery.start(
                    lambda task_status: serve(
                        self._handle,
                        0,
                        host="127.0.0.1",
                        compression=None,
                        process_request=self._check,
                        max_size=None,
                        task_status=task_status,
                    )
                )
                task_status.started(server.listeners[0].socket.getsockname()[1])

    def kill(self) -> None:
        """Drop every connection and stop listening."""
        self._scope.cancel()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._changed.park()

    def _check(self, conn: ServerConnection, request: Request) -> Response | None:
        self.headers.append(request.headers)
        if self.refuse_status is not None:
            return conn.respond(self.refuse_status, "no capacity\n")
        if self.api_key is not None:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return conn.respond(401, "bad API key\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        received: list[Event] = []
        sent: list[Event] = []
        self.received.append(received)
        self.sent.append(sent)
        self.connections.append(ws)
        conn = _Conversation(self, ws, received, sent)
        try:
            async with trio.open_nursery() as nursery:
                conn.nursery = nursery
                await conn.send({"type": "session.created", "session": {"type": "realtime"}})
                async for message in ws:
                    await conn.handle(message)
                nursery.cancel_scope.cancel()
        except* ConnectionClosed:
            pass  # (from the reader or a response in progress: the proxy went away)
        finally:
            self.closed += 1
            self._changed.unpark_all()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"


@attrs.define(eq=False)
class _Conversation:
    upstream: FakeRealtime
    ws: ServerConnection
    received: list[Event]
    sent: list[Event]
    nursery: trio.Nursery | None = None
    buffer: bytearray = attrs.field(factory=bytearray)
    committed: bytes = b""
    responses: int = 0
    cancelled: trio.Event | None = None
    """Set by ``response.cancel``; None while no response is in progress."""

    async def send(self, event: Event) -> None:
        event.setdefault("event_id", self.upstream.next_id("event"))
        self.sent.append(event)
        self.upstream._changed.unpark_all()
        await self.ws.send(json.dumps(event))

    async def error(self, code: str, message: str, param: str | None = None) -> None:
        error = {"type": "invalid_request_error", "code": code, "message": message}
        await self.send({"type": "error", "error": {**error, "param": param}})

    async def handle(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            await self.error("invalid_json", "the message is not JSON")
            return
        if not isinstance(event, dict):
            await self.error("invalid_json", "an event is a JSON object")
            return
        self.received.append(event)
        self.upstream._changed.unpark_all()
        kind = event.get("type")
        if kind == "session.update" and isinstance(event.get("session"), dict):
            await self.send({"type": "session.updated", "session": event["session"]})
        elif kind == "input_audio_buffer.append":
            try:
                self.buffer += base64.b64decode(event.get("audio", ""), validate=True)
            except (binascii.Error, TypeError):
                await self.error("invalid_value", "audio is not base64", "audio")
        elif kind == "input_audio_buffer.commit":
            if not self.buffer:
                await self.error("input_audio_buffer_commit_empty", "the buffer is empty")
                return
            self.committed, self.buffer = bytes(self.buffer), bytearray()
            item = self.upstream.next_id("item")
            await self.send({"type": "input_audio_buffer.committed", "item_id": item})
        elif kind == "response.create":
            if self.cancelled is not None:
                await self.error("conversation_already_has_active_response", "one at a time")
                return
            assert self.nursery is not None
            self.cancelled = trio.Event()
            await self.nursery.start(self._respond, self.cancelled)
        elif kind == "response.cancel":
            if self.cancelled is None:
                await self.error("response_cancel_not_active", "no response in progress")
                return
            self.cancelled.set()
        elif kind == "conversation.item.truncate":
            self.upstream.truncations.append(event)
            fields = {k: event.get(k) for k in ("item_id", "content_index", "audio_end_ms")}
            await self.send({"type": "conversation.item.truncated", **fields})
        else:
            await self.error("invalid_value", f"unknown or malformed event {kind!r}", "type")

    async def _respond(
        self,
        cancelled: trio.Event,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        upstream = self.upstream
        response, item = upstream.next_id("resp"), upstream.next_id("item")
        ids = {"response_id": response, "item_id": item, "output_index": 0, "content_index": 0}
        task_status.started()
        await self.send({"type": "response.created", "response": {"id": response}})
        audio = self.committed or bytes(i % 251 for i in range(upstream.frames * FRAME_BYTES))
        size = upstream.frame_bytes
        status = "completed"
        for start in range(0, len(audio), size):
            if cancelled.is_set():
                status = "cancelled"
                break
            delta = base64.b64encode(audio[start : start + size]).decode()
            await self.send({"type": "response.output_audio.delta", **ids, "delta": delta})
            await trio.lowlevel.checkpoint()  # a cancel read meanwhile stops it
        if upstream.hold and status == "completed":
            await cancelled.wait()
        if cancelled.is_set():
            status = "cancelled"
        if status == "completed":
            await self.send({"type": "response.output_audio.done", **ids})
        self.cancelled = None
        done = {"id": response, "status": status}
        await self.send({"type": "response.done", "response": done})
        self.responses += 1
        if self.responses == upstream.close_after:
            await self.ws.aclose()


def main(argv: list[str] | None = None) -> None:
    """``python -m trio_duplex.testing.realtime_upstream [--frames N]``: serve on a free
    port of 127.0.0.1 (its URL on stderr) until interrupted; ``benchmarks.realtime_proxy``
    runs it as a process of its own."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--frames", type=int, default=5, help="audio deltas per response")
    parser.add_argument("--api-key", default=None, help="the Bearer key it requires (none)")
    args = parser.parse_args(argv)
    upstream = FakeRealtime(api_key=args.api_key, frames=args.frames)

    async def serve_until_interrupted() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            print(f"fake realtime upstream on ws://127.0.0.1:{port}/v1/realtime", file=sys.stderr)

    try:
        trio.run(serve_until_interrupted)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
