"""``POST /v1/realtime/client_secrets``: OpenAI's client secrets, which are our client
tokens (tokens.py) in OpenAI's HTTP shape.

The request is ``{expires_after?: {anchor: "created_at", seconds}, session?: {type:
"realtime", ...}}`` with ``Authorization: Bearer API_KEY``; the answer ``200 {value,
expires_at, session}``. The value is a client token: one use, within ``seconds`` (10 to
7200, default 600, at most ``--client-token-max-ttl``), its session's configuration
locked, counted against the key's principal as ``POST /v1/client_tokens`` counts. Every
refusal is OpenAI's error object, ``{"error": {message, type, param, code}}``, with a
fixed message (never the client's input).

Sans-IO: the Gate (auth.py) calls ``request`` and ``answer``; the transport is http.py's.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import attrs

from ...core.events import ErrorCode
from ...core.wire import ConfigBudget, ProtocolError
from ...dialects.jsonwire import encode
from ...dialects.openai import defaults, to_config, to_session

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
"""``POST`` here with an API key: an OpenAI client secret for a browser."""

DEFAULT_SECONDS = 600
"""OpenAI's default life of a client secret (at most ``--client-token-max-ttl``)."""
FEWEST_SECONDS, MOST_SECONDS = 10, 7200
"""OpenAI's bounds of ``expires_after.seconds``."""

_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "origin_not_allowed"),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "server_overloaded"),
}
"""OpenAI's error ``type`` and ``code`` by status."""


def error(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    """OpenAI's HTTP error body (``openai.APIStatusError`` reads ``type``, ``code``,
    ``param`` from it)."""
    kind, default_code = _TYPES.get(status, ("server_error", None))
    body = {"message": message, "type": kind, "param": param, "code": code or default_code}
    return json.dumps({"error": body}).encode()


@attrs.frozen
class Refusal(Exception):
    """A request refused: its status and OpenAI error body."""

    status: int
    body: bytes


def _bad(message: str, param: str | None = None, code: str | None = None) -> Refusal:
    return Refusal(400, error(400, message, param, code))


@attrs.frozen
class SecretRequest:
    """A checked request: the secret's life, the configuration it locks (compact JSON,
    or None), and the session object the answer shows."""

    seconds: float
    locked: bytes | None
    session: dict[str, Any]


def request(body: dict[str, Any], max_ttl_s: float, max_config_bytes: int) -> SecretRequest:
    """Check a request's parsed body. Refusal (400): a field of the wrong shape."""
    if any(key not in ("expires_after", "session") for key in body):
        raise _bad("the body may hold expires_after and session only", None, "unknown_parameter")
    seconds = _seconds(body.get("expires_after"), max_ttl_s)
    session = body.get("session")
    if session is not None and not isinstance(session, dict):
        raise _bad("session must be an object", "session")
    if session is not None and session.get("type") != "realtime":  # (OpenAI requires it)
        raise _bad('session.type must be "realtime"', "session.type", "invalid_value")
    try:
        config, shown = openai_session(session)
        if config is not None:
            ConfigBudget.of(config, max_config_bytes)
    except ProtocolError as exc:  # (a bad_event's message may quote the client's keys)
        if exc.code == ErrorCode.BAD_EVENT:
            raise _bad("the session object is not valid", exc.param, "invalid_value") from None
        raise _bad(exc.message, exc.param or "session", exc.code) from None
    locked = None if config is None else encode(config).encode()  # parsed again when spent
    return SecretRequest(seconds, locked, shown)


def _seconds(expires_after: object, max_ttl_s: float) -> float:
    if expires_after is None:
        return min(DEFAULT_SECONDS, max_ttl_s)
    if not isinstance(expires_after, dict):
        raise _bad("expires_after must be an object", "expires_after")
    if any(key not in ("anchor", "seconds") for key in expires_after):
        raise _bad("expires_after may hold anchor and seconds only", "expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise _bad('expires_after.anchor must be "created_at"', "expires_after.anchor")
    if "seconds" not in expires_after:
        return min(DEFAULT_SECONDS, max_ttl_s)
    seconds = expires_after["seconds"]
    most = min(MOST_SECONDS, max_ttl_s)
    if type(seconds) is not int or not FEWEST_SECONDS <= seconds <= most:
        message = f"expires_after.seconds must be an integer in [{FEWEST_SECONDS}, {most:g}]"
        raise _bad(message, "expires_after.seconds", "invalid_value")
    return float(seconds)


def openai_session(session: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The configuration a secret locks (None: none locked) and the session object its
    answer shows, by the OpenAI dialect's translation: the whole configuration the
    session gets (OpenAI's defaults, then what ``session`` sets), written back as
    OpenAI's session object, and locked as that object reads back (every default it
    shows explicit). ProtocolError (its ``param`` the field at fault): a session
    OpenAI would refuse (an unknown field too)."""
    session_id = "sess_" + secrets.token_hex(12)  # the session opened gets its own id
    if session is None:
        return None, to_session(defaults(), session_id)
    asked = to_config(session)
    shown = to_session(defaults() | asked, session_id)
    # Locked as shown, read back: every default the session shows is then an explicit
    # locked value, so that a client restating what session.created showed changes
    # nothing. Turn detection the secret leaves unset stays the engine's own (opening).
    config = to_config({key: shown[key] for key in shown if key not in ("object", "id")})
    if "turn_detection" not in asked:
        del config["turn_detection"]
    return config, shown


def answer(value: str, expires_at: int, session: dict[str, Any]) -> bytes:
    """The 200's body."""
    return json.dumps({"value": value, "expires_at": expires_at, "session": session}).encode()


__all__ = ["CLIENT_SECRETS_PATH", "Refusal", "SecretRequest", "answer", "error", "request"]
