"""``openai-call``: the OpenAI Realtime dialect on a WebRTC call (``/v1/realtime/calls``).

A call's events travel on its data channel (``oai-events``) as OpenAI's; its audio
travels on its media track, which the call's shell turns into the binary lane: the
microphone's PCM arrives as kind-1 messages, and the session's output audio leaves as
kind-2 messages that the shell puts on the track. ``OPENAI_CALL`` is ``OPENAI`` with
these differences (docs/plans/webrtc.md §4.3, docs/openai.md "Calls (WebRTC)"):

* Its session opens with the call's audio (``CALL_AUDIO``): the binary lane, PCM16 at
  48 kHz in (what the media worker decodes the track to), Opus at 48 kHz out (what the
  track carries, packet for packet). It needs the ``opus`` extra.
* A ``session.update``'s audio formats (and our ``wire``) are checked as OpenAI's, then
  ignored: a call's audio is the track's, whatever the client says (the agents SDK
  always sends ``audio/pcm`` at 24 kHz, and a format change would be refused once audio
  has passed).
* A JSON ``input_audio_buffer.append`` is refused (``bad_event`` on ``audio``): a call's
  audio travels on its media track.
* The session objects it writes (``session.created``, ``session.updated``,
  ``session.resumed``) show OpenAI's default audio format, ``audio/pcm`` at 24 kHz, both
  ways, and no ``wire``: what a client of OpenAI's calls sees.
* A resume does not write the journal's audio again (``replays_audio`` False): audio not
  played before the peer connection was lost, or made while detached, would arrive
  seconds late, over the user. Its transcript (every text event) is replayed, once.
* Its shaper writes at most ``MAX_TEXT`` characters of text per event, so that each
  event fits a data channel message (Chrome's ``max-message-size`` is 256 KiB).

No WebSocket path speaks it (``dialects.CALLS_ONLY``); the calls endpoint is to.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, Final

import attrs

from ...core.events import ErrorCode
from ...core.spelling import Frame
from ...core.wire import ProtocolError
from . import OPENAI, OpenAI
from .config import to_session
from .decode import decode as openai_decode
from .decode import decode_steps as openai_decode_steps
from .shaper import OpenAIShaper, Shaped
from .spell import frame as openai_frame

__all__ = ["CALL_AUDIO", "MAX_TEXT", "OPENAI_CALL", "OpenAICall", "call_audio", "call_session"]

Event = dict[str, Any]

CALL_AUDIO: Final[Mapping[str, Any]] = {
    "wire": "binary",
    "input": {"format": "pcm16", "rate": 48000},
    "output": {"format": "opus", "rate": 48000},
}
"""A call session's audio (canonical): the binary lane, PCM16 in, Opus out, at 48 kHz."""

MAX_TEXT: Final = 60_000
"""The most characters of text one event carries: 60,000 characters are at most 240,000
bytes of UTF-8 (JSON writes a character other than a control character in at most 4), so
an event fits the 262,144 bytes of a data channel message with room for the rest of it.
(Text made mostly of control characters, 6 bytes each as JSON escapes, could still not
fit: the call's shell refuses such a message.)"""

_APPEND: Final = "input_audio_buffer.append"
_UPDATE: Final = "session.update"
_SESSION_EVENTS: Final = frozenset({"session.created", "session.updated", "session.resumed"})


def call_audio() -> Event:
    """A fresh copy of ``CALL_AUDIO``."""
    return {
        key: dict(value) if isinstance(value, dict) else value for key, value in CALL_AUDIO.items()
    }


def call_session(config: Mapping[str, Any], session_id: str) -> Event:
    """The live configuration as the session object a call's client sees: OpenAI's,
    its audio formats OpenAI's default (``audio/pcm`` at 24 kHz) and no ``wire``."""
    return to_session({key: value for key, value in config.items() if key != "audio"}, session_id)


def opening(query: Mapping[str, list[str]], bearer: str | None) -> Event:
    """OPENAI's opening (``?model=``, ``?resume=``), a new session with the call's audio."""
    event = OPENAI.opening(query, bearer)
    if event["type"] == _UPDATE:
        event["session"]["audio"] = call_audio()
    return event


def _called(event: Event) -> Event:
    """A decoded event as a call takes it: formats ignored, JSON audio refused."""
    kind = event["type"]
    if kind == _UPDATE:
        event["session"].pop("audio", None)  # (set only by formats or the wire)
    elif kind == _APPEND:
        raise ProtocolError(
            ErrorCode.BAD_EVENT,
            "a call's audio travels on its media track, not in input_audio_buffer.append",
            event_id=event.get("event_id"),
            param="audio",
        )
    return event


def decode(message: str | bytes) -> Event:
    """OPENAI's ``decode``, then a call's rules (see the module's docstring)."""
    return _called(openai_decode(message))


def decode_steps(message: str | bytes) -> Generator[None, None, Event]:
    """OPENAI's ``decode_steps``, then a call's rules."""
    return _called((yield from openai_decode_steps(message)))


def frame(event: Event) -> Frame:
    """OPENAI's ``frame``, the session object of a session event as ``call_session``."""
    if type(event) is not Shaped and event["type"] in _SESSION_EVENTS:
        config = event.get("session")
        if isinstance(config, dict) and config.get("type") != "realtime" and "audio" in config:
            event = {**event, "session": {k: v for k, v in config.items() if k != "audio"}}
    return openai_frame(event)


def shaper(config: dict[str, Any]) -> OpenAIShaper:
    """OPENAI's shaper, its text bounded by ``MAX_TEXT``, its session objects a call's."""
    return OpenAIShaper(config, max_text=MAX_TEXT, session_object=call_session)


def restore_shaper(config: dict[str, Any], state: dict[str, Any]) -> OpenAIShaper:
    """The shaper ``OpenAIShaper.state()`` described (a migration); ValueError if bad."""
    return OpenAIShaper.restore(config, state, max_text=MAX_TEXT, session_object=call_session)


@attrs.frozen
class OpenAICall(OpenAI):
    """The ``openai-call`` dialect (``trio_duplex.dialects.Dialect``): OpenAI's, with
    the call's opening, decoding, frames and shaper, and no audio replayed."""

    name: str = "openai-call"
    subprotocol: str | None = None  # (no WebSocket)
    replays_audio: bool = False
    audio_by_transport: bool = True

    decode = staticmethod(decode)
    decode_steps = staticmethod(decode_steps)
    frame = staticmethod(frame)
    opening = staticmethod(opening)
    shaper = staticmethod(shaper)
    restore_shaper = staticmethod(restore_shaper)


OPENAI_CALL: Final = OpenAICall()
"""The dialect of a WebRTC call's session (``dialects.by_name("openai-call")``)."""
