"""The session state machine and admission accounting. No I/O, no clock, no awaits.

This file owns every rule of docs/protocol.md about a session's life::

    OPENING --handshake_delivered--> ATTACHED <--commit_resume/detach--> DETACHED
       |                                 |                                   |
       +--handshake_failed / begin_close / poll (expiry) ---> CLOSING --release--> CLOSED

* A slot is held from ``admit`` until ``release`` (teardown finished), in every state
  but CLOSED, so ``slots_held <= max_sessions`` always.
* Only a session whose ``session.created`` was delivered can ever be resumed.
* Every call that comes from a connection names that connection's attachment
  generation; a stale generation changes nothing (fencing).
* ``begin_close`` returns the terminal event once, to exactly one caller.
* A lost connection starts the grace: ``disconnect_grace_s``, or the shorter
  ``unconfirmed_grace_s`` while the client has not shown it holds a token (``heard``:
  it has sent nothing since ``session.created``, and never resumed).
* A resume is two-phase: ``begin_resume`` (validate, rotate the token, freeze the grace
  timer), then ``commit_resume`` or ``abort_resume``. Nothing about the attachment changes
  before the commit, so an aborted resume leaves the session as it was.

Every frame a session journals or sends is written by its ``Spelling`` (core/spelling.py:
the dialect it was opened with); the trio shell (server/sessions) turns each returned
value into I/O.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from . import events
from .credentials import Credentials, digest
from .events import ErrorCode, Event, Reason
from .frames import CloseCode
from .journal import Journal
from .limits import Limits
from .spelling import Frame, Spelling
from .wire import ProtocolError, is_seq, utf8_len

if TYPE_CHECKING:
    from .opening import Assigned


class State(enum.Enum):
    OPENING = "opening"
    ATTACHED = "attached"
    DETACHED = "detached"
    CLOSING = "closing"
    CLOSED = "closed"


LIVE_STATES = frozenset({State.OPENING, State.ATTACHED, State.DETACHED})

# For the per-event methods (is_current, emit): a module global is read in a few ns, an
# enum member through its class in ~100 ns on Python 3.11, and hashing one for a set
# test is a Python call.
_ATTACHED, _CLOSING, _CLOSED = State.ATTACHED, State.CLOSING, State.CLOSED


@attrs.frozen
class Terminal:
    """The one terminal event of a session and where it must go."""

    event: dict[str, Any]
    close_code: int
    generation: int | None
    """The attachment to deliver it to, or None when the session was not attached."""

    @property
    def reason(self) -> str:
        return str(self.event["reason"])


@attrs.define(eq=False, repr=False)
class ResumeAttempt:
    session: Session
    new_token: str
    last_seq: int
    generation: int
    """The generation this resume will hold once committed."""

    def __repr__(self) -> str:
        return f"ResumeAttempt({self.session.id}, generation={self.generation})"


@attrs.frozen
class Commit:
    generation: int
    replaced: int | None
    """The generation that was attached and is now replaced, if any."""


class Emitted(NamedTuple):  # per event: a tuple is several times cheaper to build
    frame: Frame
    notice: Frame | None
    """A ``session.resync_required`` frame to send before ``frame``, on overflow."""


@attrs.define(eq=False, slots=True)
class Usage:
    """What one session has carried: ``usage`` in its terminal event (docs/protocol.md).

    Plain integers, bumped on the per-event paths (an attribute add each) and read by
    the metrics collector at scrape time."""

    events_in: int = 0
    """Client events handled on the session's current attachment (resume excluded)."""
    bytes_in: int = 0
    """Their sizes as read: the messages' lengths in characters (UTF-8 bytes for
    ASCII, which JSON with escapes is)."""
    events_out: int = 0
    """Events the engine sent that were sequenced (journaled)."""
    bytes_out: int = 0
    """Their UTF-8 bytes, as journaled."""
    resumes: int = 0
    """Resumes committed."""
    audio_ms_in: float | None = None
    """Audio received, in milliseconds; None: its format is not known (the engine's
    ``audio_formats``)."""
    audio_ms_out: float | None = None

    def as_event(self) -> dict[str, int]:
        usage = {
            "events_in": self.events_in,
            "events_out": self.events_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "resumes": self.resumes,
        }
        if self.audio_ms_in is not None:
            usage["audio_ms_in"] = round(self.audio_ms_in)
        if self.audio_ms_out is not None:
            usage["audio_ms_out"] = round(self.audio_ms_out)
        return usage


