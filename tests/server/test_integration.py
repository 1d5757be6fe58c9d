"""End to end: ``python -m trio_duplex serve`` in a subprocess, driven over real sockets by
an independent client (the ``websockets`` package) and by raw sockets.

Every wait is bounded; the ``serve``/``serve_module`` fixtures stop the process in a finally.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import ANY

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from ..helpers import Serve, ServerProcess

pytestmark = pytest.mark.integration

TIMEOUT = 5.0
SHARED_FLAGS = ("--max-event-bytes", "4096", "--disconnect-grace", "30")


@pytest.fixture(scope="module")
def shared(serve_module: Serve) -> ServerProcess:
    """One server for the tests that need no special flags."""
    return serve_module(*SHARED_FLAGS)


# -- helpers -----------------------------------------------------------------------------------


@contextmanager
def ws_connect(url: str, **kwargs: Any) -> Iterator[ClientConnection]:
    options: dict[str, Any] = {
        "open_timeout": TIMEOUT,
        "close_timeout": 2,
        "max_size": None,
        "ping_interval": None,
    }
    options.update(kwargs)
    with connect(url, **options) as ws:
        yield ws


def recv(ws: ClientConnection, timeout: float = TIMEOUT) -> dict[str, Any]:
    message = ws.recv(timeout=timeout)
    assert isinstance(message, str), message
    event: dict[str, Any] = json.loads(message)
    return event


def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    ws.send(json.dumps(event))


def request(ws: ClientConnection, event: dict[str, Any]) -> dict[str, Any]:
    send(ws, event)
    return recv(ws)


def until_closed(
    ws: ClientConnection, timeout: float = TIMEOUT
) -> tuple[list[dict[str, Any]], int | None]:
    """Every event until the server closes, and the close code it sent."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"still open after {timeout}s; got {events}"
            events.append(recv(ws, left))
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
        return events, code


def open_session(ws: ClientConnection, config: dict[str, Any] | None = None) -> dict[str, Any]:
    created = request(ws, {"type": "session.update", "session": config or {}})
    assert created["type"] == "session.created", created
    return created


def echo(ws: ClientConnection, text: str) -> dict[str, Any]:
    reply = request(ws, {"type": "input.text.append", "text": text})
    assert reply["type"] == "response.output_text.delta", reply
    assert reply["text"] == text
    return reply


def resume(
    ws: ClientConnection, created: dict[str, Any], last: int, token: str | None = None
) -> dict[str, Any]:
    return request(
        ws,
        {
            "type": "session.resume",
            "session_id": created["session_id"],
            "resume_token": token or created["resume_token"],
            "last_received_server_event_seq": last,
        },
    )


def raw_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def raw_http(port: int, data: bytes) -> bytes:
    with raw_socket(port) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


def http_status(answer: bytes) -> int:
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    assert line.startswith("HTTP/1.1 "), answer
    return int(line.split()[1])


def raw_ws(port: int, path: str = "/v1/duplex") -> tuple[socket.socket, bytes]:
    """A raw socket after a successful WebSocket handshake, and any bytes read past it."""
    sock = raw_socket(port)
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        assert chunk, answer
        answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert http_status(head) == 101, head
    return sock, rest


def client_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """One masked client frame."""
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + masked


class FrameReader:
    """Reads the server's (unmasked) frames from a raw socket."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self.sock = sock
        self.data = buffered

    def _need(self, n: int) -> None:
        while len(self.data) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "the stream ended in the middle of a frame, or before a close frame"
            self.data += chunk

    def frame(self) -> tuple[int, bytes]:
        self._need(2)
        opcode, length = self.data[0] & 0x0F, self.data[1] & 0x7F
        offset = 2
        if length == 126:
            self._need(4)
            (length,) = struct.unpack("!H", self.data[2:4])
            offset = 4
        elif length == 127:
            self._need(10)
            (length,) = struct.unpack("!Q", self.data[2:10])
            offset = 10
        self._need(offset + length)
        payload = self.data[offset : offset + length]
        self.data = self.data[offset + length :]
        return opcode, payload

    def event(self) -> dict[str, Any]:
        opcode, payload = self.frame()
        assert opcode == 1, (opcode, payload)
        event: dict[str, Any] = json.loads(payload)
        return event

    def until_close(self) -> tuple[list[tuple[int, bytes]], int]:
        """Frames until the server's Close frame, and its code."""
        frames: list[tuple[int, bytes]] = []
        while True:
            opcode, payload = self.frame()
            if opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                return frames, code
            frames.append((opcode, payload))


