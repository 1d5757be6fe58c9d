"""The exhaustive interleaving checker (``interleavings.py``) at a small depth, the
regressions it found, and proof that it does catch broken cores (mutations)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_duplex.core.credentials import Credentials, digest, new_token
from trio_duplex.core.events import Reason
from trio_duplex.core.journal import Journal
from trio_duplex.core.protocol import ClientEvents, Decision
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session, State, Terminal

from .interleavings import Violation, World, explore, replay

SMALL_DEPTH = 7


@pytest.mark.parametrize("max_sessions", [1, 2])
def test_every_interleaving_up_to_a_small_depth_keeps_the_invariants(max_sessions: int) -> None:
    report = explore(SMALL_DEPTH, max_sessions)
    assert report.violations == {}
    assert report.states > 1000
    assert report.sequences > report.states  # deduplication covered more than it expanded
    assert report.transitions > report.states


def test_the_search_is_deterministic() -> None:
    first, second = explore(5, 2), explore(5, 2)
    assert (first.sequences, first.states, first.transitions) == (
        second.sequences,
        second.states,
        second.transitions,
    )


def test_two_sessions_with_one_slot_exercise_the_refusal() -> None:
    world = replay([("open", 0), ("open", 1), ("created", 0), ("close", 0)], max_sessions=1)
    assert world.slots[1].status == "idle"  # refused: resource_exhausted
    assert world.registry.slots_held == 1  # closing still holds it
    world = replay(
        [("open", 0), ("created", 0), ("close", 0), ("teardown", 0), ("open", 1)], max_sessions=1
    )
    assert world.slots[1].status == "opening"
    assert world.registry.slots_held == 1


# -- regressions: sequences the checker reported -----------------------------------------


def test_replay_survives_an_ack_from_the_replaced_connection() -> None:
    """Was VIOLATION replay_stalls: the resume's replay loop resent
    resync_required(dropped_through_seq=0) forever once the old connection acked."""
    world = replay(
        [
            ("open", 0),
            ("created", 0),
            ("resume", 0),
            ("resume_step", 0),
            ("emit", 0),
            ("ack", 0),
            ("resume_step", 0),
            ("resume_step", 0),
        ],
        max_sessions=1,
    )
    slot = world.slots[0]
    assert slot.resume is None  # committed
    session = slot.session
    assert session is not None and session.generation == 2
    old, new = slot.conns
    assert (old.last, old.replaced) == (1, True)
    assert (new.gen, new.last, new.gap_to) == (2, 0, 1)  # told explicitly that 1 is gone


def test_shutdown_during_the_handshake_reaches_the_client() -> None:
    """Was VIOLATION terminal_undelivered: a session closed while OPENING addressed its
    terminal event to no attachment, though session.created was then delivered."""
    world = replay([("open", 0), ("shutdown",), ("created", 0), ("teardown", 0)], max_sessions=1)
    conn = world.slots[0].conns[0]
    assert conn.terminal == 1
    assert world.registry.slots_held == 0


def test_overflow_then_resume_is_a_gap_and_then_live_events() -> None:
    world = replay(
        [
            ("open", 0),
            ("created", 0),
            ("lose", 0, 0),
            ("emit", 0),
            ("emit", 0),
            ("emit", 0),
            ("resume", 0),
            ("resume_step", 0),  # session.resumed
            ("resume_step", 0),  # the gap notice through 2, then 3 (still held)
            ("resume_step", 0),  # caught up: commit
            ("emit", 0),
        ],
        max_sessions=1,
    )
    new = world.slots[0].conns[1]
    assert (new.gap_to, new.last) == (2, 4)  # gap through 2, 3 replayed, then 4 live


def test_expiry_racing_a_resume() -> None:
    base: list[tuple[Any, ...]] = [
        ("open", 0),
        ("created", 0),
        ("lose", 0, 0),
        ("resume", 0),
        ("expire_grace", 0),
    ]
    world = replay([*base, ("resume_step", 0), ("resume_step", 0)], max_sessions=1)
    session = world.slots[0].session
    assert session is not None and session.state is State.ATTACHED  # the resume won
    world = replay([*base, ("resume_fail", 0)], max_sessions=1)
    session = world.slots[0].session
    assert session is not None and session.state is State.CLOSING  # the grace won
    assert world.slots[0].terminals == 1


# -- mutations: the checker must catch a broken core ---------------------------------------


def first_violation(depth: int, max_sessions: int = 1) -> tuple[str, list[Any]]:
    report = explore(depth, max_sessions, stop_at_first=True)
    assert len(report.violations) == 1, "the mutation went unnoticed"
    ((name, (actions, _)),) = report.violations.items()
    return name, actions


def test_catches_detach_without_fencing(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Session.detach

    def unfenced(self: Session, generation: int, now: float) -> bool:
        return original(self, self.generation, now)

    monkeypatch.setattr(Session, "detach", unfenced)
    name, actions = first_violation(6)
    assert name in ("stale_detach", "probe_changed_state")
    assert len(actions) <= 6


def test_catches_admission_past_max_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Registry.admit

    def generous(self: Registry, config: dict[str, Any]) -> Any:
        self.slots_held -= 1
        try:
            return original(self, config)
        finally:
            self.slots_held += 1

    monkeypatch.setattr(Registry, "admit", generous)
    name, actions = first_violation(4)
    assert (name, actions) == ("slots_over_max", [("open", 0), ("open", 1)])


def test_catches_the_old_replay_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Journal, "floor", property(lambda self: self.dropped_through))
    name, actions = first_violation(7)
    assert name in ("journal_floor", "replay_stalls")
    assert len(actions) <= 7


def test_catches_the_old_opening_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Session.begin_close

    def nowhere(self: Session, reason: Reason, now: float) -> Terminal | None:
        opening = self.state is State.OPENING
        terminal = original(self, reason, now)
        if terminal is not None and opening:
            self.terminal = terminal = attrs.evolve(terminal, generation=None)
        return terminal

    monkeypatch.setattr(Session, "begin_close", nowhere)
    assert first_violation(5) == (
        "terminal_undelivered",
        [("open", 0), ("shutdown",), ("created", 0), ("teardown", 0)],
    )


def test_catches_a_rotation_that_forgets_the_presented_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def rotate(self: Credentials, presented: str) -> str:
        token = new_token()
        self._current, self._pending = digest(token), None
        return token

    monkeypatch.setattr(Credentials, "rotate", rotate)
    name, _ = first_violation(5)
    assert name in ("token_rule", "client_token_dead", "client_token_refused")


def test_catches_a_commit_that_keeps_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Session.commit_resume

    def sloppy(self: Session, attempt: Any, now: float) -> Any:
        grace = self.grace_deadline
        commit = original(self, attempt, now)
        self.grace_deadline = grace
        return commit

    monkeypatch.setattr(Session, "commit_resume", sloppy)
    name, _ = first_violation(7)
    assert name in ("grace_not_cleared", "grace_while_attached")


@pytest.mark.parametrize("grace", ["always_whole", "always_unconfirmed"])
def test_catches_a_grace_that_ignores_whether_the_client_spoke(
    monkeypatch: pytest.MonkeyPatch, grace: str
) -> None:
    original = Session.detach

    def blind(self: Session, generation: int, now: float) -> bool:
        detached = original(self, generation, now)
        if detached:
            limits = self.limits
            seconds = limits.disconnect_grace_s
            if grace == "always_unconfirmed":
                seconds = min(seconds, limits.unconfirmed_grace_s)
            self.grace_deadline = now + seconds
        return detached

    monkeypatch.setattr(Session, "detach", blind)
    name, actions = first_violation(5)
    assert name == "bad_detach"
    assert actions[-1][0] == "lose"


def test_catches_a_resume_before_the_handshake(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Session.begin_resume

    def eager(self: Session, token: object, last_seq: int, now: float) -> Any:
        if self.state is State.OPENING:
            self.state = State.ATTACHED
            try:
                return original(self, token, last_seq, now)
            finally:
                self.state = State.OPENING
        return original(self, token, last_seq, now)

    monkeypatch.setattr(Session, "begin_resume", eager)
    name, actions = first_violation(3)
    assert (name, actions) == ("probe_result", [("open", 0)])


def test_catches_a_second_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Session.begin_close

    def again(self: Session, reason: Reason, now: float) -> Terminal | None:
        if self.state is State.CLOSING:
            self.state = State.ATTACHED
        return original(self, reason, now)

    monkeypatch.setattr(Session, "begin_close", again)
    name, _ = first_violation(5)
    assert name in ("two_terminals", "probe_result", "probe_changed_state")


def test_catches_a_replay_that_skips_an_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Journal.replay

    def skipping(self: Journal, after: int, now: float) -> Any:
        entries = original(self, after, now)
        return entries[1:] if entries and len(entries) > 1 else entries

    monkeypatch.setattr(Journal, "replay", skipping)
    name, _ = first_violation(9)
    assert name == "silent_gap"


def test_catches_a_replay_that_drops_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker drives the shipped ``Replay``: break it and the checker notices."""
    original = Replay.next_frames

    def hasty(self: Replay, now: float) -> list[str | bytes]:
        frames = original(self, now)
        return frames if not self.resumed_sent or len(frames) <= 1 else frames[:1]

    monkeypatch.setattr(Replay, "next_frames", hasty)
    name, _ = first_violation(8)
    assert name in ("incomplete_replay", "silent_gap")


