"""Moving a live session to another node, as data. No I/O, no clock.

A node that drains in cluster mode stops each session whose engine can snapshot at a
safe point (``SessionRunner.freeze`` → ``Frozen``), ``export``s it to a ``Record`` and
stores ``Record.to_bytes()``. The node a client then resumes on reads it back
(``Record.from_bytes``), ``restore``s a DETACHED session from it, gives it a fresh engine
that has ``restore``d the engine state, and adopts both (``Registry.adopt``,
``Sessions.adopt``). The client's ordinary ``session.resume`` does the rest.

Exactly-once, in order, across the move:

* Server to client: the record holds the journal as the freeze left it (every event
  whose engine ``send`` returned is in it, no other) and its head, so the resume replays
  exactly what the client lacks, and the restored engine's next event is ``head + 1``.
* Client to server: ``client_seq`` is the freeze's ``resume_client_seq``, the last seq
  received (from the freeze on, nothing more is taken from the client, nor acked); what
  the engine had not taken of it yet is carried over (``pending_input``) for the next
  engine. ``session.resumed`` carries it; the client resends from the next one.

The serialization (``to_bytes``) is ``MAGIC`` then one orjson document whose ``"v"`` is
the format version: orjson is fast and already a dependency, and JSON stays readable
with ``redis-cli GET`` and the same on every Python version (pickle would be neither,
and would run code on load). Bytes (digests, binary-lane frames, a ``bytes`` engine
state) are standard base64, decoded strictly. Text frames are kept as JSON strings:
escaping their quotes costs ~15 %, a price for one format with nothing to hand-parse.
``from_bytes`` validates everything a ``Record`` holds (an object that exists is
valid), so a record from the store can be trusted no more and no less than its bytes.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import attrs
import orjson

from .credentials import Credentials
from .journal import Frame, Journal
from .limits import Limits
from .session import LIVE_STATES, Session, State, Usage
from .spelling import Spelling

FORMAT = 1
"""The record format's version; a reader refuses any other (``BadRecord``)."""
MAGIC = b"tdmig:"
"""What every record starts with: anything else is refused before it is parsed."""
DIGEST_BYTES = 32  # SHA-256 (core/credentials.py)
MAX_DEPTH = 64
"""How deeply the configuration and a JSON engine state may nest: what parses then
also serializes again (orjson writes at most 254 levels) and copies (``deepcopy``
recurses)."""

EngineState = bytes | dict[str, Any]
"""What ``Engine.snapshot`` returns when it can migrate: bytes, or a JSON object."""

_COUNTS = ("events_in", "bytes_in", "events_out", "bytes_out", "resumes")
_DURATIONS = ("audio_ms_in", "audio_ms_out")


class BadRecord(ValueError):
    """Bytes that are not a valid migration record of this format (or over the bound)."""


@attrs.frozen(repr=False)
class Frozen:
    """A session whose engine was stopped at a safe point (``SessionRunner.freeze``)."""

    engine_state: EngineState
    resume_client_seq: int
    """Every client event numbered up to this one was received: taken by the engine,
    handled by the runner, or in ``pending_input``; none after it was."""
    pending_input: tuple[tuple[dict[str, Any], int], ...] = ()
    """Client events received and not yet taken by the engine, oldest first, each with
    its counted size: the next node's engine takes them first."""
    dialect: str = "native"
    """The name of the dialect the session was opened in (``trio_duplex.dialects``)."""
    shaper_state: dict[str, Any] | None = None
    """Its dialect's shaper's ``state()``; None: its dialect has no shaper."""

    def __repr__(self) -> str:
        return f"Frozen(resume_client_seq={self.resume_client_seq}, dialect={self.dialect})"


@attrs.frozen(repr=False)
class JournalRecord:
    head: int
    dropped_through: int
    acked_through: int
    entries: tuple[tuple[int, Frame], ...]
    """The unacknowledged entries held, oldest first: (seq, frame)."""

    def __attrs_post_init__(self) -> None:
        _count(self.head, "head")
        _count(self.dropped_through, "dropped_through", most=self.head)
        _count(self.acked_through, "acked_through", most=self.head)
        # A journal only ever holds a run of consecutive seqs ending at its head (entries
        # go in at head + 1, and leave from the front), and Journal.replay relies on it.
        first = self.head - len(self.entries) + 1
        if self.entries and first <= max(self.dropped_through, self.acked_through):
            raise ValueError("an entry at or below the dropped or acknowledged seqs")
        for expected, entry in enumerate(self.entries, first):
            if type(entry) is not tuple or len(entry) != 2:
                raise ValueError("an entry is not a (seq, frame) pair")
            seq, frame = entry
            if type(seq) is not int or seq != expected:
                raise ValueError("entries are not the consecutive seqs up to head")
            if not isinstance(frame, str | bytes):
                raise ValueError("a frame is neither str nor bytes")


