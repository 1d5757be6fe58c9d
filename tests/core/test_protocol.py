"""The session protocol machine (core/protocol.py) driven directly: what each client event
means on an open session. No trio, no I/O, time as a number: one event in, one
``Decision`` out. (docs/protocol.md, Other client events, Errors, client_event_seq,
input flow control.)"""

from __future__ import annotations

import base64
import json
from typing import Any

import attrs
import pytest

from trio_duplex.core.events import ErrorCode
from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import (
    IGNORE,
    TO_ENGINE,
    Action,
    CheckFailed,
    ClientEvents,
    Decision,
    check_input,
    refusal,
)
from trio_duplex.core.session import Registry, Session, State
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE
from trio_duplex.dialects.openai import OPENAI

from ..helpers import assert_error_shape

IDLE = 300.0
TEXT = "input.text.append"
AUDIO = "input_audio_buffer.append"


@attrs.define
class Rules:
    """An engine's checks, as the echo engine's: text must be a string."""

    accepts: frozenset[str] = frozenset({TEXT, AUDIO})
    broken: bool = False
    locked_field: str | None = None
    """``check_locked`` refuses an event with this field (ConfigLocked, as realtime-proxy)."""
    checked: list[dict[str, Any]] = attrs.field(factory=list)

    def check(self, event: dict[str, Any]) -> None:
        self.checked.append(dict(event))
        if self.broken:
            raise RuntimeError("the engine's own bug")
        if event["type"] == TEXT and not isinstance(event.get("text"), str):
            raise ProtocolError(ErrorCode.BAD_EVENT, "text must be a string", param="text")

    def check_locked(self, event: dict[str, Any]) -> None:
        if self.locked_field is not None and self.locked_field in event:
            raise ProtocolError(ErrorCode.CONFIG_LOCKED, "locked", param=self.locked_field)


@attrs.define
class Room:
    free: bool = True
    asked: list[int] = attrs.field(factory=list)

    def __call__(self, size: int) -> bool:
        self.asked.append(size)
        return self.free


@attrs.define
class Audio:
    """A decoder: each byte "decoded" to two (the machine unwraps base64 first)."""

    decoded: list[bytes] = attrs.field(factory=list)

    def decode(self, audio: bytes) -> bytes:
        self.decoded.append(audio)
        return bytes(b for b in audio for _ in range(2))


@attrs.define
class Machine:
    events: ClientEvents
    session: Session
    rules: Rules
    room: Room
    audio: Audio | None

    def receive(self, event: dict[str, Any], size: int = 10, now: float = 1.0) -> Decision:
        return self.events.receive(event, size, self.session.generation, now)

    def error(self, event: dict[str, Any], size: int = 10) -> dict[str, Any]:
        decision = self.receive(event, size)
        assert decision.action is Action.REFUSE and decision.frame is not None
        error: dict[str, Any] = json.loads(decision.frame)
        assert_error_shape(error)
        return error


def machine(
    config: dict[str, Any] | None = None,
    *,
    locked: bool = False,
    audio: bool = False,
    audio_in: dict[str, int] | None = None,
    max_config_bytes: int = 64 * 1024,
    rules: Rules | None = None,
) -> Machine:
    registry = Registry(Limits(idle_ttl_s=IDLE), spelling=NATIVE)
    session, _ = registry.admit(dict(config or {}), locked=locked)
    session.handshake_delivered(0.0)
    rules = rules or Rules()
    room = Room()
    decoder = Audio() if audio else None
    budget = ConfigBudget.of(session.config, max_config_bytes)
    events = ClientEvents(session, rules, budget, room, decoder, audio_in)
    return Machine(events, session, rules, room, decoder)


