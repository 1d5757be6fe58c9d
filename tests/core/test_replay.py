"""trio_duplex.core.replay: what a resume writes before it commits, with no I/O."""

from __future__ import annotations

import json
from typing import Any

from trio_duplex.core.frames import BATCH
from trio_duplex.core.limits import Limits
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session
from trio_duplex.dialects import NATIVE


def detached_session(**limits: Any) -> tuple[Session, str]:
    registry = Registry(Limits(**limits), spelling=NATIVE)
    session, token = registry.admit({})
    session.handshake_delivered(0.0)
    session.touch(0.0)  # the client spoke: the whole grace applies
    session.detach(session.generation, 0.0)
    return session, token


def emit(session: Session, count: int, now: float = 0.0, pad: int = 0) -> None:
    for _ in range(count):
        session.emit({"type": "e", "pad": "x" * pad}, now)


def run(replay: Replay, now: float = 0.0) -> list[list[dict[str, Any]]]:
    """Every write the shell would make, as decoded events, until caught up."""
    writes = []
    while frames := replay.next_frames(now):
        writes.append([json.loads(frame) for frame in frames])
    return writes


def test_resumed_first_then_every_entry_after_the_presented_seq_in_batches() -> None:
    session, token = detached_session()
    emit(session, BATCH + 5)
    attempt = session.begin_resume(token, 3, 0.0)
    writes = run(Replay(attempt))
    assert [e["type"] for e in writes[0]] == ["session.resumed"]
    assert writes[0][0]["resume_token"] == attempt.new_token
    assert [len(w) for w in writes[1:]] == [BATCH, 2]
    seqs = [e["server_event_seq"] for w in writes[1:] for e in w]
    assert seqs == list(range(4, BATCH + 6))
    assert session.commit_resume(attempt, 0.0) is not None


def test_nothing_to_replay_is_resumed_then_caught_up() -> None:
    session, token = detached_session()
    emit(session, 2)
    replay = Replay(session.begin_resume(token, 2, 0.0))
    assert [[e["type"] for e in w] for w in run(replay)] == [["session.resumed"]]
    assert replay.cursor == 2


def seqs_of(events: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in events if "server_event_seq" in e]


def test_a_gap_at_the_start_names_the_last_lost_seq_then_replays_what_is_held() -> None:
    session, token = detached_session(journal_max_bytes=200)
    emit(session, 4, pad=60)  # overflows: the oldest entries are dropped
    journal = session.journal
    lost, head = journal.floor, journal.head
    assert 0 < lost < head  # some lost, some still held
    replay = Replay(session.begin_resume(token, 0, 0.0))
    writes = run(replay)
    assert writes[1][0] == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": lost,
    }
    assert seqs_of([e for w in writes[1:] for e in w]) == list(range(lost + 1, head + 1))
    assert journal.acked_through == 0  # nothing held was given up


def test_ttl_expired_oldest_entries_are_named_and_the_newer_ones_replayed_in_order() -> None:
    session, token = detached_session(journal_ttl_s=10.0)
    emit(session, 3, now=0.0)  # 1..3 will have expired at the resume
    emit(session, BATCH + 2, now=8.0)  # 4..BATCH+5 still held
    attempt = session.begin_resume(token, 1, 12.0)  # the client holds 1
    writes = run(Replay(attempt), now=12.0)
    assert [e["type"] for e in writes[0]] == ["session.resumed"]
    assert writes[1][0] == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": 3,
    }
    replayed = [e for w in writes[1:] for e in w][1:]
    assert seqs_of(replayed) == list(range(4, BATCH + 6))
    assert [len(w) for w in writes[1:]] == [1 + BATCH, 2]  # the notice, then batches
    assert session.commit_resume(attempt, 12.0) is not None


def test_an_overflow_while_detached_is_named_and_the_survivors_replayed_in_order() -> None:
    session, token = detached_session(journal_max_bytes=300)
    for _ in range(5):  # each overflow drops every entry before the new one
        assert session.emit({"type": "e", "pad": "x" * 100}, 0.0) is not None
    journal = session.journal
    assert journal.dropped_through == 4 and journal.floor == 4
    emit(session, 2)  # small: 6 and 7 join 5
    writes = run(Replay(session.begin_resume(token, 2, 0.0)))
    (events,) = writes[1:]
    assert events[0] == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": 4,
    }
    assert seqs_of(events[1:]) == [5, 6, 7]


def test_events_journaled_after_a_start_gap_are_replayed() -> None:
    session, token = detached_session(journal_max_bytes=200)
    emit(session, 4, pad=60)
    replay = Replay(session.begin_resume(token, 0, 0.0))
    replay.next_frames(0.0)  # session.resumed
    notice, *held = [json.loads(f) for f in replay.next_frames(0.0)]
    assert notice["dropped_through_seq"] == 3 and seqs_of(held) == [4]
    emit(session, 1)  # while those were being written
    (event,) = [json.loads(f) for f in replay.next_frames(0.0)]
    assert event["server_event_seq"] == 5
    assert replay.next_frames(0.0) == []


def test_a_start_gap_with_nothing_held_names_the_head() -> None:
    session, token = detached_session(journal_ttl_s=10.0)
    emit(session, 3, now=0.0)
    writes = run(Replay(session.begin_resume(token, 0, 20.0)), now=20.0)
    assert writes[1:] == [
        [{"type": "session.resync_required", "reason": "journal_gap", "dropped_through_seq": 3}]
    ]


