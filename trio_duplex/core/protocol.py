"""What a client event means on an open session: the session protocol machine.

This file owns every rule of docs/protocol.md about a client event once its session is
open (the opening message's own rules are core/opening.py's): the fencing of a stale
attachment, unknown types, ``session.resume`` not first, the shape of
``session.update``, ``client_event_seq`` (the next one is taken, a resend is dropped, a
gap is refused), refused-for-good numbering (core/flow.py), the locked configuration
(and an engine's ``check_locked`` hook), ``session.audio`` set for good, the
configuration's budget, the heartbeat, ack and close, and the ``input.consumed`` report.

Sans-IO, as h11 and the client's ``SessionState`` are: the shell hands
``ClientEvents.receive`` one decoded event with its size, its connection's attachment
generation and the time, and gets back ONE ``Decision``. It never awaits, reads no
clock, imports no trio and no audio codec: the engine's checks (``EngineRules``), the
room in its queue and the audio decoder (``AudioDecoding``) are handed in.
"""

from __future__ import annotations

import binascii
import enum
from collections.abc import Callable, Collection
from typing import Any, NamedTuple, Protocol

from . import events
from .events import SESSION_INPUT, ErrorCode, EventType, Reason
from .frames import CloseCode
from .session import Session, State, Terminal, audio_ms
from .spelling import Frame, Spelling
from .wire import ConfigBudget, ProtocolError, is_seq

Event = dict[str, Any]


class EngineRules(Protocol):
    """What the machine asks of an engine (``engines.api.Engine`` is one): the types it
    accepts and its check of one of them (raises ProtocolError, e.g. a BadEvent). An
    optional ``check_locked(event)`` is looked up by name."""

    @property
    def accepts(self) -> Collection[str]: ...

    def check(self, event: Event) -> None: ...


class AudioDecoding(Protocol):
    """A session's audio input decoder (``audio.Decoder``, for a session with negotiated
    audio): the wire's format to the engine's PCM16. The machine calls it only for audio
    that goes on (not a resend, and with room): the codec's state sees nothing else."""

    def decode(self, audio: bytes) -> bytes:
        """Those bytes, in the session's input format, to the engine's PCM16."""


class AudioSwitch(Protocol):
    """The shell's audio reconfiguration, for a session with negotiated audio: a
    ``session.update`` may change ``session.audio`` while no audio has passed either
    way (OpenAI clients set the format right after ``session.created``)."""

    def negotiate(self, requested: object, /) -> dict[str, Any]:
        """The effective ``session.audio`` for ``requested``; ProtocolError
        (unsupported_audio_format) if it cannot be served. Changes nothing."""

    def switch(self, negotiated: dict[str, Any], /) -> AudioDecoding:
        """Use ``negotiated`` from now on (the output's encoder, the binary lane): the
        decoder of the input that follows."""


class CheckFailed(Exception):
    """An engine's ``check`` (or ``check_locked``) raised something other than a
    ProtocolError: the engine is broken, not the event. What it raised is the
    ``__cause__``."""


class Action(enum.Enum):
    IGNORE = "ignore"
    """Nothing for the shell to do: a stale attachment, a resend, an ack taken."""
    ENGINE = "engine"
    """Queue the event (with its size) for the engine (``ClientEvents.receive`` says
    when the queue may still refuse it)."""
    REPLY = "reply"
    """Send ``frame`` on the connection (a heartbeat's ack)."""
    REFUSE = "refuse"
    """Send the error ``frame`` (and close with ``close_code`` if set)."""
    END = "end"
    """The session ends (``terminal``): a ``session.close``, or the engine broke in its
    check (``cause``, to log)."""


class Decision(NamedTuple):  # per event: the common ones are preallocated singletons
    """What the shell does with one client event: ``action``, and what it needs for it."""

    action: Action
    frame: Frame | None = None
    """REPLY and REFUSE: the frame to send."""
    close_code: int | None = None
    """REFUSE: the connection then closes with this code (``config_locked``)."""
    fault: str | None = None
    """REFUSE: the client's fault, for the log; None for a refusal that is pacing."""
    consumed: bool = False
    """REFUSE: it refused the next seq for good: that counts as consumed (the inbox's
    ``refused``)."""
    terminal: Terminal | None = None
    """END: the session's terminal event, decided (None: it had ended already)."""
    cause: BaseException | None = None
    """END: what the engine's check raised, when that is why the session ends."""


