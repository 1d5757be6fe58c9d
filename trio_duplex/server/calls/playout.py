"""``Playout``: what a WebRTC call's client hears of the audio it is sent (sans-IO).

On a call, the server's output audio is not the client's to buffer: the media worker
queues it and plays it out as RTP, 20 ms a packet. So, as OpenAI's WebRTC flow does,
the server tells the client where that playback is, with three transport events on the
data channel: ``output_audio_buffer.started {response_id}`` when a response's first
packet is played, ``.stopped`` once it has all been played (after its
``response.done``), and ``.cleared`` when its audio was cut off (the client's
``output_audio_buffer.clear``, barge-in, a cancelled response). Like ``session.created``
they are not journaled: no ``server_event_seq``, never replayed; their ``event_id`` is
``event_rtc_<n>``.

This is the state machine alone: no I/O, no clock, no awaits. The call's channel tells
it what it sent (``sent_text``, ``sent_audio``), what the client asked
(``client_clear``) and what the worker reports (``played``: the last packet it sent as
RTP); each returns what to do, in order: text for the data channel and ``CLEAR``
commands for the worker. A response's packets after it was cleared are dropped
(``sent_audio`` is False): none is heard after a clear.

The rules: ``started{R}`` once R's first packet is played; ``stopped{R}`` once R's
``response.done`` has been sent and its last packet played; a clear (the client's, an
``input_audio_buffer.speech_started`` while audio is queued, or a ``response.done``
with ``status: cancelled`` of a response with audio not yet played) sends ``CLEAR`` and
``cleared`` for every response with audio queued, and mutes them and the response
being produced. The client's clear is always answered ``cleared`` (for the latest
response, if nothing was queued and it was not cleared already). Responses play in
order: one is not started or stopped before those queued ahead of it. A response whose
``response.created`` this call never saw (a resume came back to it midway) takes the
audio filed under no response when its ``response.done`` comes (``started`` then, if it
had started).

Which response a packet belongs to: the one most recently started by
``response.created`` (the binary lane's rule, docs/protocol.md).
"""

from __future__ import annotations

import enum
import itertools
import json
from collections.abc import Iterator
from typing import Final

import attrs

from ...dialects.jsonwire import encode


class Command(enum.Enum):
    CLEAR = "clear"
    """Drop the audio the worker has queued (``wire.Kind.CLEAR``)."""


Output = str | Command
"""Text for the data channel, or a command for the worker."""

STARTED: Final = "output_audio_buffer.started"
STOPPED: Final = "output_audio_buffer.stopped"
CLEARED: Final = "output_audio_buffer.cleared"
CLIENT_CLEAR: Final = "output_audio_buffer.clear"

_CREATED: Final = '{"type":"response.created"'
_DONE: Final = '{"type":"response.done"'
_SPEECH: Final = '{"type":"input_audio_buffer.speech_started"'
_WATCHED: Final = (_CREATED, _DONE, _SPEECH)

_ids = itertools.count(1)
"""``event_rtc_<n>`` across the process: unique, as the dialect's unjournaled ids are."""


@attrs.define(eq=False, slots=True)
class _Response:
    id: str | None
    """Its ``response.id``; None for audio sent outside any response (nothing is said)."""
    first: int = 0
    """Its first packet's seq (0: none sent yet)."""
    last: int = 0
    """Its last packet's seq so far."""
    started: bool = False
    done: bool = False
    """Its ``response.done`` has been sent."""
    muted: bool = False
    """Cleared: its later packets are dropped."""
    told_cleared: bool = False
    """Its ``cleared`` was sent."""


