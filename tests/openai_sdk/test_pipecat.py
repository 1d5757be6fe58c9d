"""Pipecat's OpenAI realtime service (``pipecat-ai[openai]`` 1.14.0, unchanged, in a venv
of its own) pointed at ``trio-duplex serve`` by ``base_url``: a text turn, an audio turn
(manual turns: the pipeline's ``UserStoppedSpeakingFrame`` commits) and an interruption,
in a pipeline with no transport (frames in at one end, read at the other).

Pipecat validates every server event it handles with pydantic models of its own, and
takes any ``error`` event it does not expect as fatal: a shape it does not know, or an
error, ends its session and fails the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Servers

from .conftest import API_KEY, run_script
from .sdk_shared import LONG_TEXT, pcm16, sha

pytestmark = pytest.mark.integration
TEXT = "hello from pipecat"  # as sdk_pipecat.py says it (that script imports pipecat)


def ws_url(url: str) -> str:
    """``ws://127.0.0.1:P/v1/duplex`` (the ready line) → ``ws://127.0.0.1:P/v1/realtime``."""
    assert url.startswith("ws://") and url.endswith("/v1/duplex"), url
    return url.removesuffix("/duplex") + "/realtime"


@pytest.fixture(scope="module")
def seen(pipecat_python: Path, module_servers: Servers, key_file: Path) -> dict[str, Any]:
    keys = ("--api-key-file", str(key_file))
    echo, voice = module_servers.start_many(
        ("--engine", "echo", *keys), ("--engine", "voice", *keys)
    )
    return run_script(
        pipecat_python,
        "sdk_pipecat",
        *("--api-key", API_KEY, "--base-url", ws_url(echo.url), "--voice-url", ws_url(voice.url)),
    )


def scenario(seen: dict[str, Any], name: str) -> dict[str, Any]:
    record = seen[name]
    assert isinstance(record, dict)
    assert "crash" not in record, record["crash"]
    assert record["errors"] == [], record["errors"]  # no ErrorFrame came upstream
    return record


def test_a_text_turn(seen: dict[str, Any]) -> None:
    record = scenario(seen, "text")
    turn = record["turn"]
    assert turn["text"] == TEXT
    assert turn["audio_bytes"] == 0
    assert record["items"][-1] == ["assistant", "completed"]
    assert record["frames"][-1] == "LLMFullResponseEndFrame"


def test_an_audio_turn_comes_back(seen: dict[str, Any]) -> None:
    record = scenario(seen, "audio_echo")
    turn = record["turn"]
    sent = pcm16(300)
    assert record["sent_sha"] == sha(sent)
    assert turn["rates"] == [24000]
    assert turn["audio_bytes"] == len(sent)
    assert turn["audio_sha"] == sha(sent)
    assert "TTSStartedFrame" in record["frames"]


def test_an_interruption_cancels_the_response(seen: dict[str, Any]) -> None:
    record = scenario(seen, "cancel")
    turn = record["turn"]
    assert 0 < turn["audio_bytes"] < 24000 * 2 * 10  # some of the answer, not all
    assert LONG_TEXT.startswith(turn["text"])
    assert record["frames"][-1] == "LLMFullResponseEndFrame"
    assert record["items"][-1] == ["assistant", "incomplete"]  # the response was cancelled