@attrs.frozen(repr=False)
class Record:
    """Everything needed to re-create a session on another node. Never shown whole: its
    repr names the session, not its digests, configuration, frames or engine state."""

    session_id: str
    config: dict[str, Any]
    principal: str | None
    config_locked: bool
    current_digest: bytes
    pending_digest: bytes | None
    generation: int
    client_seq: int
    consumed_seq: int
    heard: bool
    usage: dict[str, int | float | None]
    journal: JournalRecord
    engine_state: EngineState
    pending_input: tuple[tuple[dict[str, Any], int], ...] = ()
    """Client events received and not yet taken by the engine (``Frozen``)."""
    dialect: str = "native"
    """The dialect it was opened in, by name; a record without one is native's."""
    shaper_state: dict[str, Any] | None = None
    """Its dialect's shaper's state (``Frozen``)."""
    fixed_token: bool = False
    """Its one token never rotates (``Credentials.fixed``: a telephony call's session);
    a record without it rotates (every session before fixed tokens)."""
    version: int = FORMAT

    def __attrs_post_init__(self) -> None:
        if self.version != FORMAT:
            raise ValueError(f"record format {self.version!r}, not {FORMAT}")
        if type(self.session_id) is not str or not 0 < len(self.session_id) <= 256:
            raise ValueError("session_id must be a string of 1 to 256 characters")
        if type(self.config) is not dict or not _shallow(self.config):
            raise ValueError(f"config must be an object nested at most {MAX_DEPTH} deep")
        if self.principal is not None and type(self.principal) is not str:
            raise ValueError("principal must be a string or null")
        for flag in (self.config_locked, self.heard):
            if type(flag) is not bool:
                raise ValueError("config_locked and heard must be booleans")
        for digest in (self.current_digest, self.pending_digest):
            if digest is not None and (type(digest) is not bytes or len(digest) != DIGEST_BYTES):
                raise ValueError("a credential digest must be 32 bytes")
        if self.current_digest is None:
            raise ValueError("the current digest is missing")
        if type(self.fixed_token) is not bool:
            raise ValueError("fixed_token must be a boolean")
        if self.fixed_token and self.pending_digest is not None:
            raise ValueError("a fixed token has no pending digest")
        _count(self.generation, "generation", least=1)
        _count(self.client_seq, "client_seq")
        _count(self.consumed_seq, "consumed_seq", most=self.client_seq)
        if type(self.usage) is not dict or set(self.usage) != {*_COUNTS, *_DURATIONS}:
            raise ValueError(f"usage must hold exactly {_COUNTS + _DURATIONS}")
        for name in _COUNTS:
            _count(self.usage[name], f"usage.{name}")
        for name in _DURATIONS:
            value = self.usage[name]
            if value is not None and (type(value) is not float or not 0 <= value < 1e300):
                raise ValueError(f"usage.{name} must be a non-negative float or null")
        if type(self.journal) is not JournalRecord:
            raise ValueError("journal must be a JournalRecord")
        state = self.engine_state
        if type(state) is not bytes and (type(state) is not dict or not _shallow(state)):
            raise ValueError(f"engine_state must be bytes or an object nested <= {MAX_DEPTH}")
        if type(self.pending_input) is not tuple:
            raise ValueError("pending_input must be a tuple")
        for item in self.pending_input:
            if type(item) is not tuple or len(item) != 2:
                raise ValueError("pending input must be (event, size) pairs")
            event, size = item
            if type(event) is not dict or type(event.get("type")) is not str:
                raise ValueError("a pending event must be an object with a string type")
            if not _shallow(event):
                raise ValueError(f"a pending event nests deeper than {MAX_DEPTH}")
            _count(size, "a pending event's size")
        if type(self.dialect) is not str or not 0 < len(self.dialect) <= 64:
            raise ValueError("dialect must be a string of 1 to 64 characters")
        shaper = self.shaper_state
        if shaper is not None and (type(shaper) is not dict or not _shallow(shaper)):
            raise ValueError(f"shaper_state must be null or an object nested <= {MAX_DEPTH}")

    def __repr__(self) -> str:
        return (
            f"Record({self.session_id}, format {self.version}, generation={self.generation}, "
            f"head={self.journal.head}, entries={len(self.journal.entries)})"
        )

    def to_bytes(self) -> bytes:
        """The record as stored: ``MAGIC`` and a versioned orjson document. Raises
        ValueError when the configuration or the engine's JSON state is not JSON."""
        journal = self.journal
        state = self.engine_state
        doc = {
            "v": self.version,
            "id": self.session_id,
            "config": self.config,
            "principal": self.principal,
            "config_locked": self.config_locked,
            "digests": [_b64(self.current_digest), _b64(self.pending_digest)],
            "generation": self.generation,
            "client_seq": self.client_seq,
            "consumed_seq": self.consumed_seq,
            "heard": self.heard,
            "usage": self.usage,
            "journal": {
                "head": journal.head,
                "dropped_through": journal.dropped_through,
                "acked_through": journal.acked_through,
                "entries": [
                    [seq, "b", _b64(frame)] if isinstance(frame, bytes) else [seq, "t", frame]
                    for seq, frame in journal.entries
                ],
            },
            "state": {"bytes": _b64(state)} if isinstance(state, bytes) else {"json": state},
            # Client events as the engine gets them: JSON, but for decoded audio (bytes).
            "input": [
                [
                    size,
                    {k: v for k, v in event.items() if not isinstance(v, bytes)},
                    {k: _b64(v) for k, v in event.items() if isinstance(v, bytes)},
                ]
                for event, size in self.pending_input
            ],
            "dialect": self.dialect,
            "shaper": self.shaper_state,
        }
        if self.fixed_token:  # (only then: other records stay as they were)
            doc["fixed"] = True
        try:
            return MAGIC + orjson.dumps(doc)
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"session {self.session_id}: not serializable as JSON") from exc

    @classmethod
    def from_bytes(cls, data: bytes, *, max_bytes: int) -> Record:
        """Parse what ``to_bytes`` wrote. Raises ``BadRecord`` (and nothing else) for
        anything over ``max_bytes``, of another format, malformed or inconsistent."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadRecord("a record is bytes")
        if len(data) > max_bytes:
            raise BadRecord(f"record of {len(data)} bytes, over the bound of {max_bytes}")
        data = bytes(data)
        if not data.startswith(MAGIC):
            raise BadRecord("not a migration record")
        try:
            doc = orjson.loads(data[len(MAGIC) :])
            return _parse(doc)
        except BadRecord:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            # (orjson's JSONDecodeError and binascii.Error are ValueErrors)
            raise BadRecord(f"malformed record: {exc}") from exc


def export(session: Session, frozen: Frozen) -> Record:
    """The record of a live session frozen by its runner. ValueError while a resume of it
    is in progress (it would move half-way), once it has ended, or when its engine
    state nests deeper than ``MAX_DEPTH``."""
    if session.resume is not None:
        raise ValueError(f"{session!r}: a resume is in progress")
    if session.state not in LIVE_STATES or session.state is State.OPENING:
        raise ValueError(f"{session!r} cannot be exported")
    client_seq = frozen.resume_client_seq
    current, pending = session.credentials.digests()
    journal = session.journal
    usage = session.usage
    return Record(
        session_id=session.id,
        config=copy.deepcopy(session.config),
        principal=session.principal,
        config_locked=session.config_locked,
        current_digest=current,
        pending_digest=pending,
        generation=session.generation,
        client_seq=client_seq,
        # Consumption reported past the resume point would be taken back: cap it.
        consumed_seq=min(session.consumed_seq, client_seq),
        heard=session.heard,
        usage={name: getattr(usage, name) for name in (*_COUNTS, *_DURATIONS)},
        journal=JournalRecord(
            journal.head,
            journal.dropped_through,
            journal.acked_through,
            tuple((entry.seq, entry.frame) for entry in journal),
        ),
        engine_state=frozen.engine_state,
        pending_input=frozen.pending_input,
        dialect=frozen.dialect,
        shaper_state=frozen.shaper_state,
        fixed_token=session.credentials.is_fixed,
    )


def restore(record: Record, limits: Limits, now: float, spelling: Spelling) -> Session:
    """A DETACHED session re-created from ``record`` under this node's ``limits``, written
    by ``spelling`` (the dialect its journal's frames are in): its grace runs from
    ``now`` (``disconnect_grace_s``), its journal's entries are dated ``now``, and
    exactly the tokens valid when it was exported are valid."""
    journal = record.journal
    return Session(
        id=record.session_id,
        config=copy.deepcopy(record.config),
        limits=limits,
        credentials=Credentials.from_digests(
            record.current_digest, record.pending_digest, fixed=record.fixed_token
        ),
        journal=Journal.rebuilt(
            limits.journal_max_bytes,
            limits.journal_ttl_s,
            head=journal.head,
            dropped_through=journal.dropped_through,
            acked_through=journal.acked_through,
            entries=journal.entries,
            now=now,
        ),
        state=State.DETACHED,
        generation=record.generation,
        client_seq=record.client_seq,
        consumed_seq=record.consumed_seq,
        grace_deadline=now + limits.disconnect_grace_s,
        idle_deadline=now + limits.idle_ttl_s,
        usage=Usage(**record.usage),  # type: ignore[arg-type]
        principal=record.principal,
        config_locked=record.config_locked,
        heard=record.heard,
        spelling=spelling,
    )


def _count(value: object, name: str, *, least: int = 0, most: int | None = None) -> None:
    if type(value) is not int or value < least or (most is not None and value > most):
        bound = "" if most is None else f" and at most {most}"
        raise ValueError(f"{name} must be an integer of at least {least}{bound}")


def _shallow(value: object) -> bool:
    """``value`` nests lists and dicts at most ``MAX_DEPTH`` deep (checked without
    recursion, so that any input is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list | tuple):
            if depth > MAX_DEPTH:
                return False
            stack.extend((child, depth + 1) for child in item)
    return True


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    if type(text) is not str:
        raise ValueError("expected base64 text")
    return base64.b64decode(text, validate=True)  # binascii.Error: a ValueError


def _parse(doc: Any) -> Record:
    if type(doc) is not dict:
        raise BadRecord("a record is a JSON object")
    if type(doc.get("v")) is not int or doc["v"] != FORMAT:  # (True == 1.0 == 1)
        raise BadRecord(f"record format {doc.get('v')!r}, not {FORMAT}")
    current, pending = doc["digests"]
    journal = doc["journal"]
    entries: list[tuple[int, Frame]] = []
    for seq, kind, frame in journal["entries"]:
        if kind == "b":
            entries.append((seq, _unb64(frame)))
        elif kind == "t" and type(frame) is str:
            entries.append((seq, frame))
        else:
            raise BadRecord("an entry is neither text nor base64 bytes")
    ((kind, state),) = doc["state"].items()
    if kind == "bytes":
        state = _unb64(state)
    elif kind != "json":
        raise BadRecord("engine state is neither bytes nor JSON")
    queued: list[tuple[dict[str, Any], int]] = []
    for size, fields, raw in doc["input"]:
        if type(fields) is not dict or type(raw) is not dict:
            raise BadRecord("a pending event is not an object")
        queued.append(({**fields, **{k: _unb64(v) for k, v in raw.items()}}, size))
    return Record(
        session_id=doc["id"],
        config=doc["config"],
        principal=doc["principal"],
        config_locked=doc["config_locked"],
        current_digest=_unb64(current),
        pending_digest=None if pending is None else _unb64(pending),
        generation=doc["generation"],
        client_seq=doc["client_seq"],
        consumed_seq=doc["consumed_seq"],
        heard=doc["heard"],
        usage=doc["usage"],
        journal=JournalRecord(
            journal["head"], journal["dropped_through"], journal["acked_through"], tuple(entries)
        ),
        engine_state=state,
        pending_input=tuple(queued),
        dialect=doc.get("dialect", "native"),  # (a record of a node before dialects)
        shaper_state=doc.get("shaper"),
        fixed_token=doc.get("fixed", False),
        version=doc["v"],
    )