def test_catches_a_replay_that_never_gets_past_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Journal, "floor", property(lambda self: self.acked_through))
    name, _ = first_violation(9)
    assert name in ("replay_stalls", "journal_floor", "silent_gap", "incomplete_replay")


def test_catches_a_replay_that_gives_up_on_held_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """v1's rule: at a gap, a notice through the head and nothing replayed, though the
    journal still held entries after the gap."""
    original = Replay.next_frames

    def giving_up(self: Replay, now: float) -> list[str | bytes]:
        journal = self.attempt.session.journal
        if self.resumed_sent and not self._pending and journal.replay(self.cursor, now) is None:
            self.cursor = journal.head
            journal.ack(journal.head)
            return [self.attempt.session.resync_frame("journal_gap", journal.head)]
        return original(self, now)

    monkeypatch.setattr(Replay, "next_frames", giving_up)
    name, _ = first_violation(9)
    assert name == "gap_names_held"


def test_a_violation_is_an_exception_with_its_invariant_name() -> None:
    world = World(2)
    world.step(("open", 0))
    world.registry.slots_held += 1  # corrupt the accounting
    with pytest.raises(Violation) as info:
        world.check()
    assert info.value.name == "slot_leak"


# -- mutations of the protocol machine (client events, core/protocol.py) -------------------