def text(seq: int | None = None, value: object = "x", **more: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": TEXT, "text": value, **more}
    if seq is not None:
        event["client_event_seq"] = seq
    return event


# -- fencing, the idle clock and usage --------------------------------------------------------


@pytest.mark.parametrize("generation", [0, 2])
def test_an_event_from_a_stale_attachment_changes_nothing(generation: int) -> None:
    m = machine()
    deadline = m.session.idle_deadline
    assert m.events.receive(text(1), 10, generation, 50.0) is IGNORE
    assert (m.session.usage.events_in, m.session.client_seq) == (0, 0)
    assert m.session.idle_deadline == deadline and not m.rules.checked


def test_a_detached_session_takes_nothing() -> None:
    m = machine()
    m.session.detach(m.session.generation, 1.0)
    assert m.session.state is State.DETACHED
    assert m.receive({"type": "session.heartbeat"}) is IGNORE
    assert m.session.usage.events_in == 0


def test_every_event_counts_in_usage_and_restarts_the_idle_clock() -> None:
    m = machine()
    assert m.receive(text(), 40, now=5.0) is TO_ENGINE
    m.error({"type": "nope"}, 7)  # refused: it was read all the same
    assert (m.session.usage.events_in, m.session.usage.bytes_in) == (2, 47)
    assert m.session.idle_deadline == 1.0 + IDLE  # the last event's time
    assert m.receive({"type": "session.heartbeat"}, now=9.0).action is Action.REPLY
    assert m.session.idle_deadline == 9.0 + IDLE


# -- heartbeat, ack, close -----------------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"event_id": "hb", "client_event_seq": 1}])
def test_heartbeat_is_answered_with_heartbeat_ack(extra: dict[str, Any]) -> None:
    m = machine()
    decision = m.receive({"type": "session.heartbeat", **extra})
    assert decision.action is Action.REPLY and decision.frame is not None
    assert json.loads(decision.frame) == {
        "type": "session.heartbeat_ack",
        "session_id": m.session.id,
    }
    assert m.session.journal.head == 0  # not journaled, no seq taken
    assert m.session.client_seq == 0  # a control event's seq is not the engine's numbering
    assert m.receive({"type": "session.heartbeat"}).frame == decision.frame


def test_a_playback_clear_is_taken_as_the_transport_s_and_answers_nothing() -> None:
    """``output_audio_buffer.clear`` (OpenAI's WebRTC calls): the call's transport acts
    on it; the core takes it, with its seq, and no engine is asked (none accepts it)."""
    m = machine()
    clear = {"type": "output_audio_buffer.clear"}
    assert m.receive(clear) is IGNORE
    assert m.receive({**clear, "client_event_seq": 1}) is IGNORE
    assert m.session.client_seq == 1  # its seq counts: the next one is 2
    assert m.receive({**clear, "client_event_seq": 1}) is IGNORE  # a resend: nothing
    assert m.receive(text(2)) is TO_ENGINE
    assert m.session.journal.head == 0
    m.error({**clear, "client_event_seq": 5}, 3)  # ahead of the next: refused, as any


def test_an_ack_frees_the_journal_and_answers_nothing() -> None:
    m = machine()
    m.session.emit({"type": "e"}, 0.0)
    m.session.emit({"type": "e"}, 0.0)
    assert m.receive({"type": "session.event_ack", "server_event_seq": 1}) is IGNORE
    assert [entry.seq for entry in m.session.journal] == [2]
    assert m.receive({"type": "session.event_ack", "server_event_seq": 2}) is IGNORE


@pytest.mark.parametrize(
    "seq", [3, 100, -1, "1", 1.0, 1.5, True, False, None, [1], {"seq": 1}, "missing"]
)
def test_a_bad_ack_is_invalid_event_ack_and_the_session_goes_on(seq: object) -> None:
    m = machine()
    m.session.emit({"type": "e"}, 0.0)
    m.session.emit({"type": "e"}, 0.0)
    ack: dict[str, Any] = {"type": "session.event_ack", "event_id": "a"}
    if seq != "missing":
        ack["server_event_seq"] = seq
    error = m.error(ack)
    assert (error["code"], error["param"], error["event_id"], error["retryable"]) == (
        "invalid_event_ack",
        "server_event_seq",
        "a",
        False,
    )
    assert len(m.session.journal) == 2  # nothing freed
    assert m.session.state is State.ATTACHED
    assert m.receive(text()) is TO_ENGINE


@pytest.mark.parametrize("extra", [{}, {"reason": "done for today"}, {"reason": None}])
def test_session_close_ends_the_session_with_client_close(extra: dict[str, Any]) -> None:
    m = machine()
    decision = m.receive({"type": "session.close", **extra})
    assert decision.action is Action.END and decision.cause is None
    terminal = decision.terminal
    assert terminal is not None and terminal.reason == "client_close"
    assert (terminal.close_code, terminal.generation) == (1000, m.session.generation)
    assert m.session.state is State.CLOSING
    assert m.receive(text()) is IGNORE  # nothing after the end


# -- what is refused --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["response.create", "session.nope", "", "input.text"])
def test_a_type_the_engine_does_not_accept_is_unknown_event(kind: str) -> None:
    m = machine()
    error = m.error({"type": kind, "event_id": "u"})
    assert (error["code"], error["param"], error["event_id"]) == ("unknown_event", "type", "u")
    assert m.receive(text()) is TO_ENGINE


def test_a_resume_mid_session_is_unsupported_and_the_session_goes_on() -> None:
    m = machine()
    error = m.error({"type": "session.resume", "session_id": "x", "event_id": "4"})
    assert (error["code"], error["event_id"]) == ("unsupported_session_resume", "4")
    assert m.session.state is State.ATTACHED


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": TEXT}, "text"),
        ({"type": TEXT, "text": 1}, "text"),
        ({"type": TEXT, "text": None}, "text"),
        ({"type": TEXT, "text": ["a"]}, "text"),
        ({"type": "session.update"}, "session"),
        ({"type": "session.update", "session": [1]}, "session"),
        ({"type": "session.update", "session": "x"}, "session"),
    ],
)
def test_malformed_fields_are_bad_event_and_the_refusal_takes_its_seq(
    event: dict[str, Any], param: str
) -> None:
    m = machine()
    decision = m.receive({**event, "event_id": "b", "client_event_seq": 1})
    assert decision.action is Action.REFUSE and decision.frame is not None
    error = json.loads(decision.frame)
    assert (error["code"], error["param"], error["event_id"]) == ("bad_event", param, "b")
    assert error["client_event_seq"] == 1  # which event was refused
    # Refused for good: a resend could only be refused again, so numbering goes on past
    # it, and it counts as consumed.
    assert decision.consumed and m.session.client_seq == 1
    assert decision.fault is not None and decision.close_code is None
    assert m.receive(text(2)) is TO_ENGINE


