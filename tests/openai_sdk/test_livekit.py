"""LiveKit Agents' OpenAI realtime plugin (``livekit-plugins-openai`` 1.8.9, unchanged,
in a venv of its own) pointed at ``trio-duplex serve`` by ``base_url``: a text turn, an
audio turn and a barge-in through ``generate_reply``, and a spoken turn the server hears
(the speech engine's turn detection) answered by a response the server starts, driven
headless the way an ``AgentSession`` drives the plugin's session (no LiveKit room or
server is needed for that).

The plugin matches a ``response.created`` to its ``generate_reply`` by the
``metadata`` it sent in ``response.create``, and an added item to its
``update_chat_ctx`` by the item's id: both must come back as sent.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TEXT_RESPONSE, Servers
from tests.speech_audio import RATE as SPEECH_RATE
from tests.speech_audio import is_speech, needs_speech, reply_to

from .conftest import run_script
from .sdk_shared import LONG_TEXT, pcm16
from .test_python_sdk import (
    at_rate,
    http_servers,
    response_part,
)

pytestmark = pytest.mark.integration
TEXT = "hello from livekit"  # as sdk_livekit.py says it (that script imports livekit)


@pytest.fixture(scope="module")
def seen(
    livekit_python: Path,
    module_servers: Servers,
    key_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    arguments = http_servers(module_servers, key_file, tmp_path_factory)
    scenarios = ["text", "audio_echo", "cancel"]
    if "--speech-url" in arguments:
        scenarios.append("speech")
    return run_script(livekit_python, "sdk_livekit", *arguments, *scenarios)


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
    assert record["sent_bytes"] == len(sent)
    assert base64.b64decode(reply["audio"]) == sent
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


@needs_speech
def test_a_spoken_turn_the_server_hears_is_answered_aloud(seen: dict[str, Any]) -> None:
    """The agent's own path: server-side turn detection, a response the server starts."""
    record = scenario(seen, "speech")
    [heard] = record["heard"]  # the plugin's input_audio_transcription_completed
    assert heard.split(), heard  # (how well: test_python_sdk.py, on many sentences)
    reply = record["reply"]
    assert not reply["user_initiated"]
    assert "audio" in reply["modalities"]
    assert reply["text"] == reply_to(heard)
    answer = base64.b64decode(reply["audio"])
    assert len(answer) == reply["audio_bytes"] > 24_000
    assert is_speech(at_rate(answer, 24_000, SPEECH_RATE))
    assert record["statuses"] == ["completed"]
