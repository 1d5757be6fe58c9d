"""Admission lease counts as the store holds them, and what a node remembers of its
peers' counts, so that a count replayed or deleted in the store cannot undercount a
node. No I/O: the store passes Redis's time (``TIME``, read in the same script).

A node's count is a sealed value only that node writes: ``COUNT.VERSION``, where the
version strictly increases with every value any process writes (wall-clock
microseconds, or one more than the last), so that it also orders a node id's values
across a restart. Its seal expires one lease TTL after it was written, by Redis's clock
(the writer seals with its estimate of it), and a reader checks that expiry against
Redis's ``TIME`` read in the same script as the value, not only against its own clock
with the 60 s allowance sealed values get: a value replayed at its key is at most one
lease TTL old.

Each node remembers, for each peer it has read, the newest value it has seen (its
count, version and expiry). A value older than that is a replay and counts as the cap;
a peer whose value has vanished since (its key deleted, or its id taken out of the node
index) still counts at its last count until that value's expiry, unless its sealed
tombstone says it left after that value was written (a tombstone carries a version too).
"""

from __future__ import annotations

import re

import attrs

_PAYLOAD = re.compile(r"([0-9]{1,15})\.([0-9]{1,20})")

LUA_COUNT = r"^(%d+)%.%d+$"
"""The Lua pattern that takes the count (unchecked) out of a lease payload."""


def lease_payload(count: int, version: int) -> str:
    if count < 0:
        raise ValueError(f"a lease count cannot be negative: {count}")
    return f"{count}.{version}"


def parse_lease(payload: str) -> tuple[int, int] | None:
    """(count, version) of a lease payload, or None if it is not one."""
    match = _PAYLOAD.fullmatch(payload)
    return None if match is None else (int(match[1]), int(match[2]))


@attrs.frozen
class Seen:
    count: int
    version: int
    expires_ms: int
    """The value's expiry, by Redis's clock: it counts until then, present or not."""


@attrs.define(eq=False)
class Peers:
    """The newest lease value this process has seen of each other node (in memory: at
    most one entry per node whose value has not expired)."""

    _seen: dict[str, Seen] = attrs.field(factory=dict)

    def check(self, node_id: str, count: int, version: int, expires_ms: int, now_ms: int) -> bool:
        """Is this opened value one to count (not expired by Redis's clock ``now_ms``, and
        not older than the newest seen of ``node_id``)? Remembers it if it is newer."""
        if expires_ms < now_ms:
            return False
        seen = self._seen.get(node_id)
        if seen is not None and seen.expires_ms < now_ms:
            seen = None  # (what it proved has expired: a clock set back is not held forever)
        if seen is not None and version < seen.version:
            return False
        if seen is None or version > seen.version:
            self._seen[node_id] = Seen(count, version, expires_ms)
        return True

    def vanished(self, node_id: str, now_ms: int) -> int:
        """What ``node_id``, whose value is gone from the store, still counts for: its
        last count until that value's expiry, else 0 (and it is forgotten)."""
        seen = self._seen.get(node_id)
        if seen is None:
            return 0
        if seen.expires_ms < now_ms:
            del self._seen[node_id]
            return 0
        return seen.count

    def left(self, node_id: str, version: int) -> bool:
        """``node_id``'s tombstone, written at ``version``, was found: it holds nothing
        (and is forgotten), unless the count seen of it is newer (a tombstone of an
        earlier process of the same id, played again)."""
        seen = self._seen.get(node_id)
        if seen is not None and seen.version > version:
            return False
        self._seen.pop(node_id, None)
        return True

    def remembered(self, now_ms: int, exclude: str) -> list[tuple[str, int]]:
        """The peers (but ``exclude``) whose last value has not expired by ``now_ms``, with
        their counts; the others are forgotten."""
        for node_id in [n for n, s in self._seen.items() if s.expires_ms < now_ms]:
            del self._seen[node_id]
        return [(n, s.count) for n, s in self._seen.items() if n != exclude]