@pytest.mark.parametrize("value", [0, -1, 1.5, "1", True, None, [1]])
@pytest.mark.parametrize("kind", [TEXT, "session.update"])
def test_a_malformed_client_event_seq_is_bad_event(value: object, kind: str) -> None:
    m = machine()
    event: dict[str, Any] = {"type": kind, "text": "x", "session": {}, "client_event_seq": value}
    if value is None:  # null: as if absent
        assert m.receive(event) is TO_ENGINE
        return
    error = m.error(event)
    assert (error["code"], error["param"]) == ("bad_event", "client_event_seq")
    assert "client_event_seq" not in error  # not a valid one to echo
    assert m.session.client_seq == 0


def test_a_refusal_for_good_of_a_seq_that_is_not_next_takes_nothing() -> None:
    m = machine()
    assert m.receive(text(1)) is TO_ENGINE
    decision = m.receive({"type": "nope", "client_event_seq": 5})  # not the next one
    assert decision.action is Action.REFUSE and not decision.consumed
    assert m.session.client_seq == 1
    decision = m.receive({"type": "nope", "client_event_seq": 1})  # already received
    assert not decision.consumed and m.session.client_seq == 1


def test_many_errors_in_a_row_do_not_end_the_session() -> None:
    m = machine()
    for n in range(100):
        assert m.receive({"type": "nope"} if n % 2 else text(value=n)).action is Action.REFUSE
    assert m.session.state is State.ATTACHED and m.receive(text()) is TO_ENGINE


def test_an_engine_whose_check_breaks_ends_its_session_with_the_cause() -> None:
    m = machine(rules=Rules(broken=True))
    decision = m.receive(text(1))
    assert decision.action is Action.END and isinstance(decision.cause, RuntimeError)
    assert decision.terminal is not None and decision.terminal.reason == "engine_error"
    assert decision.terminal.close_code == 1011
    assert m.session.client_seq == 0
    with pytest.raises(CheckFailed):
        check_input(Rules(broken=True), text())


def test_before_an_engine_exists_only_protocol_events_pass_the_check() -> None:
    check_input(None, {"type": "session.update", "session": {}})
    with pytest.raises(ProtocolError) as raised:
        check_input(None, text())
    assert raised.value.code == "unknown_event"


