"""No HTTP request a client can send produces a traceback or an ERROR line: the real
server (``trio-duplex serve``, keys and the demo page on) answers each with a status or
drops it, logs at most a rate-limited INFO line, and goes on serving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..helpers import Serve, ServerProcess, exchange

KEYS = "acme: k-acme-123\n"
TWILIO_TOKEN = "0123456789abcdef0123456789abcdef"
"""Phone calls' endpoints on too (their webhooks' forms, their stream's upgrade)."""
OFFER = (  # a browser's offer (no candidates): Opus audio and a data channel
    "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\na=setup:actpass\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=rtpmap:111 opus/48000/2\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\n"
    "a=sctp-port:5000\r\n"
)


@pytest.fixture(scope="module")
def target(serve_module: Serve, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    keys: Path = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEYS)
    verifier = ("--auth", "tests.server.auth_verifier:verify")  # X-Token: good
    calls = ("--calls", "--call-allow-peer", "127.0.0.0/8")  # the WebRTC calls' endpoints
    twilio = ("--twilio-auth-token", TWILIO_TOKEN, "--twilio-public-url", "http://127.0.0.1")
    return serve_module("--api-key-file", str(keys), "--demo", *verifier, *calls, *twilio)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def healthy(server: ServerProcess) -> None:
    answer = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 200, answer
    log = server.log
    assert "Traceback" not in log and " ERROR " not in log, log


def token_post(length: str, body: bytes = b"{}") -> bytes:
    return (
        "POST /v1/client_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer k-acme-123\r\nContent-Length: {length}\r\n\r\n"
    ).encode() + body


@pytest.mark.integration
@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000, "\u0663", "-1", "+2", " ", "0x2", "2, 2"])
def test_a_content_length_not_in_ascii_digits_gets_400(target: ServerProcess, length: str) -> None:
    answer = exchange(target, token_post(length))
    assert status_of(answer) == 400, answer
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {"error": "a body needs one Content-Length, in digits"}
    healthy(target)


@pytest.mark.integration
def test_two_content_lengths_or_authorizations_get_400_not_a_traceback(
    target: ServerProcess,
) -> None:
    twice = token_post("2").replace(b"\r\n\r\n", b"\r\nContent-Length: 2\r\n\r\n")
    assert status_of(exchange(target, twice)) == 400
    keys = token_post("2").replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer k-acme-123\r\n\r\n")
    assert status_of(exchange(target, keys)) == 401
    upgrade = (
        "GET /v1/duplex HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n"
    )
    bad_target = upgrade.replace("GET /v1/duplex ", "GET //[/v1/duplex ") + "\r\n"
    assert status_of(exchange(target, bad_target.encode())) == 400
    for header in ("Host: 127.0.0.1", "Authorization: Bearer k-acme-123", "Origin: http://x"):
        head = upgrade + f"{header}\r\n{header}\r\n\r\n"
        assert status_of(exchange(target, head.encode())) == 400
    # The verifier reads X-Token once (Headers.get): sent twice, it is refused, quietly.
    head = upgrade + "X-Token: good\r\nX-Token: good\r\n\r\n"
    assert status_of(exchange(target, head.encode())) == 401
    assert status_of(exchange(target, (upgrade + "X-Token: good\r\n\r\n").encode())) == 101
    tokens = token_post("2").replace(b"Authorization: Bearer k-acme-123\r\n", b"X-Token: good\r\n")
    assert status_of(exchange(target, tokens)) == 200
    twice = tokens.replace(b"\r\n\r\n", b"\r\nX-Token: good\r\n\r\n")
    assert status_of(exchange(target, twice)) == 401
    healthy(target)


