"""The journal (``core/journal.py``) directly: seqs, acks, the byte and TTL bounds, replay."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.journal import Journal, frame_size
from trio_duplex.core.wire import utf8_len
from trio_duplex.dialects.jsonwire import encode


def frame(seq: int, text: str = "") -> str:
    return encode({"type": "e", "text": text, "server_event_seq": seq})


def append(journal: Journal, now: float = 0.0, text: str = "") -> int | None:
    """Append the next event as Session.emit does: stamped, encoded, sized in UTF-8."""
    f = frame(journal.head + 1, text)
    return journal.append(f, utf8_len(f), now)


def seqs(entries: object) -> list[int]:
    assert isinstance(entries, list)
    return [e.seq for e in entries]


def test_seqs_start_at_1_and_replay_returns_the_frames_in_order() -> None:
    journal = Journal(max_bytes=1000, ttl_s=60.0)
    assert journal.head == 0 and len(journal) == 0
    assert journal.replay(0, 0.0) == []
    assert [append(journal) for _ in range(3)] == [None, None, None]
    assert journal.head == 3
    entries = journal.replay(0, 0.0)
    assert seqs(entries) == [1, 2, 3]
    assert entries is not None and [e.frame for e in entries] == [frame(1), frame(2), frame(3)]
    assert seqs(journal.replay(1, 0.0)) == [2, 3]
    assert journal.replay(3, 0.0) == []  # from the head: nothing to replay


def test_ack_frees_entries_and_bytes() -> None:
    journal = Journal(max_bytes=1000, ttl_s=60.0)
    for _ in range(3):
        append(journal)
    size = utf8_len(frame(1))
    journal.ack(0)
    assert len(journal) == 3 and journal.bytes == 3 * size
    journal.ack(2)
    assert len(journal) == 1 and journal.bytes == size
    assert journal.acked_through == 2
    assert journal.dropped_through == 0  # acked entries are not "lost"
    assert seqs(journal.replay(2, 0.0)) == [3]
    assert journal.replay(1, 0.0) is None  # the client presents less than it acked: a gap
    journal.ack(3)
    assert len(journal) == 0 and journal.bytes == 0
    assert journal.floor == 3


def test_size_is_counted_in_utf8_bytes() -> None:
    journal = Journal(max_bytes=1000, ttl_s=60.0)
    text = "é€😀"  # 2 + 3 + 4 bytes in UTF-8, 3 characters
    append(journal, text=text)
    assert journal.bytes == len(frame(1, text).encode("utf-8"))
    assert journal.bytes == len(frame(1, text)) + 1 + 2 + 3


def test_an_event_that_exactly_fills_the_bound_fits() -> None:
    size = utf8_len(frame(1))
    journal = Journal(max_bytes=2 * size, ttl_s=60.0)
    assert append(journal) is None
    assert append(journal) is None
    assert journal.bytes == 2 * size
    assert len(journal) == 2


def test_overflow_drops_through_n_minus_1_and_numbering_goes_on() -> None:
    size = utf8_len(frame(1))
    journal = Journal(max_bytes=2 * size + 1, ttl_s=60.0)
    append(journal)
    append(journal)
    assert append(journal) == 2  # appending 3 would exceed: 1..2 dropped, notice says 2
    assert seqs(journal.replay(2, 0.0)) == [3]
    assert journal.replay(1, 0.0) is None
    assert journal.dropped_through == 2
    assert journal.bytes == size
    assert append(journal) is None  # 3 and 4 fit together
    assert journal.head == 4
    assert seqs(journal.replay(2, 0.0)) == [3, 4]


def test_overflow_counts_multibyte_text_in_bytes_not_characters() -> None:
    text = "é" * 10  # 10 characters, 20 bytes
    size = utf8_len(frame(1, text))
    # Room for two events if characters were counted, only one in bytes.
    journal = Journal(max_bytes=size + len(frame(1, text)), ttl_s=60.0)
    assert append(journal, text=text) is None
    assert append(journal, text=text) == 1


def test_an_event_alone_over_the_bound_is_not_journaled() -> None:
    journal = Journal(max_bytes=100, ttl_s=60.0)
    append(journal)
    assert append(journal, text="x" * 200) == 2  # dropped through N itself
    assert len(journal) == 0 and journal.bytes == 0
    assert journal.head == 2 and journal.dropped_through == 2
    assert journal.replay(0, 0.0) is None
    assert journal.replay(1, 0.0) is None
    assert journal.replay(2, 0.0) == []
    assert append(journal) is None
    assert seqs(journal.replay(2, 0.0)) == [3]


def test_entries_older_than_the_ttl_are_dropped_quietly() -> None:
    journal = Journal(max_bytes=1000, ttl_s=60.0)
    append(journal, now=0.0)
    append(journal, now=30.0)
    assert append(journal, now=61.0) is None  # drops 1 on the way, without a notice
    assert journal.dropped_through == 1
    assert journal.bytes == 2 * utf8_len(frame(2))
    assert journal.replay(0, 61.0) is None  # reported only to a resume that needs it
    assert seqs(journal.replay(1, 61.0)) == [2, 3]
    assert seqs(journal.replay(1, 89.0)) == [2, 3]  # 2 is 59 s old: kept
    assert journal.replay(1, 91.0) is None  # now 2 is older than the TTL too
    assert seqs(journal.replay(2, 91.0)) == [3]


def test_replay_reports_a_gap_only_when_an_entry_after_the_seq_is_missing() -> None:
    size = utf8_len(frame(1))
    journal = Journal(max_bytes=3 * size, ttl_s=60.0)
    for _ in range(4):  # the 4th drops 1..3
        append(journal)
    assert journal.replay(0, 0.0) is None
    assert journal.replay(2, 0.0) is None
    assert seqs(journal.replay(3, 0.0)) == [4]
    assert journal.replay(4, 0.0) == []


def test_floor_is_the_highest_seq_no_longer_held() -> None:
    journal = Journal(max_bytes=1000, ttl_s=60.0)
    assert journal.floor == 0
    append(journal)
    append(journal)
    assert journal.floor == 0
    journal.ack(1)
    assert journal.floor == 1
    journal.ack(2)
    assert journal.floor == 2 and journal.replay(journal.floor, 0.0) == []


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    max_bytes=st.integers(20, 200),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.text(max_size=40)),
            st.tuples(st.just("ack"), st.integers(0, 40)),
            st.tuples(st.just("wait"), st.floats(0.0, 30.0)),
        ),
        max_size=40,
    ),
)
def test_journal_invariants_hold_under_any_sequence(
    max_bytes: int, ops: list[tuple[str, object]]
) -> None:
    journal = Journal(max_bytes=max_bytes, ttl_s=45.0)
    now = 0.0
    lost: set[int] = set()  # seqs the journal said it dropped (notices)
    for op, arg in ops:
        if op == "append":
            assert isinstance(arg, str)
            f = frame(journal.head + 1, arg)
            head = journal.head
            notice = journal.append(f, utf8_len(f), now)
            assert journal.head == head + 1
            if notice is not None:
                assert notice in (head, head + 1)
                lost.update(range(1, notice + 1))
        elif op == "ack":
            assert isinstance(arg, int)
            if arg <= journal.head:
                journal.ack(arg)
        else:
            assert isinstance(arg, float)
            now += arg
        entries = journal._entries
        held = [e.seq for e in entries]
        assert journal.bytes == sum(frame_size(e.frame) for e in entries) <= max_bytes
        if held:
            assert held == list(range(held[0], journal.head + 1))
            assert held[0] > max(journal.dropped_through, journal.acked_through)
            assert not lost.intersection(held)
        assert journal.floor == (held[0] - 1 if held else journal.head)
    # Replay from every point: a full, ordered tail, or None exactly when one is missing.
    for after in range(journal.head + 1):
        entries_after = journal.replay(after, now)
        held = [e.seq for e in journal._entries]
        wanted = list(range(after + 1, journal.head + 1))
        if set(wanted) <= set(held):
            assert entries_after is not None and seqs(entries_after) == wanted
        else:
            assert entries_after is None
