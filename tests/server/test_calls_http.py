"""front/calls.py: the call endpoints' HTTP, sans-IO: which heads are theirs, how a
head and a call's body are read (both of openai-python's forms, as its own client
encodes them), what each request is, and the answers with their CORS headers.

openai-python's requests are captured whole, offline: an ``openai.OpenAI`` on an
``httpx2.MockTransport`` (the SDK's HTTP client, 3.60 here), turned back into the bytes
the door reads."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from trio_duplex.server.front.calls import (
    CALLS_PATH,
    CallRequest,
    Hangup,
    Head,
    Preflight,
    classify,
    cors_headers,
    created_response,
    hangup_response,
    is_calls_head,
    new_call_id,
    parse_call,
    parse_head,
    preflight_response,
    refusal_response,
)
from trio_duplex.server.front.client_secrets import Refusal, error

from .calls.offers import CHROMIUM

CALL_ID = "rtc_" + "0123456789abcdef" * 2
MAX_SDP, MAX_SESSION = 64 * 1024, 16 * 1024
ORIGIN = "https://app.example"


def request(method: str, target: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: calls.example", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head_of(raw: bytes) -> Head:
    head = parse_head(raw)
    assert isinstance(head, Head), head
    return head


def refused(found: object) -> tuple[int, dict[str, Any]]:
    assert isinstance(found, Refusal), found
    body: dict[str, Any] = json.loads(found.body)["error"]
    return found.status, body


# -- which heads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        f"POST {CALLS_PATH} HTTP/1.1",
        f"POST {CALLS_PATH}?model=gpt-realtime HTTP/1.1",
        f"OPTIONS {CALLS_PATH} HTTP/1.1",
        f"DELETE {CALLS_PATH}/{CALL_ID} HTTP/1.1",
        f"POST {CALLS_PATH}/{CALL_ID}/hangup HTTP/1.1",
        f"OPTIONS {CALLS_PATH}/{CALL_ID}/hangup HTTP/1.1",
    ],
)
def test_the_call_endpoints_heads_are_theirs(line: str) -> None:
    assert is_calls_head(line.encode() + b"\r\nHost: x\r\n\r\n")


@pytest.mark.parametrize(
    "line",
    [
        f"GET {CALLS_PATH} HTTP/1.1",  # a WebSocket's, or a page's
        f"PUT {CALLS_PATH} HTTP/1.1",
        f"post {CALLS_PATH} HTTP/1.1",
        f"POST {CALLS_PATH}x HTTP/1.1",
        f"POST {CALLS_PATH}_x HTTP/1.1",
        "POST /v1/realtime/client_secrets HTTP/1.1",
        "POST /v1/realtime HTTP/1.1",
        f"POST  {CALLS_PATH} HTTP/1.1",
        f" POST {CALLS_PATH} HTTP/1.1",
    ],
)
def test_other_heads_are_not(line: str) -> None:
    assert not is_calls_head(line.encode() + b"\r\nHost: x\r\n\r\n")


# -- heads -----------------------------------------------------------------------------------


def test_a_head_is_parsed_with_its_query_headers_and_length() -> None:
    raw = request(
        "POST",
        f"{CALLS_PATH}?model=gpt-realtime&resume=sess_1&x=",
        "Authorization: Bearer ek_abc",
        "Content-Type: application/sdp",
        body=b"12345",
    )
    head = head_of(raw)
    assert (head.method, head.path, head.length) == ("POST", CALLS_PATH, 5)
    assert head.query == {"model": ["gpt-realtime"], "resume": ["sess_1"], "x": [""]}
    assert head.headers["authorization"] == "Bearer ek_abc"
    assert "ek_abc" not in repr(head)
    # Without the blank line too, and OPTIONS/DELETE without a length are 0.
    assert head_of(raw.removesuffix(b"\r\n\r\n")).length == 5
    assert head_of(request("DELETE", f"{CALLS_PATH}/{CALL_ID}")).length == 0
    assert head_of(request("OPTIONS", CALLS_PATH, "Content-Length: 0")).length == 0
    # A hang-up's POST has no body: curl -X POST sends no Content-Length for it.
    assert head_of(request("POST", f"{CALLS_PATH}/{CALL_ID}/hangup")).length == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /v1/realtime/calls\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/2\r\n\r\n",
        b"POST  /v1/realtime/calls HTTP/1.1\r\n\r\n",
        b"P(ST /v1/realtime/calls HTTP/1.1\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\nHost x\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\nHo st: x\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\n folded: x\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\nHost: a\nb\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\nHost: a\rb\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\nHost: a\x00\r\n\r\n",
        b"POST /v1/realtime/calls HTTP/1.1\r\n" + b"X: y\r\n" * 129 + b"\r\n",
    ],
)
def test_a_head_that_is_not_http_is_400(raw: bytes) -> None:
    status, body = refused(parse_head(raw))
    assert status == 400 and body["message"] == "not a valid HTTP/1.1 request"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (request("POST", "v1/realtime/calls"), "not a valid request target"),
        (request("POST", "http://x/v1/realtime/calls"), "not a valid request target"),
        (request("POST", f"{CALLS_PATH}#x"), "not a valid request target"),
        (request("POST", "/v1/realtime/calls/\u00e9"), "not a valid request target"),
        (
            request("POST", CALLS_PATH, "Host: y"),
            "Host, Origin and Authorization may be sent once each",
        ),
        (
            request("POST", CALLS_PATH, "Origin: a", "origin: b"),
            "Host, Origin and Authorization may be sent once each",
        ),
        (
            request("POST", CALLS_PATH, "Authorization: Bearer a", "Authorization: Bearer b"),
            "Host, Origin and Authorization may be sent once each",
        ),
        (
            request("POST", CALLS_PATH, "Transfer-Encoding: chunked"),
            "transfer codings are not supported",
        ),
        (request("POST", CALLS_PATH), "a body needs one Content-Length, in digits"),
        (
            request("POST", CALLS_PATH, "Content-Length: \u00b2"),
            "a body needs one Content-Length, in digits",
        ),
        (
            request("POST", CALLS_PATH, "Content-Length: -1"),
            "a body needs one Content-Length, in digits",
        ),
        (
            request("POST", CALLS_PATH, "Content-Length: 1, 1"),
            "a body needs one Content-Length, in digits",
        ),
        (
            request("POST", CALLS_PATH, "Content-Length: " + "9" * 17),
            "a body needs one Content-Length, in digits",
        ),
        (
            request("POST", CALLS_PATH, "Content-Length: 1", "Content-Length: 1"),
            "a body needs one Content-Length, in digits",
        ),
        (
            request("DELETE", CALLS_PATH, "Content-Length: x"),
            "a body needs one Content-Length, in digits",
        ),
    ],
)
def test_a_bad_head_is_400_in_fixed_words(raw: bytes, message: str) -> None:
    status, body = refused(parse_head(raw))
    assert (status, body["message"], body["type"]) == (400, message, "invalid_request_error")


# -- what a request is ----------------------------------------------------------------------


def test_a_preflight_needs_an_origin_and_may_ask_for_the_private_network() -> None:
    asked = "Access-Control-Request-Private-Network: true"
    for path in (CALLS_PATH, f"{CALLS_PATH}/{CALL_ID}", f"{CALLS_PATH}/{CALL_ID}/hangup"):
        plain = classify(head_of(request("OPTIONS", path, f"Origin: {ORIGIN}")))
        assert plain == Preflight(ORIGIN, False)
        private = classify(head_of(request("OPTIONS", path, f"Origin: {ORIGIN}", asked)))
        assert private == Preflight(ORIGIN, True)
    not_true = "Access-Control-Request-Private-Network: false"
    assert classify(head_of(request("OPTIONS", CALLS_PATH, f"Origin: {ORIGIN}", not_true))) == (
        Preflight(ORIGIN, False)
    )
    status, body = refused(classify(head_of(request("OPTIONS", CALLS_PATH))))
    assert (status, body["message"]) == (400, "a preflight request needs an Origin")


def test_hangups_and_calls_are_told_apart() -> None:
    auth = "Authorization: Bearer rt_secret"
    delete = classify(head_of(request("DELETE", f"{CALLS_PATH}/{CALL_ID}", auth)))
    assert delete == Hangup(CALL_ID, "rt_secret") and "rt_secret" not in repr(delete)
    hangup = request("POST", f"{CALLS_PATH}/{CALL_ID}/hangup?x=1", body=b"{}")
    assert classify(head_of(hangup)) == Hangup(CALL_ID, None)
    assert classify(head_of(request("POST", CALLS_PATH, body=b"v=0"))) == "call"
    assert classify(head_of(request("POST", f"{CALLS_PATH}?model=m", body=b"v=0"))) == "call"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", CALLS_PATH),
        ("PUT", CALLS_PATH),
        ("DELETE", CALLS_PATH),
        ("POST", f"{CALLS_PATH}/"),
        ("POST", f"{CALLS_PATH}/{CALL_ID}"),
        ("DELETE", f"{CALLS_PATH}/{CALL_ID}/hangup"),
        ("POST", f"{CALLS_PATH}/{CALL_ID}/hangup/"),
        ("POST", f"{CALLS_PATH}/{CALL_ID}/accept"),
        ("DELETE", f"{CALLS_PATH}/{CALL_ID.upper()}"),
        ("DELETE", f"{CALLS_PATH}/{CALL_ID}0"),
        ("DELETE", f"{CALLS_PATH}/{CALL_ID[:-1]}"),
        ("DELETE", f"{CALLS_PATH}/sess_{CALL_ID[4:]}"),
        ("DELETE", f"{CALLS_PATH}/rtc_{CALL_ID[4:-1]}g"),
        ("POST", "/v1/realtime"),
        ("POST", "/v1/realtime/callsx"),
    ],
)
def test_anything_else_on_the_call_paths_is_404(method: str, path: str) -> None:
    status, body = refused(classify(head_of(request(method, path, body=b"x"))))
    assert (status, body["message"], body["code"]) == (404, "no such endpoint", "not_found")


def test_the_sdks_hangup_is_a_hangup() -> None:
    sent = sdk(lambda client: client.realtime.calls.hangup(CALL_ID))
    head, body = as_read(sent)
    assert (head.length, body) == (0, b"")
    assert classify(head) == Hangup(CALL_ID, "ek_test-secret")


def test_call_ids_are_rtc_and_32_hex_digits_each_new() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"rtc_[0-9a-f]{32}", i) for i in ids)
    one = next(iter(ids))
    assert classify(head_of(request("DELETE", f"{CALLS_PATH}/{one}"))) == Hangup(one, None)


# -- a call's body: openai-python's two forms ------------------------------------------------


def sdk(call: Callable[[openai.OpenAI], object]) -> httpx2.Request:
    """The request openai-python sends for ``call(client)``, captured (nothing is sent)."""
    seen: list[httpx2.Request] = []

    def handler(sent: httpx2.Request) -> httpx2.Response:
        seen.append(sent)
        return httpx2.Response(201, headers={"Content-Type": "application/sdp"}, content=b"v=0")

    client = openai.OpenAI(
        api_key="ek_test-secret",
        base_url="http://127.0.0.1:9/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    call(client)
    (sent,) = seen
    return sent


def sdk_request(**create: Any) -> httpx2.Request:
    """The request openai-python's ``realtime.calls.create(**create)`` sends."""
    return sdk(lambda client: client.realtime.calls.create(**create))


