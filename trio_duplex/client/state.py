"""The client side of docs/protocol.md as a state machine: no I/O, no clock, no awaits.

``SessionState`` keeps sequence numbers both ways, the unconfirmed outbox, replay
deduplication, and the ack and heartbeat policies (``options.py``), and raises the
client's errors (``errors.py``). ``session.py`` is the trio shell around it, and
``trio_duplex.client`` the public home of these names.
"""

from __future__ import annotations

import base64
import enum
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ..core import events
from ..core.events import (
    MANAGED_EVENTS,
    RESUME_REFUSALS,
    TERMINAL_EVENTS,
    ErrorCode,
    EventType,
)
from ..core.frames import CloseCode
from ..core.wire import utf8_len
from ..dialects import binary
from ..dialects.jsonwire import encode
from .dialect import NATIVE, ClientDialect
from .errors import EventTooLarge, ProtocolViolation, ResumeRefused, ServerRefused
from .options import AckPolicy, Attached, HeartbeatPolicy, Limits, ResumeState

Event = dict[str, Any]


# -- the state machine -----------------------------------------------------------------


class Verdict(enum.Enum):
    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    INTERNAL = "internal"
    """Consumed by the client (``session.heartbeat_ack``, ``input.consumed``, a refusal
    of one of its events that it resends)."""
    END = "end"
    """A terminal event: deliver it; the session is over."""
    REPLACED = "replaced"
    """``session.replaced``: deliver it; another attachment owns the session now."""


@attrs.define(slots=True)
class _Outgoing:
    seq: int
    frame: str | bytes
    """JSON text, or a binary message (input audio on protocol v2's binary lane)."""
    size: int


_HEARTBEAT: Final = encode(events.heartbeat())

RESEND_BACKOFF: Final = (0.05, 1.0)
"""After a retryable refusal of one of its events, the client resends from the refused
seq after this delay, doubled on each refusal up to the second figure, or as soon as an
``input.consumed`` report shows room was made."""
_RESEND_CODES: Final = frozenset(
    {ErrorCode.INPUT_BACKPRESSURE, ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ}
)


class Phase(enum.Enum):
    """Where a session is in its life, as ``SessionState`` sees it."""

    OPEN = "open"
    """Being opened or resumed, or running (the state machine does not track connections)."""
    CLOSING = "closing"
    """``request_close`` was called: ``session.close`` goes out after everything queued."""
    ENDED = "ended"
    """A terminal event or ``session.replaced`` arrived: nothing more will come."""


