"""The client's options and policies, the limits and resume state it keeps, and the
connection changes it reports (``on_change``)."""

from __future__ import annotations

import random
from typing import Any, Final

import attrs

MiB: Final = 1024 * 1024


# -- configuration ---------------------------------------------------------------------


def _positive(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class ReconnectPolicy:
    """Jittered exponential backoff, per outage (reset once attached again).

    Attempt ``n`` (1 for the first retry) waits ``min(max_delay, initial_delay *
    multiplier**(n-1))``, of which a random fraction up to ``jitter`` is taken off.
    The client gives up after ``max_attempts`` failed attempts or ``deadline`` seconds
    since the connection was lost (or since ``connect`` began), whichever comes first.
    The default deadline matches the server's default ``disconnect_grace_s``: after it a
    resume cannot succeed.
    """

    initial_delay: float = attrs.field(default=0.1, validator=_positive)
    max_delay: float = attrs.field(default=5.0, validator=_positive)
    multiplier: float = attrs.field(default=2.0, validator=attrs.validators.ge(1.0))
    jitter: float = attrs.field(
        default=0.5, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    max_attempts: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    deadline: float = attrs.field(default=30.0, validator=_positive)
    retry_open: bool = True
    """Retry the first connection too. False: until the session has been attached once,
    a failed attempt raises ReconnectFailed at once (an interactive client that should
    say "connection refused" now, not after the whole backoff); with several URLs, once
    each has failed, tried one after the other without backoff."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * rng.random())


@attrs.frozen(kw_only=True)
class AckPolicy:
    """Send ``session.event_ack`` once ``every_events`` events or ``every_bytes`` bytes
    are unacknowledged, or ``max_delay`` seconds after the oldest unacknowledged one.
    ``every_bytes`` is also capped at a quarter of the server's ``journal_max_bytes``."""

    every_events: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    every_bytes: int = attrs.field(default=1 * MiB, validator=attrs.validators.ge(1))
    max_delay: float = attrs.field(default=0.5, validator=_positive)


@attrs.frozen(kw_only=True)
class HeartbeatPolicy:
    """``session.heartbeat`` every ``interval`` seconds (at most a third of the server's
    ``idle_ttl_s``); no ``heartbeat_ack`` within ``timeout`` means the connection is dead.

    A heartbeat is also a barrier: the server reads a connection's frames in order, so its
    ack proves every event written before it was read (received, or answered with an
    error). The client sends one early after ``confirm_every`` unconfirmed events, which
    keeps the resend buffer short on a long-lived connection."""

    interval: float = attrs.field(default=15.0, validator=_positive)
    timeout: float = attrs.field(default=10.0, validator=_positive)
    confirm_every: int = attrs.field(default=64, validator=attrs.validators.ge(1))


@attrs.frozen(kw_only=True)
class ClientOptions:
    """Every policy of a client session, with defaults that suit the default server."""

    reconnect: ReconnectPolicy = ReconnectPolicy()
    acks: AckPolicy = AckPolicy()
    heartbeat: HeartbeatPolicy = HeartbeatPolicy()
    open_timeout: float = attrs.field(default=10.0, validator=_positive)
    """One attempt: TCP, WebSocket handshake and the server's first answer."""
    close_timeout: float = attrs.field(default=5.0, validator=_positive)
    """Leaving ``connect``: time allowed to close (or detach) cleanly before cutting."""
    transport_close_timeout: float = attrs.field(default=2.0, validator=_positive)
    """The WebSocket closing handshake of one connection."""
    max_unconfirmed_events: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    max_unconfirmed_bytes: int = attrs.field(default=16 * MiB, validator=attrs.validators.ge(1))
    """``send`` waits while the resend buffer holds this much (flow control)."""
    max_message_bytes: int | None = None
    """Largest server message accepted (None: no limit; audio can be large)."""
    api_key: str | None = attrs.field(default=None, repr=False)
    """Presented (``Authorization: Bearer``) to open a session on a server with
    ``--api-key-file``; a resume presents the session's resume token instead."""


@attrs.frozen
class Limits:
    """The ``limits`` of ``session.created`` (defaults until the server has said)."""

    disconnect_grace_s: float = 30.0
    idle_ttl_s: float = 300.0
    journal_max_bytes: int = 8 * MiB
    max_event_bytes: int = 15 * MiB
    max_pending_input: int | None = None
    """Protocol v2: the input bounds ``send`` paces by (None: the server did not say, so
    it sends no ``input.consumed`` reports either)."""
    max_pending_input_bytes: int | None = None

    @classmethod
    def from_event(cls, value: object) -> Limits:
        if not isinstance(value, dict):
            return cls()
        fields = {
            name: value[name]
            for name in ("disconnect_grace_s", "idle_ttl_s", "journal_max_bytes", "max_event_bytes")
            if isinstance(value.get(name), int | float) and not isinstance(value[name], bool)
        }
        for name in ("max_pending_input", "max_pending_input_bytes"):
            bound = value.get(name)
            if type(bound) is int and bound >= 1:
                fields[name] = bound
        return cls(**fields)


@attrs.frozen
class ResumeState:
    """What a later process needs to resume the session. The token is a secret: it is
    left out of ``repr`` and never logged."""

    session_id: str
    resume_token: str = attrs.field(repr=False)
    last_server_event_seq: int = 0


# -- connection changes (for ``on_change``) --------------------------------------------


@attrs.frozen
class Attached:
    """A connection now carries the session (``resumed`` False: it was just opened)."""

    session_id: str
    generation: int
    resumed: bool
    resent: int
    """Client events queued for (re)sending on this connection."""
    event: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    """The server's answer as it arrived: ``session.created`` or ``session.resumed``
    (it holds the new resume token: kept out of ``repr``)."""


@attrs.frozen
class Disconnected:
    """The connection was lost; the client will try to resume."""

    reason: str
    close_code: int | None


@attrs.frozen
class Retrying:
    """Retry ``attempt`` (1 for the first retry of an outage, or of the first connection)
    starts after ``delay`` seconds."""

    attempt: int
    delay: float
    error: str


ConnectionChange = Attached | Disconnected | Retrying
