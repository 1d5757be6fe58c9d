"""LiveKit Agents' OpenAI realtime plugin (``livekit-plugins-openai`` 1.8.9, unchanged,
in a venv of its own) pointed at ``trio-duplex serve`` by ``base_url``: a text turn, an
audio turn and a barge-in, driven headless the way an ``AgentSession`` drives the
plugin's session (no LiveKit room or server is needed for that).

The plugin matches a ``response.created`` to its ``generate_reply`` by the
``metadata`` it sent in ``response.create``, and an added item to its
``update_chat_ctx`` by the item's id: both must come back as sent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Servers

from .conftest import API_KEY
from .sdk_livekit import LONG_TEXT, TEXT, pcm16, sha
from .test_python_sdk import TEXT_RESPONSE, http_base, response_part

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).with_name("sdk_livekit.py")
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def seen(livekit_python: Path, module_servers: Servers, key_file: Path) -> dict[str, Any]:
    keys = ("--api-key-file", str(key_file))
    echo, voice = module_servers.start_many(
        ("--engine", "echo", *keys), ("--engine", "voice", *keys)
    )
    command = [str(livekit_python), str(SCRIPT), "--api-key", API_KEY]
    command += ["--base-url", http_base(echo.url), "--voice-url", http_base(voice.url)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, f"{SCRIPT.name} failed:\n{done.stdout}\n{done.stderr}"
    results = json.loads(done.stdout)
    assert isinstance(results, dict)
    return results


def scenario(seen: dict[str, Any], name: str) -> dict[str, Any]:
    record = seen[name]
    assert isinstance(record, dict)
    assert "crash" not in record, record["crash"]
    assert record["errors"] == [], record["errors"]  # the plugin reported no error
    assert record["types"][:2] == ["session.created", "session.updated"], record["types"]
    return record


def test_a_text_turn(seen: dict[str, Any]) -> None:
    record = scenario(seen, "text")
    assert response_part(record["types"]) == TEXT_RESPONSE
    reply = record["reply"]
    assert reply["user_initiated"]  # matched to its generate_reply by the metadata
    assert reply["modalities"] == ["text"]
    assert reply["text"] == TEXT
    assert reply["audio_bytes"] == 0
    assert record["statuses"] == ["completed"]
    assert sorted(record["history"]) == [["assistant", TEXT], ["user", TEXT]]


def test_an_audio_turn_comes_back(seen: dict[str, Any]) -> None:
    record = scenario(seen, "audio_echo")
    assert "input_audio_buffer.committed" in record["types"]
    reply = record["reply"]
    assert reply["user_initiated"]
    assert "audio" in reply["modalities"]
    sent = pcm16(300)
    assert record["sent_sha"] == sha(sent)
    assert reply["audio_bytes"] == len(sent)
    assert reply["audio_sha"] == sha(sent)
    assert record["statuses"] == ["completed"]
    assert record["types"][-1] == "response.done"


def test_an_interrupt_cancels_the_response(seen: dict[str, Any]) -> None:
    record = scenario(seen, "cancel")
    reply = record["reply"]
    assert reply["user_initiated"]
    assert 0 < reply["audio_bytes"] < 24000 * 2 * 10  # some of the answer, not all
    assert LONG_TEXT.startswith(reply["text"])
    assert record["statuses"] == ["cancelled"]
    assert record["types"][-1] == "response.done"
