"""The errors the client raises about the session or the server."""

from __future__ import annotations

from typing import Any

import attrs

Event = dict[str, Any]


# -- errors ----------------------------------------------------------------------------


class ClientError(Exception):
    """Base of every error the client raises about the session or the server."""


@attrs.define(eq=False)
class ServerRefused(ClientError):
    """The server answered the open or resume with ``error{code}`` (or a refusing close)."""

    code: str | None
    message: str
    close_code: int | None = None
    retryable: bool = False
    """The server said the same request may succeed later (``error.retryable``)."""
    reason: str | None = None
    """The error's ``reason``, when it gave one: e.g. ``node_lost`` on a
    ``session_resume_expired`` (cluster mode: the session's home node is gone)."""

    def __str__(self) -> str:
        if self.code is not None:
            reason = f" ({self.reason})" if self.reason is not None else ""
            return f"{self.code}{reason}: {self.message}"
        if self.close_code is not None:
            return f"closed {self.close_code}: {self.message}"
        return self.message


class ResumeRefused(ServerRefused):
    """A terminal resume refusal: ``session_resume_expired`` (``reason`` ``node_lost``:
    the session's home node is gone), ``invalid_resume_token``, ``invalid_session_resume``
    or close 4001. The session cannot be resumed again."""


@attrs.define(eq=False)
class SessionReplaced(ClientError):
    """Another connection resumed this session (``session.replaced``, close 4000)."""

    generation: int | None

    def __str__(self) -> str:
        return f"session taken over by attachment generation {self.generation}"


@attrs.define(eq=False)
class ReconnectFailed(ClientError):
    """No connection could be (re)established within the attempts or the deadline."""

    attempts: int
    elapsed: float
    last_error: str

    def __str__(self) -> str:
        return f"gave up after {self.attempts} attempts in {self.elapsed:.1f}s: {self.last_error}"


@attrs.define(eq=False)
class SessionEnded(ClientError):
    """The session is over (closed, expired, closing or detached); ``event`` is the
    terminal event when one arrived."""

    event: Event | None = None

    def __str__(self) -> str:
        if self.event is None:
            return "the session has ended"
        return f"the session has ended: {self.event.get('type')} ({self.event.get('reason')})"


class ProtocolViolation(ClientError):
    """The server broke docs/protocol.md (e.g. its first frame was neither created nor resumed)."""


@attrs.define(eq=False)
class EventTooLarge(ClientError, ValueError):
    """An event would exceed the server's ``max_event_bytes``; it was not queued."""

    size: int
    limit: int

    def __str__(self) -> str:
        return f"event is {self.size} bytes, the server accepts at most {self.limit}"
