"""The client on protocol v2's binary audio lane, against the real server in memory."""

from __future__ import annotations

import base64
import random
import struct

import pytest
import trio

from trio_duplex.client import audio_bytes
from trio_duplex.core.events import EventType

from .helpers import Engines, client_for, next_of, sim_server

BINARY = {"audio": {"wire": "binary"}}


def chunk(n: int) -> bytes:
    """20 ms of 24 kHz PCM16 that says which chunk it is."""
    return struct.pack("<480h", *([n] * 480))


@pytest.mark.parametrize("wire", ["binary", "json"])
async def test_send_audio_goes_on_the_sessions_lane(
    autojump_clock: trio.abc.Clock, wire: str
) -> None:
    engines = Engines()
    async with sim_server(engines=engines) as (_sim, net):
        async with client_for(net, session={"audio": {"wire": wire}}) as session:
            assert session.config["audio"]["wire"] == wire
            assert session.state.audio_wire == wire
            assert await session.send_audio(chunk(1)) == 1
            echoed = await next_of(session, "response.output_audio.delta")
            if wire == "binary":
                assert echoed["audio"] == chunk(1)  # raw bytes, from a binary message
            else:
                assert echoed["audio"] == base64.b64encode(chunk(1)).decode()
            assert audio_bytes(echoed) == chunk(1)
    (engine,) = engines.made
    assert engine.received[0]["audio"] == chunk(1)  # the engine sees PCM16 bytes


@pytest.mark.parametrize("seed", range(8))
async def test_binary_audio_is_exactly_once_in_order_across_cuts(
    autojump_clock: trio.abc.Clock, seed: int
) -> None:
    rng = random.Random(seed)
    engines = Engines()
    count = 80
    async with sim_server(engines=engines) as (_sim, net):
        async with client_for(net, session=BINARY, rng=random.Random(seed)) as session:

            async def chaos() -> None:
                for _ in range(5):
                    await trio.sleep(rng.uniform(0, 0.5))
                    await net.streams[-1].cut()

            async def sender() -> None:
                for n in range(count):
                    await session.send_audio(chunk(n))
                    await trio.sleep(0.02)

            got: list[bytes] = []
            seqs: list[int] = []
            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(chaos)
                    nursery.start_soon(sender)
                    while len(got) < count:
                        event = await next_of(session, EventType.OUTPUT_AUDIO_DELTA)
                        got.append(event["audio"])
                        seqs.append(event["server_event_seq"])
    assert got == [chunk(n) for n in range(count)]
    assert seqs == list(range(1, count + 1))
    (engine,) = engines.made
    assert [e["audio"] for e in engine.received] == [chunk(n) for n in range(count)]
    assert [e["client_event_seq"] for e in engine.received] == list(range(1, count + 1))
