"""Exhaustive interleaving checker for the sans-IO session core.

Drives the real ``Registry``, ``Session``, ``Replay`` and ``ClientEvents`` (what a client
event means: core/protocol.py) objects, plus a small model of
what the trio shell does around them (the handshake send, writing what ``Replay`` says,
teardown, the per-session timer) and of the clients, through every ordering of a set of actions, and
checks the invariants of docs/protocol.md after every step. Breadth-first with a canonical
state key, so equivalent states are expanded once and the first violation found for an
invariant comes with a shortest action sequence.

Output audio (``--audio``) is journaled on the binary lane beside the text events; a
world whose dialect does not replay audio (``--no-audio-replay``, a call's) models a
client that never learns an audio frame's seq (a call's audio goes to its media track):
each text event after the seq it presents must reach it exactly once, in order, any
audio between them skipped, and no audio frame may be replayed.

Run alone::

    python -m tests.modelcheck.interleavings --depth 10 --max-sessions 1 2

The same ``World`` is driven at random by ``test_stateful.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

import attrs

from trio_duplex.core.credentials import Credentials, digest
from trio_duplex.core.events import Reason
from trio_duplex.core.journal import Journal, frame_size
from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import IGNORE, TO_ENGINE, ClientEvents, Decision
from trio_duplex.core.protocol import Action as Do
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Commit, Registry, ResumeAttempt, Session, State
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE

GRACE_S = 30.0
UNCONFIRMED_GRACE_S = 5.0  # for a session whose client has not spoken since session.created
IDLE_S = 300.0
JOURNAL_MAX_BYTES = 70  # two small events fit, the third overflows
Action = tuple[Any, ...]


class Violation(Exception):
    """An invariant does not hold. ``name`` groups violations of the same invariant."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def require(condition: bool, name: str, detail: str) -> None:
    if not condition:
        raise Violation(name, detail)


def make_config(
    max_sessions: int, journal_max_bytes: int = JOURNAL_MAX_BYTES, journal_ttl_s: float = 1e9
) -> Limits:
    return Limits(
        max_sessions=max_sessions,
        disconnect_grace_s=GRACE_S,
        unconfirmed_grace_s=UNCONFIRMED_GRACE_S,
        idle_ttl_s=IDLE_S,
        journal_max_bytes=journal_max_bytes,
        journal_ttl_s=journal_ttl_s,
    )


class Conn:
    """One WebSocket as its client sees it: what arrived, and the attachment it holds."""

    __slots__ = ("alive", "gap_to", "gen", "last", "replaced", "reports", "terminal")

    def __init__(self, gen: int, base: int) -> None:
        self.gen = gen  # attachment generation held; 0 while its resume is in progress
        self.alive = True
        self.reports = 0  # loss reports made so far (reader side, pump side)
        self.last = base  # highest server_event_seq received (or presented when resuming)
        self.gap_to = base  # highest dropped_through_seq announced on this connection
        self.terminal = 0  # terminal events received
        self.replaced = False

    def clone(self) -> Conn:
        c = Conn.__new__(Conn)
        c.gen, c.alive, c.reports, c.last = self.gen, self.alive, self.reports, self.last
        c.gap_to, c.terminal, c.replaced = self.gap_to, self.terminal, self.replaced
        return c

    def key(self) -> tuple[Any, ...]:
        return (
            self.gen,
            self.alive,
            self.reports,
            self.last,
            self.gap_to,
            self.terminal,
            self.replaced,
        )

    def frontier(self, audio: tuple[int, ...], upto: int) -> int:
        """The highest seq this client may be missing nothing up to: what it received or
        was told is gone, then any seqs of ``audio`` (the output audio a resume skips),
        below ``upto``."""
        frontier = max(self.last, self.gap_to)
        while frontier + 1 < upto and frontier + 1 in audio:
            frontier += 1
        return frontier

    def receive_event(self, seq: int, where: str, audio: tuple[int, ...] = ()) -> None:
        """The client-side check: in order, exactly once, or after an explicit gap notice
        (or after seqs of ``audio``: for a client that never learns them)."""
        if not self.alive:
            return
        require(seq > self.last, "duplicate_or_reordered", f"{where}: seq {seq} after {self.last}")
        require(
            seq <= self.frontier(audio, seq) + 1,
            "silent_gap",
            f"{where}: seq {seq} after {self.last} with notices only through {self.gap_to}",
        )
        require(self.terminal == 0, "event_after_terminal", f"{where}: seq {seq}")
        self.last = seq

    def receive_notice(self, dropped_through: int) -> None:
        if self.alive:
            self.gap_to = max(self.gap_to, dropped_through)


class Resume:
    """A resume in progress: the core's ``Replay``, as the shell drives it."""

    __slots__ = ("attempt", "conn", "prev_token", "replay")

    def __init__(self, replay: Replay, conn: int, prev_token: str) -> None:
        self.replay = replay
        self.attempt = replay.attempt
        self.conn = conn
        self.prev_token = prev_token


class Rules:
    """The engine's checks, for the machine: it accepts ``e``, and refuses one marked bad."""

    accepts = frozenset({"e"})

    def check(self, event: dict[str, Any]) -> None:
        if event.get("bad"):
            raise ProtocolError("bad_event", "a bad event", param="bad")


RULES = Rules()


def client_events(s: Session, room: bool = True) -> ClientEvents:
    """The session's protocol machine, as its runner holds one (built per step: it keeps
    no state of its own that this model uses, and a cloned session needs its own)."""
    return ClientEvents(s, RULES, ConfigBudget(1 << 20), lambda size: room)


