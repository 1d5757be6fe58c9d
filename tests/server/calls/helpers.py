"""The call shell's tests' harness: a real server in memory (``running_server``), whose
``Opener.serve`` serves each call over a ``CallChannel`` on a fake media link
(``trio_duplex.testing.media``); the test plays the worker and the client behind it.

The calls speak ``CALL``: the OpenAI dialect with a call's audio (PCM16 at 48 kHz in on
the binary lane, Opus at 48 kHz out), standing in for ``openai-call`` (dialects/openai/
call.py, being written beside this) for the shell's tests.
"""

from __future__ import annotations

import math
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from trio_duplex.core.opening import OPEN, Grant
from trio_duplex.dialects.openai.call import OPENAI_CALL
from trio_duplex.engines.api import EngineFactory
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.calls.channel import CallChannel
from trio_duplex.server.config import ServerConfig
from trio_duplex.server.sessions.connection import Connection
from trio_duplex.server.sessions.websocket import ConnectionClosed
from trio_duplex.testing import Simulation, running_server
from trio_duplex.testing.media import FakeCall, FakeMediaLink

MIC_20_MS = 1920
"""Bytes of 20 ms of the worker's microphone audio (PCM16, 48 kHz, mono)."""


CALL = OPENAI_CALL  # (the dialect a call's session speaks)


def tone(chunks: int, seed: int = 1) -> list[bytes]:
    """``chunks`` chunks of 20 ms of a loud 48 kHz tone, as the worker sends the microphone."""
    out = []
    for c in range(chunks):
        samples = [
            int(12000 * math.sin(2 * math.pi * 440 * seed * (c * 960 + i) / 48000))
            for i in range(960)
        ]
        out.append(struct.pack("<960h", *samples))
    return out


@attrs.define(eq=False)
class Calls:
    sim: Simulation
    link: FakeMediaLink

    @property
    def config(self) -> ServerConfig:
        return self.sim.server.config

    def channel(self, **bounds: Any) -> tuple[CallChannel, FakeCall]:
        """A new call's channel (its data channel not open yet) and its fake call."""
        config = self.config
        bounds.setdefault("write_timeout", config.write_timeout_s)
        bounds.setdefault("close_timeout", self.sim.server.close_timeout_s)
        channel = CallChannel(
            self.link.open, config.first_message_bytes, peer="127.0.0.1", **bounds
        )
        return channel, self.link.last

    async def serve(
        self,
        channel: CallChannel,
        query: dict[str, list[str]] | None = None,
        bearer: str | None = None,
        grant: Grant = OPEN,
    ) -> dict[str, Any]:
        """What part C's door does once the data channel is open: ``Opener.serve`` on
        the channel; the first data-channel text the client gets."""
        call = self.link.calls[channel.port.call]
        call.dc_open()
        await channel.wait_open()
        self.sim.nursery.start_soon(self._serve, channel, query or {}, grant, bearer)
        return await call.next_event()

    async def _serve(
        self,
        channel: CallChannel,
        query: dict[str, list[str]],
        grant: Grant,
        bearer: str | None,
    ) -> None:
        # As the door's task does for a WebSocket (front/accept.py): the peer's end
        # raises out of ``serve``, and ends the call's task quietly.
        try:
            await self.sim.server.opener.serve(channel, query, grant, CALL, bearer)
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def open(self, **bounds: Any) -> tuple[CallChannel, FakeCall, dict[str, Any]]:
        """A call with its session open: its channel, fake call and ``session.created``."""
        channel, call = self.channel(**bounds)
        created = await self.serve(channel)
        assert created["type"] == "session.created", created
        return channel, call, created

    def connection(self, channel: CallChannel) -> Connection:
        (conn,) = [c for c in self.sim.server.connections if c.ws is channel]
        return conn


@asynccontextmanager
async def calls(engine_factory: EngineFactory = EchoEngine, **config: Any) -> AsyncIterator[Calls]:
    async with running_server(ServerConfig(**config), engine_factory, fail_after_s=3600) as sim:
        link = FakeMediaLink()
        await sim.nursery.start(link.run)
        yield Calls(sim, link)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()
