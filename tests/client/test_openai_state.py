"""``SessionState`` speaking the OpenAI dialect (``client/dialect.py``), alone: no I/O, no
clock. The server speaks first (the upgrade opens the session, a resume is the upgrade's
query), ``session.created`` carries a ``resume`` object, the configuration goes out as
the session's first event, errors nest their fields, audio deltas are ``delta``; the
last test drives it against a model server through random cuts (hypothesis).
"""

from __future__ import annotations

import json
import urllib.parse

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.client import (
    AckPolicy,
    HeartbeatPolicy,
    ProtocolViolation,
    ResumeRefused,
    ResumeState,
    ServerRefused,
    SessionState,
    Verdict,
    audio_bytes,
)
from trio_duplex.client.dialect import NATIVE, OPENAI, dialect_named, text_of
from trio_duplex.client.transport import audio_event
from trio_duplex.core import events
from trio_duplex.dialects import openai as server_dialect
from trio_duplex.dialects.binary import output_message

from .helpers import CUT_PLANS, Event, ModelJournal, Wire, resumed

URL = "ws://h:1/v1/realtime?model=gpt-realtime"
SESSION = {"type": "realtime", "object": "realtime.session", "id": "s1", "model": "m"}


def created(**limits: float) -> Event:
    """OpenAI's ``session.created`` of ``s1`` with our ``resume`` object."""
    return {
        "type": "session.created",
        "event_id": "event_x1",
        "session": SESSION,
        "resume": {
            "session_id": "s1",
            "resume_token": "secret-1",
            "attachment_generation": 1,
            "limits": {"idle_ttl_s": 300, "journal_max_bytes": 8 << 20, **limits},
        },
    }


def error(code: str, *, seq: int | None = None, **fields: object) -> Event:
    """OpenAI's ``error``: our fields nested in ``error``."""
    nested: Event = {
        "type": "invalid_request_error",
        "code": code,
        "message": code,
        "param": None,
        "event_id": None,
        **fields,
    }
    if seq is not None:
        nested["client_event_seq"] = seq
    return {"type": "error", "event_id": "event_x2", "error": nested}


def drain(state: SessionState, now: float = 0.0) -> list[Event]:
    frames = []
    while (frame := state.next_frame(now)) is not None:
        assert isinstance(frame, str)
        frames.append(json.loads(frame))
    return frames


def opened(config: Event | None = None) -> SessionState:
    state = SessionState(config or {}, dialect=OPENAI)
    assert state.opening_url(URL) == URL and state.opening_frame() is None
    state.on_handshake(created(), now=0.0)
    return state


def test_the_server_speaks_first_and_the_configuration_is_the_first_event() -> None:
    config = {"instructions": "be brief", "audio": {"output": {"voice": "alloy"}}}
    state = opened(config)
    assert (state.session_id, state.resume_token, state.generation) == ("s1", "secret-1", 1)
    assert state.limits.idle_ttl_s == 300 and state.config == SESSION
    assert drain(state) == [
        {"type": "session.update", "session": {"type": "realtime", **config}, "client_event_seq": 1}
    ]
    assert state.next_client_seq == 2 and [o.seq for o in state.outbox] == [1]  # until read


def test_without_a_configuration_the_first_frame_is_a_heartbeat() -> None:
    state = opened()
    assert drain(state) == [{"type": "session.heartbeat"}] and state.next_client_seq == 1


def test_a_resume_is_the_upgrades_query_with_no_first_frame() -> None:
    state = SessionState.for_resume(ResumeState("s1", "secret-1", 7), dialect=OPENAI)
    dialled = urllib.parse.urlsplit(state.opening_url(URL + "&resume=old"))
    assert dialled.path == "/v1/realtime"
    assert urllib.parse.parse_qsl(dialled.query) == [
        ("model", "gpt-realtime"),
        ("resume", "s1"),
        ("last_received_server_event_seq", "7"),
    ]
    assert state.opening_frame() is None
    assert state.on_handshake(resumed(0), now=0.0).resumed and state.resume_token == "secret-2"
    assert state.next_client_seq == 1 and drain(state) == []


def test_after_a_cut_exactly_the_unread_events_are_resent() -> None:
    state = opened({"instructions": "x"})
    for value in "ab":
        state.enqueue({"type": "conversation.item.create", "item": {"id": value}})
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2, 3]
    state.on_event({"type": "response.done", "server_event_seq": 4}, 50, 0.0)
    url = state.opening_url(URL)
    assert "resume=s1" in url and "last_received_server_event_seq=4" in url
    state.on_handshake({**resumed(2), "event_id": "event_x3"}, now=1.0)
    assert [f["client_event_seq"] for f in drain(state, 1.0)] == [3]
    assert state.acked_seq == 4  # the resume acked what it claimed


