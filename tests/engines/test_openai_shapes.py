"""What echo and voice send in a conversation, through the OpenAI dialect's shaper, is
what the OpenAI SDK reads: every frame validated strictly with its own models
(tests/dialects/openai/reference.py), for text turns, audio turns, item events and a
cancel."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trio_duplex.dialects.openai import OPENAI
from trio_duplex.dialects.openai.config import defaults
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.voice import VoiceEngine

from ..dialects.openai.reference import shaped_frames, validate
from .test_conversation import PCM, running, user_text


def check_all(config: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """Shape and validate every event; the OpenAI types written, in order."""
    return [validate(frame).type for frame in shaped_frames(OPENAI.shaper(config), events)]


async def test_echo_conversation_is_valid_openai(autojump_clock: trio.testing.MockClock) -> None:
    config = defaults()
    async with running(EchoEngine(config), config) as h:
        await h.put_event(user_text("hello", id="u1"))
        await h.put("response.create")
        await h.put("input_audio_buffer.append", audio=PCM)
        await h.put("input_audio_buffer.commit")
        await h.put("response.create")
        await h.put("conversation.item.retrieve", item_id="item_resp_1")
        await h.put("conversation.item.retrieve", item_id="u1")
        await h.put("conversation.item.truncate", item_id="item_resp_2", content_index=0,
                    audio_end_ms=10)  # fmt: skip
        await h.put("conversation.item.delete", item_id="u1")
        await h.put("input_audio_buffer.append", audio=PCM)
        await h.put("input_audio_buffer.clear")
        types = check_all(config, h.events)
    assert types.count("response.done") == 2
    assert "response.output_text.delta" in types and "response.output_audio.delta" in types
    for kind in ("input_audio_buffer.committed", "conversation.item.retrieved",
                 "conversation.item.truncated", "conversation.item.deleted",
                 "input_audio_buffer.cleared"):  # fmt: skip
        assert kind in types


async def test_voice_conversation_and_cancel_are_valid_openai(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = defaults()
    async with running(VoiceEngine(config), config) as h:
        await h.put_event(user_text("hello world"))
        await h.put("response.create")
        await trio.sleep(2)
        await h.put("response.create", response={"output_modalities": ["text"]})
        await trio.sleep(1)
        await h.put("response.create")
        await trio.sleep(0.1)
        await h.put("response.cancel")
        await trio.sleep(1)
        await h.put("conversation.item.retrieve", item_id="item_resp_3")
        types = check_all(config, h.events)
    assert types.count("response.done") == 3  # (a cancelled response ends in one too)
    assert "response.output_audio_transcript.delta" in types
    assert types[-1] == "conversation.item.retrieved"
