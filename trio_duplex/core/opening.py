"""What a connection's first message may be (docs/protocol.md, "Opening a session").

Sans-IO: no trio, no socket, no clock. The session shell (server/sessions/opening.py)
reads the first message and asks here, in this order, acting only on the answers:

1. ``first_step(grant, event)``: a ``Resume`` (its fields checked), or None;
2. else ``open_with`` (or ``open_spoken`` for the upgrade of a dialect that speaks
   first): an ``Open`` whose configuration is the one the session gets (a client
   token's locked one wins over the one asked);
3. once the engine exists and has checked the event, ``check_first_event``;
4. once the engine's audio rate is known, ``check_audio``.

Each rule raises the ``ProtocolError`` the client is answered with. ``Grant`` is what the
upgrade's credential allowed (the front door's Gate makes one per upgrade).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

import attrs

from .credentials import digest
from .events import ErrorCode, Event, EventType
from .frames import CloseCode
from .wire import ConfigBudget, ProtocolError, is_seq


@attrs.frozen(repr=False)
class Assigned:
    """A session whose id and resume token the upgrade's door decided (a telephony call's,
    derived from its call id: server/twilio/tickets.py). Its token never rotates
    (``Credentials.fixed``). Never shown whole: its repr names the session only."""

    session_id: str
    token: str

    def __repr__(self) -> str:
        return f"Assigned({self.session_id!r})"


@attrs.frozen(repr=False)
class Grant:
    """What an upgrade's credential allows."""

    principal: str | None
    """The API key's name (None without authentication, or for a resume-only grant)."""
    resume_of: str | None = None
    """A resume token's session: the first message must be its ``session.resume``."""
    locked: dict[str, Any] | None = None
    """A client token's locked configuration: the session gets it and cannot change it."""
    relayed: bool = False
    """Cluster mode: another node relays this connection (relay.py): it resumes
    ``resume_of``, which must be here (it is never relayed on)."""
    elsewhere: bytes | None = None
    """Cluster mode: the digest of a credential nothing here knows, maybe the resume token
    of a session on another node: the first message must be a ``session.resume`` with
    exactly that token (which the session's home then checks)."""
    assigned: Assigned | None = None
    """A session this upgrade opens gets this id and this fixed token (``Assigned``)."""

    def __repr__(self) -> str:
        return (
            f"Grant(principal={self.principal!r}, resume_of={self.resume_of!r}, "
            f"relayed={self.relayed}, elsewhere={self.elsewhere is not None}, "
            f"assigned={self.assigned!r})"
        )

    @property
    def resume_only(self) -> bool:
        return self.resume_of is not None or self.elsewhere is not None

    def allows_resume(self, event: Mapping[str, Any]) -> bool:
        """May a connection with this grant send ``event`` (its first message)? Only a
        ``session.resume`` with a resume-only grant."""
        if self.resume_of is None and self.elsewhere is None:
            return True
        if event.get("type") != "session.resume":
            return False
        if self.resume_of is not None:
            return bool(event.get("session_id") == self.resume_of)
        token = event.get("resume_token")
        assert self.elsewhere is not None
        return isinstance(token, str) and hmac.compare_digest(digest(token), self.elsewhere)


OPEN = Grant(None)
"""The grant of every upgrade when authentication is off."""


@attrs.frozen
class Resume:
    """A first message that resumes a session, its fields checked."""

    session_id: str
    token: str = attrs.field(repr=False)
    last_seq: int
    """``last_received_server_event_seq``: the replay starts after it."""


@attrs.frozen
class Open:
    """A first message that opens a session with ``config``."""

    config: dict[str, Any]
    first: Event | None
    """The event the session handles first, as its input: None for ``session.update``,
    whose configuration ``config`` is (checked already: no engine needs to see it)."""


NOT_FAULTS = frozenset(
    {
        ErrorCode.RESOURCE_EXHAUSTED,
        ErrorCode.SERVER_SHUTTING_DOWN,
        ErrorCode.SESSION_RESUME_CONFLICT,
    }
)
"""Refusals that are the server's state, not the client's fault: not reported."""

CONFIG_TIMEOUT = ProtocolError(
    ErrorCode.CONFIG_TIMEOUT, "no first message in time", close_code=CloseCode.CONFIG_TIMEOUT
)
"""No first message within ``config_timeout_s``."""


def resume_only() -> ProtocolError:
    """An upgrade whose credential is a resume token did something but resume its session."""
    return ProtocolError(
        ErrorCode.UNAUTHORIZED,
        "this credential only resumes its own session",
        close_code=CloseCode.POLICY_VIOLATION,
    )


def autostart(grant: Grant) -> dict[str, Any]:
    """``?autostart=1``: the configuration of a session opened with no first message."""
    if grant.resume_only:
        raise resume_only()
    return {} if grant.locked is None else dict(grant.locked)


def first_step(grant: Grant, event: Event) -> Resume | None:
    """The first message's resume, or None: it opens a session (``open_with`` next).
    ProtocolError: not allowed by ``grant``, or a malformed resume."""
    if not grant.allows_resume(event):
        raise resume_only()
    return _resume(event) if event["type"] == EventType.RESUME else None


