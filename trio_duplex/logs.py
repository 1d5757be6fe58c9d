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
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TEXT_NODE = "%(asctime)s %(levelname)s %(name)s [%(node_id)s]: %(message)s"

SESSION_FIELDS = ("node_id", "session_id", "generation", "principal")
"""The ``extra`` keys a log call may set, copied into a JSON line when present."""


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
        if record.exc_info:
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
    if node_id is not None:
        handler.addFilter(_NodeStamp(node_id))
    logging.basicConfig(level=level.upper(), handlers=[handler])


__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "configure"]
