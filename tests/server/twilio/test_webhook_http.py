"""front/twilio.py's HTTP of the webhooks: which heads are theirs, the head and the form
parsed (strictly, fuzzed: a list or a fixed-text Refusal, never a traceback), the SIDs a
webhook names, and the answers."""

from __future__ import annotations

import re
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.server.front import twilio as front
from trio_duplex.server.front.client_secrets import Refusal
from trio_duplex.server.front.twilio import (
    MAX_FORM_PAIRS,
    MAX_WEBHOOK_BYTES,
    SIGNATURE_REFUSAL,
    Call,
    Status,
    WebhookHead,
    call_of,
    empty_response,
    form_value,
    is_twilio_head,
    parse_form,
    parse_head,
    presented_signature,
    refusal_response,
    status_of,
    twiml_response,
)

ACCOUNT = "AC" + "0123456789abcdef" * 2
CALL = "CA" + "fedcba9876543210" * 2
SIGNATURE = "TnqNpygQtUPfrEym+GDskjZKcpA="
FORM = "Content-Type: application/x-www-form-urlencoded"
VOICE = [  # a voice webhook's fields (Twilio's docs)
    ("AccountSid", ACCOUNT),
    ("ApiVersion", "2010-04-01"),
    ("CallSid", CALL),
    ("CallStatus", "ringing"),
    ("Direction", "inbound"),
    ("From", "+15551234567"),
    ("To", "+15557654321"),
]
FIXED = {value.body for value in vars(front).values() if isinstance(value, Refusal)} | {
    value.body for value in front._HEAD_FAULTS.values()
}
"""Every refusal front/twilio.py can give: fixed text, made at import."""


def request(target: str, *headers: str, length: int | None = 0, method: str = "POST") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: voice.example.com", *headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def refused(found: object, status: int) -> bytes:
    assert isinstance(found, Refusal), found
    assert found.status == status
    assert found.body in FIXED
    return found.body


# -- which heads ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "path", "ours"),
    [
        ("POST /v1/twilio/twiml HTTP/1.1", "/v1/twilio", True),
        ("POST /v1/twilio/twiml?resume=1&attempt=2&t=5 HTTP/1.1", "/v1/twilio", True),
        ("POST /v1/twilio/status HTTP/1.1", "/v1/twilio", True),
        ("POST /phone/twiml HTTP/1.1", "/phone", True),
        ("POST /v1/twilio/twiml HTTP/1.1", "/phone", False),
        ("POST /v1/twilio/twiml HTTP/1.1", "", False),
        ("GET /v1/twilio/twiml HTTP/1.1", "/v1/twilio", False),
        ("GET /v1/twilio HTTP/1.1", "/v1/twilio", False),  # the upgrade: the router's
        ("POST /v1/twilio HTTP/1.1", "/v1/twilio", False),
        ("POST /v1/twilio/twimlx HTTP/1.1", "/v1/twilio", False),
        ("POST /v1/twilio/statuses HTTP/1.1", "/v1/twilio", False),
        ("post /v1/twilio/twiml HTTP/1.1", "/v1/twilio", False),
    ],
)
def test_which_heads_are_the_webhooks(line: str, path: str, ours: bool) -> None:
    assert is_twilio_head(line.encode() + b"\r\nHost: x\r\n\r\n", path) == ours


# -- the head ---------------------------------------------------------------------------------


def test_a_webhooks_head() -> None:
    raw = request(
        "/v1/twilio/twiml?resume=1&attempt=2&t=5&x=%2F",
        FORM + "; charset=UTF-8",
        f"X-Twilio-Signature: {SIGNATURE}",
        length=812,
    )
    head = parse_head(raw)
    assert isinstance(head, WebhookHead), head
    assert head.endpoint == "twiml"
    assert head.path == "/v1/twilio/twiml"
    assert head.raw_query == "resume=1&attempt=2&t=5&x=%2F"
    assert head.query == {"resume": ["1"], "attempt": ["2"], "t": ["5"], "x": ["/"]}
    assert head.length == 812
    assert head.signature == SIGNATURE
    assert SIGNATURE not in repr(head)
    status = parse_head(request("/phone/status", FORM), "/phone")
    assert isinstance(status, WebhookHead)
    assert (status.endpoint, status.raw_query, status.query, status.signature) == (
        "status",
        None,
        {},
        None,
    )
    bare = parse_head(request("/v1/twilio/status?", FORM))
    assert isinstance(bare, WebhookHead) and bare.raw_query == ""


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (request("/v1/twilio/twiml", FORM, method="GET"), 404),
        (request("/v1/twilio/other", FORM), 404),
        (request("/v1/twilio", FORM), 404),
        (request("/v1/twilio/twiml", FORM, length=None), 400),
        (request("/v1/twilio/twiml", FORM, "Content-Length: 5"), 400),
        (request("/v1/twilio/twiml", FORM, length=MAX_WEBHOOK_BYTES + 1), 413),
        (request("/v1/twilio/twiml", length=10), 415),
        (request("/v1/twilio/twiml", "Content-Type: application/json", length=10), 415),
        (request("/v1/twilio/twiml", FORM + "; charset=latin-1", length=10), 415),
        (request("/v1/twilio/twiml", FORM, FORM, length=10), 415),
        (request("/v1/twilio/twiml", FORM, "Transfer-Encoding: chunked"), 400),
        (request("/v1/twilio/twiml", FORM, "Host: twice"), 400),
        (request("/v1/twilio/twiml", FORM, "X-Twilio-Signature: a", "X-Twilio-Signature: b"), 400),
        (
            request(
                "/v1/twilio/twiml",
                FORM,
                "X-Twilio-Signature: a",
                "X-Twilio-Webhooks-Signature-Settings: key=k,algorithm=HMAC_SHA256",
            ),
            403,
        ),
        (b"POST /v1/twilio/twiml HTTP/1.1\r\nBad header\r\n\r\n", 400),
        (b"POST /v1/twilio/twiml#x HTTP/1.1\r\n\r\n", 400),
        (b"\x16\x03\x01garbage\r\n\r\n", 400),
    ],
)
def test_heads_refused(raw: bytes, status: int) -> None:
    refused(parse_head(raw), status)


