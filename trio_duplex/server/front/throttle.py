"""Failed credentials by client address, in bounded memory (cluster mode; auth.py)."""

from __future__ import annotations

import ipaddress

import attrs


@attrs.frozen
class Throttled:
    """An upgrade refused for its address's failures: 429, ``Retry-After``."""

    retry_after_s: int


@attrs.define(eq=False, repr=False)
class Failures:
    """Failed credentials by client address (a token bucket each), in bounded memory.

    Cluster mode lets a credential nothing here knows through to send one resume (it may
    be a token of a session on another node), and each costs a store call: an address
    whose such resumes keep failing is refused before the upgrade for a while. IPv6
    addresses count by /64 (one host has that many); at ``max_addresses`` the address
    failed least recently is forgotten."""

    burst: float = 30.0
    rate: float = 2.0
    """Failures forgiven per second."""
    max_addresses: int = 65_536
    _buckets: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    """Address: (failures it may still have, when that was counted)."""

    @staticmethod
    def _key(peer: str) -> str:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return peer
        if address.version == 6:
            return str(ipaddress.ip_network(f"{peer}/64", strict=False))
        return peer

    def _left(self, key: str, now: float) -> float:
        left, stamp = self._buckets.get(key, (self.burst, now))
        return min(self.burst, left + (now - stamp) * self.rate)

    def allows(self, peer: str | None, now: float) -> bool:
        return peer is None or self._left(self._key(peer), now) >= 1

    def failed(self, peer: str | None, now: float) -> None:
        if peer is None:
            return
        key = self._key(peer)
        left = self._left(key, now) - 1
        self._buckets.pop(key, None)  # re-inserted last: the dict's order is recency
        if len(self._buckets) >= self.max_addresses:
            del self._buckets[next(iter(self._buckets))]
        self._buckets[key] = (left, now)

    def __len__(self) -> int:
        return len(self._buckets)

    def __repr__(self) -> str:
        return f"<Failures of {len(self._buckets)} addresses>"


__all__ = ["Failures", "Throttled"]
