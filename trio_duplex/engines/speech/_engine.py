"""``SpeechEngine``: hears with faster-whisper (a shared pool of recogniser processes)
and a Silero VAD turn detector, answers through a responder, speaks with a voice (Piper,
flite or eSpeak NG). docs/speech.md is its guide; the package's docstring lists its
events.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import attrs
import trio

from ..api import INPUT_DTMF, BadEvent, Engine, EngineSession, Event, check_dtmf
from ..conversation import (
    EVENTS,
    RESPONSE_EVENTS,
    check_response_event,
    response_metadata,
    response_modalities,
)
from ..turns import Turns
from ._answer import Answerer, Responder, Response, response, say_back
from ._capacity import BYTES_PER_SECOND, SAMPLE_RATE, cores, default_max_sessions
from ._choose import check_available, check_model, check_voice
from ._detector import TurnSettings
from ._listen import MAX_QUEUED, PARTIAL_EVERY_S, Listener, turn_settings
from ._models import ModelChoice
from ._pool import shared_pool
from ._snapshot import Asked, Speaking, State
from ._synthesise import MAX_CLAUSE_CHARS, Voice
from ._talk import Talk

log = logging.getLogger("trio_duplex.engines.speech")

MAX_TYPED_CHARS: Final = 2000  # a typed turn (input.text.append)
DEFAULTS: Final = TurnSettings()


class SpeechEngine(Engine):
    """Hears 16 kHz PCM16, answers each turn with ``responder``'s text, spoken."""

    accepts = frozenset(
        {"input_audio_buffer.append", "input.text.append", INPUT_DTMF, *EVENTS, *RESPONSE_EVENTS}
    )
    audio_rate: int | None = SAMPLE_RATE
    turn_detection: ClassVar[Mapping[str, Any] | None] = {
        "type": "server_vad",
        "threshold": DEFAULTS.threshold,
        "prefix_padding_ms": DEFAULTS.prefix_padding_ms,
        "silence_duration_ms": DEFAULTS.silence_duration_ms,
        "create_response": True,
        "interrupt_response": True,
    }
    """Its detector ends turns, answers them and cancels a reply spoken over (unless the
    session's ``turn_detection`` is null, or its ``create_response`` false); a session's
    ``threshold``, ``prefix_padding_ms`` and ``silence_duration_ms`` are taken."""

    default_max_sessions = staticmethod(default_max_sessions)
    """``serve --engine speech`` takes its ``--max-sessions`` default from here."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        responder: Responder = say_back,
        model: str | ModelChoice | None = None,
        voice: str | Voice | None = None,
        recognisers: int | None = None,
        turn: TurnSettings | None = None,
        partial_every_s: float = PARTIAL_EVERY_S,
        max_buffered_s: float = 10.0,
        responder_timeout_s: float = 30.0,
        max_reply_chars: int = 2000,
        max_history: int = 64,
    ) -> None:
        if not (max_buffered_s > 0 and responder_timeout_s > 0 and partial_every_s > 0):
            raise ValueError("max_buffered_s, responder_timeout_s and partial_every_s must be > 0")
        if recognisers is not None and recognisers < 1:
            raise ValueError("recognisers must be at least 1")
        if not isinstance(model, ModelChoice):
            model = check_model(model)  # SpeechUnavailable, saying what to install
        if voice is None or isinstance(voice, str):
            voice = check_voice(voice)
        self.config = dict(config or {})
        try:
            turn_settings(turn or DEFAULTS, self.config.get("turn_detection"))
        except ValueError as exc:  # a session opened with it gets bad_event
            raise BadEvent(str(exc), param="turn_detection") from None
        self.model = model
        self.voice = voice
        self.recognisers = recognisers
        self.max_buffered_bytes = int(max_buffered_s * BYTES_PER_SECOND)
        self.history: deque[dict[str, str]] = deque(maxlen=max_history)
        """The conversation so far: ``{"role": "user" | "assistant", "text"}``."""
        # Turns' transcripts awaiting a response, and the one speaking.
        self._turns = Turns[str | Asked, Response](response)
        self._listener = Listener(
            self._turns, self.history, self._queue_turn, turn or DEFAULTS, partial_every_s
        )
        self._answerer = Answerer(
            responder, voice, self.history, responder_timeout_s, max_reply_chars,
            lambda: self._listener.talk,
        )  # fmt: skip
        self.responder = responder

    def check(self, event: Event) -> None:
        kind = event["type"]
        if kind == "input.text.append":
            text = event.get("text")
            if not isinstance(text, str):
                raise BadEvent("text must be a string", param="text")
            if len(text) > MAX_TYPED_CHARS:  # it goes into the history and the snapshot
                raise BadEvent(f"text is over {MAX_TYPED_CHARS} characters", param="text")
        elif kind == INPUT_DTMF:
            check_dtmf(event)
        elif kind in RESPONSE_EVENTS:
            check_response_event(event)
        else:
            self._listener.talk.conversation.check(event)

    # -- the reader ------------------------------------------------------------------

    async def run(self, session: EngineSession) -> None:
        # The recognisers are the server's (a pool of processes, started by the first
        # speech session); this session only queues its turns there.
        pool = shared_pool(self.model, self.recognisers)
        _warm(self.voice)
        self._answerer.config = session.config  # (live: session.update changes it)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                self._turns.speak, functools.partial(self._answerer.respond, session)
            )
            nursery.start_soon(self._listener.run, session, pool)
            await self._listener.talk.flush(session)  # (restored: what the last node had not sent)
            await self._turns.read(session, functools.partial(self._take, session), self._full)
            self._listener.audio_in.unpark_all()

    def _full(self) -> bool:
        # The recogniser is behind, or turns wait: read no more input, so the server
        # answers the client's next audio with input_backpressure.
        return (
            len(self._listener.buffer) >= self.max_buffered_bytes
            or len(self._turns.queued) > MAX_QUEUED
        )

    async def _take(self, session: EngineSession, event: Event) -> None:
        kind = event["type"]
        listener = self._listener
        talk = listener.talk
        if kind == "input_audio_buffer.append":
            listener.take(event["audio"])
        elif kind == "input.text.append" or kind == INPUT_DTMF:
            # A typed turn (a key pressed: its digit), answered like a spoken one.
            self._turns.cancel(None)
            self._queue_turn(event["text"] if kind == "input.text.append" else event["digit"])
        elif kind == "response.cancel":
            self._turns.cancel(event.get("response_id"))
        elif kind == "response.create":  # the latest user message, answered
            turn = talk.conversation.latest_user()
            text = "" if turn is None else turn.text
            self._queue_turn(text, response_metadata(event), response_modalities(event))
        elif kind == "input_audio_buffer.commit":
            await listener.all_heard()  # the detector hears all of it first
            if listener.turn_started and not talk.skip_turn:  # a turn going on ends here
                heard = await listener.decode_open_turn()
                talk.partial = talk.partial if heard is None else heard
            talk.commit(listener.turn_started)
            await talk.flush(session)
        else:
            if kind == "input_audio_buffer.clear":
                listener.buffer.clear()  # (not yet heard: never will be)
            talk.take(event, listener.turn_started)
            await talk.flush(session)

    def _queue_turn(
        self,
        transcript: str,
        metadata: dict[str, str] | None = None,
        modalities: tuple[str] | None = None,
    ) -> None:
        self.history.append({"role": "user", "text": transcript})
        plain = metadata is None and modalities is None
        self._turns.put(transcript if plain else Asked(transcript, metadata, modalities))

    # -- migration -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        speaking = self._turns.speaking
        listener = self._listener
        return State(
            # From the last quiet point, and what is not fed yet: heard again.
            bytes(listener.replay) + bytes(listener.buffer),
            listener.replay_at_ms(),
            listener.turn_started,
            tuple(listener.turn_words),
            tuple(self.history),
            tuple(self._turns.queued),
            self._turns.responses,
            None
            if speaking is None
            else Speaking(
                speaking.response_id,
                speaking.transcript,
                speaking.created,
                speaking.finished,
                speaking.cancelled,
                tuple(speaking.said),
                speaking.metadata,
                speaking.modalities,
            ),
            listener.talk.state(),
        ).write()

    def restore(self, state: bytes | dict[str, Any]) -> None:
        got = State.read(state)  # all checked before anything is taken
        talk = Talk.read(got.talk)  # (checked too, before anything is taken)
        speaking = got.speaking
        if speaking is not None:
            self._turns.speaking = Response(
                speaking.response_id,
                speaking.transcript,
                speaking.created,
                speaking.cancelled,
                speaking.finished,
                said=[*speaking.said],
                metadata=speaking.metadata,
                modalities=speaking.modalities,
            )
        listener = self._listener
        listener.buffer = bytearray(got.audio)
        listener.replay = bytearray()
        listener.origin_ms = got.audio_at_ms
        listener.turn_started = got.turn_started
        listener.turn_words = list(got.turn_words)
        self.history.extend(got.history)
        self._turns.queued = deque(got.queued)
        self._turns.responses = got.responses
        listener.talk = talk


def _warm(voice: Voice) -> None:
    """Start a voice's processes now, if it has any (Piper's pool: its first start takes
    seconds, which the session's first turn gives it), not at the first reply."""
    from ._piper import PiperVoice
    from ._piper import shared_pool as piper_pool

    if isinstance(voice, PiperVoice):
        piper_pool(voice)


