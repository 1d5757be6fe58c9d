"""Resume credentials: 256-bit random tokens, kept only as SHA-256 digests.

Rotation rule (docs/protocol.md, Resume): a resume that presents a valid token is issued a
new one; until the client shows it holds the new token, the presented one stays valid
too, so a client whose ``session.resumed`` was lost can try again. The client shows it
by presenting the new token (a later resume), or by its first message on the resumed
connection (``confirm``); either kills every older token. At most two digests are ever
valid.

A *fixed* credential (``Credentials.fixed``) is one token that never rotates: a
telephony call's session (server/twilio/), whose token is derived from the call's id on
whichever node needs it, and which its client (the provider) never reads from
``session.resumed``. ``rotate`` gives the same token back, and ``confirm`` does nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import attrs

TOKEN_BYTES = 32  # 256 bits of randomness per token


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@attrs.define(eq=False, repr=False)
class Credentials:
    _current: bytes
    _pending: bytes | None = None
    _fixed: bool = False

    @classmethod
    def from_digests(
        cls, current: bytes, pending: bytes | None, *, fixed: bool = False
    ) -> Credentials:
        """Credentials holding these digests (``digests``): a session moved between
        nodes keeps exactly the tokens that were valid (and whether they rotate)."""
        if fixed and pending is not None:
            raise ValueError("a fixed credential has no pending token")
        return cls(current, pending, fixed)

    @classmethod
    def fixed(cls, token: str) -> Credentials:
        """Credentials of exactly ``token``, which never rotates (see the module's
        docstring)."""
        return cls(digest(token), None, True)

    @property
    def is_fixed(self) -> bool:
        """Its one token never rotates (``fixed``)."""
        return self._fixed

    def digests(self) -> tuple[bytes, bytes | None]:
        """The valid digests, current then pending: what a migration record stores."""
        return self._current, self._pending

    @classmethod
    def issue(cls) -> tuple[Credentials, str]:
        token = new_token()
        return cls(digest(token)), token

    def _matches(self, token: str) -> tuple[bool, bool]:
        presented = digest(token)
        # Both comparisons always run, so timing says nothing about which one matched.
        current = hmac.compare_digest(presented, self._current)
        pending = hmac.compare_digest(presented, self._pending or b"")
        return current, pending

    def has(self, digest: bytes) -> bool:
        """Is ``digest`` (of a token) one of the valid ones? Both always compared."""
        current = hmac.compare_digest(digest, self._current)
        pending = hmac.compare_digest(digest, self._pending or b"")
        return current or pending

    def check(self, token: object) -> bool:
        if not isinstance(token, str):
            return False
        current, pending = self._matches(token)
        return current or pending

    def rotate(self, presented: str) -> str:
        """Issue a new token after ``presented`` passed ``check``; return it (plain). A
        fixed credential's is ``presented`` itself."""
        if self._fixed:
            return presented
        _, pending = self._matches(presented)
        if pending:
            self._current = self._pending  # type: ignore[assignment]
        token = new_token()
        self._pending = digest(token)
        return token

    @property
    def pending(self) -> bytes | None:
        """The digest of the newest token while an older one is still valid too."""
        return self._pending

    def confirm(self, digest: bytes) -> None:
        """The client holds the token of ``digest`` (a ``pending`` seen before): if it is
        still the pending one, every older token dies."""
        if self._pending is not None and hmac.compare_digest(digest, self._pending):
            self._current, self._pending = self._pending, None

    def __repr__(self) -> str:
        return "Credentials(<redacted>)"
