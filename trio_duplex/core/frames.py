"""RFC 6455 framing for the server side, sans-IO: parse what clients send, build what we
send. The HTTP upgrade is left to websockets (server/front/handshake.py); this is the per-message
path.

Written here rather than taken from websockets' ``Protocol`` because that parser is a
chain of generators suspended per connection: measured on 150-byte messages, parsing
took 7.8 µs and building 2.3 µs per message there, 1.7 µs and 0.5 µs here, and an idle
connection holds only a few small objects. The one piece we keep is websockets'
``apply_mask`` (in C when websockets has its speedups).

What a client may send and what it gets for breaking the rules:

- every frame masked, no reserved bits (no extension is negotiated), opcodes 0, 1, 2,
  8, 9, 10; control frames unfragmented and at most 125 bytes: else 1002;
- fragments of one message in order, a new message only after the last one ended: else
  1002; a message over ``max_message_bytes``: 1009, decided from the frame header,
  before the payload is read. A fragmented message counts every fragment's frame header
  as well as its payload, so endless empty continuation frames meet the bound too, and
  its fragments are joined as they arrive (one buffer, never a list of small objects):
  a message held in 1-byte fragments costs its size, not fifty times it;
- text that is not UTF-8: 1007; a close frame with a code not allowed on the wire, or a
  one-byte payload: 1002, with a reason that is not UTF-8: 1007.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask


class Opcode(enum.IntEnum):
    CONT = 0
    TEXT = 1
    BINARY = 2
    CLOSE = 8
    PING = 9
    PONG = 10


class CloseCode(enum.IntEnum):
    """Close codes: RFC 6455's that we use, and the protocol's own (4000-4002)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    NO_STATUS = 1005
    """What a close frame without a payload stands for (never sent on the wire)."""
    ABNORMAL = 1006
    """The connection ended without a close frame (never sent on the wire)."""
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    REPLACED = 4000
    """Another connection resumed the session (``session.replaced``)."""
    RESUME_REFUSED = 4001
    CONFIG_TIMEOUT = 4002
    NOT_READING = 4003
    """The client let too much output pile up, or did not take a write in time."""


# The parser compares opcodes per frame: module constants spare an enum attribute lookup.
_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = (
    Opcode.CONT,
    Opcode.TEXT,
    Opcode.BINARY,
    Opcode.CLOSE,
    Opcode.PING,
    Opcode.PONG,
)

_WIRE_CLOSE_CODES = frozenset(
    {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}
)


BATCH = 64
"""The most frames one write carries (the connection's pump, a resume's replay)."""


class FrameError(Exception):
    """The client broke the framing rules; close the connection with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class Control(NamedTuple):
    """A ping or a pong, with its payload."""

    opcode: int
    payload: bytes


class Close(NamedTuple):
    """The client's close frame."""

    code: int
    reason: str


Item = str | bytes | Control | Close
"""What ``FrameReader.receive`` returns: text messages as ``str``, binary ones as
``bytes``, then control frames."""


