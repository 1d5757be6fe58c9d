"""Who may open a session: API keys, and a session's resume token for its resume.

With ``--api-key-file FILE`` every upgrade must present a credential, in one of two
places: ``Authorization: Bearer CREDENTIAL``, or (browsers cannot set headers on a
WebSocket) an offered subprotocol ``trio-duplex.bearer.CREDENTIAL``. The credential is
either an API key, whose ``NAME`` becomes the session's principal, or the current resume
token of a live session, which allows exactly one thing: the first message is that
session's ``session.resume``. Anything else is refused with 401 before the upgrade, with
nothing said about which part was wrong.

Keys are kept as SHA-256 digests and every comparison runs against every key, in
constant time (``hmac.compare_digest``); no key is ever logged or in a ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

BEARER_SUBPROTOCOL = "trio-duplex.bearer."
"""An offered subprotocol that carries a credential (never selected)."""


class KeyFileError(ValueError):
    """The API key file cannot be used; the message names the file and the line, never a
    key."""


def digest(credential: str) -> bytes:
    return hashlib.sha256(credential.encode("utf-8", "surrogatepass")).digest()


@attrs.define(eq=False, repr=False)
class KeyRing:
    """The API keys: ``NAME`` by SHA-256 digest."""

    _keys: list[tuple[bytes, str]] = attrs.field(factory=list)

    @classmethod
    def load(cls, path: str) -> KeyRing:
        """Read ``NAME:KEY`` lines (``#`` comments and blank lines ignored)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"{path}: cannot read it ({type(exc).__name__})") from None
        keys: list[tuple[bytes, str]] = []
        names: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, key = line.partition(":")
            name, key = name.strip(), key.strip()
            if not sep or not name or not key:
                raise KeyFileError(f"{path}, line {number}: not NAME:KEY")
            if name in names:
                raise KeyFileError(f"{path}, line {number}: the name {name!r} is there twice")
            names.add(name)
            keys.append((digest(key), name))
        if not keys:
            raise KeyFileError(f"{path}: no keys in it")
        return cls(keys)

    def principal(self, credential: str) -> str | None:
        """The name of the key ``credential`` is, if any: compared with every key."""
        presented = digest(credential)
        found = None
        for key, name in self._keys:
            if hmac.compare_digest(presented, key):
                found = name
        return found

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<KeyRing of {len(self._keys)} keys>"


@attrs.frozen(repr=False)
class Grant:
    """What an upgrade's credential allows."""

    principal: str | None
    """The API key's name (None without authentication, or for a resume-only grant)."""
    resume_of: str | None = None
    """A resume token's session: the first message must be its ``session.resume``."""

    def __repr__(self) -> str:
        return f"Grant(principal={self.principal!r}, resume_of={self.resume_of!r})"


OPEN = Grant(None)
"""The grant of every upgrade when authentication is off."""


def presented(headers: Mapping[str, str], offered: Iterable[str]) -> str | None:
    """The credential an upgrade presents: ``Authorization: Bearer X``, else an offered
    subprotocol ``trio-duplex.bearer.X``."""
    authorization = headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for protocol in offered:
        if protocol.startswith(BEARER_SUBPROTOCOL) and len(protocol) > len(BEARER_SUBPROTOCOL):
            return protocol[len(BEARER_SUBPROTOCOL) :]
    return None


__all__ = ["BEARER_SUBPROTOCOL", "OPEN", "Grant", "KeyFileError", "KeyRing", "presented"]
