"""What a call's shell (``server/calls/channel.py``) and the media link
(``media/link.py``) know of each other: one call's end of the link (``CallPort``), and
what the link calls on the shell's side (``CallEnd``). Both are being built (issue 28):
this is their contract, so that each is written and tested on its own."""

from __future__ import annotations

from typing import Protocol

from .wire import Kind


class CallPort(Protocol):
    """One call on a media link, as the shell uses it."""

    @property
    def call(self) -> int:
        """The call's number on its link (``wire`` frames' ``call``)."""
        ...

    @property
    def broken(self) -> bool:
        """The worker died or broke the framing: nothing more is sent or received."""
        ...

    def send(self, kind: Kind, payload: bytes = b"") -> None:
        """Queue one frame for the worker, without waiting (the shell keeps to its
        credits, so the link's queue is bounded by them); ``trio.BrokenResourceError``
        once ``broken``."""
        ...

    def release(self) -> None:
        """The call is over on the shell's side: its number may be used again once the
        worker has said ``CLOSED`` (or the link broke)."""
        ...


class CallEnd(Protocol):
    """The shell's side of one call, as the link calls it (never blocking: from the
    link's reader task)."""

    def received(self, kind: Kind, payload: bytes) -> None:
        """A frame the worker sent for this call (the link has checked its framing)."""
        ...

    def link_broken(self, why: str) -> None:
        """The worker died or broke the framing: the call has lost its peer connection."""
        ...