def test_a_gap_found_part_way_is_announced_through_the_floor() -> None:
    session, token = detached_session(journal_max_bytes=400)
    emit(session, 2)
    replay = Replay(session.begin_resume(token, 0, 0.0))
    replay.next_frames(0.0)  # session.resumed
    assert len(replay.next_frames(0.0)) == 2
    emit(session, 6, pad=100)  # while those were written: the journal overflows
    journal = session.journal
    assert journal.floor > 2
    frames = [json.loads(f) for f in replay.next_frames(0.0)]
    assert frames[0] == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": journal.floor,
    }
    seqs = [e["server_event_seq"] for e in frames[1:]]
    assert seqs == list(range(journal.floor + 1, journal.head + 1))
    assert replay.next_frames(0.0) == []


def test_entries_taken_in_one_look_are_written_whole_even_if_dropped_meanwhile() -> None:
    session, token = detached_session(journal_max_bytes=1 << 20)
    emit(session, BATCH + 2)
    replay = Replay(session.begin_resume(token, 0, 0.0))
    replay.next_frames(0.0)  # session.resumed
    assert len(replay.next_frames(0.0)) == BATCH
    session.journal.ack(BATCH + 2)  # e.g. a late ack: the journal lets them go
    rest = [json.loads(f)["server_event_seq"] for f in replay.next_frames(0.0)]
    assert rest == [BATCH + 1, BATCH + 2]
    assert replay.next_frames(0.0) == []


# -- a replay without audio (a call's: Dialect.replays_audio False) ------------------------


def emit_audio(session: Session, count: int, now: float = 0.0) -> None:
    for n in range(count):
        session.emit_audio(bytes([n % 256]) * 20, now)  # on the binary lane: kind 2


def written(replay: Replay, now: float = 0.0) -> list[list[str | bytes]]:
    """Every write the shell would make, as the frames themselves, until caught up."""
    writes = []
    while frames := replay.next_frames(now):
        writes.append(frames)
    return writes


def test_without_audio_the_text_after_the_seq_is_written_once_and_no_audio_frame() -> None:
    session, token = detached_session(journal_max_bytes=1 << 20)
    emit(session, 2)  # 1, 2: the client has them
    emit_audio(session, 3)  # 3, 4, 5
    emit(session, 1)  # 6
    emit_audio(session, 2)  # 7, 8
    emit(session, 2)  # 9, 10
    emit_audio(session, 1)  # 11: the last entry is audio
    replay = Replay(session.begin_resume(token, 2, 0.0), audio=False)
    writes = written(replay)
    assert [json.loads(f)["type"] for f in writes[0]] == ["session.resumed"]
    frames = [f for w in writes[1:] for f in w]
    assert all(isinstance(f, str) for f in frames)  # not one binary frame
    assert [json.loads(f)["server_event_seq"] for f in frames] == [6, 9, 10]
    assert (replay.audio_dropped, replay.replayed, replay.cursor) == (6, 3, 11)
    assert session.commit_resume(replay.attempt, 0.0) is not None


def test_with_audio_the_same_journal_is_written_whole() -> None:
    session, token = detached_session(journal_max_bytes=1 << 20)
    emit(session, 1)
    emit_audio(session, 2)
    emit(session, 1)
    replay = Replay(session.begin_resume(token, 0, 0.0))
    frames = [f for w in written(replay)[1:] for f in w]
    assert [type(f) for f in frames] == [str, bytes, bytes, str]
    assert (replay.audio_dropped, replay.replayed) == (0, 4)


def test_a_batch_that_is_all_audio_does_not_end_the_replay() -> None:
    """An empty answer commits the resume: a batch of audio alone must not give one
    while text follows it."""
    session, token = detached_session(journal_max_bytes=1 << 20)
    emit_audio(session, 2 * BATCH + 3)
    emit(session, 2)
    replay = Replay(session.begin_resume(token, 0, 0.0), audio=False)
    writes = written(replay)
    assert len(writes) == 2  # session.resumed, then the two texts in one write
    assert [json.loads(f)["server_event_seq"] for f in writes[1]] == [
        2 * BATCH + 4,
        2 * BATCH + 5,
    ]
    assert replay.audio_dropped == 2 * BATCH + 3


def test_audio_alone_after_the_seq_is_caught_up_at_once() -> None:
    session, token = detached_session(journal_max_bytes=1 << 20)
    emit(session, 1)
    emit_audio(session, 5)
    replay = Replay(session.begin_resume(token, 1, 0.0), audio=False)
    assert len(written(replay)) == 1  # session.resumed, and nothing else
    assert (replay.audio_dropped, replay.cursor) == (5, 6)


def test_without_audio_a_gap_is_still_named() -> None:
    session, token = detached_session(journal_max_bytes=120)
    emit(session, 1)
    emit_audio(session, 2)
    emit(session, 6, pad=20)  # the journal overflows: the oldest entries go
    journal = session.journal
    assert journal.floor >= 3
    replay = Replay(session.begin_resume(token, 0, 0.0), audio=False)
    frames = [json.loads(f) for w in written(replay)[1:] for f in w]
    assert frames[0] == {
        "type": "session.resync_required",
        "reason": "journal_gap",
        "dropped_through_seq": journal.floor,
    }
    assert [e["server_event_seq"] for e in frames[1:]] == list(
        range(journal.floor + 1, journal.head + 1)
    )
    assert replay.audio_dropped == 0  # the audio was lost to the overflow, not skipped
