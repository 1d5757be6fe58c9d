"""The limits the session rules read. Validated at construction: ``Limits`` that exist
are valid.

The deployment's settings (listeners, TLS, auth, the cluster, the ``serve`` flags) are
the server's (``trio_duplex.ServerConfig``), which hands the core these; the defaults
are the server's own.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs.validators import ge, gt

KiB = 1024
MiB = 1024 * KiB

FIRST_MESSAGE_ENVELOPE = 4 * KiB
"""What a connection's first message may hold beyond ``max_config_bytes``."""


@attrs.frozen(kw_only=True)
class Limits:
    max_sessions: int = attrs.field(default=64, validator=ge(1))
    """Session slots (``Registry``)."""
    disconnect_grace_s: float = attrs.field(default=30.0, validator=ge(0))
    """How long a detached session waits for a resume."""
    unconfirmed_grace_s: float = attrs.field(default=5.0, validator=ge(0))
    """How long instead (at most ``disconnect_grace_s``) when its client never spoke."""
    idle_ttl_s: float = attrs.field(default=300.0, validator=gt(0))
    journal_max_bytes: int = attrs.field(default=8 * MiB, validator=ge(1))
    journal_ttl_s: float = attrs.field(default=60.0, validator=gt(0))
    max_event_bytes: int = attrs.field(default=15 * MiB, validator=ge(1))
    max_config_bytes: int = attrs.field(default=64 * KiB, validator=ge(1))
    max_pending_input: int = attrs.field(default=256, validator=ge(1))
    """Client events queued for the engine (core/flow.py's ``N``)."""
    max_input_bytes: int = attrs.field(default=16 * MiB, validator=ge(1))
    """The same queue's bound in bytes (core/flow.py's ``B``)."""

    def advertised(self) -> dict[str, Any]:
        """The ``limits`` object of ``session.created``."""
        return {
            "disconnect_grace_s": self.disconnect_grace_s,
            "idle_ttl_s": self.idle_ttl_s,
            "journal_max_bytes": self.journal_max_bytes,
            "max_event_bytes": self.max_event_bytes,
            "max_config_bytes": self.max_config_bytes,
            # protocol v2: the input bounds a client paces by (core/flow.py)
            "max_pending_input": self.max_pending_input,
            "max_pending_input_bytes": self.max_input_bytes,
        }

    @property
    def first_message_bytes(self) -> int:
        return first_message_bytes(self.max_event_bytes, self.max_config_bytes)


def first_message_bytes(max_event_bytes: int, max_config_bytes: int) -> int:
    """The largest message a connection may send before it carries a session."""
    return min(max_event_bytes, max_config_bytes + FIRST_MESSAGE_ENVELOPE)
