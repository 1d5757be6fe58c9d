"""``SimClient``: a WebSocket client of the simulated server that speaks JSON events."""

from __future__ import annotations

import json

import attrs
from trio_websocket import ConnectionClosed, WebSocketConnection

from ..core.events import EventType
from ..dialects import binary
from ..engines.api import Event
from .transport import FaultyStream


@attrs.define(eq=False)
class SimClient:
    """A WebSocket client of the simulated server that speaks JSON events."""

    ws: WebSocketConnection
    transport: FaultyStream
    """The server side of this connection: inject faults here."""

    async def send(self, event: Event) -> None:
        await self.ws.send_message(json.dumps(event))

    async def send_raw(self, message: str | bytes) -> None:
        await self.ws.send_message(message)

    async def receive(self) -> Event:
        """The next event. A binary message (protocol v2's audio lane) comes as the
        ``response.output_audio.delta`` it stands for, its ``audio`` the raw payload
        (``bytes``), plus ``"binary": True``."""
        message = await self.ws.get_message()
        if isinstance(message, bytes):
            kind, seq, payload = binary.parse(message)
            assert kind == binary.OUTPUT_AUDIO, f"a server sent binary kind {kind}"
            return {
                "type": EventType.OUTPUT_AUDIO_DELTA,
                "audio": payload,
                "server_event_seq": seq,
                "binary": True,
            }
        result: Event = json.loads(message)
        return result

    async def send_audio(self, payload: bytes, seq: int = 0) -> None:
        """Send input audio on the binary lane (kind 1), with ``client_event_seq`` ``seq``."""
        await self.ws.send_message(binary.input_message(seq, payload))

    async def send_and_receive(self, event: Event) -> Event:
        await self.send(event)
        return await self.receive()

    async def receive_until_closed(self) -> list[Event]:
        """Every event until the server closes; see ``close_code`` afterwards."""
        events = []
        try:
            while True:
                events.append(await self.receive())
        except ConnectionClosed:
            return events

    @property
    def close_code(self) -> int | None:
        reason = self.ws.closed
        return None if reason is None else reason.code

    async def aclose(self, code: int = 1000) -> None:
        await self.ws.aclose(code)