def as_read(sent: httpx2.Request) -> tuple[Head, bytes]:
    """What the door reads of a request: its head, parsed, and its body."""
    body = sent.read()
    lines = [f"{sent.method} {sent.url.raw_path.decode('ascii')} HTTP/1.1"]
    lines += [f"{name.decode()}: {value.decode()}" for name, value in sent.headers.raw]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
    assert is_calls_head(raw)
    head = head_of(raw)
    assert head.length == len(body)
    return head, body


def call_of(head: Head, body: bytes, sdp: int = MAX_SDP, session: int = MAX_SESSION) -> object:
    assert classify(head) == "call"
    return parse_call(head, body, max_sdp_bytes=sdp, max_session_bytes=session)


def test_the_sdks_offer_alone_is_sent_as_application_sdp() -> None:
    head, body = as_read(sdk_request(sdp=CHROMIUM))
    assert head.headers["Content-Type"] == "application/sdp"
    call = call_of(head, body)
    assert call == CallRequest(CHROMIUM.encode(), None, {}, "ek_test-secret")
    assert "ek_test-secret" not in repr(call) and "ice-pwd" not in repr(call)


def test_the_sdks_offer_and_session_are_sent_as_a_multipart_form() -> None:
    session = {"type": "realtime", "instructions": "be brief", "audio": {"output": {"voice": "x"}}}
    head, body = as_read(sdk_request(sdp=CHROMIUM, session=session))
    assert head.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    call = call_of(head, body)
    assert call == CallRequest(CHROMIUM.encode(), session, {}, "ek_test-secret")


