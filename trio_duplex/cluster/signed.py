"""Records in the shared store, sealed so that a node acts on none it did not get from
another node of its cluster. No I/O: the caller passes the time (``Complaints``, which
logs the values that fail, rate-limits on the monotonic clock).

The store is not trusted: whoever can write to Redis could otherwise point a session at
their own URL, hand a node a session of their own making, or undercount the cluster's
leases. So every value a node acts on is *sealed*: ``v1.EXPIRES.MAC.PAYLOAD``, where
``MAC`` is an HMAC-SHA256, under a key derived from the cluster secret, of the key name
the value is stored at, its expiry (wall-clock milliseconds) and its payload. A sealed
value moved to another key, kept past its expiry, or changed in any byte does not open
(``Sealer.open`` returns None), and the caller ignores it. The payload stays readable
after the last ``.`` of the prefix, so that the Lua scripts, which cannot check a MAC
(the secret never goes to Redis), can still do their bookkeeping on it: what a script
decides on an unchecked payload can only make a node refuse (a denial of service),
because the node checks what it then acts on.

A value that must not be read either (a migration record holds a session's journal)
is also encrypted first (``seal_private``): AES-256-GCM under a second key derived from
the secret, a random 96-bit nonce per value, the key name as associated data.

What sealing cannot stop: a sealed value replayed at the same key before it expires.
Expiries are kept as short as each record allows (see the store's keys); lease counts
carry a version besides, and their expiry is checked against Redis's clock too
(``leases.py``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import time

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = "v1"
LABEL = b"trio-duplex store records v1"
"""The key is HMAC-SHA256(secret, LABEL): not the secret itself, and not the relay's key."""
PRIVATE_LABEL = b"trio-duplex store encryption v1"
"""The encryption key is HMAC-SHA256(secret, PRIVATE_LABEL)."""
NONCE_BYTES = 12
CLOCK_ALLOWANCE_MS = 60_000
"""How far ahead of a reader's clock a writer's may be (the relay allows the same): a
sealed value opens until its expiry plus this, by the reader's clock."""

COMPLAINT_INTERVAL_S = 60.0
"""A value that fails its check is logged at most once per this interval."""

log = logging.getLogger("trio_duplex")

_SEALED = re.compile(r"v1\.([0-9]{1,15})\.([0-9a-f]{64})\.(.*)", re.DOTALL)


@attrs.frozen(repr=False)
class Sealer:
    """Seals and opens store values under the key derived from the cluster secret."""

    _key: bytes
    _private: bytes

    @classmethod
    def of(cls, secret: str) -> Sealer:
        if not secret:
            raise ValueError("a sealer needs the cluster secret")
        return cls(
            hmac.new(secret.encode(), LABEL, hashlib.sha256).digest(),
            hmac.new(secret.encode(), PRIVATE_LABEL, hashlib.sha256).digest(),
        )

    def __repr__(self) -> str:
        return "Sealer(<key>)"

    def _mac(self, name: str, expires_ms: int, payload: str) -> str:
        message = f"{VERSION}\n{name}\n{expires_ms}\n{payload}".encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, name: str, payload: str, expires_ms: int) -> str:
        """``payload`` sealed for the key ``name`` until ``expires_ms`` (wall clock)."""
        if expires_ms < 0:
            raise ValueError(f"an expiry cannot be negative: {expires_ms}")
        return f"{VERSION}.{expires_ms}.{self._mac(name, expires_ms, payload)}.{payload}"

    def open(self, name: str, sealed: object, now_ms: int) -> str | None:
        """The payload of ``sealed`` if it was sealed for ``name`` and has not expired by
        ``now_ms``, else None. The MAC is compared in constant time, whatever else."""
        opened = self.open_until(name, sealed, now_ms)
        return None if opened is None else opened[0]

    def open_until(self, name: str, sealed: object, now_ms: int) -> tuple[str, int] | None:
        """``open``, with the value's expiry: for a caller that checks it against a
        second clock too (lease counts, against Redis's own)."""
        if not isinstance(sealed, str):
            return None
        match = _SEALED.fullmatch(sealed)
        if match is None:
            return None
        expires_ms, mac, payload = int(match[1]), match[2], match[3]
        good = hmac.compare_digest(mac, self._mac(name, expires_ms, payload))
        if not good or now_ms > expires_ms + CLOCK_ALLOWANCE_MS:
            return None
        return payload, expires_ms

    def seal_private(self, name: str, data: bytes, expires_ms: int) -> str:
        """``data`` encrypted (AES-256-GCM, the key name as associated data), then sealed."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._private).encrypt(nonce, data, name.encode())
        return self.seal(name, base64.b64encode(nonce + sealed).decode("ascii"), expires_ms)

    def open_private(self, name: str, sealed: object, now_ms: int) -> bytes | None:
        """What ``seal_private`` sealed for ``name``, if it opens and decrypts, else None."""
        payload = self.open(name, sealed, now_ms)
        if payload is None:
            return None
        try:
            raw = base64.b64decode(payload, validate=True)
            return AESGCM(self._private).decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], name.encode()
            )
        except (binascii.Error, ValueError, InvalidTag):
            return None


def payload_of(sealed: str) -> str:
    """The payload of a sealed value, unchecked (for display and tests only)."""
    match = _SEALED.fullmatch(sealed)
    return "" if match is None else match[3]


LUA_PAYLOAD = r"^v1%.%d+%.%x+%.(.*)$"
"""The Lua pattern that takes a sealed value's payload (unchecked) in a script."""


@attrs.define(eq=False)
class Complaints:
    """Records that failed their check: logged at WARNING at most once per interval
    (a store under attack, or nodes with different secrets), never with a value."""

    interval_s: float = COMPLAINT_INTERVAL_S
    count: int = 0
    _quiet_until: float = -float("inf")
    _unsaid: int = 0

    def __call__(self, what: str, key: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now < self._quiet_until:
            self._unsaid += 1
            return
        self._quiet_until = now + self.interval_s
        more = f" (and {self._unsaid} more since)" if self._unsaid else ""
        self._unsaid = 0
        log.warning(
            "cluster: ignored %s at %s: it fails its check (written by something other than "
            "a node of this cluster, or by one with another --cluster-secret)%s; said at most "
            "once a minute",
            what,
            key,
            more,
        )
