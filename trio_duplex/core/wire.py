"""Wire format of protocol v1: event names, error and close codes, JSON framing.

Everything here is pure: text in, dicts out, dicts in, text out. The typed errors carry
the code the peer must be answered with, so the layers above never invent one.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import Any, Final

import attrs

PROTOCOL_VERSION: Final = 1
DEFAULT_PATH: Final = "/v1/duplex"

# Close codes (PROTOCOL.md, "Close codes").
CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_NOT_AUTHORISED: Final = 1008
CLOSE_TOO_BIG: Final = 1009
CLOSE_INTERNAL_ERROR: Final = 1011
CLOSE_TRY_AGAIN_LATER: Final = 1013
CLOSE_REPLACED: Final = 4000
CLOSE_RESUME_REFUSED: Final = 4001
CLOSE_CONFIG_TIMEOUT: Final = 4002

# Terminal reasons.
REASON_CLIENT_CLOSE: Final = "client_close"
REASON_ENGINE_FINISHED: Final = "engine_finished"
REASON_ENGINE_ERROR: Final = "engine_error"
REASON_UNDELIVERED: Final = "session_created_undelivered"
REASON_SHUTDOWN: Final = "server_shutdown"
REASON_GRACE_EXPIRED: Final = "disconnect_grace_expired"
REASON_IDLE_EXPIRED: Final = "idle_ttl_expired"
EXPIRY_REASONS: Final = frozenset({REASON_GRACE_EXPIRED, REASON_IDLE_EXPIRED})

# Error codes that may be retried by sending the same request later.
RETRYABLE_CODES: Final = frozenset(
    {"resource_exhausted", "input_backpressure", "session_resume_conflict", "server_shutting_down"}
)

# Server events that are never journaled and never carry server_event_seq.
CONTROL_EVENTS: Final = frozenset(
    {
        "session.created",
        "session.resumed",
        "session.replaced",
        "session.resync_required",
        "session.heartbeat_ack",
        "session.going_away",
        "session.closed",
        "session.expired",
        "error",
    }
)

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _make_encode() -> Callable[[Any], str]:
    """``_encoder.encode`` without its per-call cost.

    ``JSONEncoder.encode`` builds a new C encoder (and a dict for cycle checks) on every
    call, which was a third of the JSON time per event. Build it once: same output, no
    cycle check (a cyclic event ends in RecursionError instead of ValueError)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    basestring = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or basestring is None:
        return _encoder.encode

    def default(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    try:
        chunks = make(None, default, basestring, None, ":", ",", False, False, False)
    except TypeError:  # another Python's signature: keep the plain path
        return _encoder.encode

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


encode = _make_encode()
"""Compact JSON: the form that is sent and whose size the journal counts."""

_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]
)


def _loads(text: str) -> Any:
    """``json.loads(text)`` with one C call in the common case (no surrounding space)."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)  # the full path, for its exact error or leading space
    if end != len(text):
        return json.loads(text)
    return value


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8, without copying it when it is ASCII (the common case).

    Raises UnicodeEncodeError for a lone surrogate: such text could never be sent.
    """
    return len(text) if text.isascii() else len(text.encode("utf-8"))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


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

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    def to_event(self, cause: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``error`` event; it echoes the ``event_id`` of the event that caused it."""
        event_id = self.event_id or (cause or {}).get("event_id")
        if not isinstance(event_id, str):
            event_id = None
        return error_event(self.code, self.message, event_id=event_id, param=self.param)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def error_event(
    code: str, message: str, *, event_id: str | None = None, param: str | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "error",
        "code": code,
        "message": message,
        "retryable": code in RETRYABLE_CODES,
    }
    if event_id is not None:
        event["event_id"] = event_id
    if param is not None:
        event["param"] = param
    return event


def decode(text: str | bytes) -> dict[str, Any]:
    """Parse one client frame into an event dict with a string ``type``.

    Raises ProtocolError(bad_event) for binary frames and ill-shaped objects,
    ProtocolError(invalid_json) for text that is not JSON.
    """
    if not isinstance(text, str):
        raise ProtocolError("bad_event", "binary frames are not accepted; send JSON text")
    try:
        event = _loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_json", "frame is not valid JSON") from None
    if not isinstance(event, dict):
        raise ProtocolError("bad_event", "an event must be a JSON object")
    # Valid UTF-8 on the wire can still decode to a lone surrogate through a \u escape;
    # echoing such a string could never be encoded, so refuse it here (cheap test first).
    if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(event):
        raise ProtocolError("bad_event", "strings must not hold lone UTF-16 surrogates")
    event_id = event.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError("bad_event", "event_id must be a string", param="event_id")
    if not isinstance(event.get("type"), str):
        raise ProtocolError(
            "bad_event", "an event needs a string field 'type'", event_id=event_id, param="type"
        )
    return event


def is_seq(value: object) -> bool:
    """A non-negative integer (bools are not integers here)."""
    return type(value) is int and value >= 0
