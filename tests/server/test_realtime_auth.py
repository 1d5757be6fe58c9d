"""OpenAI's forms of our credentials: a key offered as the subprotocol
``openai-insecure-api-key.KEY``, client secrets (``POST /v1/realtime/client_secrets``:
our client tokens in OpenAI's shape) and, on a resume from the upgrade's query, the
resume token as the bearer."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.realtime import ClientSecretCreateResponse
from trio.testing import MockClock
from websockets.datastructures import Headers
from websockets.http11 import Request as HttpRequest
from websockets.sync.client import connect as ws_connect
from wsproto.events import AcceptConnection, RejectConnection

from trio_duplex import ServerConfig
from trio_duplex.core.opening import Grant
from trio_duplex.server.front.auth import Gate, bearer, carries_credential, presented
from trio_duplex.server.front.throttle import Throttled
from trio_duplex.testing import ScriptedEngine, running_server

from ..helpers import (
    RawHttp,
    Serve,
    ServerProcess,
    answer_of,
    authorization,
    exchange,
    http_post,
    upgrade,
)

KEY, OTHER_KEY = "k-acme-123", "k-globex-456"
KEYS = f"acme: {KEY}\nglobex: {OTHER_KEY}\n"
SECRETS = "/v1/realtime/client_secrets"
SECRET_RESPONSE = pydantic.TypeAdapter(ClientSecretCreateResponse)


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return str(path)


def authorization_of(credential: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {credential}")]


def post(
    body: bytes | dict[str, Any] = b"",
    key: str | None = KEY,
    path: str = SECRETS,
    extra: str = "",
) -> bytes:
    return http_post(path, body, key, extra)


def openai_error(body: dict[str, Any]) -> dict[str, Any]:
    """The error object of an OpenAI HTTP error body, its four fields checked."""
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    return error


# -- the key as a subprotocol -------------------------------------------------------------


def test_openais_subprotocol_form_carries_a_credential() -> None:
    assert presented({}, ["realtime", "openai-insecure-api-key.xyz"]) == "xyz"
    assert presented({}, ["openai-insecure-api-key."]) is None
    assert presented({"Authorization": "Bearer h"}, ["openai-insecure-api-key.s"]) == "h"
    assert carries_credential("openai-insecure-api-key.xyz")
    assert carries_credential("trio-duplex.bearer.xyz")
    assert not carries_credential("realtime") and not carries_credential("trio-duplex")


def _request(*headers: tuple[str, str]) -> HttpRequest:
    return HttpRequest("/v1/realtime?model=m", Headers(list(headers)))


def test_the_bearer_of_an_upgrade_is_its_header_or_an_offered_subprotocol() -> None:
    offer = ("Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.sub-key")
    assert bearer(_request(offer)) == "sub-key"
    assert bearer(_request(("Authorization", "Bearer head-key"), offer)) == "head-key"
    assert bearer(_request(("Sec-WebSocket-Protocol", "realtime"))) is None
    twice = (("Authorization", "Bearer a"), ("Authorization", "Bearer b"))
    assert bearer(_request(*twice, offer)) is None  # which one would be meant: none
    assert "sub-key" not in repr(Grant("acme"))


async def test_a_key_offered_as_openais_subprotocol_opens_a_session_unechoed(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    # Was: 401, the key not looked for there.
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(api_key_file=key_file), factory) as sim:
        client, answer = await upgrade(
            sim, protocols=["trio-duplex", f"openai-insecure-api-key.{OTHER_KEY}"]
        )
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "trio-duplex"  # never the one with the key
        assert all(OTHER_KEY.encode() not in value for _, value in answer.extra_headers)
        await client.send({"type": "session.update", "session": {}})
        assert (await client.receive())["type"] == "session.created"
        await trio.testing.wait_all_tasks_blocked()
        assert factory.last.session is not None and factory.last.session.principal == "globex"
        # The same refusal as a wrong header: 401, whatever was wrong.
        _, wrong = await upgrade(sim, protocols=["realtime", "openai-insecure-api-key.k-wrong"])
        assert isinstance(wrong, RejectConnection) and wrong.status_code == 401


# -- client secrets ---------------------------------------------------------------------------


async def test_a_client_secret_opens_exactly_one_session_with_its_locked_session(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    # Was: 404 (the path did not exist).
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(api_key_file=key_file), factory) as sim:
        asked = {
            "expires_after": {"anchor": "created_at", "seconds": 30},
            "session": {"type": "realtime", "instructions": "be brief"},
        }
        before = int(time.time())
        status, issued = answer_of(await raw_http(sim, post(asked)))
        assert status == 200, issued
        SECRET_RESPONSE.validate_python(issued, strict=True)  # OpenAI's shape, exactly
        assert before + 30 <= issued["expires_at"] <= int(time.time()) + 31
        session = issued["session"]
        assert session["type"] == "realtime" and session["object"] == "realtime.session"
        assert session["instructions"] == "be brief"
        value = issued["value"]
        assert value.startswith("ek_")  # the agents SDK's browser check (webrtc.md §3.2)
        client, answer = await upgrade(sim, protocols=[f"openai-insecure-api-key.{value}"])
        assert isinstance(answer, AcceptConnection)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "be brief"  # locked
        await trio.testing.wait_all_tasks_blocked()
        assert factory.last.session is not None and factory.last.session.principal == "acme"
        opened = sim.session(created["session_id"])
        assert opened is not None and opened.config_locked
        # The configuration locked is ours, translated from OpenAI's (its defaults too).
        assert opened.config["audio"]["input"] == {"format": "pcm16", "rate": 24000}
        assert opened.config["output_modalities"] == ["audio"]
        # Spent: nothing more.
        _, again = await upgrade(sim, headers=authorization(value))
        assert isinstance(again, RejectConnection) and again.status_code == 401
        # Without a body: 600 s (OpenAI's default), nothing locked; expired, nothing.
        status, plain = answer_of(await raw_http(sim, post()))
        assert status == 200 and plain["expires_at"] >= before + 600
        SECRET_RESPONSE.validate_python(plain, strict=True)
        await trio.sleep(601)
        _, late = await upgrade(sim, headers=authorization(plain["value"]))
        assert isinstance(late, RejectConnection) and late.status_code == 401


TOO_BIG = {"type": "realtime", "instructions": "y" * 66_000}


@pytest.mark.parametrize(
    ("request_bytes", "status", "param"),
    [
        (post(key=None), 401, None),
        (post(key="k-wrong"), 401, None),
        (post(b"[1]"), 400, None),
        (post(b"{not json"), 400, None),
        (post(b'"\xff"'), 400, None),
        (post({"ttl_s": 30}), 400, None),
        (post({"expires_after": 30}), 400, "expires_after"),
        (post({"expires_after": {"anchor": "now", "seconds": 30}}), 400, "expires_after.anchor"),
        (post({"expires_after": {"seconds": 9}}), 400, "expires_after.seconds"),
        (post({"expires_after": {"seconds": 601}}), 400, "expires_after.seconds"),  # the cap
        (post({"expires_after": {"seconds": 30.5}}), 400, "expires_after.seconds"),
        (post({"expires_after": {"seconds": True}}), 400, "expires_after.seconds"),
        (post({"expires_after": {"seconds": 30, "x": 1}}), 400, "expires_after"),
        (post({"session": [1]}), 400, "session"),
        (post({"session": {"instructions": "x"}}), 400, "session.type"),
        (post({"session": {"type": "transcription"}}), 400, "session.type"),
        (post({"session": {"type": "realtime", "instructions": []}}), 400, "session.instructions"),
        (post({"session": {"type": "realtime", "x": 1}}), 400, "session.x"),  # unknown
        (
            post(
                {"session": {"type": "realtime", "audio": {"input": {"format": {"type": "mp3"}}}}}
            ),
            400,
            "session.audio.input.format.type",
        ),
        (post({"session": TOO_BIG}), 400, "session"),  # config_too_large
        (post({"session": TOO_BIG | {"x": "y" * 4000}}), 413, None),  # > a first message
        (post(extra="Origin: http://elsewhere\r\n"), 403, None),
        (post(b"{}", extra="Transfer-Encoding: chunked\r\n"), 400, None),
    ],
)
async def test_bad_client_secret_requests_get_openais_errors(
    autojump_clock: MockClock,
    raw_http: RawHttp,
    key_file: str,
    request_bytes: bytes,
    status: int,
    param: str | None,
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        answer = await raw_http(sim, request_bytes)
        got, body = answer_of(answer)
        assert got == status, body
        error = openai_error(body)
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
        if status == 401:
            assert error["code"] == "invalid_api_key"
            assert b"\r\nWWW-Authenticate: Bearer\r\n" in answer
        assert not sim.server.gate.tokens


async def test_a_client_secrets_session_is_openais_translated_into_ours(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    asked = {
        "session": {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"voice": "ash"}},
        }
    }
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        status, issued = answer_of(await raw_http(sim, post(asked)))
        assert status == 200, issued
        SECRET_RESPONSE.validate_python(issued, strict=True)
        shown = issued["session"]
        assert shown["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        assert shown["audio"]["output"]["voice"] == "ash"
        assert shown["output_modalities"] == ["text"]
        token = sim.server.gate.tokens.take(issued["value"], trio.current_time())
        assert token is not None
        locked = token.locked()
        assert locked is not None
        assert locked["audio"]["input"] == {"format": "g711_ulaw", "rate": 8000}
        assert locked["voice"] == "ash" and locked["output_modalities"] == ["text"]


async def test_a_principal_at_its_limit_gets_429_and_others_do_not(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    config = ServerConfig(api_key_file=key_file, client_token_max_per_key=2)
    async with running_server(config) as sim:
        for _ in range(2):
            assert answer_of(await raw_http(sim, post()))[0] == 200
        answer = await raw_http(sim, post())
        status, body = answer_of(answer)
        assert status == 429 and b"\r\nRetry-After: 1\r\n" in answer
        assert openai_error(body)["code"] == "rate_limit_exceeded"
        assert answer_of(await raw_http(sim, post(key=OTHER_KEY)))[0] == 200
        # A native token counts against the same share.
        assert answer_of(await raw_http(sim, post(key=OTHER_KEY, path="/v1/client_tokens")))[0]
        assert answer_of(await raw_http(sim, post(key=OTHER_KEY)))[0] == 429


async def test_an_allowed_origin_may_ask_for_a_client_secret(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    config = ServerConfig(api_key_file=key_file, allow_origin=("https://app.example",))
    async with running_server(config) as sim:
        allowed = post(extra="Origin: https://app.example\r\n")
        assert answer_of(await raw_http(sim, allowed))[0] == 200
        other = post(extra="Origin: https://evil.example\r\n")
        status, body = answer_of(await raw_http(sim, other))
        assert status == 403 and openai_error(body)["code"] == "origin_not_allowed"


async def test_without_keys_there_are_no_client_secrets(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig()) as sim:
        status, body = answer_of(await raw_http(sim, post()))
        assert status == 404 and openai_error(body)["code"] == "not_found"


# -- a resume from the query: the bearer is the resume token ----------------------------------


async def test_on_a_resume_the_bearer_is_a_resume_token_only(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        client, _ = await upgrade(sim, headers=authorization(KEY))
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        token, sid = created["resume_token"], created["session_id"]
        gate: Gate = sim.server.gate

        def resuming(credential: str, form: str = "header") -> Grant | Throttled | None:
            if form == "header":
                header = ("Authorization", f"Bearer {credential}")
            else:
                header = (
                    "Sec-WebSocket-Protocol",
                    f"realtime, openai-insecure-api-key.{credential}",
                )
            request = HttpRequest(f"/v1/realtime?resume={sid}", Headers([header]))
            return gate.authorize_resume(request, "192.0.2.1")

        # The resume token stands in for the key: it grants that session's resume only.
        assert resuming(token) == Grant(None, resume_of=sid)
        # The Gate applies that rule on the paths told, with ?resume= only.
        gate.resuming_paths = frozenset({"/v1/realtime"})
        for path, grant in [
            (f"/v1/realtime?resume={sid}", None),
            ("/v1/realtime?model=m", Grant("acme")),
            (f"/v1/duplex?resume={sid}", Grant("acme")),
        ]:
            keyed = HttpRequest(path, Headers([("Authorization", f"Bearer {KEY}")]))
            assert gate.authorize(keyed, None) == grant, path
        by_token = HttpRequest(f"/v1/realtime?resume={sid}", Headers(authorization_of(token)))
        assert gate.authorize(by_token, None) == Grant(None, resume_of=sid)
        assert resuming(token, "subprotocol") == Grant(None, resume_of=sid)
        # A key is not a resume token (it would not resume anything): 401.
        assert resuming(KEY) is None
        # A client token is not one either, and is not spent by the attempt.
        _, issued = answer_of(await raw_http(sim, post()))
        assert resuming(issued["value"]) is None
        _, still = await upgrade(sim, headers=authorization(issued["value"]))
        assert isinstance(still, AcceptConnection)
        assert resuming("not-a-token") is None
        # In a cluster an unknown one may be a token of another node's session: let through
        # to resume (checked there), and throttled by address as failures mount.
        gate.elsewhere = True
        let = resuming("from-elsewhere")
        assert isinstance(let, Grant) and let.elsewhere is not None and let.principal is None
        for _ in range(40):
            gate.resume_failed("192.0.2.1")
        assert isinstance(resuming("from-elsewhere"), Throttled)


# -- the real server: curl, the openai SDK, a fuzz ------------------------------------------


@pytest.fixture(scope="module")
def target(serve_module: Serve, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    keys: Path = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEYS)
    return serve_module("--api-key-file", str(keys), "--log-level", "debug")


def base_of(server: ServerProcess) -> str:
    return server.url.replace("ws://", "http://").removesuffix("/v1/duplex")


ISSUED: list[str] = []
"""Every secret the module's server handed out (none may be in its log)."""


