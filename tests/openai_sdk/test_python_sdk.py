"""The official Python SDK, ``openai[realtime]`` unchanged in a venv of its own, holds a
conversation with ``trio-duplex serve`` over ``/v1/realtime``: the session, a text turn,
an audio turn, a cancel mid-response, errors, and a client secret.

``sdk_python.py`` runs every scenario once in that venv against two servers (the echo
engine and the voice engine, both behind ``--api-key-file``) and prints what the SDK's
own models read; each test here asserts one scenario's outcome exactly.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Servers

from .conftest import API_KEY
from .sdk_python import LONG_TEXT, TEXT, pcm16, sha

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).with_name("sdk_python.py")
RUN_TIMEOUT = 240.0

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
"""A text response's events, each run of deltas written as one."""


def http_base(url: str) -> str:
    """``ws://127.0.0.1:P/v1/duplex`` (the ready line) → the SDK's ``http://127.0.0.1:P/v1``."""
    assert url.startswith("ws://") and url.endswith("/v1/duplex"), url
    return "http://" + url.removeprefix("ws://").removesuffix("/duplex")


@pytest.fixture(scope="module")
def seen(openai_python: Path, module_servers: Servers, key_file: Path) -> dict[str, Any]:
    keys = ("--api-key-file", str(key_file))
    echo, voice = module_servers.start_many(
        ("--engine", "echo", *keys), ("--engine", "voice", *keys)
    )
    command = [str(openai_python), str(SCRIPT), "--api-key", API_KEY]
    command += ["--base-url", http_base(echo.url), "--voice-url", http_base(voice.url)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, f"{SCRIPT.name} failed:\n{done.stdout}\n{done.stderr}"
    results = json.loads(done.stdout)
    assert isinstance(results, dict)
    return results


def scenario(seen: dict[str, Any], name: str) -> dict[str, Any]:
    """One scenario's record, after the checks every scenario shares: it did not crash,
    the SDK's union validated every event, and every event had its own ``event_id``."""
    record = seen[name]
    assert "crash" not in record, record["crash"]
    assert record.get("invalid", []) == [], record["invalid"]
    ids = record.get("event_ids", [])
    assert all(isinstance(i, str) and i.startswith("event_") for i in ids), ids
    assert len(set(ids)) == len(ids), ids
    assert isinstance(record, dict)
    return record


def collapsed(types: list[str]) -> list[str]:
    """Runs of the same event type written once (deltas vary in number)."""
    return [t for n, t in enumerate(types) if n == 0 or types[n - 1] != t]


def response_part(types: list[str]) -> list[str]:
    return collapsed(types[types.index("response.created") :])


def test_session_created_is_an_openai_session(seen: dict[str, Any]) -> None:
    record = scenario(seen, "session")
    assert record["types"] == ["session.created"]
    assert record["classes"] == ["SessionCreatedEvent"]
    assert record["session_class"] == "RealtimeSessionCreateRequest"
    session = record["session"]
    assert session["type"] == "realtime"
    assert session["model"] == "gpt-realtime-test"
    assert session["output_modalities"] == ["audio"]
    pcm = {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["format"] == pcm
    assert session["audio"]["output"]["format"] == pcm
    # the resume extension rides along, and the SDK's model keeps it
    assert "resume" in record["extension_keys"], record["extension_keys"]


def test_a_text_turn(seen: dict[str, Any]) -> None:
    record = scenario(seen, "text")
    assert record["updated_modalities"] == ["text"]
    turn = record["turn"]
    assert response_part(turn["types"]) == TEXT_RESPONSE
    assert turn["text"] == TEXT
    assert turn["text_done"] == TEXT
    assert turn["status"] == "completed"
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]
    [item] = turn["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": TEXT}]
    [user] = record["user_items"]
    assert user["role"] == "user"
    assert user["content"] == [{"type": "input_text", "text": TEXT}]


def test_an_audio_turn_comes_back_from_echo(seen: dict[str, Any]) -> None:
    record = scenario(seen, "audio_echo")
    pcm = {"type": "audio/pcm", "rate": 24000}
    assert record["formats"] == [pcm, pcm]
    assert record["committed_item_id"].startswith("item_")
    turn = record["turn"]
    sent = pcm16(300)
    assert record["sent_sha"] == sha(sent)
    assert turn["audio_bytes"] == len(sent)
    assert turn["audio_sha"] == sha(sent)  # the echo engine's answer is the turn's audio
    assert turn["status"] == "completed"
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]
    types = response_part(turn["types"])
    assert "response.output_audio.delta" in types
    assert types.index("response.output_audio.delta") < types.index("response.output_audio.done")
    assert types[-1] == "response.done"


def test_an_audio_turn_is_answered_by_voice(seen: dict[str, Any]) -> None:
    record = scenario(seen, "audio_voice")
    turn = record["turn"]
    assert turn["status"] == "completed"
    assert turn["audio_bytes"] > 0 and turn["audio_bytes"] % 2 == 0
    assert turn["transcript"] == turn.get("transcript_done", "")


def test_a_cancel_mid_response(seen: dict[str, Any]) -> None:
    record = scenario(seen, "cancel")
    turn = record["turn"]
    assert turn["status"] == "cancelled"
    assert 0 < turn["audio_bytes"] < 24000 * 2 * 10  # some audio, not the whole answer
    assert turn["response_ids"] == [turn["created_id"]] == [turn["done_id"]]
    assert record["after"] == ["session.updated"]  # nothing of the response after its end
    [item] = turn["output"]
    assert item["status"] == "incomplete"
    assert LONG_TEXT.startswith(turn["transcript"])


def test_errors_are_openai_errors_and_the_connection_goes_on(seen: dict[str, Any]) -> None:
    record = scenario(seen, "error")
    unknown, bad = record["errors"]
    for error in (unknown, bad):
        assert error["type"] == "error"
        assert error["class"] == "RealtimeErrorEvent"
        assert error["error_class"] == "RealtimeError"
        assert error["error"]["type"] == "invalid_request_error"
    assert unknown["error"]["code"] == "unknown_event"
    assert unknown["error"]["event_id"] == "evt_unknown_1"
    assert bad["error"]["code"] == "bad_event"
    assert bad["error"]["param"] == "audio"
    assert bad["error"]["event_id"] == "e2"
    turn = record["turn"]
    assert turn["status"] == "completed" and turn["text"] == "still here"


def test_a_client_secret(seen: dict[str, Any]) -> None:
    record = scenario(seen, "client_secret")
    assert record["class"] == "ClientSecretCreateResponse"
    assert record["session_class"] == "RealtimeSessionCreateResponse"
    assert record["session"]["type"] == "realtime"
    assert record["session"]["instructions"] == "be brief"
    assert record["session"]["output_modalities"] == ["text"]
    assert 590 <= record["expires_in"] <= 600
    assert record["value_is_str"] and record["value_is_not_the_key"]
    # the secret opens a session with the configuration it locks
    assert record["created_session"]["instructions"] == "be brief"
    assert record["created_session"]["output_modalities"] == ["text"]
    turn = record["turn"]
    assert turn["status"] == "completed" and turn["text"] == "secret turn"
    # once only; a wrong key opens nothing and gets no secret
    assert record["reused"] == ["InvalidStatus", 401]
    assert record["wrong_key"] == ["InvalidStatus", 401]
    assert record["secret_with_wrong_key"] == ["AuthenticationError", 401]