IGNORE = Decision(Action.IGNORE)
TO_ENGINE = Decision(Action.ENGINE)
_IGNORE, _TO_ENGINE = IGNORE, TO_ENGINE  # module globals: the per-event path reads these

# Sets, not enum members, on the per-event path: a member lookup costs ~100 ns on 3.11.
_PROTOCOL_INPUT = frozenset({*SESSION_INPUT, EventType.EVENT_ACK, EventType.RESUME})
_ANSWERED_HERE = frozenset(
    {EventType.HEARTBEAT, EventType.EVENT_ACK, EventType.CLOSE, EventType.PLAYBACK_CLEAR}
)
_PACING = frozenset({ErrorCode.INPUT_BACKPRESSURE, ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ})
_UPDATE = str(EventType.UPDATE)
_HEARTBEAT = str(EventType.HEARTBEAT)
_ACK = str(EventType.EVENT_ACK)
_PLAYBACK_CLEAR = str(EventType.PLAYBACK_CLEAR)
_APPEND = str(EventType.INPUT_AUDIO_APPEND)
_ATTACHED = State.ATTACHED


def check_input(engine: EngineRules | None, event: Event) -> None:
    """Validate a client event bound for a session (not a resume). Raises ProtocolError,
    or CheckFailed when the engine's own check breaks.

    ``engine`` may be None only before one exists, for a first ``session.update``."""
    kind = event["type"]
    if kind not in _PROTOCOL_INPUT:  # an engine's event: the per-event path, one lookup
        if engine is None or kind not in engine.accepts:
            raise ProtocolError(
                ErrorCode.UNKNOWN_EVENT, f"event type {kind!r} is not accepted", param="type"
            )
        try:
            engine.check(event)
        except ProtocolError:
            raise
        except BaseException as exc:  # a BadEvent is the event's fault, the rest the engine's
            raise CheckFailed from exc
    elif kind == EventType.RESUME:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SESSION_RESUME,
            "session.resume must be the first message of a new connection",
        )
    elif kind != EventType.UPDATE:
        return  # heartbeat, ack and close carry nothing more to check
    elif not isinstance(event.get("session"), dict):
        raise ProtocolError(ErrorCode.BAD_EVENT, "session must be an object", param="session")
    seq = event.get("client_event_seq")
    if seq is not None and not (is_seq(seq) and seq > 0):
        raise ProtocolError(
            ErrorCode.BAD_EVENT,
            "client_event_seq must be a positive integer",
            param="client_event_seq",
        )


def check_locked(engine: object, event: Event) -> None:
    """On a locked session, after ``check_input``: the engine's ``check_locked`` (an
    override of the locked configuration: ConfigLocked); CheckFailed if it breaks."""
    if event["type"] in _PROTOCOL_INPUT:
        return  # session.update is refused by the machine itself
    check = getattr(engine, "check_locked", None)
    if check is None:
        return
    try:
        check(event)
    except ProtocolError:
        raise
    except BaseException as exc:
        raise CheckFailed from exc


def backpressure() -> ProtocolError:
    """The engine's queue has no room for the event: refused, retryable."""
    return ProtocolError(
        ErrorCode.INPUT_BACKPRESSURE, "the session's input queue is full; retry later"
    )


def bad_base64() -> ProtocolError:
    """An input audio event whose ``audio`` text is not valid base64."""
    return ProtocolError(ErrorCode.BAD_EVENT, "audio is not valid base64", param="audio")


def binary_not_negotiated() -> ProtocolError:
    """A binary message on a session whose audio is not on the binary lane."""
    return ProtocolError(
        ErrorCode.BAD_EVENT,
        'binary messages need a session opened with session.audio.wire "binary"',
    )


def refusal(exc: ProtocolError, event: Event | None, spelling: Spelling) -> Decision:
    """The decision that answers ``event`` with ``exc``, written by ``spelling``
    (numbering aside: see ``ClientEvents.receive``)."""
    fault = None if exc.code in _PACING else str(exc)
    return Decision(Action.REFUSE, spelling.frame(exc.to_event(event)), exc.close_code, fault)