METHODS = ["GET", "POST", "HEAD", "PUT", "OPTIONS", "DELETE", "G\u00e9T", ""]
PATHS = [
    "/v1/duplex",
    "/v1/client_tokens",
    "/v1/client_tokens?x=1",
    "/v1/realtime/client_secrets",
    "/v1/realtime/client_secrets?x=1",
    "/",
    "/demo/app.js",
    "/demo/../../etc/passwd",
    "/healthz",
    "/readyz",
    "/metrics",
    "/nope",
    "*",
    "",
    "http://evil.example/v1/duplex",
    "/v1/duplex?autostart=1",
    "//[/v1/duplex",  # urlsplit: "Invalid IPv6 URL"
    "http://[x/v1/duplex",
    "/v1/duplex?%zz&&=",
    "/v1/realtime/calls",
    "/v1/realtime/calls?model=x",
    "/v1/realtime/calls?resume=sess_x&last_received_server_event_seq=3",
    "/v1/realtime/calls?last_received_server_event_seq=-1",
    "/v1/realtime/calls/rtc_0123456789abcdef0123456789abcdef",
    "/v1/realtime/calls/rtc_0123456789abcdef0123456789abcdef/hangup",
    "/v1/realtime/calls/../client_secrets",
    "/v1/twilio",
    "/v1/twilio/twiml",
    "/v1/twilio/twiml?resume=1&attempt=1&t=1",
    "/v1/twilio/twiml?resume=1&attempt=x&t=",
    "/v1/twilio/status",
    "/v1/twilio/status?%zz",
]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2", "", "HTTP/1.1 extra", "HTTP/9.9"]
NAMES = [
    "Host",
    "Origin",
    "Authorization",
    "Content-Length",
    "Transfer-Encoding",
    "Upgrade",
    "Connection",
    "Sec-WebSocket-Key",
    "Sec-WebSocket-Version",
    "Sec-WebSocket-Protocol",
    "Sec-WebSocket-Extensions",
    "Expect",
    "X-Token",
    "Content-Type",
    "X-Twilio-Signature",
    "X-Twilio-Webhooks-Signature-Settings",
]
VALUES = [
    "127.0.0.1",
    "[::1]:8765",
    "http://127.0.0.1",
    "null",
    "https://evil.example",
    "Bearer k-acme-123",
    "Bearer ",
    "Basic a2V5",
    "websocket",
    "Upgrade",
    "dGhlIHNhbXBsZSBub25jZQ==",
    "13",
    "chunked",
    "100-continue",
    "trio-duplex, trio-duplex.bearer.k-acme-123",
    "realtime, openai-insecure-api-key.k-acme-123",
    "permessage-deflate; client_max_window_bits",
    "\u00b2",
    "9" * 5000,
    "-1",
    "2",
    "0",
    "",
    "\u00ff\u00fe",
    "application/sdp",
    "multipart/form-data; boundary=b",
    "multipart/form-data",
    "application/x-www-form-urlencoded",
    "application/x-www-form-urlencoded; charset=utf-8",
    "3OjyaTG0gpHq3kT7s0cU9uy/8ls=",
    "\ud800",
]
BODIES = [
    b"",
    b"{}",
    b'{"ttl_s": 30}',
    b'{"expires_after": {"anchor": "created_at", "seconds": 60}, "session": {"type": "realtime"}}',
    b'{"expires_after": {"seconds": 1e999}}',
    b'{"ttl_s": NaN}',
    b'{"session": {"x": "\\ud800"}}',
    b'{"session": ' + b"[" * 600 + b"]" * 600 + b"}",
    b'{"session": {"x": 1e999}}',
    b"\xed\xa0\x80",
    b"\x81\x05hello",
    b"[" * 100_000,
    OFFER.encode(),
    OFFER.encode()[:-40],
    b"--b\r\nContent-Disposition: form-data; name=sdp\r\n\r\n" + OFFER.encode() + b"\r\n--b--\r\n",
    b'--b\r\nContent-Disposition: form-data; name="session"\r\n\r\n{"type": 1}\r\n--b--\r\n',
    b"AccountSid=AC" + b"1" * 32 + b"&CallSid=CA" + b"2" * 32 + b"&CallStatus=ringing",
    b"AccountSid=AC%zz&CallSid=&CallSid=CA",
    b"CallStatus=completed&StreamEvent=stream-error&StreamError=%ED%A0%80",
    b"=&&==&%",
]

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\r\n"),
    max_size=40,
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method, version = draw(st.sampled_from(METHODS)), draw(st.sampled_from(VERSIONS))
    path = draw(st.sampled_from(PATHS) | header_text | header_text.map(lambda t: "/" + t))
    line = f"{method} {path} {version}"
    names = st.sampled_from(NAMES) | header_text
    values = st.sampled_from(VALUES) | header_text
    headers = draw(st.lists(st.tuples(names, values), max_size=12))
    body = draw(st.sampled_from(BODIES) | st.binary(max_size=300))
    if draw(st.booleans()):
        headers.append(("Content-Length", str(len(body))))
    text = line + "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers)
    ending = draw(st.sampled_from(["\r\n", "", "\n", "\r\n\r\n"]))
    return (text + ending).encode("utf-8", "surrogatepass") + body


@pytest.mark.integration
@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=requests())
def test_no_request_makes_a_traceback(target: ServerProcess, request: bytes) -> None:
    seen = len(target.lines)
    answer = exchange(target, request)
    if answer:
        assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    # The lines since this request (the whole log is checked at the end as well).
    new = "".join(target.lines[seen:])
    assert "Traceback" not in new and " ERROR " not in new, (request[:300], new[-3000:])


@pytest.mark.integration
def test_the_server_still_serves_after_the_fuzzing(target: ServerProcess) -> None:
    healthy(target)
    answer = exchange(target, token_post("2"))
    assert status_of(answer) == 200
    assert "client fault on a connection from 127.0.0.1" in target.log
