"""Plain HTTP answers beside the WebSocket endpoint: health, readiness, metrics, POSTs.

``GET /healthz`` (200 while the process serves), ``GET /readyz`` (200 while new sessions
are accepted, 503 while draining or with every slot held), both JSON, and
``GET /metrics`` (Prometheus text, metrics.py). No authentication: with
``--metrics-port`` they move to a listener of their own, meant to stay internal.
``answer_post`` reads and answers a POST (a client token's, a client secret's: the Gate
in auth.py says what), its body bounded.

The router (router.py) asks ``Endpoints.answer`` about each request's path before the
upgrade, and the handshake tells ``refused`` why it turned one away; ``serve_internal`` serves the
separate listener, which answers nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Protocol

import attrs
import trio
from websockets.datastructures import Headers

from ..sessions.faults import FAULTS
from ..sessions.websocket import RECEIVE_SIZE
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


MAX_POST_BYTES = 80 * 1024
"""The largest body of a POST by default (a client token's request: a configuration
and a TTL); the server passes its first message's bound (``first_message_bytes``)."""
_DISCARD_BYTES = 1024 * 1024
"""A body over the bound is still read, up to this size, before the 413."""
_CONTENT_LENGTH = re.compile(r"[0-9]{1,16}")
"""ASCII digits only: ``str.isdigit`` takes ``²``, which ``int`` then refuses."""
POST_RETRY_AFTER_S = 1
"""The ``Retry-After`` of a 429 or 503 to a POST."""

_PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    413: "Content Too Large",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


class Posts(Protocol):
    """What answers the POSTs (the Gate, auth.py)."""

    def answer_post(self, path: str, headers: Headers, body: bytes) -> tuple[int, bytes]:
        """A whole request's status and JSON body (404 for a path not taken)."""
        ...

    def post_error(self, path: str, status: int, message: str) -> bytes:
        """A refusal's JSON body, as ``path``'s endpoint words errors."""
        ...


async def answer_post(
    stream: trio.abc.Stream,
    head: bytes,
    body: bytes,
    posts: Posts,
    where: str,
    origins: tuple[str, ...],
    max_bytes: int,
) -> None:
    """Answer a POST (``posts`` says how). Whatever the request holds, the answer is a
    status and a JSON error, never an exception: the fault is logged at INFO, at the
    fault log's rate."""
    line, *lines = head.decode("latin-1").split("\r\n")
    parts = line.split(" ")
    path = parts[1].partition("?")[0] if len(parts) == 3 else ""
    headers = Headers()  # case-insensitive, as a verifier (--auth) expects
    for header in lines:
        name, sep, value = header.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    lengths = headers.get_all("Content-Length")
    length = int(lengths[0]) if len(lengths) == 1 and _CONTENT_LENGTH.fullmatch(lengths[0]) else -1
    status = 0
    if len(parts) != 3:
        status, message = 404, "no such endpoint"
    elif not origin_allowed(headers.get_all("Origin"), headers.get_all("Host"), origins):
        status, message = 403, "origin not allowed"
    elif "Transfer-Encoding" in headers or length < 0:
        status, message = 400, "a body needs one Content-Length, in digits"
    elif length > max_bytes:
        status, message = 413, f"the body exceeds {max_bytes} bytes"
        # Read (and drop) a body of moderate size first: closing with unread bytes resets
        # the connection, and the client may then lose the answer.
        left = length - len(body) if length <= _DISCARD_BYTES else 0
        while left > 0:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            left -= len(data)
    if status:
        answer = posts.post_error(path, status, message)
    else:
        if len(body) < length and headers.get_all("Expect") == ["100-continue"]:
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")  # (curl waits 1 s else)
        while len(body) < length:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            body += data
        status, answer = posts.answer_post(path, headers, body[:length])
    if status != 200:
        FAULTS.report(where, f"{status} to a POST")
    extra = ["Cache-Control: no-store"]
    if status == 401:
        extra.append("WWW-Authenticate: Bearer")
    if status in (429, 503):
        extra.append(f"Retry-After: {POST_RETRY_AFTER_S}")
    reply = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(answer)}\r\n"
        + "".join(f"{line}\r\n" for line in extra)
        + "Connection: close\r\n\r\n"
    )
    await stream.send_all(reply.encode() + answer)
