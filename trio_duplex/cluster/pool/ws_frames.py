"""The WebSocket frames a channel carries (sans-IO): a client's frames as the front
writes them towards the home, and a parser of the home's (server) frames.

(What the client itself sent the front passes on as it came, checked by
``core.frames.ClientFrames`` through its WebSocket's ``get_frames``; the encoders here
serve what was parsed before that: the resume, and what came with it.)"""

from __future__ import annotations

import codecs

from ...core.frames import Opcode
from ..relay import (
    MAX_RELAYED_MESSAGE_BYTES,
)

# -- the client side's WebSocket frames (masked with a zero key: the bytes as they are) --

_ZERO_MASK = b"\x00\x00\x00\x00"


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One unfragmented frame as a client sends it (masked, with a key of zeros, which
    leaves the payload as it is: the hop between nodes is not a browser's)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0xFE)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0xFF)) + n.to_bytes(8, "big")
    return head + _ZERO_MASK + payload


def message_frame(message: str | bytes) -> bytes:
    if isinstance(message, str):
        return client_frame(Opcode.TEXT, message.encode())
    return client_frame(Opcode.BINARY, message)


def message_frames(messages: list[str | bytes]) -> bytes:
    """``message_frame`` of each of ``messages``, back to back, joined with one copy
    (a batch the front read at once goes to the home as one write)."""
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        if isinstance(message, str):
            data = message.encode()
            op = 0x81
        else:
            data = message
            op = 0x82
        n = len(data)
        if n < 126:
            append(bytes((op, 0x80 | n)) + _ZERO_MASK)
        elif n < 65536:
            append(bytes((op, 0xFE)) + n.to_bytes(2, "big") + _ZERO_MASK)
        else:
            append(bytes((op, 0xFF)) + n.to_bytes(8, "big") + _ZERO_MASK)
        append(data)
    return b"".join(parts)


class BadFrame(Exception):
    """The home's WebSocket stream broke the rules (our own server: a bug, not a client)."""


class ServerFrames:
    """Parses a server's (unmasked) WebSocket frames from the bytes of a channel:
    into messages (``feed``), or checked and passed on as they are (``scan``)."""

    __slots__ = (
        "_buf",
        "_closed",
        "_parts",
        "_parts_op",
        "_scan_size",
        "_scan_text",
        "_scanning",
        "limit",
    )

    def __init__(self, limit: int = MAX_RELAYED_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._parts: bytearray | None = None
        self._parts_op = 0
        self._scanning = False  # (scan) a fragmented message is under way
        self._scan_size = 0  # (scan) its payload so far
        self._scan_text: codecs.IncrementalDecoder | None = None  # (scan) its text's check
        self._closed = False

    def scan(self, data: bytes) -> tuple[bytes, int, list[tuple[int, bytes]]]:
        """Check the frames in ``data`` (and what was held back) without decoding them:
        returns the whole message frames (TEXT, BINARY, continuations) as they came,
        back to back, to pass on verbatim, how many they are, and the control frames
        among them (CLOSE, PING, PONG), in order. An incomplete frame is held back for
        the next call, never passed on; after a close nothing more is (what follows it
        is dropped). BadFrame: not a server's framing (masked, reserved bits, an
        unknown opcode, a control frame fragmented or over 125 bytes, fragments out of
        order), text that is not UTF-8, or a message over ``limit``."""
        if self._closed:
            return b"", 0, []
        buf = self._joined(data)
        controls: list[tuple[int, bytes]] = []
        pieces: list[bytes | bytearray] = []
        limit = self.limit
        count = 0
        n = len(buf)
        pos = run = 0  # run: where the frames to pass on since the last control began
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if b1 & 0x80 or b0 & 0x70:
                raise BadFrame("a masked frame, or reserved bits")
            opcode = b0 & 0x0F
            head = pos + 2
            if opcode >= 8:
                if opcode > 10 or not b0 & 0x80 or b1 > 125:
                    raise BadFrame("an unknown opcode, or a control frame fragmented or long")
                end = head + b1
                if end > n:
                    break
                if pos > run:
                    pieces.append(buf[run:pos])
                controls.append((opcode, bytes(buf[head:end])))
                pos = run = end
                if opcode == Opcode.CLOSE:
                    self._closed = True
                    break
                continue
            if opcode > 2:
                raise BadFrame(f"an unknown opcode {opcode}")
            length = b1
            if length >= 126:
                got = _extended_length(buf, head, n, length)
                if got is None:
                    break
                length, head = got
            if opcode:
                if self._scanning:
                    raise BadFrame("a message began before the last one ended")
                size = length
            elif not self._scanning:
                raise BadFrame("a continuation with no message")
            else:
                size = self._scan_size + length
            if size > limit:
                raise BadFrame(f"a message of over {limit} bytes")
            end = head + length
            if end > n:
                break
            fin = b0 & 0x80
            try:
                if opcode == Opcode.TEXT and fin:
                    payload = buf[head:end]
                    if not payload.isascii():
                        payload.decode()
                elif opcode == Opcode.TEXT or (not opcode and self._scan_text is not None):
                    if opcode:
                        self._scan_text = codecs.getincrementaldecoder("utf-8")()
                    assert self._scan_text is not None
                    self._scan_text.decode(buf[head:end], final=bool(fin))
            except UnicodeDecodeError:
                raise BadFrame("a text message that is not UTF-8") from None
            if fin:
                self._scanning, self._scan_size, self._scan_text = False, 0, None
            else:
                self._scanning, self._scan_size = True, size
            count += 1
            pos = end
        if pos > run:
            pieces.append(buf[run:pos])
        if self._closed:
            self._buf = bytearray()
        elif buf is self._buf:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        if not pieces:
            out = b""
        elif len(pieces) == 1 and isinstance(pieces[0], bytes):
            out = pieces[0]
        else:
            out = b"".join(pieces)
        return out, count, controls

    def _joined(self, data: bytes) -> bytes | bytearray:
        """``data`` after what an earlier call held back (``self._buf``, which it then
        is: the caller trims what it used)."""
        if self._buf:
            self._buf += data
            return self._buf
        return data

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole messages (TEXT or BINARY, joined from fragments) and control frames
        (CLOSE, PING, PONG) in ``data`` and what was held back. BadFrame: not a
        server's framing, or a message over ``limit``."""
        buf = self._joined(data)
        out: list[tuple[int, bytes]] = []
        n = len(buf)
        pos = 0
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if b1 & 0x80 or b0 & 0x70:
                raise BadFrame("a masked frame, or reserved bits")
            length = b1
            head = pos + 2
            if length >= 126:
                got = _extended_length(buf, head, n, length)
                if got is None:
                    break
                length, head = got
            if length > self.limit:
                raise BadFrame(f"a frame of {length} bytes")
            end = head + length
            if end > n:
                break
            payload = bytes(buf[head:end])
            pos = end
            opcode = b0 & 0x0F
            if opcode >= 8:
                out.append((opcode, payload))
                continue
            if opcode:  # TEXT or BINARY: a message begins
                if self._parts is not None:
                    raise BadFrame("a message began before the last one ended")
                if b0 & 0x80:
                    out.append((opcode, payload))
                    continue
                self._parts, self._parts_op = bytearray(payload), opcode
                continue
            parts = self._parts
            if parts is None:
                raise BadFrame("a continuation with no message")
            parts += payload
            if len(parts) > self.limit:
                raise BadFrame("a message over the bound")
            if b0 & 0x80:
                out.append((self._parts_op, bytes(parts)))
                self._parts = None
        if buf is self._buf:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        return out


def _extended_length(
    buf: bytes | bytearray, head: int, n: int, code: int
) -> tuple[int, int] | None:
    """A frame's length past the 7-bit code (126: 16 bits follow, 127: 64) and where its
    payload starts; None while those bytes have not all come (``n``: what has)."""
    size = 2 if code == 126 else 8
    if n - head < size:
        return None
    return int.from_bytes(buf[head : head + size], "big"), head + size
