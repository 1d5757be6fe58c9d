"""The speech engine's snapshot (migration between cluster nodes), as JSON and back.

``State.read`` checks a whole snapshot before the engine takes any of it: a restore
either takes all of it or raises ValueError and changes nothing.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Final

import attrs

from ..conversation import restored_metadata

VERSION: Final = "speech/2"  # the shape of the snapshot; a restore takes this and speech/1
OLD_VERSION: Final = "speech/1"  # (no conversation: restored with an empty one)


@attrs.frozen
class Asked:
    """A turn queued by a ``response.create`` that had ``metadata`` (its
    ``response.created`` carries it back) or ``output_modalities`` of its own (its
    response's, instead of the session's); a turn without is its transcript alone."""

    transcript: str
    metadata: dict[str, str] | None
    modalities: tuple[str] | None = None  # ("text",) or ("audio",); None: the session's

    def write(self) -> dict[str, Any]:
        metadata = None if self.metadata is None else dict(self.metadata)
        written: dict[str, Any] = {"transcript": self.transcript, "metadata": metadata}
        if self.modalities is not None:  # (absent: as the snapshots before it had none)
            written["modalities"] = list(self.modalities)
        return written


@attrs.frozen
class Speaking:
    """The response being spoken: its id, the transcript it answers, whether
    ``response.created`` was sent, whether only its end was left, whether it was
    cancelled, and the text deltas sent."""

    response_id: str
    transcript: str
    created: bool
    finished: bool  # played whole or cancelled: only its end was left to send
    cancelled: bool
    said: tuple[str, ...]
    metadata: dict[str, str] | None = None  # its response.create's (absent before speech/2 had it)
    modalities: tuple[str] | None = None  # its response.create's own (absent: the session's)

    def write(self) -> dict[str, Any]:
        written = attrs.asdict(self) | {"said": list(self.said)}
        if self.modalities is None:  # (absent: as the snapshots before it had none)
            del written["modalities"]
        else:
            written["modalities"] = list(self.modalities)
        return written


@attrs.frozen
class State:
    audio: bytes  # to be heard again: from the last quiet point, and not yet recognised
    audio_at_ms: float  # where ``audio`` starts in the session's input audio
    turn_started: bool  # speech_started was sent for the turn going on
    turn_words: tuple[str, ...]  # its words sent as transcript deltas
    history: tuple[dict[str, str], ...]
    queued: tuple[str | Asked, ...]  # transcripts awaiting their response
    responses: int  # responses created so far (their ids: resp_1, resp_2, ...)
    speaking: Speaking | None
    talk: dict[str, Any] | None = None
    """The conversation's part (speech/2): ``conversation`` (its snapshot), ``outbox``
    (answers not yet sent), ``turn_item``, ``heard``, ``partial``, ``skip_turn``; checked
    by the engine's restore."""

    def write(self) -> dict[str, Any]:
        speaking = self.speaking
        return {
            "state": VERSION,
            "audio": base64.b64encode(self.audio).decode(),
            "audio_at_ms": self.audio_at_ms,
            "turn_started": self.turn_started,
            "turn_words": list(self.turn_words),
            "history": [dict(entry) for entry in self.history],
            "queued": [turn if isinstance(turn, str) else turn.write() for turn in self.queued],
            "responses": self.responses,
            "speaking": None if speaking is None else speaking.write(),
            "talk": self.talk,
        }  # fmt: skip

    @classmethod
    def read(cls, state: object) -> State:
        if not isinstance(state, dict) or state.get("state") not in (VERSION, OLD_VERSION):
            raise ValueError(f"not a snapshot of the speech engine ({VERSION})")
        try:
            audio = base64.b64decode(_get(state, "audio", str), validate=True)
        except binascii.Error:
            raise ValueError("speech snapshot: 'audio' is not base64") from None
        at_ms = _get(state, "audio_at_ms", float | int)
        if not math.isfinite(at_ms) or at_ms < 0:
            raise ValueError("speech snapshot: 'audio_at_ms' is not a time")
        history = _get(state, "history", list)
        if not all(
            isinstance(h, dict) and set(h) == {"role", "text"}
            and h["role"] in ("user", "assistant") and isinstance(h["text"], str)
            for h in history
        ):  # fmt: skip
            raise ValueError("speech snapshot: 'history' is not a conversation")
        return cls(
            audio,
            float(at_ms),
            _get(state, "turn_started", bool),
            _texts(state, "turn_words"),
            tuple(history),
            _queued(state),
            _get(state, "responses", int),
            _speaking(state.get("speaking")),
            None if state["state"] == OLD_VERSION else _get(state, "talk", dict),
        )


def _speaking(value: object) -> Speaking | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("speech snapshot: 'speaking' is not a response")
    return Speaking(
        _get(value, "response_id", str),
        _get(value, "transcript", str),
        _get(value, "created", bool),
        _get(value, "finished", bool),
        _get(value, "cancelled", bool),
        _texts(value, "said"),
        restored_metadata(value.get("metadata")),
        _modalities(value.get("modalities")),
    )


def _modalities(value: object) -> tuple[str] | None:
    """A response's own ``output_modalities`` (absent from older snapshots: None)."""
    if value is None:
        return None
    if value == ["text"] or value == ["audio"]:
        assert isinstance(value, list)
        return (value[0],)
    raise ValueError("speech snapshot: a response's modalities are not [text] or [audio]")


def _queued(state: dict[str, Any]) -> tuple[str | Asked, ...]:
    turns: list[str | Asked] = []
    for turn in _get(state, "queued", list):
        if isinstance(turn, str):
            turns.append(turn)
        elif isinstance(turn, dict) and set(turn) - {"modalities"} == {"transcript", "metadata"}:
            metadata = restored_metadata(turn["metadata"])
            modalities = _modalities(turn.get("modalities"))
            if not isinstance(turn["transcript"], str) or (metadata is None and modalities is None):
                raise ValueError("speech snapshot: a queued turn is malformed")
            turns.append(Asked(turn["transcript"], metadata, modalities))
        else:
            raise ValueError("speech snapshot: 'queued' must hold turns")
    return tuple(turns)


def _texts(state: dict[str, Any], key: str) -> tuple[str, ...]:
    value = _get(state, key, list)
    if not all(isinstance(text, str) for text in value):
        raise ValueError(f"speech snapshot: {key!r} must hold texts")
    return tuple(value)


def _get(state: dict[str, Any], key: str, kind: Any) -> Any:
    value = state.get(key)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ValueError(f"speech snapshot: {key!r} is missing or has the wrong type")
    return value
