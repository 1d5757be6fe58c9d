"""``SpeechEngine``: listens with PocketSphinx, answers through a responder, speaks with
eSpeak NG. docs/speech.md is its guide; the module docstring of the package lists its
events and decisions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, ClassVar, Final

import attrs
import trio

from ..api import BadEvent, Engine, EngineSession, Event
from ..conversation import (
    EVENTS,
    RESPONSE_EVENTS,
    check_response_event,
    conversing,
    created,
    response_metadata,
    response_modalities,
)
from ..turns import Turns, send_end, send_live, speak_unless_cancelled
from ._capacity import check_available, default_max_sessions, shared_limiter
from ._recognise import BYTES_PER_SECOND, SAMPLE_RATE, Heard, Hearing
from ._remote import RemoteRecogniser
from ._snapshot import Asked, Speaking, State
from ._synthesise import MAX_CLAUSE_CHARS, clauses, synthesise
from ._talk import Talk, answers_turns, detects_turns

log = logging.getLogger("trio_duplex.engines.speech")

Responder = Callable[[str], AsyncIterator[str]]
"""Takes a turn's final transcript ("" if nothing was recognised) and yields the reply,
in pieces of any size (an LLM's tokens); each clause is spoken as soon as it is whole."""


async def say_back(transcript: str) -> AsyncIterator[str]:
    """The default responder: says back what it heard."""
    words = transcript.strip()
    yield f"you said: {words}." if words else "sorry, I did not catch that."


FRAME_BYTES: Final = SAMPLE_RATE * 2 // 50  # 20 ms of 16 kHz PCM16
FRAME_SECONDS: Final = 0.02
CHUNK_BYTES: Final = BYTES_PER_SECOND // 2  # the most audio one recogniser call takes
KEEP_BYTES: Final = BYTES_PER_SECOND // 2  # audio kept before a turn, for a migration
FIRM_GUESSES: Final = 3  # a word is firm once this many partial guesses agree on it
MAX_QUEUED: Final = 4  # turns waiting for their response
MAX_TYPED_CHARS: Final = 2000  # a typed turn (input.text.append)


@attrs.define(eq=False)
class _Response:
    """The response being spoken. A restored one that was created and not finished is
    ended cancelled: its responder (a generator, maybe a remote call) cannot move."""

    response_id: str
    transcript: str
    created: bool = False
    cancelled: bool = False
    finished: bool = False  # played whole (or cancelled): only its end is left to send
    said: list[str] = attrs.Factory(list)  # the text deltas sent, in order
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    metadata: dict[str, str] | None = None  # its response.create's, for response.created
    modalities: tuple[str] | None = None  # its response.create's own; None: the session's


def _response(response_id: str, turn: str | Asked) -> _Response:
    if isinstance(turn, str):
        return _Response(response_id, turn)
    return _Response(response_id, turn.transcript, metadata=turn.metadata,
                     modalities=turn.modalities)  # fmt: skip


class SpeechEngine(Engine):
    """Hears 16 kHz PCM16, answers each turn with ``responder``'s text, spoken."""

    accepts = frozenset(
        {"input_audio_buffer.append", "input.text.append", *EVENTS, *RESPONSE_EVENTS}
    )
    audio_rate: int | None = SAMPLE_RATE
    turn_detection: ClassVar[Mapping[str, Any] | None] = {
        "type": "server_vad",
        "create_response": True,
        "interrupt_response": True,
    }
    """Its endpointer ends turns, answers them and cancels a reply spoken over (unless
    the session's ``turn_detection`` is null, or its ``create_response`` false)."""

    default_max_sessions = staticmethod(default_max_sessions)
    """``serve --engine speech`` takes its ``--max-sessions`` default from here."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        responder: Responder = say_back,
        voice: str = "en-us",
        words_per_minute: int = 160,
        max_buffered_s: float = 10.0,
        max_turn_s: float = 20.0,
        responder_timeout_s: float = 30.0,
        max_reply_chars: int = 2000,
        max_history: int = 64,
    ) -> None:
        check_available()
        if not (max_buffered_s > 0 and max_turn_s > 0 and responder_timeout_s > 0):
            raise ValueError("max_buffered_s, max_turn_s and responder_timeout_s must be > 0")
        self.config = dict(config or {})
        self.responder = responder
        self.voice = voice
        self.words_per_minute = words_per_minute
        self.max_buffered_bytes = int(max_buffered_s * BYTES_PER_SECOND)
        self.max_turn_bytes = int(max_turn_s * BYTES_PER_SECOND)
        self.responder_timeout_s = responder_timeout_s
        self.max_reply_chars = max_reply_chars
        self.history: deque[dict[str, str]] = deque(maxlen=max_history)
        """The conversation so far: ``{"role": "user" | "assistant", "text"}``."""
        self._buffer = bytearray()  # audio taken from input, not yet recognised
        self._replay = bytearray()  # recognised since the last quiet point (migration)
        self._replay_at = 0  # the recogniser's offset of _replay[0]
        self._base_ms = 0.0  # session audio before the recogniser's offset 0
        self._turn_started = False  # speech_started sent for the turn going on
        self._turn_words: list[str] = []  # its words sent as transcript deltas
        self._last_guesses: deque[list[str]] = deque(maxlen=FIRM_GUESSES)
        # Turns' transcripts awaiting a response, and the one speaking.
        self._turns = Turns[str | Asked, _Response](_response)
        self._audio_in = trio.lowlevel.ParkingLot()
        self._heard_all = trio.lowlevel.ParkingLot()  # woken once the buffer is all heard
        self._hearing = False  # the listener has audio out of the buffer, not yet heard
        self._talk = Talk()  # the conversation's items, and the words kept for a commit
        self._session_config: Mapping[str, Any] = self.config

    def check(self, event: Event) -> None:
        kind = event["type"]
        if kind == "input.text.append":
            text = event.get("text")
            if not isinstance(text, str):
                raise BadEvent("text must be a string", param="text")
            if len(text) > MAX_TYPED_CHARS:  # it goes into the history and the snapshot
                raise BadEvent(f"text is over {MAX_TYPED_CHARS} characters", param="text")
        elif kind in RESPONSE_EVENTS:
            check_response_event(event)
        else:
            self._talk.conversation.check(event)

    # -- the reader ------------------------------------------------------------------

    async def run(self, session: EngineSession) -> None:
        limiter = shared_limiter()
        # The recogniser runs in a process of its own (pocketsphinx holds the GIL: in a
        # thread it would stop every session's frames); loading its model takes ~0.5 s.
        recogniser = await RemoteRecogniser.start(self.max_turn_bytes)
        try:
            await self._run(session, recogniser, limiter)
        finally:
            await recogniser.aclose()  # shielded: the process is always reaped

    async def _run(
        self,
        session: EngineSession,
        recogniser: RemoteRecogniser,
        limiter: trio.CapacityLimiter,
    ) -> None:
        self._session_config = session.config  # (live: session.update changes it)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                self._turns.speak, functools.partial(self._respond, session, limiter=limiter)
            )
            nursery.start_soon(self._listen, session, recogniser, limiter)
            await self._talk.flush(session)  # (restored: answers the last node had not sent)
            await self._turns.read(session, functools.partial(self._take, session), self._full)
            self._audio_in.unpark_all()

    def _full(self) -> bool:
        # The recogniser is behind, or turns wait: read no more input, so the server
        # answers the client's next audio with input_backpressure.
        return len(self._buffer) >= self.max_buffered_bytes or len(self._turns.queued) > MAX_QUEUED

    async def _take(self, session: EngineSession, event: Event) -> None:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            self._buffer += event["audio"]
            self._talk.conversation.append_audio(event["audio"])
            self._audio_in.unpark_all()
        elif kind == "input.text.append":  # a typed turn: answered like a spoken one
            self._turns.cancel(None)
            self._queue_turn(event["text"])
        elif kind == "response.cancel":
            self._turns.cancel(event.get("response_id"))
        elif kind == "response.create":  # the latest user message, answered
            turn = self._talk.conversation.latest_user()
            text = "" if turn is None else turn.text
            self._queue_turn(text, response_metadata(event), response_modalities(event))
        elif kind == "input_audio_buffer.commit":
            while (self._buffer or self._hearing) and not self._turns.input_ended:
                await self._heard_all.park()  # the recogniser hears all of it first
            self._talk.commit(self._turn_started)
            await self._talk.flush(session)
        else:
            if kind == "input_audio_buffer.clear":
                self._buffer.clear()  # (not yet heard: never will be)
            self._talk.take(event, self._turn_started)
            await self._talk.flush(session)

    def _queue_turn(
        self,
        transcript: str,
        metadata: dict[str, str] | None = None,
        modalities: tuple[str] | None = None,
    ) -> None:
        self.history.append({"role": "user", "text": transcript})
        plain = metadata is None and modalities is None
        self._turns.put(transcript if plain else Asked(transcript, metadata, modalities))

    # -- listening -------------------------------------------------------------------

    async def _listen(
        self,
        session: EngineSession,
        recogniser: RemoteRecogniser,
        limiter: trio.CapacityLimiter,
    ) -> None:
        while True:
            if not self._buffer:
                if self._turns.input_ended:
                    return
                await self._audio_in.park()
                continue
            await self._announce(session)  # (restored: what the last node had not sent)
            chunk = bytes(self._buffer[:CHUNK_BYTES])
            self._hearing = True
            # The limiter holds the processes computing at once to the cores. A cancel
            # here ends the session: its recogniser (its state mid-request) goes with it.
            async with limiter:
                heard = await recogniser.feed(chunk)
            del self._buffer[: len(chunk)]
            self._replay += chunk
            self._turns.make_room()
            for hearing in heard:
                await self._hear(session, hearing)
            self._hearing = False
            self._heard_all.unpark_all()
            if not recogniser.in_turn:  # quiet: keep only what a new turn may start in
                self._trim(recogniser.fed - KEEP_BYTES)

    async def _hear(self, session: EngineSession, hearing: Hearing) -> None:
        conversing_ = conversing(self._session_config)
        if (conversing_ and not detects_turns(self._session_config)) or self._talk.skip_turn:
            self._hear_only(hearing)  # turns are the client's commits
            return
        if hearing.kind is Heard.STARTED:
            if self._turn_started:  # restored mid-turn: this turn was announced
                return
            self._turns.cancel(None)  # barge-in: the user speaks over the response
            start_ms = self._base_ms + hearing.start_s * 1000
            started: Event = {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": round(start_ms),
            }
            if conversing_:
                started["item_id"] = self._talk.start_turn()
            await session.send(started)
            self._turn_started = True
        elif hearing.kind is Heard.PARTIAL:
            self._talk.partial = hearing.text
            delta = self._firm_delta(hearing.text.split())
            if delta:
                heard: Event = {"type": "input_audio.transcript.delta", "text": delta}
                if self._talk.turn_item is not None:
                    heard["item_id"] = self._talk.turn_item
                await session.send(heard)
                self._turn_words += delta.split()
        elif conversing_:
            await self._turns.wait_room(self._no_room_for_turn)  # its response must have room
            await self._end_turn(session, hearing)
        else:
            await self._turns.wait_room(self._no_room_for_turn)  # its response must have room
            self._turns.cancel(None)
            await session.send({"type": "input_audio.transcript.done", "text": hearing.text})
            self._turn_started = False
            self._turn_words = []
            self._last_guesses.clear()
            self._trim(hearing.offset)
            self._queue_turn(hearing.text)

    def _hear_only(self, hearing: Hearing) -> None:
        """No turn detection (or a turn the client committed): words are kept for the
        client's commit, nothing is announced."""
        if hearing.kind is Heard.STARTED:
            self._turn_started = True
            return
        done = hearing.kind is Heard.DONE
        self._talk.hear(hearing.text, done)
        if done:
            self._turn_started = False
            self._trim(hearing.offset)

    async def _end_turn(self, session: EngineSession, hearing: Hearing) -> None:
        """A turn detected has ended: it is committed, its transcript done, answered."""
        self._turns.cancel(None)
        end_ms = self._base_ms + hearing.offset * 1000 / BYTES_PER_SECOND
        self._talk.announcing += self._talk.end_turn(hearing.text, end_ms)
        self._turn_started = False
        self._turn_words = []
        self._last_guesses.clear()
        self._trim(hearing.offset)
        if answers_turns(self._session_config):
            self._talk.then_answer = hearing.text  # once announced (a snapshot keeps it)
        else:
            self.history.append({"role": "user", "text": hearing.text})
        await self._announce(session)

    async def _announce(self, session: EngineSession) -> None:
        """Send the turn's announcement, then queue its answer: in that order, wherever a
        migration stop lands (the next node sends the rest, then queues it)."""
        await self._talk.announce(session)
        if self._talk.then_answer is not None:
            self._queue_turn(self._talk.then_answer)
            self._talk.then_answer = None

    def _no_room_for_turn(self) -> bool:
        return len(self._turns.queued) >= MAX_QUEUED

    def _firm_delta(self, guess: list[str]) -> str:
        """The words that firmed up: the same in the last ``FIRM_GUESSES`` guesses (200 ms
        apart), and not the guess's last word (still forming); "" if none, or if they
        contradict the words already sent. These are the decoder's first pass: the done
        event's text, from its final pass, may differ from them."""
        self._last_guesses.append(guess[:-1])
        if len(self._last_guesses) < FIRM_GUESSES:
            return ""
        firm: list[str] = []
        for same in zip(*self._last_guesses, strict=False):
            if any(word != same[0] for word in same):
                break
            firm.append(same[0])
        sent = self._turn_words
        if len(firm) <= len(sent) or firm[: len(sent)] != sent:
            return ""
        new = " ".join(firm[len(sent) :])
        return f" {new}" if sent else new

    def _trim(self, offset: int) -> None:
        drop = min(offset - self._replay_at, len(self._replay))
        if drop > 0:
            del self._replay[:drop]
            self._replay_at += drop

    # -- answering -------------------------------------------------------------------

    async def _respond(
        self, session: EngineSession, response: _Response, *, limiter: trio.CapacityLimiter
    ) -> None:
        response_id = response.response_id
        conversing_ = conversing(self._session_config)
        # ["text"] (the response.create's own, else a conversing session's): the reply
        # is written, not spoken.
        modalities = self._session_config.get("output_modalities")
        modalities = ["text"] if conversing_ and modalities == ["text"] else ["audio"]
        if response.modalities is not None:
            modalities = list(response.modalities)
        if not response.created:
            if conversing_:  # (["audio"]: the text deltas are the audio's transcript)
                self._talk.conversation.begin_response(response_id)
            named = modalities if conversing_ or response.modalities is not None else None
            await session.send(created(response_id, named, response.metadata))
            response.created = True
            answer = self._play if modalities == ["audio"] else self._write
            await speak_unless_cancelled(
                response, functools.partial(answer, session, response, limiter)
            )
            # No checkpoint since the scope closed: a later cancel cannot reach this one.
            response.finished = True
        elif not response.finished:  # restored mid-reply: responder and audio left behind
            response.cancelled = True
            response.finished = True
        said = "".join(response.said).strip()
        self.history.append({"role": "assistant", "text": said})
        if conversing_:
            status = "incomplete" if response.cancelled else "completed"
            self._talk.conversation.end_response(response_id, said, modalities, status)
        await send_end(session, response)

    async def _play(
        self, session: EngineSession, response: _Response, limiter: trio.CapacityLimiter
    ) -> None:
        send, receive = trio.open_memory_channel[tuple[str, bytes]](1)  # a clause ahead
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._synthesise, response.transcript, send, limiter)
            start = trio.current_time()
            index = 0  # frames sent
            async with receive:
                async for clause, pcm in receive:
                    now = trio.current_time()
                    if start + index * FRAME_SECONDS < now:  # synthesis fell behind
                        start = now - index * FRAME_SECONDS
                    text = clause if not response.said else " " + clause
                    await send_live(
                        session,
                        {"type": "response.output_text.delta", "response_id": response.response_id,
                         "text": text},
                    )  # fmt: skip
                    response.said.append(text)
                    for at in range(0, len(pcm), FRAME_BYTES):
                        await trio.sleep_until(start + index * FRAME_SECONDS)
                        await send_live(
                            session,
                            {"type": "response.output_audio.delta",
                             "response_id": response.response_id,
                             "audio": pcm[at : at + FRAME_BYTES]},
                        )  # fmt: skip
                        index += 1
            # Done when the last frame has played, not when it was sent.
            await trio.sleep_until(start + index * FRAME_SECONDS)

    async def _write(
        self, session: EngineSession, response: _Response, limiter: trio.CapacityLimiter
    ) -> None:
        """A text-only reply: the responder's clauses as text deltas, as they come."""
        del limiter  # (nothing to synthesise)
        async with contextlib.aclosing(self._reply(response.transcript)) as reply:
            pending = ""
            async for piece in reply:
                ready, pending = clauses(pending + piece)
                for clause in ready:
                    await self._write_clause(session, response, clause)
            ready, rest = clauses(pending)
            for clause in [*ready, rest] if rest.strip() else ready:
                await self._write_clause(session, response, clause)

    async def _write_clause(self, session: EngineSession, response: _Response, clause: str) -> None:
        clause = " ".join(clause.split())
        text = clause if not response.said else " " + clause
        await send_live(
            session,
            {"type": "response.output_text.delta", "response_id": response.response_id,
             "text": text},
        )  # fmt: skip
        response.said.append(text)

    async def _synthesise(
        self,
        transcript: str,
        send: trio.MemorySendChannel[tuple[str, bytes]],
        limiter: trio.CapacityLimiter,
    ) -> None:
        # aclosing: a cancelled response closes the responder's generator now, not at GC.
        async with send, contextlib.aclosing(self._reply(transcript)) as reply:
            pending = ""
            async for piece in reply:
                pending += piece
                ready, pending = clauses(pending)
                for clause in ready:
                    await self._say(clause, send, limiter)
            ready, rest = clauses(pending)
            for clause in [*ready, rest] if rest.strip() else ready:
                await self._say(clause, send, limiter)

    async def _say(
        self,
        clause: str,
        send: trio.MemorySendChannel[tuple[str, bytes]],
        limiter: trio.CapacityLimiter,
    ) -> None:
        clause = " ".join(clause.split())
        pcm = await synthesise(clause, self.voice, self.words_per_minute, limiter)
        pcm += bytes(-len(pcm) % FRAME_BYTES)  # whole 20 ms frames: the tail padded with silence
        await send.send((clause, pcm))

    async def _reply(self, transcript: str) -> AsyncGenerator[str, None]:
        """The responder's pieces, each within ``responder_timeout_s``, up to
        ``max_reply_chars`` in all (the rest is not asked for)."""
        pieces = self.responder(transcript)
        left = self.max_reply_chars
        try:
            while left > 0:
                with trio.fail_after(self.responder_timeout_s):
                    try:
                        piece = await pieces.__anext__()
                    except StopAsyncIteration:
                        return
                if not isinstance(piece, str):
                    raise TypeError(f"the responder yielded {type(piece).__name__}, not str")
                yield piece[:left]
                left -= len(piece)
            log.info("reply cut at %d characters", self.max_reply_chars)
        finally:
            aclose = getattr(pieces, "aclose", None)
            if aclose is not None:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await aclose()

    # -- migration -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        speaking = self._turns.speaking
        return State(
            # From the last quiet point, and what is not recognised yet: heard again.
            bytes(self._replay) + bytes(self._buffer),
            self._base_ms + self._replay_at * 1000 / BYTES_PER_SECOND,
            self._turn_started,
            tuple(self._turn_words),
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
            self._talk.state(),
        ).write()

    def restore(self, state: bytes | dict[str, Any]) -> None:
        got = State.read(state)  # all checked before anything is taken
        talk = Talk.read(got.talk)  # (checked too, before anything is taken)
        speaking = got.speaking
        if speaking is not None:
            self._turns.speaking = _Response(
                speaking.response_id,
                speaking.transcript,
                speaking.created,
                speaking.cancelled,
                speaking.finished,
                said=[*speaking.said],
                metadata=speaking.metadata,
                modalities=speaking.modalities,
            )
        self._buffer = bytearray(got.audio)
        self._base_ms = got.audio_at_ms
        self._turn_started = got.turn_started
        self._turn_words = list(got.turn_words)
        self.history.extend(got.history)
        self._turns.queued = deque(got.queued)
        self._turns.responses = got.responses
        self._talk = talk


__all__ = ["MAX_CLAUSE_CHARS", "Responder", "SpeechEngine", "say_back"]
