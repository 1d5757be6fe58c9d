"""The speech engine's answering half: a turn's transcript through the responder, its
reply cut into clauses, each synthesised by the engine's voice as soon as it is whole and
played in real time (or written, for a text reply). docs/speech.md, "Answering"."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Final

import attrs
import trio

from ..api import EngineSession
from ..conversation import conversing, created
from ..turns import send_end, send_live, speak_unless_cancelled
from ._capacity import SAMPLE_RATE
from ._snapshot import Asked
from ._synthesise import SynthesisError, Voice, clauses
from ._talk import Talk

log = logging.getLogger("trio_duplex.engines.speech")

Responder = Callable[[str], AsyncIterator[str]]
"""Takes a turn's final transcript ("" if nothing was recognised) and yields the reply,
in pieces of any size (an LLM's tokens); each clause is spoken as soon as it is whole."""

FRAME_BYTES: Final = SAMPLE_RATE * 2 // 50  # 20 ms of 16 kHz PCM16
FRAME_SECONDS: Final = 0.02


async def say_back(transcript: str) -> AsyncIterator[str]:
    """The default responder: says back what it heard."""
    words = transcript.strip()
    if not words:
        yield "sorry, I did not catch that."
    else:  # (Whisper's transcript has its own full stop, or question mark)
        yield f"you said: {words}" + ("" if words[-1] in ".!?" else ".")


@attrs.define(eq=False)
class Response:
    """The response being spoken. A restored one that was created and not finished is
    ended cancelled: its responder (a generator, maybe a remote call) cannot move."""

    response_id: str
    transcript: str
    created: bool = False
    cancelled: bool = False
    finished: bool = False  # played whole (or cancelled): only its end is left to send
    cancel_reason: str | None = None  # turn_detected: a barge-in (not the client's cancel)
    said: list[str] = attrs.Factory(list)  # the text deltas sent, in order
    spoken_at: list[int] = attrs.Factory(list)
    """Each spoken clause of ``said``'s first audio frame's ``server_event_seq`` (0: none
    yet); not kept by a snapshot (a restored response is ended as it was)."""
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    metadata: dict[str, str] | None = None  # its response.create's, for response.created
    modalities: tuple[str] | None = None  # its response.create's own; None: the session's


def response(response_id: str, turn: str | Asked) -> Response:
    if isinstance(turn, str):
        return Response(response_id, turn)
    return Response(response_id, turn.transcript, metadata=turn.metadata,
                    modalities=turn.modalities)  # fmt: skip


def heard(response: Response, delivered_seq: int) -> list[str]:
    """What of a response the client is known to have heard: all of it, unless it was
    cancelled while the client acknowledges what it played (a phone call's marks: its
    ``delivered_seq`` moved), then the clauses whose first audio frame it confirmed (a
    clause it began hearing counts whole; one never spoken counts as not heard). A
    restored response (no ``spoken_at``) keeps all it said."""
    spoken_at = response.spoken_at
    if not response.cancelled or delivered_seq == 0 or len(spoken_at) != len(response.said):
        return response.said
    return [
        text for text, seq in zip(response.said, spoken_at, strict=True) if 0 < seq <= delivered_seq
    ]


@attrs.define(eq=False)
class Answerer:
    responder: Responder
    voice: Voice
    history: deque[dict[str, str]]
    responder_timeout_s: float
    max_reply_chars: int
    talk: Callable[[], Talk]  # the engine's (a restore replaces it)
    config: Mapping[str, Any] = attrs.Factory(dict)  # the session's (live)

    async def respond(self, session: EngineSession, response: Response) -> None:
        response_id = response.response_id
        conversing_ = conversing(self.config)
        # ["text"] (the response.create's own, else a conversing session's): the reply
        # is written, not spoken.
        modalities = self.config.get("output_modalities")
        modalities = ["text"] if conversing_ and modalities == ["text"] else ["audio"]
        if response.modalities is not None:
            modalities = list(response.modalities)
        if not response.created:
            if conversing_:  # (["audio"]: the text deltas are the audio's transcript)
                self.talk().conversation.begin_response(response_id)
            named = modalities if conversing_ or response.modalities is not None else None
            await session.send(created(response_id, named, response.metadata))
            response.created = True
            answer = self._play if modalities == ["audio"] else self._write
            await speak_unless_cancelled(response, functools.partial(answer, session, response))
            # No checkpoint since the scope closed: a later cancel cannot reach this one.
            response.finished = True
        elif not response.finished:  # restored mid-reply: responder and audio left behind
            response.cancelled = True
            response.finished = True
        said = "".join(heard(response, session.delivered_seq())).strip()
        self.history.append({"role": "assistant", "text": said})
        if conversing_:
            status = "incomplete" if response.cancelled else "completed"
            self.talk().conversation.end_response(response_id, said, modalities, status)
        await send_end(session, response)

    async def _play(self, session: EngineSession, response: Response) -> None:
        send, receive = trio.open_memory_channel[tuple[str, bytes]](1)  # a clause ahead
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._synthesise, response.transcript, send)
            start = trio.current_time()
            index = 0  # frames sent
            async with receive:
                async for clause, pcm in receive:
                    now = trio.current_time()
                    if start + index * FRAME_SECONDS < now:  # synthesis fell behind
                        start = now - index * FRAME_SECONDS
                    await self._text(session, response, clause)
                    clause_index = len(response.said) - 1
                    for at in range(0, len(pcm), FRAME_BYTES):
                        await trio.sleep_until(start + index * FRAME_SECONDS)
                        await send_live(
                            session,
                            {"type": "response.output_audio.delta",
                             "response_id": response.response_id,
                             "audio": pcm[at : at + FRAME_BYTES]},
                        )  # fmt: skip
                        if at == 0:
                            response.spoken_at[clause_index] = session.sent_seq()
                        index += 1
            # Done when the last frame has played, not when it was sent.
            await trio.sleep_until(start + index * FRAME_SECONDS)

    async def _write(self, session: EngineSession, response: Response) -> None:
        """A text-only reply: the responder's clauses as text deltas, as they come."""
        async with contextlib.aclosing(self._clauses(response.transcript)) as reply:
            async for clause in reply:
                await self._text(session, response, clause)

    async def _text(self, session: EngineSession, response: Response, clause: str) -> None:
        text = clause if not response.said else " " + clause
        await send_live(
            session,
            {"type": "response.output_text.delta", "response_id": response.response_id,
             "text": text},
        )  # fmt: skip
        response.said.append(text)
        response.spoken_at.append(0)

    async def _synthesise(
        self, transcript: str, send: trio.MemorySendChannel[tuple[str, bytes]]
    ) -> None:
        # aclosing: a cancelled response closes the responder's generator now, not at GC.
        async with send, contextlib.aclosing(self._clauses(transcript)) as reply:
            async for clause in reply:
                try:
                    pcm = await self.voice.synthesise(clause)
                except SynthesisError as exc:
                    # Decision: a clause the voice cannot say loses its audio, not the
                    # reply nor the session: its text still goes out, the next clause is
                    # spoken. One line in the log, no traceback (the voice's reason).
                    log.warning("speech: %s could not say a clause: %s", self.voice.name, exc)
                    pcm = b""
                pcm += bytes(-len(pcm) % FRAME_BYTES)  # whole 20 ms frames (the tail: silence)
                await send.send((clause, pcm))

    async def _clauses(self, transcript: str) -> AsyncGenerator[str, None]:
        """The reply's clauses, each as soon as it is whole, spaces made single."""
        async with contextlib.aclosing(self._reply(transcript)) as reply:
            pending = ""
            async for piece in reply:
                ready, pending = clauses(pending + piece)
                for clause in ready:
                    yield " ".join(clause.split())
            ready, rest = clauses(pending)
            for clause in [*ready, rest] if rest.strip() else ready:
                yield " ".join(clause.split())

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
