"""The upgrade's ``Origin`` check (``--allow-origin``) and subprotocol selection: raw HTTP
against the server in memory, then websockets against ``trio-duplex serve``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from trio.testing import MockClock
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin, Subprotocol

from trio_duplex import ServerConfig
from trio_duplex.cli import main
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
        ((), "https://evil.example", 101),  # no flag: any origin
        ((APP,), "https://evil.example", 403),
        ((APP,), APP, 101),
        ((APP, "http://localhost:3000"), "http://localhost:3000", 101),
        ((APP,), "https://app.example.com:444", 403),  # compared exactly
        ((APP,), None, 101),  # no Origin: not a browser
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
