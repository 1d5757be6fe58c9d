"""``connect(dialect="openai")`` against the real server's ``/v1/realtime`` in memory and
in virtual time (``sim_server``), cut at seeded random points as
test_session_sim.py's chaos test cuts ``/v1/duplex``: every client event reaches the
engine once and in order, every journaled server event reaches the application once
and in order, across resumes by the upgrade's query.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import pytest
import trio

from trio_duplex import ServerConfig
from trio_duplex.client import ClientSession, ResumeRefused, SessionReplaced, connect
from trio_duplex.client.dialect import text_of
from trio_duplex.engines.api import Engine, EngineSession

from .helpers import FAST, Event, Net, sim_server

URL = "ws://sim/v1/realtime?model=test-model"
CONFIG = {"instructions": "repeat after me", "output_modalities": ["text"]}


class TurnEngine(Engine):
    """Answers each user text item, once ``response.create`` asks, with one text
    response in the canonical vocabulary (the dialect's shaper expands it); keeps every
    event it took."""

    accepts = frozenset({"conversation.item.create", "response.create"})
    audio_rate = 24_000  # (an OpenAI session has audio, pcm16 at 24 kHz by default)

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.received: list[Event] = []
        self.session: EngineSession | None = None
        self._ids = itertools.count(1)

    async def run(self, session: EngineSession) -> None:
        self.session = session
        heard = ""
        async for event in session:
            self.received.append(event)
            if event["type"] == "conversation.item.create":
                heard = event["item"]["content"][0]["text"]
                continue
            await self.respond(heard)

    async def respond(self, text: str) -> None:
        """One text response (also from the test: output the client did not ask for)."""
        assert self.session is not None
        response_id = f"resp_{next(self._ids)}"
        await self.session.send({"type": "response.created", "response_id": response_id})
        delta = {"type": "response.output_text.delta", "response_id": response_id, "text": text}
        await self.session.send(delta)
        await self.session.send({"type": "response.done", "response_id": response_id})


@attrs.define
class Engines:
    made: list[TurnEngine] = attrs.field(factory=list)

    def __call__(self, config: Mapping[str, Any]) -> TurnEngine:
        self.made.append(TurnEngine(config))
        return self.made[-1]


def turn(text: str) -> list[Event]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]


async def answers(session: ClientSession, count: int, seen: list[Event]) -> list[str]:
    """The text of the next ``count`` responses (their deltas); every event goes to
    ``seen``."""
    got: list[str] = []
    async for event in session:
        seen.append(event)
        if (text := text_of(event)) is not None:
            got.append(text)
            if len(got) == count:
                break
    return got


def client(net: Net, rng: random.Random) -> Any:
    return connect(
        URL, CONFIG, options=FAST, open_stream=net.open_stream, rng=rng, dialect="openai"
    )


async def test_open_a_turn_and_close(autojump_clock: trio.abc.Clock) -> None:
    engines = Engines()
    async with sim_server(engines=engines) as (sim, net):
        async with client(net, random.Random(0)) as session:
            assert session.config["type"] == "realtime"  # OpenAI's session object
            for event in turn("hello"):
                await session.send(event)
            seen: list[Event] = []
            assert await answers(session, 1, seen) == ["hello"]
            kinds = [e["type"] for e in seen]
            assert kinds[0] == "session.updated" and "response.created" in kinds
            assert all(e["event_id"] == f"event_{e['server_event_seq']}" for e in seen)
            assert session.config["instructions"] == "repeat after me"  # as updated
            await session.aclose()
            assert [e["type"] async for e in session][-1] == "session.closed"
        assert sim.server.slots_held == 0


@pytest.mark.parametrize("seed", range(12))
async def test_random_faults_every_event_exactly_once(
    autojump_clock: trio.abc.Clock, seed: int
) -> None:
    rng = random.Random(seed)
    engines = Engines()
    sent = [f"m{i}" for i in range(30)]
    seen: list[Event] = []
    async with sim_server(engines=engines) as (sim, net):
        async with client(net, random.Random(seed)) as session:

            async def sender() -> None:
                for value in sent:
                    for event in turn(value):
                        await session.send(event)
                    await trio.sleep(rng.uniform(0, 0.03))

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(net.chaos, rng)
                    nursery.start_soon(sender)
                    got = await answers(session, len(sent), seen)
        assert got == sent
        seqs = [e["server_event_seq"] for e in seen if "server_event_seq" in e]
        assert seqs == list(range(1, len(seqs) + 1))  # none lost, none twice, in order
        assert session.generation > 1  # (it was cut)
        (engine,) = engines.made  # one session, never reopened
        texts = [
            e["item"]["content"][0]["text"]
            for e in engine.received
            if e["type"] == "conversation.item.create"
        ]
        assert texts == sent
        # The configuration was event 1 (answered by the session); the turns follow it.
        assert [e["client_event_seq"] for e in engine.received] == list(range(2, 62))
        assert sim.server.slots_held == 0


async def test_a_resume_after_the_grace_is_refused(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(disconnect_grace_s=2), engines=Engines()) as (_, net):
        async with client(net, random.Random(0)) as session:
            await net.outage(5)
            with pytest.raises(ResumeRefused) as caught:
                async for _ in session:
                    pass
            assert caught.value.code == "session_resume_expired"


@pytest.mark.parametrize("seed", range(4))
async def test_binary_lane_audio_turns_exactly_once_across_cuts(
    autojump_clock: trio.abc.Clock, seed: int
) -> None:
    """Our binary lane as an OpenAI extension (``session.audio.wire: "binary"``): input
    audio goes as binary messages once the server has granted the lane, output audio
    comes as binary ``delta``; the echo engine answers each committed turn with its
    audio, whole, once, through cuts."""
    rng = random.Random(seed)
    turns = [bytes([i]) * 960 * (1 + i % 3) for i in range(12)]
    replies: list[bytes] = []
    async with sim_server() as (_sim, net):
        config = {"audio": {"wire": "binary"}}
        async with connect(
            URL, config, options=FAST, open_stream=net.open_stream, rng=rng, dialect="openai"
        ) as session:
            async for event in session:
                if event["type"] == "session.updated":
                    break
            assert session.state.audio_wire == "binary"  # granted: the lane is open

            async def chaos() -> None:
                for _ in range(4):
                    await trio.sleep(rng.uniform(0, 0.3))
                    await net.cut()

            async def sender() -> None:
                for audio in turns:
                    await session.send_audio(audio)
                    await session.send({"type": "input_audio_buffer.commit"})
                    await session.send({"type": "response.create"})
                    await trio.sleep(rng.uniform(0, 0.05))

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(chaos)
                    nursery.start_soon(sender)
                    pending = b""
                    async for event in session:
                        if event["type"] == "response.output_audio.delta":
                            assert isinstance(event["delta"], bytes)  # the binary lane
                            pending += event["delta"]
                        elif event["type"] == "response.done":
                            replies.append(pending)
                            pending = b""
                            if len(replies) == len(turns):
                                break
            assert session.generation > 1
    assert replies == turns


async def test_a_debug_log_of_a_resume_shows_no_token(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The resume token is the bearer credential of the upgrade on /v1/realtime (the URL
    holds only the session id and a seq): websockets' DEBUG header lines redact it."""
    caplog.set_level(logging.DEBUG)
    tokens: list[str] = []
    async with sim_server(engines=Engines()) as (_sim, net):
        async with client(net, random.Random(0)) as session:
            tokens.append(session.resume_state().resume_token)
            await net.cut()
            for event in turn("after the cut"):
                await session.send(event)
            assert await answers(session, 1, []) == ["after the cut"]
            tokens.append(session.resume_state().resume_token)
    assert session.generation == 2 and "resume=" in caplog.text  # the resume was logged
    assert "<redacted>" in caplog.text
    for token in tokens:
        assert token not in caplog.text


async def test_a_takeover_ends_the_older_client(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(engines=Engines()) as (_sim, net):
        async with client(net, random.Random(0)) as first:
            resume = first.resume_state()
            async with connect(
                URL, resume=resume, options=FAST, open_stream=net.open_stream, dialect="openai"
            ) as second:
                replaced = [e async for e in _until(first, "session.replaced")][-1]
                assert replaced["attachment_generation"] == 2 and "event_id" in replaced
                with pytest.raises(SessionReplaced):
                    await first.receive()
                for event in turn("mine now"):
                    await second.send(event)
                assert await answers(second, 1, []) == ["mine now"]


async def test_a_drain_is_surfaced_as_going_away_then_closed(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with sim_server(ServerConfig(drain_timeout_s=3), engines=Engines()) as (sim, net):
        async with client(net, random.Random(0)) as session:
            sim.server.begin_shutdown()
            kinds = [e["type"] async for e in session if "server_event_seq" not in e]
            assert kinds == ["session.going_away", "session.closed"]


async def test_a_journal_gap_is_surfaced_as_resync_required(
    autojump_clock: trio.abc.Clock,
) -> None:
    engines = Engines()
    async with sim_server(ServerConfig(journal_max_bytes=4000), engines) as (_sim, net):
        async with client(net, random.Random(0)) as session:
            seen: list[Event] = []
            async for event in session:  # the configuration's answer
                seen.append(event)
                if event["type"] == "session.updated":
                    break
            net.down = True
            await net.cut()
            for i in range(10):
                await engines.made[0].respond(f"lost {i:02}")
            net.down = False
            resync = [e async for e in _until(session, "session.resync_required")][-1]
            assert resync["reason"] == "journal_gap" and "event_id" in resync
            dropped = resync["dropped_through_seq"]
            assert dropped > seen[-1]["server_event_seq"]
            later = await answers(session, 1, seen)
            assert later[0].startswith("lost ") and later[0] != "lost 00"
            after = [e for e in seen if e.get("server_event_seq", 0) > dropped]
            seqs = [e["server_event_seq"] for e in after]
            assert seqs == list(range(dropped + 1, dropped + 1 + len(seqs)))  # the rest, whole


async def _until(session: ClientSession, kind: str) -> AsyncIterator[Event]:
    async for event in session:
        yield event
        if event["type"] == kind:
            return
