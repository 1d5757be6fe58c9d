"""The speech engine's listener: the session's audio through its turn detector, as it
arrives, and each turn's words from the shared recogniser pool.

Its rules (docs/speech.md, "End of turn" and "Partial transcripts"):

- The reader appends audio to ``buffer``; the listener feeds it to the ``TurnDetector``
  (Silero VAD, inline: a fraction of a millisecond per 32 ms window) and acts on what it
  detects, in order. While a turn's final decode is awaited, audio waits in ``buffer``
  (bounded by the engine: the client then gets ``input_backpressure``).
- STARTED: any response playing is cancelled at once (barge-in, unless the session's
  ``turn_detection.interrupt_response`` is false; reason ``turn_detected``), then
  ``speech_started``.
- While a turn goes on, every ``partial_every_s`` (0.5) of its audio the turn so far is
  re-decoded in a task of its own, only if a pool worker is idle then (``partial=True``:
  otherwise skipped, never queued). A word two decodes in a row agree on, that is not
  the guess's last, has firmed up and goes out as a ``transcript.delta``.
- STOPPED: (conversing) ``speech_stopped``, ``committed``, ``item.added``; the final
  decode (queued FIFO in the pool); ``transcript.done`` and the turn answered, or, when
  the pool fails it (``RecogniserFailed``), ``input_audio.transcript.failed`` and the
  turn is not answered: the session goes on.
- For a migration ``replay`` holds the audio fed since the last quiet point (the
  detector's ``held()``, plus a turn whose final decode is not done), so that a new
  detector hears the turn in progress again from its start.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import trio

from ..api import EngineSession, Event
from ..conversation import conversing
from ..turns import Turns
from ._capacity import BYTES_PER_SECOND
from ._detector import Detected, Kind, TurnDetector, TurnSettings
from ._pool import RecogniserFailed, RecogniserPool
from ._talk import Talk, answers_turns, detects_turns, interrupts
from ._vad import VadStream, vad_model

log = logging.getLogger("trio_duplex.engines.speech")

PARTIAL_EVERY_S: Final = 0.5  # a partial decode per this much of a turn's audio, at most
FIRM_GUESSES: Final = 2  # a word is firm once this many partial guesses agree on it
FEED_BYTES: Final = BYTES_PER_SECOND // 10  # the most audio fed to the detector at once
MAX_QUEUED: Final = 4  # turns waiting for their response
_TURN_KEYS: Final = ("threshold", "prefix_padding_ms", "silence_duration_ms")


def turn_settings(base: TurnSettings, turn_detection: object) -> TurnSettings:
    """``base`` with what the session's ``turn_detection`` names of OpenAI's server_vad
    fields (threshold, prefix_padding_ms, silence_duration_ms). ValueError: one of them
    is out of its range (TurnSettings says which)."""
    if not isinstance(turn_detection, Mapping):
        return base
    named = [k for k in _TURN_KEYS if turn_detection.get(k) is not None]
    if not named:
        return base
    read = TurnSettings.from_config(turn_detection)
    return attrs.evolve(base, **{k: getattr(read, k) for k in named})


@attrs.define(eq=False)
class Listener:
    turns: Turns[Any, Any]
    history: deque[dict[str, str]]
    queue: Callable[[str], None]  # a transcript to answer (the engine's history and turns)
    base: TurnSettings  # the engine's; the session's turn_detection may change fields
    partial_every_s: float = PARTIAL_EVERY_S
    talk: Talk = attrs.Factory(Talk)
    config: Mapping[str, Any] = attrs.Factory(dict)  # the session's (live)
    pool: RecogniserPool | None = None
    buffer: bytearray = attrs.Factory(bytearray)  # taken from input, not yet fed
    replay: bytearray = attrs.Factory(bytearray)  # fed since the last quiet point
    fed: int = 0  # bytes fed to the detector since ``origin_ms``
    origin_ms: float = 0.0  # session audio before the detector's time 0
    turn_started: bool = False  # speech_started sent (or kept) for the turn going on
    turn_words: list[str] = attrs.Factory(list)  # its words sent as transcript deltas
    hearing: bool = False  # audio out of the buffer, not yet acted on
    audio_in: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    heard_all: trio.lowlevel.ParkingLot = attrs.Factory(trio.lowlevel.ParkingLot)
    _detector: TurnDetector | None = None
    _settings: TurnSettings | None = None
    _seen_detection: object = None  # the turn_detection the settings were made from
    _guesses: deque[list[str]] = attrs.Factory(lambda: deque(maxlen=FIRM_GUESSES))
    _guess: str | None = None  # a partial decode's text, not yet acted on
    _generation: int = 0  # the turn partial decodes belong to (a late one is dropped)
    _partial_running: bool = False
    _next_partial_s: float = 0.0  # (set at each turn's start and stop)
    _final_pending: bool = False  # a STOPPED turn's final decode is awaited

    def take(self, pcm: bytes) -> None:
        self.buffer += pcm
        self.talk.conversation.append_audio(pcm)
        self.audio_in.unpark_all()

    async def all_heard(self) -> None:
        """Return once the audio taken so far is heard and acted on (a turn it ended is
        decoded and announced), or input has ended."""
        while (self.buffer or self.hearing) and not self.turns.input_ended:
            await self.heard_all.park()

    def replay_at_ms(self) -> float:
        """Where ``replay`` starts in the session's input audio."""
        return self.origin_ms + (self.fed - len(self.replay)) * 1000 / BYTES_PER_SECOND

    # -- the loop -------------------------------------------------------------------

    async def run(self, session: EngineSession, pool: RecogniserPool) -> None:
        self.pool = pool
        self.config = session.config  # (live: session.update changes it)
        self._detector = self._new_detector()
        async with trio.open_nursery() as partials:
            await self._listen(session, partials)
            partials.cancel_scope.cancel()

    async def _listen(self, session: EngineSession, partials: trio.Nursery) -> None:
        while True:
            if self._guess is not None:
                await self._heard_partial(session)
                continue
            if not self.buffer:
                if self.turns.input_ended:
                    return
                await self.audio_in.park()
                continue
            await self._announce(session)  # (restored: what the last node had not sent)
            detector = self._current_detector()
            piece = bytes(self.buffer[:FEED_BYTES])
            self.hearing = True
            # Fed, moved to replay and out of the buffer at once: a migration stop while
            # what it detected is acted on finds the audio in replay, heard again there.
            detected = detector.feed(piece)
            del self.buffer[: len(piece)]
            self.replay += piece
            self.fed += len(piece)
            self.turns.make_room()
            stopped = False
            for found in detected:
                stopped |= found.kind is Kind.STOPPED
                await self._hear(session, found)
            self._maybe_partial(partials)
            if not self._final_pending and (stopped or not detector.in_turn):
                self._trim(len(detector.held()))
            self.hearing = False
            self.heard_all.unpark_all()
            # A backlog (a restored turn, a client ahead of real time) is heard a piece at
            # a time with the other sessions' frames between: never a long stretch at once.
            await trio.lowlevel.checkpoint()

    def _new_detector(self, settings: TurnSettings | None = None) -> TurnDetector:
        if settings is None:
            detection = self.config.get("turn_detection")
            self._seen_detection = _copy(detection)
            try:
                settings = turn_settings(self.base, detection)
            except ValueError as exc:  # (the engine refused such a session at its start)
                log.info("turn_detection not taken: %s", exc)
                settings = self.base
        self.origin_ms += self.fed * 1000 / BYTES_PER_SECOND
        self.fed = 0
        return TurnDetector(settings, VadStream(vad_model()))

    def _current_detector(self) -> TurnDetector:
        """The detector, made anew with the session's settings when a session.update
        changed them (between turns: a turn is heard to its end as it began)."""
        detector = self._detector
        assert detector is not None
        detection = self.config.get("turn_detection")
        if detection == self._seen_detection or detector.in_turn:
            return detector
        self._seen_detection = _copy(detection)
        try:
            settings = turn_settings(self.base, detection)
        except ValueError as exc:  # (a session.update's: the settings in force stay)
            log.info("turn_detection not taken: %s", exc)
            return detector
        if settings == self._settings:
            return detector
        # The quiet point's audio into the new one too: a turn starting now keeps its
        # prefix padding (its time 0 is where that audio began).
        held = detector.held()
        self.fed -= len(held)
        self._detector = self._new_detector(settings)
        self.buffer[:0] = held
        self._trim(0)
        return self._detector

    def _trim(self, keep: int) -> None:
        if len(self.replay) > keep:
            del self.replay[: len(self.replay) - keep]

    # -- what the detector found ----------------------------------------------------

    def _detects(self) -> bool:
        """Turns are the detector's (not the client's commits), and this one is not
        committed already."""
        skipping = conversing(self.config) and not detects_turns(self.config)
        return not skipping and not self.talk.skip_turn

    async def _hear(self, session: EngineSession, found: Detected) -> None:
        self._generation += 1  # a partial decode still running is of a turn now over
        self._guesses.clear()
        self._next_partial_s = self.partial_every_s
        if not self._detects():
            await self._hear_only(found)
        elif found.kind is Kind.STARTED:
            if self.turn_started:  # restored mid-turn: this turn was announced
                return
            if interrupts(self.config):  # barge-in: the user speaks over the response
                self.turns.cancel(None, "turn_detected")
            started: Event = {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": round(self.origin_ms + found.at_ms),
            }
            if conversing(self.config):
                started["item_id"] = self.talk.start_turn()
            await session.send(started)
            self.turn_started = True
        elif conversing(self.config):
            await self.turns.wait_room(self.no_room_for_turn)  # its response must have room
            await self._end_turn(session, found)
        else:
            await self.turns.wait_room(self.no_room_for_turn)
            text, failure = await self._final(found.audio)
            if interrupts(self.config):  # (else the reply plays on; this turn's waits)
                self.turns.cancel(None, "turn_detected")
            event: Event = (
                {"type": "input_audio.transcript.done", "text": text}
                if text is not None
                else failed(failure)
            )
            await session.send(event)
            self._turn_over()
            if text is not None:
                self.queue(text)

    async def _hear_only(self, found: Detected) -> None:
        """No turn detection (or a turn the client committed): the words are kept for
        the client's commit, nothing is announced."""
        if found.kind is Kind.STARTED:
            self.turn_started = True
            return
        text = ""
        if not self.talk.skip_turn:  # (committed already: its words were taken then)
            heard, _failure = await self._final(found.audio)  # (failed: no words kept)
            text = heard or ""
        self.talk.hear(text, True)
        self._turn_over()

    async def _end_turn(self, session: EngineSession, found: Detected) -> None:
        """A detected turn has ended: ``speech_stopped``, the item committed, then its
        transcript (or its failure) once decoded, then its answer (after the reply
        playing, with ``interrupt_response`` false)."""
        if interrupts(self.config):
            self.turns.cancel(None, "turn_detected")
        if self.talk.awaiting is None:  # (restored: the last node had announced it)
            self.talk.announcing += self.talk.stop_turn(self.origin_ms + found.at_ms)
            await self.talk.announce(session)
        text, failure = await self._final(found.audio)
        if text is None:
            self.talk.announcing += self.talk.failed(failure)
        else:
            self.talk.announcing += self.talk.transcribed(text)
            if answers_turns(self.config):
                self.talk.then_answer = text  # once announced (a snapshot keeps it)
            else:
                self.history.append({"role": "user", "text": text})
        self._turn_over()
        await self._announce(session)

    def _turn_over(self) -> None:
        """The turn is decoded: from here on a new node need not hear it again."""
        self.turn_started = False
        self.turn_words = []
        self._final_pending = False
        assert self._detector is not None
        self._trim(len(self._detector.held()))

    async def _announce(self, session: EngineSession) -> None:
        """Send the turn's announcement, then queue its answer: in that order, wherever a
        migration stop lands (the next node sends the rest, then queues it)."""
        await self.talk.announce(session)
        if self.talk.then_answer is not None:
            self.queue(self.talk.then_answer)
            self.talk.then_answer = None

    def no_room_for_turn(self) -> bool:
        return len(self.turns.queued) >= MAX_QUEUED

    # -- decoding ---------------------------------------------------------------------

    async def _final(self, pcm: bytes) -> tuple[str | None, str]:
        """The turn's transcript, or None and why the pool failed it."""
        assert self.pool is not None
        self._final_pending = True
        try:
            text = await self.pool.transcribe(pcm)
        except RecogniserFailed as exc:
            log.info("a turn's transcription failed: %s", exc)
            return None, str(exc)
        return text or "", ""

    async def decode_open_turn(self) -> str | None:
        """The turn going on, decoded now (a client's commit ends it); None if there is
        none, or the pool failed it."""
        detector = self._detector
        if self.pool is None or detector is None or not detector.in_turn:
            return None
        self._generation += 1
        try:
            return await self.pool.transcribe(_whole(detector.turn_audio()))
        except RecogniserFailed as exc:
            log.info("a committed turn's transcription failed: %s", exc)
            return None

    def _maybe_partial(self, partials: trio.Nursery) -> None:
        detector = self._detector
        if detector is None or not detector.in_turn or self._partial_running or not self._detects():
            return
        seconds = detector.turn_seconds()
        if seconds < self._next_partial_s:
            return
        every = self.partial_every_s
        self._next_partial_s = (math.floor(seconds / every) + 1) * every
        self._partial_running = True
        partials.start_soon(self._partial, _whole(detector.turn_audio()), self._generation)

    async def _partial(self, pcm: bytes, generation: int) -> None:
        assert self.pool is not None
        try:
            text = await self.pool.transcribe(pcm, partial=True)
        except RecogniserFailed:
            text = None  # (only a guess: the final decode says what counts)
        finally:
            self._partial_running = False
        if text is not None and generation == self._generation:
            self._guess = text
            self.audio_in.unpark_all()

    async def _heard_partial(self, session: EngineSession) -> None:
        guess, self._guess = self._guess or "", None
        self.talk.partial = guess
        delta = self._firm_delta(guess.split())
        if delta:
            heard: Event = {"type": "input_audio.transcript.delta", "text": delta}
            if self.talk.turn_item is not None:
                heard["item_id"] = self.talk.turn_item
            await session.send(heard)
            self.turn_words += delta.split()

    def _firm_delta(self, guess: list[str]) -> str:
        """The words that firmed up: the same in the last ``FIRM_GUESSES`` guesses (case
        and the marks around a word aside: Whisper punctuates an unfinished sentence as it
        pleases), and not the guess's last word (still forming); "" if none, or if they
        contradict the words already sent. They are written as the latest guess has them.
        The final decode (``transcript.done``) may differ from them."""
        self._guesses.append(guess[:-1])
        if len(self._guesses) < FIRM_GUESSES:
            return ""
        firm: list[str] = []
        for same in zip(*self._guesses, strict=False):
            if any(_key(word) != _key(same[0]) for word in same):
                break
            firm.append(same[-1])
        sent = [_key(word) for word in self.turn_words]
        if len(firm) <= len(sent) or [_key(word) for word in firm[: len(sent)]] != sent:
            return ""
        new = " ".join(firm[len(sent) :])
        return f" {new}" if sent else new


def _key(word: str) -> str:
    return word.strip(".,!?;:\"'()").lower()


def _copy(detection: object) -> object:
    # (a copy: a configuration changed in place is still seen as changed)
    return dict(detection) if isinstance(detection, Mapping) else detection


def _whole(pcm: bytes) -> bytes:
    # The turn so far ends where the audio fed ends: whole samples only (the server
    # refuses odd PCM16; an embedder's engine API may not).
    return pcm[: len(pcm) - len(pcm) % 2]


def failed(message: str, item_id: str | None = None) -> Event:
    """A turn's transcription failed (the pool's worker died or timed out on it)."""
    event: Event = {
        "type": "input_audio.transcript.failed",
        "error": {"type": "transcription_failed", "message": message},
    }
    if item_id is not None:
        event["item_id"] = item_id
    return event
