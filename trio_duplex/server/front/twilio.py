"""HTTP of Twilio's webhooks, ``POST {path}/twiml`` and ``POST {path}/status``, and
``X-Twilio-Signature`` (sans-IO; docs/plans/telephony.md §1.3, §2.2, §3.7).

``path`` is ``--twilio-path`` (``DEFAULT_PATH``); the stream's upgrade is ``GET {path}``
(the router's, which checks its signature with ``candidates(..., websocket=True)`` and
``signature_valid`` over no parameters).

What the door (the trio shell) does with a POST: ``is_twilio_head`` on the head it read,
``parse_head`` (method, path, ``Content-Type``, ``Content-Length`` ≤ ``MAX_WEBHOOK_BYTES``,
at most one ``X-Twilio-Signature``, no Webhook Rules), then reads ``WebhookHead.length``
bytes of body, ``parse_form``, ``signature_valid`` over ``candidates(public_url,
head.path, head.raw_query, websocket=False)``, ``call_of`` (or ``status_of``), and answers
``twiml_response``, ``empty_response`` or ``refusal_response``. Every refusal is fixed
``text/plain`` (never the request's input) with ``Connection: close``: 400 (not HTTP, a
bad form, no valid SIDs), 403 (a signature, an account, Webhook Rules), 404 (another path
or method), 413 (over ``MAX_WEBHOOK_BYTES`` or ``MAX_FORM_PAIRS``), 415 (not a form).

The signature is twilio-python's ``RequestValidator`` (its ``compute_signature`` and
``validate``), which the tests check ours against: base64 of HMAC-SHA1 under the Auth
Token over the URL Twilio requested, then each distinct (name, value) pair's name and
value, sorted by name and then value; the URL with and without its port.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from typing import Literal, get_args
from urllib.parse import parse_qs, unquote_to_bytes

import attrs
from websockets.datastructures import Headers

from ..twilio.tickets import ACCOUNT_SID, CALL_SID
from .calls import HeadFault, http_response, read_head
from .client_secrets import Refusal

DEFAULT_PATH = "/v1/twilio"
"""``--twilio-path``'s default: the stream's path; ``/twiml`` and ``/status`` below it."""

MAX_WEBHOOK_BYTES = 16 * 1024
"""A webhook's largest body (a voice webhook is 1-2 KB)."""
MAX_FORM_PAIRS = 256
"""A webhook's most form fields (a voice webhook has about 20)."""

SIGNATURE_HEADER = "X-Twilio-Signature"
SETTINGS_HEADER = "X-Twilio-Webhooks-Signature-Settings"
"""Webhook Rules' announcement of an HMAC-SHA256 signature under a shared key: not
supported (plan §1.3), refused 403."""

Endpoint = Literal["twiml", "status"]

FORM_TYPE = "application/x-www-form-urlencoded"

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_TWINS = {"http": "ws", "https": "wss"}
_PIECE = re.compile(rb"(?:[\x21-\x24\x27-\x7e]|%[0-9A-Fa-f]{2})*")
"""A form's name or value, still encoded: visible ASCII but ``%`` and ``&`` (the
separator), or ``%`` and two hex digits. (A value may hold ``=``: only the first one of a
pair separates.)"""
_PORT = re.compile(r"[0-9]{1,5}")


def _text(status: int, message: str) -> Refusal:
    return Refusal(status, message.encode() + b"\n")


_NOT_HTTP = _text(400, "not a valid HTTP/1.1 request")
_NOT_FOUND = _text(404, "no such endpoint")
_LENGTH = _text(400, "a webhook needs one Content-Length, in digits")
_TOO_LARGE = _text(413, "the webhook's body is too large")
_TOO_MANY = _text(413, "the webhook's form has too many fields")
_MEDIA_TYPE = _text(415, "the body must be application/x-www-form-urlencoded")
_BAD_FORM = _text(400, "the body is not a valid form")
_TWO_SIGNATURES = _text(400, "X-Twilio-Signature may be sent once")
_RULES = _text(403, "Webhook Rules signatures are not supported")
_BAD_SIDS = _text(400, "the webhook needs one AccountSid and one CallSid of Twilio's shape")
_ACCOUNT = _text(403, "this account is not served here")

SIGNATURE_REFUSAL = _text(403, "the request's signature is not valid")
"""The refusal of a request whose ``X-Twilio-Signature`` is missing or wrong."""

