"""The HTTP upgrade to a WebSocket, and the plain HTTP answered before it.

The request head is read here first, bounded, and the listener's ``Router`` (router.py)
says what it is for, so that a request that is not an upgrade (a client token's POST,
health and metrics, the demo page, a relayed resume's signature, a refused credential)
is answered or refused before it reaches a WebSocket.

A well-formed upgrade (``quick_request``, ``quick_accept``: a GET of HTTP/1.1, header
lines of tokens and visible text, the upgrade's headers each once and valid) is parsed
and answered 101 here, as websockets' sans-IO ``ServerProtocol`` would parse and answer
it, byte for byte but the clock's ``Date`` (tests/server/test_quick_upgrade.py holds
them to that). Anything else goes to ``ServerProtocol``, which parses it, and refuses
it in its own words (400, 404, 426, ...) or answers 101.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import hashlib
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, parse_qs, urlsplit

import attrs
import trio
from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from ...core.opening import Grant
from ...dialects import Dialect
from ..sessions.faults import FAULTS
from ..sessions.websocket import RECEIVE_SIZE, WebSocket
from .auth import bearer
from .calldoor import CallAccepted, CallDoor
from .calls import is_calls_head
from .http import MAX_POST_BYTES, answer_post
from .router import Answer, Router, Upgrade, plain

if TYPE_CHECKING:
    from .twiliodoor import TwilioDoor

_MAX_REQUEST_BYTES = 16384
"""The largest request head taken (431 beyond)."""

# websockets logs each handshake at INFO; that is the server's business to say.
_quiet = logging.getLogger("trio_duplex.websocket")
_quiet.setLevel(logging.WARNING)

_BAD_REQUEST = plain("400 Bad Request", "HTTP lines must end with CR LF.\n")
_TOO_LARGE = plain(
    "431 Request Header Fields Too Large", f"The request head exceeds {_MAX_REQUEST_BYTES} bytes.\n"
)
RETRY_AFTER_S = 1
_UNAVAILABLE = plain(
    "503 Service Unavailable",
    "Too many connections; retry later.\n",
    f"Retry-After: {RETRY_AFTER_S}",
)


def _uncounted(reason: str) -> None:
    pass


_SINGLE_HEADERS = ("Host", "Origin", "Authorization")
"""Headers a request may hold once only (which one would be meant?): else 400."""
_TWICE = Answer(
    plain("400 Bad Request", "Host, Origin and Authorization may be sent once each\n"),
    "400: a header sent twice that may be sent once",
    "bad_request",
)
_BAD_TARGET = Answer(
    plain("400 Bad Request", "not a valid request target\n"),
    "400: not a valid request target",
    "bad_request",
)

_REFUSAL_REASONS = {404: "not_found"}
"""The ``trio_duplex_handshake_refusals_total`` reason of an upgrade answered so."""


def _refusal_reason(exc: BaseException | None) -> str:
    """Why websockets refused a request head, in a fixed text (never the client's)."""
    cause = exc.__cause__ if exc is not None else None
    if isinstance(cause, NotImplementedError):
        return "transfer codings are not supported"
    if isinstance(cause, ValueError) and "body" in str(cause):
        return "an upgrade request has no body"
    return "not a valid HTTP/1.1 request"


Select = Callable[[ServerProtocol, Sequence[Subprotocol]], Subprotocol | None]


def _selecting(chosen: list[str | None]) -> Select:
    """The upgrade's subprotocol: its dialect's (``chosen[0]``, set once the path is
    routed: ``trio-duplex``, ``realtime``) if offered, else none (never another: a
    credential offered as a subprotocol, ``trio-duplex.bearer.KEY``, must not be
    echoed back). (websockets binds it as a method: a function, not a callable object.)"""

    def select(_: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        wanted = chosen[0]
        return Subprotocol(wanted) if wanted is not None and wanted in offered else None

    return select


@attrs.frozen
class Accepted:
    """An upgrade answered 101: its WebSocket, query, grant and dialect, and for a
    dialect that speaks first the credential it presented (which may be the resume
    token that ``Dialect.opening`` resumes with)."""

    ws: WebSocket
    query: dict[str, list[str]]
    grant: Grant
    dialect: Dialect
    bearer: str | None = attrs.field(default=None, repr=False)


def _bare_line_feed(head: bytes, start: int) -> bool:
    """A line ended by LF alone at or after ``start``: never a valid upgrade, and its
    "\r\n\r\n" may never come."""
    at = head.find(b"\n", start)
    while at >= 0:
        if at == 0 or head[at - 1] != 0x0D:
            return True
        at = head.find(b"\n", at + 1)
    return False


async def refuse_unavailable(stream: trio.abc.Stream) -> None:
    """Answer a request with 503 and ``Retry-After``, once its head has been read.

    Reading it first matters: closing a socket with unread bytes resets the connection,
    and the client may then lose the answer. Nothing is answered if the stream ends or
    the head exceeds the 16 KiB bound first. Bound it with a (short) deadline."""
    head = bytearray()
    while True:
        start = max(0, len(head) - 3)  # a blank line may straddle two reads
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return
        head += data
        if head.find(b"\r\n\r\n", start) >= 0 or head.find(b"\n\n", start) >= 0:
            break
        if len(head) > _MAX_REQUEST_BYTES:
            return
    await stream.send_all(_UNAVAILABLE)


async def accept_websocket(
    stream: trio.abc.Stream,
    router: Router,
    max_message_bytes: int,
    write_timeout: float = math.inf,
    peer: str | None = None,
    *,
    max_post_bytes: int = MAX_POST_BYTES,
    calls: CallDoor | None = None,
    twilio: TwilioDoor | None = None,
) -> Accepted | CallAccepted | None:
    """Read the HTTP upgrade request and answer it.

    ``router`` says what the request is for (router.py): plain HTTP, answered here, or
    an upgrade, which gets 101 (its path's dialect's subprotocol selected if offered)
    and returns the WebSocket, the query, the grant and the dialect; a
    request that is not an upgrade, or that repeats Host, Origin or Authorization, gets
    400; anything that is not HTTP is dropped: those return None. A client token's POST
    may carry a body of at most ``max_post_bytes``. With ``calls`` (``--calls``), a
    request to the WebRTC calls' paths is answered by it (calldoor.py), and a call it
    answered 201 is returned. With ``twilio`` (phone calls), its webhooks' POSTs are
    answered by it (twiliodoor.py). Bound it with a deadline."""
    where = f"a connection from {peer}" if peer else "a connection"
    refused = _uncounted if router.endpoints is None else router.endpoints.refused
    received = await _read_head(stream, where, refused)
    if received is None:
        return None
    # A GET upgrade has no body: frames the client sent at once come right after it.
    head, early = received
    if router.posts is not None and router.posts_token(head):
        await answer_post(stream, head, early, router.posts, where, router.origins, max_post_bytes)
        return None
    if calls is not None and is_calls_head(head):
        return await calls.answer(stream, head, early, peer)
    if twilio is not None and twilio.is_head(head):
        await twilio.answer(stream, head, early, peer)
        return None
    if (page := router.answer_head(head)) is not None:
        await stream.send_all(page)
        return None
    chosen: list[str | None] = [None]
    protocol = None  # websockets' (made only for what quick_request does not take)
    quick = quick_request(head)
    if quick is None:
        protocol = ServerProtocol(select_subprotocol=_selecting(chosen), logger=_quiet)
        parsed = _parse(protocol, head)
    else:
        parsed = _checked(quick)
    routed = parsed if isinstance(parsed, Answer) else router.route(*parsed, peer)
    if isinstance(routed, Answer):
        await _send(stream, protocol or _protocol(chosen), routed, where, refused)
        return None
    assert not isinstance(parsed, Answer)
    request, url = parsed
    dialect = routed.dialect
    chosen[0] = dialect.subprotocol
    answer = (
        quick_accept(request, dialect.subprotocol) if routed.ours and not routed.headers else None
    )
    if answer is not None:
        await stream.send_all(answer)
    elif not await _upgrade(stream, protocol or _protocol(chosen), request, routed, where, refused):
        return None
    ws = WebSocket(stream, max_message_bytes, write_timeout, peer)
    if early:
        await ws._feed(early)
    credential = bearer(request) if dialect.speaks_first else None
    query = parse_qs(url.query) if url.query else {}
    return Accepted(ws, query, routed.grant, dialect, credential)


async def _read_head(
    stream: trio.abc.Stream, where: str, refused: Callable[[str], None]
) -> tuple[bytes, bytes] | None:
    """The request head, and what came after it; None: answered (400, 431) or gone."""
    received = b""
    checked = 0  # LFs before this were looked at
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > _MAX_REQUEST_BYTES:
            break
        if _bare_line_feed(received, checked):
            FAULTS.report(where, "400: a request line not ended by CR LF")
            refused("bad_request")
            await stream.send_all(_BAD_REQUEST)
            return None
        checked = len(received)
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        received += data
    if end < 0 or end + 4 > _MAX_REQUEST_BYTES:  # the bound counts however the bytes came
        FAULTS.report(where, "431: request head too large")
        refused("head_too_large")
        await stream.send_all(_TOO_LARGE)
        return None
    return received[: end + 4], received[end + 4 :]


def _protocol(chosen: list[str | None]) -> ServerProtocol:
    return ServerProtocol(select_subprotocol=_selecting(chosen), logger=_quiet)


def _parse(protocol: ServerProtocol, head: bytes) -> tuple[Request, SplitResult] | Answer:
    """The request and its target, or the 400 that refuses them."""
    protocol.receive_data(head)
    events = protocol.events_received()
    if not events:  # not an HTTP request websockets takes: say why, in our words
        why = _refusal_reason(protocol.handshake_exc)
        return Answer(plain("400 Bad Request", why + "\n"), f"400: {why}", "bad_request")
    request = events[0]
    assert isinstance(request, Request)
    return _checked(request)


def _checked(request: Request) -> tuple[Request, SplitResult] | Answer:
    """A parsed request and its target, or the 400 that refuses them."""
    if any(len(request.headers.get_all(name)) > 1 for name in _SINGLE_HEADERS):
        return _TWICE
    try:
        return request, urlsplit(request.path)
    except ValueError:  # "//[x": an IPv6 host never closed
        return _BAD_TARGET


async def _send(
    stream: trio.abc.Stream,
    protocol: ServerProtocol,
    answer: Answer,
    where: str,
    refused: Callable[[str], None],
) -> None:
    """Write a plain HTTP answer, reporting it if it is a refusal."""
    if answer.fault is not None:
        FAULTS.report(where, answer.fault)
    if answer.reason is not None:
        refused(answer.reason)
    if answer.raw is not None:
        await stream.send_all(answer.raw)
        return
    protocol.send_response(protocol.reject(answer.status, answer.text))
    await stream.send_all(b"".join(protocol.data_to_send()))


async def _upgrade(
    stream: trio.abc.Stream,
    protocol: ServerProtocol,
    request: Request,
    routed: Upgrade,
    where: str,
    refused: Callable[[str], None],
) -> bool:
    """Answer the upgrade: 101 (True), or 400 for a request that is not an upgrade,
    then 404 for one of a path that is not ours."""
    response = protocol.accept(request)
    if response.status_code != 101:
        response = protocol.reject(400, "this endpoint takes WebSocket upgrade requests\n")
    elif not routed.ours:
        response = protocol.reject(404, "no such endpoint\n")
    else:
        for name, value in routed.headers.items():
            response.headers[name] = value
    protocol.send_response(response)
    if response.status_code != 101:
        FAULTS.report(where, f"{response.status_code}: {response.reason_phrase}")
        refused(_REFUSAL_REASONS.get(response.status_code, "not_upgrade"))
    await stream.send_all(b"".join(protocol.data_to_send()))
    return response.status_code == 101


_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
"""An HTTP token (a header's name), as websockets' parser takes it."""
_VALUE = re.compile(rb"[\x09\x20-\x7e\x80-\xff]*")
"""A header's value, as websockets' parser takes it."""
_TOKEN_TEXT = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
"""RFC 6455's, hashed with the client's key into Sec-WebSocket-Accept."""


def quick_request(head: bytes) -> Request | None:
    """The request websockets' parser makes of ``head`` (a whole request head, its
    blank line included), for the common form only: ``GET target HTTP/1.1``, an ASCII
    target, header lines ``Name: value`` of a token and visible text, no bare CR or LF,
    no body (no ``Content-Length``, no ``Transfer-Encoding``), within websockets' line
    and header bounds. None for anything else: websockets parses it then, and refuses
    it in its own words if it refuses it."""
    body = head[:-4]
    lines = body.split(b"\r\n")
    count = len(lines) - 1
    if count > MAX_NUM_HEADERS or body.count(b"\n") != count or body.count(b"\r") != count:
        return None
    parts = lines[0].split(b" ", 2)
    if len(parts) != 3 or parts[0] != b"GET" or parts[2] != b"HTTP/1.1":
        return None
    if len(lines[0]) + 2 > MAX_LINE_LENGTH or not parts[1].isascii():
        return None
    headers = Headers()
    token, visible = _TOKEN.fullmatch, _VALUE.fullmatch
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        value = value.strip(b" \t")
        if not colon or len(line) + 2 > MAX_LINE_LENGTH or not token(name) or not visible(value):
            return None
        headers.set_insecure(name.decode("ascii"), value.decode("iso-8859-1"))
    if "Content-Length" in headers or "Transfer-Encoding" in headers:
        return None
    return Request(parts[1].decode("ascii"), headers)


def quick_accept(request: Request, subprotocol: str | None) -> bytes | None:
    """The 101 that websockets' ``ServerProtocol.accept`` answers a valid upgrade
    ``request`` with (``subprotocol`` selected if offered, as ``_selecting``), as bytes;
    None unless ``request`` is plainly one: a GET of HTTP/1.1 whose Connection holds
    ``upgrade``, Upgrade is ``websocket``, one Sec-WebSocket-Key of 16 bytes in base64
    and one Sec-WebSocket-Version 13, with Connection and Sec-WebSocket-Protocol lists of
    tokens. (websockets' ``accept`` then decides: a 101 too, or its refusal.)"""
    headers = request.headers
    if request.method != "GET" or request.protocol != "HTTP/1.1":
        return None
    connection = _tokens(headers.get_all("Connection"))
    if connection is None or not any(option.lower() == "upgrade" for option in connection):
        return None
    upgrade, keys = headers.get_all("Upgrade"), headers.get_all("Sec-WebSocket-Key")
    if len(upgrade) != 1 or upgrade[0].lower() != "websocket" or len(keys) != 1:
        return None
    if headers.get_all("Sec-WebSocket-Version") != ["13"] or len(headers.get_all("Origin")) > 1:
        return None
    key = keys[0]
    try:
        if len(base64.b64decode(key.encode(), validate=True)) != 16:
            return None
    except binascii.Error:
        return None
    offered = _tokens(headers.get_all("Sec-WebSocket-Protocol"))
    if offered is None:
        return None
    accept = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
    chosen = (
        f"Sec-WebSocket-Protocol: {subprotocol}\r\n"
        if subprotocol is not None and subprotocol in offered
        else ""
    )
    return (
        f"HTTP/1.1 101 Switching Protocols\r\nDate: {_http_date()}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{chosen}\r\n"
    ).encode()


def _tokens(values: list[str]) -> list[str] | None:
    """The items of comma-separated lists of tokens (optional whitespace around each
    comma); None if any item is not a token (an empty one included)."""
    items = []
    for value in values:
        for item in value.split(","):
            item = item.strip(" \t")
            if not _TOKEN_TEXT.fullmatch(item):
                return None
            items.append(item)
    return items


_date: list[object] = [-1, ""]
"""The second it is, and its HTTP date (RFC 9110's IMF-fixdate), as last made."""


def _http_date() -> str:
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, email.utils.formatdate(now, usegmt=True)]
    date = _date[1]
    assert isinstance(date, str)
    return date


__all__ = [
    "RETRY_AFTER_S",
    "Accepted",
    "accept_websocket",
    "quick_accept",
    "quick_request",
    "refuse_unavailable",
]