OPENED = [("open", 0), ("created", 0)]


def violation(actions: list[Any]) -> str:
    with pytest.raises(Violation) as raised:
        replay(actions, max_sessions=1)
    return raised.value.name


def test_the_client_event_actions_hold_on_the_real_machine() -> None:
    world = replay(
        [
            *OPENED,
            ("client_event", 0, 1),
            ("client_event", 0, 1),  # a resend
            ("client_event", 0, 3),  # a gap
            ("client_event", 0, 2, False),  # no room
            ("client_event", 0, 2, True, True),  # refused for good: the seq is taken
            ("heartbeat", 0),
            ("client_event", 0, 3),
        ],
        max_sessions=1,
    )
    assert world.slots[0].client_seq == 3


def test_catches_a_machine_that_takes_a_resend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Session, "is_new_client_seq", lambda self, seq: True)
    assert violation([*OPENED, ("client_event", 0, 1), ("client_event", 0, 1)]) == "resend_taken"


def test_catches_a_refusal_for_good_that_keeps_the_seq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ClientEvents, "_refused_for_good", lambda self, event: False)
    assert violation([*OPENED, ("client_event", 0, 1, True, True)]) == "bad_refusal"


def test_catches_a_machine_that_hears_a_connection_not_attached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = ClientEvents.receive

    def unfenced(
        self: ClientEvents, event: dict[str, Any], size: int, generation: int, now: float
    ) -> Decision:
        return original(self, event, size, self.session.generation, now)

    monkeypatch.setattr(ClientEvents, "receive", unfenced)
    # The resuming connection (generation 0 until the commit) sends early.
    assert violation([*OPENED, ("resume", 0), ("stale_event", 0, 1)]) == "stale_event_taken"