class FrameReader:
    """Parses the byte stream a client sends after the handshake.

    ``receive(data)`` returns the complete messages and control frames in ``data`` (and
    in what was held back from before), in order. After a ``Close`` it parses nothing
    more. On a broken rule it returns what came before the fault and sets ``error``;
    from then on it parses nothing.
    """

    __slots__ = ("_buf", "_done", "_need", "_parts", "_parts_size", "_parts_text", "error", "max")

    def __init__(self, max_message_bytes: int) -> None:
        self.max = max_message_bytes
        """The largest message accepted (its fragments' headers counted); may change
        between calls (the server raises it once a session is open)."""
        self._buf = bytearray()  # an incomplete frame held back, if any
        self._need = 0  # bytes _buf must hold before a frame can be complete
        self._parts: bytearray | None = None  # the fragments so far of a message
        self._parts_size = 0  # their payloads and frame headers
        self._parts_text = False
        self._done = False
        self.error: FrameError | None = None

    def receive(self, data: bytes | bytearray) -> list[Item]:
        out: list[Item] = []
        if self._done:
            return out
        held = self._buf
        if held:
            held += data
            if len(held) < self._need:
                return out
            buf: bytes | bytearray = held
        else:
            buf = data
        try:
            pos = self._parse(buf, out)
        except FrameError as exc:
            self.error = exc
            self._done = True
            held.clear()
            return out
        if self._done:  # a close: nothing after it counts
            held.clear()
        elif buf is held:
            del held[:pos]
        elif pos < len(buf):
            held += buf[pos:]
        return out

    def _parse(self, buf: bytes | bytearray, out: list[Item]) -> int:
        """Parse whole frames from ``buf`` into ``out``; returns where parsing stopped."""
        n = len(buf)
        pos = 0
        while True:
            if n - pos < 2:
                self._need = 2
                return pos
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if not b1 & 0x80:
                raise FrameError(CloseCode.PROTOCOL_ERROR, "a client's frames must be masked")
            if b0 & 0x70:
                raise FrameError(
                    CloseCode.PROTOCOL_ERROR, "reserved bits set, and no extension was negotiated"
                )
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            length = b1 & 0x7F
            head = pos + 2
            if opcode >= _CLOSE:
                if opcode > _PONG:
                    raise FrameError(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
                if not fin:
                    raise FrameError(
                        CloseCode.PROTOCOL_ERROR, "control frames cannot be fragmented"
                    )
                if length > 125:
                    raise FrameError(
                        CloseCode.PROTOCOL_ERROR, "control frames carry at most 125 bytes"
                    )
            elif opcode > _BINARY:
                raise FrameError(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
            else:
                # Out-of-order fragments are refused from the header, like the size.
                if opcode == _CONT:
                    if self._parts is None:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR,
                            "a continuation frame with no message to continue",
                        )
                elif self._parts is not None:
                    raise FrameError(
                        CloseCode.PROTOCOL_ERROR, "a new message began before the last one ended"
                    )
                if length == 126:
                    if n - head < 2:
                        self._need = 4
                        return pos
                    length = int.from_bytes(buf[head : head + 2], "big")
                    head += 2
                elif length == 127:
                    if n - head < 8:
                        self._need = 10
                        return pos
                    length = int.from_bytes(buf[head : head + 8], "big")
                    head += 8
                    if length >> 63:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR, "a frame length must be below 2**63"
                        )
                if opcode == _CONT:  # the header counts: empty fragments are not free
                    size = self._parts_size + head + 4 - pos + length
                elif fin:
                    size = length
                else:
                    size = head + 4 - pos + length
                if size > self.max:
                    raise FrameError(
                        CloseCode.TOO_BIG, f"a message may hold at most {self.max} bytes"
                    )
            end = head + 4 + length
            if end > n:
                self._need = end - pos
                return pos
            payload = apply_mask(buf[head + 4 : end], buf[head : head + 4]) if length else b""
            pos = end
            if opcode == _TEXT or opcode == _BINARY:
                if fin:
                    out.append(_message(payload, opcode == _TEXT))
                else:
                    self._parts = bytearray(payload)
                    self._parts_size = size
                    self._parts_text = opcode == _TEXT
            elif opcode == _CONT:
                parts = self._parts
                assert parts is not None  # checked at the header
                parts += payload
                self._parts_size = size
                if fin:
                    self._parts = None
                    self._parts_size = 0
                    out.append(_message(parts, self._parts_text))
            elif opcode == _CLOSE:
                out.append(parse_close(payload))
                self._done = True
                return pos
            else:
                out.append(Control(opcode, payload))

    @property
    def idle(self) -> bool:
        """Nothing held: no incomplete frame, no fragmented message under way (a
        reader that parsed a close, or failed, holds nothing either)."""
        return not self._buf and self._parts is None


