"""Twilio Media Streams' messages, parsed once, strictly (docs/plans/telephony.md §1.2, §3.2).

Sans-IO. ``parse`` takes one WebSocket text message from Twilio and returns what it is
(``Connected``, ``Start``, ``Media``, ``Dtmf``, ``Mark``, ``Stop``, or ``Other`` for an
event we do not know: Twilio may add events, and an unknown one is counted, not a
fault), or raises ``TwilioMessageError`` with a fixed reason that never quotes the
message. ``media``, ``mark``, ``clear`` going the other way are written by
server/twilio/marks.py.

Bounds: a message is at most the connection's ``MAX_MESSAGE_BYTES``; a ``media`` payload
at most ``MAX_PAYLOAD_BYTES`` of μ-law (1 s); ``customParameters`` at most
``MAX_PARAMETERS`` names of at most 64 characters with string values of at most 1024;
``tracks`` at most 4; the ids ``MZ``/``CA``/``AC`` and 32 hex digits; ``sequenceNumber``,
``chunk`` and ``timestamp`` digits as strings (the reference's) or non-negative integers.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ...core.limits import KiB
from ...core.wire import ProtocolError
from ..jsonwire import decode_object

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Connected",
    "Dtmf",
    "Mark",
    "Media",
    "Other",
    "Start",
    "Stop",
    "TwilioMessage",
    "TwilioMessageError",
    "parse",
]

MAX_MESSAGE_BYTES: Final = 64 * KiB
"""The largest message read from Twilio (a 1 s ``media`` is ~10.8 KB of JSON)."""
MAX_PAYLOAD_BYTES: Final = 8000
"""The most μ-law one ``media`` carries: 1 s at 8 kHz (Twilio sends 20 ms, 160 bytes)."""
MAX_PARAMETERS: Final = 16
MAX_NAME: Final = 64
MAX_VALUE: Final = 1024
MAX_TRACKS: Final = 4
MAX_NUMBER: Final = 1 << 63
DIGITS: Final = frozenset("0123456789*#ABCD")
"""The keys a caller can press (DTMF's sixteen)."""

_STREAM = re.compile(r"MZ[0-9a-f]{32}")
_CALL = re.compile(r"CA[0-9a-f]{32}")
_ACCOUNT = re.compile(r"AC[0-9a-f]{32}")
_NUMBER = re.compile(r"[0-9]{1,19}")
_TRACK = re.compile(r"[a-z_]{1,32}")


class TwilioMessageError(Exception):
    """A message from Twilio that is not one: ``reason`` is fixed text (never the input)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.frozen
class Connected:
    protocol: str
    version: str


@attrs.frozen
class Start:
    stream_sid: str
    account_sid: str
    call_sid: str
    tracks: tuple[str, ...]
    custom_parameters: Mapping[str, str] = attrs.field(repr=False)
    """(Not in the repr: it holds the call's ticket.)"""
    encoding: str
    sample_rate: int
    channels: int


@attrs.frozen
class Media:
    track: str
    chunk: int | None
    timestamp: int | None
    payload: bytes = attrs.field(repr=False)


@attrs.frozen
class Dtmf:
    digit: str


@attrs.frozen
class Mark:
    name: str


@attrs.frozen
class Stop:
    pass


@attrs.frozen
class Other:
    """An event this server does not know (counted, dropped)."""


TwilioMessage = Connected | Start | Media | Dtmf | Mark | Stop | Other


def parse(text: str | bytes, stream_sid: str | None = None) -> TwilioMessage:
    """One message from Twilio. ``stream_sid``: this stream's, once ``start`` named it: a
    later message naming another is refused. TwilioMessageError: not a valid message."""
    if not isinstance(text, str):
        raise TwilioMessageError("Twilio sends text messages only")
    try:
        doc = decode_object(text)
    except ProtocolError:
        raise TwilioMessageError("not a JSON object") from None
    event = doc.get("event")
    if type(event) is not str:
        raise TwilioMessageError("no string 'event'")
    if event == "connected":
        return Connected(_text(doc, "protocol", 64), _text(doc, "version", 64))
    _number(doc.get("sequenceNumber"), "sequenceNumber", optional=True)
    if event == "start":
        return _start(doc, stream_sid)
    if event not in ("media", "dtmf", "mark", "stop"):
        return Other()
    sid = doc.get("streamSid")
    if type(sid) is not str or _STREAM.fullmatch(sid) is None:
        raise TwilioMessageError("streamSid must be MZ and 32 hex digits")
    if stream_sid is not None and sid != stream_sid:
        raise TwilioMessageError("streamSid is not this stream's")
    if event == "media":
        return _media(_object(doc, "media"))
    if event == "dtmf":
        digit = _object(doc, "dtmf").get("digit")
        if type(digit) is not str or digit not in DIGITS or len(digit) != 1:
            raise TwilioMessageError("dtmf.digit must be one of 0-9, *, #, A-D")
        return Dtmf(digit)
    if event == "mark":
        return Mark(_text(_object(doc, "mark"), "name", 256))
    return Stop()


def _start(doc: dict[str, Any], stream_sid: str | None) -> Start:
    if stream_sid is not None:
        raise TwilioMessageError("a second start")
    start = _object(doc, "start")
    ids: list[str] = []
    for name, pattern in (("stream", _STREAM), ("account", _ACCOUNT), ("call", _CALL)):
        value = start.get(f"{name}Sid")
        if type(value) is not str or pattern.fullmatch(value) is None:
            raise TwilioMessageError(f"start.{name}Sid is not a valid id")
        ids.append(value)
    tracks = start.get("tracks", [])
    if (
        type(tracks) is not list
        or len(tracks) > MAX_TRACKS
        or not all(type(t) is str and _TRACK.fullmatch(t) for t in tracks)
    ):
        raise TwilioMessageError("start.tracks must be a short list of track names")
    params = start.get("customParameters", {})
    if type(params) is not dict or len(params) > MAX_PARAMETERS:
        raise TwilioMessageError(f"start.customParameters must be at most {MAX_PARAMETERS} names")
    for name, value in params.items():
        if not 0 < len(name) <= MAX_NAME or type(value) is not str or len(value) > MAX_VALUE:
            raise TwilioMessageError("a custom parameter is too long or not a string")
    media_format = _object(start, "mediaFormat")
    encoding = _text(media_format, "encoding", 64)
    rate, channels = media_format.get("sampleRate"), media_format.get("channels")
    if type(rate) is not int or type(channels) is not int:
        raise TwilioMessageError("mediaFormat.sampleRate and channels must be integers")
    return Start(ids[0], ids[1], ids[2], tuple(tracks), dict(params), encoding, rate, channels)


def _media(media: dict[str, Any]) -> Media:
    track = media.get("track", "inbound")
    if type(track) is not str or _TRACK.fullmatch(track) is None:
        raise TwilioMessageError("media.track must be a track name")
    payload = media.get("payload")
    if type(payload) is not str or len(payload) > 4 * (MAX_PAYLOAD_BYTES // 3 + 1):
        raise TwilioMessageError(
            f"media.payload must be base64 of at most {MAX_PAYLOAD_BYTES} bytes"
        )
    try:
        audio = binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        raise TwilioMessageError("media.payload is not valid base64") from None
    if len(audio) > MAX_PAYLOAD_BYTES:
        raise TwilioMessageError(
            f"media.payload must be base64 of at most {MAX_PAYLOAD_BYTES} bytes"
        )
    return Media(
        track,
        _number(media.get("chunk"), "media.chunk", optional=True),
        _number(media.get("timestamp"), "media.timestamp", optional=True),
        audio,
    )


def _object(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name)
    if type(value) is not dict:
        raise TwilioMessageError(f"'{name}' must be an object")
    return value


def _text(doc: dict[str, Any], name: str, most: int) -> str:
    value = doc.get(name)
    if type(value) is not str or len(value) > most:
        raise TwilioMessageError(f"'{name}' must be a string of at most {most} characters")
    return value


def _number(value: object, name: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is int and 0 <= value < MAX_NUMBER:
        return value
    if type(value) is str and _NUMBER.fullmatch(value) and int(value) < MAX_NUMBER:
        return int(value)
    raise TwilioMessageError(f"{name} must be a non-negative number")