@pytest.mark.integration
def test_curl_asks_for_a_client_secret_that_a_browser_presents_as_a_subprotocol(
    target: ServerProcess,
) -> None:
    body = json.dumps({"session": {"type": "realtime", "instructions": "hi"}})
    result = subprocess.run(
        ["curl", "-s", "--max-time", "10", "-X", "POST", "-H", f"Authorization: Bearer {KEY}",
         "-H", "Content-Type: application/json", "-d", body, base_of(target) + SECRETS],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    issued = json.loads(result.stdout)
    SECRET_RESPONSE.validate_python(issued, strict=True)
    ISSUED.append(issued["value"])
    offered = ["trio-duplex", f"openai-insecure-api-key.{issued['value']}"]
    with ws_connect(target.url, subprotocols=offered) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "trio-duplex"
        assert ws.response is not None
        assert all(issued["value"] not in value for value in ws.response.headers.values())
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        created = json.loads(ws.recv(timeout=5))
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "hi"
        ISSUED.append(created["resume_token"])


@pytest.mark.integration
async def test_the_openai_sdk_creates_client_secrets_and_reads_our_errors(
    target: ServerProcess,
) -> None:
    base = base_of(target) + "/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0) as client:
        secret = await client.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 60},
            session={"type": "realtime", "instructions": "be brief", "output_modalities": ["text"]},
        )
        ISSUED.append(secret.value)
        assert secret.session.type == "realtime"
        assert secret.session.instructions == "be brief"
        assert time.time() + 50 < secret.expires_at <= time.time() + 61
        with pytest.raises(openai.BadRequestError) as bad:
            await client.realtime.client_secrets.create(expires_after={"seconds": 5})
        assert bad.value.param == "expires_after.seconds" and bad.value.code == "invalid_value"
    async with openai.AsyncOpenAI(base_url=base, api_key="k-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            await client.realtime.client_secrets.create()
        assert refused.value.code == "invalid_api_key"


_scalars = st.none() | st.booleans() | st.integers(-10, 10_000) | st.floats() | st.text(max_size=8)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["expires_after", "session", "anchor", "seconds", "type", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)
_bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "expires_after": st.fixed_dictionaries(
                {}, optional={"anchor": st.just("created_at") | _json, "seconds": _json}
            )
            | _json,
            "session": st.fixed_dictionaries(
                {"type": st.just("realtime") | _json}, optional={"instructions": _json}
            )
            | _json,
        },
    ).map(lambda body: json.dumps(body).encode())
    | _json.map(lambda value: json.dumps(value).encode())
    | st.binary(max_size=40)
)


