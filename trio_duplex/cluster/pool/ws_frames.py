"""The WebSocket frames a channel carries (sans-IO): a client's frames as the front
writes them towards the home, and a parser of the home's (server) frames."""

from __future__ import annotations

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


class BadFrame(Exception):
    """The home's WebSocket stream broke the rules (our own server: a bug, not a client)."""


class ServerFrames:
    """Parses a server's (unmasked) WebSocket frames from the bytes of a channel."""

    __slots__ = ("_buf", "_parts", "_parts_op", "limit")

    def __init__(self, limit: int = MAX_RELAYED_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._parts: bytearray | None = None
        self._parts_op = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole messages (TEXT or BINARY, joined from fragments) and control frames
        (CLOSE, PING, PONG) in ``data`` and what was held back. BadFrame: not a
        server's framing, or a message over ``limit``."""
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
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
            if length == 126:
                if n - head < 2:
                    break
                length = int.from_bytes(buf[head : head + 2], "big")
                head += 2
            elif length == 127:
                if n - head < 8:
                    break
                length = int.from_bytes(buf[head : head + 8], "big")
                head += 8
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
