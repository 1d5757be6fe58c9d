"""A second dialect, defined here, carries whole sessions through the real server.

``Slashed`` spells every event differently from the native dialect: ``kind`` for
``type``, ``/`` for ``.`` in names, ``n`` for ``server_event_seq``, output audio as
base64 ``delta``, errors nested as ``{kind: error, error: {code, message}}``, and no
binary lane. If the server knew any spelling beyond ``Dialect``, a session spoken this
way would break somewhere: open, text and audio echo, refusals, heartbeats, a resume
with its replay, and the end.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Generator, Mapping
from typing import Any

import pytest
from trio.testing import MockClock

from trio_duplex.core.events import ErrorCode
from trio_duplex.core.limits import Limits
from trio_duplex.core.session import Registry
from trio_duplex.core.spelling import Frame
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE, Dialect
from trio_duplex.dialects.jsonwire import decode_object, encode
from trio_duplex.testing import SimClient, Simulation, running_server

Event = dict[str, Any]


class Slashed:
    """A toy dialect: the core's vocabulary respelled (see the module's docstring)."""

    name = "slashed"
    subprotocol: str | None = "slashed"
    large = 1 << 30
    binary_lane = False
    replays_audio = True
    audio_by_transport = False
    resumes_from_ack = False
    config_locked_closes = True

    def decode(self, message: str | bytes, /) -> Event:
        if not isinstance(message, str):
            raise ProtocolError(ErrorCode.BAD_EVENT, "slashed: text only")
        event = decode_object(message)
        kind = event.pop("kind", None)
        if not isinstance(kind, str):
            raise ProtocolError(ErrorCode.BAD_EVENT, "slashed: an event needs a kind")
        event["type"] = kind.replace("/", ".")
        return event

    def decode_steps(self, message: str | bytes, /) -> Generator[None, None, Event]:
        yield
        return self.decode(message)

    def decode_binary(self, data: bytes, /) -> Event:
        raise ProtocolError(ErrorCode.BAD_EVENT, "slashed: no binary lane")

    def frame(self, event: Event, /) -> Frame:
        out = {("n" if key == "server_event_seq" else key): value for key, value in event.items()}
        out["kind"] = str(out.pop("type")).replace(".", "/")
        if out["kind"] == "error":
            out = {
                "kind": "error",
                "error": {"code": out.pop("code"), "message": out.pop("message")},
                **{k: v for k, v in out.items() if k != "kind"},
            }
        return encode(out)

    def audio_frame(self, seq: int, payload: bytes, fields: Event | None, /) -> Frame:
        assert fields is not None, "a session without a binary lane gets no binary audio"
        delta = {k: v for k, v in fields.items() if k != "audio"}
        delta["delta"] = base64.b64encode(payload).decode("ascii")
        delta["server_event_seq"] = seq
        return self.frame(delta)

    speaks_first = False

    def opening(self, query: Mapping[str, list[str]], bearer: str | None, /) -> None:
        return None

    def shaper(self, config: Event, /) -> None:
        return None

    def restore_shaper(self, config: Event, state: Event, /) -> None:
        return None


SLASHED: Dialect = Slashed()
"""Typed as the interface: mypy checks that the toy implements all of it."""


async def send(client: SimClient, kind: str, **fields: Any) -> None:
    await client.send_raw(json.dumps({"kind": kind, **fields}))


async def receive(client: SimClient) -> Event:
    message = await client.ws.get_message()
    assert isinstance(message, str), "the slashed dialect has no binary messages"
    event: Event = json.loads(message)
    assert "type" not in event, f"a native spelling leaked out: {event}"
    return event


async def open_slashed(sim: Simulation) -> tuple[SimClient, Event]:
    sim.server.door.dialects[sim.server.config.path] = SLASHED
    client = await sim.connect()
    await send(client, "session/update", session={})
    created = await receive(client)
    assert created["kind"] == "session/created", created
    return client, created


def pcm(samples: int) -> bytes:
    return struct.pack(f"<{samples}h", *range(samples))


async def test_a_session_speaks_the_second_dialect_both_ways(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client, created = await open_slashed(sim)
        assert isinstance(created["session_id"], str)

        await send(client, "input/text/append", text="hello", client_event_seq=1)
        echo = await receive(client)
        assert echo["kind"] == "response/output_text/delta"
        assert echo["text"] == "hello"
        assert echo["n"] == 1

        audio = pcm(480)  # 20 ms of 24 kHz PCM16, the session's default format
        b64 = base64.b64encode(audio).decode("ascii")
        await send(client, "input_audio_buffer/append", audio=b64, client_event_seq=2)
        delta = await receive(client)
        assert delta["kind"] == "response/output_audio/delta"
        assert "audio" not in delta
        assert binascii.a2b_base64(delta["delta"]) == audio
        assert delta["n"] == 2

        await send(client, "session/heartbeat")
        ack = await receive(client)
        assert ack["kind"] == "session/heartbeat_ack"

        await client.send_raw(json.dumps({"type": "input.text.append", "text": "native"}))
        refused = await receive(client)  # the native spelling is not this dialect's
        assert refused["kind"] == "error"
        assert refused["error"]["code"] == ErrorCode.BAD_EVENT

        await send(client, "no/such/event")
        unknown = await receive(client)
        assert unknown["error"]["code"] == ErrorCode.UNKNOWN_EVENT

        await client.send_raw(b"\x01\x00\x00\x00" + bytes(8))
        binary = await receive(client)
        assert binary["error"]["code"] == ErrorCode.BAD_EVENT

        await send(client, "session/close")
        ended = await receive(client)
        assert ended["kind"] == "session/closed"
        assert ended["reason"] == "client_close"


async def test_a_resume_replays_the_journal_in_the_second_dialect(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, created = await open_slashed(sim)
        for seq, text in enumerate(["a", "b", "c"], start=1):
            await send(client, "input/text/append", text=text, client_event_seq=seq)
            assert (await receive(client))["n"] == seq
        await client.aclose()

        again = await sim.connect()
        await send(
            again,
            "session/resume",
            session_id=created["session_id"],
            resume_token=created["resume_token"],
            last_received_server_event_seq=1,
        )
        resumed = await receive(again)
        assert resumed["kind"] == "session/resumed"
        assert resumed["last_received_client_event_seq"] == 3
        replayed = [await receive(again) for _ in range(2)]
        assert [(e["kind"], e["text"], e["n"]) for e in replayed] == [
            ("response/output_text/delta", "b", 2),
            ("response/output_text/delta", "c", 3),
        ]
        await send(again, "input/text/append", text="d", client_event_seq=4)
        assert (await receive(again))["n"] == 4
        await send(again, "session/close")
        assert (await receive(again))["kind"] == "session/closed"


def test_the_core_writes_only_through_the_session_s_spelling() -> None:
    registry = Registry(Limits(), spelling=NATIVE)
    session, token = registry.admit({}, spelling=SLASHED)
    created = json.loads(registry.created_frame(session, token))
    assert created["kind"] == "session/created"
    emitted = session.emit({"type": "response.output_text.delta", "text": "x"}, 1.0)
    assert emitted is not None
    assert json.loads(emitted.frame) == {"kind": "response/output_text/delta", "text": "x", "n": 1}
    audio = session.emit_audio(b"\x01\x02", 1.0, {"type": "response.output_audio.delta"})
    assert audio is not None
    assert json.loads(audio.frame)["delta"] == "AQI="
    assert session.journal.bytes == len(emitted.frame) + len(audio.frame)
    assert json.loads(session.resync_frame("journal_gap", 1))["kind"] == "session/resync_required"
    assert json.loads(session.consumed(2) or "")["kind"] == "input/consumed"


@pytest.mark.parametrize("message", ["{}", '{"kind": 1}', "[]", "nope"])
def test_the_toy_refuses_what_it_cannot_read(message: str) -> None:
    with pytest.raises(ProtocolError):
        SLASHED.decode(message)
