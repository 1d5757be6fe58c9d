"""The framing between a server process and its media worker (sans-IO, stdlib only).

The worker (``media/_worker.py``, issue 28: WebRTC calls) runs aiortc in a process of its
own, never in the server's (aiortc imports PyAV, whose PyPI wheels link GPL code: see
docs/plans/webrtc.md). The two talk over the worker's stdin and stdout in frames: a 9-byte
head of ``kind`` (u8), ``call`` (u32, the call's number on this link; 0 for the link
itself) and ``length`` (u32), all big-endian, then ``length`` bytes of payload, at most
``MAX_PAYLOAD``. The worker loads this file by its path (``python -P``: the package is
not on its ``sys.path``), so it imports nothing but the standard library.

Kinds, and what each payload holds (``encode`` and ``Reader`` check only the framing; the
fixed-size payloads have ``pack_*``/``unpack_*`` helpers that check their size):

- server → worker: ``OFFER`` (a JSON object: the offer's SDP and the call's media
  settings), ``AUDIO`` (u64 seq, then one Opus packet), ``DC_TEXT`` (UTF-8 text for the
  ``oai-events`` data channel), ``CLEAR`` (empty: drop the queued audio), ``CLOSE``
  (empty), ``SHUTDOWN`` (empty, call 0);
- worker → server: ``READY`` (empty, call 0: it has started), ``ANSWER`` (the answer's
  SDP), ``FAILED`` (UTF-8 text: why), ``STATE`` (ASCII: the peer connection's state),
  ``DC_OPEN`` (empty), ``DC_TEXT`` (UTF-8), ``DC_DRAINED`` (u32: bytes of data-channel
  text sent on since the last), ``DC_CLOSED`` (empty), ``MIC`` (PCM16 48 kHz mono),
  ``PLAYED`` (u64 seq of the last packet sent as RTP, u8 drained, u8 cleared),
  ``CLOSED`` (empty: the call's peer connection is closed), ``FAULT`` (UTF-8: the peer
  broke a rule), ``STATS`` (u64 seq, u64 the monotonic nanoseconds it went out as RTP).
"""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple

HEAD: Final = struct.Struct(">BII")
HEAD_SIZE: Final = HEAD.size
MAX_PAYLOAD: Final = 1024 * 1024
"""A frame's payload at most (an offer or answer is a few KB, an Opus packet ~60 bytes,
a data-channel message at most the session's ``max_event_bytes``)."""
MAX_CALL: Final = 2**32 - 1
OFFER_REFUSED: Final = "the offer was refused"
"""How a ``FAILED`` for an offer that cannot be answered (the client's fault) begins."""


class Kind(enum.IntEnum):
    # server -> worker
    OFFER = 1
    AUDIO = 2
    DC_TEXT = 3  # (either way)
    CLEAR = 4
    CLOSE = 5
    SHUTDOWN = 6
    # worker -> server
    READY = 16
    ANSWER = 17
    FAILED = 18
    STATE = 19
    DC_OPEN = 20
    DC_DRAINED = 21
    DC_CLOSED = 22
    MIC = 23
    PLAYED = 24
    CLOSED = 25
    FAULT = 26
    STATS = 27


_KINDS: Final = frozenset(int(k) for k in Kind)


class WireError(Exception):
    """The other side broke the framing (an unknown kind, a payload over the bound, a
    fixed-size payload of the wrong size): the link is cut, never guessed at."""


class Frame(NamedTuple):
    kind: Kind
    call: int
    payload: bytes


def encode(kind: Kind, call: int, payload: bytes = b"") -> bytes:
    """One frame; WireError if ``payload`` is over ``MAX_PAYLOAD`` or ``call`` is not a u32."""
    if len(payload) > MAX_PAYLOAD:
        raise WireError(f"a {kind.name} payload of {len(payload)} bytes (at most {MAX_PAYLOAD})")
    if not 0 <= call <= MAX_CALL:
        raise WireError(f"call {call} is not a u32")
    return HEAD.pack(kind, call, len(payload)) + payload


class Reader:
    """Frames from a byte stream: ``feed(data)`` returns the whole frames in ``data`` and
    in what an earlier call held back (at most one incomplete frame: ``HEAD_SIZE`` +
    ``MAX_PAYLOAD`` bytes). After a WireError it parses nothing more."""

    __slots__ = ("_broken", "_buf")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._broken = False

    @property
    def held(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray) -> list[Frame]:
        if self._broken:
            raise WireError("the stream already broke the framing")
        buf = self._buf
        buf += data
        out: list[Frame] = []
        pos, n = 0, len(buf)
        while n - pos >= HEAD_SIZE:
            kind, call, length = HEAD.unpack_from(buf, pos)
            if kind not in _KINDS or length > MAX_PAYLOAD:
                self._broken = True
                buf.clear()
                what = f"kind {kind}" if kind not in _KINDS else f"a payload of {length} bytes"
                raise WireError(f"not a frame of the media link: {what}")
            end = pos + HEAD_SIZE + length
            if end > n:
                break
            out.append(Frame(Kind(kind), call, bytes(buf[pos + HEAD_SIZE : end])))
            pos = end
        del buf[:pos]
        return out


# -- fixed-size payloads ------------------------------------------------------------------

_SEQ: Final = struct.Struct(">Q")
_DRAINED: Final = struct.Struct(">I")
_PLAYED: Final = struct.Struct(">QBB")
_STATS: Final = struct.Struct(">QQ")


def pack_audio(seq: int, packet: bytes) -> bytes:
    return _SEQ.pack(seq) + packet


def unpack_audio(payload: bytes) -> tuple[int, bytes]:
    if len(payload) < _SEQ.size:
        raise WireError(f"an AUDIO payload of {len(payload)} bytes has no seq")
    return _SEQ.unpack_from(payload)[0], payload[_SEQ.size :]


def pack_drained(size: int) -> bytes:
    return _DRAINED.pack(size)


def unpack_drained(payload: bytes) -> int:
    return int(_fixed(_DRAINED, payload, "DC_DRAINED")[0])


def pack_played(seq: int, *, drained: bool, cleared: bool) -> bytes:
    return _PLAYED.pack(seq, drained, cleared)


def unpack_played(payload: bytes) -> tuple[int, bool, bool]:
    seq, drained, cleared = _fixed(_PLAYED, payload, "PLAYED")
    if drained > 1 or cleared > 1:
        raise WireError("PLAYED's flags must be 0 or 1")
    return seq, bool(drained), bool(cleared)


def pack_stats(seq: int, sent_ns: int) -> bytes:
    return _STATS.pack(seq, sent_ns)


def unpack_stats(payload: bytes) -> tuple[int, int]:
    seq, sent_ns = _fixed(_STATS, payload, "STATS")
    return seq, sent_ns


def _fixed(layout: struct.Struct, payload: bytes, name: str) -> tuple[int, ...]:
    if len(payload) != layout.size:
        raise WireError(f"a {name} payload of {len(payload)} bytes (it has {layout.size})")
    return layout.unpack(payload)