@pytest.mark.integration
@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=_bodies)
def test_any_body_gets_a_secret_or_openais_error_never_a_traceback(
    target: ServerProcess, body: bytes
) -> None:
    seen = len(target.lines)
    status, answer = answer_of(exchange(target, post(body).replace(b"Host: sim", b"Host: x")))
    if status == 200:
        SECRET_RESPONSE.validate_python(answer, strict=True)
        ISSUED.append(answer["value"])
    else:
        assert status == 400, answer
        openai_error(answer)
    new = "".join(target.lines[seen:])
    assert "Traceback" not in new and " ERROR " not in new, (body, new[-3000:])


@pytest.mark.integration
def test_no_secret_is_in_the_debug_log(target: ServerProcess) -> None:
    """Every secret the module's tests saw (this one's own at least)."""
    status, issued = answer_of(exchange(target, post().replace(b"Host: sim", b"Host: x")))
    assert status == 200
    ISSUED.append(issued["value"])
    for credential in (KEY, issued["value"]):
        offered: Any = ["trio-duplex", f"openai-insecure-api-key.{credential}"]
        with ws_connect(target.url, subprotocols=offered) as ws:
            ws.send(json.dumps({"type": "session.update", "session": {}}))
            created = json.loads(ws.recv(timeout=5))
            assert created["type"] == "session.created"
            ISSUED.append(created["resume_token"])
    answer = exchange(target, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    log = target.log
    assert "client token issued to acme" in log  # (--log-level debug: every line)
    assert KEY not in log and OTHER_KEY not in log
    for value in ISSUED:  # random, long: a part of one is not there by chance
        lines = [line for line in log.splitlines() if value[4:-4] in line]
        assert not lines, lines
