"""The native dialect, protocol v2: events as JSON text, and audio on the binary lane.

Client events arrive as JSON objects spelled as the core spells them (docs/protocol.md),
so decoding is the JSON codec's (jsonwire.py) plus an event's own checks (a string
``type``, a string ``event_id`` if any); a binary message is input audio on the binary
lane (binary.py). Server events are written as compact JSON, output audio as a kind-2
binary message or as base64 ``audio`` in its delta event.
"""

from __future__ import annotations

import binascii
from collections.abc import Generator, Mapping
from typing import Any, Final

import attrs

from ..core.events import SUBPROTOCOL, ErrorCode, EventType
from ..core.spelling import Frame
from ..core.wire import ProtocolError
from .binary import output_message, parse_input
from .jsonwire import LARGE, decode_object, encode, object_steps

Event = dict[str, Any]

_APPEND: Final = str(EventType.INPUT_AUDIO_APPEND)
_NOT_OBJECT: Final = "an event must be a JSON object"
_b2a = binascii.b2a_base64


def decode(message: str | bytes) -> Event:
    """Parse one client message into an event dict with a string ``type``.

    Raises ProtocolError(bad_event) for binary messages and ill-shaped objects,
    ProtocolError(invalid_json) for text that is not JSON.
    """
    if not isinstance(message, str):
        raise ProtocolError(ErrorCode.BAD_EVENT, "binary frames are not accepted; send JSON text")
    return _checked(decode_object(message, _NOT_OBJECT))


def decode_steps(message: str | bytes) -> Generator[None, None, Event]:
    """``decode`` as a generator that yields between slices of work (see
    ``jsonwire.object_steps``): from ``LARGE`` characters on. Below, it yields nothing."""
    if not isinstance(message, str) or len(message) < LARGE:
        return decode(message)
    return _checked((yield from object_steps(message)))


def decode_binary(data: bytes) -> Event:
    """A binary message of a session opened with ``session.audio.wire = "binary"``: the
    ``input_audio_buffer.append`` it stands for, its ``audio`` the payload as bytes."""
    seq, payload = parse_input(data)
    event: Event = {"type": _APPEND, "audio": payload}
    if seq:
        event["client_event_seq"] = seq
    return event


def audio_frame(seq: int, payload: bytes, fields: Event | None) -> Frame:
    """Output audio journaled as ``seq``: a kind-2 binary message, or ``fields`` with
    the payload as base64 ``audio``."""
    if fields is None:
        return output_message(seq, payload)
    event = {**fields, "audio": _b2a(payload, newline=False).decode("ascii")}
    event["server_event_seq"] = seq
    return encode(event)


def _checked(event: Event) -> Event:
    """The checks of an event's own fields, once it is parsed and its structure checked."""
    event_id = event.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError(ErrorCode.BAD_EVENT, "event_id must be a string", param="event_id")
    if not isinstance(event.get("type"), str):
        raise ProtocolError(
            ErrorCode.BAD_EVENT,
            "an event needs a string field 'type'",
            event_id=event_id,
            param="type",
        )
    return event


@attrs.frozen
class Native:
    """The native dialect (``trio_duplex.dialects.Dialect``). Its methods are the
    module's functions themselves: binding one costs no call layer per event."""

    name: str = "native"
    subprotocol: str | None = str(SUBPROTOCOL)
    large: int = LARGE
    binary_lane: bool = True
    replays_audio: bool = True
    audio_by_transport: bool = False
    resumes_from_ack: bool = False

    decode = staticmethod(decode)
    decode_steps = staticmethod(decode_steps)
    decode_binary = staticmethod(decode_binary)
    frame = staticmethod(encode)
    audio_frame = staticmethod(audio_frame)
    config_locked_closes: bool = True
    """A ``session.update`` changing a locked field closes the connection (1008)."""
    speaks_first: bool = False
    """The client's first message opens or resumes the session (``?autostart=1`` aside)."""

    def opening(self, query: Mapping[str, list[str]], bearer: str | None, /) -> None:
        return None

    def shaper(self, config: dict[str, Any], /) -> None:
        """No shaping: the engine's events are the native wire's, as they are."""
        return None

    def restore_shaper(self, config: dict[str, Any], state: dict[str, Any], /) -> None:
        if state:
            raise ValueError("the native dialect has no shaper state")
        return None


NATIVE: Final = Native()
"""The native dialect: the one ``/v1/duplex`` speaks."""