# -- open, echo, close -----------------------------------------------------------------------


def test_open_echo_heartbeat_close(shared: ServerProcess) -> None:
    with ws_connect(shared.url) as ws:
        created = open_session(ws, {"voice": "alto"})
        assert created["session"] == {"voice": "alto"}
        assert created["attachment_generation"] == 1
        assert created["limits"]["max_event_bytes"] == 4096
        assert created["limits"]["disconnect_grace_s"] == 30
        assert "server_event_seq" not in created
        assert [echo(ws, t)["server_event_seq"] for t in ("a", "b", "c")] == [1, 2, 3]
        ack = request(ws, {"type": "session.heartbeat"})
        assert ack == {"type": "session.heartbeat_ack", "session_id": created["session_id"]}
        send(ws, {"type": "session.close"})
        events, code = until_closed(ws)
        assert events == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "client_close",
                "usage": ANY,
            }
        ]
        assert code == 1000


def test_autostart_and_first_event_opens(shared: ServerProcess) -> None:
    with ws_connect(shared.url + "?autostart=1") as ws:
        created = recv(ws)
        assert created["type"] == "session.created"
    with ws_connect(shared.url) as ws:
        send(ws, {"type": "input.text.append", "text": "first"})
        assert recv(ws)["type"] == "session.created"
        assert recv(ws)["server_event_seq"] == 1


def test_large_message_under_a_big_bound_is_accepted(serve: Serve) -> None:
    # Over trio-websocket's own 1 MiB default, under --max-event-bytes.
    server = serve("--max-event-bytes", str(3 * 1024 * 1024))
    with ws_connect(server.url) as ws:
        open_session(ws)
        big = "é" * (1024 * 1024)  # 1 Mi characters, 2 MiB of UTF-8
        ws.send(json.dumps({"type": "input.text.append", "text": big}, ensure_ascii=False))
        reply = recv(ws, timeout=20)
        assert reply["text"] == big


# -- resume and takeover ---------------------------------------------------------------------


def test_resume_with_replay_after_a_close_frame(shared: ServerProcess) -> None:
    with ws_connect(shared.url) as ws:
        created = open_session(ws)
        for t in ("one", "two", "three"):
            echo(ws, t)
    with ws_connect(shared.url) as ws:
        resumed = resume(ws, created, 1)
        assert resumed["type"] == "session.resumed"
        assert resumed["attachment_generation"] == 2
        assert resumed["resume_token"] != created["resume_token"]
        replay = [recv(ws) for _ in range(2)]
        assert [(e["text"], e["server_event_seq"]) for e in replay] == [("two", 2), ("three", 3)]
        assert echo(ws, "four")["server_event_seq"] == 4


def test_resume_after_a_dropped_socket(shared: ServerProcess) -> None:
    sock, rest = raw_ws(shared.port)
    with sock:
        sock.sendall(client_frame(1, b'{"type":"session.update","session":{}}'))
        sock.sendall(client_frame(1, b'{"type":"input.text.append","text":"kept"}'))
        reader = FrameReader(sock, rest)
        created = reader.event()
        assert created["type"] == "session.created"
        assert reader.event()["server_event_seq"] == 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # closed with RST: no close frame
    with ws_connect(shared.url) as ws:
        resumed = resume(ws, created, 0)
        assert resumed["type"] == "session.resumed"
        replayed = recv(ws)
        assert (replayed["text"], replayed["server_event_seq"]) == ("kept", 1)


def test_takeover_moves_the_session_and_closes_the_old_connection_4000(
    shared: ServerProcess,
) -> None:
    with ws_connect(shared.url) as old:
        created = open_session(old)
        echo(old, "before")
        with ws_connect(shared.url) as new:
            resumed = resume(new, created, 1)
            assert resumed["type"] == "session.resumed"
            assert resumed["attachment_generation"] == 2
            events, code = until_closed(old)
            assert events == [
                {
                    "type": "session.replaced",
                    "session_id": created["session_id"],
                    "attachment_generation": 2,
                }
            ]
            assert code == 4000
            assert echo(new, "after")["server_event_seq"] == 2