_HEAD_FAULTS: dict[HeadFault, Refusal] = {
    "not_http": _NOT_HTTP,
    "target": _text(400, "not a valid request target"),
    "twice": _text(400, "Host, Origin and Authorization may be sent once each"),
    "codings": _text(400, "transfer codings are not supported"),
    "length": _LENGTH,
}


# -- the head ---------------------------------------------------------------------------------


def is_twilio_head(head: bytes, path: str = DEFAULT_PATH) -> bool:
    """Is this request head (its first bytes will do) a POST of ``{path}/twiml`` or
    ``{path}/status``? Prefix checks only (``parse_head`` checks the rest); False when
    ``path`` is ``""`` (the endpoints are off)."""
    if not path:
        return False
    prefixes = tuple(
        f"POST {path}/{endpoint}{end}".encode() for endpoint in get_args(Endpoint) for end in " ?"
    )
    return head.startswith(prefixes)


@attrs.frozen
class WebhookHead:
    """A Twilio POST's checked head: which ``endpoint``, its ``path`` and ``raw_query``
    as received (the signed URL is made of them; ``raw_query`` None without a ``?``),
    ``query`` parsed, the body's ``length``, and the ``signature`` (None without one).
    Neither the headers nor the signature are in the repr."""

    endpoint: Endpoint
    path: str
    raw_query: str | None
    query: dict[str, list[str]]
    headers: Headers = attrs.field(repr=False)
    length: int
    signature: str | None = attrs.field(repr=False)


def presented_signature(headers: Headers) -> str | Refusal | None:
    """The request's ``X-Twilio-Signature`` (None without one). Refusal: sent twice
    (400), or a Webhook Rules request (``SETTINGS_HEADER``, 403). For the upgrade too."""
    if SETTINGS_HEADER in headers:
        return _RULES
    signatures = headers.get_all(SIGNATURE_HEADER)
    if len(signatures) > 1:
        return _TWO_SIGNATURES
    return signatures[0] if signatures else None


def _is_form(headers: Headers) -> bool:
    """One ``Content-Type``, ``application/x-www-form-urlencoded``, its charset (if
    any) UTF-8."""
    types = headers.get_all("Content-Type")
    if len(types) != 1:
        return False
    media_type, *params = (item.strip(" \t") for item in types[0].split(";"))
    if media_type.lower() != FORM_TYPE:
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip(" \t").lower() == "charset":
            if value.strip(" \t").strip('"').lower() not in ("utf-8", "utf8"):
                return False
    return True


def parse_head(head: bytes, path: str = DEFAULT_PATH) -> WebhookHead | Refusal:
    """Parse the head of a POST of ``{path}/twiml`` or ``{path}/status`` (its blank line
    may be included). Refusal: 400 for what calls.py's ``read_head`` refuses, or no
    ``Content-Length``, or the signature twice; 404 for another method or path; 403 for
    Webhook Rules; 413 for a body over ``MAX_WEBHOOK_BYTES`` (known before it is read);
    415 for a body not a form (UTF-8, if a charset is named). The signature itself is
    checked once the body is read (``signature_valid``)."""
    lexed = read_head(head)
    if isinstance(lexed, str):
        return _HEAD_FAULTS[lexed]
    endpoint: Endpoint | None = None
    for name in get_args(Endpoint):
        if path and lexed.method == "POST" and lexed.path == f"{path}/{name}":
            endpoint = name
    if endpoint is None:
        return _NOT_FOUND
    signature = presented_signature(lexed.headers)
    if isinstance(signature, Refusal):
        return signature
    if lexed.length is None:
        return _LENGTH
    if lexed.length > MAX_WEBHOOK_BYTES:
        return _TOO_LARGE
    if not _is_form(lexed.headers):
        return _MEDIA_TYPE
    raw = lexed.raw_query
    query = parse_qs(raw, keep_blank_values=True) if raw else {}
    return WebhookHead(endpoint, lexed.path, raw, query, lexed.headers, lexed.length, signature)


# -- the body ---------------------------------------------------------------------------------


