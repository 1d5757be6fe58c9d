"""Server configuration. Validated at construction: a ServerConfig that exists is valid."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from .events import DEFAULT_PATH

MiB = 1024 * 1024

_positive = v.gt(0)
_positive_s = v.gt(0.0)
_nonnegative_s = v.ge(0.0)


def _path(_: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not value.startswith("/") or "?" in value:
        raise ValueError(f"{attribute.name} must start with '/' and hold no query, got {value!r}")


@attrs.frozen(kw_only=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8765, validator=[v.ge(0), v.le(65535)])
    path: str = attrs.field(default=DEFAULT_PATH, validator=_path)
    max_sessions: int = attrs.field(default=64, validator=v.ge(1))
    disconnect_grace_s: float = attrs.field(default=30.0, validator=_nonnegative_s)
    idle_ttl_s: float = attrs.field(default=300.0, validator=_positive_s)
    journal_max_bytes: int = attrs.field(default=8 * MiB, validator=_positive)
    journal_ttl_s: float = attrs.field(default=60.0, validator=_positive_s)
    max_event_bytes: int = attrs.field(default=15 * MiB, validator=_positive)
    config_timeout_s: float = attrs.field(default=10.0, validator=_positive_s)
    drain_timeout_s: float = attrs.field(default=5.0, validator=_nonnegative_s)
    ping_interval_s: float = attrs.field(default=20.0, validator=_positive_s)
    ping_timeout_s: float = attrs.field(default=20.0, validator=_positive_s)
    max_pending_input: int = attrs.field(default=256, validator=v.ge(1))
    """Client events queued for the engine before ``input_backpressure``."""
    max_pending_output: int = attrs.field(default=256, validator=v.ge(1))
    """Frames queued for a connection before the engine's ``send`` waits."""

    def limits(self) -> dict[str, Any]:
        """The ``limits`` object of ``session.created``."""
        return {
            "disconnect_grace_s": self.disconnect_grace_s,
            "idle_ttl_s": self.idle_ttl_s,
            "journal_max_bytes": self.journal_max_bytes,
            "max_event_bytes": self.max_event_bytes,
        }