# -- output audio, and a replay without it (a call's dialect: replays_audio False) ---------

AUDIO_DEPTH = 8


@pytest.mark.parametrize("replays_audio", [True, False])
def test_every_interleaving_with_output_audio_keeps_the_invariants(replays_audio: bool) -> None:
    """Audio frames journaled beside text events: replayed like any event, or (a call)
    never replayed while every text event after the presented seq arrives exactly once."""
    report = explore(AUDIO_DEPTH, 1, audio=True, replays_audio=replays_audio)
    assert report.violations == {}
    assert report.states > 5000


def test_every_interleaving_without_audio_replay_holds_with_batches_of_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one entry a batch, a batch of audio alone is reached at this depth: it must
    not end the replay while text follows."""
    monkeypatch.setattr("trio_duplex.core.replay.BATCH", 1)
    report = explore(AUDIO_DEPTH, 1, audio=True, replays_audio=False)
    assert report.violations == {}


def test_a_resume_without_audio_replays_the_text_after_the_seq_once() -> None:
    world = replay(
        [
            ("open", 0),
            ("created", 0),
            ("emit", 0),  # 1: received
            ("emit_audio", 0),  # 2: played live; its seq is never known to the client
            ("lose", 0, 0),
            ("emit_audio", 0),  # 3: made while detached
            ("emit", 0),  # 4
            ("emit_audio", 0),  # 5
            ("resume", 0),  # presents 1
            ("resume_step", 0),  # session.resumed
            ("resume_step", 0),  # 4 only
            ("resume_step", 0),  # caught up: commit
            ("emit", 0),  # 6, live
        ],
        max_sessions=1,
        replays_audio=False,
    )
    old, new = world.slots[0].conns
    assert (old.last, new.gen, new.last) == (1, 2, 6)
    assert world.slots[0].audio == (2, 3, 5)


def test_catches_a_replay_that_ignores_the_audio_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Replay.next_frames

    def heedless(self: Replay, now: float) -> list[str | bytes]:
        self.audio = True
        return original(self, now)

    monkeypatch.setattr(Replay, "next_frames", heedless)
    report = explore(AUDIO_DEPTH, 1, audio=True, replays_audio=False, stop_at_first=True)
    assert list(report.violations) == ["audio_replayed"]


def test_catches_a_replay_that_commits_after_a_batch_of_audio_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Filtering each batch's audio out after the fact answers [] for a batch of audio
    alone, which commits the resume before the text after it is written."""
    original = Replay.next_frames

    def filtering(self: Replay, now: float) -> list[str | bytes]:
        if self.audio:
            return original(self, now)
        self.audio = True
        try:
            frames = original(self, now)
        finally:
            self.audio = False
        return [frame for frame in frames if isinstance(frame, str)]

    monkeypatch.setattr(Replay, "next_frames", filtering)
    monkeypatch.setattr("trio_duplex.core.replay.BATCH", 1)
    report = explore(AUDIO_DEPTH, 1, audio=True, replays_audio=False, stop_at_first=True)
    ((name, (actions, _)),) = report.violations.items()
    assert name == "incomplete_replay"
    assert ("emit_audio", 0) in actions
