"""The official Python SDK, ``openai[realtime]`` unchanged in a venv of its own, holds a
conversation with ``trio-duplex serve`` over ``/v1/realtime``: the session, a text turn,
an audio turn, a cancel mid-response, errors, and a client secret.

``sdk_python.py`` runs every scenario once in that venv against three servers (the
echo, voice and speech engines, each behind ``--api-key-file``) and prints what the SDK's
own models read; each test here asserts one scenario's outcome exactly.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from tests.helpers import TEXT_RESPONSE, Servers
from tests.speech_audio import RATE as SPEECH_RATE
from tests.speech_audio import (
    VOICES,
    is_speech,
    judge,
    judge_reply,
    missing_speech_parts,
    needs_speech,
    recognise,
    reply_to,
    sentences,
    spoken,
)

from .conftest import API_KEY, run_script
from .sdk_python import SCENARIOS, TEXT
from .sdk_shared import LONG_TEXT, pcm16, sha

pytestmark = pytest.mark.integration


def http_base(url: str) -> str:
    """``ws://127.0.0.1:P/v1/duplex`` (the ready line) → the SDK's ``http://127.0.0.1:P/v1``."""
    assert url.startswith("ws://") and url.endswith("/v1/duplex"), url
    return "http://" + url.removeprefix("ws://").removesuffix("/duplex")


SENTENCES = 6
"""The outside set's first sentences, each said by each voice, in the speech_sentences
scenario (12 turns: one sentence's word error rate scatters, tests/speech_audio.py)."""


def speech_available() -> bool:
    """(In CI a missing part fails the speech tests: ``needs_speech``.)"""
    return not missing_speech_parts()


def http_servers(
    servers: Servers, key_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """An SDK script's arguments for the echo and voice servers, and the speech server
    where the speech engine can run (``--speech-url`` present) with the outside set's
    first sentence (``--speech-audio``) and its first SENTENCES in each voice
    (``--speech-sentences``)."""
    keys = ("--api-key-file", str(key_file))
    engines = ["echo", "voice", *(["speech"] if speech_available() else [])]
    started = servers.start_many(*(("--engine", name, *keys) for name in engines))
    urls = {name: http_base(server.url) for name, server in zip(engines, started, strict=True)}
    arguments = ["--api-key", API_KEY, "--base-url", urls["echo"], "--voice-url", urls["voice"]]
    if "speech" in urls:
        folder = tmp_path_factory.mktemp("speech")
        pcm = folder / "in.pcm"
        pcm.write_bytes(spoken_at_24k(sentences(1)[0]))
        many = folder / "sentences"
        many.mkdir()
        said = [(text, voice) for voice in VOICES for text in sentences(SENTENCES)]
        for n, (text, voice) in enumerate(said):
            (many / f"{n:03}.pcm").write_bytes(spoken_at_24k(text, voice))
        arguments += ["--speech-url", urls["speech"], "--speech-audio", str(pcm)]
        arguments += ["--speech-sentences", str(many)]
    return arguments


@pytest.fixture(scope="module")
def seen(
    openai_python: Path,
    module_servers: Servers,
    key_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    arguments = http_servers(module_servers, key_file, tmp_path_factory)
    speech = ["audio_speech", "speech_sentences"]
    scenarios = [name for name in SCENARIOS if name not in speech]
    if "--speech-url" in arguments:
        scenarios += speech
    return run_script(openai_python, "sdk_python", *arguments, *scenarios)


def spoken_at_24k(text: str, voice: str = "espeak-ng") -> bytes:
    """``text`` said by ``voice`` (tests/speech_audio.py), as OpenAI's 24 kHz PCM16."""
    return at_rate(spoken(text, voice), SPEECH_RATE, 24_000)


def at_rate(pcm: bytes, rate: int, to: int) -> bytes:
    samples = np.frombuffer(pcm, dtype=np.int16)
    out: bytes = soxr.resample(samples, rate, to).astype(np.int16).tobytes()
    return out


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


@needs_speech
def test_a_spoken_turn_is_heard_transcribed_and_answered_aloud(seen: dict[str, Any]) -> None:
    """The speech engine with server-side turn detection: the SDK only appends audio."""
    record = scenario(seen, "audio_speech")
    heard = record["heard_types"]
    assert heard.index("input_audio_buffer.speech_started") < heard.index(
        "input_audio_buffer.speech_stopped"
    )
    assert "input_audio_buffer.committed" in heard
    assert heard[-1] == "conversation.item.input_audio_transcription.completed"
    # (How well it hears: test_sentences_are_heard_and_the_last_answered_aloud.)
    assert record["transcript"].split(), record["transcript"]
    turn = record["turn"]
    assert turn["status"] == "completed"
    assert turn["transcript"] == turn["transcript_done"] == reply_to(record["transcript"])
    answer = base64.b64decode(record["answer"])
    assert len(answer) == turn["audio_bytes"] > 24_000  # over half a second of reply
    assert is_speech(at_rate(answer, 24_000, SPEECH_RATE))
    assert not is_speech(bytes(len(answer)))  # (the check can fail)
    judge_reply(turn["transcript"], recognise(answer, 24_000))  # the audio says its text


@needs_speech
def test_sentences_are_heard_and_the_last_answered_aloud(seen: dict[str, Any]) -> None:
    """The outside set's first sentences in both voices, streamed through the SDK: each a
    turn (started, stopped, committed, its transcript), heard within the bound; then a
    response.create answers the last one aloud."""
    record = scenario(seen, "speech_sentences")
    transcripts = record["transcripts"]
    judge(sentences(SENTENCES) * len(VOICES), transcripts)
    heard = record["heard_types"]
    turns = len(transcripts)
    for kind in ("speech_started", "speech_stopped", "committed"):
        assert heard.count(f"input_audio_buffer.{kind}") == turns, heard
    assert "conversation.item.input_audio_transcription.failed" not in heard
    assert "response.created" not in heard  # create_response: false
    turn = record["turn"]
    assert turn["status"] == "completed"
    assert turn["transcript"] == reply_to(transcripts[-1])
    answer = base64.b64decode(record["answer"])
    judge_reply(turn["transcript"], recognise(answer, 24_000))


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


def test_a_client_secret_is_issued(seen: dict[str, Any]) -> None:
    record = seen["client_secret"]
    assert "crash" not in record, record["crash"]
    assert record["class"] == "ClientSecretCreateResponse"
    assert record["session_class"] == "RealtimeSessionCreateResponse"
    assert record["session"]["type"] == "realtime"
    assert record["session"]["instructions"] == "be brief"
    assert record["session"]["output_modalities"] == ["text"]
    assert 590 <= record["expires_in"] <= 600
    assert record["value_is_str"] and record["value_is_not_the_key"]
    # a wrong key opens nothing and gets no secret
    assert record["wrong_key"] == ["InvalidStatus", 401]
    assert record["secret_with_wrong_key"] == ["AuthenticationError", 401]


def test_a_client_secret_opens_its_session_once(seen: dict[str, Any]) -> None:
    record = scenario(seen, "client_secret")
    assert "connect_crash" not in record, record["connect_crash"]
    # the secret opens a session with the configuration it locks
    assert record["created_session"]["instructions"] == "be brief"
    assert record["created_session"]["output_modalities"] == ["text"]
    turn = record["turn"]
    assert turn["status"] == "completed" and turn["text"] == "secret turn"
    assert record["reused"] == ["InvalidStatus", 401]  # once only
