"""Wire dialects: how a WebSocket spells the core's events, one codec per dialect.

A dialect sits between frames and the core. Reading, it turns one WebSocket message
into one client event in the core's canonical vocabulary (core/events.py; the event's
size, counted against the session's limits, is its message's length), or refuses it
with a ProtocolError. Writing, it is the core's ``Spelling`` (core/spelling.py): the
core hands it server events and output audio, and journals and sends the frames it
returns. The shell binds a dialect's methods once per connection or session. Nothing
else in the package knows how an event is spelled.

``native`` is protocol v2 (docs/protocol.md): JSON text and the binary audio lane;
``openai`` (``trio_duplex.dialects.openai``) is OpenAI Realtime GA; ``openai-call``
(``trio_duplex.dialects.openai.call``) is OpenAI's on a WebRTC call, which no WebSocket
path speaks (``CALLS_ONLY``). A dialect that
``speaks_first`` opens its session from the upgrade itself (``opening``); one with a
``shaper`` expands each engine event into its own structure before it is sequenced.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator, Mapping
from typing import Any, Final, Protocol

from ..core.spelling import Spelling
from .native import NATIVE

__all__ = ["CALLS_ONLY", "DIALECTS", "NATIVE", "Dialect", "Shaper", "Spelling", "by_name"]


class Shaper(Protocol):
    """One session's expansion of the engine's compact events into a dialect's own
    structure (the OpenAI dialect's ``response.*`` tree). Stateful: it remembers the
    response under way, and that state moves with a migrated session."""

    def shape(self, event: dict[str, Any], /) -> list[dict[str, Any]]:
        """One engine event into the events to sequence, in order (each gets its own
        ``server_event_seq``; the dialect's ``frame`` writes each)."""
        ...

    def state(self) -> dict[str, Any]:
        """What ``Dialect.restore_shaper`` takes back: JSON-able, for a migration record."""
        ...


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

    @property
    def replays_audio(self) -> bool:
        """A resume writes the journal's output audio again (native, openai). False: a
        resume skips the binary lane's audio frames and replays the rest (``Replay``'s
        ``audio``): a call's audio not played before its peer connection was lost, or
        made while detached, would arrive late, over the user (docs/openai.md)."""
        ...

    @property
    def audio_by_transport(self) -> bool:
        """The session's ``audio`` is its transport's (a call's media track), set by
        ``opening`` whatever a client token locks (native, openai: False)."""
        ...

    @property
    def resumes_from_ack(self) -> bool:
        """A resume replays from the session's acknowledged frontier (what its transport
        proved was played), whatever seq it presents: the client cannot number what it
        holds (a telephony provider, whose marks are the acks). False: from the
        presented seq (native, openai)."""
        ...

    @property
    def speaks_first(self) -> bool:
        """The upgrade itself opens (or resumes) the session: ``opening`` says how."""
        ...

    def opening(
        self, query: Mapping[str, list[str]], bearer: str | None, /
    ) -> dict[str, Any] | None:
        """For a dialect that speaks first: the client event the upgrade (its ``query``
        and its bearer credential) stands for, handled exactly as a first message:
        ``session.update`` for a new session, ``session.resume`` for a resume.
        ProtocolError for a bad query; None: wait for a first message (native)."""
        ...

    def shaper(self, config: dict[str, Any], /) -> Shaper | None:
        """A new session's shaper, given its live configuration; None: the engine's
        events are sequenced as they are, at no cost (native)."""
        ...

    def restore_shaper(self, config: dict[str, Any], state: dict[str, Any], /) -> Shaper | None:
        """A migrated session's shaper from its ``Shaper.state()``; ValueError for a bad
        state. None for a dialect without a shaper."""
        ...


DIALECTS: dict[str, Dialect] = {"native": NATIVE}
"""The dialects known by name (a migration record's, a relayed resume's), loaded on
first use beyond native."""

_MODULES = {
    "openai": "trio_duplex.dialects.openai",
    "openai-call": "trio_duplex.dialects.openai.call",
    "twilio": "trio_duplex.dialects.twilio",
}

CALLS_ONLY: Final = frozenset({"openai-call", "twilio"})
"""Dialects spoken on calls only: no client's WebSocket upgrade selects one (the router
answers such a path 404; a telephony stream's door selects ``twilio`` itself). A session
of one may still be named by a migration record or a relayed resume between the nodes
(``by_name``)."""


def by_name(name: str) -> Dialect:
    """The dialect called ``name`` (a migration record's ``dialect``). KeyError: none."""
    dialect = DIALECTS.get(name)
    if dialect is None:
        module = _MODULES.get(name)
        if module is None:
            raise KeyError(name)
        attribute = name.upper().replace("-", "_")  # openai-call: OPENAI_CALL
        dialect = DIALECTS[name] = getattr(importlib.import_module(module), attribute)
    return dialect