@attrs.frozen
class SpeechFactory:
    """``serve --engine speech``'s factory: the model and the voice chosen once, at
    startup (a missing one is a startup error), every session's engine built on them."""

    model: ModelChoice
    voice: Voice
    recognisers: int | None = None  # the pool's processes (None: one per core)

    @classmethod
    def choose(
        cls, model: str | None, voice: str | None, recognisers: int | None = None
    ) -> SpeechFactory:
        """SpeechUnavailable (saying what to install) if a part is missing."""
        chosen_model, chosen_voice = check_available(model, voice)
        return cls(chosen_model, chosen_voice, recognisers)

    def __call__(self, config: Mapping[str, Any]) -> SpeechEngine:
        return SpeechEngine(
            config, model=self.model, voice=self.voice, recognisers=self.recognisers
        )

    default_max_sessions = staticmethod(default_max_sessions)

    def warm(self) -> None:
        """The server's start (DuplexServer.run): the recogniser pool and the voice's
        processes start loading now (1-4 s), so that the first session's first turn
        neither waits for them nor goes without partial transcripts."""
        shared_pool(self.model, self.recognisers)
        _warm(self.voice)

    def describe(self) -> str:
        """For the startup log: what the engine hears and speaks with."""
        model = self.model
        where = "" if model.packaged or not model.is_path else " (a directory)"
        if not model.is_path:
            where = " (a faster-whisper model name: fetched by the workers if not cached)"
        size = self.recognisers or cores()
        return (
            f"speech: model {model.name}{where}, voice {self.voice.name}, "
            f"{size} recogniser process{'es' if size > 1 else ''}"
        )


__all__ = ["MAX_CLAUSE_CHARS", "Responder", "SpeechEngine", "SpeechFactory", "say_back"]