def test_the_limits_are_the_plans() -> None:
    assert MAX_WEBHOOK_BYTES == 16 * 1024
    assert MAX_FORM_PAIRS == 256
    head = parse_head(request("/v1/twilio/twiml", FORM, length=MAX_WEBHOOK_BYTES))
    assert isinstance(head, WebhookHead)


def test_presented_signature_for_the_upgrade() -> None:
    from websockets.datastructures import Headers

    assert presented_signature(Headers()) is None
    assert presented_signature(Headers({"x-twilio-signature": "abc"})) == "abc"
    refused(presented_signature(Headers({"X-Twilio-Webhooks-Signature-Settings": ""})), 403)


header_lines = st.one_of(
    st.sampled_from(
        [
            FORM,
            "Content-Type: application/json",
            "Content-Length: 12",
            "Content-Length: 99999",
            "Content-Length: ²",
            f"X-Twilio-Signature: {SIGNATURE}",
            "X-Twilio-Webhooks-Signature-Settings: algorithm=HMAC_SHA256",
            "Transfer-Encoding: chunked",
            "Host: x",
        ]
    ),
    st.text(max_size=40),
)
targets = st.sampled_from(
    ["/v1/twilio/twiml", "/v1/twilio/status", "/v1/twilio/twiml?resume=1", "/x"]
) | st.text(max_size=30)


@given(
    st.binary(max_size=300)
    | st.builds(
        lambda method, target, lines: (
            f"{method} {target} HTTP/1.1\r\n" + "".join(line + "\r\n" for line in lines) + "\r\n"
        ).encode("utf-8", "surrogatepass"),
        st.sampled_from(["POST", "GET", "PUT", "POST "]),
        targets,
        st.lists(header_lines, max_size=6),
    )
)
def test_parse_head_fuzzed(raw: bytes) -> None:
    found = parse_head(raw)
    if isinstance(found, Refusal):
        assert found.status in (400, 403, 404, 413, 415)
        assert found.body in FIXED
    else:
        assert isinstance(found, WebhookHead)
        assert found.endpoint in ("twiml", "status")
        assert 0 <= found.length <= MAX_WEBHOOK_BYTES


# -- the form ---------------------------------------------------------------------------------


def test_a_voice_webhooks_form() -> None:
    body = urlencode(VOICE).encode()
    assert parse_form(body) == VOICE
    assert parse_form(b"") == []
    assert parse_form(b"a=1&&a=2&b&c=&=d&e=f=g&+=%20+") == [
        ("a", "1"),
        ("a", "2"),
        ("b", ""),
        ("c", ""),
        ("", "d"),
        ("e", "f=g"),
        (" ", "  "),
    ]
    assert parse_form(b"CallerName=J%C3%BCrgen%20%E2%98%8E") == [("CallerName", "Jürgen ☎")]


@pytest.mark.parametrize(
    "body",
    [
        b"a=%",
        b"a=%4",
        b"a=%zz",
        b"%g0=1",
        b"a=%ff",  # not UTF-8
        b"a=%ed%a0%80",  # an encoded surrogate: not UTF-8
        b"a=b c",
        b"a=\xc3\xa9",  # raw bytes, not encoded
        b"a=1\r\n",
        b"a=1\x00",
        b"a=1;b=2\t",
    ],
)
def test_forms_refused(body: bytes) -> None:
    refused(parse_form(body), 400)


def test_form_bounds() -> None:
    most = b"&".join(b"a=%d" % i for i in range(MAX_FORM_PAIRS))
    parsed = parse_form(most)
    assert isinstance(parsed, list) and len(parsed) == MAX_FORM_PAIRS
    refused(parse_form(most + b"&b=1"), 413)
    assert parse_form(most + b"&&&") == parsed  # empty pairs are not pairs
    refused(parse_form(b"a=" + b"x" * MAX_WEBHOOK_BYTES), 413)


