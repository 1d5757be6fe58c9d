"""Cluster mode (issue 13): what nodes share through Redis.

So far only the shared store: membership, the session directory and admission leases.
"""

from .keys import DEFAULT_PREFIX, Keys
from .store import (
    HEARTBEAT_INTERVAL_S,
    NODE_TTL_S,
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
    "NotRegistered",
    "Store",
    "StoreUnavailable",
    "open_store",
]
