"""Verifiers for ``--auth`` in tests/server/test_auth.py (imported by its module path)."""

from __future__ import annotations

from collections.abc import Mapping


def verify(headers: Mapping[str, str]) -> str | None:
    """A stand-in for a JWT check: ``X-Token: good`` is the principal ``jwt-user``."""
    return "jwt-user" if headers.get("x-token") == "good" else None


def broken(headers: Mapping[str, str]) -> str | None:
    raise RuntimeError("the verifier's own bug")


not_callable = 42
