"""Where sessions live: the few points at which the session shell asks cluster mode.

A single server places every session here, and ``SingleProcess`` answers so. With
``--cluster`` the server composes ``trio_duplex.cluster.placement.ClusterPlacement``
instead (the shell never imports it): it takes a cluster-wide lease for each open, files
the session in the shared directory, finds a session held elsewhere for a resume, and
hands the sessions that can migrate over when the node drains.

The points, in a session's life:

* ``lease``, before the local admission of an open; ``release`` gives it back;
* ``claim``, once the session is admitted, before its client hears of it;
* ``resume_elsewhere``, for a resume of a session not held here (``findable``, to ask
  whether one is, claiming nothing);
* ``migrates`` when the drain begins, and ``hand_over`` during it;
* ``released``, once a session's slot is free (its lease and directory entry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...core.events import Event
from ...core.session import Session
from .connection import Connection
from .owner import Observer, Sessions
from .runner import SessionRunner


class Placement(Protocol):
    """What the shell asks of cluster mode (``SingleProcess``: nothing to ask)."""

    @property
    def store_up(self) -> bool | None:
        """Did the cluster store answer its last call? None: not in a cluster."""

    @property
    def refusing_opens(self) -> bool:
        """Is every open refused for now (a cluster-wide cap, and its store down)?"""

    async def lease(self) -> bool:
        """Before the local admission of an open: a cluster-wide lease. True: taken (give
        it back with ``release`` if the open is not admitted). ProtocolError: refused."""

    def release(self) -> None:
        """Give back a lease whose open was not admitted."""

    async def claim(self, session_id: str) -> None:
        """The admitted session lives here (before its client hears of it)."""

    async def resume_elsewhere(self, conn: Connection, event: Event, session_id: str) -> bool:
        """A resume of a session not held here. True: answered elsewhere (relayed);
        False: answer it here (it was never elsewhere, or it has just moved here).
        ProtocolError: its home is gone, or cannot be reached now."""

    async def findable(self, session_id: str) -> bool:
        """Is a session not held here held elsewhere, or handed over, so that a resume
        could find it? Claims nothing (a phone call's ``<Redirect>`` asks)."""

    def migrates(self) -> Callable[[SessionRunner], bool] | None:
        """When the drain begins: which sessions it hands over rather than ends (None:
        none)."""

    async def hand_over(self, sessions: Sessions) -> None:
        """During the drain: hand over the sessions ``migrates`` chose."""

    def released(self, session_id: str) -> None:
        """A session's slot is free: its lease and directory entry go back."""


class SingleProcess:
    """One server: every session is placed here, and there is nothing to ask."""

    @property
    def store_up(self) -> bool | None:
        return None

    @property
    def refusing_opens(self) -> bool:
        return False

    async def lease(self) -> bool:
        return False

    def release(self) -> None:
        pass

    async def claim(self, session_id: str) -> None:
        pass

    async def resume_elsewhere(self, conn: Connection, event: Event, session_id: str) -> bool:
        return False

    async def findable(self, session_id: str) -> bool:
        return False

    def migrates(self) -> Callable[[SessionRunner], bool] | None:
        return None

    async def hand_over(self, sessions: Sessions) -> None:
        pass

    def released(self, session_id: str) -> None:
        pass


class Releasing(Observer):
    """Tells a placement each session whose slot is free."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def released(self, session: Session) -> None:
        self.placement.released(session.id)


__all__ = ["Placement", "Releasing", "SingleProcess"]