def test_the_sdks_explicit_null_session_is_no_session() -> None:
    head, body = as_read(sdk_request(sdp=CHROMIUM, session=None))
    assert head.headers["Content-Type"].startswith("multipart/form-data")
    call = call_of(head, body)
    assert (
        isinstance(call, CallRequest) and call.session is None and call.offer == CHROMIUM.encode()
    )


def test_a_resume_and_its_seq_come_from_the_query_and_other_keys_are_ignored() -> None:
    query = {
        "model": "gpt-realtime",
        "resume": "sess_42",
        "last_received_server_event_seq": "17",
        "unknown": "x",
    }
    sent = sdk_request(sdp=CHROMIUM, extra_query=query)
    head, body = as_read(sent)
    call = call_of(head, body)
    assert isinstance(call, CallRequest)
    assert (call.resume, call.last_seq, call.query["model"]) == ("sess_42", 17, ["gpt-realtime"])
    head, body = as_read(sdk_request(sdp=CHROMIUM, extra_query={"resume": "sess_42"}))
    call = call_of(head, body)
    assert isinstance(call, CallRequest) and (call.resume, call.last_seq) == ("sess_42", None)


def form_b(parts: list[tuple[str, bytes, str]], **extra: Any) -> tuple[Head, bytes]:
    """A multipart form as httpx encodes it (openai-python's ``files``)."""
    sent = httpx2.Request(
        "POST",
        f"http://calls.example{CALLS_PATH}",
        files=[(name, (None, data, media)) for name, data, media in parts],
        **extra,
    )
    return as_read(sent)


