"""docs/protocol.md, Transport, event_id: an error echoes the ``event_id`` of the event
that caused it, when that is a string. Driven directly: the native dialect's decoding, the
protocol machine (core/protocol.py) with the echo engine's checks, the registry's
refusals; no trio, time as a number. (The shell's part, that a bad first message's error
carries it and opens nothing, is tests/server/test_protocol_transport.py's.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import Action, ClientEvents, refusal
from trio_duplex.core.session import Registry
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE
from trio_duplex.engines.echo import EchoEngine


def machine() -> ClientEvents:
    """An open session of the echo engine, attached at generation 1, with room."""
    session, _ = Registry(Limits(), spelling=NATIVE).admit({})
    session.handshake_delivered(0.0)
    return ClientEvents(session, EchoEngine({}), ConfigBudget.of({}, 64 * 1024), lambda _: True)


def refused(events: ClientEvents, event: dict[str, Any]) -> dict[str, Any]:
    """The error ``event`` is answered with; the session goes on (no close code)."""
    decision = events.receive(event, len(json.dumps(event)), 1, 1.0)
    assert decision.action is Action.REFUSE
    assert decision.close_code is None
    assert isinstance(decision.frame, str)
    error = json.loads(decision.frame)
    assert isinstance(error, dict)
    assert error["type"] == "error"
    return error


def decode_refusal(message: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as raised:
        NATIVE.decode(message)
    return raised.value


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"type": "no.such.event"}, "unknown_event"),
        ({"type": "input.text.append", "text": 5}, "bad_event"),
        ({"type": "input.text.append", "text": "x", "client_event_seq": -1}, "bad_event"),
        ({"type": "session.event_ack", "server_event_seq": 99}, "invalid_event_ack"),
        ({"type": "session.update", "session": "nope"}, "bad_event"),
        (
            {"type": "session.resume", "session_id": "s", "resume_token": "t"},
            "unsupported_session_resume",
        ),
    ],
)
def test_event_id_is_echoed_mid_session(event: dict[str, Any], code: str) -> None:
    error = refused(machine(), {**event, "event_id": "evt-42"})
    assert error["code"] == code
    assert error["event_id"] == "evt-42"


def test_no_event_id_means_none_in_the_error() -> None:
    error = refused(machine(), {"type": "no.such.event"})
    assert error["code"] == "unknown_event"
    assert "event_id" not in error


@pytest.mark.parametrize(
    "message",
    ["[1,2]", '"text"', "42", "null", '{"no_type":1}', '{"type":7}', '{"type":null}'],
)
def test_frame_that_is_not_an_object_with_string_type_is_bad_event(message: str) -> None:
    error = decode_refusal(message)
    # No close code: the shell answers it and the session goes on.
    assert (error.code, error.retryable, error.close_code) == ("bad_event", False, None)


@pytest.mark.parametrize(
    "message",
    ['{"event_id":"first-2"}', '{"event_id":"first-2","type":5}'],
)
def test_event_id_is_echoed_for_a_message_without_type(message: str) -> None:
    error = decode_refusal(message)
    assert error.close_code is None
    # As the shell answers one: a first message with the event it could not decode ({}),
    # one mid-session through the session's dialect with no event.
    first = error.to_event({})
    assert (first["type"], first["code"], first.get("event_id")) == (
        "error",
        "bad_event",
        "first-2",
    )
    frame = refusal(error, None, NATIVE).frame
    assert isinstance(frame, str)
    assert json.loads(frame)["event_id"] == "first-2"


def test_event_id_that_is_not_a_string_is_bad_event() -> None:
    message = json.dumps({"type": "input.text.append", "text": "x", "event_id": 12})
    error = decode_refusal(message)
    assert (error.code, error.param, error.close_code) == ("bad_event", "event_id", None)
    event = error.to_event({"type": "input.text.append", "text": "x", "event_id": 12})
    assert event["code"] == "bad_event"
    assert "event_id" not in event


def test_server_shutting_down_for_an_open_echoes_event_id() -> None:
    """The refusal of an open during the drain answers the first message it refuses."""
    registry = Registry(Limits(), spelling=NATIVE)
    registry.admit({})[0].handshake_delivered(0.0)
    registry.shutting_down = True
    with pytest.raises(ProtocolError) as raised:
        registry.admit({})
    error = raised.value.to_event({"type": "session.update", "session": {}, "event_id": "open-2"})
    assert (error["code"], error["retryable"], error.get("event_id")) == (
        "server_shutting_down",
        True,
        "open-2",
    )
    assert raised.value.close_code == 1001
    assert registry.slots_held == 1
