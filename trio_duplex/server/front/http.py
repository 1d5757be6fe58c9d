"""Plain HTTP answers beside the WebSocket endpoint: health, readiness and metrics.

``GET /healthz`` (200 while the process serves), ``GET /readyz`` (200 while new sessions
are accepted, 503 while draining or with every slot held), both JSON, and
``GET /metrics`` (Prometheus text, metrics.py). No authentication: with
``--metrics-port`` they move to a listener of their own, meant to stay internal.

The router (router.py) asks ``Endpoints.answer`` about each request's path before the
upgrade, and the handshake tells ``refused`` why it turned one away; ``serve_internal`` serves the
separate listener, which answers nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import trio

from .demo import DemoPages

HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_MAX_REQUEST_BYTES = 16384

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _authority(text: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` (a name, an IPv4 address or a bracketed IPv6 one) as (host, port),
    lower-case, the port ``default_port`` when absent; None if it is not one."""
    text = text.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, colon, port = text.partition(":")
        rest = colon + port
    if host in ("", "[]") or any(c in host for c in "/?#@ \t\\"):
        return None
    if not rest:
        return host, default_port
    digits = rest[1:]
    if rest[0] != ":" or not (digits.isascii() and digits.isdigit()) or len(digits) > 5:
        return None
    return host, int(digits)


def same_origin(origin: str, host: str | None) -> bool:
    """Is ``origin`` (an Origin header: ``scheme://host[:port]``) that of a page served
    by the ``host`` a request names (its Host header)? Host and port are compared, the
    port defaulting by the origin's scheme on both sides (``https://a`` is ``a:443``), so
    that a TLS-terminating proxy in front (Host ``a``, no port) still matches."""
    scheme, sep, authority = origin.partition("://")
    default = _DEFAULT_PORTS.get(scheme.lower())
    if not sep or default is None or host is None:
        return False
    mine = _authority(authority, default)
    return mine is not None and mine == _authority(host, default)


def origin_allowed(origins: list[str], hosts: list[str], allowed: tuple[str, ...]) -> bool:
    """May a request with these Origin and Host headers (every one sent) go on? No
    Origin (not a browser): yes. ``allowed`` (``--allow-origin``): the origin is one of
    them, or any with ``*``. Without it: the page is this server's own (``same_origin``)."""
    if not origins:
        return True
    if len(origins) > 1:
        return False
    if allowed:
        return "*" in allowed or origins[0] in allowed
    return len(hosts) == 1 and same_origin(origins[0], hosts[0])


def response(status: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _json(status: str, value: dict[str, object]) -> bytes:
    return response(status, json.dumps(value).encode() + b"\n", "application/json")


@attrs.define(eq=False)
class Endpoints:
    """A server's plain HTTP answers, and its count of refused handshakes."""

    readiness: Callable[[], tuple[bool, dict[str, object]]]
    """Ready for new sessions, and the JSON body that says why (or why not)."""
    metrics: Callable[[], tuple[bytes, str]]
    """The metrics' exposition and its content type."""
    refusals: dict[str, int]
    """Where ``refused`` counts (``Totals.refusals``)."""
    on_main: bool = True
    """Answer the paths on the WebSocket listener (False: ``--metrics-port`` does)."""
    demo: DemoPages | None = None
    """The demo page and its assets (``--demo``; demo.py), always on the main listener."""

    def answer(self, path: str, host: str | None = None) -> bytes | None:
        """The whole response for a GET of ``path`` (``host``: its Host header), or None:
        not ours here."""
        if self.demo is not None and (page := self.demo.answer(path, host)) is not None:
            return page
        if not self.on_main:
            return None
        return self.respond(path)

    def answer_head(self, head: bytes) -> bytes:
        """The response to a HEAD request (its whole ``head``): a GET's, without the body."""
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        host = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"host":
                host = value.strip().decode("latin-1")
        path = parts[1].decode("latin-1").split("?", 1)[0] if len(parts) == 3 else ""
        answer = self.answer(path, host) or _NOT_FOUND
        return answer[: answer.index(b"\r\n\r\n") + 4]

    def respond(self, path: str) -> bytes | None:
        if path == "/healthz":
            return _json("200 OK", {"status": "ok"})
        if path == "/readyz":
            ready, state = self.readiness()
            return _json("200 OK" if ready else "503 Service Unavailable", state)
        if path == "/metrics":
            text, content_type = self.metrics()
            return response("200 OK", text, content_type)
        return None

    def refused(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1


_NOT_FOUND = response("404 Not Found", b"not found\n", "text/plain")
_BAD_REQUEST = response("400 Bad Request", b"a GET request is expected\n", "text/plain")


async def serve_internal(stream: trio.abc.Stream, endpoints: Endpoints) -> None:
    """Answer one request on the internal listener: GET of a health path, else 404
    (400 for anything but a GET). Bound it with a deadline."""
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > _MAX_REQUEST_BYTES:
            return
        data = await stream.receive_some(_MAX_REQUEST_BYTES)
        if not data:
            return
        head += data
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or not parts[2].startswith(b"HTTP/1."):
        await stream.send_all(_BAD_REQUEST)
        return
    path = parts[1].decode("latin-1").split("?", 1)[0]
    await stream.send_all(endpoints.respond(path) or _NOT_FOUND)