def test_a_form_with_other_parts_and_curls_filenames_is_taken() -> None:
    head, body = form_b(
        [
            ("note", b"ignored", "text/plain"),
            ("sdp", CHROMIUM.encode(), "application/octet-stream"),
            ("session", b'{"type":"realtime"}', "application/json"),
        ]
    )
    call = call_of(head, body)
    assert isinstance(call, CallRequest)
    assert call.offer == CHROMIUM.encode() and call.session == {"type": "realtime"}
    # curl -F sdp=@offer.sdp: a filename, a preamble, a quoted boundary, padding.
    boundary = "----curl-7d0e1f"
    curl = (
        f"preamble\r\n--{boundary}  \r\n"
        'Content-Disposition: form-data; name="sdp"; filename="offer.sdp"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
        f"{CHROMIUM}\r\n--{boundary}--\r\nepilogue"
    ).encode()
    raw = request(
        "POST", CALLS_PATH, f'Content-Type: multipart/form-data; boundary="{boundary}"', body=curl
    )
    call = call_of(head_of(raw), curl)
    assert isinstance(call, CallRequest) and call.offer == CHROMIUM.encode()


def sdp_post(media: str, body: bytes, target: str = CALLS_PATH) -> Head:
    return head_of(request("POST", target, f"Content-Type: {media}", body=body))


