"""The ``realtime-proxy`` engine on a raw session (the client speaks OpenAI's dialect): the
engine driven through a hand-built ``EngineSession`` against the fake OpenAI upstream on
a real socket, so that what it sends up and what it hands the server are seen exactly.
The same through ``trio-duplex``'s ``/v1/realtime`` is tests/engines/test_realtime_proxy_openai.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from trio_duplex.engines.api import EngineSession, Inbox
from trio_duplex.engines.proxy_wire import openai_format, relayed, upstream_session
from trio_duplex.engines.realtime_proxy import RealtimeProxyEngine, Upstream
from trio_duplex.testing.realtime_upstream import FakeRealtime

Event = dict[str, Any]
ULAW = {"format": "g711_ulaw", "rate": 8000}
PCMU = {"wire": "json", "input": ULAW, "output": ULAW}


@attrs.define
class Rig:
    upstream: FakeRealtime
    inbox: Inbox
    session: EngineSession
    sent: list[Event]
    changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def put(self, event: Event) -> None:
        self.inbox.put_nowait(event)

    async def until(self, kind: str) -> list[Event]:
        while not any(e["type"] == kind for e in self.sent):
            await self.changed.park()
        return self.sent

    async def upstream_got(self, count: int) -> list[Event]:
        await self.upstream.wait_for(lambda: len(self.upstream.received[0]) >= count)
        return self.upstream.received[0]


@asynccontextmanager
async def raw_rig(
    config: Event | None = None, *, raw: bool = True, **fake: Any
) -> AsyncIterator[Rig]:
    upstream = FakeRealtime(**fake)
    config = {"output_modalities": ["audio"], "model": "gpt-realtime", **(config or {})}
    inbox = Inbox(64)
    sent: list[Event] = []
    rig: Rig

    async def emit(event: Event) -> None:
        sent.append(event)
        rig.changed.unpark_all()
        await trio.lowlevel.checkpoint()

    session = EngineSession(
        "sess_raw", config, inbox, emit, dialect="openai" if raw else "native", raw=raw
    )
    rig = Rig(upstream, inbox, session, sent)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            engine = RealtimeProxyEngine(Upstream(f"ws://127.0.0.1:{port}/v1/realtime"), config)
            await engine.prepare(nursery)
            nursery.start_soon(engine.run, session)
            yield rig
            nursery.cancel_scope.cancel()


async def test_upstream_events_keep_their_names_and_fields() -> None:
    async with raw_rig(frames=2) as r:
        r.put({"type": "response.create", "event_id": "evt_client_1", "client_event_seq": 1})
        got = await r.until("response.done")
        upstream_sent = r.upstream.sent[0]
        # Dropped: the upstream's session.created (the client heard the server's own).
        assert [e["type"] for e in got] == [e["type"] for e in upstream_sent[1:]]
        assert [e["type"] for e in got] == [
            "session.updated",
            "response.created",
            "response.output_audio.delta",
            "response.output_audio.delta",
            "response.output_audio.done",
            "response.done",
        ]
        assert not any(e["type"].startswith("upstream.") for e in got)
        for mine, theirs in zip(got[1:], upstream_sent[2:], strict=True):
            assert "event_id" not in mine  # the server gives its own
            theirs = {k: v for k, v in theirs.items() if k != "event_id"}
            if mine["type"] == "response.output_audio.delta":
                # The audio as PCM16 bytes, for the server to encode for the client.
                assert mine.pop("audio") == base64.b64decode(theirs.pop("delta"))
            assert mine == theirs
        up = await r.upstream_got(2)
        # The client's own event, as it sent it (its event_id too), but our seq.
        assert up[1] == {"type": "response.create", "event_id": "evt_client_1"}


async def test_the_upstream_answers_session_update_and_sees_openai_shapes() -> None:
    config = {"instructions": "be brief", "turn_detection": None, "audio": PCMU}
    async with raw_rig(config) as r:
        first = (await r.upstream_got(1))[0]
        assert first == {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "be brief",
                "audio": {"input": {"turn_detection": None}},
            },
        }
        await r.until("session.updated")
        # The upstream's session object, with the client's own audio formats in it.
        updated = r.sent[0]["session"]
        assert updated["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        assert updated["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        r.sent.clear()
        update = {"voice": "marin", "input_audio_transcription": {"model": "whisper-1"}}
        r.put({"type": "session.update", "session": update})
        await r.until("session.updated")
        # One answer, the upstream's: the engine's handle sent none of its own.
        assert [e["type"] for e in r.sent] == ["session.updated"]
        assert r.session.config["voice"] == "marin"  # the configuration is updated all the same
        up = await r.upstream_got(2)
        assert up[1]["session"] == {
            "type": "realtime",
            "audio": {
                "input": {"transcription": {"model": "whisper-1"}},
                "output": {"voice": "marin"},
            },
        }


async def test_an_upstream_error_reaches_the_client_as_an_error() -> None:
    async with raw_rig() as r:
        r.put({"type": "response.cancel", "event_id": "evt_7"})
        got = await r.until("error")
        assert got[-1] == {
            "type": "error",
            "code": "response_cancel_not_active",
            "message": "no response in progress",
            "param": None,
            "event_id": None,
        }


async def test_a_cancel_is_not_followed_by_a_truncate_of_our_own() -> None:
    # OpenAI's clients truncate to what they played; a native client's proxy does it.
    async with raw_rig(frames=3, hold=True) as r:
        r.put({"type": "response.create"})
        while sum(e["type"] == "response.output_audio.delta" for e in r.sent) < 3:
            await r.changed.park()
        r.put({"type": "response.cancel"})
        await r.until("response.done")
        up = await r.upstream_got(3)
        assert [e["type"] for e in up] == ["session.update", "response.create", "response.cancel"]
        assert r.upstream.truncations == []


async def test_a_native_session_keeps_renaming() -> None:
    async with raw_rig(raw=False) as r:
        r.put({"type": "response.cancel"})
        got = await r.until("upstream.error")
        assert [e["type"] for e in got] == [
            "upstream.session.created",
            "upstream.session.updated",
            "upstream.error",
        ]
        first = (await r.upstream_got(1))[0]  # the configuration as it is, model and all
        assert first["session"] == {
            "output_modalities": ["audio"],
            "model": "gpt-realtime",
            "type": "realtime",
        }


def test_upstream_session_nests_what_openai_nests() -> None:
    assert upstream_session(
        {"audio": PCMU, "model": "m", "voice": "ash", "speed": 1.1, "tools": [], "x": 1}
    ) == {
        "type": "realtime",
        "tools": [],
        "x": 1,
        "audio": {"output": {"voice": "ash", "speed": 1.1}},
    }


@pytest.mark.parametrize(
    ("canonical", "openai"),
    [
        ({"format": "pcm16", "rate": 24000}, {"type": "audio/pcm", "rate": 24000}),
        ({"format": "g711_ulaw", "rate": 8000}, {"type": "audio/pcmu"}),
        ({"format": "g711_alaw", "rate": 8000}, {"type": "audio/pcma"}),
        ({"format": "opus", "rate": 48000}, {"type": "audio/opus", "rate": 48000}),
        ({"format": "mp3"}, None),
        ("pcm16", None),
    ],
)
def test_formats(canonical: object, openai: Event | None) -> None:
    assert openai_format(canonical) == openai


def test_our_extension_names_from_the_upstream_are_renamed() -> None:
    for kind in ("session.closed", "session.going_away", "input.consumed"):
        assert relayed({"type": kind, "event_id": "e"}, {}) == {"type": f"upstream.{kind}"}
    assert relayed({"type": "session.created", "session": {}}, {}) is None
    assert relayed({"type": "rate_limits.updated", "rate_limits": []}, {}) == {
        "type": "rate_limits.updated",
        "rate_limits": [],
    }


def test_a_journaled_error_keeps_its_seq_on_openais_wire() -> None:
    # Was: written with an unjournaled event_id and no seq, a hole in the client's seqs.
    from trio_duplex.dialects.openai import OPENAI

    from ..dialects.openai.reference import validate

    upstream = {"type": "error", "error": {"type": "invalid_request_error", "code": "x"}}
    event = {**relayed(upstream, {}), "server_event_seq": 7}  # type: ignore[dict-item]
    frame = OPENAI.frame(event)
    validate(frame)
    assert isinstance(frame, str)
    data = json.loads(frame)
    assert data["event_id"] == "event_7" and data["server_event_seq"] == 7
    assert data["error"] == {
        "type": "invalid_request_error",
        "code": "x",
        "message": "",
        "param": None,
        "event_id": None,
    }
    unjournaled = json.loads(OPENAI.frame({"type": "error", "code": "y", "message": "m"}))
    assert "server_event_seq" not in unjournaled and unjournaled["event_id"].startswith("event_x")
