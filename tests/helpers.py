"""Helpers shared by the tests.

In memory: ``RawClient``, a bare wsproto client of a ``running_server`` simulation, for
what the trio-websocket client will not do (fragments, binary and over-size frames
written together in one ``send_all``, pings left unanswered, raw HTTP); ``echo``, one
round trip through the echo engine.

Over real sockets: ``Servers`` starts ``python -m trio_duplex serve`` as a subprocess on
a free port, waits for its ``serving ws://...`` line on stderr, and always stops it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trustme
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Request,
    TextMessage,
)

from trio_duplex.testing import SimClient, Simulation

UPGRADE_HEAD = (
    "GET /v1/duplex HTTP/1.1\r\n"
    "Host: sim\r\n"
    "Upgrade: websocket\r\n"
    "Connection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    "Sec-WebSocket-Version: 13\r\n"
)
"""A valid upgrade request's head without its final empty line (tests add headers)."""


# -- in memory: a bare WebSocket client --------------------------------------------------


class RawClosed(Exception):
    """The server closed the WebSocket (or the stream) under a RawClient."""


@attrs.define(eq=False)
class RawClient:
    """A wsproto client on an in-memory stream to the simulated server."""

    stream: trio.abc.Stream
    ws: WSConnection = attrs.field(factory=lambda: WSConnection(ConnectionType.CLIENT))
    answer_pings: bool = True
    close_code: int | None = None
    pings: int = 0
    eof: bool = False
    _pending: deque[Any] = attrs.field(factory=deque)
    _parts: list[str | bytes | bytearray] = attrs.field(factory=list)

    # writing
    def frame(self, data: str | bytes, *, fin: bool = True) -> bytes:
        """The bytes of one client frame (masked), without sending them."""
        message: Message[Any]
        if isinstance(data, str):
            message = TextMessage(data=data, message_finished=fin)
        else:
            message = BytesMessage(data=data, message_finished=fin)
        return self.ws.send(message)

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, event: dict[str, Any]) -> None:
        await self.send_bytes(self.frame(json.dumps(event)))

    # reading
    async def next_event(self) -> Any:
        """The next wsproto event, or None at end of stream."""
        while not self._pending:
            if self.eof:
                return None
            try:
                data = await self.stream.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.eof = True
                self.ws.receive_data(None)
            else:
                self.ws.receive_data(bytes(data))
            self._pending.extend(self.ws.events())
        return self._pending.popleft()

    async def receive(self) -> dict[str, Any]:
        """The next JSON event; raises RawClosed once the server closes."""
        while True:
            event = await self.next_event()
            if event is None:
                raise RawClosed(self.close_code)
            if isinstance(event, CloseConnection):
                self.close_code = int(event.code)
                try:
                    await self.stream.send_all(self.ws.send(event.response()))
                except Exception:
                    pass
                raise RawClosed(self.close_code)
            if isinstance(event, Ping):
                self.pings += 1
                if self.answer_pings:
                    await self.stream.send_all(self.ws.send(event.response()))
                continue
            if isinstance(event, TextMessage | BytesMessage):
                self._parts.append(event.data)
                if event.message_finished:
                    parts, self._parts = self._parts, []
                    if isinstance(event, TextMessage):
                        result: dict[str, Any] = json.loads("".join(parts))  # type: ignore[arg-type]
                        return result
                    raise AssertionError(f"server sent a binary frame: {parts!r}")

    async def receive_until_closed(self) -> list[dict[str, Any]]:
        events = []
        try:
            while True:
                events.append(await self.receive())
        except RawClosed:
            return events


async def upgrade(
    sim: Simulation,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    protocols: Sequence[str] = (),
) -> tuple[RawClient, Any]:
    """A new ``RawClient``'s upgrade to ``/v1/duplex`` with ``headers`` and ``protocols``,
    and the server's answer to it."""
    stream, _ = await sim.listener.connect()
    client = RawClient(stream)
    request = Request(
        host="sim", target="/v1/duplex", extra_headers=list(headers), subprotocols=list(protocols)
    )
    await client.send_bytes(client.ws.send(request))
    return client, await client.next_event()


def authorization(credential: str) -> list[tuple[bytes, bytes]]:
    """The ``Authorization: Bearer`` header of an upgrade."""
    return [(b"Authorization", f"Bearer {credential}".encode())]


