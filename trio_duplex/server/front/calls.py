"""HTTP of OpenAI's WebRTC call endpoints, ``/v1/realtime/calls`` (sans-IO;
docs/plans/webrtc.md §3.1).

* ``POST /v1/realtime/calls[?model=M]``, ``Authorization: Bearer K``: a call. Its body is
  the offer, as ``Content-Type: application/sdp`` (browsers, the agents SDK, openai-python
  without a session), or ``multipart/form-data`` with a part ``sdp`` and an optional part
  ``session`` (JSON, ``{"type": "realtime", ...}``), as openai-python's
  ``realtime.calls.create(sdp=, session=)`` sends it. ``?resume=SESSION_ID`` (with the
  resume token as the bearer) and ``&last_received_server_event_seq=N`` resume a session
  on a new call. ``201`` with the answer and ``Location: /v1/realtime/calls/{call_id}``.
* ``POST /v1/realtime/calls/{call_id}/hangup`` and ``DELETE /v1/realtime/calls/{call_id}``:
  hang up, ``200`` with an empty body.
* ``OPTIONS`` on any of them: CORS's preflight, for the origins ``--allow-origin`` allows
  (the caller says whether one is: http.py's ``origin_allowed``).

What the door (the trio shell) does with these: ``is_calls_head`` on the head it read,
``parse_head``, ``classify``; for a call it reads ``Head.length`` bytes of body (bounded)
and ``parse_call``; it answers with ``created_response``, ``hangup_response``,
``preflight_response`` or ``refusal_response``. Every refusal is OpenAI's error JSON
(``client_secrets.error``) with a fixed message, never the client's input. A path under
``/v1/realtime/calls`` that is none of the above, or a method it does not take, is 404
(not 405: one answer for "nothing here", and no ``Allow`` to keep in step).

The query's other keys are ignored, as ``model`` is (the model goes in the session's
configuration): an SDK's ``extra_query`` does not break a call.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal
from urllib.parse import parse_qs

import attrs
from websockets.datastructures import Headers

from ...core.wire import ProtocolError
from ...dialects.jsonwire import decode_object
from .client_secrets import Refusal, error

CALLS_PATH = "/v1/realtime/calls"
"""``POST`` here: a WebRTC call; below it, one call (``/{call_id}``, ``/{call_id}/hangup``)."""

RETRY_AFTER_S = 1
"""The ``Retry-After`` of a 429 or 503."""

_METHODS = ("POST", "OPTIONS", "DELETE")
_PREFIXES = tuple(f"{method} {CALLS_PATH}{end}".encode() for method in _METHODS for end in " ?/")
_CALL_ID = re.compile(r"rtc_[0-9a-f]{32}")
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
"""An HTTP token (a method, a header's name)."""
_VALUE = re.compile(r"[\x09\x20-\x7e\x80-\xff]*")
"""A header's value (latin-1 text, no control character but tab)."""
_TARGET = re.compile(r"/[\x21-\x7e]*")
"""An origin-form request target: visible ASCII, from ``/``."""
_ORIGIN = re.compile(r"[\x21-\x7e]+")
"""An Origin echoed back: visible ASCII only."""
_VERSIONS = ("HTTP/1.1", "HTTP/1.0")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,16}")
"""ASCII digits only (``str.isdigit`` takes ``²``, which ``int`` refuses)."""
_SEQ = re.compile(r"[0-9]{1,18}")
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
"""RFC 2046's boundary: 1 to 70 of its characters, not ending in a space."""
_PART_NAME = re.compile(r'(?:^|;)\s*name\s*=\s*(?:"([^"]*)"|([^\s;"]+))\s*(?=;|$)', re.IGNORECASE)
"""A Content-Disposition's ``name`` parameter, quoted or a bare token."""
_MAX_HEADERS = 128
_MAX_PARTS = 16
_SINGLE = ("Host", "Origin", "Authorization")
"""Headers a request may hold once only (which one would be meant?)."""

_PHRASES = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


def openai_refusal(status: int, message: str, param: str | None = None) -> Refusal:
    """A refusal with OpenAI's error body (a fixed ``message``, never the request's)."""
    return Refusal(status, error(status, message, param))