def test_created_without_its_resume_object_is_a_violation() -> None:
    state = SessionState({}, dialect=OPENAI)
    with pytest.raises(ProtocolViolation):
        state.on_handshake({**created(), "resume": None}, now=0.0)
    flat = {"type": "session.created", "session_id": "s1", "resume_token": "t"}
    with pytest.raises(ProtocolViolation):
        SessionState({}, dialect=OPENAI).on_handshake({**flat, "attachment_generation": 1}, 0.0)


def test_a_refused_opening_reads_the_nested_error() -> None:
    with pytest.raises(ServerRefused) as caught:
        SessionState({}, dialect=OPENAI).on_handshake(
            error("server_shutting_down", retryable=True), now=0.0
        )
    assert caught.value.code == "server_shutting_down" and caught.value.retryable
    back = SessionState.for_resume(ResumeState("s1", "t", 0), dialect=OPENAI)
    with pytest.raises(ResumeRefused) as refused:
        back.on_handshake(error("session_resume_expired", retryable=False), now=0.0)
    assert refused.value.code == "session_resume_expired"


def test_a_nested_backpressure_refusal_rewinds_and_a_nested_bad_event_is_delivered() -> None:
    state = opened()
    drain(state)
    for value in "abc":
        state.enqueue({"type": "input_audio_buffer.append", "audio": value})
    assert [f["client_event_seq"] for f in drain(state)] == [1, 2, 3]
    refusal = error("input_backpressure", seq=2, retryable=True)
    assert state.on_event(refusal, 90, 1.0) is Verdict.INTERNAL and state.rewinds == 1
    stale = error("unexpected_client_event_seq", seq=3, expected_client_event_seq=2)
    assert state.on_event(stale, 90, 1.0) is Verdict.INTERNAL  # an answer to before
    assert [f["client_event_seq"] for f in drain(state, 2.0)] == [2, 3]
    assert state.on_event(error("bad_event", seq=3), 90, 2.0) is Verdict.DELIVER
    # Our fields at the top level are not OpenAI's spelling: no refusal of ours.
    flat = {"type": "error", "code": "input_backpressure", "client_event_seq": 3}
    assert state.on_event(flat, 90, 2.0) is Verdict.DELIVER and state.rewinds == 1


def test_session_updated_states_the_whole_configuration() -> None:
    state = opened({"audio": {"wire": "binary"}})
    assert state.audio_wire == "json"  # asked, not yet granted
    whole = {**SESSION, "audio": {"wire": "binary"}}
    updated = {"type": "session.updated", "server_event_seq": 1, "session": whole}
    assert state.on_event(updated, 90, 0.0) is Verdict.DELIVER
    assert state.config == whole and state.audio_wire == "binary"
    assert state.on_event(updated, 90, 0.0) is Verdict.DUPLICATE
    native = SessionState({"voice": "x"})
    native.on_handshake({**created()["resume"], "type": "session.created"}, 0.0)
    native.on_event({**updated, "session": {"voice": "y"}}, 90, 0.0)
    assert native.config == {"voice": "x"}  # natively: the fields an update set, not all


def test_audio_and_text_are_read_in_either_spelling() -> None:
    delta = {"type": "response.output_audio.delta", "delta": "AAEC", "response_id": "r"}
    assert audio_bytes(delta) == b"\x00\x01\x02"
    assert audio_bytes({"type": "input_audio_buffer.append", "audio": "AAEC"}) == b"\0\1\2"
    lane = audio_event(output_message(5, b"\x09"), OPENAI.output_audio_field)
    assert lane == {"type": "response.output_audio.delta", "server_event_seq": 5, "delta": b"\t"}
    assert text_of({"type": "response.output_audio_transcript.delta", "delta": "hi"}) == "hi"
    assert text_of({"type": "response.output_text.delta", "text": "yo"}) == "yo"
    assert text_of({"type": "response.output_audio.delta", "delta": "AAEC"}) is None


