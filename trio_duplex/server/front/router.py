"""What a request is for, before any upgrade (the server's ``process_request``).

websockets' servers let a ``process_request`` hook answer plain HTTP before the upgrade;
``Router`` is that hook for ours, a table read in order. Before the head is parsed (which
websockets does for GETs only): a ``POST`` of the client-token path goes to the token
issuer, a ``HEAD`` to the demo pages. Once parsed (``route``): a path the endpoints
answer (health, readiness, metrics, the demo page's GETs) gets that answer; an Origin
not allowed 403, before any credential is looked at; the relay path the relay's check
(403 unless signed for this node); the WebSocket path the credential's check (401, or
429 while its address is throttled); anything else goes on to the upgrade, which
refuses a request that is not one (400) and then a path that is not ours (404).

Sans-IO: it answers with the bytes to send (``Answer``) or the upgrade's grant
(``Upgrade``); the handshake (handshake.py) does the reading and the writing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import SplitResult

import attrs
from websockets.http11 import Request

from ...core.opening import OPEN, Grant
from ...dialects import CALLS_ONLY, NATIVE, Dialect, by_name
from ...dialects.twilio import TWILIO
from .auth import POST_PATHS
from .http import Endpoints, Posts, origin_allowed
from .throttle import Throttled

Authorize = Callable[[Request, str | None], Grant | Throttled | None]
"""The credential's check (``Gate.authorize``): a grant, a throttle, or nothing (401)."""
RelayCheck = Callable[[Request], tuple[Grant, dict[str, str]] | None]
"""Cluster mode: a relayed resume's grant and its 101's headers, if its signature holds."""


def plain(status: str, text: str, *headers: str) -> bytes:
    """A whole plain-text HTTP response that closes the connection."""
    body = text.encode()
    extra = "".join(f"{header}\r\n" for header in headers)
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body


_UNAUTHORIZED = plain("401 Unauthorized", "a credential is required\n", "WWW-Authenticate: Bearer")
_RELAY_FORBIDDEN = plain(
    "403 Forbidden", "this endpoint takes resumes relayed by the nodes of this cluster only\n"
)


def _throttled(retry_after_s: int) -> bytes:
    return plain(
        "429 Too Many Requests",
        "too many failed resumes from this address; retry later\n",
        f"Retry-After: {retry_after_s}",
    )


@attrs.frozen
class Answer:
    """Plain HTTP in place of the upgrade: ``raw``, or (None) websockets' own
    rejection with ``status`` and ``text``. ``fault``: the client's fault, for the
    fault log; ``reason``: the refusal's metric label (None: not a refusal)."""

    raw: bytes | None
    fault: str | None = None
    reason: str | None = None
    status: int = 0
    text: str = ""


@attrs.frozen
class Upgrade:
    """Go on with the upgrade: the credential's grant, headers for the 101, whether
    the path is one this listener takes WebSockets on (else 404), and the dialect the
    connection speaks (the path's)."""

    grant: Grant
    headers: dict[str, str] = attrs.field(factory=dict)
    ours: bool = True
    dialect: Dialect = NATIVE


_NOT_OURS = Upgrade(OPEN, ours=False)
_ORIGIN = Answer(None, "403: origin not allowed", "origin", 403, "origin not allowed\n")
_RELAY_UNSIGNED = Answer(
    _RELAY_FORBIDDEN, "403: a relay request not signed for this node", "relay_unsigned"
)
_NO_CREDENTIAL = Answer(_UNAUTHORIZED, "401: no valid credential", "unauthorized")
_TWILIO_UNSIGNED = Answer(
    None,
    "403: a Twilio stream not signed by its account",
    "twilio_signature",
    403,
    "not signed by this Twilio account\n",
)

_RELAY_DIALECT = Answer(
    plain("400 Bad Request", "a relayed resume names one known dialect\n"),
    "400: a relay request naming no known dialect",
    "bad_request",
)

DIALECT_HEADER = "X-Trio-Duplex-Dialect"
"""A relayed resume's: the dialect its client speaks (absent: native), which the home
speaks on the relayed connection (the session must be of that dialect)."""