pairs = st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=20)


@given(pairs)
def test_forms_round_trip(items: list[tuple[str, str]]) -> None:
    # As an HTTP client encodes a form (quote_plus), and with %20 and a raw "=" in values.
    assert parse_form(urlencode(items).encode()) == items
    percent = "&".join(quote(n, safe="") + "=" + quote(v, safe="=") for n, v in items)
    assert parse_form(percent.encode()) == items


@given(
    st.binary(max_size=400)
    | st.lists(
        st.sampled_from(
            [b"a", b"=", b"&", b"%", b"%4", b"%41", b"%ff", b"%c3%a9", b"+", b" ", b"\x80"]
        ),
        max_size=40,
    ).map(b"".join)
)
def test_parse_form_fuzzed(body: bytes) -> None:
    found = parse_form(body)
    if isinstance(found, Refusal):
        assert found.status in (400, 413)
        assert found.body in FIXED
    else:
        assert len(found) <= MAX_FORM_PAIRS
        for name, value in found:
            name.encode("utf-8")  # strict: no surrogate got through
            value.encode("utf-8")


# -- what a webhook names ---------------------------------------------------------------------


def test_the_call_a_webhook_names() -> None:
    assert call_of(VOICE, None) == Call(ACCOUNT, CALL)
    assert call_of(VOICE, ACCOUNT) == Call(ACCOUNT, CALL)
    refused(call_of(VOICE, "AC" + "f" * 32), 403)
    assert form_value(VOICE, "From") == "+15551234567"
    assert form_value([*VOICE, ("From", "x")], "From") is None
    assert form_value(VOICE, "Nope") is None
    for broken in (
        [p for p in VOICE if p[0] != "CallSid"],
        [p for p in VOICE if p[0] != "AccountSid"],
        [*VOICE, ("CallSid", CALL)],
        [(n, v.upper() if n == "CallSid" else v) for n, v in VOICE],
        [(n, v + "0" if n == "AccountSid" else v) for n, v in VOICE],
    ):
        refused(call_of(broken, None), 400)
        refused(call_of(broken, ACCOUNT), 400)


@pytest.mark.parametrize(
    ("fields", "call_status", "stream_event", "ended"),
    [
        ([("CallStatus", "completed")], "completed", None, True),
        ([("CallStatus", "no-answer")], "no-answer", None, True),
        ([("CallStatus", "in-progress")], "in-progress", None, False),
        ([("CallStatus", "<script>")], "other", None, False),
        ([("StreamEvent", "stream-stopped")], None, "stream-stopped", False),
        ([("StreamEvent", "stream-error"), ("StreamError", "x")], None, "stream-error", False),
        ([("StreamEvent", "STREAM-STARTED")], None, "other", False),
        ([], None, None, False),
    ],
)
def test_a_status_post(
    fields: list[tuple[str, str]], call_status: str | None, stream_event: str | None, ended: bool
) -> None:
    base = [("AccountSid", ACCOUNT), ("CallSid", CALL)]
    found = status_of(base + fields, ACCOUNT)
    assert found == Status(Call(ACCOUNT, CALL), call_status, stream_event)  # type: ignore[arg-type]
    assert isinstance(found, Status) and found.ended == ended
    refused(status_of(fields, None), 400)


# -- answers ----------------------------------------------------------------------------------


def split(response: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, headers, body


def test_answers() -> None:
    status, headers, body = split(twiml_response("<Response>é</Response>"))
    assert status == "HTTP/1.1 200 OK"
    assert headers["Content-Type"] == "text/xml; charset=utf-8"
    assert (
        headers["Content-Length"] == str(len(body)) == str(len("<Response>é</Response>".encode()))
    )
    assert headers["Connection"] == "close"
    status, headers, body = split(empty_response())
    assert status == "HTTP/1.1 204 No Content"
    assert "Content-Length" not in headers and body == b""
    for refusal, line in [
        (SIGNATURE_REFUSAL, "HTTP/1.1 403 Forbidden"),
        (parse_form(b"%"), "HTTP/1.1 400 Bad Request"),
        (parse_head(request("/nope", FORM)), "HTTP/1.1 404 Not Found"),
        (
            parse_head(request("/v1/twilio/twiml", FORM, length=10**6)),
            "HTTP/1.1 413 Content Too Large",
        ),
        (parse_head(request("/v1/twilio/twiml", length=3)), "HTTP/1.1 415 Unsupported Media Type"),
    ]:
        assert isinstance(refusal, Refusal)
        status, headers, body = split(refusal_response(refusal))
        assert status == line
        assert headers["Content-Type"] == "text/plain; charset=utf-8"
        assert headers["Connection"] == "close"
        assert body == refusal.body and body.endswith(b"\n")
        assert re.fullmatch(rb"[a-zA-Z0-9 ,.'/_-]+\n", body)