def test_pacing_refusals_are_not_logged_as_faults() -> None:
    backpressure = ProtocolError(ErrorCode.INPUT_BACKPRESSURE, "full")
    assert refusal(backpressure, None, NATIVE).fault is None
    assert refusal(ProtocolError.unexpected_client_seq(2, 3), None, NATIVE).fault is None
    assert refusal(ProtocolError(ErrorCode.BAD_EVENT, "no"), None, NATIVE).fault == "bad_event: no"


# -- client_event_seq ----------------------------------------------------------------------


def test_only_the_next_seq_is_taken_a_resend_is_dropped_a_gap_refused() -> None:
    m = machine()
    assert m.receive(text(1)) is TO_ENGINE
    assert m.receive(text(1)) is IGNORE  # a resend: dropped silently
    assert m.receive(text(2)) is TO_ENGINE
    error = m.error(text(4, event_id="e"))  # 3 is missing: nothing may overtake it
    assert error == {
        "type": "error",
        "code": "unexpected_client_event_seq",
        "message": "client_event_seq 4 is not the next one, 3; resend from 3",
        "retryable": True,
        "event_id": "e",
        "param": "client_event_seq",
        "client_event_seq": 4,
        "expected_client_event_seq": 3,
    }
    assert m.session.client_seq == 2
    assert m.receive(text()) is TO_ENGINE  # events without a seq pass
    assert m.receive(text(3)) is TO_ENGINE and m.session.client_seq == 3


def test_the_checks_come_before_the_resend_rule() -> None:
    m = machine()
    m.receive(text(1))
    assert m.receive(text(1, value="changed")) is IGNORE  # a resend: not taken again
    decision = m.receive(text(1, value=None))  # malformed: refused, even as a resend
    assert decision.action is Action.REFUSE and not decision.consumed
    assert m.session.client_seq == 1 and len(m.rules.checked) == 3


def test_control_events_between_numbered_ones_need_no_seq() -> None:
    m = machine()
    assert m.receive(text(1)) is TO_ENGINE
    assert m.receive({"type": "session.heartbeat"}).action is Action.REPLY
    assert m.receive({"type": "session.event_ack", "server_event_seq": 0}) is IGNORE
    assert m.receive(text(2)) is TO_ENGINE and m.session.client_seq == 2


# -- backpressure -----------------------------------------------------------------------------


def test_no_room_is_input_backpressure_retryable_and_the_seq_is_not_taken() -> None:
    m = machine()
    m.room.free = False
    decision = m.receive(text(1, event_id="5"), 33)
    assert decision.action is Action.REFUSE and decision.frame is not None
    error = json.loads(decision.frame)
    assert (error["code"], error["retryable"], error["event_id"]) == (
        "input_backpressure",
        True,
        "5",
    )
    assert decision.fault is None and not decision.consumed  # pacing, not a fault
    assert m.session.client_seq == 0 and m.room.asked == [33]
    m.room.free = True
    assert m.receive(text(1)) is TO_ENGINE and m.session.client_seq == 1


def test_an_event_that_takes_nothing_is_queued_at_once_and_full_answers_the_refusal() -> None:
    m = machine()
    m.room.free = False
    event = text(event_id="7")
    assert m.receive(event) is TO_ENGINE  # no seq, no usage: nothing to take back
    assert m.room.asked == []
    decision = m.events.full(event)  # the queue refused it
    assert decision.action is Action.REFUSE and decision.frame is not None
    assert json.loads(decision.frame) == {
        "type": "error",
        "code": "input_backpressure",
        "message": "the session's input queue is full; retry later",
        "retryable": True,
        "event_id": "7",
    }
    assert decision.fault is None and not decision.consumed


def test_control_events_need_no_room() -> None:
    m = machine()
    m.room.free = False
    assert m.receive({"type": "session.heartbeat"}).action is Action.REPLY
    assert m.receive({"type": "session.event_ack", "server_event_seq": 0}) is IGNORE
    assert m.room.asked == []


# -- session.update ------------------------------------------------------------------------


