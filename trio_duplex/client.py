"""The trio-duplex client: one resumable session over any number of connections.

::

    async with trio_duplex.client.connect("ws://127.0.0.1:8765/v1/duplex") as session:
        await session.send({"type": "input.text.append", "text": "hello"})
        async for event in session:
            print(event)

This file has two halves. ``SessionState`` is the client side of PROTOCOL.md as a
state machine with no I/O, no clock and no awaits: sequence numbers both ways, the
unconfirmed outbox, deduplication, the ack and heartbeat policies. ``ClientSession`` and
``connect`` are the trio shell around it: one supervisor task that connects, resumes with
backoff, and runs a reader and a single writer per connection.

Guarantees: every server event with a ``server_event_seq`` is yielded once, in order,
across reconnects; control events (no seq) are yielded once per arrival. Every event
given to ``send`` is stamped with ``client_event_seq`` and kept until the server is known
to have read it; after a resume exactly the events past the server's
``last_received_client_event_seq`` are sent again.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import random
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import attrs
import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.exceptions import WebSocketException as _WebSocketException
from websockets.trio.client import ClientConnection
from websockets.trio.client import connect as _ws_connect

from ._protocol import CLOSE_RESUME_REFUSED, encode, utf8_len

__all__ = [
    "AckPolicy",
    "Attached",
    "ClientError",
    "ClientOptions",
    "ClientSession",
    "ConnectionChange",
    "Disconnected",
    "EventTooLarge",
    "HeartbeatPolicy",
    "Limits",
    "ProtocolViolation",
    "ReconnectFailed",
    "ReconnectPolicy",
    "ResumeRefused",
    "ResumeState",
    "Retrying",
    "ServerRefused",
    "SessionEnded",
    "SessionReplaced",
    "SessionState",
    "StreamFactory",
    "Verdict",
    "connect",
]

log = logging.getLogger("trio_duplex.client")

Event = dict[str, Any]
StreamFactory = Callable[[], Awaitable[trio.abc.Stream]]
"""Opens the byte stream a connection runs on (tests: an in-memory stream)."""

MiB: Final = 1024 * 1024
MANAGED_EVENTS: Final = frozenset(
    {"session.resume", "session.heartbeat", "session.event_ack", "session.close"}
)
"""Client events the client sends itself; ``send`` refuses them."""
TERMINAL_EVENTS: Final = frozenset({"session.closed", "session.expired"})
RESUME_REFUSALS: Final = frozenset(
    {"session_resume_expired", "invalid_resume_token", "invalid_session_resume"}
)


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

    def __str__(self) -> str:
        return f"{self.code or 'closed ' + str(self.close_code)}: {self.message}"


class ResumeRefused(ServerRefused):
    """A terminal resume refusal: ``session_resume_expired``, ``invalid_resume_token``,
    ``invalid_session_resume`` or close 4001. The session cannot be resumed again."""


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
    """The server broke PROTOCOL.md (e.g. its first frame was neither created nor resumed)."""


@attrs.define(eq=False)
class EventTooLarge(ClientError, ValueError):
    """An event would exceed the server's ``max_event_bytes``; it was not queued."""

    size: int
    limit: int

    def __str__(self) -> str:
        return f"event is {self.size} bytes, the server accepts at most {self.limit}"


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
    since the connection was lost, whichever comes first. The default deadline matches
    the server's default ``disconnect_grace_s``: after it a resume cannot succeed.
    """

    initial_delay: float = attrs.field(default=0.1, validator=_positive)
    max_delay: float = attrs.field(default=5.0, validator=_positive)
    multiplier: float = attrs.field(default=2.0, validator=attrs.validators.ge(1.0))
    jitter: float = attrs.field(
        default=0.5, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    max_attempts: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    deadline: float = attrs.field(default=30.0, validator=_positive)

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


@attrs.frozen
class Limits:
    """The ``limits`` of ``session.created`` (defaults until the server has said)."""

    disconnect_grace_s: float = 30.0
    idle_ttl_s: float = 300.0
    journal_max_bytes: int = 8 * MiB
    max_event_bytes: int = 15 * MiB

    @classmethod
    def from_event(cls, value: object) -> Limits:
        if not isinstance(value, dict):
            return cls()
        fields = {
            name: value[name]
            for name in ("disconnect_grace_s", "idle_ttl_s", "journal_max_bytes", "max_event_bytes")
            if isinstance(value.get(name), int | float) and not isinstance(value[name], bool)
        }
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


@attrs.frozen
class Disconnected:
    """The connection was lost; the client will try to resume."""

    reason: str
    close_code: int | None


@attrs.frozen
class Retrying:
    """Attempt ``attempt`` starts after ``delay`` seconds."""

    attempt: int
    delay: float
    error: str


ConnectionChange = Attached | Disconnected | Retrying


# -- the state machine -----------------------------------------------------------------


class Verdict(enum.Enum):
    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    INTERNAL = "internal"
    """Consumed by the client (``session.heartbeat_ack``)."""
    END = "end"
    """A terminal event: deliver it; the session is over."""
    REPLACED = "replaced"
    """``session.replaced``: deliver it; another attachment owns the session now."""


@attrs.define(slots=True)
class _Outgoing:
    seq: int
    frame: str
    size: int


_HEARTBEAT: Final = encode({"type": "session.heartbeat"})


@attrs.define(eq=False, repr=False)
class SessionState:
    """The client half of protocol v1. Time comes in as ``now``; frames go out as text.

    Per connection the shell calls ``opening_frame``, feeds the first answer to
    ``on_handshake``, then loops ``next_frame``/``next_deadline`` in its writer and
    ``on_event`` in its reader.
    """

    config: dict[str, Any]
    acks: AckPolicy = AckPolicy()
    heartbeat: HeartbeatPolicy = HeartbeatPolicy()
    session_id: str | None = None
    resume_token: str | None = None
    generation: int = 0
    limits: Limits = Limits()
    # server -> client
    last_received_seq: int = 0
    """Highest ``server_event_seq`` received: dedup, and what a resume claims."""
    acked_seq: int = 0
    # client -> server
    next_client_seq: int = 1
    confirmed_seq: int = 0
    """Every client event up to this seq has been read by the server."""
    outbox: deque[_Outgoing] = attrs.field(factory=deque)
    """Unconfirmed client events, contiguous seqs in order: the resend buffer."""
    outbox_bytes: int = 0
    closing: bool = False
    close_reason: str | None = None
    ended: bool = False
    _unacked: int = 0
    _unacked_bytes: int = 0
    _unacked_since: float | None = None
    _sent_through: int = 0
    _heartbeats: deque[tuple[float, int]] = attrs.field(factory=deque)
    """Outstanding heartbeats on this connection: (sent at, last client seq before it)."""
    _last_heartbeat: float = 0.0
    _confirm_target: int = 0
    _close_sent: bool = False
    _resume_from: int = 0

    def __repr__(self) -> str:
        return (
            f"SessionState({self.session_id}, generation={self.generation}, "
            f"received={self.last_received_seq}, sent={self.next_client_seq - 1}, "
            f"confirmed={self.confirmed_seq})"
        )

    @classmethod
    def for_resume(cls, resume: ResumeState, **kwargs: Any) -> SessionState:
        return cls(
            {},
            session_id=resume.session_id,
            resume_token=resume.resume_token,
            last_received_seq=resume.last_server_event_seq,
            acked_seq=resume.last_server_event_seq,
            **kwargs,
        )

    def resume_state(self) -> ResumeState | None:
        if self.session_id is None or self.resume_token is None:
            return None
        return ResumeState(self.session_id, self.resume_token, self.last_received_seq)

    # -- handshake ---------------------------------------------------------------------

    def opening_frame(self) -> str:
        """The first frame of a connection: open a session, or resume ours."""
        if self.session_id is None:
            return encode({"type": "session.update", "session": self.config})
        self._resume_from = self.last_received_seq
        return encode(
            {
                "type": "session.resume",
                "session_id": self.session_id,
                "resume_token": self.resume_token,
                "last_received_server_event_seq": self.last_received_seq,
            }
        )

    def on_handshake(self, event: Event, now: float) -> Attached:
        """The server's first answer. Raises ServerRefused (see ``.retryable``),
        ResumeRefused or ProtocolViolation."""
        kind = event.get("type")
        if kind == "error":
            raise _refusal(event, resuming=self.session_id is not None)
        token = event.get("resume_token")
        generation = event.get("attachment_generation")
        if not isinstance(token, str) or type(generation) is not int:
            raise ProtocolViolation(f"{kind} without resume_token or attachment_generation")
        resumed = self.session_id is not None
        if not resumed:
            session_id = event.get("session_id")
            if kind != "session.created" or not isinstance(session_id, str):
                raise ProtocolViolation(f"expected session.created, got {kind!r}")
            self.session_id = session_id
            self.limits = Limits.from_event(event.get("limits"))
            if isinstance(event.get("session"), dict):
                self.config = event["session"]
        else:
            received = event.get("last_received_client_event_seq")
            if kind != "session.resumed" or event.get("session_id") != self.session_id:
                raise ProtocolViolation(f"expected session.resumed of {self.session_id}")
            if type(received) is not int or received < 0:
                raise ProtocolViolation("session.resumed without last_received_client_event_seq")
            if isinstance(event.get("session"), dict):
                self.config = event["session"]
            # The resume acked everything up to what it claimed.
            self.acked_seq = max(self.acked_seq, self._resume_from)
            self._unacked, self._unacked_bytes, self._unacked_since = 0, 0, None
            # Resuming from another process: our numbering continues after the server's.
            self.next_client_seq = max(self.next_client_seq, received + 1)
            self._confirm(received)
        self.resume_token = token
        self.generation = generation
        self._sent_through = self.confirmed_seq
        self._heartbeats.clear()
        self._last_heartbeat = now
        self._close_sent = False
        assert self.session_id is not None
        return Attached(self.session_id, generation, resumed, len(self.outbox))

    # -- client -> server --------------------------------------------------------------

    def enqueue(self, event: Mapping[str, Any]) -> int:
        """Stamp ``event`` with the next ``client_event_seq`` and queue it. Nothing changes
        if this raises (ValueError, TypeError, EventTooLarge)."""
        kind = event.get("type")
        if not isinstance(kind, str):
            raise ValueError("an event needs a string field 'type'")
        if kind in MANAGED_EVENTS:
            raise ValueError(f"{kind} is sent by the client itself; see ClientSession's methods")
        if "client_event_seq" in event:
            raise ValueError("client_event_seq is assigned by the client")
        seq = self.next_client_seq
        frame = encode({**event, "client_event_seq": seq})
        size = utf8_len(frame)
        if size > self.limits.max_event_bytes:
            raise EventTooLarge(size, self.limits.max_event_bytes)
        self.next_client_seq = seq + 1
        self.outbox.append(_Outgoing(seq, frame, size))
        self.outbox_bytes += size
        return seq

    def request_confirm(self) -> int:
        """Ask for a heartbeat after everything sent so far; returns the seq to wait for."""
        target = self.next_client_seq - 1
        self._confirm_target = max(self._confirm_target, target)
        return target

    def next_frame(self, now: float) -> str | None:
        """The next frame the writer should send, or None (then wait for ``next_deadline``).
        Taking a frame counts it as sent: a failed send ends the connection, and the next
        handshake resets what counts as sent."""
        if self._ack_due(now):
            self.acked_seq = self.last_received_seq
            self._unacked, self._unacked_bytes, self._unacked_since = 0, 0, None
            return encode({"type": "session.event_ack", "server_event_seq": self.acked_seq})
        if self._heartbeat_due(now):
            self._heartbeats.append((now, self._sent_through))
            self._last_heartbeat = now
            return _HEARTBEAT
        if self.outbox:
            index = self._sent_through + 1 - self.outbox[0].seq
            if index < len(self.outbox):
                item = self.outbox[max(index, 0)]
                self._sent_through = item.seq
                return item.frame
        if self.closing and not self._close_sent:
            self._close_sent = True
            close: Event = {"type": "session.close"}
            if self.close_reason is not None:
                close["reason"] = self.close_reason
            return encode(close)
        return None

    def next_deadline(self) -> float:
        deadline = self._last_heartbeat + self._heartbeat_interval()
        if self._heartbeats:
            deadline = min(deadline, self._heartbeats[0][0] + self.heartbeat.timeout)
        if self._unacked_since is not None:
            deadline = min(deadline, self._unacked_since + self.acks.max_delay)
        return deadline

    def heartbeat_overdue(self, now: float) -> bool:
        return bool(self._heartbeats) and now >= self._heartbeats[0][0] + self.heartbeat.timeout

    def has_room(self, max_events: int, max_bytes: int) -> bool:
        return len(self.outbox) < max_events and self.outbox_bytes < max_bytes

    # -- server -> client --------------------------------------------------------------

    def on_event(self, event: Event, size: int, now: float) -> Verdict:
        seq = event.get("server_event_seq")
        if type(seq) is int:
            if seq <= self.last_received_seq:
                return Verdict.DUPLICATE
            self.last_received_seq = seq
            self._unacked += 1
            self._unacked_bytes += size
            if self._unacked_since is None:
                self._unacked_since = now
            return Verdict.DELIVER
        kind = event.get("type")
        if kind == "session.heartbeat_ack":
            if self._heartbeats:
                _, barrier = self._heartbeats.popleft()
                self._confirm(barrier)
            return Verdict.INTERNAL
        if kind in TERMINAL_EVENTS:
            self.ended = True
            return Verdict.END
        if kind == "session.replaced":
            self.ended = True
            return Verdict.REPLACED
        return Verdict.DELIVER

    @property
    def ack_pending(self) -> bool:
        """Unacked events exist (the writer must be awake to time the ack)."""
        return self._unacked > 0

    # -- internals ---------------------------------------------------------------------

    def _confirm(self, seq: int) -> None:
        self.confirmed_seq = max(self.confirmed_seq, min(seq, self.next_client_seq - 1))
        outbox = self.outbox
        while outbox and outbox[0].seq <= self.confirmed_seq:
            self.outbox_bytes -= outbox.popleft().size

    def _ack_due(self, now: float) -> bool:
        if not self._unacked:
            return False
        every_bytes = min(self.acks.every_bytes, max(1, self.limits.journal_max_bytes // 4))
        return (
            self._unacked >= self.acks.every_events
            or self._unacked_bytes >= every_bytes
            or ((since := self._unacked_since) is not None and now >= since + self.acks.max_delay)
        )

    def _heartbeat_interval(self) -> float:
        return min(self.heartbeat.interval, self.limits.idle_ttl_s / 3)

    def _heartbeat_due(self, now: float) -> bool:
        if now >= self._last_heartbeat + self._heartbeat_interval():
            return True
        barrier = self._heartbeats[-1][1] if self._heartbeats else self.confirmed_seq
        unbarriered = self._sent_through - barrier
        if unbarriered <= 0:
            return False
        return (
            unbarriered >= self.heartbeat.confirm_every
            or self._sent_through >= self._confirm_target > barrier
        )


def _refusal(event: Event, *, resuming: bool) -> ServerRefused:
    code = event.get("code")
    code = code if isinstance(code, str) else None
    message = str(event.get("message", ""))
    if resuming and code in RESUME_REFUSALS:
        return ResumeRefused(code, message, CLOSE_RESUME_REFUSED)
    return ServerRefused(code, message, retryable=event.get("retryable") is True)


# -- the trio shell --------------------------------------------------------------------


@attrs.define(eq=False)
class _Loss:
    reason: str = "connection closed"
    close_code: int | None = None
    abort: bool = False
    fatal: ClientError | None = None


class _AttemptFailed(Exception):
    """One connection attempt failed in a way that another attempt might not."""


SessionStatus = Literal["connecting", "attached", "reconnecting", "closing", "ended", "failed"]


class ClientSession:
    """A session as the application sees it. Create it with ``connect``.

    ``send`` queues an event (stamped with ``client_event_seq``); iterate to receive.
    One task should iterate; any number may send. ``session_id``, ``generation``,
    ``limits`` and ``config`` reflect the latest handshake.
    """

    def __init__(
        self,
        url: str,
        state: SessionState,
        options: ClientOptions,
        *,
        on_change: Callable[[ConnectionChange], None] | None,
        open_stream: StreamFactory | None,
        rng: random.Random,
    ) -> None:
        self._url = url
        self._core = state
        self._options = options
        self._on_change = on_change
        self._open_stream = open_stream
        self._rng = rng
        self._events_tx, self._events_rx = trio.open_memory_channel[Event](math.inf)
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._stop = trio.Event()
        self._done = trio.Event()
        self._detaching = False
        self._attached = False
        self._started = False
        self._failure: ClientError | None = None
        self._scope = trio.CancelScope()
        """The supervisor's scope: shielded once attached, so that a cancelled block
        still gets its bounded close; ``connect`` cancels it when done."""
        self._terminal: Event | None = None
        self.duplicates_dropped = 0
        """Server events dropped because their seq had already been received."""

    def __repr__(self) -> str:
        return f"<ClientSession {self.session_id} generation={self.generation} {self.status}>"

    # -- what the application sees -----------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self._core.session_id

    @property
    def generation(self) -> int:
        return self._core.generation

    @property
    def limits(self) -> Limits:
        return self._core.limits

    @property
    def config(self) -> dict[str, Any]:
        return self._core.config

    @property
    def state(self) -> SessionState:
        """The protocol state machine (read it; don't change it)."""
        return self._core

    @property
    def status(self) -> SessionStatus:
        if self._failure is not None:
            return "failed"
        if self._done.is_set() or self._core.ended:
            return "ended"
        if self._core.closing or self._detaching:
            return "closing"
        if self._attached:
            return "attached"
        return "reconnecting" if self._started else "connecting"

    def resume_state(self) -> ResumeState:
        """Session id, current token and last received seq, for ``connect(resume=...)``."""
        state = self._core.resume_state()
        if state is None:
            raise SessionEnded()
        return state

    async def send(self, event: Mapping[str, Any]) -> int:
        """Queue ``event`` for the server and return its ``client_event_seq``.

        Waits only while the resend buffer is full. Cancelled, nothing was queued;
        returned, the event will reach the server exactly once unless the session fails.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        core, options = self._core, self._options
        while True:
            self._check_usable()
            if core.has_room(options.max_unconfirmed_events, options.max_unconfirmed_bytes):
                break
            core.request_confirm()  # a heartbeat barrier frees the buffer soonest
            self._wake.set()
            progress = self._progress
            await progress.wait()
        seq = core.enqueue(event)
        self._wake.set()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return seq

    async def confirm(self) -> None:
        """Wait until the server has read every event sent so far (each was received, or
        answered with an ``error`` that is already in the event stream)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        target = self._core.request_confirm()
        self._wake.set()
        while self._core.confirmed_seq < target:
            self._check_usable()
            progress = self._progress
            await progress.wait()

    async def receive(self) -> Event:
        """The next server event. Raises the session's error once it has failed, or
        SessionEnded once the terminal event has been received. Cancel-safe."""
        try:
            return await self._events_rx.receive()
        except trio.EndOfChannel:
            if self._failure is not None:
                raise self._failure from None
            raise SessionEnded(self._terminal) from None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except SessionEnded:
            raise StopAsyncIteration from None

    async def aclose(self, reason: str | None = None) -> None:
        """Close the session (``session.close``) and wait until it has ended. If cancelled,
        the close goes on; leaving ``connect`` bounds it by ``close_timeout``."""
        self._request_close(reason)
        await self._done.wait()

    async def detach(self) -> ResumeState:
        """Drop the connection without closing the session; the server keeps it for
        ``disconnect_grace_s``. Returns what ``connect(resume=...)`` needs. Events already
        received stay readable here, and a later resume starts after them."""
        state = self.resume_state()
        self._request_detach()
        await self._done.wait()
        return self._core.resume_state() or state

    # -- internals ---------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._done.is_set() or self._core.ended or self._core.closing or self._detaching:
            raise SessionEnded(self._terminal)

    def _notify_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _request_close(self, reason: str | None = None) -> None:
        if not self._core.closing:
            self._core.closing = True
            self._core.close_reason = reason
        self._wake.set()

    def _request_detach(self) -> None:
        self._detaching = True
        self._stop.set()
        self._wake.set()

    def _change(self, change: ConnectionChange) -> None:
        if self._on_change is not None:
            try:
                self._on_change(change)
            except Exception:
                log.exception("on_change callback failed")

    async def _finish(self, *, detach: bool) -> None:
        """Leave ``connect``: close or detach, bounded by ``close_timeout``, shielded."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self._options.close_timeout
            if detach:
                self._request_detach()
            else:
                self._request_close()
            await self._done.wait()
        if not self._done.is_set():
            log.info("session %s: close timed out; cutting the connection", self.session_id)

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                await self._supervise(task_status)
        except ClientError as exc:
            log.info("session %s failed: %s", self.session_id, exc)
            self._failure = exc
        finally:
            self._attached = False
            self._events_tx.close()
            self._done.set()
            self._notify_progress()
        if not self._started:
            task_status.started()  # connect() raises self._failure

    async def _supervise(self, task_status: trio.TaskStatus[None]) -> None:
        policy = self._options.reconnect
        failures = 0
        outage_start = trio.current_time()
        last_error = ""
        first = True
        while not (self._core.ended or self._detaching):
            if not first:
                elapsed = trio.current_time() - outage_start
                if failures >= policy.max_attempts or elapsed >= policy.deadline:
                    raise ReconnectFailed(failures, elapsed, last_error)
                delay = min(policy.delay(failures + 1, self._rng), policy.deadline - elapsed)
                self._change(Retrying(failures + 1, delay, last_error))
                with trio.move_on_after(delay):
                    await self._stop.wait()
                if self._detaching:
                    return
            first = False
            try:
                loss = await self._connection(task_status)
            except _AttemptFailed as exc:
                failures += 1
                last_error = str(exc)
                log.info("session %s: attempt failed: %s", self.session_id, last_error)
                continue
            except ResumeRefused as exc:
                if self._core.closing and exc.code == "session_resume_expired":
                    return  # our close won the race: the session is gone, as asked
                raise
            if loss.fatal is not None:
                raise loss.fatal
            if self._core.ended or self._detaching:
                return
            failures = 0
            outage_start = trio.current_time()
            last_error = loss.reason
            log.info("session %s: connection lost: %s", self.session_id, loss.reason)
            self._change(Disconnected(loss.reason, loss.close_code))

    async def _connection(self, task_status: trio.TaskStatus[None]) -> _Loss:
        """One connection: open it, handshake, then pump until it is lost."""
        deadline = trio.current_time() + self._options.open_timeout
        attached = False
        try:
            async with self._websocket(deadline) as ws:
                with trio.fail_at(deadline):
                    await ws.send(self._core.opening_frame())
                    reply = await self._first_answer(ws)
                try:
                    change = self._core.on_handshake(reply, trio.current_time())
                except ServerRefused as exc:
                    if exc.retryable:
                        raise _AttemptFailed(str(exc)) from None
                    raise
                attached = self._attached = True
                self._notify_progress()
                log.info(
                    "session %s: attached, generation %d%s",
                    change.session_id,
                    change.generation,
                    " (resumed)" if change.resumed else "",
                )
                self._change(change)
                if not self._started:
                    self._started = True
                    self._scope.shield = True
                    task_status.started()
                loss = await self._pump(ws)
                if loss.abort:
                    await trio.aclose_forcefully(ws.stream)
                return loss
        except InvalidURI as exc:
            raise ServerRefused(None, f"cannot connect: {exc}") from exc
        except InvalidStatus as exc:
            status = exc.response.status_code
            if 400 <= status < 500 and status != 429:  # e.g. 404: a wrong path stays wrong
                raise ServerRefused(None, f"WebSocket handshake refused: HTTP {status}") from exc
            raise _AttemptFailed(_describe(exc)) from exc
        except _TRANSIENT as exc:
            if attached:  # lost while closing the transport: still just a loss
                return _Loss(_describe(exc))
            raise _AttemptFailed(_describe(exc)) from exc
        finally:
            self._attached = False

    @asynccontextmanager
    async def _websocket(self, deadline: float) -> AsyncIterator[ClientConnection]:
        stream = None
        if self._open_stream is not None:
            with trio.fail_at(deadline):
                stream = await self._open_stream()
        async with _ws_connect(
            self._url,
            stream=stream,
            compression=None,
            proxy=None,
            open_timeout=max(deadline - trio.current_time(), 0.001),
            ping_interval=None,  # session.heartbeat is the keepalive
            close_timeout=self._options.transport_close_timeout,
            max_size=self._options.max_message_bytes,
            user_agent_header="trio-duplex-client",
            logger=_WEBSOCKETS_LOG,
        ) as ws:
            yield ws

    async def _first_answer(self, ws: ClientConnection) -> Event:
        try:
            message = await ws.recv()
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            if code == CLOSE_RESUME_REFUSED and self._core.session_id is not None:
                raise ResumeRefused(None, "resume refused", code) from None
            raise
        event = _parse(message)
        if event is None:
            raise ProtocolViolation("the server's first frame is not a JSON event")
        return event

    async def _pump(self, ws: ClientConnection) -> _Loss:
        loss = _Loss()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop, ws, loss, nursery.cancel_scope)
            await self._read_loop(ws, loss)
            nursery.cancel_scope.cancel()
        return loss

    async def _read_loop(self, ws: ClientConnection, loss: _Loss) -> None:
        core, deliver = self._core, self._events_tx.send_nowait
        while True:
            try:
                message = await ws.recv()
            except ConnectionClosed as exc:
                loss.reason = _describe(exc)
                loss.close_code = exc.rcvd.code if exc.rcvd is not None else None
                return
            event = _parse(message)
            if event is None or not isinstance(message, str):
                log.warning("session %s: ignored a frame that is not a JSON event", core.session_id)
                continue
            had_unacked = core.ack_pending
            verdict = core.on_event(event, utf8_len(message), trio.current_time())
            if verdict is Verdict.DUPLICATE:
                self.duplicates_dropped += 1
                continue
            if verdict is Verdict.INTERNAL:
                self._notify_progress()
                self._wake.set()
                continue
            deliver(event)
            if not had_unacked and core.ack_pending:
                self._wake.set()  # the writer times the ack from the first unacked event
            if verdict is Verdict.END:
                self._terminal = event
                loss.reason = f"{event.get('type')} ({event.get('reason')})"
                return
            if verdict is Verdict.REPLACED:
                generation = event.get("attachment_generation")
                loss.fatal = SessionReplaced(generation if type(generation) is int else None)
                return

    async def _write_loop(self, ws: ClientConnection, loss: _Loss, pump: trio.CancelScope) -> None:
        core = self._core
        try:
            while True:
                self._wake = trio.Event()
                now = trio.current_time()
                if self._detaching:
                    loss.reason = "detached"
                    break
                if core.heartbeat_overdue(now):
                    loss.reason = f"no heartbeat_ack within {core.heartbeat.timeout}s"
                    loss.abort = True
                    break
                frame = core.next_frame(now)
                if frame is None:
                    with trio.move_on_at(core.next_deadline()):
                        await self._wake.wait()
                    continue
                await ws.send(frame)
        except ConnectionClosed as exc:
            loss.reason = _describe(exc)
            loss.close_code = exc.rcvd.code if exc.rcvd is not None else None
        pump.cancel()


class _WebsocketsLog(logging.LoggerAdapter[logging.Logger]):
    """websockets 17.4's trio connection logs "unexpected internal error" (EOFError) when a
    failed send closes the stream while its reader is mid-batch: a benign race on a
    connection that is ending anyway (what it carried is replayed by the resume).
    Demoted to DEBUG so a terminal does not show a traceback for an ordinary cut."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg == "unexpected internal error" and isinstance(sys.exc_info()[1], EOFError):
            level, msg, args, kwargs = logging.DEBUG, "connection ended mid-batch", (), {}
        super().log(level, msg, *args, **kwargs)


_WEBSOCKETS_LOG = _WebsocketsLog(logging.getLogger("websockets.client"), {})

_TRANSIENT = (
    OSError,  # refused, reset, unreachable
    TimeoutError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    _WebSocketException,  # a cut handshake (InvalidMessage), a close (ConnectionClosed), ...
)
"""What one connection attempt may fail with and another may not. Attempts are bounded
by ReconnectPolicy, so a permanent problem misread as transient still ends."""


def _parse(message: str | bytes) -> Event | None:
    if not isinstance(message, str):
        return None
    try:
        event = json.loads(message)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    return event


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        if exc.rcvd is not None:
            reason = f" {exc.rcvd.reason}" if exc.rcvd.reason else ""
            return f"closed by the server: {exc.rcvd.code}{reason}"
        return "connection lost"
    if isinstance(exc, TimeoutError | trio.TooSlowError):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@asynccontextmanager
async def connect(
    url: str,
    session: Mapping[str, Any] | None = None,
    *,
    resume: ResumeState | None = None,
    options: ClientOptions | None = None,
    detach_on_exit: bool = False,
    on_change: Callable[[ConnectionChange], None] | None = None,
    open_stream: StreamFactory | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[ClientSession]:
    """Open a session (configured with ``session``), or resume one (``resume``), and keep
    it attached until the block is left.

    Entering returns once the session is attached; a failure to get there raises
    (ServerRefused, ResumeRefused, ReconnectFailed). Leaving closes the session with
    ``session.close``, or with ``detach_on_exit`` (or after ``detach()``) only drops the
    connection; either way within ``options.close_timeout``. Exceptions raised in the
    block come out unchanged.

    ``on_change`` is called with Attached / Disconnected / Retrying as the connection
    comes and goes. ``open_stream`` replaces the TCP connection (tests), ``rng`` the
    backoff jitter's randomness.
    """
    opts = options or ClientOptions()
    if resume is not None:
        if session is not None:
            raise ValueError("give either session (open) or resume, not both")
        state = SessionState.for_resume(resume, acks=opts.acks, heartbeat=opts.heartbeat)
    else:
        state = SessionState(dict(session or {}), acks=opts.acks, heartbeat=opts.heartbeat)
    client = ClientSession(
        url,
        state,
        opts,
        on_change=on_change,
        open_stream=open_stream,
        rng=rng or random.Random(),
    )
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(client._run)
            if client._started:
                try:
                    yield client
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    # Re-raised below, outside the nursery, so it is not wrapped in a group.
                    body_error = exc
                finally:
                    await client._finish(detach=detach_on_exit or client._detaching)
        finally:
            client._scope.cancel()
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
    if not client._started:
        raise client._failure or SessionEnded()
