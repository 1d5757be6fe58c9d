"""LiveKit Agents' OpenAI realtime plugin (``livekit-plugins-openai``, unchanged) pointed
at a ``trio-duplex serve``: its ``RealtimeModel(base_url=...)`` session, headless (no
LiveKit room: the session is driven as an ``AgentSession`` drives it, through
``update_chat_ctx``, ``push_audio``/``commit_audio``, ``generate_reply`` and
``interrupt``).

Run in the venv of ``livekit-requirements.txt``, never the project's: ``python -m
tests.openai_sdk.sdk_livekit --base-url http://H:P/v1 --voice-url http://H:P2/v1 --speech-url
http://H:P3/v1 --speech-audio PCM --api-key K [SCENARIO ...]``.
Prints one JSON object, scenario → what the plugin gave (or ``{"crash": traceback}``),
which ``test_livekit.py`` asserts on.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad

from tests.openai_sdk.sdk_shared import LONG_TEXT, RATE, TIMEOUT, cli, pcm16, run_scenarios

TEXT = "hello from livekit"


class Session:
    """A plugin session, and every server event and error it reported."""

    def __init__(self, model: openai.realtime.RealtimeModel) -> None:
        self.session = model.session()
        self.types: list[str] = []
        self.errors: list[str] = []
        self.statuses: list[str] = []  # each response.done's response.status
        self.ended = asyncio.Event()  # a response.done was seen
        self.session.on("openai_server_event_received", self._seen)
        self.session.on("error", lambda e: self.errors.append(repr(e.error)))

    def _seen(self, event: dict[str, Any]) -> None:
        self.types.append(event["type"])
        if event["type"] == "response.done":
            self.statuses.append(event["response"]["status"])
            self.ended.set()

    async def reply(self, *, cancel_after_audio: bool = False) -> dict[str, Any]:
        """generate_reply, then read its one message's text and audio to the end."""
        generation = await asyncio.wait_for(self.session.generate_reply(), TIMEOUT)
        return await self.read(generation, cancel_after_audio=cancel_after_audio)

    async def read(
        self, generation: llm.GenerationCreatedEvent, *, cancel_after_audio: bool = False
    ) -> dict[str, Any]:
        """A generation's one message, its text and audio read to the end."""
        messages = []
        async for message in generation.message_stream:
            messages.append(message)
            break
        [message] = messages
        audio = bytearray()
        frames = 0

        async def read_audio() -> None:
            nonlocal frames
            async for frame in message.audio_stream:
                audio.extend(frame.data.tobytes())
                frames += 1
                assert frame.sample_rate == RATE and frame.num_channels == 1
                if cancel_after_audio and frames == 1:
                    self.session.interrupt()

        async def read_text() -> str:
            return "".join([piece async for piece in message.text_stream])

        text, _ = await asyncio.wait_for(asyncio.gather(read_text(), read_audio()), TIMEOUT)
        return {
            "response_id": generation.response_id,
            "user_initiated": generation.user_initiated,
            "modalities": await asyncio.wait_for(message.modalities, TIMEOUT),
            "text": text,
            "audio_bytes": len(audio),
            "audio": base64.b64encode(bytes(audio)).decode(),
        }

    async def close(self) -> dict[str, Any]:
        await self.session.aclose()
        return {"types": self.types, "errors": self.errors, "statuses": self.statuses}


def model(
    args: argparse.Namespace,
    http: aiohttp.ClientSession,
    base_url: str,
    modality: str,
    turn_detection: ServerVad | None = None,
) -> openai.realtime.RealtimeModel:
    return openai.realtime.RealtimeModel(
        model="gpt-realtime-test",
        base_url=base_url,
        api_key=args.api_key,
        http_session=http,
        modalities=[modality],
        turn_detection=turn_detection,
        input_audio_transcription=None,
    )


async def _say(session: Session, text: str) -> None:
    chat = session.session.chat_ctx.copy()
    chat.add_message(role="user", content=text)
    await asyncio.wait_for(session.session.update_chat_ctx(chat), TIMEOUT)


async def text_scenario(args: argparse.Namespace, http: aiohttp.ClientSession) -> dict[str, Any]:
    session = Session(model(args, http, args.base_url, "text"))
    try:
        await _say(session, TEXT)
        reply = await session.reply()
        history = [
            (item.role, item.text_content)
            for item in session.session.chat_ctx.items
            if isinstance(item, llm.ChatMessage)
        ]
    finally:
        closed = await session.close()
    return {**closed, "reply": reply, "history": history}


async def audio_scenario(args: argparse.Namespace, http: aiohttp.ClientSession) -> dict[str, Any]:
    session = Session(model(args, http, args.base_url, "audio"))
    sent = pcm16(300)
    try:
        for start in range(0, len(sent), 960):  # 20 ms frames, as a room's track gives them
            chunk = sent[start : start + 960]
            session.session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        session.session.commit_audio()
        reply = await session.reply()
    finally:
        closed = await session.close()
    return {**closed, "reply": reply, "sent_bytes": len(sent)}


async def cancel_scenario(args: argparse.Namespace, http: aiohttp.ClientSession) -> dict[str, Any]:
    session = Session(model(args, http, args.voice_url, "audio"))
    try:
        await _say(session, LONG_TEXT)
        reply = await session.reply(cancel_after_audio=True)
        # interrupt() ends the plugin's streams at once, before the server's answer to its
        # response.cancel: wait for that response.done (with the deadline) before closing.
        await asyncio.wait_for(session.ended.wait(), TIMEOUT)
    finally:
        closed = await session.close()
    return {**closed, "reply": reply}


async def speech_scenario(args: argparse.Namespace, http: aiohttp.ClientSession) -> dict[str, Any]:
    """A voice agent's own path: server-side turn detection (the speech engine) hears a
    spoken sentence pushed as a room's track would, and the server starts the response
    (a generation the plugin did not ask for)."""
    vad = ServerVad(type="server_vad")
    session = Session(model(args, http, args.speech_url, "audio", turn_detection=vad))
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    heard: list[str] = []
    session.session.on("generation_created", generations.put_nowait)
    session.session.on("input_audio_transcription_completed", lambda e: heard.append(e.transcript))
    sent: bytes = args.speech_pcm
    try:
        for start in range(0, len(sent), 960):
            chunk = sent[start : start + 960]
            session.session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        reply = await session.read(await asyncio.wait_for(generations.get(), TIMEOUT))
    finally:
        closed = await session.close()
    return {**closed, "reply": reply, "heard": heard}


SCENARIOS: dict[
    str, Callable[[argparse.Namespace, aiohttp.ClientSession], Awaitable[dict[str, Any]]]
] = {
    "text": text_scenario,
    "audio_echo": audio_scenario,
    "cancel": cancel_scenario,
    "speech": speech_scenario,
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        return await run_scenarios(args.scenarios, lambda name: SCENARIOS[name](args, http))


if __name__ == "__main__":
    cli(__doc__, SCENARIOS, run)