def test_resume_refusals_close_4001(shared: ServerProcess) -> None:
    with ws_connect(shared.url) as ws:
        created = open_session(ws)
    cases = [
        ({"session_id": "sess_nope", "resume_token": "x"}, "session_resume_expired"),
        ({"session_id": created["session_id"], "resume_token": "wrong"}, "invalid_resume_token"),
        ({"session_id": created["session_id"]}, "invalid_session_resume"),
    ]
    for fields, code in cases:
        with ws_connect(shared.url) as ws:
            send(ws, {"type": "session.resume", **fields})
            events, close = until_closed(ws)
            assert [e["code"] for e in events] == [code]
            assert close == 4001


# -- bad input -------------------------------------------------------------------------------


def test_invalid_json_and_binary_are_errors_not_closes(shared: ServerProcess) -> None:
    with ws_connect(shared.url) as ws:
        open_session(ws)
        ws.send("{nope")
        assert recv(ws)["code"] == "invalid_json"
        ws.send(b"\x00\x01")
        assert recv(ws)["code"] == "bad_event"
        error = request(ws, {"type": "input.text.append", "text": 1, "event_id": "e9"})
        assert (error["code"], error["param"], error["event_id"]) == ("bad_event", "text", "e9")
        assert echo(ws, "fine")["server_event_seq"] == 1


@pytest.mark.parametrize(
    "message",
    ["x" * 4097, "é" * 2500, b"\x00" * 5000],
    ids=["ascii-4097-bytes", "2500-chars-5000-bytes", "binary-5000-bytes"],
)
def test_oversize_message_closes_1009(shared: ServerProcess, message: str | bytes) -> None:
    with ws_connect(shared.url) as ws:
        open_session(ws)
        ws.send(message)
        events, code = until_closed(ws)
        assert events == []
        assert code == 1009


def test_oversize_fragmented_message_closes_1009(shared: ServerProcess) -> None:
    # Raw frames, all in ONE write: the server may close as soon as the running total
    # passes the bound (before the last fragment has arrived), and a client sending the
    # fragments one by one would then fail its own send at random.
    sock, rest = raw_ws(shared.port)
    with sock:
        sock.sendall(client_frame(1, b'{"type":"session.update","session":{}}'))
        reader = FrameReader(sock, rest)
        assert reader.event()["type"] == "session.created"
        piece = ("é" * 1000).encode()  # 3 fragments of 2000 bytes: 6000 > 4096
        sock.sendall(
            client_frame(1, piece, fin=False)
            + client_frame(0, piece, fin=False)
            + client_frame(0, piece)
        )
        frames, code = reader.until_close()
        assert frames == []
        assert code == 1009


def test_fragmented_message_under_the_bound_is_one_event(shared: ServerProcess) -> None:
    with ws_connect(shared.url) as ws:
        open_session(ws)
        text = json.dumps({"type": "input.text.append", "text": "y" * 3000})
        ws.send([text[:1000], text[1000:2000], text[2000:]])
        reply = recv(ws)
        assert reply["text"] == "y" * 3000


def test_two_oversize_frames_in_one_tcp_write_do_not_take_down_the_server(
    shared: ServerProcess,
) -> None:
    with ws_connect(shared.url) as bystander:
        open_session(bystander)
        echo(bystander, "before")
        sock, rest = raw_ws(shared.port)
        with sock:
            sock.sendall(client_frame(1, b'{"type":"session.update","session":{}}'))
            big = b"z" * 10000
            sock.sendall(client_frame(1, big) + client_frame(1, big))  # ONE write
            frames, code = FrameReader(sock, rest).until_close()
            assert code == 1009
            assert [json.loads(p)["type"] for _, p in frames] == ["session.created"]
        # Same again before any first message, with binary frames.
        sock, rest = raw_ws(shared.port)
        with sock:
            sock.sendall(client_frame(2, big) + client_frame(2, big) + client_frame(1, big))
            _, code = FrameReader(sock, rest).until_close()
            assert code == 1009
        assert echo(bystander, "after")["server_event_seq"] == 2
    with ws_connect(shared.url) as ws:
        open_session(ws)
        echo(ws, "new sessions still open")


def test_other_path_is_404_and_non_upgrade_is_400(shared: ServerProcess) -> None:
    with pytest.raises(InvalidStatus) as info:
        with ws_connect(shared.url.replace("/v1/duplex", "/v1/elsewhere")):
            pass
    assert info.value.response.status_code == 404
    answer = raw_http(shared.port, b"GET /v1/duplex HTTP/1.1\r\nHost: x\r\n\r\n")
    assert http_status(answer) == 400
    with ws_connect(shared.url) as ws:
        open_session(ws)


# -- admission -------------------------------------------------------------------------------