def parse_form(body: bytes) -> list[tuple[str, str]] | Refusal:
    """An ``application/x-www-form-urlencoded`` body's (name, value) pairs, in order,
    repeated names kept. ``&`` separates pairs (empty ones skipped, as WHATWG's
    parser does), the first ``=`` a name from its value (none: the value is ``""``),
    ``+`` is a space; everything else must be visible ASCII with ``%`` only as ``%XX``
    (strict: no bare ``%``), and the bytes decoded must be UTF-8. Refusal: 400 for any
    of that broken, 413 for a body over ``MAX_WEBHOOK_BYTES`` or over ``MAX_FORM_PAIRS``
    pairs."""
    if len(body) > MAX_WEBHOOK_BYTES:
        return _TOO_LARGE
    pairs: list[tuple[str, str]] = []
    for item in body.split(b"&"):
        if not item:
            continue
        if len(pairs) == MAX_FORM_PAIRS:
            return _TOO_MANY
        name, _, value = item.partition(b"=")
        if not _PIECE.fullmatch(name) or not _PIECE.fullmatch(value):
            return _BAD_FORM
        try:
            pairs.append((_decoded(name), _decoded(value)))
        except UnicodeDecodeError:
            return _BAD_FORM
    return pairs


def _decoded(piece: bytes) -> str:
    return unquote_to_bytes(piece.replace(b"+", b" ")).decode("utf-8")


def form_value(params: Sequence[tuple[str, str]], name: str) -> str | None:
    """The value of the field ``name`` if the form holds it exactly once, else None."""
    values = [value for key, value in params if key == name]
    return values[0] if len(values) == 1 else None


# -- the signature ----------------------------------------------------------------------------


def _signed_params(params: Iterable[tuple[str, str]]) -> str:
    # RequestValidator.compute_signature: sorted(set(names)), each name's
    # sorted(set(values)): the distinct pairs, sorted by name then value.
    return "".join(name + value for name, value in sorted(set(params)))


def _signature(token: bytes, url: str, suffix: str) -> str:
    message = (url + suffix).encode("utf-8", "surrogatepass")
    return base64.b64encode(hmac.new(token, message, hashlib.sha1).digest()).decode("ascii")


def expected_signature(auth_token: str, url: str, params: Iterable[tuple[str, str]]) -> str:
    """``X-Twilio-Signature`` of a request to ``url`` with the form ``params``: base64 of
    HMAC-SHA1 under ``auth_token`` over ``url`` and then each distinct (name, value)
    pair's name and value, sorted by name then value (as twilio-python's
    ``RequestValidator.compute_signature``; a GET has no params)."""
    return _signature(auth_token.encode("utf-8"), url, _signed_params(params))


def candidates(public_url: str, path: str, raw_query: str | None, *, websocket: bool) -> list[str]:
    """The URLs a request of ``path`` (and ``raw_query``, as received: ``?`` and it; None
    or ``""``: no query, as ``RequestValidator.validate``'s ``urlparse`` drops a bare
    ``?``) may have been signed as: ``public_url`` (``--twilio-public-url``,
    ``scheme://host[:port]``) with its port and without it (RequestValidator's rule:
    ``validate`` takes both, the port being the default one when none is written, and
    takes the URL without a port even when the port written is not the default). With
    ``websocket`` (the stream's upgrade: which spelling Twilio signs is UNCONFIRMED,
    plan §1.3), also each as ``wss``/``ws``. No duplicates; the configured spelling
    first."""
    scheme, _, authority = public_url.rstrip("/").partition("://")
    scheme = scheme.lower()
    host, port = _split_authority(authority)
    tail = path + ("?" + raw_query if raw_query else "")
    base = f"{scheme}://{authority}"
    schemes = [scheme]
    if websocket and scheme in _TWINS:
        schemes.append(_TWINS[scheme])
    found = [base + tail]
    for each in schemes:
        number = port if port is not None else _DEFAULT_PORTS.get(each)
        found.append(f"{each}://{host}{tail}")
        if number is not None:
            found.append(f"{each}://{host}:{number}{tail}")
    return list(dict.fromkeys(found))


