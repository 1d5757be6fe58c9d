"""``Spelling``: how the core has its server events written, without knowing any wire.

The core builds events as dicts in its canonical vocabulary (core/events.py) and hands
each one to its session's ``Spelling`` for the frame to journal and send. A dialect
(``trio_duplex.dialects``: the native v2 JSON and binary lane, and any other) implements
it; the core never imports one, and writes no frame any other way.
"""

from __future__ import annotations

from typing import Any, Protocol

from .journal import Frame

__all__ = ["Frame", "Spelling"]


class Spelling(Protocol):
    """The writing half of a dialect: what the core calls (bind the methods once)."""

    def frame(self, event: dict[str, Any], /) -> Frame:
        """One server event (journaled or not, its ``server_event_seq`` already set if
        journaled) as the message that carries it. Raises ValueError or TypeError for an
        event that cannot be written (a NaN, an object of no JSON type)."""
        ...

    @property
    def config_locked_closes(self) -> bool:
        """A ``session.update`` refused ``config_locked`` (it changes a locked field)
        also closes the connection (1008), the session detaching: native. False: the
        connection goes on after the error, as every error in OpenAI's dialect."""
        ...

    def audio_frame(self, seq: int, payload: bytes, fields: dict[str, Any] | None, /) -> Frame:
        """Output audio ``payload`` (the session's wire format), journaled as event
        ``seq``. ``fields``: the engine's ``response.output_audio.delta`` whose audio it
        is (its other fields go with it), or None for the binary lane, which the session
        was opened with (``session.audio.wire``)."""
        ...