def test_application_sdp_takes_parameters_and_any_case() -> None:
    head = sdp_post("Application/SDP; charset=utf-8", b"v=0\r\n")
    call = call_of(head, b"v=0\r\n")
    assert isinstance(call, CallRequest) and call.offer == b"v=0\r\n" and call.bearer is None


def test_an_offer_or_a_session_over_its_bound_is_413() -> None:
    offer = CHROMIUM.encode()
    call = call_of(sdp_post("application/sdp", offer), offer, sdp=len(offer))
    assert isinstance(call, CallRequest)
    status, body = refused(call_of(sdp_post("application/sdp", offer), offer, sdp=len(offer) - 1))
    assert (status, body["message"], body["param"]) == (413, "the SDP offer is too large", "sdp")
    head, form = form_b([("sdp", offer, "application/sdp")])
    assert refused(call_of(head, form, sdp=len(offer) - 1))[0] == 413
    session = b'{"type":"realtime"}'
    head, form = form_b(
        [("sdp", offer, "application/sdp"), ("session", session, "application/json")]
    )
    assert isinstance(call_of(head, form, session=len(session)), CallRequest)
    status, body = refused(call_of(head, form, session=len(session) - 1))
    assert (status, body["message"]) == (413, "the session part is too large")


@pytest.mark.parametrize(
    "media",
    ["text/plain", "application/json", "application/sdpx", "multipart/mixed; boundary=x", ""],
)
def test_a_body_of_another_type_is_415(media: str) -> None:
    head = sdp_post(media, b"v=0")
    status, body = refused(call_of(head, b"v=0"))
    assert status == 415 and body["code"] == "unsupported_media_type"
    no_type = head_of(request("POST", CALLS_PATH, body=b"v=0"))
    assert refused(call_of(no_type, b"v=0"))[0] == 415
    two = head_of(
        request(
            "POST",
            CALLS_PATH,
            "Content-Type: application/sdp",
            "Content-Type: text/plain",
            body=b"v",
        )
    )
    assert refused(call_of(two, b"v"))[0] == 415


BOUNDARY = "b0undary"
OK_PART = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="sdp"\r\n\r\nv=0\r\n'
END = f"\r\n--{BOUNDARY}--"


@pytest.mark.parametrize(
    ("media", "body", "message"),
    [
        (
            "multipart/form-data",
            OK_PART + f"--{BOUNDARY}--\r\n",
            "a multipart body needs a valid boundary",
        ),
        ("multipart/form-data; boundary=", OK_PART, "a multipart body needs a valid boundary"),
        (
            "multipart/form-data; boundary=" + "x" * 71,
            OK_PART,
            "a multipart body needs a valid boundary",
        ),
        (
            "multipart/form-data; boundary=a; boundary=b",
            OK_PART,
            "a multipart body needs a valid boundary",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            OK_PART,
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            "v=0\r\n",
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            f'--{BOUNDARY}\r\nContent-Disposition: attachment; name="sdp"\r\n\r\nv=0' + END,
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name=sdp"\r\n\r\nv=0' + END,
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            f"--{BOUNDARY}\r\n\r\nv=0\r\n--{BOUNDARY}--",
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            f"--{BOUNDARY}x\r\nContent-Disposition: form-data; name=sdp\r\n\r\nv=0" + END,
            "the body is not valid multipart/form-data",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="session"\r\n\r\n{{}}' + END,
            "the multipart body has no sdp part",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            OK_PART + OK_PART + f"--{BOUNDARY}--\r\n",
            "the multipart body holds a part twice",
        ),
        (
            f"multipart/form-data; boundary={BOUNDARY}",
            OK_PART * 20 + f"--{BOUNDARY}--\r\n",
            "the body is not valid multipart/form-data",
        ),
    ],
)
def test_a_bad_form_is_400(media: str, body: str, message: str) -> None:
    status, found = refused(call_of(sdp_post(media, body.encode()), body.encode()))
    assert (status, found["message"]) == (400, message)