@attrs.define(eq=False)
class Playout:
    """One call's playback, as its client is told of it."""

    ids: Iterator[int] = _ids
    """Where ``event_rtc_<n>``'s n come from (a test passes its own count)."""
    _current: _Response | None = None
    """The response most recently created: audio sent now is its."""
    _queued: list[_Response] = attrs.field(factory=list)
    """Responses with audio sent and not yet stopped or cleared, oldest first."""
    _played: int = 0
    """The last packet the worker has played (sent as RTP)."""

    # -- inputs -------------------------------------------------------------------------

    def sent_text(self, frame: str) -> list[Output]:
        """``frame`` was sent on the data channel. Only ``response.created``,
        ``response.done`` and ``input_audio_buffer.speech_started`` matter (seen by
        their ``{"type":"…"`` prefix, which the OpenAI dialect writes first)."""
        if not frame.startswith(_WATCHED):
            return []
        if frame.startswith(_CREATED):
            previous = self._current
            self._current = _Response(_id(_response(frame)))
            if previous is not None and previous.id is None and not previous.done:
                previous.done = True  # audio outside a response: it ends with the next one
                return self._advance()
            return []
        if frame.startswith(_SPEECH):
            return self._clear(list(self._queued))
        body = _response(frame)
        response_id = _id(body)
        response = self._find(response_id)
        out: list[Output] = []
        if response is None:
            # A response this call never saw created: one a resume came back to midway
            # (its response.created was before the resume's point). Its audio so far was
            # filed under no response: it is this one's.
            response = self._current
            if response is None or response.id is not None or response_id is None:
                return []
            response.id = response_id
            if response.started:
                out.append(self._event(STARTED, response_id))
        response.done = True
        if body.get("status") == "cancelled" and response.last > self._played:
            return out + self._clear([response])  # (played out already: it stops as any other)
        return out + self._advance()

    def sent_audio(self, seq: int) -> bool:
        """A packet with ``seq`` is about to go to the worker: False if its response was
        cleared (drop it)."""
        response = self._current
        if response is None:
            response = self._current = _Response(None)
        if response.muted:
            return False
        if not response.first:
            response.first = seq
            self._queued.append(response)
        response.last = seq
        return True

    def client_clear(self) -> list[Output]:
        """The client sent ``output_audio_buffer.clear``: cut off what it would hear, and
        the response being produced."""
        targets = list(self._queued)
        current = self._current
        if current is not None and not current.done and current not in targets:
            targets.append(current)
        out = self._clear(targets, command=True)
        if len(out) == 1 and current is not None and current.id is not None:
            # Nothing was queued (played out already, or none yet): the clear is still
            # answered, as OpenAI answers it, for the latest response (once).
            if not current.told_cleared:
                current.told_cleared = True
                out.append(self._event(CLEARED, current.id))
        return out

    def played(self, seq: int) -> list[Output]:
        """The worker's report: ``seq`` is the last packet it has sent as RTP."""
        self._played = max(self._played, seq)
        return self._advance()

    # -- the rules ----------------------------------------------------------------------

    def _advance(self) -> list[Output]:
        """In play order: ``started`` for a response once its first packet is played,
        ``stopped`` once it is done and its last packet is played."""
        out: list[Output] = []
        queued = self._queued
        while queued:
            response = queued[0]
            if not response.started:
                if response.first > self._played:
                    break
                response.started = True
                if response.id is not None:
                    out.append(self._event(STARTED, response.id))
            if not response.done or response.last > self._played:
                break
            queued.pop(0)
            if response.id is not None:
                out.append(self._event(STOPPED, response.id))
        return out

    def _clear(self, targets: list[_Response], *, command: bool = False) -> list[Output]:
        """Mute ``targets``. If any of them has audio queued (or ``command``), ``CLEAR``
        the worker's queue: every response queued is cut off there (``cleared`` each)."""
        for response in targets:
            response.muted = True
        queued = self._queued
        if not command and not any(response in queued for response in targets):
            return []
        out: list[Output] = [Command.CLEAR]
        for response in queued:
            response.muted = True
            if response.id is not None:
                response.told_cleared = True
                out.append(self._event(CLEARED, response.id))
        queued.clear()
        return out

    def _find(self, response_id: object) -> _Response | None:
        current = self._current
        if current is not None and current.id == response_id:
            return current
        for response in self._queued:
            if response.id == response_id:
                return response
        return None

    def _event(self, kind: str, response_id: str) -> str:
        return encode(
            {"type": kind, "event_id": f"event_rtc_{next(self.ids)}", "response_id": response_id}
        )


def _id(body: dict[str, object]) -> str | None:
    rid = body.get("id")
    return rid if isinstance(rid, str) else None


def _response(frame: str) -> dict[str, object]:
    """The ``response`` object of a ``response.created``/``.done`` frame ({} if none)."""
    try:
        body = json.loads(frame).get("response")
    except (ValueError, AttributeError):
        return {}
    return body if isinstance(body, dict) else {}


__all__ = ["CLEARED", "CLIENT_CLEAR", "STARTED", "STOPPED", "Command", "Output", "Playout"]