def http_post(
    path: str, body: bytes | dict[str, Any] = b"", key: str | None = None, extra: str = ""
) -> bytes:
    """A JSON ``POST`` to ``path`` (``key``: its bearer credential; ``extra``: more header
    lines, each ending in CRLF), as raw bytes."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    auth = "" if key is None else f"Authorization: Bearer {key}\r\n"
    return (
        f"POST {path} HTTP/1.1\r\nHost: sim\r\n{auth}{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def answer_of(answer: bytes) -> tuple[int, dict[str, Any]]:
    """A raw HTTP answer's status and JSON body; it must say ``Cache-Control: no-store``."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"\r\nCache-Control: no-store\r\n" in head
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def raw_handshake(client: RawClient, path: str) -> Any:
    await client.send_bytes(client.ws.send(Request(host="sim", target=path)))
    event = await client.next_event()
    assert event is not None, "the server closed the stream during the handshake"
    return event


# -- over real sockets: the serve command as a subprocess ---------------------------------

READY = re.compile(r"serving (wss?://\S+)")


def exchange(server: ServerProcess, request: bytes) -> bytes:
    """Send ``request``, end our half, and read whatever comes back until the end."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        try:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before taking it all
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


@attrs.define(eq=False)
class ServerProcess:
    proc: subprocess.Popen[str]
    lines: list[str] = attrs.field(factory=list)
    url: str = ""
    _cond: threading.Condition = attrs.field(factory=threading.Condition)
    _reader: threading.Thread | None = None

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.lines.append("")  # EOF marker
            self._cond.notify_all()

    def start_reading(self) -> None:
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def wait_for_line(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Wait for a stderr line matching ``pattern``; fail after ``timeout`` seconds."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                while seen < len(self.lines):
                    line = self.lines[seen]
                    seen += 1
                    if line == "":
                        raise AssertionError(f"server exited before {regex.pattern!r}:\n{self.log}")
                    match = regex.search(line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {regex.pattern!r} within {timeout}s:\n{self.log}")
                self._cond.wait(left)

    @property
    def log(self) -> str:
        with self._cond:
            return "".join(self.lines)

    @property
    def port(self) -> int:
        match = re.match(r"wss?://[^/]*:(\d+)/", self.url)
        assert match, self.url
        return int(match.group(1))

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Kill the process if it is still running (graceful stops are tested explicitly)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@attrs.frozen
class Certs:
    """A private CA's certificate (what a client trusts), and a server's chain and key
    for 127.0.0.1 and localhost."""

    ca: Path
    cert: Path
    key: Path


def issue_certs(folder: Path) -> Certs:
    """A new private CA and a server certificate issued by it, written into ``folder``."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    paths = Certs(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")
    ca.cert_pem.write_to_path(str(paths.ca))
    issued.private_key_pem.write_to_path(str(paths.key))
    with paths.cert.open("wb") as chain:  # leaf first, then the chain
        for blob in issued.cert_chain_pems:
            chain.write(blob.bytes())
    return paths


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trio_duplex", "serve", *args]


READY_TIMEOUT_S = 60.0
"""How long a server may take to log that it is serving: a deadline for one that never
does, not a speed asserted. The suite runs on two workers (pyproject's -n 2), each
starting servers, up to three at once, so a start can take several times what it does
alone; 15 s was missed on a loaded 2-core machine (seven seconds for one echo server,
over 15 for three side by side)."""


