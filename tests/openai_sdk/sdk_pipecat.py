"""Pipecat's OpenAI realtime service (``pipecat-ai[openai]``, unchanged) pointed at a
``trio-duplex serve``: ``OpenAIRealtimeLLMService(base_url="ws://H:P/v1/realtime")`` in a
pipeline of its own (no transport: frames go in at one end and are read at the other),
as a Pipecat bot uses it.

Run in the venv of ``pipecat-requirements.txt``, never the project's: ``python -m
tests.openai_sdk.sdk_pipecat --base-url ws://H:P/v1/realtime --voice-url ws://H:P2/v1/realtime
--api-key K``. Prints one JSON object, scenario → what frames came out (or ``{"crash":
traceback}``), which ``test_pipecat.py`` asserts on.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.tests.utils import QueuedFrameProcessor
from pipecat.workers.runner import WorkerRunner

from tests.openai_sdk.sdk_shared import LONG_TEXT, RATE, TIMEOUT, cli, pcm16, run_scenarios, sha

TEXT = "hello from pipecat"


class Bot:
    """source → the service → sink, run by a WorkerRunner; frames read at the sink."""

    def __init__(self, base_url: str, api_key: str, modality: str) -> None:
        properties = events.SessionProperties(
            output_modalities=[modality],
            # manual turns: the pipeline's UserStoppedSpeakingFrame commits the audio
            audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=False)),
        )
        self.service = OpenAIRealtimeLLMService(
            api_key=api_key,
            base_url=base_url,
            settings=OpenAIRealtimeLLMService.Settings(
                model="gpt-realtime-test", session_properties=properties
            ),
        )
        self.down: asyncio.Queue[Frame] = asyncio.Queue()
        self.up: asyncio.Queue[Frame] = asyncio.Queue()
        source = QueuedFrameProcessor(queue=self.up, queue_direction=FrameDirection.UPSTREAM)
        sink = QueuedFrameProcessor(queue=self.down, queue_direction=FrameDirection.DOWNSTREAM)
        self.worker = PipelineWorker(
            Pipeline([source, self.service, sink]), cancel_on_idle_timeout=False
        )
        self.started = asyncio.Event()
        self.worker.event_handler("on_pipeline_started")(self._on_started)
        self.frames: list[str] = []
        self.errors: list[str] = []
        self.items: list[list[Any]] = []  # each item the service saw done: [role, status]
        self.service.event_handler("on_conversation_item_updated")(self._on_item)
        self.assistant_done = asyncio.Event()  # an assistant item the service saw ended

    async def _on_started(self, worker: object, frame: object) -> None:
        self.started.set()

    async def _on_item(self, service: object, item_id: str, item: Any) -> None:
        if item is not None:
            self.items.append([item.role, item.status])
            if item.role == "assistant" and item.status != "in_progress":
                self.assistant_done.set()

    async def __aenter__(self) -> Bot:
        runner = WorkerRunner()
        await runner.add_workers(self.worker)
        self.task = asyncio.create_task(runner.run())
        await asyncio.wait_for(self.started.wait(), TIMEOUT)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(self.task, TIMEOUT)
        while not self.up.empty():  # errors travel upstream
            frame = self.up.get_nowait()
            if isinstance(frame, ErrorFrame):
                self.errors.append(frame.error)

    async def send(self, frame: Frame) -> None:
        await self.worker.queue_frame(frame)

    async def until(
        self, kind: type[Frame], *, on_audio: Callable[[], Awaitable[None]] | None = None
    ) -> list[Frame]:
        """The frames out of the service up to and including the next ``kind``."""
        frames: list[Frame] = []
        while True:
            frame = await asyncio.wait_for(self.down.get(), TIMEOUT)
            frames.append(frame)
            self.frames.append(type(frame).__name__)
            if on_audio is not None and isinstance(frame, TTSAudioRawFrame):
                await on_audio()
                on_audio = None
            if isinstance(frame, kind):
                return frames

    def record(self) -> dict[str, Any]:
        return {"frames": self.frames, "errors": self.errors, "items": self.items}


def summary(frames: list[Frame]) -> dict[str, Any]:
    audio = b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))
    rates = sorted({f.sample_rate for f in frames if isinstance(f, TTSAudioRawFrame)})
    return {
        "text": "".join(f.text for f in frames if isinstance(f, LLMTextFrame)),
        "audio_bytes": len(audio),
        "audio_sha": sha(audio),
        "rates": rates,
    }


async def text_scenario(args: argparse.Namespace) -> dict[str, Any]:
    async with Bot(args.base_url, args.api_key, "text") as bot:
        await bot.send(LLMContextFrame(LLMContext(messages=[{"role": "user", "content": TEXT}])))
        frames = await bot.until(LLMFullResponseEndFrame)
        await asyncio.wait_for(bot.assistant_done.wait(), TIMEOUT)  # (see cancel_scenario)
    return {**bot.record(), "turn": summary(frames)}


async def audio_scenario(args: argparse.Namespace) -> dict[str, Any]:
    sent = pcm16(300)
    async with Bot(args.base_url, args.api_key, "audio") as bot:
        await bot.send(LLMContextFrame(LLMContext(messages=[])))
        for start in range(0, len(sent), 960):  # 20 ms frames, as a transport gives them
            await bot.send(
                InputAudioRawFrame(
                    audio=sent[start : start + 960], sample_rate=RATE, num_channels=1
                )
            )
        await bot.send(UserStoppedSpeakingFrame())
        frames = await bot.until(LLMFullResponseEndFrame)
    return {**bot.record(), "turn": summary(frames), "sent_bytes": len(sent), "sent_sha": sha(sent)}


async def cancel_scenario(args: argparse.Namespace) -> dict[str, Any]:
    async with Bot(args.voice_url, args.api_key, "audio") as bot:

        async def interrupt() -> None:
            await bot.send(InterruptionFrame())

        context = LLMContext(messages=[{"role": "user", "content": LONG_TEXT}])
        await bot.send(LLMContextFrame(context))
        frames = await bot.until(LLMFullResponseEndFrame, on_audio=interrupt)
        # The service reports the item's end by a handler of its own, which may run after
        # the response's end frame: wait for it (with the deadline) before ending.
        await asyncio.wait_for(bot.assistant_done.wait(), TIMEOUT)
    return {**bot.record(), "turn": summary(frames)}


SCENARIOS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "text": text_scenario,
    "audio_echo": audio_scenario,
    "cancel": cancel_scenario,
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    return await run_scenarios(args.scenarios, lambda name: SCENARIOS[name](args))


if __name__ == "__main__":
    cli(__doc__, SCENARIOS, run, url="ws://H:P/v1/realtime", speech=False)
