"""API keys (``--api-key-file``: ``KeyRing``) and another verifier (``--auth``:
``load_verifier``), the two ways a Gate (auth.py) knows a principal."""

from __future__ import annotations

import hmac
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from .tokens import digest


class KeyFileError(ValueError):
    """The API key file cannot be used; the message names the file and the line, never a
    key."""


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

    def holds(self) -> Callable[[bytes], bool]:
        """Is a digest one of these keys? For the server's own records (a client token's
        key), never a presented credential: a set, so that a reload's revocation costs
        one lookup per token, not one comparison per token and key."""
        return frozenset(key for key, _ in self._keys).__contains__

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for _, name in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<KeyRing of {len(self._keys)} keys>"


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


__all__ = ["KeyFileError", "KeyRing", "Verifier", "load_verifier"]