@pytest.mark.parametrize(
    ("session", "message"),
    [
        (b"[]", "the session part must be a JSON object"),
        (b"{", "the session part must be a JSON object"),
        (b'{"type": "realtime", "x": NaN}', "the session part must be a JSON object"),
        (b"\xff{}", "the session part must be a JSON object"),
        (b'{"a":' * 200 + b"1" + b"}" * 200, "the session part must be a JSON object"),
        (b"{}", 'session.type must be "realtime"'),
        (b'{"type": "transcription"}', 'session.type must be "realtime"'),
    ],
)
def test_a_bad_session_part_is_400(session: bytes, message: str) -> None:
    head, form = form_b(
        [("sdp", b"v=0", "application/sdp"), ("session", session, "application/json")]
    )
    status, found = refused(call_of(head, form))
    assert (status, found["message"]) == (400, message)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("resume=", "resume"),
        ("resume=a&resume=b", "resume"),
        ("last_received_server_event_seq=3", "last_received_server_event_seq"),
        ("resume=s&last_received_server_event_seq=-1", "last_received_server_event_seq"),
        ("resume=s&last_received_server_event_seq=x", "last_received_server_event_seq"),
        ("resume=s&last_received_server_event_seq=", "last_received_server_event_seq"),
        ("resume=s&last_received_server_event_seq=%C2%B2", "last_received_server_event_seq"),
        (
            "resume=s&last_received_server_event_seq=1&last_received_server_event_seq=2",
            "last_received_server_event_seq",
        ),
        ("resume=s&last_received_server_event_seq=" + "9" * 19, "last_received_server_event_seq"),
    ],
)
def test_a_bad_resume_query_is_400(query: str, param: str) -> None:
    head = sdp_post("application/sdp", b"v=0", f"{CALLS_PATH}?{query}")
    status, found = refused(call_of(head, b"v=0"))
    assert (status, found["param"]) == (400, param)


def test_a_resume_at_seq_zero_and_a_lowercase_bearer() -> None:
    raw = request(
        "POST",
        f"{CALLS_PATH}?resume=sess_1&last_received_server_event_seq=0",
        "Content-Type: application/sdp",
        "authorization: bearer   rt_tok  ",
        body=b"v=0",
    )
    call = call_of(head_of(raw), b"v=0")
    assert isinstance(call, CallRequest) and (call.last_seq, call.bearer) == (0, "rt_tok")
    basic = request(
        "POST", CALLS_PATH, "Content-Type: application/sdp", "Authorization: Basic x", body=b"v"
    )
    call = call_of(head_of(basic), b"v")
    assert isinstance(call, CallRequest) and call.bearer is None


# -- answers ---------------------------------------------------------------------------------


def parse_response(raw: bytes) -> tuple[int, str, dict[str, list[str]], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *lines = head.decode("latin-1").split("\r\n")
    version, status, phrase = line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, list[str]] = {}
    for header in lines:
        name, _, value = header.partition(": ")
        headers.setdefault(name.lower(), []).append(value)
    if "content-length" in headers:
        assert headers["content-length"] == [str(len(body))]
    assert headers["connection"] == ["close"] and headers["cache-control"] == ["no-store"]
    return int(status), phrase, headers, body


CORS = {
    "access-control-allow-origin": [ORIGIN],
    "vary": ["Origin"],
    "access-control-expose-headers": ["Location"],
}


def test_cors_headers_only_for_an_origin_allowed() -> None:
    cors = cors_headers(ORIGIN, True)
    assert cors == [
        f"Access-Control-Allow-Origin: {ORIGIN}",
        "Vary: Origin",
        "Access-Control-Expose-Headers: Location",
    ]
    assert cors_headers(ORIGIN, False) == [] and cors_headers(None, True) == []
    assert cors_headers("https://a\r\nSet-Cookie: x", True) == []  # never a header injected


