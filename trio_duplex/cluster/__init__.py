"""Cluster mode (docs/cluster.md): what nodes share through Redis.

The shared store: membership, the session directory, admission leases and handed-over
sessions.
"""

from .keys import DEFAULT_PREFIX, Keys
from .signed import Sealer
from .store import (
    CLAIM_TTL_S,
    HEARTBEAT_INTERVAL_S,
    LEASE_TTL_S,
    NODE_TTL_S,
    Beat,
    ClusterRefused,
    Located,
    NotRegistered,
    Store,
    StoreUnavailable,
    open_store,
)

__all__ = [
    "CLAIM_TTL_S",
    "DEFAULT_PREFIX",
    "HEARTBEAT_INTERVAL_S",
    "LEASE_TTL_S",
    "NODE_TTL_S",
    "Beat",
    "ClusterRefused",
    "Keys",
    "Located",
    "NotRegistered",
    "Sealer",
    "Store",
    "StoreUnavailable",
    "open_store",
]
