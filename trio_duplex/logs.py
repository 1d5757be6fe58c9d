"""The ``serve`` command's log output: text for people, or one JSON object per line.

A JSON line holds ``timestamp`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``,
and, on a line about one session, ``session_id``, ``generation`` and ``principal`` (the
API key's name, with authentication) where they apply, and in cluster mode ``node_id``
on every line (so that the workers of ``--workers`` can be told apart). The
server passes those as ``extra`` on the log call itself rather than through a context
variable: a session's lines are written from many tasks (its connection's, the timer
heap's, the drain's, another connection's resume) and from no task at all (the watchdog's
thread), so only the call knows which session it speaks of. No line carries a resume
token: the server never logs one (tokens are kept as digests, ``Credentials`` repr
redacted).

No secret reaches a log line at any level, whoever logs it (our loggers, or third-party
ones that print headers, frames and URLs at DEBUG: ``websockets.*``, ``coredis``):
``configure`` puts a ``Redactor`` on its handler, which every record passes through. It
replaces with ``***`` every secret registered with ``register_secret`` (the upstream key,
``--upstream-header`` values, the cluster secret, the Redis password, the API keys of
``--api-key-file``), and by their form: the values of the ``Authorization``,
``Proxy-Authorization``, ``Cookie``, ``Set-Cookie`` and relay (``X-Trio-Duplex-Relay``)
headers, ``Bearer`` credentials, the keys carried in WebSocket subprotocols
(``trio-duplex.bearer.KEY``, ``openai-insecure-api-key.KEY``), URL passwords
(``redis://user:***@host``), and the values of token, key, secret and password fields
in JSON or in a query string (a relayed ``session.resume``'s ``resume_token``).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TEXT_NODE = "%(asctime)s %(levelname)s %(name)s [%(node_id)s]: %(message)s"

SESSION_FIELDS = ("node_id", "session_id", "generation", "principal")
"""The ``extra`` keys a log call may set, copied into a JSON line when present."""


MASK = "***"
MIN_SECRET_CHARS = 4
"""A registered secret shorter than this is not searched for verbatim (it would mask
every "abc" of every line); the forms below still catch it in a header or a URL."""

_SECRET_NAMES = r"(?:resume_token|client_token|token|api_key|apikey|key|secret|password)"
_FORMS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Header lines, as websockets and the HTTP path print them: the whole value.
    (
        re.compile(
            r"((?:Proxy-)?Authorization|Cookie|Set-Cookie|X-Trio-Duplex-Relay)"
            r"(['\"]?+\s*+[:=,]\s*+['\"]?+)(?!<redacted>)[^\r\n'\"]+",  # (masked: kept)
            re.IGNORECASE,
        ),
        rf"\1\2{MASK}",
    ),
    (re.compile(r"(\bBearer\s+)[^\s,;'\"]+", re.IGNORECASE), rf"\1{MASK}"),
    # Keys in WebSocket subprotocols (ours, and the one OpenAI's browser clients use).
    (
        re.compile(r"((?:trio-duplex\.bearer|openai-insecure-api-key)\.)[^\s,;'\"\]]+"),
        rf"\1{MASK}",
    ),
    # URL userinfo: redis://user:PASSWORD@host, redis://:PASSWORD@host.
    (re.compile(r"([a-z][a-z0-9+.-]*://[^\s/@:'\"]*:)[^\s/@'\"]+@", re.IGNORECASE), rf"\1{MASK}@"),
    # JSON or repr fields ("resume_token": "...", possibly cut short by a truncated log).
    (
        re.compile(rf"""(["']{_SECRET_NAMES}["']\s*:\s*["'])[^"']*""", re.IGNORECASE),
        rf"\1{MASK}",
    ),
    (re.compile(rf"([?&]{_SECRET_NAMES}=)[^&\s'\"]+", re.IGNORECASE), rf"\1{MASK}"),
)


class _Secrets:
    """The registry of known secret values, searched for verbatim in every line."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()  # the watchdog's thread logs too
        self.pattern: re.Pattern[str] | None = None

    def add(self, values: Iterable[str | None]) -> None:
        with self._lock:
            self._values.update(v for v in values if v and len(v) >= MIN_SECRET_CHARS)
            longest_first = sorted(self._values, key=len, reverse=True)
            alternatives = "|".join(map(re.escape, longest_first))
            self.pattern = re.compile(alternatives) if alternatives else None

    def __repr__(self) -> str:
        return f"<{len(self._values)} secrets>"


_SECRETS = _Secrets()


def register_secret(*values: str | None) -> None:
    """Mask these values (None and empty ones are skipped) in every log line from now on."""
    _SECRETS.add(values)


def register_key_file(path: str | None) -> None:
    """Register the keys of an ``--api-key-file`` (``NAME:KEY`` lines). One that cannot be
    read registers nothing: the server refuses it itself, naming no key."""
    if path is None:
        return
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    lines = (line.strip() for line in text.splitlines())
    register_secret(*(line.partition(":")[2].strip() for line in lines if ":" in line))


_MARKS = (
    "authorization", "cookie", "x-trio-duplex-relay", "bearer", "://",
    "token", "key", "secret", "password",
)  # fmt: skip
"""A substring, lowercased, that each of ``_FORMS`` needs to match: a line with none of
them (most lines) skips the six substitutions (19 of the 40 us a line cost)."""


def redact(text: str) -> str:
    """``text`` with every secret it holds masked (``***``)."""
    pattern = _SECRETS.pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    lowered = text.lower()
    if not any(mark in lowered for mark in _MARKS):
        return text
    for form, replacement in _FORMS:
        text = form.sub(replacement, text)
    return text


class Redactor(logging.Filter):
    """On a handler: masks the secrets in each record's message, traceback and stack
    (the record is changed in place, so every formatter sees the masked text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a call whose arguments do not fit: logged as it was written
            message = f"{record.msg} (with arguments that do not fit it)"
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (any newline in it escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {
            "timestamp": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in SESSION_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_text:  # (the Redactor's, masked)
            line["exception"] = record.exc_text
        elif record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


class _NodeStamp(logging.Filter):
    """Puts the node's id on every record (``node_id``)."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self.node_id
        return True


def configure(level: str, format: str, node_id: str | None = None) -> None:
    """Send every record at ``level`` (any case) or above to stderr, as ``format``.

    With ``node_id`` (cluster mode) every line names the node (text: ``[ID]`` before the
    message; JSON: a ``node_id`` key), so that the lines of the worker processes sharing
    one stderr, or of the nodes of one log pipeline, can be told apart."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = (
        JsonFormatter()
        if format == "json"
        else logging.Formatter(TEXT if node_id is None else TEXT_NODE)
    )
    handler.setFormatter(formatter)
    handler.addFilter(Redactor())  # on the handler: third-party loggers' records too
    if node_id is not None:
        handler.addFilter(_NodeStamp(node_id))
    logging.basicConfig(level=level.upper(), handlers=[handler])


__all__ = [
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "Redactor",
    "configure",
    "redact",
    "register_key_file",
    "register_secret",
]