def audio_ms(event: dict[str, Any], bytes_per_ms: int) -> float:
    """The duration of the base64 ``audio`` of ``event`` (0 if it has none), without
    decoding it."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        return 0.0
    size = len(audio) * 3 // 4 - (2 if audio.endswith("==") else 1 if audio.endswith("=") else 0)
    return max(0, size) / bytes_per_ms


@attrs.define(eq=False, repr=False)
class Session:
    id: str
    config: dict[str, Any]
    limits: Limits
    credentials: Credentials
    journal: Journal
    spelling: Spelling = attrs.field(kw_only=True)
    """The dialect that writes its frames: the one it was opened with."""
    state: State = State.OPENING
    generation: int = 1
    client_seq: int = 0
    """Highest ``client_event_seq`` received: queued for the engine, or refused for good.
    Protocol v2: the next one accepted is exactly ``client_seq + 1``."""
    consumed_seq: int = 0
    """The last ``consumed_client_event_seq`` reported (``input.consumed``, core/flow.py)."""
    grace_deadline: float = math.inf
    idle_deadline: float = math.inf
    terminal: Terminal | None = None
    resume: ResumeAttempt | None = None
    usage: Usage = attrs.field(factory=Usage)
    principal: str | None = None
    """Who opened it: the name of the API key it was opened with (None: no auth)."""
    config_locked: bool = False
    """Its configuration was locked by the client token that opened it."""
    heard: bool = False
    """The client has shown it holds a resume token: it sent something (any event,
    see ``touch``) after ``session.created``, or it resumed. Until then a lost connection
    gets ``unconfirmed_grace_s``, not the whole grace."""
    _opening_event: bool = False
    """The event that opened the session is still to be handled: it was sent before
    ``session.created``, so its ``touch`` shows nothing."""
    _lost_in_handshake: bool = False
    _unconfirmed: bytes | None = None
    """The digest of the token the last resume issued, until the client shows it holds
    it (its first event on the resumed attachment)."""
    _frame: Callable[[dict[str, Any]], Frame] = attrs.field(init=False)
    _audio_frame: Callable[[int, bytes, dict[str, Any] | None], Frame] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Bound once: the per-event paths call the dialect's functions directly.
        self._frame = self.spelling.frame
        self._audio_frame = self.spelling.audio_frame

    def __repr__(self) -> str:
        return f"Session({self.id}, {self.state.value}, generation={self.generation})"

    # -- handshake ---------------------------------------------------------------------

    def handshake_delivered(self, now: float, *, opening_event: bool = False) -> None:
        """``session.created`` was handed to the transport: the session is resumable.
        ``opening_event``: the message that opened it (not a ``session.update``) is handled
        next, as its first input."""
        if self.state is not State.OPENING:
            return
        self.state = State.ATTACHED
        self._opening_event = opening_event
        self.idle_deadline = now + self.limits.idle_ttl_s
        if self._lost_in_handshake:
            self.detach(self.generation, now)

    def handshake_failed(self, now: float) -> Terminal | None:
        """The send of ``session.created`` failed, or its connection was gone first."""
        if self.state is not State.OPENING:
            return None
        return self.begin_close(Reason.UNDELIVERED, now)

    # -- attachment --------------------------------------------------------------------

    def is_current(self, generation: int) -> bool:
        return self.state is _ATTACHED and generation == self.generation

    def detach(self, generation: int, now: float) -> bool:
        """A connection was lost. True only for the first report of the current one."""
        if generation != self.generation:
            return False
        if self.state is State.OPENING:
            # The outcome waits for the handshake send: delivered → detached, else closed.
            self._lost_in_handshake = True
            return False
        if self.state is not State.ATTACHED:
            return False
        self.state = State.DETACHED
        grace = self.limits.disconnect_grace_s
        if not self.heard:  # its client may never have received session.created's token
            grace = min(grace, self.limits.unconfirmed_grace_s)
        self.grace_deadline = now + grace
        return True

    def touch(self, now: float) -> None:
        """A client event arrived on the current attachment: the idle clock restarts; the
        first one after ``session.created`` shows the client holds a token (``heard``);
        and after a resume, the first one shows the client holds the token it was issued
        there (it waited for ``session.resumed``): the token it presented dies."""
        self.idle_deadline = now + self.limits.idle_ttl_s
        if not self.heard:
            if self._opening_event:  # sent before session.created: it shows nothing
                self._opening_event = False
            else:
                self.heard = True
        if self._unconfirmed is not None:
            self.credentials.confirm(self._unconfirmed)
            self._unconfirmed = None

    # -- resume ------------------------------------------------------------------------

    def begin_resume(self, token: object, last_seq: int, now: float) -> ResumeAttempt:
        if self.state not in (State.ATTACHED, State.DETACHED) or self._due(now):
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_EXPIRED, "the session has ended or expired"
            )
        if not self.credentials.check(token):
            raise ProtocolError.resume_refused(
                ErrorCode.INVALID_RESUME_TOKEN, "the resume token is not valid"
            )
        if self.resume is not None:
            raise ProtocolError(
                ErrorCode.SESSION_RESUME_CONFLICT,
                "another resume of this session is in progress",
                close_code=CloseCode.RESUME_REFUSED,
            )
        if last_seq > self.journal.head:
            raise ProtocolError.resume_refused(
                ErrorCode.INVALID_SESSION_RESUME,
                f"last_received_server_event_seq {last_seq} is past the newest seq "
                f"{self.journal.head}",
                param="last_received_server_event_seq",
            )
        assert isinstance(token, str)
        self.journal.ack(last_seq)  # the client holds everything up to last_seq
        attempt = ResumeAttempt(self, self.credentials.rotate(token), last_seq, self.generation + 1)
        self.resume = attempt
        return attempt

    def frame(self, event: dict[str, Any]) -> Frame:
        """``event`` as this session's dialect writes it (not journaled)."""
        return self._frame(event)

    def resync_frame(self, reason: str, dropped_through: int) -> Frame:
        return self._frame(events.resync_required(reason, dropped_through))

    def resumed_frame(self, attempt: ResumeAttempt) -> Frame:
        return self._frame(self.resumed_event(attempt))

    def resumed_event(self, attempt: ResumeAttempt) -> Event:
        return events.resumed(
            self.id,
            self.config,
            attempt.new_token,
            attempt.generation,
            self.client_seq,
            self.consumed_seq,
        )

    def commit_resume(self, attempt: ResumeAttempt, now: float) -> Commit | None:
        """Move the session to the resuming connection. None: the session ended meanwhile."""
        if self.resume is not attempt:
            return None
        self.resume = None
        if self.state not in (State.ATTACHED, State.DETACHED):
            return None
        replaced = self.generation if self.state is State.ATTACHED else None
        self.generation = attempt.generation
        self.state = State.ATTACHED
        self.grace_deadline = math.inf
        self.idle_deadline = now + self.limits.idle_ttl_s
        self._unconfirmed = self.credentials.pending
        self.heard = True  # it presented a token: it has one
        self.usage.resumes += 1
        return Commit(attempt.generation, replaced)

    def abort_resume(self, attempt: ResumeAttempt, now: float) -> Terminal | None:
        """Undo a resume that failed or was cancelled before its commit."""
        if self.resume is not attempt:
            return None
        self.resume = None
        return self.poll(now)  # the grace may have run out while the resume was frozen

    # -- events ------------------------------------------------------------------------

    def emit(self, event: dict[str, Any], now: float) -> Emitted | None:
        """Sequence, encode and journal one engine event. None once the session ends."""
        state = self.state
        if state is _CLOSING or state is _CLOSED:
            return None
        event["server_event_seq"] = self.journal.head + 1
        frame = self._frame(event)
        return self._journaled(
            frame, len(frame) if isinstance(frame, bytes) else utf8_len(frame), now
        )

    def emit_audio(
        self, payload: bytes, now: float, fields: dict[str, Any] | None = None
    ) -> Emitted | None:
        """Sequence and journal one output audio delta of ``payload``: on the binary lane
        (``fields`` None), else as the engine's delta ``fields`` carrying it (its
        dialect's ``audio_frame``). None once the session ends."""
        state = self.state
        if state is _CLOSING or state is _CLOSED:
            return None
        frame = self._audio_frame(self.journal.head + 1, payload, fields)
        return self._journaled(
            frame, len(frame) if isinstance(frame, bytes) else utf8_len(frame), now
        )

    def _journaled(self, frame: Frame, size: int, now: float) -> Emitted:
        """Journal event ``head + 1``, already encoded as ``frame`` of ``size`` bytes."""
        dropped = self.journal.append(frame, size, now)
        usage = self.usage
        usage.events_out += 1
        usage.bytes_out += size
        notice = None if dropped is None else self.resync_frame("journal_overflow", dropped)
        return Emitted(frame, notice)

    def ack(self, seq: object) -> None:
        if not is_seq(seq) or seq > self.journal.head:  # type: ignore[operator]
            raise ProtocolError(
                ErrorCode.INVALID_EVENT_ACK,
                f"server_event_seq must be an integer from 0 to {self.journal.head}",
                param="server_event_seq",
            )
        self.journal.ack(seq)  # type: ignore[arg-type]

    def is_new_client_seq(self, seq: int) -> bool:
        """True for the next ``client_event_seq`` (``client_seq + 1``), False for a resend
        of what was received (dropped silently). Anything further ahead raises
        ProtocolError(unexpected_client_event_seq), retryable: an event refused (for
        ``input_backpressure``) leaves ``client_seq`` where it was, so no later event can
        overtake it, and a resend from the refused seq restores exactly-once order."""
        last = self.client_seq
        if seq == last + 1:
            return True
        if seq <= last:
            return False
        raise ProtocolError.unexpected_client_seq(last + 1, seq)

    def note_client_seq(self, seq: int) -> None:
        """The event of the next seq was taken: queued for the engine, or refused for good
        (a non-retryable error: resending it could not help, so numbering goes on)."""
        if seq == self.client_seq + 1:
            self.client_seq = seq

    def consumed(self, seq: int) -> Frame | None:
        """The frame of ``input.consumed`` for ``seq`` (how far the session is done with
        the client's input), or None if that is no news."""
        if seq <= self.consumed_seq:
            return None
        self.consumed_seq = seq
        return self._frame(events.input_consumed(seq))

    # -- ending ------------------------------------------------------------------------

    def begin_close(self, reason: Reason, now: float) -> Terminal | None:
        """Decide the session's end. Returns the terminal event to the first caller only."""
        del now  # part of the signature so every transition reads the same
        if self.state not in LIVE_STATES:
            return None
        if reason == Reason.ENGINE_ERROR:
            code = CloseCode.INTERNAL_ERROR
        elif reason == Reason.SHUTDOWN or reason == Reason.MIGRATED:
            code = CloseCode.GOING_AWAY
        else:
            code = CloseCode.NORMAL
        # An OPENING session's terminal goes to the connection carrying session.created,
        # should that send complete.
        attached = self.generation if self.state in (State.ATTACHED, State.OPENING) else None
        self.state = State.CLOSING
        self.grace_deadline = self.idle_deadline = math.inf
        ended = events.ended(self.id, reason, self.usage.as_event())
        self.terminal = Terminal(ended, code, attached)
        return self.terminal

    def poll(self, now: float) -> Terminal | None:
        """Expire the session if one of its deadlines has passed."""
        if self.resume is not None:
            return None  # a resume in progress holds the timers; abort_resume polls again
        if self.state is State.DETACHED and now >= self.grace_deadline:
            return self.begin_close(Reason.GRACE_EXPIRED, now)
        if self.state is State.ATTACHED and now >= self.idle_deadline:
            return self.begin_close(Reason.IDLE_EXPIRED, now)
        return None

    def next_deadline(self) -> float:
        if self.resume is not None:
            return math.inf
        if self.state is State.DETACHED:
            return self.grace_deadline
        if self.state is State.ATTACHED:
            return self.idle_deadline
        return math.inf

    def _due(self, now: float) -> bool:
        return self.resume is None and now >= self.next_deadline()