def test_the_created_answer_has_its_location_exposed() -> None:
    answer = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\n"
    status, phrase, headers, body = parse_response(
        created_response(answer, CALL_ID, cors_headers(ORIGIN, True))
    )
    assert (status, phrase, body) == (201, "Created", answer.encode())
    assert headers["content-type"] == ["application/sdp"]
    assert headers["location"] == [f"{CALLS_PATH}/{CALL_ID}"]
    assert {name: headers[name] for name in CORS} == CORS
    _, _, plain, _ = parse_response(created_response(answer, CALL_ID, []))
    assert not any(name.startswith("access-control") for name in plain)


@pytest.mark.parametrize(
    ("status", "phrase", "extra"),
    [
        (400, "Bad Request", {}),
        (401, "Unauthorized", {"www-authenticate": ["Bearer"]}),
        (403, "Forbidden", {}),
        (404, "Not Found", {}),
        (413, "Content Too Large", {}),
        (415, "Unsupported Media Type", {}),
        (429, "Too Many Requests", {"retry-after": ["1"]}),
        (503, "Service Unavailable", {"retry-after": ["1"]}),
    ],
)
def test_every_refusal_is_openais_error_with_cors(
    status: int, phrase: str, extra: dict[str, list[str]]
) -> None:
    refusal = Refusal(status, error(status, "a fixed message"))
    raw = refusal_response(refusal, cors_headers(ORIGIN, True))
    found, said, headers, body = parse_response(raw)
    assert (found, said) == (status, phrase)
    assert headers["content-type"] == ["application/json"]
    assert json.loads(body)["error"]["message"] == "a fixed message"
    assert {name: headers[name] for name in CORS} == CORS
    for name in ("www-authenticate", "retry-after"):
        assert headers.get(name) == extra.get(name)


def test_a_hangup_is_200_and_empty() -> None:
    status, phrase, headers, body = parse_response(hangup_response(cors_headers(ORIGIN, True)))
    assert (status, phrase, body, headers["content-length"]) == (200, "OK", b"", ["0"])
    assert {name: headers[name] for name in CORS} == CORS


def test_a_preflight_allowed_gets_204_with_the_permissions() -> None:
    status, phrase, headers, body = parse_response(
        preflight_response(Preflight(ORIGIN, False), True)
    )
    assert (status, phrase, body) == (204, "No Content", b"")
    assert "content-length" not in headers
    assert headers["access-control-allow-origin"] == [ORIGIN]
    assert headers["access-control-allow-methods"] == ["POST, DELETE, OPTIONS"]
    assert headers["access-control-allow-headers"] == [
        "authorization, content-type, x-openai-agents-sdk"
    ]
    assert headers["access-control-max-age"] == ["600"] and headers["vary"] == ["Origin"]
    assert "access-control-allow-private-network" not in headers
    _, _, private, _ = parse_response(preflight_response(Preflight(ORIGIN, True), True))
    assert private["access-control-allow-private-network"] == ["true"]


def test_a_preflight_not_allowed_gets_403_without_cors() -> None:
    for asked in (False, True):
        status, _, headers, body = parse_response(
            preflight_response(Preflight(ORIGIN, asked), False)
        )
        assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
        assert not any(name.startswith("access-control") for name in headers)


# -- fuzz -----------------------------------------------------------------------------------

PIECES = [
    "POST ",
    "OPTIONS ",
    "DELETE ",
    CALLS_PATH,
    f"/{CALL_ID}",
    "/hangup",
    "?resume=s&last_received_server_event_seq=1",
    " HTTP/1.1",
    "\r\n",
    "\n",
    "\r",
    ": ",
    "Host: x\r\n",
    "Origin: https://a\r\n",
    "Content-Length: 3\r\n",
    "Content-Type: application/sdp\r\n",
    f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n",
    "Authorization: Bearer SECRET-TOKEN\r\n",
    "Transfer-Encoding: chunked\r\n",
    "\r\n\r\n",
]


