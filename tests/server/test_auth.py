"""API keys (--api-key-file): who may open a session, and a resume token as the credential
of that session's resume."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock
from wsproto.events import AcceptConnection, RejectConnection, Request

from trio_duplex import ServerConfig
from trio_duplex.server.auth import KeyFileError, KeyRing, presented
from trio_duplex.testing import ScriptedEngine, Simulation, running_server

from ..helpers import RawClient, RawHttp

KEYS = "# customers\nacme: k-acme-123\n\n  globex : k-globex-456  \n"
HEAD = (
    "GET /v1/duplex HTTP/1.1\r\n"
    "Host: sim\r\n"
    "Upgrade: websocket\r\n"
    "Connection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\n"
)


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


async def upgrade(
    sim: Simulation,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    protocols: Sequence[str] = (),
) -> tuple[RawClient, Any]:
    stream, _ = await sim.listener.connect()
    client = RawClient(stream)
    request = Request(
        host="sim", target="/v1/duplex", extra_headers=list(headers), subprotocols=list(protocols)
    )
    await client.send_bytes(client.ws.send(request))
    return client, await client.next_event()


def bearer(credential: str) -> list[tuple[bytes, bytes]]:
    return [(b"Authorization", f"Bearer {credential}".encode())]


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
        by_header, answer = await upgrade(sim, headers=bearer("k-acme-123"))
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
        first, _ = await upgrade(sim, headers=bearer("k-acme-123"))
        await first.send({"type": "session.update", "session": {}})
        created = await first.receive()
        other, _ = await upgrade(sim, headers=bearer("k-acme-123"))
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
            client, answer = await upgrade(sim, headers=bearer(token))
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
        _, answer = await upgrade(sim, headers=bearer("not-a-token"))
        assert isinstance(answer, RejectConnection) and answer.status_code == 401


# -- the real server: reload, and our own client ----------------------------------------


@pytest.mark.integration
def test_sighup_reloads_the_keys_and_a_bad_file_keeps_the_old_ones(
    serve: Any, tmp_path: Path
) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    path = tmp_path / "keys"
    path.write_text("acme: old-key\n")
    server = serve("--api-key-file", str(path))

    def opens(key: str) -> bool:
        try:
            with connect(server.url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
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
    from trio_duplex.cli import main

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
    from trio_duplex import DuplexServer
    from trio_duplex.client import ClientOptions, ServerRefused, connect
    from trio_duplex.engines.echo import EchoEngine

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