class Slot:
    """One session as the whole system knows it: core object, connections, client."""

    __slots__ = (
        "audio",
        "client_seq",
        "conns",
        "digests",
        "first_token",
        "hs",
        "issued",
        "listening",
        "presented",
        "resume",
        "session",
        "spoke",
        "status",
        "terminals",
        "token",
        "unconfirmed",
    )

    def __init__(self) -> None:
        self.status = "idle"  # idle | opening | open | released
        self.session: Session | None = None
        self.first_token = ""
        self.hs = False  # session.created reached the client
        self.terminals = 0  # terminal events the core handed out
        self.issued: list[str] = []  # every token, oldest first
        self.presented: str | None = None  # the token the latest successful resume presented
        self.token: str | None = None  # the token the client holds
        self.unconfirmed = False  # resumed, and no client event on it since
        self.spoke = False  # the client sent an event after session.created, or resumed
        self.listening = 0  # the connection the client reads
        self.conns: list[Conn] = []
        self.resume: Resume | None = None
        self.client_seq = 0  # highest client_event_seq the core accepted
        self.digests: list[bytes] = []  # the digests of issued (for state keys)
        self.audio: tuple[int, ...] = ()  # the seqs emitted as output audio

    def holder(self) -> Conn | None:
        """The connection holding the session's current generation, if attached."""
        s = self.session
        if s is None or s.state is not State.ATTACHED:
            return None
        for conn in self.conns:
            if conn.gen == s.generation:
                return conn
        return None

    def live(self) -> bool:
        """The session can still be resumed or used (attached or detached)."""
        s = self.session
        return s is not None and s.state in (State.ATTACHED, State.DETACHED)

    def client_last(self) -> int:
        return self.conns[self.listening].last if self.conns else 0

    def credentials_key(self, s: Session) -> tuple[Any, ...]:
        """The credentials' two digests, as the ages of the tokens they belong to."""
        digests = self.digests
        cred = s.credentials
        age = len(digests) - 1
        current = age - digests.index(cred._current) if cred._current in digests else -1
        pending = cred._pending
        if pending is None:
            return current, None
        return current, age - digests.index(pending) if pending in digests else -1

    def issue(self, token: str) -> None:
        self.issued.append(token)
        self.digests.append(digest(token))

    def label(self, token: str | None) -> int | None:
        """A token as its age: 0 the newest issued, 1 the one before, ..."""
        if token is None:
            return None
        return len(self.issued) - 1 - self.issued.index(token)


def _copier(cls: type) -> Any:
    names = [a.name for a in attrs.fields(cls)]
    new, setattr_ = object.__new__, object.__setattr__

    def shallow(obj: Any) -> Any:
        out: Any = new(cls)
        for name in names:
            setattr_(out, name, getattr(obj, name))
        return out

    return shallow


_copy_session, _copy_journal = _copier(Session), _copier(Journal)
_copy_credentials, _copy_attempt = _copier(Credentials), _copier(ResumeAttempt)
_copy_replay = _copier(Replay)


def clone_replay(r: Replay, attempt: ResumeAttempt) -> Replay:
    n: Replay = _copy_replay(r)
    n.attempt = attempt
    n._pending = list(r._pending)
    return n


def clone_session(s: Session) -> Session:
    n: Session = _copy_session(s)
    journal = _copy_journal(s.journal)
    journal._entries = deque(s.journal._entries)
    n.journal = journal
    n.credentials = _copy_credentials(s.credentials)
    if s.resume is not None:
        attempt = _copy_attempt(s.resume)
        attempt.session = n
        n.resume = attempt
    return n


def rel(deadline: float, now: float) -> float | None:
    return None if math.isinf(deadline) else deadline - now


def session_key(s: Session, now: float) -> tuple[Any, ...]:
    j = s.journal
    entries = j._entries
    first = entries[0].seq if entries else None
    attempt = None if s.resume is None else (s.resume.generation, s.resume.last_seq)
    terminal = None if s.terminal is None else (s.terminal.reason, s.terminal.generation)
    return (
        s.state.value,
        s.generation,
        s._lost_in_handshake,
        s.heard,
        rel(s.grace_deadline, now),
        rel(s.idle_deadline, now),
        attempt,
        s.client_seq,
        terminal,
        j.head,
        j.dropped_through,
        j.acked_through,
        first,
        len(entries),
        j.bytes,
    )


def _error(decision: Decision) -> dict[str, Any]:
    require(
        decision.action is Do.REFUSE and decision.frame is not None,
        "not_refused",
        str(decision),
    )
    assert decision.frame is not None
    error: dict[str, Any] = json.loads(decision.frame)
    return error