def _split_authority(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` (a bracketed IPv6 host too) as host and port (None: none given)."""
    host, colon, port = authority.rpartition(":")
    if colon and _PORT.fullmatch(port) and (not host.startswith("[") or host.endswith("]")):
        return host, int(port)
    return authority, None


def signature_valid(
    auth_token: str,
    header: str | None,
    candidates: Sequence[str],
    params: Iterable[tuple[str, str]],
) -> bool:
    """Is ``header`` (``X-Twilio-Signature``, None without one) the signature of one of
    the ``candidates`` URLs with ``params``? Every candidate's is computed and compared
    (``hmac.compare_digest``), so the time taken says nothing about which one matched."""
    token = auth_token.encode("utf-8")
    suffix = _signed_params(params)
    presented = (header or "").encode("utf-8", "surrogatepass")
    matched = False
    for url in candidates:
        computed = _signature(token, url, suffix).encode("ascii")
        matched |= hmac.compare_digest(computed, presented)
    return matched and header is not None


# -- what a webhook names ---------------------------------------------------------------------


@attrs.frozen
class Call:
    """The call a webhook is about (its SIDs, of Twilio's shape)."""

    account_sid: str
    call_sid: str


def call_of(params: Sequence[tuple[str, str]], account_sid: str | None) -> Call | Refusal:
    """The call a (signed) webhook names. Refusal: 400 without exactly one
    ``AccountSid`` (``AC`` and 32 hex digits) and one ``CallSid`` (``CA``...); 403 for
    an account not ``account_sid`` (``--twilio-account-sid``, None: any)."""
    account, call = form_value(params, "AccountSid"), form_value(params, "CallSid")
    if account is None or call is None:
        return _BAD_SIDS
    if not ACCOUNT_SID.fullmatch(account) or not CALL_SID.fullmatch(call):
        return _BAD_SIDS
    if account_sid is not None and account != account_sid:  # (an account SID is no secret)
        return _ACCOUNT
    return Call(account, call)


CallStatus = Literal[
    "queued", "ringing", "in-progress", "completed", "busy", "failed", "no-answer", "canceled"
]
"""A voice status callback's ``CallStatus``."""
StreamEvent = Literal["stream-started", "stream-stopped", "stream-error"]
"""A ``<Stream statusCallback>``'s ``StreamEvent`` (UNCONFIRMED in Twilio's own table,
plan §1.1)."""
ENDED: frozenset[str] = frozenset({"completed", "busy", "failed", "no-answer", "canceled"})
"""The ``CallStatus`` values of a call that is over."""


@attrs.frozen
class Status:
    """A status POST: its call, its ``CallStatus`` and ``StreamEvent`` (each one of
    the known values, ``"other"`` for one that is not, None without one: a label set
    that stays fixed), and whether the call is over (``ended``)."""

    call: Call
    call_status: CallStatus | Literal["other"] | None
    stream_event: StreamEvent | Literal["other"] | None

    @property
    def ended(self) -> bool:
        return self.call_status in ENDED


def status_of(params: Sequence[tuple[str, str]], account_sid: str | None) -> Status | Refusal:
    """What a (signed) status POST says (``call_of``'s refusals)."""
    call = call_of(params, account_sid)
    if isinstance(call, Refusal):
        return call
    status, event = form_value(params, "CallStatus"), form_value(params, "StreamEvent")
    known_status: CallStatus | Literal["other"] | None = None
    if status is not None:
        known_status = next((s for s in get_args(CallStatus) if s == status), "other")
    known_event: StreamEvent | Literal["other"] | None = None
    if event is not None:
        known_event = next((e for e in get_args(StreamEvent) if e == event), "other")
    return Status(call, known_status, known_event)


# -- answers ----------------------------------------------------------------------------------


def twiml_response(document: str) -> bytes:
    """200 with a TwiML document (``twilio/twiml.py``'s)."""
    return http_response(200, [], document.encode("utf-8"), "text/xml; charset=utf-8")


def empty_response() -> bytes:
    """204: a status POST taken (Twilio reads nothing of the answer but its status)."""
    return http_response(204, [])


def refusal_response(refusal: Refusal) -> bytes:
    """A refusal: its fixed text, ``text/plain``."""
    return http_response(refusal.status, [], refusal.body, "text/plain; charset=utf-8")


__all__ = [
    "DEFAULT_PATH",
    "ENDED",
    "FORM_TYPE",
    "MAX_FORM_PAIRS",
    "MAX_WEBHOOK_BYTES",
    "SETTINGS_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_REFUSAL",
    "Call",
    "CallStatus",
    "Endpoint",
    "Status",
    "StreamEvent",
    "WebhookHead",
    "call_of",
    "candidates",
    "empty_response",
    "expected_signature",
    "form_value",
    "is_twilio_head",
    "parse_form",
    "parse_head",
    "presented_signature",
    "refusal_response",
    "signature_valid",
    "status_of",
    "twiml_response",
]
