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
The conversation (docs/engines.md, "The conversation"): ``conversation.item.*`` and
``input_audio_buffer.commit/clear`` are answered by its ``Conversation`` (a committed
buffer is a user item with no transcript: it hears no words); ``response.create`` queues a
response that speaks the latest user message's text (its texts and transcripts) as
``input.text.append`` does, except that ``response.created`` carries the
``response.create``'s ``metadata`` (if any) and ``output_modalities``: ``["audio"]``
(the text deltas are the audio's transcript), or
``["text"]`` when the ``response.create`` override or the session's
``output_modalities`` asks for text only: the words then come as text deltas at once, with
no audio, then ``response.done``. Each response's assistant item (``item_`` + its id) is
kept for ``conversation.item.retrieve``.

- It migrates (``snapshot``/``restore``, cluster mode). Its state: the response counter;
  the response being spoken (id, text, whether ``response.created`` was sent, the next
  frame whose audio was not, whether that frame's text delta was, whether a cancel was
  read, whether only its end is left); the texts queued; ``audio_bytes_received`` and
  ``max_queued``. Restored, it goes on mid-sentence: that frame at once (its delta first
  unless sent), then one every 20 ms from there, then the queued texts. A cancel read
  after the restore stops the restored response like any other (its id is kept), and each
  response still gets exactly one ``response.created`` and one end.
"""

from __future__ import annotations

import enum
import functools
import math
import struct
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Final, TypeVar

import attrs
import trio

from .api import INPUT_DTMF, BadEvent, Engine, EngineSession, Event, check_dtmf
from .conversation import (
    EVENTS,
    RESPONSE_EVENTS,
    Conversation,
    check_response_event,
    created,
    output_modalities,
    response_metadata,
    restored_metadata,
)
from .turns import Turns, send_end, send_live, speak_unless_cancelled

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
_T = TypeVar("_T")


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


def speech_frames(text: str, first: int = 0) -> Iterator[tuple[str | None, bytes]]:
    """``text`` as 20 ms PCM16 frames, each with the word that starts on it, if any; from
    frame number ``first`` on (a restored response goes on mid-sentence).

    Lazy, so that a long text costs one frame of work per frame sent.
    """
    position = 0  # the number of the next frame
    for index, word in enumerate(text.split()):
        if index:
            for _ in range(min(_GAP_FRAMES, position + _GAP_FRAMES - first)):
                yield None, _SILENCE
            position += _GAP_FRAMES
        frames = word_frames(word)
        if position + frames > first:
            yield from _tone_frames(word, word_pitch(word), frames, max(0, first - position))
        position += frames


def _tone_frames(
    word: str, pitch: float, frames: int, first: int = 0
) -> Iterator[tuple[str | None, bytes]]:
    total = frames * FRAME_SAMPLES
    step = 2 * math.pi * pitch / SAMPLE_RATE
    for frame in range(first, frames):
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


class _Stage(enum.Enum):
    CREATE = "create"  # response.created is not sequenced yet
    SPEAK = "speak"  # its frames from ``next_frame`` on are (none once cancelled)
    END = "end"  # only its end is left; a cancel no longer applies


@attrs.frozen
class _Turn:
    """A text to speak, and the modalities its ``response.created`` names (None: an
    ``input.text.append``, whose events are as they always were)."""

    text: str
    modalities: tuple[str, ...] | None = None
    metadata: dict[str, str] | None = None  # its response.create's, for response.created

    def state(self) -> str | dict[str, Any]:
        if self.modalities is None:
            return self.text  # (voice/1's shape)
        state = {"text": self.text, "output_modalities": list(self.modalities)}
        return state | ({} if self.metadata is None else {"metadata": self.metadata})


def _start(response_id: str, turn: _Turn) -> _Response:
    return _Response(response_id, turn.text, modalities=turn.modalities, metadata=turn.metadata)


@attrs.define(eq=False)
class _Response:
    """The response being spoken, and exactly where its output stands.

    Each field changes right after the send it describes returns (or the cancel it
    records is read), with no await in between: wherever a migration stop lands, this is
    what the client has got, and a snapshot of it goes on from there.
    """

    response_id: str
    text: str
    stage: _Stage = _Stage.CREATE
    next_frame: int = 0  # the first frame whose audio is not sequenced
    delta_sent: bool = False  # that frame's text delta is (it starts a word)
    cancelled: bool = False  # a cancel was read: no more audio, response.cancelled ends it
    cancel_reason: str | None = None  # (never set: voice hears no speech to barge in on)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)  # what a cancel cancels
    modalities: tuple[str, ...] | None = None  # a response.create's (text only: next_frame
    # counts the words sent)
    metadata: dict[str, str] | None = None  # its response.create's

    @property
    def finished(self) -> bool:
        return self.stage is _Stage.END

    def state(self) -> dict[str, Any]:
        """Its part of the engine's snapshot (``_restore_response`` reads it back)."""
        return {
            "response_id": self.response_id,
            "text": self.text,
            "stage": self.stage.value,
            "next_frame": self.next_frame,
            "delta_sent": self.delta_sent,
            "cancelled": self.cancelled,
        } | (
            ({} if self.modalities is None else {"modalities": list(self.modalities)})
            | ({} if self.metadata is None else {"metadata": self.metadata})
        )


class VoiceEngine(Engine):
    """Speaks ``input.text.append`` as paced synthetic audio; see the module docstring."""

    accepts = frozenset(
        {"input.text.append", "input_audio_buffer.append", INPUT_DTMF, *EVENTS, *RESPONSE_EVENTS}
    )
    audio_rate: int | None = SAMPLE_RATE  # it hears and speaks 24 kHz mono PCM16 (protocol v2)

    def __init__(self, config: Mapping[str, Any] | None = None, *, max_queued: int = 16) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self.config = dict(config or {})
        self.max_queued = max_queued
        self.audio_bytes_received = 0
        self._turns = Turns[_Turn, _Response](_start)  # the texts queued, the one speaking
        self.conversation = Conversation()  # (it keeps no audio: it hears no words)
        self._outbox: deque[Event] = deque()  # conversation answers not yet sequenced

    def check(self, event: Event) -> None:
        kind = event["type"]
        if kind == "input.text.append":
            if not isinstance(event.get("text"), str):
                raise BadEvent("text must be a string", param="text")
        elif kind == INPUT_DTMF:
            check_dtmf(event)
        elif kind in RESPONSE_EVENTS:
            check_response_event(event)
        else:
            self.conversation.check(event)

    async def run(self, session: EngineSession) -> None:
        # The reader never waits on speech, so input (and above all a cancel) is read
        # while a response plays: that is the full duplex.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._turns.speak, functools.partial(self._respond, session))
            # One text over max_queued may be held: read no more until one starts. Once
            # input has ended, the queued responses are still spoken, then run returns.
            await self._flush(session)  # (restored: answers the last node had not sent)
            await self._turns.read(session, functools.partial(self._take, session), self._full)

    def _full(self) -> bool:
        return len(self._turns.queued) > self.max_queued

    async def _take(self, session: EngineSession, event: Event) -> None:
        kind = event["type"]
        if kind == "input.text.append":
            self._turns.put(_Turn(event["text"]))
        elif kind == INPUT_DTMF:  # a key: spoken, after what is queued
            self._turns.put(_Turn(event["digit"]))
        elif kind == "input_audio_buffer.append":
            self.audio_bytes_received += len(event["audio"])  # PCM16 bytes
            self.conversation.append_audio(event["audio"])
        elif kind == "response.cancel":
            self._turns.cancel(event.get("response_id"))
        elif kind == "response.create":
            turn = self.conversation.latest_user()
            modalities = output_modalities(session.config, event, "audio")
            text = "" if turn is None else turn.text
            self._turns.put(_Turn(text, tuple(modalities), response_metadata(event)))
        else:
            self._outbox.extend(self.conversation.take(event))
            await self._flush(session)

    async def _flush(self, session: EngineSession) -> None:
        while self._outbox:
            await session.send(self._outbox[0])
            self._outbox.popleft()

    async def _respond(self, session: EngineSession, response: _Response) -> None:
        response_id = response.response_id
        if response.stage is _Stage.CREATE:
            # A cancel read during this send is kept for after it: created is still sent
            # whole, and no audio follows.
            if response.modalities is not None:
                self.conversation.begin_response(response_id)
            await session.send(created(response_id, response.modalities, response.metadata))
            response.stage = _Stage.SPEAK
        if response.stage is _Stage.SPEAK:
            stream = self._stream if response.modalities != ("text",) else self._write
            await speak_unless_cancelled(response, functools.partial(stream, session, response))
            # No checkpoint since the scope closed: a later cancel cannot reach this one.
            response.stage = _Stage.END
        if response.modalities is not None:
            status = "incomplete" if response.cancelled else "completed"
            self.conversation.end_response(response_id, response.text, response.modalities, status)
        await send_end(session, response)

    async def _write(self, session: EngineSession, response: _Response) -> None:
        """A text-only response: its words as text deltas, at once (no audio to pace)."""
        for index, word in enumerate(response.text.split()):
            if index >= response.next_frame:  # (restored: the words not yet sent)
                delta = word if index == 0 else " " + word
                await send_live(
                    session,
                    {"type": "response.output_text.delta", "response_id": response.response_id,
                     "text": delta},
                )  # fmt: skip
                response.next_frame = index + 1

    async def _stream(self, session: EngineSession, response: _Response) -> None:
        first = response.next_frame
        # Paced from now: a restored response sends its next frame at once.
        start = trio.current_time() - first * FRAME_SECONDS
        response_id = response.response_id
        for index, (word, frame) in enumerate(speech_frames(response.text, first), first):
            await trio.sleep_until(start + index * FRAME_SECONDS)
            if word is not None and not response.delta_sent:
                delta = word if index == 0 else " " + word  # deltas join with one space
                await send_live(
                    session,
                    {"type": "response.output_text.delta", "response_id": response_id,
                     "text": delta},
                )  # fmt: skip
                response.delta_sent = True
            await send_live(
                session,
                {"type": "response.output_audio.delta", "response_id": response_id,
                 "audio": frame},
            )  # fmt: skip
            response.next_frame = index + 1
            response.delta_sent = False
        # Done when the last frame has played, not when it was sent.
        await trio.sleep_until(start + response.next_frame * FRAME_SECONDS)

    def snapshot(self) -> dict[str, Any]:
        speaking = self._turns.speaking
        return {
            "state": _STATE,
            "responses": self._turns.responses,
            "speaking": None if speaking is None else speaking.state(),
            "queued": [turn.state() for turn in self._turns.queued],
            "audio_bytes_received": self.audio_bytes_received,
            "max_queued": self.max_queued,
            "outbox": list(self._outbox),
            "conversation": self.conversation.snapshot(),
        }

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") not in (_STATE, _OLD_STATE):
            raise ValueError(f"not a snapshot of the voice engine ({_STATE}): {_short(state)}")
        responses = _count(state, "responses")
        queued = [_restore_turn(turn) for turn in _field(state, "queued", list)]
        audio_bytes = _count(state, "audio_bytes_received")
        max_queued = _count(state, "max_queued", minimum=1)
        speaking = state.get("speaking")
        restored = None if speaking is None else _restore_response(speaking)
        conversation, outbox = Conversation(), deque[Event]()
        if state["state"] == _STATE:  # (voice/1 had no conversation)
            conversation.restore(state.get("conversation"))
            outbox.extend(_field(state, "outbox", list))
            if not all(isinstance(event, dict) for event in outbox):
                raise ValueError("voice snapshot: 'outbox' must be a list of events")
        self._turns.speaking = restored
        self._turns.responses, self._turns.queued = responses, deque(queued)
        self.audio_bytes_received, self.max_queued = audio_bytes, max_queued
        self.conversation, self._outbox = conversation, outbox


_STATE: Final = "voice/2"  # the shape of the snapshot; a restore takes this and voice/1
_OLD_STATE: Final = "voice/1"


def _restore_turn(state: object) -> _Turn:
    if isinstance(state, str):
        return _Turn(state)
    if isinstance(state, dict):
        return _Turn(
            _field(state, "text", str),
            _modalities(state.get("output_modalities")),
            restored_metadata(state.get("metadata")),  # (absent before responses carried it)
        )
    raise ValueError(f"voice snapshot: 'queued' must be a list of texts, not {_short(state)}")


def _modalities(value: object) -> tuple[str, ...]:
    if value not in (["audio"], ["text"]):
        raise ValueError(f"voice snapshot: output_modalities {_short(value)} is not known")
    assert isinstance(value, list)
    return tuple(value)


def _restore_response(state: object) -> _Response:
    if not isinstance(state, dict):
        raise ValueError(f"voice snapshot: 'speaking' must be an object, not {_short(state)}")
    text = _field(state, "text", str)
    try:
        stage = _Stage(state.get("stage"))
    except ValueError:
        raise ValueError(f"voice snapshot: unknown stage {_short(state.get('stage'))}") from None
    next_frame = _count(state, "next_frame")
    if next_frame > frame_count(text):
        raise ValueError(f"voice snapshot: frame {next_frame} is past the text's end")
    return _Response(
        _field(state, "response_id", str),
        text,
        stage,
        next_frame,
        _field(state, "delta_sent", bool),
        _field(state, "cancelled", bool),
        modalities=None if state.get("modalities") is None else _modalities(state["modalities"]),
        metadata=restored_metadata(state.get("metadata")),
    )


def _field(state: Mapping[str, Any], key: str, kind: type[_T]) -> _T:
    value = state.get(key)
    if type(value) is not kind:  # type(), not isinstance(): True is no frame number
        raise ValueError(f"voice snapshot: {key!r} is not a {kind.__name__}: {_short(value)}")
    return value


def _count(state: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = _field(state, key, int)
    if value < minimum:
        raise ValueError(f"voice snapshot: {key!r} is {value}, under {minimum}")
    return value


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