def test_the_dialects_spell_a_text_turn_and_an_audio_request() -> None:
    assert NATIVE.text_turn("hi") == [{"type": "input.text.append", "text": "hi"}]
    create, respond = OPENAI.text_turn("hi")
    assert create["item"]["content"] == [{"type": "input_text", "text": "hi"}]
    assert respond == {"type": "response.create"}
    asked = OPENAI.audio_request("binary", "g711_ulaw", None)
    assert asked == {
        "wire": "binary",
        "input": {"format": {"type": "audio/pcmu"}},
        "output": {"format": {"type": "audio/pcmu"}},
    }
    granted = {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}}}}
    assert OPENAI.audio_format(granted, "output") == ("pcm16", 24000)
    assert OPENAI.audio_format({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "output")
    assert NATIVE.audio_format({"audio": {"input": {"format": "opus", "rate": 48000}}}, "input")
    assert dialect_named("openai") is OPENAI
    with pytest.raises(ValueError, match="dialect"):
        dialect_named("klingon")


# -- a model server through random cuts -----------------------------------------------


@attrs.define
class ModelServer(ModelJournal):
    """The OpenAI dialect's server side as far as the client's guarantees go: one reply
    event per client event, nested refusals at random for backpressure, a journal."""

    KIND = "response.done"
    refuse: list[bool] = attrs.field(factory=list)
    client_seq: int = 0
    inputs: list[str] = attrs.field(factory=list)
    refusing_from: int = 0

    def handle(self, frame: str) -> list[str]:
        event = json.loads(frame)
        if event["type"] == "session.heartbeat":
            return [json.dumps({"type": "session.heartbeat_ack", "event_id": "event_x9"})]
        if event["type"] == "session.event_ack":
            self.ack(event["server_event_seq"])
            return []
        seq = event["client_event_seq"]
        if seq <= self.client_seq:
            return []
        if seq > self.client_seq + 1:  # after a refusal: nothing overtakes it
            return [
                json.dumps(
                    error(
                        "unexpected_client_event_seq",
                        seq=seq,
                        expected_client_event_seq=self.client_seq + 1,
                    )
                )
            ]
        if self.refuse and self.refuse.pop():
            return [json.dumps(error("input_backpressure", seq=seq, retryable=True))]
        self.client_seq = seq
        self.inputs.append(json.dumps(event["session"] if seq == 1 else event["item"]))
        return [self.emit()]

    def resume(self, url: str) -> list[str]:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        assert query["resume"] == "s1" and query["model"] == "gpt-realtime"
        replay = self.replay(int(query["last_received_server_event_seq"]))
        return [json.dumps(resumed(self.client_seq)), *replay]


@settings(max_examples=300, deadline=None)
@given(CUT_PLANS, st.lists(st.booleans(), max_size=20))
def test_model_every_event_once_in_order_through_any_cuts(
    plan: list[tuple[str, int]], refuse: list[bool]
) -> None:
    state = SessionState(
        {"instructions": "x"},
        acks=AckPolicy(every_events=2, max_delay=1.0),
        heartbeat=HeartbeatPolicy(interval=5, timeout=100, confirm_every=2),
        dialect=OPENAI,
    )
    server = ModelServer(refuse=refuse)
    assert state.opening_frame() is None
    state.on_handshake(created(), now=0.0)
    sent = [json.dumps({"type": "realtime", "instructions": "x"})]
    wire = Wire(state, server.handle)

    def send() -> None:
        item = {"id": f"m{len(sent)}"}
        sent.append(json.dumps(item))
        state.enqueue({"type": "conversation.item.create", "item": item})

    def resume() -> list[str]:
        answer = server.resume(state.opening_url(URL))
        assert state.opening_frame() is None
        return answer

    wire.run(plan, send=send, emit=server.emit, resume=resume)
    server.refuse.clear()
    wire.settle(tick=2)  # (past any resend backoff)
    assert not wire.up and not wire.down and not state.outbox
    assert server.inputs == sent
    assert wire.delivered == list(range(1, server.head + 1))


# -- against the server's own spelling (trio_duplex.dialects.openai) ----------------------


def test_what_the_servers_dialect_writes_is_what_the_client_reads() -> None:
    limits = {"idle_ttl_s": 60, "journal_max_bytes": 1 << 20, "max_event_bytes": 1 << 16}
    config = server_dialect.to_config({"type": "realtime", "instructions": "x"})
    wrote = server_dialect.OPENAI.frame(events.created("s9", config, "tok-1", 1, limits))
    state = SessionState({"instructions": "x"}, dialect=OPENAI)
    assert isinstance(wrote, str)
    state.on_handshake(json.loads(wrote), now=0.0)
    assert (state.session_id, state.resume_token, state.limits.idle_ttl_s) == ("s9", "tok-1", 60)
    assert state.config["type"] == "realtime" and state.config["instructions"] == "x"
    # Every frame the client writes decodes on the server as the event it meant.
    state.enqueue({"type": "response.create"})
    frames = drain(state)
    decoded = [server_dialect.OPENAI.decode(json.dumps(f)) for f in frames]
    assert [(e["type"], e.get("client_event_seq")) for e in decoded] == [
        ("session.update", 1),
        ("response.create", 2),
    ]
    assert decoded[0]["session"]["instructions"] == "x"
    refusal = events.error("input_backpressure", "full")
    refusal["client_event_seq"] = 2
    written = server_dialect.OPENAI.frame(refusal)
    assert isinstance(written, str)
    assert state.on_event(json.loads(written), len(written), 1.0) is Verdict.INTERNAL
    assert state.rewinds == 1
    back = events.resumed("s9", config, "tok-2", 2, 1, 1)
    url = state.opening_url(URL)
    assert server_dialect.opening(
        urllib.parse.parse_qs(urllib.parse.urlsplit(url).query), "tok-1"
    ) == (events.resume("s9", "tok-1", 0))
    resumed_text = server_dialect.OPENAI.frame(back)
    assert isinstance(resumed_text, str)
    assert state.on_handshake(json.loads(resumed_text), now=2.0).resumed
    assert state.resume_token == "tok-2" and [o.seq for o in state.outbox] == [2]
    assert [f.get("client_event_seq") for f in drain(state, 2.0)] == [2]  # resent
