"""The first message's rules (core/opening.py), with no trio and no socket; then what a
first message opens, driven on the core's ``Registry``, ``Session`` and ``ClientEvents``
(docs/protocol.md, Opening a session: the first message, admission, the delivery rule).
What only the shell decides (the config timeout, ``?autostart=1``, the codec, a send that
fails, concurrency): tests/server/test_protocol_opening.py."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from trio_duplex.core import opening
from trio_duplex.core.credentials import digest
from trio_duplex.core.events import ErrorCode, Event
from trio_duplex.core.frames import CloseCode
from trio_duplex.core.limits import Limits
from trio_duplex.core.opening import OPEN, Grant, Open, Resume
from trio_duplex.core.protocol import IGNORE, TO_ENGINE, Action, ClientEvents, Decision, check_input
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session, State
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE

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
        assert exc.param == "session." + next(iter(asked))  # the field it would change
        assert exc.close_code == CloseCode.POLICY_VIOLATION
    event: Event = {"type": "input_text", "text": "hi"}
    assert opening.open_with(locked, event, 999) == Open({"voice": "a", "rate": 1}, event)
    assert opening.autostart(locked) == {"voice": "a", "rate": 1}
    assert opening.autostart(OPEN) == {}


def test_an_upgrade_that_speaks_first_under_a_lock_opens_the_locked_configuration() -> None:
    # Was: the upgrade's own defaults were judged against the lock (config_locked).
    def spoken(session: Event) -> Event:
        return {"type": "session.update", "session": session}

    locked = Grant("app", locked={"voice": "a"})
    asked = spoken({"audio": {"x": 1}, "model": "m"})
    assert opening.open_spoken(locked, asked, 999) == Open({"voice": "a"}, None)
    with_model = Grant("app", locked={"voice": "a", "model": "m"})
    assert opening.open_spoken(with_model, asked, 999) == Open({"voice": "a", "model": "m"}, None)
    assert opening.open_spoken(with_model, spoken({}), 999).config["model"] == "m"
    exc = refusal(opening.open_spoken, with_model, spoken({"model": "other"}), 999)
    assert exc.code == ErrorCode.CONFIG_LOCKED and exc.param == "model"
    assert exc.close_code == CloseCode.POLICY_VIOLATION
    assert opening.open_spoken(OPEN, asked, 999) == Open({"audio": {"x": 1}, "model": "m"}, None)


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


# -- a first message that opens a session, from the rules to the open session ---------------
#
# ``first_message`` asks the core what the session shell (server/sessions/opening.py's
# ``Opener``) asks, in its order; each outcome is then driven on the real ``Registry``,
# ``Session`` and ``ClientEvents``.

TEXT = "input.text.append"
UPDATE: Event = {"type": "session.update", "session": {}}
MAX_CONFIG = 64 * 1024


class Rules:
    """The echo engine's check: it takes text, which must be a string."""

    accepts = frozenset({TEXT})

    def check(self, event: dict[str, Any]) -> None:
        if not isinstance(event.get("text"), str):
            raise ProtocolError(ErrorCode.BAD_EVENT, "text must be a string", param="text")


def registry(**limits: Any) -> Registry:
    return Registry(Limits(**limits), spelling=NATIVE)


@attrs.define
class Opened:
    registry: Registry
    session: Session
    token: str
    first: Event | None
    """The event the session handles first (None: a ``session.update`` opened it)."""

    def created(self) -> dict[str, Any]:
        created: dict[str, Any] = json.loads(self.registry.created_frame(self.session, self.token))
        return created

    def receive(self, event: Event, now: float = 0.0) -> Decision:
        budget = ConfigBudget.of(self.session.config, MAX_CONFIG)
        events = ClientEvents(self.session, Rules(), budget, lambda size: True)
        return events.receive(event, 10, self.session.generation, now)