_NOT_HTTP = openai_refusal(400, "not a valid HTTP/1.1 request")
_BAD_TARGET = openai_refusal(400, "not a valid request target")
_TWICE = openai_refusal(400, "Host, Origin and Authorization may be sent once each")
_CODINGS = openai_refusal(400, "transfer codings are not supported")
_LENGTH = openai_refusal(400, "a body needs one Content-Length, in digits")
_NOT_FOUND = openai_refusal(404, "no such endpoint")
_NO_ORIGIN = openai_refusal(400, "a preflight request needs an Origin")
_MEDIA_TYPE = openai_refusal(
    415, "the body must be application/sdp or multipart/form-data with an sdp part"
)
_NO_BOUNDARY = openai_refusal(400, "a multipart body needs a valid boundary")
_BAD_MULTIPART = openai_refusal(400, "the body is not valid multipart/form-data")
_NO_SDP_PART = openai_refusal(400, "the multipart body has no sdp part", "sdp")
_TWO_PARTS = openai_refusal(400, "the multipart body holds a part twice")
_SDP_TOO_LARGE = openai_refusal(413, "the SDP offer is too large", "sdp")
_SESSION_TOO_LARGE = openai_refusal(413, "the session part is too large", "session")
_BAD_SESSION = openai_refusal(400, "the session part must be a JSON object", "session")
_SESSION_TYPE = openai_refusal(400, 'session.type must be "realtime"', "session.type")
_BAD_RESUME = openai_refusal(400, "resume must be given once, a session id", "resume")
_BAD_SEQ = openai_refusal(
    400,
    "last_received_server_event_seq must be given once, a non-negative integer",
    "last_received_server_event_seq",
)
_SEQ_ALONE = openai_refusal(
    400, "last_received_server_event_seq needs resume", "last_received_server_event_seq"
)


def is_calls_head(head: bytes) -> bool:
    """Is this request head (its first bytes will do) a POST, OPTIONS or DELETE of
    ``CALLS_PATH`` or a path below it? Prefix checks only: ``parse_head`` checks the rest."""
    return head.startswith(_PREFIXES)


