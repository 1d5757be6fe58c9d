"""Every event of the protocol by name, and a constructor for each one the protocol builds.

Event types, terminal reasons and error codes are named here once (``StrEnum``s, which
are ``str``: they compare equal to the strings on the wire and encode as them). The
sets the server, the client and the simulation kit share (control, terminal, managed)
are defined here once. Every server event is built by its constructor below, and so is
every protocol event the client sends; engine events (``response.*``) are the engine's.

Pure: dicts out, nothing encoded (a dialect does that: ``trio_duplex.dialects``).
"""

from __future__ import annotations

import enum
from typing import Any, Final

PROTOCOL_VERSION: Final = 2
"""The version of docs/protocol.md this package speaks (its title states it)."""
DEFAULT_PATH: Final = "/v1/duplex"
SUBPROTOCOL: Final = "trio-duplex"
"""The WebSocket subprotocol selected when a client offers it (docs/protocol.md)."""

Event = dict[str, Any]


class EventType(enum.StrEnum):
    # client -> server
    UPDATE = "session.update"
    RESUME = "session.resume"
    EVENT_ACK = "session.event_ack"
    HEARTBEAT = "session.heartbeat"
    CLOSE = "session.close"
    PLAYBACK_CLEAR = "output_audio_buffer.clear"
    """The client stopped the playback of what it was sent (OpenAI's WebRTC calls: the
    call's transport acts on it, before the core sees it); consumed here, a no-op."""
    # server -> client
    CREATED = "session.created"
    RESUMED = "session.resumed"
    UPDATED = "session.updated"
    REPLACED = "session.replaced"
    RESYNC_REQUIRED = "session.resync_required"
    HEARTBEAT_ACK = "session.heartbeat_ack"
    GOING_AWAY = "session.going_away"
    CLOSED = "session.closed"
    EXPIRED = "session.expired"
    ERROR = "error"
    INPUT_CONSUMED = "input.consumed"
    """How far the engine has taken the client's input (flow control, protocol v2)."""
    # audio (protocol v2: carried in binary messages on a session with audio.wire binary)
    INPUT_AUDIO_APPEND = "input_audio_buffer.append"
    OUTPUT_AUDIO_DELTA = "response.output_audio.delta"


class Reason(enum.StrEnum):
    """Why a session ended (``session.closed`` / ``session.expired`` ``reason``)."""

    CLIENT_CLOSE = "client_close"
    ENGINE_FINISHED = "engine_finished"
    ENGINE_ERROR = "engine_error"
    UNDELIVERED = "session_created_undelivered"
    SHUTDOWN = "server_shutdown"
    GRACE_EXPIRED = "disconnect_grace_expired"
    IDLE_EXPIRED = "idle_ttl_expired"
    UPSTREAM_LOST = "upstream_lost"
    """The service an engine fronts is gone (``engines.api.UpstreamLost``; the
    ``realtime-proxy`` engine's upstream WebSocket closed or failed)."""
    REVOKED = "credential_revoked"
    """The API key the session was opened with (its NAME) was removed from
    ``--api-key-file`` and the server reloaded it (SIGHUP)."""
    MIGRATED = "migrated"
    """The session moved to another node (core/migration.py). Never sent: its node has
    already finished the connection with ``session.going_away {migrating: true}``."""


class ErrorCode(enum.StrEnum):
    """The ``code`` of an ``error`` event."""

    INVALID_JSON = "invalid_json"
    BAD_EVENT = "bad_event"
    UNKNOWN_EVENT = "unknown_event"
    INVALID_EVENT_ACK = "invalid_event_ack"
    CONFIG_TIMEOUT = "config_timeout"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    INPUT_BACKPRESSURE = "input_backpressure"
    CONFIG_TOO_LARGE = "config_too_large"
    UNAUTHORIZED = "unauthorized"
    CONFIG_LOCKED = "config_locked"
    SERVER_SHUTTING_DOWN = "server_shutting_down"
    UNSUPPORTED_SESSION_RESUME = "unsupported_session_resume"
    INVALID_SESSION_RESUME = "invalid_session_resume"
    INVALID_RESUME_TOKEN = "invalid_resume_token"
    SESSION_RESUME_EXPIRED = "session_resume_expired"
    SESSION_RESUME_CONFLICT = "session_resume_conflict"
    SESSION_HOME_UNREACHABLE = "session_home_unreachable"
    """Cluster mode: the session lives on another node, alive, that this one could not
    reach to relay the resume. Retryable (close 1013)."""
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    """``session.audio`` asks for a wire, format or rate the server (or the engine) does
    not support; ``param`` names the field. No session is opened."""
    UNEXPECTED_CLIENT_EVENT_SEQ = "unexpected_client_event_seq"
    """A ``client_event_seq`` past the next one expected: refused (retryable) so that no
    event overtakes one that was refused; ``expected_client_event_seq`` says which to send."""
    ENGINE_ERROR = "engine_error"
    """The engine broke before a session existed (its factory, or its check of the first
    message). Not retryable: the server cannot tell a passing fault from a broken engine."""


EXPIRY_REASONS: Final = frozenset({Reason.GRACE_EXPIRED, Reason.IDLE_EXPIRED})
"""Reasons that end a session with ``session.expired`` rather than ``session.closed``."""

RETRYABLE_CODES: Final = frozenset(
    {
        ErrorCode.RESOURCE_EXHAUSTED,
        ErrorCode.INPUT_BACKPRESSURE,
        ErrorCode.SESSION_RESUME_CONFLICT,
        ErrorCode.SERVER_SHUTTING_DOWN,
        ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ,
        ErrorCode.SESSION_HOME_UNREACHABLE,
    }
)
"""Error codes whose request may succeed if sent again later."""