def heads() -> st.SearchStrategy[bytes]:
    pieces = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=20)
    return st.one_of(
        st.binary(max_size=300), pieces.map(lambda p: "".join(p).encode("utf-8", "surrogatepass"))
    )


def bodies() -> st.SearchStrategy[bytes]:
    form = st.lists(
        st.sampled_from(
            [
                OK_PART,
                f"--{BOUNDARY}--\r\n",
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="session"\r\n\r\n',
                '{"type":"realtime"}\r\n',
                "\r\n",
                "x",
            ]
        ),
        max_size=8,
    ).map(lambda parts: "".join(parts).encode())
    return st.one_of(st.binary(max_size=300), form)


@given(raw=heads(), body=bodies())
def test_any_bytes_give_a_request_or_a_refusal_never_an_exception(raw: bytes, body: bytes) -> None:
    head = parse_head(raw)
    if isinstance(head, Refusal):
        assert head.status == 400 and b"SECRET-TOKEN" not in head.body
        return
    assert "SECRET-TOKEN" not in repr(head)
    kind = classify(head)
    assert isinstance(kind, Preflight | Hangup | Refusal) or kind == "call"
    if isinstance(kind, Hangup | Preflight):
        assert "SECRET-TOKEN" not in repr(kind)
    call = parse_call(head, body, max_sdp_bytes=100, max_session_bytes=50)
    if isinstance(call, Refusal):
        assert call.status in (400, 413, 415) and b"SECRET" not in call.body
        json.loads(call.body)
    else:
        assert len(call.offer) <= 100 and "SECRET-TOKEN" not in repr(call)


def requests() -> st.SearchStrategy[tuple[bytes, bytes]]:
    """Well-formed heads of the call paths, their parts drawn, with bodies to match."""
    method = st.sampled_from(["POST"] * 5 + ["OPTIONS", "DELETE", "GET"])  # mostly calls
    others = [f"{CALLS_PATH}/{CALL_ID}", f"{CALLS_PATH}/{CALL_ID}/hangup", f"{CALLS_PATH}/x"]
    path = st.sampled_from([CALLS_PATH] * 6 + others)
    query = st.lists(
        st.sampled_from(
            ["model=m", "resume=sess_1", "resume=", "last_received_server_event_seq=2", "x=%ff"]
        ),
        max_size=3,
    ).map(lambda items: "?" + "&".join(items) if items else "")
    media = st.sampled_from(
        [
            "application/sdp",
            f"multipart/form-data; boundary={BOUNDARY}",
            "multipart/form-data",
            "text/plain",
        ]
    )
    headers = st.lists(
        st.sampled_from(
            [
                "Origin: https://a",
                "Authorization: Bearer SECRET-TOKEN",
                "Access-Control-Request-Private-Network: true",
            ]
        ),
        max_size=3,
        unique=True,
    )

    def build(m: str, p: str, q: str, t: str, h: list[str], body: bytes) -> tuple[bytes, bytes]:
        return request(m, p + q, f"Content-Type: {t}", *h, f"Content-Length: {len(body)}"), body

    return st.builds(build, method, path, query, media, headers, bodies())


@given(sent=requests())
def test_well_formed_requests_give_a_request_or_a_refusal(sent: tuple[bytes, bytes]) -> None:
    raw, body = sent
    assert is_calls_head(raw) == (not raw.startswith(b"GET"))
    head = head_of(raw)
    kind = classify(head)
    if kind != "call":
        assert isinstance(kind, Preflight | Hangup | Refusal)
        return
    call = parse_call(head, body, max_sdp_bytes=100, max_session_bytes=50)
    event("refused" if isinstance(call, Refusal) else "a call")
    if isinstance(call, Refusal):
        assert call.status in (400, 413, 415) and b"SECRET" not in call.body
    else:
        assert call.bearer in (None, "SECRET-TOKEN") and "SECRET-TOKEN" not in repr(call)
        assert call.offer in body  # the whole body, or a form's sdp part
