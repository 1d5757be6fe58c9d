"""What a resume writes before it commits: the replay rules, sans-IO.

A resume (``Session.begin_resume``) owes the resuming client, in order: its
``session.resumed``, then every journaled event after the seq it presented, with a
``session.resync_required{journal_gap}`` wherever the journal no longer holds what
comes next. The shell asks ``Replay.next_frames(now)`` for the next frames, writes
them, and asks again; an empty answer means caught up: commit the resume at once, with
no await in between (``Session.commit_resume``), so that nothing journaled since can be
missed. The interleaving checker (tests/modelcheck) drives this same object.

The rules:

* A gap (an entry after the cursor is gone: overflow, TTL, or an ack from the old
  connection), whether at the start or found part-way (while the replay was being
  written): a notice with ``dropped_through_seq`` = the journal's floor, the last seq
  it no longer holds, then on with the entries it still holds after it. The client is
  told exactly which seqs it will never get, and loses nothing else.
* Entries are written in batches of at most ``BATCH``, each taken from one look at the
  journal: a batch that was taken is written whole even if the journal drops some of it
  meanwhile (the client receives them in order all the same).
* Without audio (``audio=False``, for a dialect whose ``replays_audio`` is False: a
  call's): the binary lane's frames (kind 2, output audio; the only binary frames a
  journal holds) are skipped, counted in ``audio_dropped``, and the cursor moves past
  them; every other entry is written as above, exactly once. Audio spelled as text (the
  JSON wire's deltas) is not told apart: such a session uses the binary lane. A batch
  that was all audio writes nothing, so the next one is taken at once: an empty answer
  still means caught up.
"""

from __future__ import annotations

import attrs

from .frames import BATCH
from .journal import Entry, Frame
from .session import ResumeAttempt


@attrs.define(eq=False, repr=False)
class Replay:
    attempt: ResumeAttempt
    audio: bool = attrs.field(default=True, kw_only=True)
    """Output audio on the binary lane is written again; False: skipped (see above)."""
    cursor: int = attrs.field(init=False)
    """The highest seq the client holds, has been written, or was told is gone."""
    resumed_sent: bool = False
    """``session.resumed`` has been handed out (the client may have it)."""
    replayed: int = 0
    """Journaled events handed out so far (for the metrics)."""
    audio_dropped: int = 0
    """Journaled audio frames skipped (``audio`` False; for the metrics)."""
    _pending: list[Entry] = attrs.field(factory=list)
    """Entries taken from the journal and not yet handed out, in order."""

    def __attrs_post_init__(self) -> None:
        self.cursor = self.attempt.last_seq

    def __repr__(self) -> str:
        return f"Replay({self.attempt.session.id}, cursor={self.cursor})"

    def next_frames(self, now: float) -> list[Frame]:
        """The frames to write next, in order; [] once the client is caught up."""
        session = self.attempt.session
        if not self.resumed_sent:
            self.resumed_sent = True
            return [session.resumed_frame(self.attempt)]
        journal = session.journal
        frames: list[Frame] = []
        while True:
            if not self._pending:
                entries = journal.replay(self.cursor, now)
                if entries is None:
                    self.cursor = journal.floor  # the last seq lost: what is held comes after
                    frames.append(session.resync_frame("journal_gap", self.cursor))
                    # The journal holds every entry above its floor, so this finds no gap;
                    # were it to, the next call would look again.
                    entries = journal.replay(self.cursor, now) or []
                self._pending = entries
            batch = self._pending[:BATCH]
            if not batch:
                return frames
            del self._pending[:BATCH]
            self.cursor = batch[-1].seq
            if self.audio:
                self.replayed += len(batch)
                frames.extend([entry.frame for entry in batch])
                return frames
            kept = [entry.frame for entry in batch if type(entry.frame) is str]
            self.audio_dropped += len(batch) - len(kept)
            self.replayed += len(kept)
            frames.extend(kept)
            if frames:
                return frames
            # All audio: nothing to write yet, and an empty answer would commit.
