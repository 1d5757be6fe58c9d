"""Cluster mode (issue 13): what nodes share through Redis.

The shared store: membership, the session directory, admission leases and handed-over
sessions.
"""

from .keys import DEFAULT_PREFIX, Keys
from .store import (
    HEARTBEAT_INTERVAL_S,
    NODE_TTL_S,
    Located,
    NotRegistered,
    Store,
    StoreUnavailable,
    open_store,
)

__all__ = [
    "DEFAULT_PREFIX",
    "HEARTBEAT_INTERVAL_S",
    "NODE_TTL_S",
    "Keys",
    "Located",
    "NotRegistered",
    "Store",
    "StoreUnavailable",
    "open_store",
]
