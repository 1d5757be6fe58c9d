"""The conversation an engine keeps: items, the user's audio buffer, and their events.

Engines see one vocabulary whichever dialect the client speaks (docs/engines.md, "The
conversation"): ``conversation.item.create/retrieve/truncate/delete``,
``input_audio_buffer.append/commit/clear``, ``response.create/cancel``. ``Conversation``
holds the items in OpenAI's shape and answers the item events with the contract's
``conversation.item.*`` events; an engine calls ``check`` from its own ``check`` (an
unknown ``item_id`` is then a ``BadEvent`` the client gets, and the session goes on) and
``take`` from its reader, and sends what ``take`` returns.

Bounded: at most ``max_items`` items and ``max_bytes`` bytes (their JSON and their kept
audio); past either, the oldest items are forgotten (as OpenAI truncates a long
conversation), so an operator's memory does not grow with a session's length. The audio
buffer keeps at most ``max_buffer_bytes`` (the newest) when ``keep_audio``, and counts
every byte either way.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from ..core import conversation as core
from ..core.conversation import assistant_item_id as assistant_item_id  # (re-exported)
from ..core.conversation import new_item_id as new_item_id
from ..core.wire import ProtocolError
from .api import BadEvent, Event

MAX_ITEMS: Final = 256
MAX_BYTES: Final = 4 * 1024 * 1024
MAX_BUFFER_BYTES: Final = 24_000 * 2 * 30  # 30 s of 24 kHz PCM16
MAX_PENDING_IDS: Final = 1024  # ids of creates checked and not yet taken (see ``check``)
VERSION: Final = "conversation/1"  # the shape of the snapshot; a restore refuses any other

ITEM_EVENTS: Final = frozenset(
    {
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
    }
)
BUFFER_EVENTS: Final = frozenset({"input_audio_buffer.commit", "input_audio_buffer.clear"})
EVENTS: Final = ITEM_EVENTS | BUFFER_EVENTS
"""The client events ``take`` answers (``input_audio_buffer.append`` is the engine's: it
calls ``append_audio``)."""
RESPONSE_EVENTS: Final = frozenset({"response.create", "response.cancel"})
_TEXT_PARTS: Final = {"input_text": "text", "output_text": "text", "text": "text"}


def conversing(config: Mapping[str, Any]) -> bool:
    """Does the session speak in turns (OpenAI's way): its configuration names
    ``output_modalities`` or ``turn_detection`` (an OpenAI session's always does)? Then
    ``echo`` buffers audio for a commit rather than echoing each append, and ``speech``
    announces its turns' items. A native session that names neither behaves as before."""
    return "output_modalities" in config or "turn_detection" in config


def output_modalities(config: Mapping[str, Any], event: Event, default: str) -> list[str]:
    """A response's modalities: the ``response.create`` override, else the session's,
    else ``[default]``; an engine that cannot make one ("audio" without a voice) is
    not asked here: it narrows the answer itself. ``["text"]`` or ``["audio"]``."""
    asked = response_modalities(event)
    if asked is not None:
        return list(asked)
    session = config.get("output_modalities")
    if isinstance(session, list) and session and all(m in ("text", "audio") for m in session):
        return ["audio"] if "audio" in session else ["text"]
    return [default]


def response_modalities(event: Event) -> tuple[str] | None:
    """The ``output_modalities`` a ``response.create`` asks for itself (checked by
    ``check_response_event``): ``("audio",)`` if it names audio, ``("text",)`` if text
    only; None when it asks nothing (the session's then hold)."""
    override = event.get("response")
    asked = override.get("output_modalities") if isinstance(override, dict) else None
    if isinstance(asked, list) and asked and all(m in ("text", "audio") for m in asked):
        return ("audio",) if "audio" in asked else ("text",)
    return None


def check_response_event(event: Event) -> None:
    """``response.create {response?}`` / ``response.cancel {response_id?}`` fields."""
    if event["type"] == "response.cancel":
        if not isinstance(event.get("response_id", ""), str):
            raise BadEvent("response_id must be a string", param="response_id")
        return
    response = event.get("response", {})
    if not isinstance(response, dict):
        raise BadEvent("response must be an object", param="response")
    modalities = response.get("output_modalities")
    if modalities is not None and not (
        isinstance(modalities, list) and modalities and set(modalities) <= {"text", "audio"}
    ):
        raise BadEvent(
            'output_modalities must be ["text"] or ["audio"]', param="response.output_modalities"
        )
    metadata = response.get("metadata")
    if metadata is not None and not _metadata_ok(metadata):
        raise BadEvent(
            "metadata must map at most 16 keys of up to 64 characters to strings of up to 512",
            param="response.metadata",
        )


MAX_METADATA_KEYS: Final = 16
"""OpenAI's bounds on a response's ``metadata``: 16 pairs, keys of at most 64
characters, values of at most 512."""


def _metadata_ok(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= MAX_METADATA_KEYS
        and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    )


def response_metadata(event: Event) -> dict[str, str] | None:
    """The ``metadata`` of a ``response.create`` (checked by ``check_response_event``),
    which its ``response.created`` carries back (a client matches its reply by it)."""
    response = event.get("response")
    metadata = response.get("metadata") if isinstance(response, dict) else None
    return dict(metadata) if isinstance(metadata, dict) else None


def created(
    response_id: str, modalities: Iterable[str] | None, metadata: dict[str, str] | None
) -> Event:
    """A response's ``response.created``: its ``output_modalities`` when the engine names
    them, its ``response.create``'s ``metadata`` when it had some."""
    event: Event = {"type": "response.created", "response_id": response_id}
    if modalities is not None:
        event["output_modalities"] = list(modalities)
    if metadata is not None:
        event["metadata"] = dict(metadata)
    return event


def restored_metadata(value: object) -> dict[str, str] | None:
    """A snapshot's ``metadata`` of a response (absent from older snapshots: None);
    ValueError if it is not one ``check_response_event`` would have taken."""
    if value is None:
        return None
    if not _metadata_ok(value):
        raise ValueError("snapshot: a response's metadata is not a map of strings")
    assert isinstance(value, dict)
    return dict(value)


def check_item(item: object) -> None:
    """An item in OpenAI's shape (``core.conversation.check_item``): a message of a known
    role whose content parts are texts or audio, or another item type (stored, never
    answered). Raises BadEvent naming the field."""
    try:
        core.check_item(item)
    except ProtocolError as exc:
        raise BadEvent(exc.message, param=exc.param) from None


def _stored(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the store holds it, in the shape ``check_item`` takes: its parts'
    unset fields (a transcript not yet recognised: None) left out."""
    content = item.get("content")
    if not isinstance(content, list):
        return item
    parts = [{k: v for k, v in p.items() if v is not None} if isinstance(p, dict) else p
             for p in content]  # fmt: skip
    return item | {"content": parts}


def item_text(item: Mapping[str, Any]) -> str:
    """A message's words: its texts and its audio's transcripts, joined by spaces."""
    texts: list[str] = []
    for part in item.get("content", ()):
        key = _TEXT_PARTS.get(part.get("type"), "transcript")
        value = part.get(key)
        if isinstance(value, str) and value:
            texts.append(value)
    return " ".join(texts)


@attrs.frozen
class Turn:
    """The conversation's latest user message: what a ``response.create`` answers."""

    item_id: str
    text: str  # its texts and transcripts ("" for audio not yet recognised)
    audio: bytes | None  # the committed audio it holds, if kept (``keep_audio``)
    typed: bool  # it has a text part: a text turn


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _make_size() -> Callable[[Mapping[str, Any]], int]:
    """``len(json.dumps(item, separators=(",", ":")))``, an item's counted size, without
    the per-call cost: ``json.dumps`` builds a ``JSONEncoder`` and a C encoder (and a
    dict for cycle checks) on every call, most of its time for an item. Built once here:
    the same text, so the same size (an item is decoded JSON or built here: no cycles)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    ascii_string = getattr(json.encoder, "c_encode_basestring_ascii", None)
    if make is None or ascii_string is None:  # (another Python: the plain path)
        return lambda item: len(json.dumps(item, separators=(",", ":")))

    def default(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    # (markers, default, encoder, indent, key and item separators, sort_keys, skipkeys,
    # allow_nan: json.dumps's defaults)
    chunks = make(None, default, ascii_string, None, ":", ",", False, False, True)

    def size(item: Mapping[str, Any]) -> int:
        return len("".join(chunks(item, 0)))

    return size


_size = _make_size()


@attrs.define(eq=False)
class Conversation:
    """The items, in order, and the user's audio buffer; see the module docstring."""

    keep_audio: bool = False
    max_items: int = MAX_ITEMS
    max_bytes: int = MAX_BYTES
    max_buffer_bytes: int = MAX_BUFFER_BYTES
    _items: dict[str, dict[str, Any]] = attrs.Factory(dict)  # by id, oldest first
    _audio: dict[str, bytes] = attrs.Factory(dict)  # committed audio kept, by item id
    _bytes: int = 0
    _sizes: dict[str, int] = attrs.Factory(dict)  # each item's counted size, by id
    buffer: bytearray = attrs.Factory(bytearray)  # audio appended and kept since commit/clear
    buffered: int = 0  # bytes appended since the last commit/clear, kept or not
    _checked_ids: set[str] = attrs.Factory(set)  # ids held, and those of creates checked
    _checked_audio: int = 0  # bytes of appends checked, ever

    # -- checks (the connection's reader, before the event is queued) -----------------

    def check(self, event: Event) -> None:
        """Validate a conversation or buffer event (others pass); raises BadEvent.

        An event it passes may still be refused after it (``input_backpressure``) and
        sent again, so it judges nothing a refusal could make wrong: an item id is known
        once an item holds it or a create of it was checked (one still queued is known to
        the events after it), and stays known until the item goes; a client id is
        refused only if an item holds it; a commit only if no audio was ever appended.
        What it passes and ``take`` then finds gone is answered with nothing."""
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            audio = event.get("audio")
            self._checked_audio += len(audio) if isinstance(audio, bytes | str) else 0
        elif kind == "input_audio_buffer.commit":
            if not self._checked_audio:
                raise BadEvent("the input audio buffer is empty: nothing to commit")
        elif kind == "conversation.item.create":
            item = event.get("item")
            check_item(item)
            assert isinstance(item, dict)
            previous = event.get("previous_item_id")
            if previous is not None and previous != "root" and previous not in self._checked_ids:
                raise BadEvent(
                    f"no item {previous!r} in the conversation", param="previous_item_id"
                )
            item_id = item.get("id")
            if item_id is not None:
                if item_id in self._items:
                    raise BadEvent(
                        f"an item {item_id!r} is already in the conversation", param="item.id"
                    )
                if len(self._checked_ids) >= len(self._items) + MAX_PENDING_IDS:
                    # Creates checked and never taken (refused after their check): forget
                    # them, so that a client's refused creates cannot grow this.
                    self._checked_ids = set(self._items)
                self._checked_ids.add(item_id)
        elif kind in ITEM_EVENTS:
            item_id = event.get("item_id")
            if not isinstance(item_id, str) or item_id not in self._checked_ids:
                raise BadEvent(f"no item {item_id!r} in the conversation", param="item_id")
            if kind == "conversation.item.truncate":
                for key in ("content_index", "audio_end_ms"):
                    value = event.get(key)
                    if type(value) is not int or value < 0:
                        raise BadEvent(f"{key} must be an integer >= 0", param=key)

    # -- answering (the engine's reader) ------------------------------------------------

    def take(self, event: Event) -> list[Event]:
        """Apply one of ``EVENTS`` (checked) and return what answers it, to send in
        order. An event whose item went meanwhile (forgotten past the bounds, or a create
        refused after its check) is answered with nothing."""
        kind = event["type"]
        if kind == "input_audio_buffer.commit":
            item_id = self.commit_audio()
            return [] if item_id is None else self.committed_events(item_id)
        if kind == "input_audio_buffer.clear":
            self.clear_audio()
            return [{"type": "input_audio_buffer.cleared"}]
        if kind == "conversation.item.create":
            item_id = self.add(dict(event["item"]))
            after = event.get("previous_item_id")
            if after == "root" or after in self._items:
                self._move_after(item_id, None if after == "root" else after)
            previous = self._previous(item_id)
            added: Event = {"type": "conversation.item.added", "item": self.public(item_id)}
            if previous is not None:
                added["previous_item_id"] = previous
            return [added, {"type": "conversation.item.done", "item": self.public(item_id)}]
        item_id = event["item_id"]
        if item_id not in self._items:
            return []
        if kind == "conversation.item.retrieve":
            return [{"type": "conversation.item.retrieved", "item": self.public(item_id)}]
        if kind == "conversation.item.truncate":
            return [
                {"type": "conversation.item.truncated", "item_id": item_id,
                 "content_index": event["content_index"], "audio_end_ms": event["audio_end_ms"]}
            ]  # fmt: skip
        self.delete(item_id)
        return [{"type": "conversation.item.deleted", "item_id": item_id}]

    # -- the items ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """The bytes the items hold (their JSON and kept audio) and the buffer."""
        return self._bytes + len(self.buffer)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    def add(self, item: dict[str, Any], audio: bytes | None = None) -> str:
        """Store ``item`` (given an id and ``status: completed`` if it has none); returns
        its id. The oldest items go once past the bounds (never the one just added)."""
        item_id = item.get("id") or new_item_id()
        item["id"] = item_id
        item.setdefault("type", "message")
        item.setdefault("object", "realtime.item")
        if item.get("type") == "message":
            item.setdefault("status", "completed")
        self._forget(item_id)
        self._items[item_id] = item
        self._checked_ids.add(item_id)
        size = self._sizes[item_id] = _size(item)
        self._bytes += size
        if audio is not None and self.keep_audio:
            self._audio[item_id] = audio
            self._bytes += len(audio)
        while len(self._items) > 1 and (
            len(self._items) > self.max_items or self._bytes > self.max_bytes
        ):
            self.delete(next(iter(self._items)))
        return item_id

    def update(self, item_id: str, **fields: Any) -> None:
        """Change an item's fields (e.g. a transcript recognised, a response's end)."""
        item = self._items.get(item_id)
        if item is not None:
            item.update(fields)
            size = _size(item)
            self._bytes += size - self._sizes[item_id]
            self._sizes[item_id] = size

    def delete(self, item_id: str) -> None:
        self._forget(item_id)
        self._checked_ids.discard(item_id)

    def _forget(self, item_id: str) -> None:
        if self._items.pop(item_id, None) is not None:
            self._bytes -= self._sizes.pop(item_id) + len(self._audio.pop(item_id, b""))

    def public(self, item_id: str) -> dict[str, Any]:
        """A copy of the item as the client sees it (audio is never echoed in events)."""
        item = dict(self._items[item_id])
        if isinstance(item.get("content"), list):
            item["content"] = [
                {k: v for k, v in part.items() if k != "audio"} for part in item["content"]
            ]
        return item

    def latest_user(self) -> Turn | None:
        """The latest user message, or None if there is none."""
        for item_id in reversed(self._items):
            item = self._items[item_id]
            if item.get("type") == "message" and item.get("role") == "user":
                typed = any(p.get("type") in _TEXT_PARTS for p in item.get("content", ()))
                return Turn(item_id, item_text(item), self._audio.get(item_id), typed)
        return None

    # -- the audio buffer ---------------------------------------------------------------

    def append_audio(self, pcm: bytes) -> None:
        self.buffered += len(pcm)
        if self.keep_audio:
            self.buffer += pcm
            if len(self.buffer) > self.max_buffer_bytes:  # the turn's newest audio kept
                del self.buffer[: len(self.buffer) - self.max_buffer_bytes]

    def clear_audio(self) -> None:
        self.buffer.clear()
        self.buffered = 0

    def commit_audio(self, transcript: str | None = None, item_id: str | None = None) -> str | None:
        """The buffer becomes a user item (None: nothing was appended since the last
        commit or clear); returns its id (``item_id`` if given: the one a turn's
        ``speech_started`` named). ``transcript`` None: not recognised (yet)."""
        if not self.buffered:
            return None
        audio = bytes(self.buffer) if self.keep_audio else None
        self.clear_audio()
        part: dict[str, Any] = {"type": "input_audio", "transcript": transcript}
        item = {"type": "message", "role": "user", "content": [part]}
        return self.add(item if item_id is None else {"id": item_id, **item}, audio)

    def committed_events(self, item_id: str, *, done: bool = True) -> list[Event]:
        """``input_audio_buffer.committed``, ``conversation.item.added`` and (unless
        ``done`` is false: its transcript is to come) ``conversation.item.done``."""
        previous = self._previous(item_id)
        committed: Event = {"type": "input_audio_buffer.committed", "item_id": item_id}
        added: Event = {"type": "conversation.item.added", "item": self.public(item_id)}
        if previous is not None:
            committed["previous_item_id"] = added["previous_item_id"] = previous
        if not done:
            added["item"]["status"] = "in_progress"
            return [committed, added]
        return [committed, added, {"type": "conversation.item.done", "item": self.public(item_id)}]

    def transcribed(self, item_id: str, text: str) -> list[Event]:
        """A committed item's transcript is known: ``input_audio.transcript.done`` and
        ``conversation.item.done``."""
        done: Event = {"type": "input_audio.transcript.done", "text": text, "item_id": item_id}
        if item_id not in self._items:
            return [done]
        self.update(item_id, content=[{"type": "input_audio", "transcript": text}])
        return [done, {"type": "conversation.item.done", "item": self.public(item_id)}]

    def _move_after(self, item_id: str, after: str | None) -> None:
        """Put an item right after ``after`` (None: first), as ``previous_item_id`` asks."""
        if after == item_id:
            return
        item = self._items.pop(item_id)
        order = list(self._items.items())
        at = 0 if after is None else 1 + next(i for i, (k, _) in enumerate(order) if k == after)
        order.insert(at, (item_id, item))
        self._items = dict(order)

    def _previous(self, item_id: str) -> str | None:
        # From the newest: the item asked about is nearly always the one just added.
        newer = iter(reversed(self._items))
        for other in newer:
            if other == item_id:
                return next(newer, None)
        return None

    # -- responses ----------------------------------------------------------------------

    def begin_response(self, response_id: str) -> None:
        """A response starts: its assistant item (``assistant_item_id``), in progress."""
        self.add(core.assistant_item(response_id, None, audio=False, status="in_progress"))

    def end_response(
        self, response_id: str, text: str, modalities: Iterable[str], status: str
    ) -> None:
        """A response ended: its item holds what it said (``completed``, or
        ``incomplete`` when cancelled or cut), as the OpenAI dialect's shaper writes it."""
        item = core.assistant_item(response_id, text, audio="audio" in modalities, status=status)
        if item["id"] in self._items:
            self.update(item["id"], status=status, content=item["content"])
        else:
            self.add(item)

    # -- migration ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": VERSION,
            "items": list(self._items.values()),
            "audio": {k: base64.b64encode(v).decode() for k, v in self._audio.items()},
            "buffer": base64.b64encode(self.buffer).decode(),
            "buffered": self.buffered,
            "checked_ids": sorted(self._checked_ids),
            "checked_audio": self._checked_audio,
        }

    def restore(self, state: object) -> None:
        """Take a ``snapshot()``, all checked first; ValueError for a bad one."""
        if not isinstance(state, dict) or state.get("state") != VERSION:
            raise ValueError(f"not a snapshot of a conversation ({VERSION})")
        items, audio, ids = state.get("items"), state.get("audio"), state.get("checked_ids")
        buffered, checked_audio = state.get("buffered", -1), state.get("checked_audio", -1)
        if not isinstance(items, list) or not isinstance(audio, dict) or not isinstance(ids, list):
            raise ValueError("conversation snapshot: items, audio and ids must be given")
        if not (isinstance(buffered, int) and isinstance(checked_audio, int)) or not (
            _count(buffered) and _count(checked_audio)
        ):
            raise ValueError("conversation snapshot: its audio counts are not counts")
        try:
            for item in items:
                check_item(_stored(item) if isinstance(item, dict) else item)
                if not isinstance(item.get("id"), str):
                    raise ValueError("conversation snapshot: an item has no id")
        except BadEvent as exc:
            raise ValueError(f"conversation snapshot: {exc}") from None
        if not all(isinstance(i, str) for i in ids):
            raise ValueError("conversation snapshot: 'checked_ids' must hold ids")
        if len(items) > self.max_items or len(ids) > self.max_items + MAX_PENDING_IDS:
            raise ValueError("conversation snapshot: more items or ids than its bounds hold")
        try:
            kept = {str(k): base64.b64decode(v, validate=True) for k, v in audio.items()}
            buffer = base64.b64decode(state.get("buffer", ""), validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ValueError("conversation snapshot: its audio is not base64") from None
        self._items, self._audio, self._sizes, self._bytes = {}, {}, {}, 0
        for item in items:
            self.add(dict(item), kept.get(item["id"]))
        self.buffer, self.buffered = bytearray(buffer[-self.max_buffer_bytes :]), buffered
        self._checked_ids, self._checked_audio = set(ids), checked_audio
