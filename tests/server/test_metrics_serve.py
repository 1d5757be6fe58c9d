"""Health and metrics of a real ``trio-duplex serve``, read with curl and parsed with
prometheus-client's own text parser; a websockets client makes the traffic."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from ..helpers import Serve
from .test_metrics import samples

pytestmark = pytest.mark.integration


def curl(url: str) -> tuple[int, str]:
    """``curl -s`` of ``url``: the status and the body."""
    done = subprocess.run(
        ["curl", "-s", "--max-time", "10", "-w", "\n%{http_code}", url],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def talk(url: str, texts: list[str]) -> dict[str, object]:
    """Open a session, echo ``texts``, close; returns ``session.closed``."""
    with connect(url) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for text in texts:
            ws.send(json.dumps({"type": "input.text.append", "text": text}))
            assert json.loads(ws.recv(timeout=10))["text"] == text
        ws.send(json.dumps({"type": "session.close"}))
        closed: dict[str, object] = json.loads(ws.recv(timeout=10))
        return closed


def test_curl_health_and_metrics_on_the_main_port(serve: Serve) -> None:
    server = serve()
    base = f"http://127.0.0.1:{server.port}"
    assert curl(base + "/healthz") == (200, '{"status": "ok"}\n')
    status, body = curl(base + "/readyz")
    assert status == 200
    assert json.loads(body) == {"status": "ready", "slots_held": 0, "slots_max": 64}

    closed = talk(server.url, [str(n) for n in range(64)])
    assert closed["usage"] == {
        "events_in": 65,
        "events_out": 64,
        "bytes_in": sum(
            len(json.dumps({"type": "input.text.append", "text": str(n)})) for n in range(64)
        )
        + len(json.dumps({"type": "session.close"})),
        "bytes_out": sum(
            len(f'{{"type":"response.output_text.delta","text":"{n}","server_event_seq":{n + 1}}}')
            for n in range(64)
        ),
        "resumes": 0,
        "audio_ms_in": 0,  # the echo engine declares its audio format
        "audio_ms_out": 0,
    }

    status, text = curl(base + "/metrics")
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {
        "trio_duplex_sessions",
        "trio_duplex_slots_max",
        "trio_duplex_sessions_opened",
        "trio_duplex_resumes",
        "trio_duplex_events",
        "trio_duplex_replayed_events",
        "trio_duplex_replay_audio_dropped",
        "trio_duplex_journal_bytes",
        "trio_duplex_connections",
        "trio_duplex_handshake_refusals",
        "trio_duplex_engine_errors",
        "trio_duplex_send_to_write_seconds",
    } <= names
    found = samples(text)
    assert found["trio_duplex_sessions_opened_total", ()] == 1
    assert found["trio_duplex_events_total", (("direction", "in"),)] == 65
    assert found["trio_duplex_events_total", (("direction", "out"),)] == 64
    assert found["trio_duplex_slots_max", ()] == 64
    # the 64th echo was timed (on a socket: written directly, in the send's own call)
    assert found["trio_duplex_send_to_write_seconds_count", ()] == 1
    assert found["trio_duplex_connections", ()] == 1  # this curl


def test_metrics_port_serves_them_apart(serve: Serve) -> None:
    port = free_port()
    server = serve("--metrics-port", str(port))
    internal = f"http://127.0.0.1:{port}"
    assert curl(internal + "/healthz") == (200, '{"status": "ok"}\n')
    assert curl(internal + "/readyz")[0] == 200
    status, text = curl(internal + "/metrics")
    assert status == 200
    assert samples(text)["trio_duplex_connections", ()] == 0  # not counted there
    assert curl(internal + "/v1/duplex")[0] == 404
    # The main port no longer answers them (not an upgrade: 400), and still serves.
    assert curl(f"http://127.0.0.1:{server.port}/metrics")[0] == 400
    assert talk(server.url, ["x"])["type"] == "session.closed"
    _, text = curl(internal + "/metrics")
    found = samples(text)
    assert found["trio_duplex_sessions_opened_total", ()] == 1
    assert found["trio_duplex_handshake_refusals_total", (("reason", "not_upgrade"),)] == 1
