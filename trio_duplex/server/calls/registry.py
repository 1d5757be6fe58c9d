"""``Calls``: the calls a server process serves now, by id, and the session each one
carries, so that a hangup (``DELETE /v1/realtime/calls/{id}``) finds its session even
after the call's peer connection is gone.

It keeps no history: an entry lives from a call's ``201`` until its session is released
(ended, or never opened), and is bounded by the sessions plus the calls in setup
(``--call-max-setup``). An ``Observer`` of the sessions (owner.py): ``attached`` maps a
call's channel to its session when the session shell opens or resumes one over it,
``released`` forgets the session's calls.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from ...core.session import Session
from ...media.port import CallEnd, CallPort
from ..sessions.connection import Connection
from ..sessions.owner import Observer
from .channel import CallChannel


class Media(Protocol):
    """What the door needs of a media link (``media.link.MediaLink``, or the tests'
    ``testing.media.FakeMediaLink``)."""

    @property
    def broken(self) -> object:
        """Truthy while no worker serves (then every call is refused 503)."""
        ...

    def open_call(self, end: CallEnd) -> CallPort:
        """A new call on the worker; ``trio.BrokenResourceError`` if none runs."""
        ...


@attrs.define(eq=False)
class Calls(Observer):
    """Live calls: by id, the channel and (once attached) the session id."""

    max_setup: int
    in_setup: int = 0
    """Calls between their POST and their data channel open (or their end)."""
    _channels: dict[str, CallChannel] = attrs.field(factory=dict)
    _call_of_channel: dict[CallChannel, str] = attrs.field(factory=dict)
    _session_of: dict[str, str] = attrs.field(factory=dict)
    """call id -> the id of the session it carries (or carried)."""
    _calls_of: dict[str, set[str]] = attrs.field(factory=dict)
    """session id -> the ids of its calls, until the session is released."""

    def __repr__(self) -> str:
        return f"<Calls {len(self._session_of)} live, {self.in_setup} in setup>"

    @property
    def full(self) -> bool:
        return self.in_setup >= self.max_setup

    def add(self, call_id: str, channel: CallChannel) -> None:
        self._channels[call_id] = channel
        self._call_of_channel[channel] = call_id

    def remove(self, channel: CallChannel) -> None:
        """The call's channel has ended (its session, if any, is kept by id until it is
        released: a hangup may still end it)."""
        call_id = self._call_of_channel.pop(channel, None)
        if call_id is not None:
            del self._channels[call_id]

    def session_of(self, call_id: str) -> str | None:
        """The session the call carries, or carried while that session lives."""
        return self._session_of.get(call_id)

    def channel(self, call_id: str) -> CallChannel | None:
        return self._channels.get(call_id)

    def __len__(self) -> int:
        return len(self._channels)

    # -- Observer ---------------------------------------------------------------------

    def attached(self, session: Session, conn: Connection) -> None:
        ws = conn.ws
        call_id = self._call_of_channel.get(ws) if isinstance(ws, CallChannel) else None
        if call_id is not None:
            self._session_of[call_id] = session.id
            self._calls_of.setdefault(session.id, set()).add(call_id)

    def released(self, session: Session) -> None:
        for call_id in self._calls_of.pop(session.id, ()):
            self._session_of.pop(call_id, None)


__all__ = ["Calls", "Media"]
