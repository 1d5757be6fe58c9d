"""The client tokens outstanding (``POST /v1/client_tokens``; auth.py), bounded in bytes.

Each token is kept as a SHA-256 digest, its principal, its deadline, the digest of the
API key that asked for it, and its locked configuration as compact JSON bytes (parsed
again, by the wire's decoder, when the token is spent): what it costs is what it is
counted as, ``len(config) + TOKEN_OVERHEAD``. Three bounds hold at every issue: the
whole store's bytes (``--client-token-max-bytes``), and one principal's count and bytes
(``--client-token-max-per-key``, ``--client-token-max-bytes-per-key``, at most half the
store's: one principal at its share never leaves another none). Expired tokens are
dropped as time passes (a heap of deadlines), so they stop counting without a sweep.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import secrets
from collections.abc import Callable
from typing import Any

import attrs

from ...core.wire import ProtocolError
from ...dialects.jsonwire import decode_object

TOKEN_PREFIX = "ek_"
"""Every client token (a client secret too) starts so: the OpenAI agents SDK takes a key
in a browser only if it does (``apiKey.startsWith('ek_')``), as OpenAI's own secrets do."""

TOKEN_OVERHEAD = 512
"""Bytes counted per token beyond its configuration: its digest, key digest, record,
dict slot and heap entry: about 300 as tests/server/test_tenancy.py measures it, and
a dict that has just doubled holds more for a while."""


def digest(credential: str) -> bytes:
    """How a credential is kept and looked up: its SHA-256 digest."""
    return hashlib.sha256(credential.encode("utf-8", "surrogatepass")).digest()


class Refused(enum.Enum):
    """Why a token was not issued."""

    PRINCIPAL_FULL = "principal_full"
    """The principal holds its share (count or bytes): 429, for it alone."""
    STORE_FULL = "store_full"
    """The whole store holds ``max_bytes``: 503."""


@attrs.frozen
class TokenLimits:
    max_bytes: int
    max_per_principal: int
    max_bytes_per_principal: int


@attrs.define(eq=False, repr=False, slots=True)
class ClientToken:
    principal: str
    deadline: float
    """``trio.current_time()`` past which it is expired."""
    config: bytes | None
    """A locked session configuration as compact JSON, or None."""
    key: bytes | None = None
    """The digest of the API key that asked for it (None: the ``--auth`` verifier's)."""

    @property
    def size(self) -> int:
        return TOKEN_OVERHEAD + (0 if self.config is None else len(self.config))

    def locked(self) -> dict[str, Any] | None:
        """The locked configuration, parsed (it was checked when issued)."""
        if self.config is None:
            return None
        try:
            return decode_object(self.config.decode())
        except ProtocolError:  # (it was encoded by us from a checked object)
            raise AssertionError("a stored configuration no longer parses") from None

    def __repr__(self) -> str:
        return f"<ClientToken of {self.principal!r}, {self.size} bytes>"


@attrs.define(eq=False, slots=True)
class _Share:
    count: int = 0
    size: int = 0


@attrs.define(eq=False, repr=False)
class ClientTokens:
    """Short-lived, one-use client tokens, by SHA-256 digest, bounded (see the module)."""

    limits: TokenLimits
    _tokens: dict[bytes, ClientToken] = attrs.field(factory=dict)
    _shares: dict[str, _Share] = attrs.field(factory=dict)
    """What each principal holds; a principal with none has no entry."""
    _deadlines: list[tuple[float, bytes]] = attrs.field(factory=list)
    """A heap of (deadline, digest); an entry whose token is gone is skipped when popped."""
    held_bytes: int = 0
    """What the outstanding tokens count, in bytes."""

    def issue(self, token: ClientToken, now: float) -> str | Refused:
        """A new token for ``token``'s grant, or why not."""
        self.forget_expired(now)
        limits, size = self.limits, token.size
        share = self._shares.get(token.principal) or _Share()
        if (
            share.count >= limits.max_per_principal
            or share.size + size > limits.max_bytes_per_principal
        ):
            return Refused.PRINCIPAL_FULL
        if self.held_bytes + size > limits.max_bytes:
            return Refused.STORE_FULL
        plain = TOKEN_PREFIX + secrets.token_urlsafe(32)  # URL-safe: may be a subprotocol
        key = digest(plain)
        self._tokens[key] = token
        share.count += 1
        share.size += size
        self._shares[token.principal] = share
        self.held_bytes += size
        heapq.heappush(self._deadlines, (token.deadline, key))
        return plain

    def take(self, credential: str, now: float) -> ClientToken | None:
        """Spend ``credential`` if it is a live client token (one use)."""
        self.forget_expired(now)
        key = digest(credential)
        token = self._tokens.get(key)  # a dict of digests: no timing to learn from
        if token is None:
            return None
        self._drop(key)
        return token if token.deadline >= now else None

    def revoke(self, kept: Callable[[bytes], bool]) -> int:
        """Drop every token an API key asked for whose digest is not ``kept``; how many."""
        gone = [k for k, t in self._tokens.items() if t.key is not None and not kept(t.key)]
        for key in gone:
            self._drop(key)
        return len(gone)

    def forget_expired(self, now: float) -> None:
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _, key = heapq.heappop(heap)
            token = self._tokens.get(key)
            if token is not None and token.deadline < now:
                self._drop(key)
        if len(heap) > 2 * len(self._tokens) + 64:  # spent tokens' entries: rebuild
            self._deadlines = [(t.deadline, k) for k, t in self._tokens.items()]
            heapq.heapify(self._deadlines)

    def _drop(self, key: bytes) -> None:
        token = self._tokens.pop(key)
        share = self._shares[token.principal]
        share.count -= 1
        share.size -= token.size
        if not share.count:
            del self._shares[token.principal]
        self.held_bytes -= token.size

    def held_by(self, principal: str) -> tuple[int, int]:
        """The count and bytes of ``principal``'s outstanding tokens."""
        share = self._shares.get(principal) or _Share()
        return share.count, share.size

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"<ClientTokens, {len(self._tokens)} outstanding, {self.held_bytes} bytes>"


__all__ = [
    "TOKEN_OVERHEAD",
    "TOKEN_PREFIX",
    "ClientToken",
    "ClientTokens",
    "Refused",
    "TokenLimits",
    "digest",
]