def test_an_update_is_for_the_engine_and_takes_its_seq() -> None:
    m = machine({"a": 1})
    assert m.receive({"type": "session.update", "session": {"b": 2}, "client_event_seq": 1}) is (
        TO_ENGINE
    )
    assert m.session.client_seq == 1


def test_updates_are_bounded_by_the_merged_size_and_cost_their_own() -> None:
    m = machine({"a": "x" * 300}, max_config_bytes=1000)
    for i in range(60):  # replacing a field does not add up
        assert m.receive({"type": "session.update", "session": {"b": f"{i}" + "y" * 400}}) is (
            TO_ENGINE
        )
    error = m.error({"type": "session.update", "session": {"c": "z" * 300}})
    assert (error["code"], error["param"]) == ("config_too_large", "session")
    assert m.receive({"type": "session.update", "session": {"c": "z" * 100}}) is TO_ENGINE


def test_an_update_refused_for_room_leaves_the_budget_as_it_was() -> None:
    m = machine({}, max_config_bytes=100)
    m.room.free = False
    assert m.error({"type": "session.update", "session": {"c": "z" * 60}})["code"] == (
        "input_backpressure"
    )
    m.room.free = True
    assert m.receive({"type": "session.update", "session": {"d": "z" * 60}}) is TO_ENGINE


def test_session_audio_cannot_change_after_the_open() -> None:
    audio = {"wire": "binary", "input": {"format": "pcm16", "rate": 24000}}
    m = machine({"audio": audio})
    same = {"type": "session.update", "session": {"audio": dict(audio), "x": 1}}
    assert m.receive(same) is TO_ENGINE
    error = m.error({"type": "session.update", "session": {"audio": {"wire": "json"}}})
    assert (error["code"], error["param"]) == ("bad_event", "session.audio")


# -- a locked configuration ------------------------------------------------------------------


def test_an_update_changing_a_locked_session_is_config_locked_and_closes_1008() -> None:
    m = machine({"voice": "a"}, locked=True)
    for seq, asked in enumerate(({"voice": "b"}, {"voice": "a", "tools": []}), 1):
        decision = m.receive({"type": "session.update", "session": asked, "client_event_seq": seq})
        assert decision.action is Action.REFUSE and decision.frame is not None
        assert decision.close_code == 1008
        error = json.loads(decision.frame)
        field = "session.voice" if seq == 1 else "session.tools"  # unset in the lock: locked
        assert (error["code"], error["param"]) == ("config_locked", field)
        assert decision.consumed and m.session.client_seq == seq  # refused for good
    assert m.session.config == {"voice": "a"}


def test_an_update_restating_a_locked_session_is_taken() -> None:
    # Was: any update of a locked session was config_locked (OpenAI's clients restate
    # their configuration right after connecting).
    m = machine({"voice": "a", "instructions": "be brief"}, locked=True)
    for asked in ({}, {"voice": "a"}, {"voice": "a", "instructions": "be brief"}):
        assert m.receive({"type": "session.update", "session": asked}) is TO_ENGINE


def test_a_dialect_may_keep_the_connection_after_a_locked_update() -> None:
    # The dialect decides the close: OpenAI's connection goes on after an error.
    m = machine({"voice": "a"}, locked=True)
    m.session.spelling = OPENAI
    decision = m.receive({"type": "session.update", "session": {"voice": "b"}})
    assert decision.action is Action.REFUSE and decision.frame is not None
    assert decision.close_code is None
    error = json.loads(decision.frame)["error"]
    assert (error["code"], error["param"]) == ("config_locked", "session.voice")


def test_the_engine_check_locked_hook_refuses_an_override() -> None:
    m = machine(locked=True, rules=Rules(locked_field="instructions"))
    error = m.error(text(instructions="be evil"))
    assert (error["code"], error["param"]) == ("config_locked", "instructions")
    assert m.receive(text()) is TO_ENGINE
    unlocked = machine(rules=Rules(locked_field="instructions"))
    assert unlocked.receive(text(instructions="fine")) is TO_ENGINE  # only when locked


# -- input audio -------------------------------------------------------------------------------