class ClientFrames:
    """Checks a client's (masked) frames by ``FrameReader``'s rules without unmasking
    or decoding its messages: the pooled relay's front passes them on to the home as
    they came (cluster/pool/front.py), where they are parsed once.

    ``scan(data)`` returns the data frames (TEXT, BINARY, continuations) in ``data`` and
    what was held back, verbatim and back to back, how many they are, and the control
    frames among them in order, their payloads unmasked (``Control``, ``Close``, as
    ``FrameReader`` gives them; at most 125 bytes each). An incomplete frame is held
    back, never returned in part (so what is held is at most one frame, of at most the
    bound). After a ``Close`` it scans nothing more; on a broken rule it returns what
    came before the fault and sets ``error`` (the same code and reason as
    ``FrameReader``'s for the same bytes), and from then on scans nothing.

    What it does not check: that a text message is UTF-8. The home's ``FrameReader``
    decodes every message anyway, and refuses such text with 1007, which reaches the
    client as any close of the home's does; checking here too would decode every text
    twice, the cost this pass-through saves. (A close frame's reason is checked: the
    front answers a client's close itself.)
    """

    __slots__ = ("_buf", "_done", "_need", "_parts", "_parts_size", "error", "max")

    def __init__(self, max_message_bytes: int) -> None:
        self.max = max_message_bytes
        """As ``FrameReader.max``: fragments' frame headers are counted the same way."""
        self._buf = bytearray()  # an incomplete frame held back, if any
        self._need = 0  # bytes _buf must hold before a frame can be complete
        self._parts = False  # a fragmented message is under way
        self._parts_size = 0  # its payloads and frame headers so far
        self._done = False
        self.error: FrameError | None = None

    def scan(self, data: bytes | bytearray) -> tuple[bytes, int, list[Control | Close]]:
        controls: list[Control | Close] = []
        if self._done:
            return b"", 0, controls
        held = self._buf
        if held:
            held += data
            if len(held) < self._need:
                return b"", 0, controls
            buf: bytes | bytearray = held
        else:
            buf = data
        pieces: list[bytes | bytearray] = []
        count = 0
        n = len(buf)
        pos = run = 0  # run: where the data frames since the last control frame began
        try:
            while True:
                if n - pos < 2:
                    self._need = 2
                    break
                b0 = buf[pos]
                b1 = buf[pos + 1]
                if not b1 & 0x80:
                    raise FrameError(CloseCode.PROTOCOL_ERROR, "a client's frames must be masked")
                if b0 & 0x70:
                    raise FrameError(
                        CloseCode.PROTOCOL_ERROR,
                        "reserved bits set, and no extension was negotiated",
                    )
                opcode = b0 & 0x0F
                fin = b0 & 0x80
                length = b1 & 0x7F
                head = pos + 2
                if opcode >= _CLOSE:
                    if opcode > _PONG:
                        raise FrameError(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
                    if not fin:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR, "control frames cannot be fragmented"
                        )
                    if length > 125:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR, "control frames carry at most 125 bytes"
                        )
                    end = head + 4 + length
                    if end > n:
                        self._need = end - pos
                        break
                    payload = (
                        apply_mask(buf[head + 4 : end], buf[head : head + 4]) if length else b""
                    )
                    if opcode == _CLOSE:
                        close = parse_close(payload)  # (its faults: FrameReader's)
                        if pos > run:
                            pieces.append(buf[run:pos])
                        controls.append(close)
                        pos = run = end
                        self._done = True
                        break
                    if pos > run:
                        pieces.append(buf[run:pos])
                    controls.append(Control(opcode, payload))
                    pos = run = end
                    continue
                if opcode > _BINARY:
                    raise FrameError(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
                if opcode == _CONT:
                    if not self._parts:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR,
                            "a continuation frame with no message to continue",
                        )
                elif self._parts:
                    raise FrameError(
                        CloseCode.PROTOCOL_ERROR, "a new message began before the last one ended"
                    )
                if length == 126:
                    if n - head < 2:
                        self._need = 4
                        break
                    length = int.from_bytes(buf[head : head + 2], "big")
                    head += 2
                elif length == 127:
                    if n - head < 8:
                        self._need = 10
                        break
                    length = int.from_bytes(buf[head : head + 8], "big")
                    head += 8
                    if length >> 63:
                        raise FrameError(
                            CloseCode.PROTOCOL_ERROR, "a frame length must be below 2**63"
                        )
                if opcode == _CONT:  # counted as FrameReader counts it
                    size = self._parts_size + head + 4 - pos + length
                elif fin:
                    size = length
                else:
                    size = head + 4 - pos + length
                if size > self.max:
                    raise FrameError(
                        CloseCode.TOO_BIG, f"a message may hold at most {self.max} bytes"
                    )
                end = head + 4 + length
                if end > n:
                    self._need = end - pos
                    break
                if fin:
                    self._parts, self._parts_size = False, 0
                else:
                    self._parts, self._parts_size = True, size
                count += 1
                pos = end
        except FrameError as exc:
            self.error = exc
            self._done = True
        if pos > run:
            pieces.append(buf[run:pos])
        if self._done:  # a close or a fault: nothing after it counts
            held.clear()
        elif buf is held:
            del held[:pos]
        elif pos < n:
            held += buf[pos:]
        if not pieces:
            return b"", count, controls
        if len(pieces) == 1 and isinstance(pieces[0], bytes):
            return pieces[0], count, controls
        return b"".join(pieces), count, controls

    @property
    def holding(self) -> int:
        """The bytes of an incomplete frame held back."""
        return len(self._buf)


def _message(payload: bytes | bytearray, text: bool) -> str | bytes:
    if not text:
        return bytes(payload)
    try:
        return payload.decode()
    except UnicodeDecodeError:
        raise FrameError(CloseCode.INVALID_DATA, "a text message must be UTF-8") from None


