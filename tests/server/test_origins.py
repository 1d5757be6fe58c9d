"""The upgrade's ``Origin`` check (``--allow-origin``) and subprotocol selection: raw HTTP
against the server in memory, then websockets against ``trio-duplex serve``."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin, Subprotocol

from trio_duplex import ServerConfig
from trio_duplex.cli import main
from trio_duplex.server.front.http import same_origin
from trio_duplex.testing import running_server

from ..helpers import UPGRADE_HEAD as HEAD
from ..helpers import RawHttp, Serve

APP = "https://app.example.com"


def head_of(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, the headers (lower-case names) and the body of an HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


async def upgrade(
    raw_http: RawHttp, config: ServerConfig, *headers: str
) -> tuple[int, dict[str, str], bytes]:
    extra = "".join(f"{header}\r\n" for header in headers)
    async with running_server(config) as sim:
        answer = await raw_http(sim, (HEAD + extra + "\r\n").encode())
    return head_of(answer)


# -- origins -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "origin", "status"),
    [
        ((), "https://evil.example", 403),  # no flag: the Host's own origin only
        ((), "http://sim", 101),
        ((), "https://sim", 101),  # a TLS-terminating proxy: Host sim is sim:443 for https
        ((), "http://sim:80", 101),
        ((), "http://sim:8080", 403),
        ((), "http://sim.evil.example", 403),
        ((), "null", 403),
        ((APP,), "https://evil.example", 403),
        ((APP,), APP, 101),
        ((APP,), "http://sim", 403),  # with the flag, the list alone
        ((APP, "http://localhost:3000"), "http://localhost:3000", 101),
        ((APP,), "https://app.example.com:444", 403),  # compared exactly
        ((APP,), None, 101),  # no Origin: not a browser
        ((), None, 101),
        ((APP, "*"), "https://evil.example", 101),
        (("*",), "null", 101),
    ],
)
async def test_origin_is_checked_against_allow_origin(
    autojump_clock: MockClock,
    raw_http: RawHttp,
    allowed: tuple[str, ...],
    origin: str | None,
    status: int,
) -> None:
    headers = () if origin is None else (f"Origin: {origin}",)
    got, _, body = await upgrade(raw_http, ServerConfig(allow_origin=allowed), *headers)
    assert got == status
    if status == 403:
        assert body == b"origin not allowed\n"  # the origin itself is not quoted


@pytest.mark.parametrize(
    ("host", "origin", "status"),
    [
        ("127.0.0.1:8765", "http://127.0.0.1:8765", 101),
        ("127.0.0.1:8765", "http://localhost:8765", 403),  # another origin to a browser
        ("LocalHost:8765", "http://localhost:8765", 101),  # names are case-insensitive
        ("[::1]:8765", "http://[::1]:8765", 101),
        ("[::1]:8765", "http://[::1]:8766", 403),
        ("[::1]", "https://[::1]:443", 101),
        ("app.example.com:443", APP, 101),
        ("app.example.com:80", APP, 403),
        ("app.example.com:8o", "http://app.example.com:8o", 403),
        ("app.example.com:\u00b2", "http://app.example.com:\u00b2", 403),
    ],
)
async def test_without_allow_origin_the_origin_must_be_the_hosts(
    autojump_clock: MockClock, raw_http: RawHttp, host: str, origin: str, status: int
) -> None:
    head = HEAD.replace("Host: sim\r\n", f"Host: {host}\r\n") + f"Origin: {origin}\r\n\r\n"
    async with running_server(ServerConfig()) as sim:
        answer = await raw_http(sim, head.encode("utf-8"))
    assert head_of(answer)[0] == status


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://localhost:8765", "localhost:8765", True),
        ("https://a.example", "a.example", True),
        ("https://a.example", "a.example:443", True),
        ("https://a.example:443", "a.example", True),
        ("http://a.example", "a.example:443", False),
        ("HTTP://A.example:80", "a.EXAMPLE", True),
        ("http://[::1]", "[::1]", True),
        ("http://[::1]:8765", "[::1]:8766", False),
        ("http://[::1", "[::1", False),
        ("http://[]", "[]", False),
        ("http://a.example.evil", "a.example", False),
        ("http://a@b", "a@b", False),
        ("null", "null", False),
        ("file://x", "x", False),
        ("ws://x", "x", False),  # a page's origin is http(s)
        ("http://x:", "x:", False),
        ("http://x:123456", "x:123456", False),
    ],
)
def test_the_same_origin_rule(origin: str, host: str, same: bool) -> None:
    assert same_origin(origin, host) is same


async def test_two_origins_or_two_hosts_get_400(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    twice = HEAD + "Origin: http://sim\r\nOrigin: http://sim\r\n\r\n"
    async with running_server(ServerConfig()) as sim:
        assert head_of(await raw_http(sim, twice.encode()))[0] == 400
        hosts = HEAD + "Host: sim\r\nOrigin: http://sim\r\n\r\n"
        assert head_of(await raw_http(sim, hosts.encode()))[0] == 400


async def test_an_origin_refusal_is_counted_as_such(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(allow_origin=(APP,))) as sim:
        answer = await raw_http(sim, (HEAD + "Origin: https://evil.example\r\n\r\n").encode())
        assert head_of(answer)[0] == 403
        assert sim.server.sessions.totals.refusals == {"origin": 1}


@pytest.mark.parametrize("bad", ["https://app.example.com/", "app.example.com", "https://a b", ""])
def test_an_origin_with_a_path_or_no_scheme_exits_2(
    capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--allow-origin", APP, "--allow-origin", bad])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--allow-origin" in err and "must be * or an origin" in err, err


# -- subprotocols ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "selected"),
    [
        (None, None),
        ("trio-duplex", "trio-duplex"),
        ("chat, trio-duplex", "trio-duplex"),
        ("trio-duplex.bearer.s3cret, trio-duplex", "trio-duplex"),
        ("trio-duplex.bearer.s3cret", None),  # a credential is never echoed back
        ("chat", None),  # not ours: none selected, the handshake goes on
    ],
)
async def test_trio_duplex_is_selected_when_offered_and_nothing_else(
    autojump_clock: MockClock, raw_http: RawHttp, offered: str | None, selected: str | None
) -> None:
    headers = () if offered is None else (f"Sec-WebSocket-Protocol: {offered}",)
    status, answer, _ = await upgrade(raw_http, ServerConfig(), *headers)
    assert status == 101
    assert answer.get("sec-websocket-protocol") == selected


# -- with websockets, against the real command -------------------------------------------


@pytest.mark.integration
def test_websockets_origin_and_subprotocol(serve: Serve) -> None:
    server = serve("--allow-origin", APP, "--allow-origin", "http://localhost:3000")
    options: dict[str, Any] = {"open_timeout": 10, "ping_interval": None}
    with pytest.raises(InvalidStatus) as refused:
        with connect(server.url, origin=Origin("https://evil.example"), **options):
            raise AssertionError("not reached")
    assert refused.value.response.status_code == 403
    for origin in (APP, "http://localhost:3000"):
        with connect(
            server.url,
            origin=Origin(origin),
            subprotocols=[Subprotocol("trio-duplex.bearer.k"), Subprotocol("trio-duplex")],
            **options,
        ) as ws:
            assert ws.subprotocol == "trio-duplex"
            ws.send(json.dumps({"type": "session.update", "session": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    assert "s3cret" not in server.log and "bearer" not in server.log


@pytest.mark.integration
def test_by_default_only_the_hosts_own_origin_may_connect(serve: Serve, tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("acme: k-acme-123\n")
    server = serve()
    options: dict[str, Any] = {"open_timeout": 10, "ping_interval": None}
    with pytest.raises(InvalidStatus) as refused:
        with connect(server.url, origin=Origin("https://evil.example"), **options):
            raise AssertionError("not reached")
    assert refused.value.response.status_code == 403
    own = Origin(f"http://127.0.0.1:{server.port}")
    for origin in (own, None):  # the page's own origin, and a client that is no browser
        with connect(server.url, origin=origin, **options) as ws:
            ws.send(json.dumps({"type": "session.update", "session": {}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    keyed = serve("--api-key-file", str(tmp_path / "keys"))
    post = (
        "POST /v1/client_tokens HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n"
        "Authorization: Bearer k-acme-123\r\nContent-Length: 0\r\n\r\n"
    )
    for page, status in (("https://evil.example", 403), (f"http://127.0.0.1:{keyed.port}", 200)):
        request = post.format(port=keyed.port, origin=page).encode()
        with socket.create_connection(("127.0.0.1", keyed.port), timeout=10) as sock:
            sock.sendall(request)
            answer = sock.recv(65536)
        assert head_of(answer)[0] == status, answer
    anyone = serve("--allow-origin", "*")
    with connect(anyone.url, origin=Origin("https://evil.example"), **options) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
