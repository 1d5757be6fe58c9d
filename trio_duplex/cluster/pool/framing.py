"""The peer connection's framing (sans-IO): the frame kinds, the 9-byte head, the
bounds both sides keep to. Every frame is ``kind`` (1 byte), ``channel`` (4), ``length``
(4), all big-endian, then ``length`` bytes (the package's docstring says what each kind
carries)."""

from __future__ import annotations

import enum
import struct

WINDOW = 256 * 1024
"""Bytes one direction of a channel may have in flight (sent, not yet consumed)."""
SLACK = 1024
"""What a sender may go past a window by, for the small control frames it must answer
(a pong to the home's ping, a close's echo) when the window is full."""
MAX_FRAME = 64 * 1024
"""The longest DATA payload (a longer write is sent in several)."""
OUT_LIMIT = 1024 * 1024
"""Bytes queued for one peer connection before senders wait (plus one frame at most)."""
MAX_CHANNELS = 4096
"""Channels one peer connection carries at once; more are refused (RESET)."""

HEAD = struct.Struct(">BII")
HEAD_SIZE = HEAD.size
CREDIT_BODY = struct.Struct(">I")
PING_BODY = struct.Struct(">Q")


class Kind(enum.IntEnum):
    OPEN = 1
    DATA = 2
    CREDIT = 3
    EOF = 4
    RESET = 5
    PING = 6
    PONG = 7


K_OPEN, K_DATA, K_CREDIT, K_EOF, K_RESET, K_PING, K_PONG = (
    Kind.OPEN,
    Kind.DATA,
    Kind.CREDIT,
    Kind.EOF,
    Kind.RESET,
    Kind.PING,
    Kind.PONG,
)
MAX_OPEN = 2 * 128 + 1


class Broken(Exception):
    """The peer connection broke the framing rules (or ended): it is cut."""