def messages_of(frames: bytes) -> list[str | bytes]:
    """The messages in ``frames``: whole, unmasked frames as a server sends them (a
    relayed home's, checked already by the pooled relay's scan), back to back; control
    frames among them are skipped. For a transport that carries messages, not frames (a
    call). FrameError: not such frames (a fragment left open, a frame cut short, a
    masked one, text that is not UTF-8)."""
    out: list[str | bytes] = []
    parts: bytearray | None = None
    text = False
    pos, n = 0, len(frames)
    while pos < n:
        if n - pos < 2:
            raise FrameError(CloseCode.PROTOCOL_ERROR, "a frame cut short")
        b0, b1 = frames[pos], frames[pos + 1]
        if b1 & 0x80:
            raise FrameError(CloseCode.PROTOCOL_ERROR, "a server's frames are not masked")
        length, head = b1 & 0x7F, pos + 2
        if length == 126:
            length, head = int.from_bytes(frames[head : head + 2], "big"), head + 2
        elif length == 127:
            length, head = int.from_bytes(frames[head : head + 8], "big"), head + 8
        end = head + length
        if end > n:
            raise FrameError(CloseCode.PROTOCOL_ERROR, "a frame cut short")
        opcode, payload = b0 & 0x0F, frames[head:end]
        pos = end
        if opcode >= _CLOSE:
            continue
        if opcode == _CONT:
            if parts is None:
                raise FrameError(CloseCode.PROTOCOL_ERROR, "a continuation with no message")
            parts += payload
        elif parts is not None:
            raise FrameError(CloseCode.PROTOCOL_ERROR, "a message inside a message")
        else:
            parts, text = bytearray(payload), opcode == _TEXT
        if b0 & 0x80:
            out.append(_message(parts, text))
            parts = None
    if parts is not None:
        raise FrameError(CloseCode.PROTOCOL_ERROR, "a message left unfinished")
    return out


def parse_close(payload: bytes) -> Close:
    if not payload:
        return Close(CloseCode.NO_STATUS, "")
    if len(payload) == 1:
        raise FrameError(
            CloseCode.PROTOCOL_ERROR, "a close frame's payload is empty or at least 2 bytes"
        )
    code = int.from_bytes(payload[:2], "big")
    if code not in _WIRE_CLOSE_CODES and not 3000 <= code <= 4999:
        raise FrameError(
            CloseCode.PROTOCOL_ERROR, f"close code {code} cannot be sent in a close frame"
        )
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError:
        raise FrameError(CloseCode.INVALID_DATA, "a close reason must be UTF-8") from None
    return Close(code, reason)


# -- what the server sends (unmasked) ----------------------------------------------------

_TEXT_HEADS = [bytes((0x80 | _TEXT, n)) for n in range(126)]


def text_frame(text: str) -> bytes:
    """One unfragmented text frame."""
    data = text.encode()
    n = len(data)
    if n < 126:
        return _TEXT_HEADS[n] + data
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + data
    return b"\x81\x7f" + n.to_bytes(8, "big") + data


_BINARY_HEADS = [bytes((0x80 | _BINARY, n)) for n in range(126)]


class Encoded(bytes):
    """Frames already encoded as a server sends them (whole, unmasked, back to back),
    where a message is expected (``frames_of``, a connection's outbox): sent as they
    are. The pooled relay's front passes its home's frames on so (``frames``: how many
    it holds, for the outbox's count)."""

    frames: int

    def __new__(cls, data: bytes, frames: int = 1) -> Encoded:
        self = super().__new__(cls, data)
        self.frames = frames
        return self


def frames_of(messages: Iterable[str | bytes]) -> bytes:
    """Unfragmented frames of ``messages`` (text for ``str``, binary for ``bytes``),
    back to back: ``text_frame``/``binary_frame`` of each, joined with one copy
    (``Encoded`` ones are frames already: as they are)."""
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        if isinstance(message, str):
            data = message.encode()
            n = len(data)
            if n < 126:
                append(_TEXT_HEADS[n])
            elif n < 65536:
                append(b"\x81\x7e" + n.to_bytes(2, "big"))
            else:
                append(b"\x81\x7f" + n.to_bytes(8, "big"))
        elif isinstance(message, Encoded):
            append(message)
            continue
        else:
            data = message
            n = len(data)
            if n < 126:
                append(_BINARY_HEADS[n])
            elif n < 65536:
                append(b"\x82\x7e" + n.to_bytes(2, "big"))
            else:
                append(b"\x82\x7f" + n.to_bytes(8, "big"))
        append(data)
    return b"".join(parts)


def binary_frame(data: bytes) -> bytes:
    """One unfragmented binary frame."""
    n = len(data)
    if n < 126:
        return bytes((0x80 | _BINARY, n)) + data
    if n < 65536:
        return b"\x82\x7e" + n.to_bytes(2, "big") + data
    return b"\x82\x7f" + n.to_bytes(8, "big") + data


def control_frame(opcode: int, payload: bytes) -> bytes:
    if len(payload) > 125:
        raise ValueError("a control frame carries at most 125 bytes")
    return bytes((0x80 | opcode, len(payload))) + payload


def close_frame(code: int = CloseCode.NO_STATUS, reason: str = "") -> bytes:
    """A close frame; ``CloseCode.NO_STATUS`` gives one without a payload. A reason is cut to fit
    125 bytes (at a character boundary)."""
    if code == CloseCode.NO_STATUS:
        return control_frame(_CLOSE, b"")
    data = reason.encode()[:123].decode(errors="ignore").encode()
    return control_frame(_CLOSE, code.to_bytes(2, "big") + data)
