"""The HTTP upgrade against a hostile client: bounded in time and size, answered
promptly, whatever the bytes and however they arrive."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from trio_duplex import ServerConfig
from trio_duplex.testing import running_server

from ..helpers import UPGRADE_HEAD as HEAD
from ..helpers import RawHttp, echo


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_headers_over_16_kib_in_one_write_get_431(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    # Was: the bound was checked only between reads, so 64 KiB in one write got through.
    padding = "".join(f"X-Pad-{i}: {'p' * 1000}\r\n" for i in range(64))
    async with running_server() as sim:
        answer = await raw_http(sim, (HEAD + padding + "\r\n").encode())
        assert status_of(answer) == 431
        client, _ = await sim.open_session()
        await echo(client)


async def test_a_request_with_bare_line_feeds_gets_400_at_once(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    # Was: the server waited for a CR LF CR LF that never came: 10 s, then a silent close.
    async with running_server() as sim:
        start = trio.current_time()
        answer = await raw_http(sim, HEAD.replace("\r\n", "\n").encode() + b"\n")
        assert status_of(answer) == 400
        assert trio.current_time() == start


@pytest.mark.parametrize(
    ("request_text", "why"),
    [
        (HEAD + "Content-Length: 5\r\n\r\nhello", b"an upgrade request has no body"),
        (
            HEAD + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"transfer codings are not supported",
        ),
        # Smuggling-shaped: both, which a proxy and the server might read differently.
        (
            HEAD + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"transfer codings are not supported",
        ),
        ("POST /v1/duplex HTTP/1.1\r\nHost: sim\r\nContent-Length: 2\r\n\r\nhi", b"no body"),
        ("GARBAGE\r\n\r\n", b"not a valid HTTP/1.1 request"),
    ],
)
async def test_requests_with_a_body_or_not_http_get_400_at_once(
    autojump_clock: MockClock, raw_http: RawHttp, request_text: str, why: bytes
) -> None:
    # Was: a silent close.
    async with running_server() as sim:
        start = trio.current_time()
        answer = await raw_http(sim, request_text.encode())
        assert status_of(answer) == 400
        assert why in answer
        assert b"GARBAGE" not in answer  # nothing of the request is echoed
        assert trio.current_time() == start
        assert sim.server.slots_held == 0


async def test_the_whole_upgrade_is_bounded_by_handshake_timeout(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(handshake_timeout_s=2.5)) as sim:
        start = trio.current_time()
        answer = await raw_http(sim, HEAD.encode())  # never finished: no empty line
        assert answer == b""
        assert trio.current_time() - start == 2.5


async def test_a_client_event_seq_far_ahead_is_refused_and_numbering_goes_on(
    autojump_clock: MockClock,
) -> None:
    # Was: a jump to 10**12 was accepted, and every later event (seq 2, 3, ...) was then
    # dropped as a resend: the session fell silent. Protocol v2: only the next seq is
    # taken; one further ahead is refused (retryable), naming the seq expected.
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await echo(client, "one", seq=1)
        refused = await client.send_and_receive(
            {"type": "input.text.append", "text": "jump", "client_event_seq": 10**12}
        )
        assert (refused["code"], refused["param"]) == (
            "unexpected_client_event_seq",
            "client_event_seq",
        )
        assert refused["retryable"] is True
        assert (refused["expected_client_event_seq"], refused["client_event_seq"]) == (2, 10**12)
        assert (await echo(client, "two", seq=2))["server_event_seq"] == 2
