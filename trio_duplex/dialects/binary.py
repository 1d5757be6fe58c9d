"""Protocol v2's binary audio lane: the 12-byte header of every binary message. Pure.

On a session opened with ``session.audio.wire = "binary"``, audio travels in binary
WebSocket messages and everything else stays JSON text. Each binary message is::

    offset size field
    0      1    kind: 1 input audio (client -> server), 2 output audio (server -> client)
    1      1    flags: 0
    2      2    reserved: 0
    4      8    seq (big-endian): kind 2 its server_event_seq; kind 1 its
                client_event_seq, 0 for none
    12     ...  payload: audio in the session's negotiated input/output format

A kind-1 message is ``input_audio_buffer.append`` with the payload as its audio; a kind-2
message is ``response.output_audio.delta`` with that ``server_event_seq``.
"""

from __future__ import annotations

import struct
from typing import Final

from ..core.events import ErrorCode
from ..core.wire import ProtocolError

INPUT_AUDIO: Final = 1
OUTPUT_AUDIO: Final = 2
HEADER_SIZE: Final = 12

_HEADER = struct.Struct(">BBHQ")
_OUTPUT_HEAD = struct.Struct(">4sQ")
_OUTPUT_PREFIX = bytes((OUTPUT_AUDIO, 0, 0, 0))
_INPUT_PREFIX = bytes((INPUT_AUDIO, 0, 0, 0))
_SEQ = struct.Struct(">Q")


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_EVENT, message)


def parse(data: bytes) -> tuple[int, int, bytes]:
    """A binary message's kind, seq and payload; ProtocolError(bad_event) if malformed.

    Only the header is checked here: kind 1 or 2, flags and reserved 0."""
    if len(data) < HEADER_SIZE:
        raise _bad(f"a binary message starts with a {HEADER_SIZE}-byte header; got {len(data)}")
    kind, flags, reserved, seq = _HEADER.unpack_from(data)
    if kind not in (INPUT_AUDIO, OUTPUT_AUDIO):
        raise _bad(f"unknown binary message kind {kind}")
    if flags or reserved:
        raise _bad("a binary message's flags and reserved bytes must be 0")
    return kind, seq, data[HEADER_SIZE:]


def parse_input(data: bytes) -> tuple[int, bytes]:
    """A client's binary message: its ``client_event_seq`` (0: none) and payload."""
    if len(data) >= HEADER_SIZE and data[:4] == _INPUT_PREFIX:  # (every valid one)
        return _SEQ.unpack_from(data, 4)[0], data[HEADER_SIZE:]
    kind, seq, payload = parse(data)
    if kind != INPUT_AUDIO:
        raise _bad("a client sends binary messages of kind 1 (input audio) only")
    return seq, payload


def output_message(seq: int, payload: bytes) -> bytes:
    """A kind-2 message: output audio with ``server_event_seq`` ``seq``."""
    return _OUTPUT_HEAD.pack(_OUTPUT_PREFIX, seq) + payload


def input_message(seq: int, payload: bytes) -> bytes:
    """A kind-1 message: input audio with ``client_event_seq`` ``seq`` (0: none)."""
    return _HEADER.pack(INPUT_AUDIO, 0, 0, seq) + payload