def _shutting_down() -> ProtocolError:
    return ProtocolError(
        ErrorCode.SERVER_SHUTTING_DOWN,
        "the server is shutting down",
        close_code=CloseCode.GOING_AWAY,
    )


@attrs.define(eq=False)
class Registry:
    """Every session of a server, and the admission slots they hold."""

    limits: Limits
    sessions: dict[str, Session] = attrs.field(factory=dict)
    slots_held: int = 0
    shutting_down: bool = False
    spelling: Spelling = attrs.field(kw_only=True)
    """The dialect a session is opened with unless ``admit`` is given another."""

    def admit(
        self,
        session_config: dict[str, Any],
        principal: str | None = None,
        locked: bool = False,
        spelling: Spelling | None = None,
        assigned: Assigned | None = None,
    ) -> tuple[Session, str]:
        """Take a slot and create an OPENING session, written by ``spelling`` (the
        registry's by default). Returns it and its first token. ``assigned``: its id and
        its fixed token (``Credentials.fixed``); refused (``session_resume_conflict``,
        retryable) while a session of that id is here."""
        if assigned is not None and assigned.session_id in self.sessions:
            raise ProtocolError(
                ErrorCode.SESSION_RESUME_CONFLICT,
                "a session of this id is open already",
                close_code=CloseCode.TRY_AGAIN_LATER,
            )
        self._take_slot()
        if assigned is None:
            credentials, token = Credentials.issue()
            session_id = "sess_" + secrets.token_hex(12)
        else:
            credentials, token = Credentials.fixed(assigned.token), assigned.token
            session_id = assigned.session_id
        session = Session(
            id=session_id,
            config=session_config,
            limits=self.limits,
            credentials=credentials,
            journal=Journal(self.limits.journal_max_bytes, self.limits.journal_ttl_s),
            principal=principal,
            config_locked=locked,
            spelling=self.spelling if spelling is None else spelling,
        )
        self.sessions[session.id] = session
        return session, token

    def adopt(self, session: Session) -> None:
        """Take a slot for a session restored from another node (core/migration.py) and
        register it. Refused as ``admit`` refuses, and when its id is already here."""
        if session.state is not State.DETACHED:
            raise ValueError(f"only a detached session can be adopted, not {session!r}")
        if session.id in self.sessions:
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_CONFLICT, "the session is already on this node"
            )
        self._take_slot()
        self.sessions[session.id] = session

    def _take_slot(self) -> None:
        if self.shutting_down:
            raise _shutting_down()
        if self.slots_held >= self.limits.max_sessions:
            raise ProtocolError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"all {self.limits.max_sessions} session slots are in use",
                close_code=CloseCode.TRY_AGAIN_LATER,
            )
        self.slots_held += 1

    def created_frame(self, session: Session, token: str) -> Frame:
        """``session.created``, as the session's dialect writes it."""
        return session.frame(self.created_event(session, token))

    def created_event(self, session: Session, token: str) -> Event:
        return events.created(
            session.id, session.config, token, session.generation, self.limits.advertised()
        )

    def release(self, session: Session) -> bool:
        """Teardown finished: free the slot. Only a CLOSING session can be released."""
        if session.state is not State.CLOSING:
            return False
        session.state = State.CLOSED
        self.slots_held -= 1
        del self.sessions[session.id]
        return True

    def holder_of(self, token: str) -> Session | None:
        """The live session whose valid resume token ``token`` is, if any (every session
        compared, in constant time each)."""
        presented = digest(token)
        found = None
        for session in self.sessions.values():
            if session.credentials.has(presented):
                found = session
        return found

    def lookup_for_resume(self, session_id: object) -> Session:
        if self.shutting_down:
            raise _shutting_down()
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise ProtocolError.resume_refused(
                ErrorCode.SESSION_RESUME_EXPIRED, "no such session, or it has ended"
            )
        return session