RESUME_REFUSALS: Final = frozenset(
    {
        ErrorCode.SESSION_RESUME_EXPIRED,
        ErrorCode.INVALID_RESUME_TOKEN,
        ErrorCode.INVALID_SESSION_RESUME,
    }
)
"""Refusals after which the session can never be resumed."""

TERMINAL_EVENTS: Final = frozenset({EventType.CLOSED, EventType.EXPIRED})
"""The events that end a session: exactly one per session, and nothing after it."""

INPUT_DTMF: Final = "input.dtmf"
"""An engine event no client sends itself: a key a phone's caller pressed, ``{"type":
"input.dtmf", "digit": "5"}``, one of ``DTMF_DIGITS``, made by a telephony dialect's
channel (dialects/twilio) from the provider's own message; an engine takes it if its
``accepts`` names it (engines.api)."""
DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")

CONTROL_EVENTS: Final = frozenset(
    {
        EventType.CREATED,
        EventType.RESUMED,
        EventType.REPLACED,
        EventType.RESYNC_REQUIRED,
        EventType.HEARTBEAT_ACK,
        EventType.GOING_AWAY,
        EventType.ERROR,
        EventType.INPUT_CONSUMED,
        *TERMINAL_EVENTS,
    }
)
"""Server events that are never journaled and carry no ``server_event_seq``."""

SESSION_INPUT: Final = frozenset(
    {EventType.UPDATE, EventType.HEARTBEAT, EventType.CLOSE, EventType.PLAYBACK_CLEAR}
)
"""Client events the session itself answers, whatever its engine accepts."""

MANAGED_EVENTS: Final = frozenset(
    {EventType.RESUME, EventType.HEARTBEAT, EventType.EVENT_ACK, EventType.CLOSE}
)
"""Client events a client library sends itself (never on the application's behalf)."""


# -- server events -----------------------------------------------------------------------


def created(session_id: str, config: Event, token: str, generation: int, limits: Event) -> Event:
    return {
        "type": EventType.CREATED,
        "session_id": session_id,
        "session": config,
        "resume_token": token,
        "attachment_generation": generation,
        "limits": limits,
    }


def resumed(
    session_id: str,
    config: Event,
    token: str,
    generation: int,
    last_client_seq: int,
    consumed_client_seq: int = 0,
) -> Event:
    return {
        "type": EventType.RESUMED,
        "session_id": session_id,
        "session": config,
        "resume_token": token,
        "attachment_generation": generation,
        "last_received_client_event_seq": last_client_seq,
        "consumed_client_event_seq": consumed_client_seq,
    }


def input_consumed(consumed_client_seq: int) -> Event:
    """How far the session is done with the client's input (protocol v2, ``core.flow``)."""
    return {"type": EventType.INPUT_CONSUMED, "consumed_client_event_seq": consumed_client_seq}


def updated(session_id: str, config: Event) -> Event:
    return {"type": EventType.UPDATED, "session_id": session_id, "session": config}


def replaced(session_id: str, generation: int) -> Event:
    return {
        "type": EventType.REPLACED,
        "session_id": session_id,
        "attachment_generation": generation,
    }


def resync_required(reason: str, dropped_through: int) -> Event:
    """``reason``: ``journal_overflow`` (live) or ``journal_gap`` (on resume)."""
    return {
        "type": EventType.RESYNC_REQUIRED,
        "reason": reason,
        "dropped_through_seq": dropped_through,
    }


def heartbeat_ack(session_id: str) -> Event:
    return {"type": EventType.HEARTBEAT_ACK, "session_id": session_id}


def going_away(time_left_ms: int, *, migrating: bool = False) -> Event:
    """``migrating``: the session is being handed to another node (cluster mode): resume
    it, elsewhere, at once."""
    event: Event = {"type": EventType.GOING_AWAY, "time_left_ms": time_left_ms}
    if migrating:
        event["migrating"] = True
    return event


def ended(session_id: str, reason: Reason, usage: dict[str, int] | None = None) -> Event:
    """The terminal event: ``session.expired`` for an expiry, else ``session.closed``;
    with the session's ``usage`` when given."""
    kind = EventType.EXPIRED if reason in EXPIRY_REASONS else EventType.CLOSED
    event: Event = {"type": kind, "session_id": session_id, "reason": reason}
    if usage is not None:
        event["usage"] = usage
    return event


def error(
    code: str, message: str, *, event_id: str | None = None, param: str | None = None
) -> Event:
    event: Event = {
        "type": EventType.ERROR,
        "code": code,
        "message": message,
        "retryable": code in RETRYABLE_CODES,
    }
    if event_id is not None:
        event["event_id"] = event_id
    if param is not None:
        event["param"] = param
    return event


# -- protocol events a client sends ------------------------------------------------------


def update(config: Event) -> Event:
    return {"type": EventType.UPDATE, "session": config}


def resume(session_id: str, token: str, last_server_seq: int) -> Event:
    return {
        "type": EventType.RESUME,
        "session_id": session_id,
        "resume_token": token,
        "last_received_server_event_seq": last_server_seq,
    }


def event_ack(server_seq: int) -> Event:
    return {"type": EventType.EVENT_ACK, "server_event_seq": server_seq}


def heartbeat() -> Event:
    return {"type": EventType.HEARTBEAT}


def close(reason: str | None = None) -> Event:
    event: Event = {"type": EventType.CLOSE}
    if reason is not None:
        event["reason"] = reason
    return event