class World:
    """Registry + sessions + a model of the shell and clients. ``step`` checks invariants."""

    def __init__(
        self, max_sessions: int, sessions: int = 2, *, replays_audio: bool = True, **config: Any
    ) -> None:
        self.registry = Registry(make_config(max_sessions, **config), spelling=NATIVE)
        self.now = 0.0
        self.slots = [Slot() for _ in range(sessions)]
        self.replays_audio = replays_audio
        """The dialect's ``replays_audio``: False, a call's (see the module's docstring)."""

    # -- copying and identity ------------------------------------------------------------

    def clone(self) -> World:
        w = World.__new__(World)
        old = self.registry
        reg = Registry(old.limits, {}, old.slots_held, old.shutting_down, spelling=old.spelling)
        w.registry, w.now, w.slots = reg, self.now, []
        w.replays_audio = self.replays_audio
        for slot in self.slots:
            n = Slot.__new__(Slot)
            n.status, n.first_token, n.hs, n.terminals = (
                slot.status,
                slot.first_token,
                slot.hs,
                slot.terminals,
            )
            n.issued, n.presented, n.token = list(slot.issued), slot.presented, slot.token
            n.listening, n.client_seq = slot.listening, slot.client_seq
            n.unconfirmed, n.spoke = slot.unconfirmed, slot.spoke
            n.digests = list(slot.digests)
            n.audio = slot.audio
            n.conns = [c.clone() for c in slot.conns]
            n.session, n.resume = None, None
            s = slot.session
            if s is not None:
                n.session = clone_session(s)
                if s.id in old.sessions:
                    reg.sessions[s.id] = n.session
            if slot.resume is not None:
                assert s is not None and n.session is not None
                r = slot.resume
                assert r.attempt is s.resume, "the shell's attempt is the core's"
                assert n.session.resume is not None
                n.resume = Resume(clone_replay(r.replay, n.session.resume), r.conn, r.prev_token)
            w.slots.append(n)
        return w

    def key(self) -> tuple[Any, ...]:
        """Canonical: times relative to now, tokens by age, and the two sessions sorted
        (they are symmetric: only the order they were opened in differs)."""
        now = self.now
        slots = []
        for slot in self.slots:
            s = slot.session
            r = slot.resume
            resume = None
            if r is not None:
                replay = r.replay
                resume = (
                    r.conn,
                    replay.resumed_sent,
                    replay.cursor,
                    tuple(entry.seq for entry in replay._pending),
                    slot.label(r.prev_token),
                )
            slots.append(
                (
                    slot.status,
                    slot.hs,
                    slot.terminals,
                    slot.label(slot.token),
                    slot.label(slot.presented),
                    slot.unconfirmed,
                    slot.spoke,
                    None if s is None else slot.credentials_key(s),
                    slot.listening,
                    slot.client_seq,
                    slot.audio,
                    tuple(c.key() for c in slot.conns),
                    resume,
                    None if s is None else session_key(s, now),
                )
            )
        slots.sort(key=hash)
        return (self.registry.slots_held, self.registry.shutting_down, *slots)

    # -- the actions ---------------------------------------------------------------------

    def actions(
        self,
        *,
        big: bool = False,
        engine_end: bool = False,
        client: bool = False,
        audio: bool = False,
    ) -> list[Action]:
        """The actions enabled in this state (the exhaustive checker's alphabet).

        ``big``: also events that alone exceed the journal bound; ``engine_end``: also the
        engine finishing or failing by itself; ``client``: also heartbeats, and late events
        from connections that no longer hold their session; ``audio``: also output audio
        on the binary lane."""
        acts: list[Action] = []
        if not self.registry.shutting_down:
            acts.append(("shutdown",))
        for i, slot in enumerate(self.slots):
            s = slot.session
            if slot.status == "idle":
                acts.append(("open", i))
                continue
            if slot.status == "opening":
                acts += [("created", i), ("created_fail", i)]
            acts += [
                ("lose", i, c) for c, conn in enumerate(slot.conns) if conn.gen and not conn.reports
            ]
            if slot.resume is not None:
                acts += [("resume_step", i), ("resume_fail", i)]
                if not slot.resume.replay.resumed_sent:
                    acts.append(("resume_cancel", i))
            elif slot.status == "open" and slot.token is not None:
                acts.append(("resume", i))
            assert s is not None
            if slot.hs and s.state in (State.ATTACHED, State.DETACHED):
                acts.append(("emit", i))
                if audio:
                    acts.append(("emit_audio", i))
                if big:
                    acts.append(("emit", i, 2 * JOURNAL_MAX_BYTES))
                if engine_end:
                    acts += [("engine_end", i), ("engine_end", i, True)]
            holder = slot.holder()
            if holder is not None and holder.alive:
                acts += [("ack", i), ("close", i)]
                if client:
                    acts.append(("heartbeat", i))
            if client:
                acts += [
                    ("stale_event", i, c)
                    for c, conn in enumerate(slot.conns)
                    if conn.alive and not s.is_current(conn.gen)
                ]
            if s.state is State.DETACHED and self.now < s.grace_deadline:
                acts.append(("expire_grace", i))
            if s.state is State.ATTACHED and self.now < s.idle_deadline:
                acts.append(("expire_idle", i))
            if s.state in (State.ATTACHED, State.DETACHED) and self.now >= s.next_deadline():
                acts.append(("timer", i))
            if s.state is State.CLOSING and slot.status == "open":  # its runner ends
                acts.append(("teardown", i))
        return acts

    def step(self, action: Action) -> None:
        getattr(self, "do_" + action[0])(*action[1:])

    def _session(self, i: int) -> Session:
        s = self.slots[i].session
        assert s is not None
        return s

    def _terminal(self, i: int, terminal: object, where: str) -> None:
        if terminal is not None:
            slot = self.slots[i]
            slot.terminals += 1
            require(slot.terminals == 1, "two_terminals", f"session {i}: second one from {where}")

    def do_shutdown(self) -> None:
        self.registry.shutting_down = True
        for i, slot in enumerate(self.slots):
            s = slot.session
            if s is not None and s.id in self.registry.sessions:
                self._terminal(i, s.begin_close(Reason.SHUTDOWN, self.now), "shutdown")

    def do_open(self, i: int) -> None:
        slot = self.slots[i]
        held = self.registry.slots_held
        try:
            s, token = self.registry.admit({})
        except ProtocolError as exc:
            require(
                exc.code in ("resource_exhausted", "server_shutting_down"),
                "bad_refusal",
                f"admit refused with {exc.code}",
            )
            require(
                exc.code == "server_shutting_down" or held >= self.registry.limits.max_sessions,
                "refused_with_free_slot",
                f"{held} of {self.registry.limits.max_sessions}",
            )
            return
        require(s.state is State.OPENING and s.generation == 1, "bad_open", repr(s))
        slot.status, slot.session, slot.first_token = "opening", s, token
        slot.issue(token)
        slot.conns = [Conn(1, 0)]  # session.created says attachment_generation 1

    def do_created(self, i: int) -> None:
        """The send of ``session.created`` completed."""
        slot, s = self.slots[i], self._session(i)
        event = self.registry.created_event(s, slot.first_token)
        require(event["attachment_generation"] == 1, "bad_created", str(event))
        was_opening = s.state is State.OPENING
        s.handshake_delivered(self.now)
        slot.status, slot.hs = "open", True
        if slot.conns[0].alive:  # else the client never saw it: it holds no token
            slot.token = slot.first_token
        if was_opening:
            expect = State.DETACHED if s._lost_in_handshake else State.ATTACHED
            require(s.state is expect, "bad_handshake", f"{s.state} instead of {expect}")

    def do_created_fail(self, i: int) -> None:
        """The send of ``session.created`` failed: the shell closes and releases at once."""
        slot, s = self.slots[i], self._session(i)
        self._terminal(i, s.handshake_failed(self.now), "handshake_failed")
        require(self.registry.release(s), "release_refused", "after handshake_failed")
        require(
            s.terminal is not None and s.terminal.reason in (Reason.UNDELIVERED, Reason.SHUTDOWN),
            "bad_terminal",
            str(s.terminal),
        )
        slot.status = "released"
        slot.conns[0].alive = False

    def do_lose(self, i: int, c: int) -> None:
        """A connection is lost; its reader and its pump each report it."""
        slot, s = self.slots[i], self._session(i)
        conn = slot.conns[c]
        conn.alive = False
        conn.reports += 1
        state = s.state
        current = conn.gen == s.generation and state in (State.OPENING, State.ATTACHED)
        before = session_key(s, self.now)
        detached = s.detach(conn.gen, self.now)
        if not current:
            require(
                not detached and session_key(s, self.now) == before,
                "stale_detach",
                f"generation {conn.gen} (session at {s.generation}, {state}) changed it",
            )
        elif state is State.OPENING:
            require(not detached and s.state is State.OPENING, "bad_detach", repr(s))
        else:
            grace = GRACE_S if slot.spoke else min(GRACE_S, UNCONFIRMED_GRACE_S)
            require(
                detached and s.state is State.DETACHED and s.grace_deadline == self.now + grace,
                "bad_detach",
                f"{s!r}: grace {s.grace_deadline - self.now}, client spoke: {slot.spoke}",
            )

    def do_resume(self, i: int, from_zero: bool = False, token: str | None = None) -> None:
        """A new connection's ``session.resume``, as the server's resume path runs it."""
        slot = self.slots[i]
        token = slot.token if token is None else token
        last = 0 if from_zero else slot.client_last()
        assert slot.session is not None and token is not None
        try:
            s = self.registry.lookup_for_resume(slot.session.id)
        except ProtocolError as exc:
            require(
                exc.code in ("server_shutting_down", "session_resume_expired"),
                "bad_refusal",
                exc.code,
            )
            return
        self._terminal(i, s.poll(self.now), "poll before resume")
        before = session_key(s, self.now)
        valid_before = [s.credentials.check(t) for t in slot.issued]
        try:
            attempt = s.begin_resume(token, last, self.now)
        except ProtocolError as exc:
            require(
                session_key(s, self.now) == before
                and valid_before == [s.credentials.check(t) for t in slot.issued],
                "refusal_changed_state",
                exc.code,
            )
            live = s.state in (State.ATTACHED, State.DETACHED)
            require(
                exc.code == "session_resume_expired" or not live or token != slot.token,
                "client_token_refused",
                f"{exc.code} for the token the client holds",
            )
            return
        require(slot.hs, "resumable_before_handshake", f"session {i}")
        require(slot.resume is None, "two_resumes", f"session {i}")
        slot.presented = token
        slot.unconfirmed = False  # a newer token is issued: the last commit's is not newest
        slot.issue(attempt.new_token)
        slot.conns.append(Conn(0, last))
        replay = Replay(attempt, audio=self.replays_audio)
        slot.resume = Resume(replay, len(slot.conns) - 1, token)
        slot.listening = len(slot.conns) - 1
        slot.token = attempt.new_token

    def do_resume_step(self, i: int) -> None:
        """One write of the resume (what ``Replay.next_frames`` says), or its commit once
        it says nothing more: the shell's loop, driving the core's own replay."""
        slot, s = self.slots[i], self._session(i)
        r = slot.resume
        assert r is not None
        conn = slot.conns[r.conn]
        replay = r.replay
        started, before = replay.resumed_sent, replay.cursor
        # What the journal holds at this moment (the TTL counted): no notice may name it.
        cutoff = self.now - s.journal.ttl_s
        held = [e.seq for e in s.journal._entries if e.time > cutoff]
        frames = replay.next_frames(self.now)
        if not frames:
            self._commit(i)
            return
        skipped = () if self.replays_audio else slot.audio
        for frame in frames:
            if isinstance(frame, bytes):
                require(self.replays_audio, "audio_replayed", f"a binary frame {frame[:12]!r}")
                seq = int.from_bytes(frame[4:12], "big")
                require(frame[0] == 2 and seq in slot.audio, "bad_audio_frame", repr(frame))
                conn.receive_event(seq, "replay")
                continue
            event = json.loads(frame)
            kind = event["type"]
            if kind == "session.resumed":
                self._check_resumed(i, s, event)
            elif kind == "session.resync_required":
                dropped = event["dropped_through_seq"]
                require(
                    not held or dropped < held[0],
                    "gap_names_held",
                    f"a journal_gap through {dropped} while the journal holds {held}",
                )
                conn.receive_notice(dropped)
            else:
                seq = event["server_event_seq"]
                require(seq not in slot.audio, "bad_audio_frame", f"seq {seq} as text")
                conn.receive_event(seq, "replay", skipped)
        require(
            not started or replay.cursor > before,
            "replay_stalls",
            f"a replay step from seq {before} wrote {frames} and got no further",
        )

    def _check_resumed(self, i: int, s: Session, event: dict[str, Any]) -> None:
        slot = self.slots[i]
        require(event["attachment_generation"] == s.generation + 1, "bad_resumed", str(event))
        require(
            event["last_received_client_event_seq"] == slot.client_seq,
            "bad_client_seq",
            f"{event['last_received_client_event_seq']} != {slot.client_seq}",
        )
        require(  # v2: nothing is consumed before it was received
            0 <= event["consumed_client_event_seq"] <= slot.client_seq,
            "bad_client_seq",
            f"consumed {event['consumed_client_event_seq']} > {slot.client_seq}",
        )
        require(event["resume_token"] == slot.token, "bad_resumed", "not the token issued")

    def _commit(self, i: int) -> None:
        slot, s = self.slots[i], self._session(i)
        r = slot.resume
        assert r is not None
        conn = slot.conns[r.conn]
        old = slot.holder()
        old_gen = s.generation if s.state is State.ATTACHED else None
        commit = s.commit_resume(r.attempt, self.now)
        slot.resume = None
        if commit is None:
            require(
                s.state not in (State.ATTACHED, State.DETACHED),
                "commit_refused",
                f"session {i} still live",
            )
            conn.alive = False  # session_resume_expired, close 4001
            return
        require(commit == Commit(r.attempt.generation, old_gen), "bad_commit", str(commit))
        require(
            s.grace_deadline == math.inf and s.state is State.ATTACHED, "grace_not_cleared", repr(s)
        )
        head = s.journal.head
        skipped = () if self.replays_audio else slot.audio
        require(
            conn.frontier(skipped, head + 1) >= head,
            "incomplete_replay",
            f"switched at seq {conn.last} (gap to {conn.gap_to}), head {head}",
        )
        conn.gen = commit.generation
        slot.unconfirmed = slot.spoke = True
        if old is not None:
            old.replaced = True  # session.replaced, close 4000
            old.alive = False
        before = session_key(s, self.now)
        require(
            s.commit_resume(r.attempt, self.now) is None
            and s.abort_resume(r.attempt, self.now) is None
            and session_key(s, self.now) == before,
            "stale_attempt",
            "a finished attempt changed the session",
        )

    def _abort(self, i: int, got_resumed: bool) -> None:
        slot, s = self.slots[i], self._session(i)
        r = slot.resume
        assert r is not None
        gen = s.generation
        self._terminal(i, s.abort_resume(r.attempt, self.now), "abort_resume")
        slot.resume = None
        slot.conns[r.conn].alive = False
        require(
            s.resume is None and s.generation == gen == r.attempt.generation - 1,
            "abort_changed_attachment",
            repr(s),
        )
        if not got_resumed:
            slot.token = r.prev_token

    def do_resume_fail(self, i: int) -> None:
        """The resuming connection died after ``session.resumed`` reached the client."""
        self._abort(i, got_resumed=True)

    def do_resume_cancel(self, i: int) -> None:
        """The resume was cancelled before ``session.resumed`` reached the client."""
        self._abort(i, got_resumed=False)

    def do_emit(self, i: int, pad: int = 0) -> None:
        slot, s = self.slots[i], self._session(i)
        event: dict[str, Any] = {"type": "e"}
        if pad:
            event["pad"] = "é" * pad
        head = s.journal.head
        emitted = s.emit(event, self.now)
        live = s.state in (State.OPENING, State.ATTACHED, State.DETACHED)
        require((emitted is None) != live, "bad_emit", f"{s.state}: {emitted}")
        if emitted is None:
            require(s.journal.head == head, "emit_after_end", "journal moved")
            return
        seq = s.journal.head
        require(
            seq == head + 1 and json.loads(emitted.frame)["server_event_seq"] == seq,
            "bad_seq",
            str(emitted.frame),
        )
        holder = slot.holder()
        if holder is None:
            return
        if emitted.notice is not None:
            notice = json.loads(emitted.notice)
            require(
                notice["dropped_through_seq"] in (seq - 1, seq), "bad_notice", str(emitted.notice)
            )
            holder.receive_notice(notice["dropped_through_seq"])
        holder.receive_event(seq, "live", () if self.replays_audio else slot.audio)

    def do_emit_audio(self, i: int) -> None:
        """The engine's output audio, journaled as a binary-lane (kind 2) frame. A client
        that replays audio receives it as an event; one that does not (a call's) hears it
        on its media track and never learns its seq."""
        slot, s = self.slots[i], self._session(i)
        head = s.journal.head
        emitted = s.emit_audio(b"\x00\x01", self.now)
        live = s.state in (State.OPENING, State.ATTACHED, State.DETACHED)
        require((emitted is None) != live, "bad_emit", f"{s.state}: {emitted}")
        if emitted is None:
            require(s.journal.head == head, "emit_after_end", "journal moved")
            return
        seq = s.journal.head
        frame = emitted.frame
        require(
            seq == head + 1
            and isinstance(frame, bytes)
            and frame[0] == 2
            and int.from_bytes(frame[4:12], "big") == seq,
            "bad_seq",
            repr(frame),
        )
        slot.audio = (*slot.audio, seq)
        holder = slot.holder()
        if holder is None:
            return
        if emitted.notice is not None:
            holder.receive_notice(json.loads(emitted.notice)["dropped_through_seq"])
        if self.replays_audio:
            holder.receive_event(seq, "live")

    def _send(self, i: int, event: dict[str, Any], room: bool = True) -> Decision:
        """A client event on the attached connection, through the protocol machine. The
        first one after a resume shows the client holds the token issued there: the one
        it presented dies (unless a newer resume has issued a newer token since: then
        that one's rule holds)."""
        slot, s = self.slots[i], self._session(i)
        holder = slot.holder()
        assert holder is not None
        idle = s.idle_deadline
        decision = client_events(s, room).receive(event, 10, holder.gen, self.now)
        require(
            s.idle_deadline == self.now + s.limits.idle_ttl_s or s.state is not State.ATTACHED,
            "idle_not_restarted",
            f"{idle} -> {s.idle_deadline} at {self.now}",
        )
        slot.spoke = True
        if slot.unconfirmed:
            slot.unconfirmed = False
            slot.presented = None
        return decision

    def do_ack(self, i: int, seq: object = None) -> None:
        """The attached connection acks what it received (or ``seq``, valid or not)."""
        slot, s = self.slots[i], self._session(i)
        holder = slot.holder()
        assert holder is not None
        seq = holder.last if seq is None else seq
        valid = type(seq) is int and 0 <= seq <= s.journal.head
        decision = self._send(i, {"type": "session.event_ack", "server_event_seq": seq})
        if decision is IGNORE:
            require(valid, "bad_ack_accepted", repr(seq))
            return
        error = _error(decision)
        require(
            not valid and error["code"] == "invalid_event_ack" and decision.close_code is None,
            "ack_refused",
            f"{error['code']} for {seq!r}",
        )

    def do_heartbeat(self, i: int) -> None:
        s = self._session(i)
        before = (s.client_seq, s.journal.head, s.state)
        decision = self._send(i, {"type": "session.heartbeat"})
        require(
            decision.action is Do.REPLY
            and decision.frame is not None
            and json.loads(decision.frame) == {"type": "session.heartbeat_ack", "session_id": s.id}
            and (s.client_seq, s.journal.head, s.state) == before,
            "bad_heartbeat",
            str(decision),
        )

    def do_client_event(self, i: int, seq: int, taken: bool = True, bad: bool = False) -> None:
        """A client event bound for the engine with ``client_event_seq``; ``taken``
        False: the engine's queue has no room (refused, retryable: its seq is not taken);
        ``bad``: the engine's check refuses it (for good: the next seq is taken).

        Protocol v2: only the next seq is new; a resend is dropped silently; one further
        ahead is refused, retryable, naming the seq expected, and nothing changes."""
        slot, s = self.slots[i], self._session(i)
        expected = slot.client_seq + 1
        event: dict[str, Any] = {"type": "e", "client_event_seq": seq}
        if bad:
            event["bad"] = True
        decision = self._send(i, event, room=taken)
        if bad:  # the checks come first, whatever the seq
            error = _error(decision)
            require(
                error["code"] == "bad_event"
                and error["client_event_seq"] == seq
                and decision.consumed == (seq == expected),
                "bad_refusal",
                str(decision),
            )
            if seq == expected:
                slot.client_seq = seq
        elif seq > expected:
            error = _error(decision)
            require(
                error["code"] == "unexpected_client_event_seq"
                and error["retryable"]
                and error["expected_client_event_seq"] == expected
                and error["client_event_seq"] == seq
                and not decision.consumed,
                "bad_client_seq",
                f"{seq} refused: {error}",
            )
        elif seq < expected:
            require(decision is IGNORE, "resend_taken", f"{seq}: {decision}")
        elif taken:
            require(decision is TO_ENGINE, "next_seq_refused", f"{seq}: {decision}")
            slot.client_seq = seq
        else:
            error = _error(decision)
            require(
                error["code"] == "input_backpressure" and not decision.consumed,
                "bad_backpressure",
                str(decision),
            )
        require(s.client_seq == slot.client_seq, "bad_client_seq", f"{s.client_seq}")

    def do_stale_event(self, i: int, c: int) -> None:
        """A late event from a connection that no longer holds the session: fenced off."""
        slot, s = self.slots[i], self._session(i)
        conn = slot.conns[c]
        before = session_key(s, self.now), s.usage.events_in
        next_seq = {"type": "e", "client_event_seq": s.client_seq + 1}
        for event in (next_seq, {"type": "session.close"}, {"type": "session.heartbeat"}):
            decision = client_events(s).receive(event, 10, conn.gen, self.now)
            require(decision is IGNORE, "stale_event_taken", f"{event}: {decision}")
        require((session_key(s, self.now), s.usage.events_in) == before, "stale_event_moved", "")

    def do_close(self, i: int) -> None:
        s = self._session(i)
        decision = self._send(i, {"type": "session.close"})
        terminal = decision.terminal
        require(
            decision.action is Do.END
            and terminal is not None
            and terminal.generation == s.generation
            and terminal.reason == "client_close",
            "bad_close",
            str(decision),
        )
        self._terminal(i, terminal, "client close")

    def do_engine_end(self, i: int, error: bool = False) -> None:
        """The engine returned (``engine_finished``) or raised (``engine_error``)."""
        s = self._session(i)
        attached = s.generation if s.state is State.ATTACHED else None
        terminal = s.begin_close(Reason.ENGINE_ERROR if error else Reason.ENGINE_FINISHED, self.now)
        require(
            terminal is not None
            and terminal.generation == attached
            and terminal.close_code == (1011 if error else 1000),
            "bad_engine_end",
            str(terminal),
        )
        self._terminal(i, terminal, "engine end")

    def _expire(self, i: int, deadline: float) -> None:
        self.now = max(self.now, deadline)
        self.do_timer(i)

    def do_expire_grace(self, i: int) -> None:
        self._expire(i, self._session(i).grace_deadline)

    def do_expire_idle(self, i: int) -> None:
        self._expire(i, self._session(i).idle_deadline)

    def do_advance(self, dt: float) -> None:
        self.now += dt

    def do_timer(self, i: int) -> None:
        """The session's timer fires (``poll``)."""
        s = self._session(i)
        due = (
            s.resume is None
            and s.state in (State.ATTACHED, State.DETACHED)
            and (self.now >= s.next_deadline())
        )
        reason = Reason.GRACE_EXPIRED if s.state is State.DETACHED else Reason.IDLE_EXPIRED
        terminal = s.poll(self.now)
        require((terminal is not None) == due, "bad_poll", f"{terminal} with due={due}")
        if terminal is not None:
            require(
                terminal.reason == reason and terminal.event["type"] == "session.expired",
                "bad_expiry",
                str(terminal),
            )
        self._terminal(i, terminal, "poll")

    def do_teardown(self, i: int) -> None:
        """The runner finished: release the slot, then send the terminal to its attachment."""
        slot, s = self.slots[i], self._session(i)
        terminal = s.terminal
        require(self.registry.release(s), "release_refused", repr(s))
        require(not self.registry.release(s), "double_release", repr(s))
        slot.status = "released"
        assert terminal is not None
        for conn in slot.conns:
            if conn.gen and conn.gen == terminal.generation and conn.alive:
                conn.terminal += 1
                require(conn.terminal == 1, "two_terminals_delivered", f"session {i}")
                conn.alive = False
            require(
                not (conn.alive and conn.gen == s.generation),
                "terminal_undelivered",
                f"session {i} ended ({terminal.reason}) but its connection holding "
                f"generation {conn.gen} is not sent the terminal event "
                f"(Terminal.generation={terminal.generation})",
            )

    # -- invariants of a state -----------------------------------------------------------

    def check(self) -> None:
        reg = self.registry
        open_slots = sum(slot.status in ("opening", "open") for slot in self.slots)
        require(
            reg.slots_held <= reg.limits.max_sessions,
            "slots_over_max",
            f"{reg.slots_held} > {reg.limits.max_sessions}",
        )
        require(
            reg.slots_held == open_slots == len(reg.sessions),
            "slot_leak",
            f"held {reg.slots_held}, sessions not torn down {open_slots}",
        )
        for i, slot in enumerate(self.slots):
            s = slot.session
            if s is None:
                continue
            ended = s.state in (State.CLOSING, State.CLOSED)
            require(
                slot.terminals == (1 if ended else 0) and (s.terminal is not None) == ended,
                "terminal_count",
                f"session {i} {s.state}: {slot.terminals} terminals",
            )
            if s.state in (State.ATTACHED, State.DETACHED):
                require(slot.hs, "resumable_before_handshake", f"session {i} is {s.state}")
                if slot.token is not None:
                    require(s.credentials.check(slot.token), "client_token_dead", f"session {i}")
                require(
                    s.grace_deadline != math.inf or s.state is State.ATTACHED,
                    "no_grace",
                    f"session {i}",
                )
                require(
                    s.grace_deadline == math.inf or s.state is State.DETACHED,
                    "grace_while_attached",
                    f"session {i}",
                )
                valid = {slot.presented, slot.issued[-1]} - {None}
                for age, token in enumerate(reversed(slot.issued)):
                    require(
                        s.credentials.check(token) == (token in valid),
                        "token_rule",
                        f"session {i}: token of age {age} valid={token not in valid}",
                    )
            gens = [c.gen for c in slot.conns if c.gen]
            require(len(gens) == len(set(gens)), "shared_generation", f"session {i}: {gens}")
            if slot.resume is not None:
                require(
                    s.next_deadline() == math.inf and s.poll(self.now) is None,
                    "timer_during_resume",
                    f"session {i}",
                )
            j = s.journal
            entries = list(j._entries)
            require(
                j.bytes == sum(frame_size(e.frame) for e in entries) <= j.max_bytes,
                "journal_bytes",
                f"{j.bytes} of {j.max_bytes}",
            )
            require(
                j.floor == (entries[0].seq - 1 if entries else j.head)
                and j.floor >= max(j.dropped_through, j.acked_through),
                "journal_floor",
                f"floor {j.floor}",
            )
            if entries:
                seqs = [e.seq for e in entries]
                require(
                    seqs == list(range(seqs[0], j.head + 1))
                    and seqs[0] > max(j.dropped_through, j.acked_through),
                    "journal_shape",
                    f"{seqs}, head {j.head}",
                )

    def probe(self) -> None:
        """Calls that must be refused, or be no-ops, in this state: none may change it."""
        for i, slot in enumerate(self.slots):
            s = slot.session
            if s is None:
                continue
            before = session_key(s, self.now), slot.credentials_key(s)
            probes = self._probes(slot, s)
            for name, expected, call in probes:
                try:
                    result = call()
                except ProtocolError as exc:
                    result = exc.code
                require(
                    any(result == e for e in expected),
                    "probe_result",
                    f"session {i}, {name}: {result}",
                )
            require(
                (session_key(s, self.now), slot.credentials_key(s)) == before,
                "probe_changed_state",
                f"session {i}: one of {[p[0] for p in probes]}",
            )

    def _probes(self, slot: Slot, s: Session) -> list[tuple[str, set[Any], Any]]:
        now, nothing = self.now, {None, False}
        probes: list[tuple[str, set[Any], Any]] = []
        for gen in (s.generation - 1, s.generation + 1):
            require(not s.is_current(gen), "stale_is_current", f"generation {gen}")
            if gen >= 1:
                probes.append((f"detach({gen})", nothing, partial(s.detach, gen, now)))
        for conn in slot.conns:
            if conn.reports:  # a later report of the same loss (the other side, or late)
                probes.append(
                    (f"detach({conn.gen}) again", nothing, partial(s.detach, conn.gen, now))
                )
        if s.state is State.OPENING:
            probes.append(
                (
                    "resume while opening",
                    {"session_resume_expired"},
                    partial(s.begin_resume, slot.first_token, 0, now),
                )
            )
        probes.append(
            (
                "wrong token",
                {"invalid_resume_token", "session_resume_expired"},
                partial(s.begin_resume, "x" * 43, 0, now),
            )
        )
        if slot.resume is not None and slot.token is not None:
            probes.append(
                (
                    "concurrent resume",
                    {"session_resume_conflict", "session_resume_expired"},
                    partial(s.begin_resume, slot.token, 0, now),
                )
            )
        for bad in (s.journal.head + 1, -1, True):
            probes.append((f"ack({bad!r})", {"invalid_event_ack"}, partial(s.ack, bad)))
        if s.state in (State.CLOSING, State.CLOSED):
            probes.append(
                ("begin_close again", nothing, partial(s.begin_close, Reason.CLIENT_CLOSE, now))
            )
            probes.append(("emit after end", nothing, partial(s.emit, {"type": "e"}, now)))
            probes.append(("audio after end", nothing, partial(s.emit_audio, b"\x00", now)))
            probes.append(("handshake_failed late", nothing, partial(s.handshake_failed, now)))
            probes.append(
                ("handshake_delivered late", nothing, partial(s.handshake_delivered, now))
            )
        return probes


