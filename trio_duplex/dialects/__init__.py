"""Wire dialects: how a WebSocket spells the core's events, one codec per dialect.

A dialect sits between frames and the core. Reading, it turns one WebSocket message
into one client event in the core's canonical vocabulary (core/events.py; the event's
size, counted against the session's limits, is its message's length), or refuses it
with a ProtocolError. Writing, it is the core's ``Spelling`` (core/spelling.py): the
core hands it server events and output audio, and journals and sends the frames it
returns. The shell binds a dialect's methods once per connection or session. Nothing
else in the package knows how an event is spelled.

``native`` is protocol v2 (docs/protocol.md): JSON text and the binary audio lane.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from ..core.spelling import Spelling
from .native import NATIVE

__all__ = ["NATIVE", "Dialect", "Spelling"]


class Dialect(Spelling, Protocol):
    """One wire dialect: its name, the subprotocol it answers to, and its codec."""

    @property
    def name(self) -> str:
        """What logs and metrics call it (``native``)."""
        ...

    @property
    def subprotocol(self) -> str | None:
        """The WebSocket subprotocol the upgrade selects when the client offers it."""
        ...

    @property
    def large(self) -> int:
        """Text messages of at least this many characters are decoded with
        ``decode_steps``, which lets the shell yield between slices of the work."""
        ...

    @property
    def binary_lane(self) -> bool:
        """It carries audio in binary messages (``decode_binary``, ``audio_frame`` with
        no fields): a session may be opened with ``session.audio.wire = "binary"``."""
        ...

    def decode(self, message: str | bytes, /) -> dict[str, Any]:
        """One message into a client event with a string ``type``, in the core's
        vocabulary; ProtocolError (with the code to answer) if it cannot be one. A
        binary message is refused here: it is ``decode_binary``'s, on an open session."""
        ...

    def decode_steps(self, message: str | bytes, /) -> Generator[None, None, dict[str, Any]]:
        """``decode`` in slices: a generator that yields between them and returns the
        event (or raises what ``decode`` raises)."""
        ...

    def decode_binary(self, data: bytes, /) -> dict[str, Any]:
        """A binary message of a session opened for the binary lane, as the client
        event it stands for (``input_audio_buffer.append`` with bytes ``audio``)."""
        ...
