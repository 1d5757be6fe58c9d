"""The first message's rules (core/opening.py), with no trio and no socket."""

from __future__ import annotations

from typing import Any

import pytest

from trio_duplex.core import opening
from trio_duplex.core.credentials import digest
from trio_duplex.core.events import ErrorCode, Event
from trio_duplex.core.frames import CloseCode
from trio_duplex.core.opening import OPEN, Grant, Open, Resume
from trio_duplex.core.wire import ProtocolError

RESUME: Event = {
    "type": "session.resume",
    "session_id": "sess_1",
    "resume_token": "tok",
    "last_received_server_event_seq": 3,
}


def refusal(call: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        call(*args)
    return caught.value


def test_a_resume_is_read_with_its_fields() -> None:
    step = opening.first_step(OPEN, RESUME)
    assert step == Resume("sess_1", "tok", 3)
    assert "tok" not in repr(step)
    bare = {"type": "session.resume", "session_id": "s", "resume_token": "t"}
    assert opening.first_step(OPEN, bare) == Resume("s", "t", 0)


@pytest.mark.parametrize(
    "fields",
    [
        {"session_id": 1, "resume_token": "t"},
        {"session_id": "s"},
        {"session_id": "s", "resume_token": "t", "last_received_server_event_seq": -1},
        {"session_id": "s", "resume_token": "t", "last_received_server_event_seq": True},
    ],
)
def test_a_malformed_resume_is_refused_and_closed_4001(fields: dict[str, Any]) -> None:
    exc = refusal(opening.first_step, OPEN, {"type": "session.resume", **fields})
    assert exc.code == ErrorCode.INVALID_SESSION_RESUME
    assert exc.close_code == CloseCode.RESUME_REFUSED


def test_anything_else_opens() -> None:
    assert opening.first_step(OPEN, {"type": "session.update", "session": {}}) is None
    assert opening.first_step(OPEN, {"type": "input_text"}) is None


def test_a_resume_only_grant_allows_its_own_resume_only() -> None:
    own = Grant(None, resume_of="sess_1")
    assert opening.first_step(own, RESUME) == Resume("sess_1", "tok", 3)
    for event in ({**RESUME, "session_id": "sess_2"}, {"type": "session.update", "session": {}}):
        exc = refusal(opening.first_step, own, event)
        assert exc.code == ErrorCode.UNAUTHORIZED
        assert exc.close_code == CloseCode.POLICY_VIOLATION
    assert refusal(opening.autostart, own).code == ErrorCode.UNAUTHORIZED


def test_a_credential_from_elsewhere_allows_a_resume_with_exactly_that_token() -> None:
    elsewhere = Grant(None, elsewhere=digest("tok"))
    assert opening.first_step(elsewhere, RESUME) == Resume("sess_1", "tok", 3)
    exc = refusal(opening.first_step, elsewhere, {**RESUME, "resume_token": "other"})
    assert exc.code == ErrorCode.UNAUTHORIZED
    assert "elsewhere=True" in repr(elsewhere) and "tok" not in repr(elsewhere)


def test_a_locked_configuration_is_the_session_s_whatever_is_asked() -> None:
    locked = Grant("app", locked={"voice": "a", "rate": 1})
    same = opening.open_with(locked, {"type": "session.update", "session": {"voice": "a"}}, 999)
    assert same == Open({"voice": "a", "rate": 1}, None)
    for asked in ({"voice": "b"}, {"other": 1}):
        exc = refusal(opening.open_with, locked, {"type": "session.update", "session": asked}, 999)
        assert exc.code == ErrorCode.CONFIG_LOCKED
        assert exc.close_code == CloseCode.POLICY_VIOLATION
    event: Event = {"type": "input_text", "text": "hi"}
    assert opening.open_with(locked, event, 999) == Open({"voice": "a", "rate": 1}, event)
    assert opening.autostart(locked) == {"voice": "a", "rate": 1}
    assert opening.autostart(OPEN) == {}


def test_an_asked_configuration_is_bounded_in_bytes() -> None:
    update: Event = {"type": "session.update", "session": {"text": "x" * 100}}
    assert opening.open_with(OPEN, update, 200) == Open({"text": "x" * 100}, None)
    exc = refusal(opening.open_with, OPEN, update, 50)
    assert exc.code == ErrorCode.CONFIG_TOO_LARGE


def test_a_first_event_ack_acknowledges_nothing_but_0() -> None:
    opening.check_first_event({"type": "session.event_ack", "server_event_seq": 0})
    opening.check_first_event({"type": "input_text"})
    exc = refusal(opening.check_first_event, {"type": "session.event_ack", "server_event_seq": 1})
    assert exc.code == ErrorCode.INVALID_EVENT_ACK and exc.close_code is None


def test_audio_needs_an_engine_that_declares_a_rate() -> None:
    opening.check_audio(24000, {"audio": {}})
    opening.check_audio(None, {"voice": "a"})
    exc = refusal(opening.check_audio, None, {"audio": {}})
    assert exc.code == ErrorCode.UNSUPPORTED_AUDIO_FORMAT


def test_the_server_s_own_state_is_not_the_client_s_fault() -> None:
    assert ErrorCode.RESOURCE_EXHAUSTED in opening.NOT_FAULTS
    assert ErrorCode.BAD_EVENT not in opening.NOT_FAULTS
    assert opening.CONFIG_TIMEOUT.close_code == CloseCode.CONFIG_TIMEOUT
    assert opening.ended_during_resume().code == ErrorCode.SESSION_RESUME_EXPIRED
    still_opening = opening.not_resumable()
    assert still_opening.code == ErrorCode.SESSION_RESUME_EXPIRED
    assert still_opening.close_code == CloseCode.RESUME_REFUSED