class ClientEvents:
    """One session's client events: ``receive`` decides what each one means.

    ``room(size)``: whether the engine's queue would take an event of ``size`` now;
    ``audio``: the decoder of ``input_audio_buffer.append`` (a session with negotiated
    audio), else None; ``audio_in``: for an engine without one, the client event types
    whose base64 ``audio`` is counted in ``usage`` (bytes per millisecond)."""

    __slots__ = (
        "_audio",
        "_audio_in",
        "_audio_switch",
        "_budget",
        "_heartbeat_ack",
        "_pcm_per_ms",
        "_room",
        "engine",
        "session",
    )

    def __init__(
        self,
        session: Session,
        engine: EngineRules,
        budget: ConfigBudget,
        room: Callable[[int], bool],
        audio: AudioDecoding | None = None,
        audio_in: dict[str, int] | None = None,
        pcm_per_ms: int = 48,
        audio_switch: AudioSwitch | None = None,
    ) -> None:
        self.session = session
        self._audio_switch = audio_switch
        self.engine = engine
        self._budget = budget
        self._room = room
        self._audio = audio
        self._audio_in = audio_in or {}
        self._pcm_per_ms = pcm_per_ms
        self._heartbeat_ack: Decision | None = None

    def receive(self, event: Event, size: int, generation: int, now: float) -> Decision:
        """One client event, decoded from ``size`` characters (or bytes), from the
        connection holding attachment ``generation``. TO_ENGINE: the shell queues it as
        it is (its audio decoded in place), its seq taken. Should the queue refuse it (it
        can only when the machine took nothing for it, so did not ask ``room``: an event
        without a seq), the answer is ``full(event)``."""
        session = self.session
        if session.state is not _ATTACHED or generation != session.generation:
            return _IGNORE  # a replaced or ending attachment: fenced off (``is_current``)
        session.touch(now)
        usage = session.usage
        usage.events_in += 1
        usage.bytes_in += size
        try:
            kind = event["type"]
            decoded = False
            if kind == _APPEND and self._audio is not None:
                if not self._decode_audio(event, size, self._audio):
                    return _IGNORE  # a resend of what was received
                decoded = True  # its seq is the next one, and there is room
            check_input(self.engine, event)
            if session.config_locked:
                check_locked(self.engine, event)
            if kind not in _ANSWERED_HERE:  # for the engine (session.update too)
                if decoded:
                    seq = event.get("client_event_seq")
                    if seq is not None:
                        session.note_client_seq(seq)
                    return _TO_ENGINE
                if kind != _UPDATE and not self._audio_in and "client_event_seq" not in event:
                    return _TO_ENGINE  # the per-event path: nothing to take but room
                return self._to_engine(event, kind, size)
            if kind == _HEARTBEAT:
                return self._heartbeat()
            if kind == _ACK:
                session.ack(event.get("server_event_seq"))
                return _IGNORE
            if kind == _PLAYBACK_CLEAR:  # the transport's (a call's) to act on: taken
                seq = event.get("client_event_seq")
                if seq is not None and session.is_new_client_seq(seq):
                    session.note_client_seq(seq)
                return _IGNORE
            return Decision(Action.END, terminal=session.begin_close(Reason.CLIENT_CLOSE, now))
        except ProtocolError as exc:
            decision = refusal(exc, event, self.session.spelling)
            if not exc.retryable and self._refused_for_good(event):
                return decision._replace(consumed=True)
            return decision
        except CheckFailed as exc:
            terminal = session.begin_close(Reason.ENGINE_ERROR, now)
            return Decision(Action.END, terminal=terminal, cause=exc.__cause__)

    def full(self, event: Event) -> Decision:
        """The engine's queue refused an event that took nothing (TO_ENGINE)."""
        return refusal(backpressure(), event, self.session.spelling)

    def _heartbeat(self) -> Decision:
        reply = self._heartbeat_ack
        if reply is None:  # the same answer every time: built once
            frame = self.session.spelling.frame(events.heartbeat_ack(self.session.id))
            reply = self._heartbeat_ack = Decision(Action.REPLY, frame)
        return reply

    def _refused_for_good(self, event: Event) -> bool:
        """A non-retryable refusal of the next ``client_event_seq``: numbering goes on past
        it, and it counts as consumed (core/flow.py)."""
        seq = event.get("client_event_seq")
        session = self.session
        if type(seq) is int and seq == session.client_seq + 1:
            session.note_client_seq(seq)
            return True
        return False

    def _decode_audio(self, event: Event, size: int, audio: AudioDecoding) -> bool:
        """Turn an input audio event's ``audio`` into the engine's PCM16, in place.
        False: it is a resend of an event already received (nothing decoded). Refused
        before it is decoded if the engine's queue has no room."""
        seq = event.get("client_event_seq")
        if type(seq) is int and seq > 0 and not self.session.is_new_client_seq(seq):
            return False
        raw = event.get("audio")
        if isinstance(raw, str):
            try:
                raw = binascii.a2b_base64(raw, strict_mode=True)
            except (binascii.Error, ValueError):
                raise bad_base64() from None
        elif not isinstance(raw, bytes):  # (bytes: from the binary lane)
            raise ProtocolError(ErrorCode.BAD_EVENT, "audio must be a base64 string", param="audio")
        if not self._room(size):
            raise backpressure()
        pcm = event["audio"] = audio.decode(raw)
        usage = self.session.usage
        if usage.audio_ms_in is not None:
            usage.audio_ms_in += len(pcm) / self._pcm_per_ms
        return True

    def _to_engine(self, event: Event, kind: str, size: int) -> Decision:
        seq = event.get("client_event_seq")
        session = self.session
        if seq is not None and not session.is_new_client_seq(seq):
            return _IGNORE  # a resend of something already received
        if kind == _UPDATE:
            self._update(event["session"], size)
        elif not self._room(size):
            raise backpressure()
        elif self._audio_in:
            rate = self._audio_in.get(kind)
            usage = session.usage
            if rate is not None and usage.audio_ms_in is not None:
                usage.audio_ms_in += audio_ms(event, rate)
        if seq is not None:
            session.note_client_seq(seq)
        return _TO_ENGINE

    def _update(self, update: Event, size: int) -> None:
        """A ``session.update`` is taken if it changes nothing of a locked configuration,
        leaves ``session.audio`` as it is (or changes it before any audio passed), and
        fits its bound."""
        session = self.session
        if session.config_locked:
            self._restates(update)  # ProtocolError: it changes a locked field
        negotiated = None
        if "audio" in update and update["audio"] != session.config.get("audio"):
            switch = self._audio_switch
            usage = session.usage
            if switch is None or usage.audio_ms_in or usage.audio_ms_out:
                raise ProtocolError(
                    ErrorCode.BAD_EVENT,
                    "session.audio cannot change once audio has passed",
                    param="session.audio",
                )
            negotiated = switch.negotiate(update["audio"])  # ProtocolError: unsupported
            if negotiated == session.config.get("audio"):
                negotiated = None  # the same format again: no change
        measured = self._budget.check(update)
        if not self._room(size):
            raise backpressure()
        self._budget.commit(measured)
        if negotiated is not None:
            assert self._audio_switch is not None
            # The engine merges the effective audio into the configuration, as at open;
            # the input after this event is decoded in the new format.
            update["audio"] = negotiated
            self._audio = self._audio_switch.switch(negotiated)

    def _restates(self, update: Event) -> None:
        """On a locked session, an update is taken only if it changes nothing: every
        field it sets equals the configuration's (audio as negotiated; a field the lock
        leaves unset is locked unset). Else ``config_locked`` naming the first field
        changed; the connection then closes if the session's dialect says so
        (``Spelling.config_locked_closes``: native yes, OpenAI's no)."""
        config = self.session.config
        for key, value in update.items():
            if key in config and config[key] == value:
                continue
            if key == "audio" and key in config and self._same(value):
                continue
            closes = self.session.spelling.config_locked_closes
            raise ProtocolError(
                ErrorCode.CONFIG_LOCKED,
                f"the client token that opened this session locked its configuration: {key}",
                param=f"session.{key}",
                close_code=CloseCode.POLICY_VIOLATION if closes else None,
            )

    def _same(self, audio: object) -> bool:
        """``audio`` negotiates to the session's own audio (a restatement, not a change)."""
        switch = self._audio_switch
        if switch is None:
            return False
        try:
            return switch.negotiate(audio) == self.session.config.get("audio")
        except ProtocolError:
            return False

    def report_consumed(
        self, event: Event | None, drained: bool, generation: int
    ) -> tuple[bool, Frame | None]:
        """The inbox's report step was reached (core/flow.py): how far the client's input
        is consumed. Drained, that is every seq received; else the seq of the event just
        taken. Returns whether it was reported (False: count on, as the event had no seq
        and the client numbers some) and the ``input.consumed`` frame for the connection
        holding ``generation``, if it is news and that connection is current."""
        session = self.session
        seq = session.client_seq if drained or event is None else event.get("client_event_seq")
        if type(seq) is not int:
            return session.client_seq == 0, None
        frame = session.consumed(seq)
        if frame is not None and not session.is_current(generation):
            frame = None
        return True, frame
