"""The front door's router (front/router.py): what a request is for, with no socket."""

from __future__ import annotations

from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request

from trio_duplex.core.opening import OPEN, Grant
from trio_duplex.server.front.http import Endpoints
from trio_duplex.server.front.router import Answer, Router, Upgrade
from trio_duplex.server.front.throttle import Throttled

PATH = "/v1/duplex"
RELAY = "/relay"


def request(path: str, **headers: str) -> Request:
    return Request(path, Headers({"Host": "example.com", **headers}))


class Calls:
    def __init__(self, answer: Grant | Throttled | None) -> None:
        self.answer = answer
        self.seen: list[str] = []

    def authorize(self, req: Request, peer: str | None) -> Grant | Throttled | None:
        self.seen.append(req.path)
        return self.answer

    def relay(self, req: Request) -> tuple[Grant, dict[str, str]] | None:
        self.seen.append(req.path)
        if req.headers.get("X-Signed") != "yes":
            return None
        return Grant(None, resume_of="s", relayed=True), {"X-Proof": "p"}


def route(router: Router, path: str, **headers: str) -> Answer | Upgrade:
    req = request(path, **headers)
    return router.route(req, urlsplit(req.path), "127.0.0.1")


def endpoints() -> Endpoints:
    return Endpoints(lambda: (True, {"status": "ready"}), lambda: (b"m 1\n", "text/plain"), {})


def test_an_endpoint_answers_before_anything_is_checked() -> None:
    calls = Calls(None)
    router = Router(PATH, endpoints(), authorize=calls.authorize)
    answer = route(router, "/healthz", Origin="https://elsewhere.example")
    assert isinstance(answer, Answer) and answer.raw is not None and answer.reason is None
    assert answer.raw.startswith(b"HTTP/1.1 200")
    assert calls.seen == []


def test_an_origin_not_allowed_is_403_before_the_credential_is_looked_at() -> None:
    calls = Calls(Grant("app"))
    router = Router(PATH, authorize=calls.authorize)
    answer = route(router, PATH, Origin="https://elsewhere.example")
    assert answer == Answer(None, "403: origin not allowed", "origin", 403, "origin not allowed\n")
    assert calls.seen == []
    assert route(router, PATH, Origin="https://example.com") == Upgrade(Grant("app"))


def test_the_credential_decides_401_429_or_the_grant() -> None:
    for found, status, reason in (
        (None, b"401", "unauthorized"),
        (Throttled(7), b"429", "throttled"),
    ):
        answer = route(Router(PATH, authorize=Calls(found).authorize), PATH)
        assert isinstance(answer, Answer) and answer.raw is not None
        assert answer.raw.startswith(b"HTTP/1.1 " + status) and answer.reason == reason
    throttled = route(Router(PATH, authorize=Calls(Throttled(7)).authorize), PATH)
    assert isinstance(throttled, Answer) and b"Retry-After: 7\r\n" in (throttled.raw or b"")
    assert route(Router(PATH), PATH) == Upgrade(OPEN)


def test_another_path_goes_to_the_upgrade_as_not_ours_unauthorized() -> None:
    calls = Calls(Grant("app"))
    routed = route(Router(PATH, authorize=calls.authorize), "/elsewhere")
    assert routed == Upgrade(OPEN, ours=False)
    assert calls.seen == []
    assert route(Router(None), PATH) == Upgrade(OPEN, ours=False)  # (a relay-only listener)


def test_the_relay_path_takes_signed_requests_only() -> None:
    calls = Calls(None)
    router = Router(PATH, authorize=calls.authorize, relay=(RELAY, calls.relay))
    unsigned = route(router, RELAY)
    assert isinstance(unsigned, Answer) and unsigned.reason == "relay_unsigned"
    assert (unsigned.raw or b"").startswith(b"HTTP/1.1 403")
    signed = route(router, RELAY, **{"X-Signed": "yes"})
    assert signed == Upgrade(Grant(None, resume_of="s", relayed=True), {"X-Proof": "p"})
    assert calls.seen == [RELAY, RELAY]  # the credential's check never ran
    assert route(Router(PATH), RELAY) == Upgrade(OPEN, ours=False)  # not in a cluster


def test_posts_and_heads_are_told_apart_before_parsing() -> None:
    class Posts:
        def answer_post(self, path: str, headers: Headers, body: bytes) -> tuple[int, bytes]:
            return 200, b"{}"

        def post_error(self, path: str, status: int, message: str) -> bytes:
            return b"{}"

    router = Router(PATH, endpoints(), posts=Posts())
    assert router.posts_token(b"POST /v1/client_tokens HTTP/1.1\r\n\r\n")
    assert router.posts_token(b"POST /v1/client_tokens?x=1 HTTP/1.1\r\n\r\n")
    assert not router.posts_token(b"POST /v1/client_tokensX HTTP/1.1\r\n\r\n")
    assert router.posts_token(b"POST /v1/realtime/client_secrets HTTP/1.1\r\n\r\n")
    assert not router.posts_token(b"POST /v1/realtime/client_secretsX HTTP/1.1\r\n\r\n")
    assert not Router(PATH).posts_token(b"POST /v1/client_tokens HTTP/1.1\r\n\r\n")
    assert router.answer_head(b"HEAD / HTTP/1.1\r\n\r\n") is None  # no demo pages