def _relayed_dialect(request: Request) -> Dialect | None:
    names = request.headers.get_all(DIALECT_HEADER)
    if not names:
        return NATIVE
    try:
        return by_name(names[0]) if len(names) == 1 else None
    except KeyError:
        return None


_POSTS = tuple(f"POST {path}{end}".encode() for path in POST_PATHS for end in " ?")


@attrs.frozen
class Router:
    """One listener's routes (its ``path`` None: no WebSocket endpoint there, as on the
    ``--relay-port`` listener, which takes relayed resumes only)."""

    path: str | None
    endpoints: Endpoints | None = None
    origins: tuple[str, ...] = ()
    """``--allow-origin``: those, or any with ``*``; none: only the Host's own origin."""
    authorize: Authorize | None = None
    posts: Posts | None = None
    """Client tokens' and client secrets' POSTs (``Gate``)."""
    relay: tuple[str, RelayCheck] | None = None
    """Cluster mode: the relay's path, and the check of a request's signature."""
    dialects: Mapping[str, Dialect] = attrs.field(factory=dict)
    """The dialect of each WebSocket path (``--realtime-path``'s); ``path`` is native
    unless named here. A dialect of ``CALLS_ONLY`` (a call's) is never selected: its path
    is not ours (404). Only the relay path takes one (a call's resume relayed between
    nodes, signed)."""
    twilio: tuple[str, Callable[[Request, SplitResult], bool]] | None = None
    """Phone calls (twiliodoor.py): the stream's path, and the check of its upgrade's
    ``X-Twilio-Signature``; such an upgrade speaks ``twilio``, its door serves it."""

    def posts_token(self, head: bytes) -> bool:
        """A POST of a client token or secret (answered by ``posts``, body and all)."""
        return self.posts is not None and head.startswith(_POSTS)

    def answer_head(self, head: bytes) -> bytes | None:
        """A HEAD request, answered as the demo pages would a GET (websockets parses
        GETs only); None: not one of ours to answer."""
        endpoints = self.endpoints
        if endpoints is None or endpoints.demo is None or not head.startswith(b"HEAD "):
            return None
        return endpoints.answer_head(head)

    def route(self, request: Request, url: SplitResult, peer: str | None) -> Answer | Upgrade:
        """What a parsed GET is for (see the module's docstring for the order)."""
        headers = request.headers
        endpoints = self.endpoints
        if endpoints is not None:
            page = endpoints.answer(url.path, headers.get("Host"))
            if page is not None:
                return Answer(page)
        # Before the credential: a page of another origin spends no client token.
        if not origin_allowed(headers.get_all("Origin"), headers.get_all("Host"), self.origins):
            return _ORIGIN
        relay = self.relay
        if relay is not None and url.path == relay[0]:
            signed = relay[1](request)
            if signed is None:
                return _RELAY_UNSIGNED
            relayed = _relayed_dialect(request)
            return _RELAY_DIALECT if relayed is None else Upgrade(*signed, dialect=relayed)
        twilio = self.twilio
        if twilio is not None and url.path == twilio[0]:
            return Upgrade(OPEN, dialect=TWILIO) if twilio[1](request, url) else _TWILIO_UNSIGNED
        dialect = self.dialects.get(url.path)
        if dialect is None:
            if url.path != self.path:
                return _NOT_OURS
            dialect = NATIVE
        elif dialect.name in CALLS_ONLY:  # a call's: no client's WebSocket speaks it
            return _NOT_OURS
        if self.authorize is None:
            return Upgrade(OPEN, dialect=dialect)
        found = self.authorize(request, peer)
        if isinstance(found, Throttled):
            fault = "429: too many failed resumes from its address"
            return Answer(_throttled(found.retry_after_s), fault, "throttled")
        return _NO_CREDENTIAL if found is None else Upgrade(found, dialect=dialect)


__all__ = ["DIALECT_HEADER", "Answer", "Authorize", "RelayCheck", "Router", "Upgrade", "plain"]