def first_message(reg: Registry, event: Event, grant: Grant = OPEN) -> Opened:
    """Open a session for a first message that is not a resume, as the shell does: the
    input check of an update, ``open_with``, the engine's check and ``check_first_event``
    of another event, then admission and the delivery of ``session.created``."""
    assert opening.first_step(grant, event) is None
    if event["type"] == "session.update":
        check_input(None, event)
    plan = opening.open_with(grant, event, MAX_CONFIG)
    if plan.first is not None:
        check_input(Rules(), plan.first)
        opening.check_first_event(plan.first)
    session, token = reg.admit(plan.config, grant.principal, grant.locked is not None)
    session.handshake_delivered(0.0, opening_event=plan.first is not None)
    return Opened(reg, session, token, plan.first)


def test_session_update_opens_a_session_with_that_configuration() -> None:
    reg = registry()
    config = {"voice": "alloy", "nested": {"a": [1, 2]}}
    opened = first_message(reg, {"type": "session.update", "session": config})
    assert opened.first is None  # nothing more for the engine
    created = opened.created()
    assert created["type"] == "session.created"
    assert created["session"] == config
    assert reg.slots_held == 1
    assert opened.receive({"type": TEXT, "text": "hi"}) is TO_ENGINE


def test_the_server_allocates_distinct_ids_and_tokens() -> None:
    reg = registry()
    created = [first_message(reg, UPDATE).created() for _ in range(5)]
    assert len({c["session_id"] for c in created}) == 5
    assert len({c["resume_token"] for c in created}) == 5
    # A session_id offered by the client is not used.
    mine = first_message(reg, {**UPDATE, "session_id": "sess_mine"}).created()
    assert mine["session_id"] != "sess_mine"
    assert mine["session"] == {}


def test_session_created_is_not_journaled() -> None:
    opened = first_message(registry(), UPDATE)
    opened.created()
    session = opened.session
    assert session.journal.head == 0 and len(session.journal) == 0
    session.detach(1, 0.0)
    attempt = session.begin_resume(opened.token, 0, 1.0)
    writes: list[dict[str, Any]] = []
    replay = Replay(attempt)
    while frames := replay.next_frames(1.0):
        writes.extend(json.loads(frame) for frame in frames)
    # Nothing to replay: the resumed event alone.
    assert [e["type"] for e in writes] == ["session.resumed"]


def test_other_valid_first_event_opens_default_session_and_is_handled() -> None:
    first: Event = {"type": TEXT, "text": "first", "client_event_seq": 1}
    opened = first_message(registry(), first)
    assert opened.first == first
    assert opened.created()["session"] == {}
    assert opened.receive(first) is TO_ENGINE
    # The first input counted as received.
    opened.session.detach(1, 0.0)
    attempt = opened.session.begin_resume(opened.token, 0, 1.0)
    assert opened.session.resumed_event(attempt)["last_received_client_event_seq"] == 1


def test_heartbeat_as_first_message_opens_and_is_answered() -> None:
    opened = first_message(registry(), {"type": "session.heartbeat"})
    decision = opened.receive({"type": "session.heartbeat"})
    assert decision.action is Action.REPLY and decision.frame is not None
    assert json.loads(decision.frame) == {
        "type": "session.heartbeat_ack",
        "session_id": opened.session.id,
    }


def test_event_ack_zero_as_first_message_opens_a_session() -> None:
    ack: Event = {"type": "session.event_ack", "server_event_seq": 0}
    opened = first_message(registry(), ack)
    assert opened.first == ack
    assert opened.receive(ack) is IGNORE  # no error follows the created


def test_session_close_as_first_message_opens_then_closes() -> None:
    reg = registry()
    opened = first_message(reg, {"type": "session.close"})
    decision = opened.receive({"type": "session.close"})
    assert decision.action is Action.END and decision.terminal is not None
    assert decision.terminal.event == {
        "type": "session.closed",
        "session_id": opened.session.id,
        "reason": "client_close",
        "usage": decision.terminal.event["usage"],
    }
    assert decision.terminal.close_code == 1000
    assert decision.terminal.generation == 1  # to the connection that opened it
    assert reg.release(opened.session)
    assert reg.slots_held == 0