@attrs.define
class Servers:
    """Every server process started through it is stopped by ``stop_all``."""

    started: list[ServerProcess] = attrs.field(factory=list)

    def start(self, *args: str, ready_timeout: float = READY_TIMEOUT_S) -> ServerProcess:
        server = self.launch(*args)
        server.url = server.wait_for_line(READY, ready_timeout).group(1)
        return server

    def start_many(
        self, *commands: tuple[str, ...], ready_timeout: float = READY_TIMEOUT_S
    ) -> list[ServerProcess]:
        """Start a server per command at once, then wait until each is ready: a few
        seconds of imports each, spent side by side."""
        launched = [self.launch(*args) for args in commands]
        for server in launched:
            server.url = server.wait_for_line(READY, ready_timeout).group(1)
        return launched

    def launch(self, *args: str) -> ServerProcess:
        """Start a server; its ``url`` is set once ``wait_for_line(READY)`` has seen it."""
        if "--port" not in args:
            args = ("--port", "0", *args)
        proc = subprocess.Popen(
            serve_command(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        server = ServerProcess(proc)
        self.started.append(server)
        server.start_reading()
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.stop()


# The types of the fixtures in conftest.py, for the tests' signatures.
RawWs = Callable[..., Awaitable[RawClient]]
"""``raw_ws``: ``await raw_ws(sim, path="/v1/duplex", **RawClient_fields)`` → a RawClient."""
RawHttp = Callable[[Simulation, bytes], Awaitable[bytes]]
"""``raw_http``: ``await raw_http(sim, request_bytes)`` → every byte the server answers."""
Serve = Callable[..., ServerProcess]
"""``serve`` and ``serve_module``: ``serve(*flags, ready_timeout=15.0)`` → a ready server."""


async def echo(client: SimClient, value: str = "x", seq: int | None = None) -> dict[str, Any]:
    """Send ``input.text.append`` (with ``client_event_seq`` ``seq``) and check the echo."""
    event: dict[str, Any] = {"type": "input.text.append", "text": value}
    if seq is not None:
        event["client_event_seq"] = seq
    reply = await client.send_and_receive(event)
    assert reply["type"] == "response.output_text.delta", reply
    assert reply["text"] == value, reply
    return reply


async def speak(client: SimClient) -> None:
    """The client speaks after ``session.created`` (a heartbeat): it shows it holds its
    token, so its session, once detached, waits the whole ``disconnect_grace_s``, not
    ``unconfirmed_grace_s``."""
    ack = await client.send_and_receive({"type": "session.heartbeat"})
    assert ack["type"] == "session.heartbeat_ack", ack


def state_of(sim: Simulation, session_id: str) -> str | None:
    """The session's state (``"attached"``, ...), or None once its slot is free."""
    session = sim.session(session_id)
    return None if session is None else session.state.value


# -- the JavaScript client's tests (clients/js) under Node ---------------------------------

JS_CLIENT = Path(__file__).resolve().parents[1] / "clients" / "js"


def node_executable() -> str:
    """Node (>= 20: its WebSocket); skips the test if there is none (.ci/run installs it)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (.ci/run installs it)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    match = re.match(r"v(\d+)", version.stdout)
    assert match is not None and int(match.group(1)) >= 20, (
        f"the JS client's tests need Node >= 20, found {version.stdout.strip()}"
    )
    return node


def run_node_tests(node: str, files: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run ``files`` with Node's test runner (its WebSocket enabled), in clients/js;
    fails the test with node's output unless every test passed. Returns how many did,
    and the output."""
    run = subprocess.run(
        [node, "--experimental-websocket", "--test", "--test-timeout=60000", *files],
        cwd=JS_CLIENT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"node --test failed ({run.returncode}):\n{output}"
    passed = re.search(r"^# pass (\d+)$", output, re.MULTILINE)
    assert passed is not None, output
    assert re.search(r"^# fail 0$", output, re.MULTILINE), output
    return int(passed.group(1)), output


# -- the shape of an error event (docs/protocol.md, Errors) ------------------------------

RETRYABLE = {
    "resource_exhausted",
    "input_backpressure",
    "session_resume_conflict",
    "server_shutting_down",
    "unexpected_client_event_seq",
}
ERROR_KEYS = {
    "type",
    "code",
    "message",
    "retryable",
    "event_id",
    "param",
    "client_event_seq",  # protocol v2: the seq of the event refused
    "expected_client_event_seq",  # v2: for unexpected_client_event_seq
}


def assert_error_shape(error: dict[str, Any]) -> None:
    """An ``error`` event as docs/protocol.md, Errors, shapes every one."""
    assert error["type"] == "error"
    assert set(error) <= ERROR_KEYS, error
    assert {"code", "message", "retryable"} <= set(error)
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["retryable"] is (error["code"] in RETRYABLE)
    if "event_id" in error:
        assert isinstance(error["event_id"], str)
    if "param" in error:
        assert isinstance(error["param"], str)
    assert "server_event_seq" not in error


def resume_event(
    session_id: str, token: str, last: int | None = None, **extra: object
) -> dict[str, Any]:
    """A ``session.resume`` (``last``: its ``last_received_server_event_seq``, if any)."""
    event: dict[str, Any] = {
        "type": "session.resume",
        "session_id": session_id,
        "resume_token": token,
    }
    if last is not None:
        event["last_received_server_event_seq"] = last
    return {**event, **extra}


RESUMED_FIELDS = {
    "type",
    "session_id",
    "session",
    "resume_token",
    "attachment_generation",
    "last_received_client_event_seq",
    "consumed_client_event_seq",  # protocol v2
}
"""Every field of a ``session.resumed`` (docs/protocol.md, Resuming)."""


def echo_message(size: int, char: str = "a") -> str:
    """An ``input.text.append`` whose UTF-8 encoding is exactly ``size`` bytes."""
    head = '{"type":"input.text.append","text":"'
    tail = '"}'
    room = size - len(head) - len(tail)
    width = len(char.encode())
    assert room >= 0 and room % width == 0, (size, char)
    message = head + char * (room // width) + tail
    assert len(message.encode()) == size
    return message


TEXT_RESPONSE = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
"""A text response's events on the OpenAI dialect, each run of deltas written as one."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server whose URL must be known first)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