def test_admission_with_max_sessions_1(serve: Serve) -> None:
    server = serve("--max-sessions", "1")
    with ws_connect(server.url) as first:
        open_session(first)
        with ws_connect(server.url) as second:
            send(second, {"type": "session.update", "session": {}})
            events, code = until_closed(second)
            assert [(e["code"], e["retryable"]) for e in events] == [("resource_exhausted", True)]
            assert code == 1013
        send(first, {"type": "session.close"})
        assert until_closed(first)[1] == 1000
    # The slot is free before session.closed is sent: reopen at once.
    with ws_connect(server.url) as third:
        open_session(third)


# -- shutdown ------------------------------------------------------------------------------------


def test_sigint_drains_then_closes_1001_and_exits_0(serve: Serve) -> None:
    drain = 1.5
    server = serve("--drain-timeout", str(drain))
    with ws_connect(server.url) as attached:
        created = open_session(attached)
        echo(attached, "before")
        started = time.monotonic()
        server.interrupt()
        going = recv(attached)
        assert going["type"] == "session.going_away"
        assert 0 < going["time_left_ms"] <= drain * 1000
        # New opens are refused during the drain.
        with ws_connect(server.url) as late:
            send(late, {"type": "session.update", "session": {}})
            events, code = until_closed(late)
            assert [(e["code"], e["retryable"]) for e in events] == [("server_shutting_down", True)]
            assert code == 1001
        assert echo(attached, "during")["server_event_seq"] == 2
        events, code = until_closed(attached, timeout=drain + 5)
        assert events == [
            {
                "type": "session.closed",
                "session_id": created["session_id"],
                "reason": "server_shutdown",
                "usage": ANY,
            }
        ]
        assert code == 1001
        assert time.monotonic() - started >= drain - 0.2
    assert server.wait(timeout=drain + 5) == 0
    assert time.monotonic() - started < drain + 5


def test_sigint_without_sessions_exits_at_once(serve: Serve) -> None:
    server = serve("--drain-timeout", "30")
    started = time.monotonic()
    server.interrupt()
    assert server.wait(timeout=10) == 0
    assert time.monotonic() - started < 5


# -- protocol v2: the binary lane, with the websockets package as the outside client -----

HEADER = struct.Struct(">BBHQ")  # docs/protocol.md, "The binary lane"


def test_binary_audio_is_replayed_as_binary_after_a_drop(shared: ServerProcess) -> None:
    ulaw = {"format": "g711_ulaw", "rate": 8000}
    audio = {"wire": "binary", "input": ulaw, "output": ulaw}
    with ws_connect(shared.url) as ws:
        created = open_session(ws, {"audio": audio})
        assert created["session"]["audio"] == {"wire": "binary", "input": ulaw, "output": ulaw}
        for seq in (1, 2, 3):  # 20 ms of μ-law each, kind 1 with its client_event_seq
            ws.send(HEADER.pack(1, 0, 0, seq) + bytes([0x80 + seq]) * 160)
        send(ws, {"type": "input.text.append", "text": "end", "client_event_seq": 4})
        received: list[tuple[int, bytes]] = []
        while True:
            message = ws.recv(timeout=TIMEOUT)
            if isinstance(message, str):
                assert json.loads(message)["text"] == "end"
                break
            kind, flags, reserved, seq = HEADER.unpack_from(message)
            assert (kind, flags, reserved) == (2, 0, 0)
            received.append((seq, message[HEADER.size :]))
        assert [seq for seq, _ in received] == list(range(1, len(received) + 1))
    # Dropped having acked nothing: a resume from 1 gets every later event again, the
    # audio as binary messages byte for byte, then the text.
    with ws_connect(shared.url) as ws:
        resumed = resume(ws, created, 1)
        assert resumed["type"] == "session.resumed"
        assert resumed["last_received_client_event_seq"] == 4
        replayed: list[tuple[int, bytes]] = []
        while True:
            message = ws.recv(timeout=TIMEOUT)
            if isinstance(message, str):
                event = json.loads(message)
                assert (event["type"], event["text"]) == ("response.output_text.delta", "end")
                break
            replayed.append((HEADER.unpack_from(message)[3], message[HEADER.size :]))
        assert replayed == received[1:]
        ws.send(HEADER.pack(1, 0, 1, 5) + bytes(160))  # reserved bytes set: refused
        error = recv(ws)
        assert (error["type"], error["code"]) == ("error", "bad_event")
