"""The official Node SDK (npm ``openai`` 6.x, unchanged, with ``ws``) holds a
conversation with ``trio-duplex serve`` over ``wss://.../v1/realtime``: the session, a
text turn, an audio turn, a cancel mid-response, errors, a client secret.

The SDK always dials ``wss://`` and aborts unless the server selects the subprotocol
``realtime``, so the servers run with TLS (a trustme CA, given to node as
``NODE_EXTRA_CA_CERTS``). ``node/conversation.cjs`` runs every scenario once, with
``OpenAIRealtimeWebSocket`` (the key as the subprotocol ``openai-insecure-api-key.KEY``)
and ``OpenAIRealtimeWS`` (the key as ``Authorization: Bearer``), and prints what the
SDK emitted; each test here asserts one scenario's outcome exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TEXT_RESPONSE, Certs, Servers

from .conftest import API_KEY, NODE_DIR, NodeSdk
from .sdk_shared import LONG_TEXT
from .test_python_sdk import response_part

pytestmark = pytest.mark.integration
SCRIPT = NODE_DIR / "conversation.cjs"
RUN_TIMEOUT = 240.0
TEXT = "hello from the node sdk"


def https_base(url: str) -> str:
    """``wss://127.0.0.1:P/v1/duplex`` (the ready line) → ``https://127.0.0.1:P/v1``."""
    assert url.startswith("wss://") and url.endswith("/v1/duplex"), url
    return "https://" + url.removeprefix("wss://").removesuffix("/duplex")


@pytest.fixture(scope="module")
def seen(
    openai_node: NodeSdk, module_servers: Servers, key_file: Path, certs: Certs
) -> dict[str, Any]:
    flags: tuple[str, ...] = ("--api-key-file", str(key_file))
    flags += ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    echo, voice = module_servers.start_many(
        ("--engine", "echo", *flags), ("--engine", "voice", *flags)
    )
    env = {
        **os.environ,
        "NODE_EXTRA_CA_CERTS": str(certs.ca),
        "NODE_PATH": str(openai_node.modules),
    }
    command = [openai_node.node, str(SCRIPT), https_base(echo.url), https_base(voice.url)]
    done = subprocess.run(
        [*command, API_KEY],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=env,
        cwd=NODE_DIR,
    )
    assert done.returncode == 0, f"{SCRIPT.name} failed:\n{done.stdout}\n{done.stderr}"
    results = json.loads(done.stdout)
    assert isinstance(results, dict)
    return results


def scenario(seen: dict[str, Any], name: str) -> dict[str, Any]:
    """One scenario's record, after the checks every scenario shares: no crash, no
    socket error, and every event had its own ``event_id``."""
    record = seen[name]
    assert isinstance(record, dict)
    assert "crash" not in record, record["crash"]
    assert record["socket_errors"] == [] or name == "wrong_key", record["socket_errors"]
    ids = record["event_ids"]
    assert all(isinstance(i, str) and i.startswith("event_") for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    return record


def assert_text_turn(turn: dict[str, Any], text: str) -> None:
    assert response_part(turn["types"]) == TEXT_RESPONSE
    assert turn["text"] == turn["text_done"] == text
    assert turn["status"] == "completed"
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]
    [item] = turn["output"]
    assert item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": text}]


def test_session_created_over_wss_with_the_realtime_subprotocol(seen: dict[str, Any]) -> None:
    record = scenario(seen, "session")
    assert record["url"] == "wss://127.0.0.1:PORT/v1/realtime?model=gpt-realtime-test"
    assert record["protocol"] == "realtime"
    assert record["types"] == ["session.created"]
    session = record["session"]
    assert session["type"] == "realtime" and session["model"] == "gpt-realtime-test"
    assert session["output_modalities"] == ["audio"]
    assert "resume" in record["extension_keys"]


def test_a_text_turn(seen: dict[str, Any]) -> None:
    record = scenario(seen, "text")
    assert record["updated_modalities"] == ["text"]
    assert_text_turn(record["turn"], TEXT)
    assert record["errors"] == []


def test_the_ws_class_with_an_authorization_header(seen: dict[str, Any]) -> None:
    record = scenario(seen, "ws_class")
    assert record["protocol"] == ""  # it offers no subprotocol, and none is selected
    assert_text_turn(record["turn"], TEXT)


def test_an_audio_turn_comes_back(seen: dict[str, Any]) -> None:
    record = scenario(seen, "audio_echo")
    pcm = {"type": "audio/pcm", "rate": 24000}
    assert record["formats"] == [pcm, pcm]
    assert record["committed_item_id"].startswith("item_")
    turn = record["turn"]
    assert turn["audio_bytes"] == record["sent_bytes"]
    assert turn["audio_sha"] == record["sent_sha"]
    assert turn["status"] == "completed"
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]


def test_a_cancel_mid_response(seen: dict[str, Any]) -> None:
    record = scenario(seen, "cancel")
    turn = record["turn"]
    assert turn["status"] == "cancelled"
    assert 0 < turn["audio_bytes"] < 24000 * 2 * 10
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]
    assert record["after"] == ["session.updated"]
    [item] = turn["output"]
    assert item["status"] == "incomplete"
    assert LONG_TEXT.startswith(turn["transcript"])


def test_errors_reach_the_error_handler_and_the_connection_goes_on(
    seen: dict[str, Any],
) -> None:
    record = scenario(seen, "error")
    unknown, bad = record["errors"]  # as the SDK raised them: OpenAIRealtimeError
    assert all(e["realtimeError"] for e in (unknown, bad))
    assert unknown["error"]["type"] == bad["error"]["type"] == "invalid_request_error"
    assert unknown["error"]["code"] == "unknown_event"
    assert unknown["error"]["event_id"] == "evt_unknown_1"
    assert bad["error"]["code"] == "bad_event"
    assert bad["error"]["param"] == "audio" and bad["error"]["event_id"] == "e2"
    assert [e["type"] for e in record["error_events"]] == ["error", "error"]
    turn = record["turn"]
    assert turn["status"] == "completed" and turn["text"] == "still here"


def test_a_wrong_key_is_refused(seen: dict[str, Any]) -> None:
    record = scenario(seen, "wrong_key")
    assert "refused" in record, record
    assert "401" in record["refused"], record["refused"]
    assert record["types"] == []


def test_a_client_secret_is_issued(seen: dict[str, Any]) -> None:
    record = seen["client_secret"]
    assert "crash" not in record, record["crash"]
    assert record["secret_session"]["type"] == "realtime"
    assert record["secret_session"]["output_modalities"] == ["text"]
    assert 590 <= record["expires_in"] <= 600
    assert record["value_is_ephemeral"]


def test_a_client_secret_opens_its_session(seen: dict[str, Any]) -> None:
    record = scenario(seen, "client_secret")
    assert "connect_crash" not in record, record["connect_crash"]
    assert record["created_session"]["instructions"] == "be brief"
    assert_text_turn(record["turn"], "secret turn")