@attrs.define(eq=False, repr=False)
class SessionState:
    """The client half of the protocol. Time comes in as ``now``; frames go out as text.

    Per connection the shell calls ``opening_frame``, feeds the first answer to
    ``on_handshake``, then loops ``next_frame``/``next_deadline`` in its writer and
    ``on_event`` in its reader. Its state changes only through these methods (and
    ``enqueue``, ``request_confirm``, ``request_close``): every attribute is read-only.
    The constructor takes where a session starts (``for_resume`` fills it in).
    """

    _config: dict[str, Any]
    _acks: AckPolicy = attrs.field(factory=AckPolicy)
    _heartbeat: HeartbeatPolicy = attrs.field(factory=HeartbeatPolicy)
    _session_id: str | None = None
    _resume_token: str | None = None
    _generation: int = 0
    _limits: Limits = attrs.field(factory=Limits)
    # server -> client
    _last_received_seq: int = 0
    _acked_seq: int = 0
    # client -> server
    _next_client_seq: int = 1
    _confirmed_seq: int = 0
    _outbox: deque[_Outgoing] = attrs.field(init=False, factory=deque)
    _outbox_bytes: int = attrs.field(init=False, default=0)
    _phase: Phase = attrs.field(init=False, default=Phase.OPEN)
    _close_reason: str | None = attrs.field(init=False, default=None)
    _unacked: int = attrs.field(init=False, default=0)
    _unacked_bytes: int = attrs.field(init=False, default=0)
    _unacked_since: float | None = attrs.field(init=False, default=None)
    _sent_through: int = attrs.field(init=False, default=0)
    _heartbeats: deque[tuple[float, int]] = attrs.field(init=False, factory=deque)
    """Outstanding heartbeats on this connection: (sent at, last client seq before it)."""
    _last_heartbeat: float = attrs.field(init=False, default=0.0)
    _confirm_target: int = attrs.field(init=False, default=0)
    _close_sent: bool = attrs.field(init=False, default=False)
    _owe_hello: bool = attrs.field(init=False, default=False)
    """A new session's client has not spoken on it yet (see ``on_handshake``)."""
    _resume_from: int = attrs.field(init=False, default=0)
    # input flow control (protocol v2): sizes of the events above the consumption reported
    _unconsumed: deque[int] = attrs.field(init=False, factory=deque)
    _unconsumed_bytes: int = attrs.field(init=False, default=0)
    _resend_at: float = attrs.field(init=False, default=-math.inf)
    _backoff: float = attrs.field(init=False, default=RESEND_BACKOFF[0])
    _stale_through: int = attrs.field(init=False, default=0)
    """After a rewind: the highest seq sent before it, whose answers (refusals all) are
    still on their way and are dropped; 0: none."""
    _rewinds: int = attrs.field(init=False, default=0)
    _dialect: ClientDialect = attrs.field(default=NATIVE, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self._session_id is None and (update := self._dialect.first_update(self._config)):
            self.enqueue(update)  # (a dialect whose server speaks first: the first event)

    # -- read-only views ---------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The session's configuration (the server's copy once it has answered)."""
        return self._config

    @property
    def dialect(self) -> ClientDialect:
        """How the session's wire spells what the client reads and writes itself."""
        return self._dialect

    @property
    def acks(self) -> AckPolicy:
        return self._acks

    @property
    def heartbeat(self) -> HeartbeatPolicy:
        return self._heartbeat

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def resume_token(self) -> str | None:
        return self._resume_token

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def limits(self) -> Limits:
        return self._limits

    @property
    def last_received_seq(self) -> int:
        """Highest ``server_event_seq`` received: dedup, and what a resume claims."""
        return self._last_received_seq

    @property
    def acked_seq(self) -> int:
        """Highest ``server_event_seq`` acknowledged to the server."""
        return self._acked_seq

    @property
    def next_client_seq(self) -> int:
        return self._next_client_seq

    @property
    def confirmed_seq(self) -> int:
        """Every client event up to this seq has been read by the server."""
        return self._confirmed_seq

    @property
    def outbox(self) -> Sequence[_Outgoing]:
        """Unconfirmed client events, contiguous seqs in order: the resend buffer."""
        return self._outbox

    @property
    def outbox_bytes(self) -> int:
        return self._outbox_bytes

    @property
    def consumed_seq(self) -> int:
        """Every client event up to this seq was consumed by the server (``input.consumed``):
        taken by its engine, or refused for good."""
        return self._next_client_seq - 1 - len(self._unconsumed)

    @property
    def unconsumed(self) -> tuple[int, int]:
        """Events queued or sent above ``consumed_seq``, and their bytes as the server
        counts them: what ``has_room`` paces by."""
        return len(self._unconsumed), self._unconsumed_bytes

    @property
    def rewinds(self) -> int:
        """How many times a refusal made the client resend from a refused seq."""
        return self._rewinds

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def closing(self) -> bool:
        """A close was requested and the session has not ended yet."""
        return self._phase is Phase.CLOSING

    @property
    def ended(self) -> bool:
        return self._phase is Phase.ENDED

    @property
    def close_reason(self) -> str | None:
        """The ``reason`` given to ``request_close``."""
        return self._close_reason

    def __repr__(self) -> str:
        return (
            f"SessionState({self._session_id}, generation={self._generation}, "
            f"received={self._last_received_seq}, sent={self._next_client_seq - 1}, "
            f"confirmed={self._confirmed_seq})"
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
        if self._session_id is None or self._resume_token is None:
            return None
        return ResumeState(self._session_id, self._resume_token, self._last_received_seq)

    # -- handshake ---------------------------------------------------------------------

    def opening_url(self, url: str) -> str:
        """The URL a connection to ``url`` dials (the dialect may resume by its query)."""
        if self._session_id is None:
            return self._dialect.opening_url(url, None)
        self._resume_from = self._last_received_seq
        return self._dialect.opening_url(url, (self._session_id, self._resume_from))

    def opening_frame(self) -> str | None:
        """The first frame of a connection: open a session, or resume ours (None: the
        dialect's server speaks first, ``opening_url`` said it all)."""
        if self._session_id is None:
            return self._dialect.opening_frame(self._config, None)
        assert self._resume_token is not None, "a session id without its resume token"
        self._resume_from = self._last_received_seq
        resume = (self._session_id, self._resume_token, self._resume_from)
        return self._dialect.opening_frame(self._config, resume)

    def on_handshake(self, event: Event, now: float) -> Attached:
        """The server's first answer. Raises ServerRefused (see ``.retryable``),
        ResumeRefused or ProtocolViolation."""
        kind = event.get("type")
        if kind == EventType.ERROR:
            raise _refusal(self._dialect.error(event), resuming=self._session_id is not None)
        said = self._dialect.handshake(event)
        token, generation = said.resume_token, said.generation
        if not isinstance(token, str) or type(generation) is not int:
            raise ProtocolViolation(f"{kind} without resume_token or attachment_generation")
        resumed = self._session_id is not None
        if not resumed:
            if kind != EventType.CREATED or not isinstance(said.session_id, str):
                raise ProtocolViolation(f"expected session.created, got {kind!r}")
            self._session_id = said.session_id
            self._limits = Limits.from_event(said.limits)
            if isinstance(said.session, dict):
                self._config = said.session
        else:
            received = event.get("last_received_client_event_seq")
            if kind != EventType.RESUMED or said.session_id != self._session_id:
                raise ProtocolViolation(f"expected session.resumed of {self._session_id}")
            if type(received) is not int or received < 0:
                raise ProtocolViolation("session.resumed without last_received_client_event_seq")
            if isinstance(said.session, dict):
                self._config = said.session
            # The resume acked everything up to what it claimed.
            self._acked_seq = max(self._acked_seq, self._resume_from)
            self._unacked, self._unacked_bytes, self._unacked_since = 0, 0, None
            # Resuming from another process: our numbering continues after the server's.
            if received + 1 > self._next_client_seq:
                self._next_client_seq = received + 1
                self._unconsumed.clear()  # (another process's events: not ours to count)
                self._unconsumed_bytes = 0
            self._confirm(received)
            consumed = event.get("consumed_client_event_seq")
            if type(consumed) is int:
                self._consumed(consumed)
        self._resume_token = token
        self._generation = generation
        self._sent_through = self._confirmed_seq
        self._heartbeats.clear()
        self._last_heartbeat = now
        # A new session: the first frame tells the server we hold its credentials (a
        # session whose client never spoke after session.created is kept only for the
        # short unconfirmed grace); a heartbeat if nothing else goes. A resume shows it.
        self._owe_hello = not resumed
        self._close_sent = False
        self._stale_through = 0  # a new connection: nothing of the old one is answered
        self._resend_at, self._backoff = -math.inf, RESEND_BACKOFF[0]
        assert self._session_id is not None
        return Attached(self._session_id, generation, resumed, len(self._outbox), event)

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
        seq = self._next_client_seq
        frame: str | bytes
        audio = event.get("audio")
        if kind == EventType.INPUT_AUDIO_APPEND and isinstance(audio, bytes | bytearray):
            # Raw audio in the session's input format: a binary message on the binary
            # lane, base64 in JSON on the other.
            if self.audio_wire == "binary":
                frame = binary.input_message(seq, bytes(audio))
            else:
                b64 = base64.b64encode(audio).decode("ascii")
                frame = encode({**event, "audio": b64, "client_event_seq": seq})
        else:
            frame = encode({**event, "client_event_seq": seq})
        size = len(frame) if isinstance(frame, bytes) else utf8_len(frame)
        if size > self._limits.max_event_bytes:
            raise EventTooLarge(size, self._limits.max_event_bytes)
        self._next_client_seq = seq + 1
        self._outbox.append(_Outgoing(seq, frame, size))
        self._outbox_bytes += size
        self._unconsumed.append(len(frame))  # the server's measure: the message's length
        self._unconsumed_bytes += len(frame)
        return seq

    def request_close(self, reason: str | None = None) -> None:
        """Close the session: ``session.close`` (with ``reason``) goes out after everything
        already queued, on this connection or the next. Only the first request counts,
        and none once the session has ended."""
        if self._phase is Phase.OPEN:
            self._phase = Phase.CLOSING
            self._close_reason = reason

    def request_confirm(self) -> int:
        """Ask for a heartbeat after everything sent so far; returns the seq to wait for."""
        target = self._next_client_seq - 1
        self._confirm_target = max(self._confirm_target, target)
        return target

    @property
    def audio_wire(self) -> str:
        """``json`` or ``binary``: the lane audio travels on (``session.audio.wire`` as
        the server confirmed it, or as asked for before that)."""
        audio = self._config.get("audio")
        wire = audio.get("wire") if isinstance(audio, dict) else None
        return wire if isinstance(wire, str) else "json"

    def next_frame(self, now: float) -> str | bytes | None:
        """The next frame the writer should send, or None (then wait for ``next_deadline``).
        Taking a frame counts it as sent: a failed send ends the connection, and the next
        handshake resets what counts as sent."""
        frame = self._next_frame(now)
        if self._owe_hello:
            self._owe_hello = False
            if frame is None:
                self._heartbeats.append((now, self._sent_through))
                self._last_heartbeat = now
                frame = _HEARTBEAT
        return frame

    @property
    def owes_hello(self) -> bool:
        """A new session's client has sent nothing on it yet: ``next_frame`` gives a
        frame (a heartbeat if nothing else) that shows the server it holds the session's
        credentials, so that it keeps the session for the whole disconnect grace."""
        return self._owe_hello

    def _next_frame(self, now: float) -> str | bytes | None:
        if self._ack_due(now):
            self._acked_seq = self._last_received_seq
            self._unacked, self._unacked_bytes, self._unacked_since = 0, 0, None
            return encode(events.event_ack(self._acked_seq))
        if self._heartbeat_due(now):
            self._heartbeats.append((now, self._sent_through))
            self._last_heartbeat = now
            return _HEARTBEAT
        if now >= self._resend_at:  # (a resend's backoff is over, or there is none)
            self._resend_at = -math.inf
        if self._outbox and self._resend_at == -math.inf:
            index = self._sent_through + 1 - self._outbox[0].seq
            if index < len(self._outbox):
                item = self._outbox[max(index, 0)]
                self._sent_through = item.seq
                return item.frame
        if self._phase is Phase.CLOSING and not self._close_sent:
            self._close_sent = True
            return encode(events.close(self._close_reason))
        return None

    def next_deadline(self) -> float:
        deadline = self._last_heartbeat + self._heartbeat_interval()
        if self._heartbeats:
            deadline = min(deadline, self._heartbeats[0][0] + self._heartbeat.timeout)
        if self._unacked_since is not None:
            deadline = min(deadline, self._unacked_since + self._acks.max_delay)
        return min(deadline, self._resend_at) if self._resend_at > -math.inf else deadline

    def send_deadline(self) -> float:
        """When a send still not taken counts as the connection's loss: the oldest
        heartbeat's answer is due then (with none out, the next one's would be: a send
        that blocks keeps it from going out)."""
        if self._heartbeats:
            return self._heartbeats[0][0] + self._heartbeat.timeout
        return self._last_heartbeat + self._heartbeat_interval() + self._heartbeat.timeout

    def heartbeat_overdue(self, now: float) -> bool:
        return bool(self._heartbeats) and now >= self._heartbeats[0][0] + self._heartbeat.timeout

    def has_room(self, max_events: int, max_bytes: int) -> bool:
        """Room for one more event: the resend buffer holds fewer than ``max_events``
        and ``max_bytes``, and (protocol v2) the events above the consumption the server
        reported are fewer than its ``max_pending_input`` and hold fewer than its
        ``max_pending_input_bytes`` (core/flow.py: then the server never refuses them)."""
        if len(self._outbox) >= max_events or self._outbox_bytes >= max_bytes:
            return False
        limits = self._limits
        bound, bytes_bound = limits.max_pending_input, limits.max_pending_input_bytes
        return (bound is None or len(self._unconsumed) < bound) and (
            bytes_bound is None or self._unconsumed_bytes < bytes_bound
        )

    # -- server -> client --------------------------------------------------------------

    def on_event(self, event: Event, size: int, now: float) -> Verdict:
        seq = event.get("server_event_seq")
        if type(seq) is int:
            if seq <= self._last_received_seq:
                return Verdict.DUPLICATE
            self._last_received_seq = seq
            self._unacked += 1
            self._unacked_bytes += size
            if self._unacked_since is None:
                self._unacked_since = now
            if event.get("type") == EventType.UPDATED:
                whole = self._dialect.full_update(event)
                if whole is not None:
                    self._config = whole
            return Verdict.DELIVER
        kind = event.get("type")
        if kind == EventType.INPUT_CONSUMED:
            consumed = event.get("consumed_client_event_seq")
            if type(consumed) is int:
                self._consumed(consumed)
                self._resend_at, self._backoff = -math.inf, RESEND_BACKOFF[0]  # room was made
            return Verdict.INTERNAL
        if kind == EventType.ERROR:
            fields = self._dialect.error(event)
            if type(fields.get("client_event_seq")) is int:
                return self._on_refusal(fields, now)
            return Verdict.DELIVER
        if kind == EventType.HEARTBEAT_ACK:
            if self._heartbeats:  # else unasked for: nothing to confirm
                _, barrier = self._heartbeats.popleft()
                self._confirm(barrier)
            return Verdict.INTERNAL
        if kind in TERMINAL_EVENTS:
            self._phase = Phase.ENDED
            return Verdict.END
        if kind == EventType.REPLACED:
            self._phase = Phase.ENDED
            return Verdict.REPLACED
        return Verdict.DELIVER

    @property
    def ack_pending(self) -> bool:
        """Unacked events exist (the writer must be awake to time the ack)."""
        return self._unacked > 0

    # -- internals ---------------------------------------------------------------------

    def _consumed(self, seq: int) -> None:
        """The server consumed every event up to ``seq``, so it has read them too."""
        drop = min(seq - self.consumed_seq, len(self._unconsumed))
        for _ in range(drop):
            self._unconsumed_bytes -= self._unconsumed.popleft()
        self._confirm(seq)

    def _on_refusal(self, event: Mapping[str, Any], now: float) -> Verdict:
        """An ``error`` naming one of our events (its ``client_event_seq``).

        A retryable refusal (``input_backpressure``, ``unexpected_client_event_seq``)
        rewinds: every event from the seq the server expects is sent again, after a
        short backoff, and the answers still due to what was sent before the rewind
        (the server refuses each: nothing may overtake the refused one) are dropped.
        Since the server reads and answers a connection's messages in order, those
        answers all come before any answer to the resent events, the last of them
        naming the highest seq sent before the rewind. Other refusals are delivered."""
        refused: int = event["client_event_seq"]
        if self._stale_through:
            if refused >= self._stale_through:
                self._stale_through = 0
            return Verdict.INTERNAL
        code = event.get("code")
        if code not in _RESEND_CODES:
            return Verdict.DELIVER
        expected = event.get("expected_client_event_seq", refused)
        first = self._outbox[0].seq if self._outbox else self._next_client_seq
        if type(expected) is not int or not first <= expected <= min(refused, self._sent_through):
            raise ProtocolViolation(
                f"{code} asks for client_event_seq {expected!r}, which the client cannot "
                f"resend (it holds {first} to {self._next_client_seq - 1})"
            )
        if self._sent_through > refused:
            self._stale_through = self._sent_through
        self._sent_through = expected - 1
        # A heartbeat sent after the refused events must not confirm them.
        self._heartbeats = deque(
            (at, min(barrier, expected - 1)) for at, barrier in self._heartbeats
        )
        self._resend_at = now + self._backoff
        self._backoff = min(self._backoff * 2, RESEND_BACKOFF[1])
        self._rewinds += 1
        return Verdict.INTERNAL

    def _confirm(self, seq: int) -> None:
        self._confirmed_seq = max(self._confirmed_seq, min(seq, self._next_client_seq - 1))
        outbox = self._outbox
        while outbox and outbox[0].seq <= self._confirmed_seq:
            self._outbox_bytes -= outbox.popleft().size

    def _ack_due(self, now: float) -> bool:
        if not self._unacked:
            return False
        every_bytes = min(self._acks.every_bytes, max(1, self._limits.journal_max_bytes // 4))
        return (
            self._unacked >= self._acks.every_events
            or self._unacked_bytes >= every_bytes
            or ((since := self._unacked_since) is not None and now >= since + self._acks.max_delay)
        )

    def _heartbeat_interval(self) -> float:
        return min(self._heartbeat.interval, self._limits.idle_ttl_s / 3)

    def _heartbeat_due(self, now: float) -> bool:
        if now >= self._last_heartbeat + self._heartbeat_interval():
            return True
        barrier = self._heartbeats[-1][1] if self._heartbeats else self._confirmed_seq
        unbarriered = self._sent_through - barrier
        if unbarriered <= 0:
            return False
        return (
            unbarriered >= self._heartbeat.confirm_every
            or self._sent_through >= self._confirm_target > barrier
        )


def _refusal(event: Mapping[str, Any], *, resuming: bool) -> ServerRefused:
    code = event.get("code")
    code = code if isinstance(code, str) else None
    message = str(event.get("message", ""))
    reason = event.get("reason")
    reason = reason if isinstance(reason, str) else None
    if resuming and code in RESUME_REFUSALS:
        return ResumeRefused(code, message, CloseCode.RESUME_REFUSED, reason=reason)
    return ServerRefused(code, message, retryable=event.get("retryable") is True, reason=reason)