@attrs.frozen
class Head:
    """A parsed request head of the call endpoints. ``headers`` (not in the repr: it
    holds the credential) keeps every header line in order; ``length`` is the body's
    ``Content-Length`` (0 when an OPTIONS or DELETE has none)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Headers = attrs.field(repr=False)
    length: int


HeadFault = Literal["not_http", "target", "twice", "codings", "length"]
"""Why ``read_head`` refused a head: each endpoint words it in its own refusal."""


@attrs.frozen
class RequestHead:
    """A request head as ``read_head`` lexed it, for any endpoint: the target split
    into ``path`` and ``raw_query`` (as received, still percent-encoded; None without a
    ``?``, ``""`` for a bare one), every header line in order (not in the repr: they hold
    credentials), and the ``Content-Length`` (None without one)."""

    method: str
    path: str
    raw_query: str | None
    headers: Headers = attrs.field(repr=False)
    length: int | None


def read_head(head: bytes) -> RequestHead | HeadFault:
    """Lex a request head (its blank line may be included). The fault: ``not_http`` for
    a request line that is not ``METHOD /target HTTP/1.x``, a header line that is not
    ``Name: value``, a bare CR or LF, more than 128 headers; ``target`` for a target that
    is not origin-form visible ASCII (or holds a ``#``); ``twice`` for Host, Origin or
    Authorization sent twice; ``codings`` for ``Transfer-Encoding``; ``length`` for a
    ``Content-Length`` that is not one value in ASCII digits."""
    lines = head.decode("latin-1").removesuffix("\r\n\r\n").split("\r\n")
    if len(lines) - 1 > _MAX_HEADERS or any("\r" in line or "\n" in line for line in lines):
        return "not_http"
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in _VERSIONS:
        return "not_http"
    method, target, _ = parts
    if not _TARGET.fullmatch(target) or "#" in target:
        return "target"
    path, mark, query_text = target.partition("?")
    headers = Headers()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        value = value.strip(" \t")
        if not colon or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
            return "not_http"
        headers.set_insecure(name, value)
    if any(len(headers.get_all(name)) > 1 for name in _SINGLE):
        return "twice"
    if "Transfer-Encoding" in headers:
        return "codings"
    lengths = headers.get_all("Content-Length")
    if not lengths:
        length = None
    elif len(lengths) == 1 and _CONTENT_LENGTH.fullmatch(lengths[0]):
        length = int(lengths[0])
    else:
        return "length"
    return RequestHead(method, path, query_text if mark else None, headers, length)


_HEAD_FAULTS: dict[HeadFault, Refusal] = {
    "not_http": _NOT_HTTP,
    "target": _BAD_TARGET,
    "twice": _TWICE,
    "codings": _CODINGS,
    "length": _LENGTH,
}


def parse_head(head: bytes) -> Head | Refusal:
    """Parse a request head (its blank line may be included). Refusal (400): a
    request line that is not ``METHOD /target HTTP/1.x``, a header line that is not
    ``Name: value``, a bare CR or LF, more than 128 headers, ``Transfer-Encoding``, a
    ``Content-Length`` that is not one value in ASCII digits, Host, Origin or
    Authorization sent twice (``read_head``'s faults). A call's POST (of ``CALLS_PATH``)
    needs a Content-Length (its body is the offer); without one, any other request has no
    body (RFC 9112 §6.3: ``curl -X POST .../hangup`` sends none)."""
    lexed = read_head(head)
    if isinstance(lexed, str):
        return _HEAD_FAULTS[lexed]
    method, path, length = lexed.method, lexed.path, lexed.length
    if length is None:
        if method == "POST" and path == CALLS_PATH:
            return _LENGTH
        length = 0  # (curl -X POST .../hangup)
    query_text = lexed.raw_query
    query = parse_qs(query_text, keep_blank_values=True) if query_text else {}
    return Head(method, path, query, lexed.headers, length)


@attrs.frozen
class Preflight:
    """CORS's preflight (``OPTIONS``): its Origin, and whether it asks for the private
    network (``Access-Control-Request-Private-Network: true``, a public page calling a
    server on a private address)."""

    origin: str
    private_network: bool


@attrs.frozen
class Hangup:
    """Hang up the call ``call_id`` (its bearer: not in the repr)."""

    call_id: str
    bearer: str | None = attrs.field(repr=False)


def bearer(headers: Headers) -> str | None:
    """``Authorization: Bearer X``'s X (auth.presented's rule, for a header only:
    a call's request carries no subprotocol)."""
    scheme, _, value = headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def classify(head: Head) -> Preflight | Hangup | Literal["call"] | Refusal:
    """What a request of the call endpoints is: a preflight (an ``OPTIONS`` of any of
    them, which needs an Origin: else 400), a hang-up (``DELETE /{id}``,
    ``POST /{id}/hangup``), a call (``POST`` of ``CALLS_PATH``), or 404 (another path
    or method, or a call id not ``rtc_`` and 32 lower-case hex digits)."""
    path = head.path
    if path != CALLS_PATH and not path.startswith(CALLS_PATH + "/"):
        return _NOT_FOUND
    if head.method == "OPTIONS":
        origin = head.headers.get("Origin")
        if not origin:
            return _NO_ORIGIN
        asked = head.headers.get_all("Access-Control-Request-Private-Network")
        return Preflight(origin, [value.lower() for value in asked] == ["true"])
    if path == CALLS_PATH:
        return "call" if head.method == "POST" else _NOT_FOUND
    rest = path[len(CALLS_PATH) + 1 :].split("/")
    if not _CALL_ID.fullmatch(rest[0]):
        return _NOT_FOUND
    if (head.method, rest[1:]) in (("DELETE", []), ("POST", ["hangup"])):
        return Hangup(rest[0], bearer(head.headers))
    return _NOT_FOUND


@attrs.frozen
class CallRequest:
    """A call's checked request. ``offer``: the SDP as sent (``sdp.check_offer`` checks
    it), not in the repr (it holds the ICE password), nor the bearer. ``session``: the
    multipart form's session object (type ``realtime``), None without one. ``resume``,
    ``last_seq``: the query's ``resume`` and ``last_received_server_event_seq``."""

    offer: bytes = attrs.field(repr=False)
    session: dict[str, Any] | None
    query: dict[str, list[str]]
    bearer: str | None = attrs.field(repr=False)
    resume: str | None = None
    last_seq: int | None = None


def parse_call(
    head: Head, body: bytes, *, max_sdp_bytes: int, max_session_bytes: int
) -> CallRequest | Refusal:
    """A call's request from its head and whole body. Refusal: 415 for a body neither
    ``application/sdp`` nor ``multipart/form-data``; 400 for a multipart body without a
    boundary, not well formed, without an ``sdp`` part or with a part twice, a session
    part not a JSON object of type ``realtime``, a bad ``resume`` or
    ``last_received_server_event_seq``; 413 for an offer over ``max_sdp_bytes`` or a
    session part over ``max_session_bytes``. Other parts are ignored."""
    query = _query(head.query)
    if isinstance(query, Refusal):
        return query
    types = head.headers.get_all("Content-Type")
    if len(types) != 1:
        return _MEDIA_TYPE
    media_type, *params = (item.strip(" \t") for item in types[0].split(";"))
    media_type = media_type.lower()
    session = None
    if media_type == "application/sdp":
        offer = body
    elif media_type == "multipart/form-data":
        form = _form(body, params)
        if isinstance(form, Refusal):
            return form
        if "sdp" not in form:
            return _NO_SDP_PART
        offer = form["sdp"]
        raw = form.get("session")
        if raw is not None:
            if len(raw) > max_session_bytes:
                return _SESSION_TOO_LARGE
            parsed = _session(raw)
            if isinstance(parsed, Refusal):
                return parsed
            session = parsed
    else:
        return _MEDIA_TYPE
    if len(offer) > max_sdp_bytes:
        return _SDP_TOO_LARGE
    resume, last_seq = query
    return CallRequest(offer, session, head.query, bearer(head.headers), resume, last_seq)


def _query(query: dict[str, list[str]]) -> tuple[str | None, int | None] | Refusal:
    resumes = query.get("resume")
    seqs = query.get("last_received_server_event_seq")
    if resumes is None:
        return _SEQ_ALONE if seqs is not None else (None, None)
    if len(resumes) != 1 or not resumes[0]:
        return _BAD_RESUME
    if seqs is None:
        return resumes[0], None
    if len(seqs) != 1 or not _SEQ.fullmatch(seqs[0]):
        return _BAD_SEQ
    return resumes[0], int(seqs[0])


def _form(body: bytes, params: list[str]) -> dict[str, bytes] | Refusal:
    """The parts of a ``multipart/form-data`` body (RFC 7578) by name: those named
    ``sdp`` and ``session`` (each at most once); the others are skipped."""
    boundaries = [
        value.strip(" \t")
        for name, sep, value in (param.partition("=") for param in params)
        if sep and name.strip(" \t").lower() == "boundary"
    ]
    if len(boundaries) != 1:
        return _NO_BOUNDARY
    boundary = boundaries[0]
    if len(boundary) >= 2 and boundary[0] == boundary[-1] == '"':
        boundary = boundary[1:-1]
    if not _BOUNDARY.fullmatch(boundary):
        return _NO_BOUNDARY
    pieces = (b"\r\n" + body).split(b"\r\n--" + boundary.encode("ascii"))
    if len(pieces) < 2 or len(pieces) > _MAX_PARTS + 2:
        return _BAD_MULTIPART
    form: dict[str, bytes] = {}
    for piece in pieces[1:]:  # pieces[0]: the preamble
        if piece.startswith(b"--"):  # the close delimiter (the epilogue follows)
            return form
        piece = piece.lstrip(b" \t")  # transport padding
        if not piece.startswith(b"\r\n"):
            return _BAD_MULTIPART
        part = _part(piece[2:])
        if part is None:
            return _BAD_MULTIPART
        name, content = part
        if name in ("sdp", "session"):
            if name in form:
                return _TWO_PARTS
            form[name] = content
    return _BAD_MULTIPART  # no close delimiter: cut short


def _part(part: bytes) -> tuple[str, bytes] | None:
    """A part's name (its ``Content-Disposition: form-data; name=...``) and content."""
    if part.startswith(b"\r\n"):
        return None  # no headers: no name
    end = part.find(b"\r\n\r\n")
    if end < 0:
        return None
    names = []
    for line in part[:end].decode("latin-1").split("\r\n"):
        header, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(header):
            return None
        if header.lower() == "content-disposition":
            kind, _, rest = value.strip(" \t").partition(";")
            match = _PART_NAME.search(";" + rest)
            if kind.strip().lower() != "form-data" or match is None:
                return None
            names.append(match[1] if match[1] is not None else match[2])
    if len(names) != 1:
        return None
    return names[0], part[end + 4 :]


def _session(raw: bytes) -> dict[str, Any] | Refusal | None:
    """The session part: a JSON object of type ``realtime``, or ``null`` (the SDK sends
    an explicit ``session=None`` so): None."""
    try:
        text = raw.decode("utf-8")
        if text.strip() == "null":
            return None
        session = decode_object(text)
    except (UnicodeDecodeError, ProtocolError):
        return _BAD_SESSION
    if session.get("type") != "realtime":  # (OpenAI requires it)
        return _SESSION_TYPE
    return session


# -- answers ----------------------------------------------------------------------------------

_ALLOW_METHODS = "POST, DELETE, OPTIONS"
_ALLOW_HEADERS = "authorization, content-type, x-openai-agents-sdk"
"""What the agents SDK sends (``X-OpenAI-Agents-SDK`` makes its POST preflighted)."""
PREFLIGHT_MAX_AGE_S = 600


def cors_headers(origin: str | None, allowed: bool) -> list[str]:
    """The CORS header lines of a call endpoint's answer to a request from ``origin``
    (its Origin header), if ``allowed`` (``origin_allowed``): ``Location`` exposed, or a
    page on another origin reads it as null. None for no origin, or one not allowed (or
    not header text: never echoed)."""
    if origin is None or not allowed or not _ORIGIN.fullmatch(origin):
        return []
    return [
        f"Access-Control-Allow-Origin: {origin}",
        "Vary: Origin",
        "Access-Control-Expose-Headers: Location",
    ]


def http_response(
    status: int, lines: list[str], body: bytes = b"", media: str | None = None
) -> bytes:
    """A whole answer: its status line, ``lines`` (header lines), ``Content-Length``
    (none on a 204), ``Cache-Control: no-store`` and ``Connection: close`` (one request a
    connection), then ``body``."""
    head = [f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}"]
    if media is not None:
        head.append(f"Content-Type: {media}")
    if status != 204:  # (RFC 9110 §8.6: never on a 204)
        head.append(f"Content-Length: {len(body)}")
    head += ["Cache-Control: no-store", *lines, "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def preflight_response(preflight: Preflight, allowed: bool) -> bytes:
    """The answer to a preflight: 204 with CORS's permissions if its origin is
    ``allowed``, else 403 without any (the browser then sends nothing more)."""
    cors = cors_headers(preflight.origin, allowed)
    if not cors:
        refusal = openai_refusal(403, "origin not allowed")
        return http_response(403, [], refusal.body, "application/json")
    lines = [
        cors[0],
        f"Access-Control-Allow-Methods: {_ALLOW_METHODS}",
        f"Access-Control-Allow-Headers: {_ALLOW_HEADERS}",
        f"Access-Control-Max-Age: {PREFLIGHT_MAX_AGE_S}",
        "Vary: Origin",
    ]
    if preflight.private_network:
        lines.append("Access-Control-Allow-Private-Network: true")
    return http_response(204, lines)


def created_response(answer_sdp: str, call_id: str, cors: list[str]) -> bytes:
    """201: the call's answer, and where the call is (``Location``)."""
    lines = [f"Location: {CALLS_PATH}/{call_id}", *cors]
    return http_response(201, lines, answer_sdp.encode(), "application/sdp")


def refusal_response(refusal: Refusal, cors: list[str]) -> bytes:
    """A refusal: OpenAI's error JSON; ``WWW-Authenticate`` on a 401, ``Retry-After`` on
    a 429 or 503."""
    lines = list(cors)
    if refusal.status == 401:
        lines.append("WWW-Authenticate: Bearer")
    if refusal.status in (429, 503):
        lines.append(f"Retry-After: {RETRY_AFTER_S}")
    return http_response(refusal.status, lines, refusal.body, "application/json")


def hangup_response(cors: list[str]) -> bytes:
    """200 with an empty body: the call is hung up."""
    return http_response(200, list(cors))


def new_call_id() -> str:
    """A call's id, as OpenAI's look (``rtc_...``)."""
    return "rtc_" + secrets.token_hex(16)


__all__ = [
    "CALLS_PATH",
    "CallRequest",
    "Hangup",
    "Head",
    "HeadFault",
    "Preflight",
    "RequestHead",
    "classify",
    "cors_headers",
    "created_response",
    "hangup_response",
    "http_response",
    "is_calls_head",
    "new_call_id",
    "openai_refusal",
    "parse_call",
    "parse_head",
    "preflight_response",
    "read_head",
    "refusal_response",
]
