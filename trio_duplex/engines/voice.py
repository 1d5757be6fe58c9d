"""The built-in ``voice`` engine: speaks text as synthetic audio, with no model.

It behaves like a realtime speech model so that clients can be built and tested against
full duplex, pacing and barge-in without one.

Client events:

- ``input.text.append {text}`` queues a response that speaks ``text``. Each
  whitespace-separated word becomes a tone whose pitch is derived from the word (the
  same word always sounds the same), with a short silence between words.
- ``input_audio_buffer.append {audio}`` is accepted at any time, also while speaking,
  and only counted (``audio_bytes_received``, in 24 kHz PCM16 bytes); it is never
  answered.
- ``response.cancel {response_id?}`` (barge-in) stops the response being spoken at
  once. Without ``response_id`` it stops whatever is speaking; with one it stops that
  response only if it is the one speaking.

Server events, for each ``input.text.append``, in this order:
``response.created {response_id}``; then, every 20 ms of the session clock, one
``response.output_audio.delta {response_id, audio}`` holding exactly 20 ms of 24 kHz
mono PCM16 little-endian audio (960 bytes; on the wire in the session's negotiated
format and lane), preceded by
``response.output_text.delta {response_id, text}`` on the frame where a word starts (the
deltas join to the words separated by single spaces); finally ``response.done
{response_id}`` when the audio's playback time is over, or ``response.cancelled
{response_id}`` after a cancel. So every text gets exactly one ``response.created`` and
exactly one of ``response.done`` / ``response.cancelled``; a text without words gets no
audio.

Decisions:

- Responses queue: text that arrives while speaking is spoken after the current
  response, in order. A cancel stops only the current response; queued ones follow.
  Response ids (``resp_1``, ``resp_2``, ...) are given when a response starts.
- A cancel with nothing speaking, or naming a response that is not speaking (it has
  ended, or a stale id), is ignored and emits nothing: barge-in races the end of a
  response, and clients may send it whenever the user talks without tracking state.
- No audio is sequenced after a cancel has been read: the frame that was being sent
  when it arrived is the last one, and ``response.cancelled`` follows it.
- At most ``max_queued`` texts wait (default 16). Beyond that the engine stops reading
  input until one starts, so the server answers further input with
  ``input_backpressure``; a cancel sent then waits its turn like any other event.
- Frames are paced against absolute deadlines; a frame delayed by backpressure is sent
  as soon as possible and the following ones catch up to the schedule.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs
import trio

from .api import BadEvent, Engine, EngineSession, Event

SAMPLE_RATE: Final = 24_000
FRAME_SAMPLES: Final = 480
FRAME_BYTES: Final = FRAME_SAMPLES * 2
FRAME_SECONDS: Final = FRAME_SAMPLES / SAMPLE_RATE

# Word tones last 60 ms per character, 120 to 600 ms, in whole frames so that each word
# (and its text delta) starts on a frame boundary.
_FRAMES_PER_CHAR: Final = 3
_MIN_TONE_FRAMES: Final = 6
_MAX_TONE_FRAMES: Final = 30
_GAP_FRAMES: Final = 4
_AMPLITUDE: Final = 0.3 * 32767
_RAMP_SAMPLES: Final = 120  # 5 ms fade in and out, so tones start and stop without a click
_SILENCE: Final = bytes(FRAME_BYTES)


def word_pitch(word: str) -> float:
    """The tone frequency of ``word`` in Hz: 180 to 810, from a stable hash of the word."""
    # crc32, not hash(): str hashes change from one process to the next.
    digest = zlib.crc32(word.casefold().encode("utf-8", "surrogatepass"))
    return 180.0 + (digest % 64) * 10.0


def word_frames(word: str) -> int:
    """How many 20 ms frames the tone of ``word`` lasts."""
    return max(_MIN_TONE_FRAMES, min(_MAX_TONE_FRAMES, _FRAMES_PER_CHAR * len(word)))


def frame_count(text: str) -> int:
    """How many 20 ms frames speaking ``text`` takes."""
    words = text.split()
    return sum(map(word_frames, words)) + _GAP_FRAMES * max(0, len(words) - 1)


def speech_frames(text: str) -> Iterator[tuple[str | None, bytes]]:
    """``text`` as 20 ms PCM16 frames, each with the word that starts on it, if any.

    Lazy, so that a long text costs one frame of work per frame sent.
    """
    for index, word in enumerate(text.split()):
        if index:
            for _ in range(_GAP_FRAMES):
                yield None, _SILENCE
        yield from _tone_frames(word, word_pitch(word), word_frames(word))


def _tone_frames(word: str, pitch: float, frames: int) -> Iterator[tuple[str | None, bytes]]:
    total = frames * FRAME_SAMPLES
    step = 2 * math.pi * pitch / SAMPLE_RATE
    for frame in range(frames):
        samples = []
        for n in range(frame * FRAME_SAMPLES, (frame + 1) * FRAME_SAMPLES):
            ramp = min(1.0, n / _RAMP_SAMPLES, (total - n) / _RAMP_SAMPLES)
            samples.append(round(_AMPLITUDE * ramp * math.sin(step * n)))
        yield (word if frame == 0 else None), struct.pack(f"<{FRAME_SAMPLES}h", *samples)


def pcm16_to_wav(pcm: bytes, sample_rate: int = SAMPLE_RATE, channels: int = 1) -> bytes:
    """Wrap little-endian PCM16 samples in a WAV (RIFF) file, e.g. for ``--save-audio``."""
    block = 2 * channels
    if len(pcm) % block:
        raise ValueError(f"PCM16 data of {channels} channel(s) must be whole {block}-byte frames")
    if len(pcm) > 0xFFFFFFFF - 36:
        raise ValueError("too much audio for one WAV file (4 GiB)")
    # Written by hand: the stdlib ``wave`` takes samples in the host's byte order.
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + len(pcm), b"WAVE",
        b"fmt ", 16, 1, channels, sample_rate, sample_rate * block, block, 16,
        b"data", len(pcm),
    )  # fmt: skip
    return header + pcm


@attrs.define(eq=False)
class _Speaking:
    response_id: str
    scope: trio.CancelScope


class VoiceEngine(Engine):
    """Speaks ``input.text.append`` as paced synthetic audio; see the module docstring."""

    accepts = frozenset({"input.text.append", "input_audio_buffer.append", "response.cancel"})
    audio_rate: int | None = SAMPLE_RATE  # it hears and speaks 24 kHz mono PCM16 (protocol v2)

    def __init__(self, config: Mapping[str, Any] | None = None, *, max_queued: int = 16) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.config = dict(config or {})
        self.max_queued = max_queued
        self.audio_bytes_received = 0
        self._responses = 0
        self._speaking: _Speaking | None = None

    def check(self, event: Event) -> None:
        kind = event["type"]
        if kind == "input.text.append":
            if not isinstance(event.get("text"), str):
                raise BadEvent("text must be a string", param="text")
        elif kind == "response.cancel":
            if not isinstance(event.get("response_id", ""), str):
                raise BadEvent("response_id must be a string", param="response_id")

    async def run(self, session: EngineSession) -> None:
        # The reader never waits on speech, so input (and above all a cancel) is read
        # while a response plays: that is the full duplex.
        send_text, receive_text = trio.open_memory_channel[str](self.max_queued)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._speak_queued, session, receive_text)
            async with send_text:
                async for event in session:
                    kind = event["type"]
                    if kind == "input.text.append":
                        await send_text.send(event["text"])
                    elif kind == "input_audio_buffer.append":
                        self.audio_bytes_received += len(event["audio"])  # PCM16 bytes
                    elif kind == "response.cancel":
                        self._cancel(event.get("response_id"))
            # Input has ended: the queued responses are still spoken, then run returns.

    def _cancel(self, response_id: str | None) -> None:
        # Synchronous: once this returns, the speaker sends no further frame.
        speaking = self._speaking
        if speaking is not None and response_id in (None, speaking.response_id):
            speaking.scope.cancel()

    async def _speak_queued(
        self, session: EngineSession, texts: trio.MemoryReceiveChannel[str]
    ) -> None:
        async with texts:
            async for text in texts:
                await self._respond(session, text)

    async def _respond(self, session: EngineSession, text: str) -> None:
        self._responses += 1
        response_id = f"resp_{self._responses}"
        # Cancellable from here on. A cancel during the send of response.created lands
        # before the scope is entered: created is still sent whole, and no audio follows.
        scope = trio.CancelScope()
        self._speaking = _Speaking(response_id, scope)
        try:
            await session.send({"type": "response.created", "response_id": response_id})
            with scope:
                await self._stream(session, response_id, text)
        finally:
            # No checkpoint since the scope closed: a later cancel cannot reach this one.
            self._speaking = None
        ending = "response.cancelled" if scope.cancel_called else "response.done"
        await session.send({"type": ending, "response_id": response_id})

    async def _stream(self, session: EngineSession, response_id: str, text: str) -> None:
        start = trio.current_time()
        index = -1
        for index, (word, frame) in enumerate(speech_frames(text)):
            await trio.sleep_until(start + index * FRAME_SECONDS)
            if word is not None:
                delta = word if index == 0 else " " + word  # deltas join with one space
                await _send_live(
                    session,
                    {"type": "response.output_text.delta", "response_id": response_id,
                     "text": delta},
                )  # fmt: skip
            await _send_live(
                session,
                {"type": "response.output_audio.delta", "response_id": response_id,
                 "audio": frame},
            )  # fmt: skip
        # Done when the last frame has played, not when it was sent.
        await trio.sleep_until(start + (index + 1) * FRAME_SECONDS)


async def _send_live(session: EngineSession, event: Event) -> None:
    # A task woken by its deadline in the same batch as the cancel resumes normally and
    # would send one more frame: check for the cancel before every send.
    await trio.lowlevel.checkpoint_if_cancelled()
    await session.send(event)
