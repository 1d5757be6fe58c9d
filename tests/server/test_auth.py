"""API keys (--api-key-file): who may open a session, and a resume token as the credential
of that session's resume."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect
from wsproto.events import AcceptConnection, RejectConnection

from trio_duplex import DuplexServer, ServerConfig
from trio_duplex.cli import main
from trio_duplex.client import ClientOptions, ServerRefused, connect
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.server.front.auth import KeyFileError, KeyRing, presented
from trio_duplex.testing import ScriptedEngine, running_server

from ..helpers import UPGRADE_HEAD as HEAD
from ..helpers import RawHttp, answer_of, authorization, http_post, upgrade

KEYS = "# customers\nacme: k-acme-123\n\n  globex : k-globex-456  \n"


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return str(path)


# -- the key file ------------------------------------------------------------------------


def test_the_key_file_gives_names_by_key(key_file: str) -> None:
    keys = KeyRing.load(key_file)
    assert len(keys) == 2
    assert keys.principal("k-acme-123") == "acme"
    assert keys.principal("k-globex-456") == "globex"
    assert keys.principal("k-acme-12") is None
    assert keys.principal("acme") is None
    assert "k-acme" not in repr(keys)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("acme: k1\nno colon here\n", "line 2: not NAME:KEY"),
        ("acme:\n", "line 1: not NAME:KEY"),
        (":secret-key\n", "line 1: not NAME:KEY"),
        ("acme: k1\nacme: k2\n", "line 2: the name 'acme' is there twice"),
        ("# nothing\n\n", "no keys in it"),
    ],
)
def test_a_bad_key_file_is_refused_without_quoting_a_key(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeyFileError) as info:
        KeyRing.load(str(path))
    assert says in str(info.value)
    assert "secret-key" not in str(info.value) and "k2" not in str(info.value)


def test_the_credential_comes_from_the_header_or_a_subprotocol() -> None:
    assert presented({"Authorization": "Bearer abc"}, []) == "abc"
    assert presented({"Authorization": "bearer  abc "}, []) == "abc"
    assert presented({"Authorization": "Basic abc"}, []) is None
    assert presented({}, ["trio-duplex", "trio-duplex.bearer.xyz"]) == "xyz"
    assert presented({}, ["trio-duplex.bearer."]) is None
    assert presented({"Authorization": "Bearer h"}, ["trio-duplex.bearer.s"]) == "h"


# -- upgrades ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra", ["", "Authorization: Bearer k-wrong\r\n", "Authorization: Basic a2V5\r\n"]
)
async def test_no_valid_credential_gets_401_and_the_same_answer_whatever_was_wrong(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str, extra: str
) -> None:
    # Was: anyone who could reach the port opened sessions.
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        answer = await raw_http(sim, (HEAD + extra + "\r\n").encode())
        assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
        assert b"\r\nWWW-Authenticate: Bearer\r\n" in answer
        assert answer.endswith(b"\r\n\r\na credential is required\n")
        assert sim.server.slots_held == 0
        assert sim.server.sessions.totals.refusals == {"unauthorized": 1}


async def test_a_key_opens_a_session_whose_engine_knows_its_principal(
    autojump_clock: MockClock, key_file: str
) -> None:
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(api_key_file=key_file), factory) as sim:
        by_header, answer = await upgrade(sim, headers=authorization("k-acme-123"))
        assert isinstance(answer, AcceptConnection)
        await by_header.send({"type": "session.update", "session": {}})
        assert (await by_header.receive())["type"] == "session.created"
        by_protocol, answer = await upgrade(
            sim, protocols=["trio-duplex", "trio-duplex.bearer.k-globex-456"]
        )
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "trio-duplex"  # never the one with the key
        await by_protocol.send({"type": "session.update", "session": {}})
        assert (await by_protocol.receive())["type"] == "session.created"
        await trio.testing.wait_all_tasks_blocked()
        principals = [engine.session.principal for engine in factory.engines if engine.session]
        assert principals == ["acme", "globex"]


async def test_a_resume_token_is_the_credential_of_its_own_resume_only(
    autojump_clock: MockClock, key_file: str
) -> None:
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(api_key_file=key_file), factory) as sim:
        first, _ = await upgrade(sim, headers=authorization("k-acme-123"))
        await first.send({"type": "session.update", "session": {}})
        created = await first.receive()
        other, _ = await upgrade(sim, headers=authorization("k-acme-123"))
        await other.send({"type": "session.update", "session": {}})
        other_created = await other.receive()
        await first.stream.aclose()
        token, sid = created["resume_token"], created["session_id"]
        # Its token opens nothing and resumes no other session: 1008, nothing held.
        for message in (
            {"type": "session.update", "session": {}},
            {"type": "session.resume", "session_id": other_created["session_id"]}
            | {"resume_token": token},
        ):
            client, answer = await upgrade(sim, headers=authorization(token))
            assert isinstance(answer, AcceptConnection)
            await client.send(message)
            refused = await client.receive_until_closed()
            assert [e.get("code") for e in refused] == ["unauthorized"]
            assert client.close_code == 1008
        assert sim.server.slots_held == 2
        # It resumes its own session, which keeps its principal.
        client, answer = await upgrade(sim, protocols=[f"trio-duplex.bearer.{token}"])
        assert isinstance(answer, AcceptConnection)
        await client.send({"type": "session.resume", "session_id": sid, "resume_token": token})
        resumed = await client.receive()
        assert resumed["type"] == "session.resumed"
        assert sim.session(sid) is not None
        assert sim.session(sid).principal == "acme"  # type: ignore[union-attr]
        # A token that is no longer valid is no credential at all.
        _, answer = await upgrade(sim, headers=authorization("not-a-token"))
        assert isinstance(answer, RejectConnection) and answer.status_code == 401


# -- the real server: reload, and our own client ----------------------------------------


@pytest.mark.integration
def test_sighup_reloads_the_keys_and_a_bad_file_keeps_the_old_ones(
    serve: Any, tmp_path: Path
) -> None:

    path = tmp_path / "keys"
    path.write_text("acme: old-key\n")
    server = serve("--api-key-file", str(path))

    def opens(key: str) -> bool:
        try:
            with ws_connect(
                server.url, additional_headers={"Authorization": f"Bearer {key}"}
            ) as ws:
                ws.send(json.dumps({"type": "session.update", "session": {}}))
                return bool(json.loads(ws.recv(timeout=5))["type"] == "session.created")
        except InvalidStatus as exc:
            assert exc.response.status_code == 401
            return False

    assert opens("old-key") and not opens("new-key")
    path.write_text("acme: new-key\n")
    server.proc.send_signal(1)  # SIGHUP
    server.wait_for_line(r"API keys reloaded from .*: 1 keys", timeout=10)
    assert opens("new-key") and not opens("old-key")
    path.write_text("no colon\n")
    server.proc.send_signal(1)
    server.wait_for_line(r"ERROR .*API keys not reloaded, the old ones stay in use", timeout=10)
    assert opens("new-key")
    assert "new-key" not in server.log and "old-key" not in server.log


def test_a_bad_key_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    path = tmp_path / "keys"
    path.write_text("acme secret\n")
    with pytest.raises(SystemExit) as info:
        main(["serve", "--api-key-file", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "line 1: not NAME:KEY" in err and "secret" not in err


async def test_our_client_presents_its_key_to_open_and_its_token_to_resume(
    tmp_path: Path,
) -> None:

    path = tmp_path / "keys"
    path.write_text("acme: k-acme-123\n")
    config = ServerConfig(host="127.0.0.1", port=0, api_key_file=str(path))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = DuplexServer(config, EchoEngine)
            port = await nursery.start(server.run_tcp)
            url = f"ws://127.0.0.1:{port}/v1/duplex"
            with pytest.raises(ServerRefused, match="HTTP 401"):
                async with connect(url):
                    pass
            async with connect(url, options=ClientOptions(api_key="k-acme-123")) as session:
                await session.send({"type": "input.text.append", "text": "one"})
                assert (await session.receive())["text"] == "one"
                state = await session.detach()
            # No key this time: the resume token is the credential.
            async with connect(url, resume=state) as again:
                await again.send({"type": "input.text.append", "text": "two"})
                assert (await again.receive())["text"] == "two"
            nursery.cancel_scope.cancel()


# -- client tokens ---------------------------------------------------------------------------


def post(
    body: bytes = b"", key: str | None = "k-acme-123", path: str = "/v1/client_tokens"
) -> bytes:
    return http_post(path, body, key)


async def test_a_client_token_opens_exactly_one_session_within_its_ttl(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    factory = ScriptedEngine.factory()
    async with running_server(ServerConfig(api_key_file=key_file), factory) as sim:
        status, issued = answer_of(await raw_http(sim, post(b'{"ttl_s": 30}')))
        assert status == 200
        token = issued["token"]
        assert set(token) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
        assert isinstance(issued["expires_at"], int)
        client, answer = await upgrade(
            sim, protocols=["trio-duplex", f"trio-duplex.bearer.{token}"]
        )
        assert isinstance(answer, AcceptConnection)
        await client.send({"type": "session.update", "session": {"voice": "alto"}})
        assert (await client.receive())["type"] == "session.created"
        await trio.testing.wait_all_tasks_blocked()
        assert factory.last.session is not None and factory.last.session.principal == "acme"
        # Spent: it opens nothing more.
        _, again = await upgrade(sim, headers=authorization(token))
        assert isinstance(again, RejectConnection) and again.status_code == 401
        # Expired: nothing either.
        _, late = answer_of(await raw_http(sim, post(b'{"ttl_s": 30}')))
        await trio.sleep(31)
        _, answer = await upgrade(sim, headers=authorization(late["token"]))
        assert isinstance(answer, RejectConnection) and answer.status_code == 401


async def test_a_locked_configuration_is_the_sessions_and_cannot_change(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        body = json.dumps({"session": {"voice": "alto", "lang": "en"}}).encode()
        tokens = [answer_of(await raw_http(sim, post(body)))[1]["token"] for _ in range(2)]
        # Asking for another value at the open: refused, 1008, nothing opened.
        client, _ = await upgrade(sim, headers=authorization(tokens[0]))
        await client.send({"type": "session.update", "session": {"voice": "bass"}})
        assert [e.get("code") for e in await client.receive_until_closed()] == ["config_locked"]
        assert client.close_code == 1008 and sim.server.slots_held == 0
        # Asking for what is locked, or less: the session gets the whole locked one.
        client, _ = await upgrade(sim, headers=authorization(tokens[1]))
        await client.send({"type": "session.update", "session": {"voice": "alto"}})
        created = await client.receive()
        assert created["session"] == {"voice": "alto", "lang": "en"}
        # An update later that changes a field: config_locked, 1008; the session
        # detaches, unchanged.
        await client.send({"type": "session.update", "session": {"lang": "fr"}})
        assert [e.get("code") for e in await client.receive_until_closed()] == ["config_locked"]
        assert client.close_code == 1008
        session = sim.session(created["session_id"])
        assert session is not None and session.config == {"voice": "alto", "lang": "en"}


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (post(key=None), 401),
        (post(key="k-wrong"), 401),
        (post(b"[1]"), 400),
        (post(b"{not json"), 400),
        (post(b'{"ttl_s": 601}'), 400),
        (post(b'{"ttl_s": 0}'), 400),
        (post(b'{"ttl_s": true}'), 400),
        (post(b'{"session": [1]}'), 400),
        (post(b'{"session": {"x": "' + b"y" * 66_000 + b'"}}'), 400),  # config_too_large
        (post(b'{"session": {"x": "' + b"y" * 70_000 + b'"}}'), 413),  # > first message
        (post(path="/v1/other"), 400),
    ],
)
async def test_bad_token_requests_are_refused(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str, request_bytes: bytes, status: int
) -> None:
    async with running_server(ServerConfig(api_key_file=key_file)) as sim:
        answer = await raw_http(sim, request_bytes)
        assert int(answer.split(b" ", 2)[1]) == status
        if status == 401:
            assert b"\r\nWWW-Authenticate: Bearer\r\n" in answer
        assert len(sim.server.gate.tokens) == 0


async def test_without_keys_there_are_no_client_tokens(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server() as sim:
        assert int((await raw_http(sim, post())).split(b" ", 2)[1]) == 404


# -- --auth module:callable ------------------------------------------------------------------


async def test_another_verifier_decides_from_the_headers(
    autojump_clock: MockClock, raw_http: RawHttp, key_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    factory = ScriptedEngine.factory()
    config = ServerConfig(auth="tests.server.auth_verifier:verify", api_key_file=key_file)
    async with running_server(config, factory) as sim:
        client, answer = await upgrade(sim, headers=[(b"X-Token", b"good")])
        assert isinstance(answer, AcceptConnection)
        await client.send({"type": "session.update", "session": {}})
        assert (await client.receive())["type"] == "session.created"
        _, answer = await upgrade(sim, headers=[(b"X-Token", b"bad")])
        assert isinstance(answer, RejectConnection) and answer.status_code == 401
        _, answer = await upgrade(sim, headers=authorization("k-globex-456"))  # keys still work
        assert isinstance(answer, AcceptConnection)
        await trio.testing.wait_all_tasks_blocked()
        assert factory.last.session is not None and factory.last.session.principal == "jwt-user"
        # The verifier's principal may ask for client tokens too.
        token_request = post(key=None).replace(b"Host: sim\r\n", b"Host: sim\r\nX-Token: good\r\n")
        assert answer_of(await raw_http(sim, token_request))[0] == 200


async def test_a_broken_verifier_refuses_and_says_so_at_error(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_server(ServerConfig(auth="tests.server.auth_verifier:broken")) as sim:
        _, answer = await upgrade(sim, headers=[(b"X-Token", b"good")])
        assert isinstance(answer, RejectConnection) and answer.status_code == 401
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == [
        "the --auth verifier failed; the request is refused"
    ]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon", "is not 'package.module:callable'"),
        ("tests.server.no_such_module:verify", "cannot be loaded: ModuleNotFoundError"),
        ("tests.server.auth_verifier:missing", "cannot be loaded: AttributeError"),
        ("tests.server.auth_verifier:not_callable", "is not callable"),
    ],
)
def test_a_verifier_that_cannot_be_loaded_exits_2(
    capsys: pytest.CaptureFixture[str], spec: str, says: str
) -> None:

    with pytest.raises(SystemExit) as info:
        main(["serve", "--auth", spec])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.integration
def test_curl_asks_for_a_client_token_that_a_browser_like_client_presents(
    serve: Any, tmp_path: Path
) -> None:

    path = tmp_path / "keys"
    path.write_text("acme: k-acme-123\n")
    server = serve("--api-key-file", str(path))
    base = server.url.replace("ws://", "http://").removesuffix("/v1/duplex")
    request = ["-X", "POST", "-H", "Authorization: Bearer k-acme-123", "-d", '{"ttl_s": 30}']
    result = subprocess.run(
        ["curl", "-s", "--max-time", "10", *request, f"{base}/v1/client_tokens"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    issued = json.loads(result.stdout)
    offered = ["trio-duplex", f"trio-duplex.bearer.{issued['token']}"]
    with ws_connect(server.url, subprotocols=offered) as ws:  # type: ignore[arg-type]
        assert ws.subprotocol == "trio-duplex"
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
    with pytest.raises(InvalidStatus) as refused:  # spent
        with ws_connect(server.url, subprotocols=offered):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 401
    assert issued["token"] not in server.log
