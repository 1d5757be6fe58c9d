"""The per-session journal of engine events: sequence numbers, replay, bounds.

Sans-IO: time is passed in. Entries hold the encoded frame, so an event is encoded once
and the same string is sent live, journaled and replayed.

Bounds (docs/protocol.md, Events and the journal): ``max_bytes`` of compact JSON and
``ttl_s`` of age. Overflow is never silent: when appending event N would exceed the byte
bound every entry up to N-1 is dropped and the caller is told ``dropped_through = N-1``
(an event that alone exceeds the bound is not journaled: ``dropped_through = N``). TTL
drops are quiet; a replay that needs a dropped entry reports a gap instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import NamedTuple

import attrs

from .wire import utf8_len

Frame = str | bytes
"""A WebSocket message as a dialect wrote it: text for ``str``, binary for ``bytes``."""


def frame_size(frame: Frame) -> int:
    """What a frame counts against the journal's bound: its bytes on the wire (UTF-8)."""
    return len(frame) if isinstance(frame, bytes) else utf8_len(frame)


class Entry(NamedTuple):  # one per event: a tuple is several times cheaper to build
    seq: int
    frame: Frame
    """A JSON text frame, or a binary message (protocol v2's audio lane)."""
    size: int
    time: float


@attrs.define(eq=False)
class Journal:
    max_bytes: int
    ttl_s: float
    head: int = 0
    """The newest seq handed out (0: none yet)."""
    dropped_through: int = 0
    """Every seq up to this one is lost to overflow or TTL (acked entries don't count)."""
    acked_through: int = 0
    _entries: deque[Entry] | tuple[()] = ()
    """Oldest first: a deque from the first append on (an empty deque is 760 bytes, and
    the journal of an idle session, which has sent nothing, needs none)."""
    _bytes: int = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def floor(self) -> int:
        """Every seq up to this one is no longer held (acked, overflowed or expired)."""
        entries = self._entries
        return entries[0].seq - 1 if entries else self.head

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """The entries held, oldest first (what a migration record carries)."""
        return iter(self._entries)

    @classmethod
    def rebuilt(
        cls,
        max_bytes: int,
        ttl_s: float,
        *,
        head: int,
        dropped_through: int,
        acked_through: int,
        entries: Iterable[tuple[int, Frame]],
        now: float,
    ) -> Journal:
        """A journal as another node left it (core/migration.py), its entries dated
        ``now``. Under tighter bounds than that node's, the oldest entries that do not
        fit are dropped, as an overflow would (``dropped_through`` says so)."""
        journal = cls(max_bytes, ttl_s, head, dropped_through, acked_through)
        held = journal._entries = deque()
        for seq, frame in entries:
            size = frame_size(frame)
            held.append(Entry(seq, frame, size, now))
            journal._bytes += size
        while held and journal._bytes > max_bytes:
            entry = held.popleft()
            journal._bytes -= entry.size
            journal.dropped_through = max(journal.dropped_through, entry.seq)
        return journal

    def append(self, frame: Frame, size: int, now: float) -> int | None:
        """Journal event ``head + 1`` (the caller has already stamped it with that seq).

        Returns ``dropped_through`` when this append dropped entries (the attached client
        must be sent ``session.resync_required`` before the event), else None.
        """
        self.head = seq = self.head + 1
        entries = self._entries
        if entries and entries[0].time <= now - self.ttl_s:  # (most appends: none expire)
            self._expire(now)
        if size > self.max_bytes:
            self._drop_all(seq)
            return seq
        notice = None
        if self._bytes + size > self.max_bytes:
            self._drop_all(seq - 1)
            notice = seq - 1
        entries = self._entries  # (again: a drop may have replaced it)
        if isinstance(entries, tuple):  # (the first entry)
            entries = self._entries = deque()
        entries.append(Entry(seq, frame, size, now))
        self._bytes += size
        return notice

    def ack(self, seq: int) -> None:
        """Free entries up to and including ``seq``; the caller validated 0 <= seq <= head."""
        entries = self._entries
        while entries and entries[0].seq <= seq:
            self._bytes -= entries.popleft().size
        if seq > self.acked_through:
            self.acked_through = seq

    def replay(self, after: int, now: float) -> list[Entry] | None:
        """Every entry after ``after`` up to head, in order; None when one is missing."""
        self._expire(now)
        if after >= self.head:
            return []
        entries = self._entries
        if not entries or entries[0].seq > after + 1:
            return None
        return list(islice(entries, after + 1 - entries[0].seq, None))

    def _drop_all(self, through: int) -> None:
        if isinstance(self._entries, deque):
            self._entries.clear()
        self._bytes = 0
        if through > self.dropped_through:
            self.dropped_through = through

    def _expire(self, now: float) -> None:
        entries = self._entries
        cutoff = now - self.ttl_s
        while entries and entries[0].time <= cutoff:
            entry = entries.popleft()
            self._bytes -= entry.size
            if entry.seq > self.dropped_through:
                self.dropped_through = entry.seq