@attrs.define
class Report:
    max_sessions: int
    depth: int
    sequences: int = 0
    """Distinct action sequences of length 1..depth, every one checked step by step."""
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    """Wall-clock time of the search."""
    cpu_seconds: float = 0.0
    violations: dict[str, tuple[list[Action], str]] = attrs.field(factory=dict)
    """Invariant name -> (a shortest action sequence, what went wrong)."""


def explore(
    depth: int,
    max_sessions: int,
    *,
    sessions: int = 2,
    big: bool = False,
    engine_end: bool = False,
    from_zero: bool = False,
    audio: bool = False,
    replays_audio: bool = True,
    stop_at_first: bool = False,
) -> Report:
    """Breadth-first over every interleaving up to ``depth`` actions, states deduplicated.

    Levels are explored in order, so the first violation found is a shortest one; with
    ``stop_at_first`` the search ends there (the counts then cover a partial search).
    ``audio``: engines also emit output audio; ``replays_audio`` False: a resume does not
    write it again (a call's dialect).
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    report = Report(max_sessions, depth)
    root = World(max_sessions, sessions, replays_audio=replays_audio)
    root.check()
    root_key = root.key()
    parent: dict[Any, tuple[Any, Action] | None] = {root_key: None}
    succ: dict[Any, list[Any]] = {}
    frontier = [(root_key, root)]

    def path(key: Any) -> list[Action]:
        out: list[Action] = []
        while (link := parent[key]) is not None:
            key, action = link
            out.append(action)
        return out[::-1]

    for _level in range(depth):
        next_frontier = []
        for key, world in frontier:
            kids: list[Any] = []
            acts = world.actions(big=big, engine_end=engine_end, audio=audio)
            if from_zero:
                acts += [("resume", a[1], True) for a in acts if a[0] == "resume"]
            for action in acts:
                report.transitions += 1
                w = world.clone()
                try:
                    w.step(action)
                    k = w.key()
                    if k not in parent:
                        w.check()
                        w.probe()
                except Violation as v:
                    report.violations.setdefault(v.name, ([*path(key), action], v.detail))
                    if stop_at_first:
                        report.states = len(parent)
                        report.seconds = time.perf_counter() - started
                        report.cpu_seconds = time.process_time() - cpu_started
                        return report
                    kids.append(None)
                    continue
                kids.append(k)
                if k not in parent:
                    parent[k] = (key, action)
                    next_frontier.append((k, w))
            succ[key] = kids
        frontier = next_frontier
    report.states = len(parent)
    # Count the action sequences the deduplicated search covered, level by level.
    ways: dict[Any, int] = {root_key: 1}
    for _level in range(depth):
        nxt: dict[Any, int] = {}
        for key, n in ways.items():
            for kid in succ.get(key, ()):
                report.sequences += n
                if kid is not None:
                    nxt[kid] = nxt.get(kid, 0) + n
        ways = nxt
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started
    return report


def replay(
    actions: Iterable[Action], max_sessions: int, sessions: int = 2, *, replays_audio: bool = True
) -> World:
    """Run one action sequence, checking after every step (raises Violation)."""
    world = World(max_sessions, sessions, replays_audio=replays_audio)
    for action in actions:
        world.step(action)
        world.check()
        world.probe()
    return world


def format_report(r: Report) -> str:
    lines = [
        f"max_sessions={r.max_sessions} depth={r.depth}: {r.sequences:,} interleavings "
        f"(action sequences), {r.states:,} distinct states, {r.transitions:,} transitions, "
        f"{r.seconds:.1f} s ({r.cpu_seconds:.1f} s CPU)"
    ]
    for name, (actions, detail) in sorted(r.violations.items()):
        lines.append(f"  VIOLATION {name} after {len(actions)} actions: {detail}")
        lines.append(f"    {actions}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--max-sessions", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument(
        "--engine-end", action="store_true", help="also let engines finish or fail by themselves"
    )
    parser.add_argument(
        "--big", action="store_true", help="also emit events that alone exceed the journal bound"
    )
    parser.add_argument(
        "--from-zero",
        action="store_true",
        help="also resume with last_received_server_event_seq omitted (0)",
    )
    parser.add_argument(
        "--audio", action="store_true", help="also emit output audio on the binary lane"
    )
    parser.add_argument(
        "--no-audio-replay",
        action="store_true",
        help="resumes skip output audio (a call's dialect, replays_audio False)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="explore the --max-sessions values in parallel processes",
    )
    args = parser.parse_args(argv)
    run = partial(
        explore,
        args.depth,
        sessions=args.sessions,
        big=args.big,
        engine_end=args.engine_end,
        from_zero=args.from_zero,
        audio=args.audio,
        replays_audio=not args.no_audio_replay,
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, len(args.max_sessions)))) as pool:
        reports = list(pool.map(run, args.max_sessions))
    for report in reports:
        print(format_report(report))
    print(
        f"total: {sum(r.sequences for r in reports):,} interleavings, "
        f"{sum(r.states for r in reports):,} states, "
        f"{time.perf_counter() - started:.1f} s wall"
    )
    return 1 if any(r.violations for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
