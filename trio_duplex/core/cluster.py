"""Cluster mode's refusals: what a client is answered when the cluster, not the
session, is why its open or resume cannot go on now (docs/cluster.md).

The node (``trio_duplex.cluster``) finds out where a session lives, whether a lease is
free, whether a handed-over session could be taken; these name the answer for each case,
so that the shell raises only what the core built. Each is retryable (close 1013) but a
session whose node is gone (``node_lost``) and a take-over the record or the token
refuses (close 4001).
"""

from __future__ import annotations

import enum

from .events import ErrorCode
from .frames import CloseCode
from .wire import ProtocolError


class Located(enum.Enum):
    """Where the store says a session this node does not hold is, when it is not here to
    be resumed (``Store.locate``'s kinds)."""

    BUSY = "busy"
    """Another node is taking it over."""
    STALLED = "stalled"
    """Its node is registered but not answering the cluster."""
    LOST = "lost"
    """Its node is gone, and the session with it."""


def elsewhere(kind: Located, node_id: str | None = None) -> ProtocolError:
    """The answer to a resume of a session that lives ``kind`` of here."""
    if kind is Located.BUSY:
        return ProtocolError.home_unreachable("the session is being taken over by another node")
    if kind is Located.STALLED:
        return ProtocolError.home_unreachable(
            f"the session's node ({node_id}) is not answering the cluster"
        )
    return ProtocolError.resume_refused(
        ErrorCode.SESSION_RESUME_EXPIRED, "the session's node is gone, and the session with it"
    ).with_extra(reason="node_lost")


def unreachable_home(node_id: str) -> ProtocolError:
    """A relayed resume whose home node could not be reached from this one."""
    return ProtocolError.home_unreachable(
        f"the session's node ({node_id}) could not be reached from this one"
    )


def store_unreachable_for_resume() -> ProtocolError:
    """A resume of a session this node does not hold, while the store does not answer."""
    return ProtocolError.home_unreachable(
        "the cluster store is unreachable, so the session cannot be found"
    )


class NoLease(enum.Enum):
    """Why an open got no cluster-wide lease."""

    STORE_UNREACHABLE = "the cluster store is unreachable; try again later"
    REJOINING = "this node is rejoining the cluster; try again shortly"


def no_lease(why: NoLease) -> ProtocolError:
    """An open refused because the store could not grant a lease now."""
    return _exhausted(why.value)


def cluster_full(cap: int) -> ProtocolError:
    """An open refused at ``--cluster-max-sessions``."""
    return _exhausted(f"all {cap} cluster-wide session slots are in use")


def record_unusable() -> ProtocolError:
    """A handed-over session whose record cannot be used: it is gone for good."""
    return ProtocolError.resume_refused(
        ErrorCode.SESSION_RESUME_EXPIRED, "the session could not be taken over"
    )


def takeover_token_invalid() -> ProtocolError:
    """A resume token that does not match the handed-over session's record."""
    return ProtocolError.resume_refused(
        ErrorCode.INVALID_RESUME_TOKEN, "the resume token is not valid"
    )


def takeover_failed() -> ProtocolError:
    """The handed-over session could not be restored here (retryable: left to another
    node, or to a later attempt)."""
    return ProtocolError.home_unreachable("the session could not be taken over here")


def takeover_unconfirmed() -> ProtocolError:
    """The store did not confirm this node's take-over: another node may hold it."""
    return ProtocolError.home_unreachable("the session is being taken over")


def _exhausted(message: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.RESOURCE_EXHAUSTED, message, close_code=CloseCode.TRY_AGAIN_LATER
    )