def open_with(grant: Grant, event: Event, max_config_bytes: int) -> Open:
    """The session a first message other than a resume opens. A ``session.update`` has
    passed the input check first (its ``session`` is an object); any other event is the
    engine's to check next. ProtocolError: a locked configuration changed, or one over
    ``max_config_bytes``."""
    locked = grant.locked
    if event["type"] != EventType.UPDATE:
        return Open({} if locked is None else dict(locked), event)
    config = dict(event["session"])
    if locked is not None:  # the client token's configuration, whatever is asked
        for key, value in config.items():
            if key not in locked or locked[key] != value:
                raise _config_locked(f"session.{key}")
        config = dict(locked)
    ConfigBudget.of(config, max_config_bytes)  # ProtocolError: too large
    return Open(config, None)


def open_spoken(
    grant: Grant, event: Event, max_config_bytes: int, *, transport_audio: bool = False
) -> Open:
    """The session the upgrade of a dialect that speaks first opens (``event``: its
    ``Dialect.opening``, a ``session.update`` of the dialect's defaults and the query's
    ``model``). The upgrade asks for nothing but ``model``: with a locked configuration
    the session gets that configuration, as ``?autostart=1``'s does; ``model`` must then
    equal the locked ``model`` if it sets one, and is ignored if it does not.
    ProtocolError: another model than the locked one (``config_locked``, close 1008).
    ``transport_audio``: the opening's ``audio`` is its transport's (a call's media
    track), which the session gets whatever the locked configuration says."""
    locked = grant.locked
    if locked is None or event["type"] != EventType.UPDATE:
        return open_with(grant, event, max_config_bytes)
    model = event["session"].get("model")
    if model is not None and "model" in locked and locked["model"] != model:
        raise _config_locked("model")
    config = dict(locked)
    if transport_audio and "audio" in event["session"]:
        config["audio"] = event["session"]["audio"]
    return Open(config, None)


def check_first_event(event: Event) -> None:
    """An opening event the engine has accepted: a first ``event_ack`` acknowledges
    nothing but 0 (no server event has been sent yet)."""
    if event["type"] == EventType.EVENT_ACK and event.get("server_event_seq") != 0:
        raise ProtocolError(
            ErrorCode.INVALID_EVENT_ACK,
            "no server event has been sent yet",
            param="server_event_seq",
        )


def check_audio(rate: int | None, config: Mapping[str, Any]) -> None:
    """An engine that declares no audio rate takes no ``session.audio``."""
    if rate is None and "audio" in config:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            "this server's engine declares no audio format: session.audio cannot be set",
            param="session.audio",
        )


def ended_during_resume() -> ProtocolError:
    """The session ended while its resume replayed, with a terminal event its resumer
    is not owed (another connection heard it)."""
    return ProtocolError.resume_refused(
        ErrorCode.SESSION_RESUME_EXPIRED, "the session ended during the resume"
    )


def other_dialect() -> ProtocolError:
    """A resume on the path of another dialect than the one its session was opened in."""
    return ProtocolError.resume_refused(
        ErrorCode.INVALID_SESSION_RESUME,
        "this session resumes only on the path of the dialect it was opened with",
    )


def not_resumable() -> ProtocolError:
    """A resume of a session still opening (its ``session.created`` not delivered):
    answered as one of a session that does not exist."""
    return ProtocolError.resume_refused(
        ErrorCode.SESSION_RESUME_EXPIRED, "no such session, or it has ended"
    )


def _resume(event: Event) -> Resume:
    session_id = event.get("session_id")
    token = event.get("resume_token")
    last = event.get("last_received_server_event_seq", 0)
    if not isinstance(session_id, str) or not isinstance(token, str) or not is_seq(last):
        raise ProtocolError.resume_refused(
            ErrorCode.INVALID_SESSION_RESUME,
            "session.resume needs session_id, resume_token (strings) and an optional "
            "non-negative integer last_received_server_event_seq",
        )
    return Resume(session_id, token, last)


def _config_locked(field: str | None = None) -> ProtocolError:
    return ProtocolError(
        ErrorCode.CONFIG_LOCKED,
        "the client token that opened this session locked its configuration"
        + ("" if field is None else f": {field}"),
        param="session" if field is None else field,
        close_code=CloseCode.POLICY_VIOLATION,
    )


__all__ = [
    "CONFIG_TIMEOUT",
    "NOT_FAULTS",
    "OPEN",
    "Assigned",
    "Grant",
    "Open",
    "Resume",
    "autostart",
    "check_audio",
    "check_first_event",
    "ended_during_resume",
    "first_step",
    "not_resumable",
    "open_spoken",
    "open_with",
    "other_dialect",
    "resume_only",
]


def engine_failed() -> ProtocolError:
    """The engine failed before a session existed (in its factory, ``prepare`` or the
    check of the first message): ``engine_error``, close 1011; no slot is held any more."""
    return ProtocolError(
        ErrorCode.ENGINE_ERROR,
        "the engine failed; no session was opened",
        close_code=CloseCode.INTERNAL_ERROR,
    )


def engine_not_ready(timeout_s: float) -> ProtocolError:
    """The engine was not ready within ``timeout_s``: a capacity refusal (retryable)."""
    return ProtocolError.not_ready(f"the engine was not ready within {timeout_s:g} s")
