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
import importlib
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

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
    locked: dict[str, Any] | None = None
    """A client token's locked configuration: the session gets it and cannot change it."""

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


TOKENS_PATH = "/v1/client_tokens"
"""``POST`` here with an API key: a short-lived client token for a browser."""
MAX_OUTSTANDING = 10_000
"""Client tokens issued and not yet spent or expired, at most (then 429)."""


@attrs.define(eq=False, repr=False)
class ClientToken:
    principal: str
    deadline: float
    """``trio.current_time()`` past which it is expired."""
    config: dict[str, Any] | None
    """A locked session configuration, or None."""


@attrs.define(eq=False, repr=False)
class ClientTokens:
    """Short-lived, one-use client tokens, kept as SHA-256 digests (auth.py)."""

    _tokens: dict[bytes, ClientToken] = attrs.field(factory=dict)

    def issue(self, token: ClientToken, now: float) -> str | None:
        """A new token for ``token``'s grant; None when MAX_OUTSTANDING are out."""
        self._forget_expired(now)
        if len(self._tokens) >= MAX_OUTSTANDING:
            return None
        plain = secrets.token_urlsafe(32)  # URL-safe: it may travel as a subprotocol
        self._tokens[digest(plain)] = token
        return plain

    def take(self, credential: str, now: float) -> ClientToken | None:
        """Spend ``credential`` if it is a live client token (one use)."""
        token = self._tokens.pop(digest(credential), None)  # a dict of digests: no timing
        if token is None or token.deadline < now:
            return None
        return token

    def _forget_expired(self, now: float) -> None:
        if len(self._tokens) >= MAX_OUTSTANDING // 2:
            self._tokens = {k: t for k, t in self._tokens.items() if t.deadline >= now}

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"<ClientTokens, {len(self._tokens)} outstanding>"


Verifier = Callable[[Mapping[str, str]], "str | None"]
"""``--auth module:callable``: given an upgrade's request headers (names as sent; look
them up case-insensitively), return the principal, or None to refuse (401). It runs on
the event loop, before the upgrade: it must be quick (a JWT's signature check is)."""


def load_verifier(spec: str) -> Verifier:
    """Resolve ``package.module:callable`` (ValueError: a message fit for a terminal)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--auth {spec!r} is not 'package.module:callable'")
    try:
        verifier = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError, SyntaxError, AttributeError, its own errors
        raise ValueError(f"--auth {spec!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
    if not callable(verifier):
        raise ValueError(f"--auth {spec!r} is not callable")
    return verifier  # type: ignore[no-any-return]


__all__ = [
    "BEARER_SUBPROTOCOL",
    "OPEN",
    "TOKENS_PATH",
    "ClientToken",
    "ClientTokens",
    "Grant",
    "KeyFileError",
    "KeyRing",
    "load_verifier",
    "presented",
]