def test_input_audio_is_decoded_in_place_for_the_engine() -> None:
    m = machine(audio=True)
    event = {"type": AUDIO, "audio": "AAE=", "client_event_seq": 1}
    assert m.receive(event) is TO_ENGINE
    assert event["audio"] == b"\x00\x00\x01\x01"
    assert m.rules.checked[-1]["audio"] == b"\x00\x00\x01\x01"  # the engine checks PCM
    assert m.session.client_seq == 1 and m.room.asked == [10]  # asked once, before decoding
    binary = {"type": AUDIO, "audio": b"\x02"}  # the binary lane: bytes already
    assert m.receive(binary) is TO_ENGINE and binary["audio"] == b"\x02\x02"


def test_decoded_audio_is_counted_in_the_sessions_usage() -> None:
    m = machine(audio=True)  # PCM16 at 24 kHz: 48 bytes a millisecond
    m.session.usage.audio_ms_in = 0.0
    audio = base64.b64encode(bytes(48)).decode()  # decoded to 96 bytes: 2 ms
    assert m.receive({"type": AUDIO, "audio": audio, "client_event_seq": 1}) is TO_ENGINE
    assert m.session.usage.audio_ms_in == 2.0
    assert m.receive({"type": AUDIO, "audio": audio, "client_event_seq": 1}) is IGNORE
    assert m.session.usage.audio_ms_in == 2.0  # a resend: nothing decoded, nothing counted


def test_a_resent_audio_event_is_not_decoded() -> None:
    m = machine(audio=True)
    assert m.receive({"type": AUDIO, "audio": "AAE=", "client_event_seq": 1}) is TO_ENGINE
    assert m.receive({"type": AUDIO, "audio": "AAE=", "client_event_seq": 1}) is IGNORE
    assert m.audio is not None and m.audio.decoded == [b"\x00\x01"]
    assert len(m.rules.checked) == 1  # nor checked


def test_audio_is_refused_before_it_is_decoded_when_there_is_no_room() -> None:
    m = machine(audio=True)
    m.room.free = False
    error = m.error({"type": AUDIO, "audio": "AAE=", "client_event_seq": 1})
    assert error["code"] == "input_backpressure"
    assert m.audio is not None and m.audio.decoded == []  # the codec never saw it


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        ("not base64!", "audio is not valid base64"),
        (None, "audio must be a base64 string"),
        ({}, "audio must be a base64 string"),
    ],
)
def test_input_audio_that_is_not_base64_is_bad_event(audio: object, message: str) -> None:
    m = machine(audio=True)
    m.room.free = False  # (the shape is refused first)
    error = m.error({"type": AUDIO, "audio": audio})
    assert (error["code"], error["param"], error["message"]) == ("bad_event", "audio", message)


def test_audio_of_a_known_format_is_counted_without_a_decoder() -> None:
    m = machine(audio_in={AUDIO: 48})
    m.session.usage.audio_ms_in = 0.0
    assert m.receive({"type": AUDIO, "audio": "A" * 128}) is TO_ENGINE  # 96 bytes
    assert m.session.usage.audio_ms_in == 2.0
    assert m.receive(text()) is TO_ENGINE and m.session.usage.audio_ms_in == 2.0


# -- the consumed report -----------------------------------------------------------------------


def test_the_consumed_report_names_the_seq_taken_or_all_once_drained() -> None:
    m = machine()
    generation = m.session.generation
    for seq in (1, 2, 3):
        m.receive(text(seq))
    reported, frame = m.events.report_consumed(text(2), False, generation)
    assert reported and frame is not None
    assert json.loads(frame) == {"type": "input.consumed", "consumed_client_event_seq": 2}
    assert m.events.report_consumed(text(2), False, generation) == (True, None)  # no news
    reported, frame = m.events.report_consumed(None, True, generation)
    assert reported and frame is not None and json.loads(frame)["consumed_client_event_seq"] == 3


def test_an_event_without_a_seq_puts_the_report_off_unless_none_are_numbered() -> None:
    m = machine()
    assert m.events.report_consumed(text(), False, m.session.generation) == (True, None)
    m.receive(text(1))
    assert m.events.report_consumed(text(), False, m.session.generation) == (False, None)


def test_the_consumed_report_goes_to_the_current_attachment_only() -> None:
    m = machine()
    m.receive(text(1))
    assert m.events.report_consumed(None, True, 0) == (True, None)  # (no connection)
    assert m.session.consumed_seq == 1  # reported all the same: a resume says so
