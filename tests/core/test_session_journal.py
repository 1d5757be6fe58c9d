"""docs/protocol.md, Events and the journal, on the core's objects: a session's numbering,
acks, the byte and TTL bounds with their notices, what a resume replays (``Replay``) and
``client_event_seq`` across a resume. No trio, time as a number; the engine is the echo
engine's answer (``response.output_text.delta`` of the text) emitted by hand. What goes
on the wire end to end: tests/server/test_protocol_journal.py."""

from __future__ import annotations

import json
from typing import Any

import attrs

from trio_duplex.core.events import ErrorCode
from trio_duplex.core.limits import Limits
from trio_duplex.core.protocol import IGNORE, TO_ENGINE, ClientEvents, Decision
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session
from trio_duplex.core.wire import ConfigBudget, ProtocolError
from trio_duplex.dialects import NATIVE

TEXT = "input.text.append"
GAP = "journal_gap"
OVERFLOW = "journal_overflow"


class Rules:
    """The echo engine's check: it takes text, which must be a string."""

    accepts = frozenset({TEXT})

    def check(self, event: dict[str, Any]) -> None:
        if not isinstance(event.get("text"), str):
            raise ProtocolError(ErrorCode.BAD_EVENT, "text must be a string", param="text")


@attrs.define
class Opened:
    registry: Registry
    session: Session
    token: str

    def events(self) -> ClientEvents:
        """The session's client-event machine on its current attachment (room always)."""
        budget = ConfigBudget.of(self.session.config, 64 * 1024)
        return ClientEvents(self.session, Rules(), budget, lambda size: True)

    def receive(self, event: dict[str, Any], now: float = 0.0) -> Decision:
        return self.events().receive(event, 10, self.session.generation, now)

    def echo(self, text: str = "x", now: float = 0.0) -> dict[str, Any]:
        """The engine's answer to ``text``: its frame as sent live (no overflow)."""
        emitted = self.session.emit(answer(text), now)
        assert emitted is not None and emitted.notice is None, emitted
        event: dict[str, Any] = json.loads(emitted.frame)
        return event

    def resume(
        self, last_seq: int, now: float = 0.0, token: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Cut the connection and resume at ``last_seq``: ``session.resumed`` and every
        event the replay writes after it (the resume is then committed)."""
        session = self.session
        session.detach(session.generation, now)
        attempt = session.begin_resume(self.token if token is None else token, last_seq, now)
        writes = [json.loads(f) for frames in iter_writes(Replay(attempt), now) for f in frames]
        assert session.commit_resume(attempt, now) is not None
        self.token = attempt.new_token
        resumed, *replayed = writes
        assert resumed["type"] == "session.resumed"
        return resumed, replayed


def iter_writes(replay: Replay, now: float) -> list[list[str | bytes]]:
    writes = []
    while frames := replay.next_frames(now):
        writes.append(frames)
    return writes


def answer(text: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "text": text}


def frame_size(text: str, seq: int) -> int:
    """Compact-JSON UTF-8 size of the echo answer to ``text`` as event ``seq``."""
    event = {**answer(text), "server_event_seq": seq}
    return len(json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode())


def open_session(registry: Registry | None = None, **limits: Any) -> Opened:
    registry = registry or Registry(Limits(**limits), spelling=NATIVE)
    session, token = registry.admit({})
    session.handshake_delivered(0.0)
    session.touch(0.0)  # its client spoke: the whole grace applies
    return Opened(registry, session, token)


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["server_event_seq"] for e in events]


def notice(reason: str, through: int) -> dict[str, Any]:
    return {"type": "session.resync_required", "reason": reason, "dropped_through_seq": through}


def ack(seq: object) -> dict[str, Any]:
    return {"type": "session.event_ack", "server_event_seq": seq}


def text(seq: int, value: str = "x") -> dict[str, Any]:
    return {"type": TEXT, "text": value, "client_event_seq": seq}


# -- sequence numbers ----------------------------------------------------------------------


def test_engine_events_are_numbered_1_2_3_and_never_reset_by_resume() -> None:
    s = open_session()
    assert [s.echo(str(n))["server_event_seq"] for n in range(3)] == [1, 2, 3]
    for round_ in range(3):
        _, replayed = s.resume(3 + 2 * round_)
        assert replayed == []
        assert s.echo()["server_event_seq"] == 4 + 2 * round_
        assert s.echo()["server_event_seq"] == 5 + 2 * round_


def test_each_session_has_its_own_numbering() -> None:
    a = open_session()
    b = open_session(a.registry)
    assert a.echo()["server_event_seq"] == 1
    assert a.echo()["server_event_seq"] == 2
    assert b.echo()["server_event_seq"] == 1


# -- acks -----------------------------------------------------------------------------------


def test_event_ack_frees_entries_up_to_and_including_the_seq() -> None:
    s = open_session()
    for n in range(5):
        s.echo(str(n))
    journal = s.session.journal
    assert len(journal) == 5
    assert s.receive(ack(3)) is IGNORE  # the ack itself is not answered
    assert len(journal) == 2
    assert s.receive(ack(0)) is IGNORE
    assert len(journal) == 2
    assert s.receive(ack(5)) is IGNORE  # the newest seq is a valid ack
    assert len(journal) == 0
    assert journal.bytes == 0


def test_acked_events_are_not_replayed() -> None:
    s = open_session()
    for n in range(4):
        s.echo(str(n))
    assert s.receive(ack(2)) is IGNORE
    _, replayed = s.resume(2)
    assert seqs(replayed) == [3, 4]


def test_acked_entries_make_room_so_no_overflow_is_reported() -> None:
    size = frame_size("x", 1)
    s = open_session(journal_max_bytes=2 * size + size // 2)
    s.echo()
    s.echo()
    assert s.receive(ack(2)) is IGNORE
    # Without the ack the third event would overflow; with it, no notice comes (``echo``).
    assert s.echo()["server_event_seq"] == 3
    assert s.echo()["server_event_seq"] == 4


# -- the byte bound ---------------------------------------------------------------------------


def test_overflow_notice_comes_with_the_event_and_numbering_goes_on() -> None:
    size = frame_size("x", 1)  # the same for seqs 1-9
    s = open_session(journal_max_bytes=2 * size + size // 2)
    assert s.echo()["server_event_seq"] == 1
    assert s.echo()["server_event_seq"] == 2
    emitted = s.session.emit(answer("x"), 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice) == notice(OVERFLOW, 2)  # sent before the event
    assert json.loads(emitted.frame)["server_event_seq"] == 3  # held: 3
    assert s.echo()["server_event_seq"] == 4  # held: 3, 4
    emitted = s.session.emit(answer("x"), 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice)["dropped_through_seq"] == 4
    assert json.loads(emitted.frame)["server_event_seq"] == 5
    assert len(s.session.journal) == 1


def test_after_overflow_the_held_events_are_replayed_and_the_dropped_are_a_gap() -> None:
    size = frame_size("x", 1)
    s = open_session(journal_max_bytes=2 * size + size // 2)
    s.echo()
    s.echo()
    emitted = s.session.emit(answer("x"), 0.0)  # 3: overflow, 1 and 2 dropped
    assert emitted is not None and emitted.notice is not None
    s.echo()  # seq 4; the journal holds 3, 4
    _, replayed = s.resume(2)
    assert seqs(replayed) == [3, 4]
    # Resume again, with the token that resume issued, and ask for seq 2.
    _, replayed = s.resume(1)
    assert replayed[0] == notice(GAP, 2)  # 2 is lost; 3 and 4 are still held
    assert seqs(replayed[1:]) == [3, 4]
    emitted = s.session.emit(answer("x"), 0.0)
    assert emitted is not None
    assert json.loads(emitted.frame)["server_event_seq"] == 5


def test_event_bigger_than_the_journal_is_delivered_with_its_own_seq_dropped() -> None:
    s = open_session(journal_max_bytes=120)
    s.echo()
    big = "y" * 150
    emitted = s.session.emit(answer(big), 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice) == notice(OVERFLOW, 2)
    event = json.loads(emitted.frame)
    assert (event["text"], event["server_event_seq"]) == (big, 2)  # still delivered live
    # Not journaled, and the older entries are gone too; the next small one fits.
    assert len(s.session.journal) == 0
    assert s.echo()["server_event_seq"] == 3
    _, replayed = s.resume(2)
    assert seqs(replayed) == [3]


def test_first_event_bigger_than_the_journal() -> None:
    s = open_session(journal_max_bytes=50)
    emitted = s.session.emit(answer("z" * 60), 0.0)
    assert emitted is not None and emitted.notice is not None
    assert json.loads(emitted.notice)["dropped_through_seq"] == 1
    assert json.loads(emitted.frame)["server_event_seq"] == 1


def test_overflow_while_detached_is_a_gap_to_the_resume_then_the_survivors_follow() -> None:
    s = open_session(journal_max_bytes=150)
    s.session.detach(1, 0.0)
    for n in range(1, 6):  # journaled; 1-4 overflow, 5 is held
        assert s.session.emit(answer(f"while away {n}"), 0.0) is not None
    assert s.session.journal.floor == 4
    _, replayed = s.resume(0)
    assert replayed[0] == notice(GAP, 4)
    (survivor,) = replayed[1:]
    assert (survivor["text"], survivor["server_event_seq"]) == ("while away 5", 5)
    live = s.session.emit(answer("live"), 0.0)
    assert live is not None
    assert live.notice is None or json.loads(live.notice)["dropped_through_seq"] == 5
    assert (json.loads(live.frame)["text"], json.loads(live.frame)["server_event_seq"]) == (
        "live",
        6,
    )


def test_events_emitted_while_detached_are_replayed_in_order() -> None:
    s = open_session()
    s.session.detach(1, 0.0)
    for n in range(4):
        s.session.emit(answer(str(n)), 1.0)
    _, replayed = s.resume(1, now=2.0)
    assert [(e["text"], e["server_event_seq"]) for e in replayed] == [
        ("1", 2),
        ("2", 3),
        ("3", 4),
    ]


# -- the TTL ---------------------------------------------------------------------------------


def test_entries_older_than_the_ttl_are_dropped_quietly() -> None:
    s = open_session(journal_ttl_s=10)
    s.echo(now=0.0)
    # No notice at the next append (``echo`` asserts it), 11 s later.
    assert s.echo(now=11.0)["server_event_seq"] == 2
    assert len(s.session.journal) == 1


def test_a_resume_that_needs_an_expired_entry_gets_a_gap_then_the_fresh_ones() -> None:
    s = open_session(journal_ttl_s=10)
    s.echo("old", now=0.0)
    s.echo("newer", now=8.0)
    _, replayed = s.resume(0, now=11.0)  # entry 1 is past the TTL, entry 2 is not
    assert replayed[0] == notice(GAP, 1)
    (newer,) = replayed[1:]
    assert (newer["text"], newer["server_event_seq"]) == ("newer", 2)


def test_a_resume_that_needs_only_fresh_entries_is_replayed() -> None:
    s = open_session(journal_ttl_s=10)
    s.echo("old", now=0.0)
    s.echo("newer", now=8.0)
    _, replayed = s.resume(1, now=11.0)
    assert [(e["text"], e["server_event_seq"]) for e in replayed] == [("newer", 2)]


def test_within_the_ttl_everything_is_replayed() -> None:
    s = open_session()  # journal_ttl_s defaults to 60
    s.echo("a", now=0.0)
    _, replayed = s.resume(0, now=25.0)
    assert [e["text"] for e in replayed] == ["a"]


# -- client_event_seq ------------------------------------------------------------------------


def test_last_received_client_event_seq_is_zero_without_any() -> None:
    s = open_session()
    assert s.receive({"type": TEXT, "text": "x"}) is TO_ENGINE
    s.echo()
    resumed, _ = s.resume(1)
    assert resumed["last_received_client_event_seq"] == 0


def test_client_event_seq_survives_resume_and_resends_are_dropped() -> None:
    s = open_session()
    assert s.receive(text(1, "a")) is TO_ENGINE
    assert s.receive(text(2, "b")) is TO_ENGINE
    resumed, _ = s.resume(0)
    assert resumed["last_received_client_event_seq"] == 2
    # The client resends what it is unsure about: 2 is dropped, 3 is new.
    assert s.receive(text(2, "b")) is IGNORE
    assert s.receive(text(3, "c")) is TO_ENGINE
    assert s.session.client_seq == 3
