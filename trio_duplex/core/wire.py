"""The protocol's typed error and the few measures the core's rules take of events.

Pure. The typed errors carry the code the peer must be answered with, so the layers
above never invent one. How an event is spelled on a wire (JSON text, binary lanes) is a
dialect's (``trio_duplex.dialects``); the core writes frames only through ``Spelling``
(core/spelling.py).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from . import events
from .events import RETRYABLE_CODES, ErrorCode
from .frames import CloseCode

_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
"""The compact JSON a configuration's size is counted in (docs/protocol.md states the
bound in bytes of it): a measure, never a frame; off the per-event path."""


@attrs.frozen
class ProtocolError(Exception):
    """A client event that must be answered with ``error{code}``.

    ``close_code`` is set when the answer also ends the connection.
    """

    code: str
    message: str
    event_id: str | None = None
    param: str | None = None
    close_code: int | None = None
    extra: tuple[tuple[str, int | str], ...] = ()
    """More fields of the ``error`` event, by name (``expected_client_event_seq``,
    ``reason``)."""

    @classmethod
    def unexpected_client_seq(cls, expected: int, seq: int) -> ProtocolError:
        """A ``client_event_seq`` past the next one (protocol v2): refused, retryable, so
        that no event overtakes one that was refused; the client resends from
        ``expected``."""
        return cls(
            ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ,
            f"client_event_seq {seq} is not the next one, {expected}; resend from {expected}",
            param="client_event_seq",
            extra=(("expected_client_event_seq", expected),),
        )

    @classmethod
    def resume_refused(cls, code: str, message: str, param: str | None = None) -> ProtocolError:
        """A refused ``session.resume``: answered, then closed with 4001."""
        return cls(code, message, param=param, close_code=CloseCode.RESUME_REFUSED)

    @classmethod
    def home_unreachable(cls, why: str) -> ProtocolError:
        """Cluster mode: a resume that cannot reach its session now (its node, the store,
        a take-over in progress): ``session_home_unreachable``, retryable, close 1013."""
        return cls(
            ErrorCode.SESSION_HOME_UNREACHABLE,
            f"{why}; try again",
            close_code=CloseCode.TRY_AGAIN_LATER,
        )

    @classmethod
    def not_ready(cls, why: str) -> ProtocolError:
        """A new session refused for want of capacity beyond this server's slots (an
        engine's upstream refused, or was not ready in time): ``resource_exhausted``,
        retryable, close 1013, as when every slot is held."""
        return cls(
            ErrorCode.RESOURCE_EXHAUSTED,
            f"{why}; try again",
            close_code=CloseCode.TRY_AGAIN_LATER,
        )

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    def with_extra(self, **fields: int | str) -> ProtocolError:
        """The same error with more fields in its ``error`` event."""
        return attrs.evolve(self, extra=(*self.extra, *fields.items()))

    def to_event(self, cause: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``error`` event; it echoes the ``event_id`` and (protocol v2) the valid
        ``client_event_seq`` of the event that caused it."""
        cause = cause or {}
        event_id = self.event_id or cause.get("event_id")
        if not isinstance(event_id, str):
            event_id = None
        event = events.error(self.code, self.message, event_id=event_id, param=self.param)
        seq = cause.get("client_event_seq")
        if type(seq) is int and seq > 0:
            event["client_event_seq"] = seq
        event.update(self.extra)
        return event

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8, without copying it when it is ASCII (the common case).

    Raises UnicodeEncodeError for a lone surrogate: such text could never be sent.
    """
    return len(text) if text.isascii() else len(text.encode("utf-8"))


@attrs.define
class ConfigBudget:
    """A session configuration's size, kept field by field so that an update is
    measured by the fields it sets: the work is the update's, not the configuration's.

    The size is that of the configuration's compact JSON: ``{}``, and each top-level
    field's ``"key":value`` with its comma, in UTF-8 bytes.
    """

    limit: int
    total: int = 2
    _fields: dict[str, int] = attrs.field(factory=dict)

    @classmethod
    def of(cls, config: dict[str, Any], limit: int) -> ConfigBudget:
        """The budget of an initial configuration (ProtocolError: too large)."""
        budget = cls(limit)
        budget.commit(budget.check(config))
        return budget

    def check(self, update: dict[str, Any]) -> tuple[dict[str, int], int]:
        """Measure merging ``update`` (shallowly) into the configuration; raises
        ProtocolError(config_too_large) if the result would exceed the limit. Commit
        what it returns once the update is taken."""
        sizes = {key: len(_compact({key: value}).encode()) - 1 for key, value in update.items()}
        total = self.total + sum(sizes.values())
        total -= sum(self._fields.get(key, 0) for key in sizes)
        if total > self.limit:
            raise ProtocolError(
                ErrorCode.CONFIG_TOO_LARGE,
                f"the session configuration may hold at most {self.limit} bytes of JSON",
                param="session",
            )
        return sizes, total

    def commit(self, measured: tuple[dict[str, int], int]) -> None:
        sizes, self.total = measured
        self._fields.update(sizes)


def is_seq(value: object) -> bool:
    """A non-negative integer (bools are not integers here)."""
    return type(value) is int and value >= 0
