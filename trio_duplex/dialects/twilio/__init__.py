"""``twilio``: the dialect of a telephony call's session (Twilio Media Streams).

Twilio's own messages (``connected``, ``start``, ``media``, ``mark``, ``dtmf``,
``stop``; outbound ``media``, ``mark``, ``clear``) never reach this dialect: the call's
transport (server/twilio/channel.py, ``TwilioChannel``) parses them once and hands the
session shell messages in the core's own vocabulary, and it turns the session's frames
into Twilio's. So this dialect is native's codec behind an allow-list
(docs/plans/telephony.md §3.1):

* Reading, only what the channel produces: ``input.dtmf {digit}`` (a key the caller
  pressed), ``session.event_ack`` (a mark Twilio echoed: the audio before it played),
  ``session.close`` (Twilio's ``stop``), and the caller's audio as binary-lane kind-1
  messages. Anything else is ``bad_event``.
* Writing, native's compact JSON and kind-2 binary frames: the journal holds no
  ``streamSid`` (a stream's, which changes with every reconnect), so a migration record
  carries the frames as they are and a resume on a new stream writes them again.
* Its session opens with the call's audio (``TWILIO_AUDIO``: G.711 μ-law at 8 kHz both
  ways, on the binary lane; the core's codecs convert to and from the engine's rate),
  whatever else is configured (``audio_by_transport``).
* ``opening``: the call's door (server/front/twiliodoor.py) decides whether the stream
  opens or resumes the call's session and says so in a synthetic query, ``{"open": [S]}``
  or ``{"resume": [S]}``, with the session's fixed token as the bearer.
* A resume replays from the acknowledged frontier (``resumes_from_ack``): the marks'
  echoes are the acks, so that frontier is what the caller heard; Twilio presents no seq.
  Output audio is replayed (``replays_audio``): the gap is one we chose (a drain), and
  the caller waits in silence for the reply to go on.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, Final

import attrs

from ...core.events import INPUT_DTMF, ErrorCode, EventType
from ...core.wire import ProtocolError
from ..jsonwire import LARGE, encode
from ..native import audio_frame, decode_binary
from ..native import decode as native_decode

__all__ = ["INPUT_DTMF", "TWILIO", "TWILIO_AUDIO", "Twilio", "twilio_audio"]

Event = dict[str, Any]

TWILIO_AUDIO: Final[Mapping[str, Any]] = {
    "wire": "binary",
    "input": {"format": "g711_ulaw", "rate": 8000},
    "output": {"format": "g711_ulaw", "rate": 8000},
}
"""A call session's audio (canonical): the binary lane, G.711 μ-law at 8 kHz both ways."""

ALLOWED: Final = frozenset(
    {INPUT_DTMF, str(EventType.EVENT_ACK), str(EventType.CLOSE), str(EventType.INPUT_AUDIO_APPEND)}
)
"""The only events a call's session reads: what its channel produces."""


def twilio_audio() -> Event:
    """A fresh copy of ``TWILIO_AUDIO``."""
    return {
        key: dict(value) if isinstance(value, dict) else value
        for key, value in TWILIO_AUDIO.items()
    }


def decode(message: str | bytes) -> Event:
    """Native's ``decode``, then the allow-list (``ALLOWED``)."""
    event = native_decode(message)
    if event["type"] not in ALLOWED:
        raise ProtocolError(
            ErrorCode.BAD_EVENT,
            "a telephony call's session takes no such event",
            event_id=event.get("event_id"),
            param="type",
        )
    return event


def decode_steps(message: str | bytes) -> Generator[None, None, Event]:
    """``decode``: the channel's messages are small, so there is nothing to slice."""
    return decode(message)
    yield  # (a generator)


def opening(query: Mapping[str, list[str]], bearer: str | None) -> Event:
    """The door's synthetic query (see the module's docstring) as the first message:
    ``session.update`` with the call's audio, or ``session.resume`` with the bearer."""
    opens, resumes = query.get("open"), query.get("resume")
    if resumes is not None and len(resumes) == 1 and opens is None and bearer is not None:
        return {
            "type": str(EventType.RESUME),
            "session_id": resumes[0],
            "resume_token": bearer,
            "last_received_server_event_seq": 0,
        }
    if opens is not None and len(opens) == 1 and resumes is None:
        return {"type": str(EventType.UPDATE), "session": {"audio": twilio_audio()}}
    raise ProtocolError(ErrorCode.BAD_EVENT, "not a telephony call's opening")


@attrs.frozen
class Twilio:
    """The ``twilio`` dialect (``trio_duplex.dialects.Dialect``)."""

    name: str = "twilio"
    subprotocol: str | None = None  # (selected by its door, never by a subprotocol)
    large: int = LARGE
    binary_lane: bool = True
    replays_audio: bool = True
    audio_by_transport: bool = True
    resumes_from_ack: bool = True
    speaks_first: bool = True
    config_locked_closes: bool = False

    decode = staticmethod(decode)
    decode_steps = staticmethod(decode_steps)
    decode_binary = staticmethod(decode_binary)
    frame = staticmethod(encode)
    audio_frame = staticmethod(audio_frame)
    opening = staticmethod(opening)

    def shaper(self, config: dict[str, Any], /) -> None:
        """No shaping: the engine's events are journaled as native's."""
        return None

    def restore_shaper(self, config: dict[str, Any], state: dict[str, Any], /) -> None:
        if state:
            raise ValueError("the twilio dialect has no shaper state")
        return None


TWILIO: Final = Twilio()
"""The dialect of a telephony call's session (``dialects.by_name("twilio")``)."""