BAD_FIRST: list[tuple[Event, str]] = [
    ({"type": TEXT, "text": 5}, "bad_event"),
    ({"type": TEXT, "text": "x", "client_event_seq": 0}, "bad_event"),
    ({"type": "session.update", "session": "x"}, "bad_event"),
    ({"type": "session.update"}, "bad_event"),
    ({"type": "no.such.event"}, "unknown_event"),
    ({"type": "session.event_ack", "server_event_seq": 1}, "invalid_event_ack"),
    ({"type": "session.event_ack", "server_event_seq": -1}, "invalid_event_ack"),
    ({"type": "session.event_ack", "server_event_seq": "0"}, "invalid_event_ack"),
    ({"type": "session.event_ack"}, "invalid_event_ack"),
]
"""The first messages the core refuses (what the dialect cannot decode is the shell's:
tests/server/test_protocol_opening.py)."""


@pytest.mark.parametrize(("event", "code"), BAD_FIRST)
def test_bad_first_message_opens_no_session(event: Event, code: str) -> None:
    reg = registry()
    exc = refusal(first_message, reg, event)
    assert exc.code == code
    assert exc.retryable is False
    assert exc.close_code is None  # the connection stays open
    assert reg.slots_held == 0 and not reg.sessions
    # The connection may still open a session.
    first_message(reg, UPDATE)
    assert reg.slots_held == 1


# -- admission ---------------------------------------------------------------------------------


def test_full_server_refuses_with_resource_exhausted_and_1013() -> None:
    reg = registry(max_sessions=2)
    first_message(reg, UPDATE)
    first_message(reg, UPDATE)
    exc = refusal(first_message, reg, UPDATE)
    assert exc.code == ErrorCode.RESOURCE_EXHAUSTED
    assert exc.close_code == 1013
    error = exc.to_event(UPDATE)
    assert error["retryable"] is True
    assert isinstance(error["message"], str) and error["message"]
    assert reg.slots_held == 2


def test_a_detached_session_holds_its_slot_until_it_expires() -> None:
    reg = registry(max_sessions=1, disconnect_grace_s=30)
    first = first_message(reg, UPDATE)
    first.receive({"type": TEXT, "text": "x"}, now=0.0)  # it spoke: the whole grace
    first.session.detach(1, 0.0)
    assert first.session.poll(29.0) is None
    assert refusal(first_message, reg, UPDATE).code == ErrorCode.RESOURCE_EXHAUSTED
    terminal = first.session.poll(30.0)
    assert terminal is not None and terminal.reason == "disconnect_grace_expired"
    assert reg.release(first.session)
    assert reg.slots_held == 0
    first_message(reg, UPDATE)


def test_an_opening_session_holds_a_slot() -> None:
    reg = registry(max_sessions=1)
    session, _ = reg.admit({})  # session.created cannot be sent yet
    assert session.state is State.OPENING
    assert reg.slots_held == 1
    assert refusal(first_message, reg, UPDATE).code == ErrorCode.RESOURCE_EXHAUSTED
    session.handshake_delivered(0.0)
    assert session.is_current(1)


def test_refused_open_leaves_slots_as_they_were() -> None:
    reg = registry(max_sessions=1)
    owner = first_message(reg, UPDATE)
    for _ in range(3):
        assert refusal(first_message, reg, UPDATE).code == ErrorCode.RESOURCE_EXHAUSTED
    assert reg.slots_held == 1
    assert owner.receive({"type": "session.close"}).action is Action.END
    assert reg.release(owner.session)
    first_message(reg, UPDATE)  # the slot came back, once
    assert refusal(first_message, reg, UPDATE).code == ErrorCode.RESOURCE_EXHAUSTED


def test_delivered_created_makes_the_session_resumable() -> None:
    opened = first_message(registry(), UPDATE)
    opened.session.detach(1, 0.0)
    attempt = opened.session.begin_resume(opened.token, 0, 1.0)
    assert opened.session.commit_resume(attempt, 1.0) is not None
