"""No secret in any log line at any level: ``trio-duplex serve --log-level debug`` (two
cluster nodes as subprocesses, their stdout and stderr read whole), with every secret the
server holds or sees in use: API keys from ``--api-key-file``, a client token, resume
tokens (a resume relayed from one node to the other), the ``realtime-proxy`` upstream's
key (``TRIO_DUPLEX_UPSTREAM_API_KEY``) and an ``--upstream-header`` value against the fake
upstream, the cluster secret (``TRIO_DUPLEX_CLUSTER_SECRET``) and the password of a real
``redis-server --requirepass``. Every secret is random, so the grep cannot pass by chance.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from websockets.trio.client import ClientConnection, connect

from trio_duplex.engines.realtime_proxy import API_KEY_ENV
from trio_duplex.logs import redact, register_secret
from trio_duplex.testing.realtime_upstream import FakeRealtime

from .helpers import READY, ServerProcess, Servers, serve_command

Event = dict[str, Any]
TIMEOUT = 20.0


def _secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(12)}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def redis_url() -> Iterator[tuple[str, str]]:
    """A redis-server of its own that requires a password: (its URL, the password)."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server)")
    password, port = _secret("redis"), _free_port()
    argv = [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--requirepass", password]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not _answers(port):  # a real process: polled against a deadline
            assert process.poll() is None and time.monotonic() < deadline, "no redis-server"
            time.sleep(0.02)
        yield f"redis://:{password}@127.0.0.1:{port}/0", password
    finally:
        process.kill()
        process.wait()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _launch(servers: Servers, *args: str) -> ServerProcess:
    """``serve`` with its stdout and stderr in one pipe, read whole."""
    proc = subprocess.Popen(
        serve_command("--port", "0", *args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
    )
    proc.stderr, proc.stdout = proc.stdout, None  # ServerProcess reads (and closes) stderr
    server = ServerProcess(proc)
    servers.started.append(server)
    server.start_reading()
    return server


async def send(ws: ClientConnection, event: Event) -> None:
    await ws.send(json.dumps(event))


async def receive_until(ws: ClientConnection, kind: str) -> list[Event]:
    got: list[Event] = []
    with trio.fail_after(TIMEOUT):
        while not got or got[-1]["type"] != kind:
            got.append(json.loads(await ws.recv()))
    return got


async def curl(*args: str) -> Event:
    done = await trio.run_process(["curl", "-s", "--max-time", "10", *args], capture_stdout=True)
    answer: Event = json.loads(done.stdout)
    return answer


def offer(credential: str) -> Any:
    return ["trio-duplex", f"trio-duplex.bearer.{credential}"]


@pytest.mark.integration
async def test_a_debug_run_of_every_component_logs_no_secret(
    servers: Servers,
    redis_url: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    cluster, redis_password = redis_url
    held = {
        "API key": _secret("apikey"),
        "second API key": _secret("apikey"),
        "upstream key": _secret("sk-upstream"),
        "upstream header": _secret("tenant"),
        "cluster secret": _secret("cluster") * 2,
        "Redis password": redis_password,
    }
    seen: dict[str, str] = {}  # the tokens the server handed out
    keys = tmp_path / "keys"
    keys.write_text(f"acme: {held['API key']}\nbeta: {held['second API key']}\n")
    monkeypatch.setenv(API_KEY_ENV, held["upstream key"])  # the subprocesses inherit them
    monkeypatch.setenv("TRIO_DUPLEX_CLUSTER_SECRET", held["cluster secret"])
    upstream = FakeRealtime(api_key=held["upstream key"], frames=2)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(upstream.run)
            flags = ("--log-level", "debug", "--engine", "realtime-proxy",
                     "--upstream", f"ws://127.0.0.1:{port}/v1/realtime",
                     "--upstream-header", f"X-Secret: {held['upstream header']}",
                     "--api-key-file", str(keys), "--cluster", cluster,
                     "--relay-port", "0")  # fmt: skip
            a, b = (_launch(servers, *flags, "--node-id", name) for name in "ab")
            for node in (a, b):
                node.url = (await trio.to_thread.run_sync(node.wait_for_line, READY, 30)).group(1)
            base = a.url.replace("ws://", "http://").removesuffix("/v1/duplex")
            issued = await curl("-X", "POST", "-H", f"Authorization: Bearer {held['API key']}",
                                "-d", '{"ttl_s": 30}', f"{base}/v1/client_tokens")  # fmt: skip
            seen["client token"] = issued["token"]
            async with connect(a.url, subprotocols=offer(issued["token"])) as ws:
                await send(ws, {"type": "session.update", "session": {"instructions": "hi"}})
                created = (await receive_until(ws, "session.created"))[-1]
                seen["resume token"] = created["resume_token"]
                await send(ws, {"type": "response.create", "client_event_seq": 1})
                await receive_until(ws, "response.done")
                ws.stream.socket.close()  # type: ignore[attr-defined]  # dropped, no close
            assert upstream.headers[0]["X-Secret"] == held["upstream header"]
            async with connect(b.url, subprotocols=offer(created["resume_token"])) as ws:
                await send(ws, {"type": "session.resume", "session_id": created["session_id"],
                                "resume_token": created["resume_token"],
                                "last_received_server_event_seq": 0})  # fmt: skip
                resumed = (await receive_until(ws, "session.resumed"))[-1]
                if "resume_token" in resumed:
                    seen["rotated resume token"] = resumed["resume_token"]
                await send(ws, {"type": "response.create", "client_event_seq": 2})
                await receive_until(ws, "response.done")
                await send(ws, {"type": "session.close"})
                await receive_until(ws, "session.closed")
            headers = {"Authorization": f"Bearer {held['second API key']}"}
            async with connect(b.url, additional_headers=headers) as ws:  # a key, directly
                await send(ws, {"type": "session.update", "session": {}})
                created = (await receive_until(ws, "session.created"))[-1]
                seen["second resume token"] = created["resume_token"]
            for node in (a, b):
                node.interrupt()  # drained and stopped: every line written
            for node in (a, b):
                assert await trio.to_thread.run_sync(node.wait, 30) == 0, node.log
            nursery.cancel_scope.cancel()
    output = a.log + b.log
    # The resume went through the pooled relay (which logs no frames, at any level: its
    # upgrade and the client's bytes are never written to the log).
    assert "relaying its resume to its home node a" in output
    for name, value in {**held, **seen}.items():
        assert value not in output, f"the {name} is in the log"
        assert value[4:-4] not in output, f"part of the {name} is in the log"


def test_the_forms_of_secrets_are_masked() -> None:
    key = _secret("registered")
    register_secret(key, "abc", None)  # too short to search for: not registered
    lines = {
        f"> Authorization: Bearer {_secret('k')}": "> Authorization: ***",
        f"> Proxy-Authorization: Basic {_secret('k')}": "> Proxy-Authorization: ***",
        f"> Cookie: session={_secret('k')}": "> Cookie: ***",
        f"> Sec-WebSocket-Protocol: trio-duplex, trio-duplex.bearer.{key}":
            "> Sec-WebSocket-Protocol: trio-duplex, trio-duplex.bearer.***",
        "offered ['realtime', 'openai-insecure-api-key.sk-x1y2']":
            "offered ['realtime', 'openai-insecure-api-key.***']",
        "> X-Trio-Duplex-Relay: v1 b a sess_1 1700000000 0f0f": "> X-Trio-Duplex-Relay: ***",
        "store at redis://:pw-123@127.0.0.1:6379/0": "store at redis://:***@127.0.0.1:6379/0",
        "store at redis://user:pw-123@h/0": "store at redis://user:***@h/0",
        """> TEXT '{"type":"session.resume","resume_token":"tok_12...' [180 bytes]""":
            """> TEXT '{"type":"session.resume","resume_token":"***' [180 bytes]""",
        "wss://up/v1?model=m&api_key=sk-q1": "wss://up/v1?model=m&api_key=***",
        f"the key {key} in prose": "the key *** in prose",
        "abc stays, as does a plain ws://host:1/v1/duplex": (
            "abc stays, as does a plain ws://host:1/v1/duplex"
        ),
    }  # fmt: skip
    for line, masked in lines.items():
        assert redact(line) == masked, line


@pytest.mark.integration
async def test_a_debug_run_of_a_phone_call_logs_no_secret(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phone call through the fake Twilio at ``--log-level debug``: the auth token (from
    ``TRIO_DUPLEX_TWILIO_AUTH_TOKEN``), the signatures Twilio sent, the tickets the TwiML
    carried and the call's derived resume token are in no line."""
    from trio_duplex.server.twilio.tickets import TwilioKeys
    from trio_duplex.testing.twilio_provider import FakeCall, FakeTwilio, run_scenario, sign

    token, account = secrets.token_hex(16), "AC" + secrets.token_hex(16)
    monkeypatch.setenv("TRIO_DUPLEX_TWILIO_AUTH_TOKEN", token)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _launch(servers, "--port", str(port), "--log-level", "debug",
                     "--twilio-public-url", base)  # fmt: skip
    await trio.to_thread.run_sync(server.wait_for_line, READY, 30)

    async def scenario(url: str) -> FakeCall:
        async with FakeTwilio(url, token, account) as twilio:
            call = await twilio.place_call()
            await call.send_silence(0.5)
            await call.dtmf("7")
            await call.wait_for(lambda c: c.received_events("mark"), timeout=TIMEOUT)
            await call.stop()
            await call.wait_ended()
            return call

    call = await trio.to_thread.run_sync(run_scenario, scenario, base)
    server.interrupt()
    assert await trio.to_thread.run_sync(server.wait, 30) == 0, server.log
    keys = TwilioKeys.derive(token)
    session_id = keys.session_id(account, call.call_sid)
    held = {
        "auth token": token,
        "resume token": keys.resume_token(session_id),
        "ticket": call.streams[0].parameters["trio_duplex_ticket"],
        "upgrade's signature": sign(token, f"ws://127.0.0.1:{port}/v1/twilio"),
        "webhook's signature": sign(token, f"{base}/v1/twilio/twiml", call.form),
    }
    assert f"session {session_id}" in server.log  # (the call was served and logged)
    for name, value in held.items():
        assert value not in server.log, f"the {name} is in the log"
        assert value[4:-4] not in server.log, f"part of the {name} is in the log"
