"""docs/protocol.md, Transport, as the shell serves it: the endpoint and the HTTP upgrade,
binary frames, the first message's event_id, that the server reads with max_event_bytes
(exactly it passes, one byte over is 1009, before and after the session opens), pings,
ordering, and bad frames that must never take down the server or another session.

The rules themselves are plain tests of the sans-IO parts: how a message is measured
against the bound (UTF-8 bytes, fragment headers counted, the first fault decides) in
tests/core/test_event_bound.py and tests/core/test_frames.py; what an ill-shaped message
is refused as and the event_id an error echoes in tests/core/test_event_id.py and
tests/dialects/test_native.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock
from trio_websocket import ConnectionRejected, wrap_client_stream

from trio_duplex import ServerConfig
from trio_duplex.testing import Simulation, running_server

from ..helpers import RawClient, RawHttp, RawWs, echo, echo_message

UPGRADE = (
    "GET {path} HTTP/1.1\r\n"
    "Host: sim\r\n"
    "Upgrade: websocket\r\n"
    "Connection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\n"
    "\r\n"
)


def status_of(answer: bytes) -> int:
    first = answer.split(b"\r\n", 1)[0].decode("latin-1")
    assert first.startswith("HTTP/1.1 "), answer
    return int(first.split()[1])


async def assert_still_serving(sim: Simulation, text: str = "still here") -> None:
    """A brand-new session opens and echoes."""
    client, _ = await sim.open_session()
    reply = await client.send_and_receive({"type": "input.text.append", "text": text})
    assert reply["type"] == "response.output_text.delta"
    assert reply["text"] == text


# -- endpoint -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/other", "/", "/v1/duplex/", "/v1/duplexx", "/v2/duplex"])
async def test_upgrade_for_another_path_is_rejected_with_404(
    autojump_clock: MockClock, raw_http: RawHttp, path: str
) -> None:
    async with running_server() as sim:
        answer = await raw_http(sim, UPGRADE.format(path=path).encode())
        assert status_of(answer) == 404
        assert sim.server.slots_held == 0
        await assert_still_serving(sim)


async def test_trio_websocket_client_sees_404_as_a_rejected_handshake(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        stream, _ = await sim.listener.connect()
        statuses = set()
        try:
            # trio-websocket raises the rejection from its reader task too: own nursery.
            async with trio.open_nursery() as nursery:
                # trio-websocket annotates it SocketStream | SSLStream; any trio Stream works:
                await wrap_client_stream(nursery, stream, "sim", "/v1/other?autostart=1")  # type: ignore[arg-type]
        except* ConnectionRejected as group:
            statuses = {
                exc.status_code for exc in group.exceptions if isinstance(exc, ConnectionRejected)
            }
        assert statuses == {404}
        assert sim.server.slots_held == 0
        await assert_still_serving(sim)


async def test_configured_path_is_the_endpoint(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server(ServerConfig(path="/custom/ws")) as sim:
        answer = await raw_http(sim, UPGRADE.format(path="/v1/duplex").encode())
        assert status_of(answer) == 404
        client = await sim.connect("/custom/ws")
        created = await client.send_and_receive({"type": "session.update", "session": {}})
        assert created["type"] == "session.created"


async def test_query_string_does_not_change_the_path(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect("/v1/duplex?client=test")
        created = await client.send_and_receive({"type": "session.update", "session": {}})
        assert created["type"] == "session.created"


@pytest.mark.parametrize("path", ["/v1/duplex", "/elsewhere"])
async def test_request_that_is_not_an_upgrade_gets_400(
    autojump_clock: MockClock, raw_http: RawHttp, path: str
) -> None:
    async with running_server() as sim:
        answer = await raw_http(sim, f"GET {path} HTTP/1.1\r\nHost: sim\r\n\r\n".encode())
        assert status_of(answer) == 400
        await assert_still_serving(sim)


async def test_garbage_instead_of_http_does_not_take_down_the_server(
    autojump_clock: MockClock, raw_http: RawHttp
) -> None:
    async with running_server() as sim:
        await raw_http(sim, b"\x00\xff not http at all\r\n\r\n")
        await assert_still_serving(sim)


# -- text frames, binary frames, event_id ------------------------------------------------


async def test_binary_first_frame_is_bad_event_and_opens_nothing(autojump_clock: MockClock) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        await client.send_raw(b'{"type":"session.update","session":{}}')
        error = await client.receive()
        assert error["type"] == "error"
        assert error["code"] == "bad_event"
        assert error["retryable"] is False
        assert sim.server.slots_held == 0
        # The connection is still waiting for a first message.
        created = await client.send_and_receive({"type": "session.update", "session": {}})
        assert created["type"] == "session.created"


async def test_binary_frame_mid_session_is_bad_event_and_session_goes_on(
    autojump_clock: MockClock,
) -> None:
    async with running_server() as sim:
        client, _ = await sim.open_session()
        await client.send_raw(b"\x00\x01\x02")
        error = await client.receive()
        assert (error["type"], error["code"]) == ("error", "bad_event")
        assert "server_event_seq" not in error
        reply = await echo(client, "after binary")
        assert reply["server_event_seq"] == 1


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"type": "no.such.event"}, "unknown_event"),
        ({"type": "input.text.append", "text": 5}, "bad_event"),
        ({"type": "session.event_ack", "server_event_seq": 3}, "invalid_event_ack"),
        ({"type": "session.update", "session": []}, "bad_event"),
    ],
)
async def test_event_id_is_echoed_for_a_bad_first_message(
    autojump_clock: MockClock, event: dict[str, Any], code: str
) -> None:
    async with running_server() as sim:
        client = await sim.connect()
        error = await client.send_and_receive({**event, "event_id": "first-1"})
        assert (error["type"], error["code"]) == ("error", code)
        assert error["event_id"] == "first-1"
        assert sim.server.slots_held == 0


# -- max_event_bytes ----------------------------------------------------------------------


async def test_message_of_exactly_max_event_bytes_is_accepted(autojump_clock: MockClock) -> None:
    async with running_server(ServerConfig(max_event_bytes=100)) as sim:
        client, _ = await sim.open_session()
        await client.send_raw(echo_message(100))
        reply = await client.receive()
        assert reply["type"] == "response.output_text.delta"
        await client.send_raw(echo_message(100, "é"))
        reply = await client.receive()
        assert reply["text"] == "é" * ((100 - 38) // 2)


@pytest.mark.parametrize("first", [True, False], ids=["first-message", "mid-session"])
async def test_one_byte_over_max_event_bytes_closes_1009(
    autojump_clock: MockClock, first: bool
) -> None:
    async with running_server(ServerConfig(max_event_bytes=100)) as sim:
        if first:
            client = await sim.connect()
        else:
            client, _ = await sim.open_session()
        await client.send_raw(echo_message(101))
        assert await client.receive_until_closed() == []
        assert client.close_code == 1009
        assert sim.server.slots_held == (0 if first else 1)  # a lost session is detached
        await assert_still_serving(sim)


async def test_1009_detaches_the_session_which_stays_resumable(autojump_clock: MockClock) -> None:
    # 300, not 100: a session.resume itself is about 150 bytes.
    async with running_server(ServerConfig(max_event_bytes=300)) as sim:
        client, created = await sim.open_session()
        await echo(client, "one")
        await client.send_raw("x" * 500)
        await client.receive_until_closed()
        assert client.close_code == 1009
        client2, resumed = await sim.resume(created["session_id"], created["resume_token"], 1)
        assert resumed["type"] == "session.resumed"
        reply = await echo(client2, "two")
        assert reply["server_event_seq"] == 2


# -- frames that must not take down the server -------------------------------------------


def _junk(client: RawClient, kind: str) -> bytes:
    big = "x" * 300
    if kind == "oversize-text":
        return client.frame(big)
    if kind == "oversize-binary":
        return client.frame(big.encode())
    if kind == "oversize-multibyte":
        return client.frame("é" * 60)
    if kind == "binary":
        return client.frame(b"\x00")
    if kind == "invalid-json":
        return client.frame("{")
    if kind == "bad-utf8":
        # A text frame (opcode 1, FIN, masked with a zero key) whose payload is not UTF-8.
        return bytes([0x81, 0x80 | 2, 0, 0, 0, 0, 0xC3, 0x28])
    if kind == "unmasked":
        return bytes([0x81, 2]) + b"{}"
    if kind == "reserved-bits":
        return bytes([0x81 | 0x70, 0x80 | 2, 0, 0, 0, 0]) + b"{}"
    if kind == "ping":
        return bytes([0x89, 0x80, 0, 0, 0, 0])
    if kind == "close":
        return bytes([0x88, 0x82, 0, 0, 0, 0, 0x03, 0xE8])
    if kind == "fragment-over-bound":
        return client.frame("y" * 300, fin=False)
    raise AssertionError(kind)


JUNK_COMBINATIONS = [
    ("oversize-text", "oversize-text"),
    ("oversize-text", "oversize-text", "oversize-text"),
    ("oversize-binary", "oversize-binary"),
    ("oversize-text", "oversize-binary"),
    ("oversize-multibyte", "oversize-multibyte"),
    ("fragment-over-bound", "oversize-text"),
    ("oversize-text", "bad-utf8"),
    ("bad-utf8", "bad-utf8"),
    ("bad-utf8", "oversize-text"),
    ("oversize-text", "unmasked"),
    ("unmasked", "unmasked"),
    ("reserved-bits", "oversize-text"),
    ("oversize-text", "ping", "oversize-text"),
    ("oversize-text", "close"),
    ("close", "oversize-text"),
    ("invalid-json", "binary", "oversize-text", "oversize-text"),
]


@pytest.mark.parametrize("kinds", JUNK_COMBINATIONS, ids="+".join)
@pytest.mark.parametrize("when", ["before-first-message", "mid-session"])
async def test_bad_frames_in_one_write_never_take_down_the_server(
    autojump_clock: MockClock, raw_ws: RawWs, kinds: tuple[str, ...], when: str
) -> None:
    async with running_server(ServerConfig(max_event_bytes=100)) as sim:
        bystander, _ = await sim.open_session()
        await echo(bystander, "before")
        attacker = await raw_ws(sim)
        if when == "mid-session":
            await attacker.send({"type": "session.update", "session": {}})
            assert (await attacker.receive())["type"] == "session.created"
        payload = b"".join(_junk(attacker, kind) for kind in kinds)
        with trio.fail_after(60):
            await attacker.send_bytes(payload)  # all frames in ONE write
            await attacker.receive_until_closed()
        # The bystander's session and brand-new sessions are unaffected.
        reply = await echo(bystander, "after")
        assert reply["server_event_seq"] == 2
        await assert_still_serving(sim)
        assert bystander.close_code is None


def _random_junk(rng: random.Random) -> bytes:
    """Frames with random header bits, lengths and masks, cut anywhere, or plain noise."""
    parts = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.25:
            parts.append(rng.randbytes(rng.randint(1, 40)))
            continue
        if rng.random() < 0.3:
            payload = json.dumps({"type": "input.text.append", "text": "x"}).encode()
        else:
            payload = rng.randbytes(rng.choice([0, 1, 5, 125, 126, 127, 300, 70_000]))
            if rng.random() < 0.5:
                payload = bytes(b & 0x7F for b in payload)  # ASCII: valid UTF-8
        length = len(payload)
        fin = 0x80 if rng.random() < 0.8 else 0
        rsv = 0 if rng.random() < 0.85 else rng.randrange(1, 8) << 4
        opcode = rng.choice([0, 1, 1, 1, 2, 8, 9, 10]) if rng.random() < 0.9 else rng.randrange(16)
        b0 = fin | rsv | opcode
        code = length if length < 126 else 126 if length < 65536 else 127
        b1 = (0x80 if rng.random() < 0.9 else 0) | code
        head = bytes((b0, b1))
        if code == 126:
            head += length.to_bytes(2, "big")
        elif code == 127:
            head += length.to_bytes(8, "big")
        key = rng.randbytes(4)
        frame = head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        parts.append(frame[: rng.randint(1, len(frame))] if rng.random() < 0.2 else frame)
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(60))
async def test_random_bytes_after_the_handshake_end_only_that_connection(
    autojump_clock: MockClock, raw_ws: RawWs, seed: int
) -> None:
    """Whatever a client writes after the 101, the server ends that connection with a
    close code (or keeps it, for what is valid), and nobody else notices."""
    rng = random.Random(seed)
    async with running_server(ServerConfig(max_event_bytes=1000)) as sim:
        bystander, _ = await sim.open_session()
        attacker = await raw_ws(sim)
        if rng.random() < 0.5:
            await attacker.send({"type": "session.update", "session": {}})
            assert (await attacker.receive())["type"] == "session.created"
        with trio.fail_after(120):
            await attacker.send_bytes(_random_junk(rng))
            assert isinstance(attacker.stream, trio.abc.HalfCloseableStream)
            await attacker.stream.send_eof()  # then the peer's FIN
            events = await attacker.receive_until_closed()
        assert all(isinstance(event, dict) and "type" in event for event in events)
        # 1006: the junk was valid up to our FIN, so the server saw the peer go without a
        # close frame and ended the TCP connection likewise.
        assert attacker.close_code in (1000, 1001, 1002, 1006, 1007, 1009), attacker.close_code
        reply = await echo(bystander, "after")
        assert reply["server_event_seq"] == 1
        await assert_still_serving(sim)
        assert bystander.close_code is None


# -- pings ----------------------------------------------------------------------------------


async def test_server_pings_every_20_seconds(autojump_clock: MockClock, raw_ws: RawWs) -> None:
    async with running_server() as sim:
        client = await raw_ws(sim)
        await client.send({"type": "session.update", "session": {}})
        assert (await client.receive())["type"] == "session.created"
        start = trio.current_time()
        with trio.move_on_after(65):
            await client.receive()
        # answered pings keep the connection: three of them in 65 s
        assert client.pings == 3
        assert client.close_code is None
        assert trio.current_time() - start == pytest.approx(65)
        session = next(iter(sim.server.sessions.registry.sessions.values()))
        assert session.state.value == "attached"


async def test_unanswered_ping_loses_the_connection_after_20_seconds(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    async with running_server() as sim:
        client = await raw_ws(sim, answer_pings=False)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        session = sim.server.sessions.registry.sessions[created["session_id"]]
        start = trio.current_time()
        await trio.sleep(39.5)
        assert session.state.value == "attached"
        await trio.sleep(1)
        assert session.state.value == "detached"
        assert trio.current_time() - start == pytest.approx(40.5)
        # Lost means detached, not closed: a resume within the grace works.
        _, resumed = await sim.resume(created["session_id"], created["resume_token"])
        assert resumed["type"] == "session.resumed"


async def test_every_server_frame_is_a_json_text_object(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    async with running_server() as sim:
        client = await raw_ws(sim)
        await client.send({"type": "session.update", "session": {}})
        await client.send({"type": "session.heartbeat"})
        await client.send({"type": "input.text.append", "text": "t"})
        await client.send({"type": "nope"})
        # (The close waits for the echo: output the engine has not produced when the
        # close is read is not sent, docs/protocol.md.)
        events = [await client.receive() for _ in range(4)]  # a binary frame raises
        await client.send({"type": "session.close"})
        events += await client.receive_until_closed()
        types = [event["type"] for event in events]
        # The engine's output and the reader's answers are not ordered with each other.
        assert (types[0], sorted(types[1:-1]), types[-1]) == (
            "session.created",
            ["error", "response.output_text.delta", "session.heartbeat_ack"],
            "session.closed",
        )
        assert all(isinstance(event, dict) for event in events)
        assert json.loads(json.dumps(events)) == events


# -- ordering -------------------------------------------------------------------------------


async def test_answers_arrive_in_the_order_their_messages_were_read(
    autojump_clock: MockClock, raw_ws: RawWs
) -> None:
    """docs/protocol.md, Transport, Ordering: errors and heartbeat acks, in read order,
    for messages that arrive together (one write) as for messages one by one."""
    async with running_server() as sim:
        client = await raw_ws(sim)
        await client.send({"type": "session.update", "session": {}})
        created = await client.receive()
        ack = {"type": "session.heartbeat_ack", "session_id": created["session_id"]}
        for burst in (True, False):
            expected: list[tuple[str, str | None]] = []
            frames: list[bytes] = []
            for n in range(3):  # the mix, sent without waiting for any answer
                frames += [
                    client.frame('{"type": "input.text.append", "text": '),  # bad JSON
                    client.frame(json.dumps({"type": "nope", "event_id": f"u{n}"})),
                    client.frame(json.dumps({"type": "session.heartbeat"})),
                    client.frame(
                        json.dumps(
                            {
                                "type": "session.event_ack",
                                "server_event_seq": 9,
                                "event_id": f"a{n}",
                            }
                        )
                    ),
                    client.frame(json.dumps({"type": "session.heartbeat"})),
                ]
                expected += [
                    ("invalid_json", None),
                    ("unknown_event", f"u{n}"),
                    ("ack", None),
                    ("invalid_event_ack", f"a{n}"),
                    ("ack", None),
                ]
            if burst:
                await client.send_bytes(b"".join(frames))
            else:
                for frame in frames:
                    await client.send_bytes(frame)
                    await trio.testing.wait_all_tasks_blocked()
            got: list[tuple[str, str | None]] = []
            for _ in expected:
                answer = await client.receive()
                if answer["type"] == "error":
                    got.append((answer["code"], answer.get("event_id")))
                else:
                    assert answer == ack
                    got.append(("ack", None))
            assert got == expected, burst
        await client.send({"type": "input.text.append", "text": "on"})
        assert (await client.receive())["server_event_seq"] == 1  # the session went on
