"""The speech engine's part in the conversation (docs/engines.md, "The conversation"):
its items, the words heard for a client's commit, and the answers not yet sent.

With turn detection (``turn_detection`` absent or an object), the engine's turn detector
ends turns; in a conversing session each is announced as an item (``Talk.stop_turn``,
then ``Talk.transcribed`` or ``Talk.failed`` once the pool has decoded it).
With ``turn_detection: null`` nothing is announced: the words heard are kept here, and
the client's ``input_audio_buffer.commit`` makes them a turn (``Talk.commit``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs

from ..api import EngineSession, Event
from ..conversation import Conversation, new_item_id


def detects_turns(config: Mapping[str, Any]) -> bool:
    """Server-side turn detection is on (``turn_detection`` not null)."""
    return config.get("turn_detection", {}) is not None


def interrupts(config: Mapping[str, Any]) -> bool:
    """Speech over a reply cancels it (OpenAI's ``interrupt_response``, default true)."""
    detection = config.get("turn_detection")
    return not (isinstance(detection, dict) and detection.get("interrupt_response") is False)


def answers_turns(config: Mapping[str, Any]) -> bool:
    """A detected turn is answered at once (OpenAI's ``create_response``, default true)."""
    detection = config.get("turn_detection")
    return not (isinstance(detection, dict) and detection.get("create_response") is False)


@attrs.define(eq=False)
class Talk:
    conversation: Conversation = attrs.Factory(Conversation)  # (no audio kept: it is heard)
    outbox: deque[Event] = attrs.Factory(deque)  # the reader's answers not yet sequenced
    announcing: deque[Event] = attrs.Factory(deque)  # the listener's, of a turn it ended
    turn_item: str | None = None  # the id of the detected turn going on (conversing)
    heard: list[str] = attrs.Factory(list)  # without turn detection: text since a commit
    partial: str = ""  # the last guess at the turn going on
    skip_turn: bool = False  # the turn going on was committed (or cleared) already
    then_answer: str | None = None  # the transcript to answer once ``announcing`` is sent
    awaiting: str | None = None  # the item of a stopped turn whose transcript is to come

    async def flush(self, session: EngineSession) -> None:
        await _send_all(session, self.outbox)

    async def announce(self, session: EngineSession) -> None:
        await _send_all(session, self.announcing)

    def commit(self, in_turn: bool) -> None:
        """A client's commit: what was heard since the last one is a user turn (a turn
        going on ends here, by its latest guess, and the rest of it is not kept)."""
        words = [*self.heard, self.partial] if in_turn else self.heard
        text = " ".join(w for w in words if w)
        self.heard, self.partial, self.skip_turn = [], "", in_turn
        named, self.turn_item = (self.turn_item if in_turn else None), None
        item_id = self.conversation.commit_audio(item_id=named)  # (speech_started's id)
        if item_id is not None:
            self.outbox += self.conversation.committed_events(item_id, done=False)
            self.outbox += self.conversation.transcribed(item_id, text)

    def take(self, event: Event, in_turn: bool) -> None:
        """Any other conversation event (a clear also forgets what was heard)."""
        if event["type"] == "input_audio_buffer.clear":
            self.heard, self.partial, self.skip_turn = [], "", in_turn
        self.outbox += self.conversation.take(event)

    def hear(self, text: str, done: bool) -> None:
        """Without turn detection (or in a turn committed already): keep the words."""
        if not done:
            self.partial = text
            return
        if not self.skip_turn and text:
            self.heard.append(text)
        self.skip_turn, self.partial = False, ""

    def start_turn(self) -> str:
        self.turn_item = new_item_id()
        return self.turn_item

    def stop_turn(self, end_ms: float) -> list[Event]:
        """A detected turn has ended: ``speech_stopped``, the item committed (its
        transcript to come: ``transcribed`` or ``failed``)."""
        item_id = self.turn_item or new_item_id()
        self.turn_item, self.partial, self.awaiting = None, "", item_id
        stopped = {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": round(end_ms),
                   "item_id": item_id}  # fmt: skip
        self.conversation.clear_audio()
        self.conversation.add(
            {"id": item_id, "type": "message", "role": "user",
             "content": [{"type": "input_audio", "transcript": None}]}
        )  # fmt: skip
        return [stopped, *self.conversation.committed_events(item_id, done=False)]

    def transcribed(self, text: str) -> list[Event]:
        """The stopped turn's transcript: ``transcript.done``, ``item.done``."""
        item_id, self.awaiting = self.awaiting or new_item_id(), None
        return self.conversation.transcribed(item_id, text)

    def failed(self, message: str) -> list[Event]:
        """The stopped turn's transcription failed: ``transcript.failed``, and its item
        done without a transcript."""
        item_id, self.awaiting = self.awaiting or new_item_id(), None
        failed: Event = {
            "type": "input_audio.transcript.failed",
            "item_id": item_id,
            "error": {"type": "transcription_failed", "message": message},
        }
        if item_id not in self.conversation:
            return [failed]
        return [failed, {"type": "conversation.item.done",
                         "item": self.conversation.public(item_id)}]  # fmt: skip

    def state(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation.snapshot(),
            "outbox": list(self.outbox),
            "announcing": list(self.announcing),
            "turn_item": self.turn_item,
            "heard": list(self.heard),
            "partial": self.partial,
            "skip_turn": self.skip_turn,
            "then_answer": self.then_answer,
            "awaiting": self.awaiting,
        }

    @classmethod
    def read(cls, state: dict[str, Any] | None) -> Talk:
        """From ``state()`` (None: a speech/1 snapshot, before the conversation)."""
        if state is None:
            return cls()
        conversation = Conversation()
        conversation.restore(state.get("conversation"))
        outbox, heard = state.get("outbox"), state.get("heard")
        announcing = state.get("announcing")
        turn_item, partial = state.get("turn_item"), state.get("partial")
        skip, then_answer = state.get("skip_turn"), state.get("then_answer")
        awaiting = state.get("awaiting")  # (absent from older snapshots: none)
        if not (
            isinstance(outbox, list)
            and isinstance(announcing, list)
            and all(isinstance(e, dict) for e in [*outbox, *announcing])
            and isinstance(heard, list)
            and all(isinstance(t, str) for t in heard)
            and isinstance(turn_item, str | None)
            and isinstance(partial, str)
            and isinstance(skip, bool)
            and isinstance(then_answer, str | None)
            and isinstance(awaiting, str | None)
        ):
            raise ValueError("speech snapshot: 'talk' is malformed")
        return cls(
            conversation, deque(outbox), deque(announcing), turn_item, heard, partial, skip,
            then_answer, awaiting,
        )  # fmt: skip


async def _send_all(session: EngineSession, events: deque[Event]) -> None:
    # Each leaves the queue once its send returned: a migration stop keeps the rest.
    while events:
        await session.send(events[0])
        events.popleft()
