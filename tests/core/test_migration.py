"""core/migration.py driven directly: records out of live sessions, through bytes and back
into a session on another "node" (another Registry), with no trio and time as a number."""

from __future__ import annotations

import base64
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_duplex.core import migration
from trio_duplex.core.events import ErrorCode, Reason
from trio_duplex.core.limits import Limits
from trio_duplex.core.migration import BadRecord, Frozen, Record, export
from trio_duplex.core.opening import Assigned
from trio_duplex.core.replay import Replay
from trio_duplex.core.session import Registry, Session, State
from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import NATIVE


def restore(record: Record, limits: Limits, now: float) -> Session:
    """``migration.restore`` in the native dialect."""
    return migration.restore(record, limits, now, NATIVE)


MAX = 1 << 22
GRACE = 30.0


def limits(**overrides: Any) -> Limits:
    settings: dict[str, Any] = {
        "max_sessions": 4,
        "disconnect_grace_s": GRACE,
        "idle_ttl_s": 300.0,
        "journal_max_bytes": 1 << 20,
        "journal_ttl_s": 600.0,
    }
    settings.update(overrides)
    return Limits(**settings)


def opened(registry: Registry) -> tuple[Session, str]:
    session, token = registry.admit({"voice": "x", "n": [1, 2]}, "alice", True)
    session.handshake_delivered(0.0)
    session.touch(0.0)
    return session, token


def text(n: int) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "text": f"t{n:07d}"}


# Each step on the session: ("text", n) / ("audio", payload) emit; ("ack", k) acks the
# k-th seq from the floor; ("rotate", confirm) resumes with the newest token.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("text"), st.integers(0, 10**6)),
        st.tuples(st.just("audio"), st.binary(max_size=40)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("rotate"), st.booleans()),
    ),
    max_size=40,
)


def build(script: list[tuple[str, Any]], client_seq: int) -> tuple[Session, list[str], list[str]]:
    """A live session after ``script``; its tokens still valid, and the dead ones."""
    session, token = opened(Registry(limits(), spelling=NATIVE))
    tokens = [token]
    for kind, arg in script:
        if kind == "text":
            session.emit(text(arg), 1.0)
        elif kind == "audio":
            session.emit_audio(arg, 1.0)
        elif kind == "ack":
            session.ack(min(session.journal.floor + arg, session.journal.head))
        else:
            attempt = session.begin_resume(tokens[-1], session.journal.acked_through, 1.0)
            assert session.commit_resume(attempt, 1.0) is not None
            tokens.append(attempt.new_token)
            if arg:
                session.touch(1.0)  # the client showed it holds the new token
    session.client_seq = client_seq
    session.consumed_seq = client_seq // 2
    valid = [t for t in tokens if session.credentials.check(t)]
    dead = [t for t in tokens if t not in valid]
    return session, valid, dead


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(steps, st.integers(0, 50), st.one_of(st.binary(max_size=64), st.just({"k": [1, "x"]})))
def test_record_round_trip(
    script: list[tuple[str, Any]], client_seq: int, state: bytes | dict[str, Any]
) -> None:
    session, valid, dead = build(script, client_seq)
    resume_seq = max(0, client_seq - 3)
    record = export(session, Frozen(state, resume_seq))
    again = Record.from_bytes(record.to_bytes(), max_bytes=MAX)
    assert again == record
    assert again.client_seq == resume_seq
    assert again.consumed_seq == min(session.consumed_seq, resume_seq)
    assert [frame for _, frame in again.journal.entries] == [e.frame for e in session.journal]

    moved = restore(again, limits(), now=500.0)
    assert moved.state is State.DETACHED
    assert moved.grace_deadline == 500.0 + GRACE
    assert moved.id == session.id and moved.config == session.config
    assert (moved.principal, moved.config_locked) == ("alice", True)
    assert moved.generation == session.generation
    assert attrs.asdict(moved.usage) == attrs.asdict(session.usage)
    assert (moved.client_seq, moved.consumed_seq) == (again.client_seq, again.consumed_seq)
    journal = moved.journal
    assert (journal.head, journal.dropped_through, journal.acked_through) == (
        session.journal.head,
        session.journal.dropped_through,
        session.journal.acked_through,
    )
    assert [(e.seq, e.frame, e.time) for e in journal] == [
        (e.seq, e.frame, 500.0) for e in session.journal
    ]
    assert journal.bytes == session.journal.bytes
    # Exactly the tokens valid on the old node are valid here.
    for token in valid:
        assert moved.credentials.check(token)
    for token in dead:
        assert not moved.credentials.check(token)
    assert not moved.credentials.check("not-a-token")


def test_a_restored_session_resumes_where_it_was() -> None:
    old, token = opened(Registry(limits(), spelling=NATIVE))
    for n in range(1, 11):
        old.emit(text(n), 1.0)
    old.ack(3)
    for seq in (1, 2, 3, 4, 5):
        assert old.is_new_client_seq(seq)
        old.note_client_seq(seq)
    old.consumed(5)
    # The engine took events 1 to 4; 5 was still queued when it stopped.
    data = export(old, Frozen({"n": 10}, 4)).to_bytes()

    registry = Registry(limits(), spelling=NATIVE)
    moved = restore(Record.from_bytes(data, max_bytes=MAX), registry.limits, now=100.0)
    registry.adopt(moved)
    assert registry.slots_held == 1 and registry.sessions[moved.id] is moved

    attempt = moved.begin_resume(token, 6, 101.0)
    replay = Replay(attempt)
    resumed = orjson.loads(replay.next_frames(101.0)[0])
    assert resumed["last_received_client_event_seq"] == 4
    assert resumed["consumed_client_event_seq"] == 4  # capped at the resume point
    frames = replay.next_frames(101.0)
    assert [orjson.loads(f)["server_event_seq"] for f in frames] == [7, 8, 9, 10]
    assert replay.next_frames(101.0) == []
    assert moved.commit_resume(attempt, 101.0) is not None
    # Output numbering goes on; client numbering goes on from the resume point.
    emitted = moved.emit(text(11), 102.0)
    assert emitted is not None and orjson.loads(emitted.frame)["server_event_seq"] == 11
    assert not moved.is_new_client_seq(4)
    assert moved.is_new_client_seq(5)
    with pytest.raises(ProtocolError) as info:
        moved.is_new_client_seq(6)
    assert info.value.code == ErrorCode.UNEXPECTED_CLIENT_EVENT_SEQ
    # The token it resumed with is valid until the client shows it holds the new one.
    assert moved.credentials.check(token) and moved.credentials.check(attempt.new_token)
    moved.touch(102.0)
    assert not moved.credentials.check(token)


def test_a_restored_session_expires_after_its_grace() -> None:
    old, _ = opened(Registry(limits(), spelling=NATIVE))
    record = export(old, Frozen(b"", 0))
    moved = restore(record, limits(), now=10.0)
    assert moved.poll(10.0 + GRACE - 0.001) is None
    terminal = moved.poll(10.0 + GRACE)
    assert terminal is not None and terminal.reason == "disconnect_grace_expired"


def test_a_tighter_journal_drops_the_oldest_entries_and_says_so() -> None:
    old, token = opened(Registry(limits(), spelling=NATIVE))
    for n in range(1, 21):
        old.emit(text(n), 1.0)
    last_five = sum(entry.size for entry in old.journal if entry.seq > 15)
    moved = restore(export(old, Frozen(b"", 0)), limits(journal_max_bytes=last_five), 2.0)
    assert [e.seq for e in moved.journal] == [16, 17, 18, 19, 20]
    assert moved.journal.dropped_through == 15
    attempt = moved.begin_resume(token, 0, 3.0)
    replay = Replay(attempt)
    replay.next_frames(3.0)  # session.resumed
    gap, *rest = replay.next_frames(3.0)
    assert orjson.loads(gap)["dropped_through_seq"] == 15
    assert [orjson.loads(f)["server_event_seq"] for f in rest] == [16, 17, 18, 19, 20]


def test_export_refuses_a_resume_in_progress_and_an_ended_session() -> None:
    session, token = opened(Registry(limits(), spelling=NATIVE))
    attempt = session.begin_resume(token, 0, 1.0)
    with pytest.raises(ValueError, match="resume"):
        export(session, Frozen(b"", 0))
    session.abort_resume(attempt, 1.0)
    export(session, Frozen(b"", 0))
    session.begin_close(Reason.CLIENT_CLOSE, 2.0)
    with pytest.raises(ValueError):
        export(session, Frozen(b"", 0))


def test_adopt_refuses_as_admit_does_and_a_session_already_here() -> None:
    source, _ = opened(Registry(limits(), spelling=NATIVE))
    record = export(source, Frozen(b"", 0))
    registry = Registry(limits(max_sessions=1), spelling=NATIVE)
    registry.adopt(restore(record, registry.limits, 0.0))
    with pytest.raises(ProtocolError) as here:
        registry.adopt(restore(record, registry.limits, 0.0))
    assert here.value.code == ErrorCode.SESSION_RESUME_CONFLICT
    other, _ = opened(Registry(limits(), spelling=NATIVE))
    with pytest.raises(ProtocolError) as full:
        registry.adopt(restore(export(other, Frozen(b"", 0)), registry.limits, 0.0))
    assert full.value.code == ErrorCode.RESOURCE_EXHAUSTED
    draining = Registry(limits(), spelling=NATIVE)
    draining.shutting_down = True
    with pytest.raises(ProtocolError) as down:
        draining.adopt(restore(record, draining.limits, 0.0))
    assert down.value.code == ErrorCode.SERVER_SHUTTING_DOWN
    assert draining.slots_held == 0
    with pytest.raises(ValueError):  # only a detached session
        Registry(limits(), spelling=NATIVE).adopt(source)
    # Adopted, it ends and frees its slot like any session.
    adopted = registry.sessions[source.id]
    assert adopted.begin_close(Reason.CLIENT_CLOSE, 1.0) is not None
    assert registry.release(adopted) and registry.slots_held == 0


def test_a_record_shows_no_secret_in_its_repr() -> None:
    session, _ = opened(Registry(limits(), spelling=NATIVE))
    session.emit(text(1), 1.0)
    record = export(session, Frozen({"secret": "engine-state"}, 0))
    shown = repr(record) + repr(Frozen({"secret": "engine-state"}, 0)) + repr(record.journal)
    current, pending = session.credentials.digests()
    assert pending is None
    for secret in (current.hex(), base64.b64encode(current).decode(), "engine-state", "t0000001"):
        assert secret not in shown
    assert "secret" not in repr(session.credentials)


def test_from_bytes_refuses_what_is_over_its_bound_or_of_another_format() -> None:
    session, _ = opened(Registry(limits(), spelling=NATIVE))
    data = export(session, Frozen(b"x", 0)).to_bytes()
    assert Record.from_bytes(data, max_bytes=len(data)).session_id == session.id
    with pytest.raises(BadRecord, match="bound"):
        Record.from_bytes(data, max_bytes=len(data) - 1)
    doc = orjson.loads(data[len(migration.MAGIC) :])
    for version in (2, 0, True, 1.0, "1", None):
        with pytest.raises(BadRecord):
            Record.from_bytes(migration.MAGIC + orjson.dumps({**doc, "v": version}), max_bytes=MAX)
    with pytest.raises(BadRecord):
        Record.from_bytes(orjson.dumps(doc), max_bytes=MAX)  # no magic


def test_to_bytes_refuses_a_state_that_is_not_json() -> None:
    session, _ = opened(Registry(limits(), spelling=NATIVE))
    with pytest.raises(ValueError, match="JSON"):
        export(session, Frozen({"x": {1, 2}}, 0)).to_bytes()


def _valid_bytes() -> bytes:
    session, _, _ = build([("text", 1), ("audio", b"\x00\x01"), ("rotate", False)], 3)
    carried = (({"type": "input_audio_buffer.append", "audio": b"\x01\x02"}, 0),)
    return export(session, Frozen({"a": 1}, 2, carried)).to_bytes()


VALID = _valid_bytes()
VALID_DOC = orjson.loads(VALID[len(migration.MAGIC) :])


def _parses_or_refuses(data: bytes) -> None:
    try:
        record = Record.from_bytes(data, max_bytes=MAX)
    except BadRecord:
        return
    assert Record.from_bytes(record.to_bytes(), max_bytes=MAX) == record
    restore(record, limits(), 0.0)  # what parses can be restored


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_from_bytes_of_arbitrary_bytes_raises_only_bad_record(data: bytes) -> None:
    _parses_or_refuses(data)
    _parses_or_refuses(migration.MAGIC + data)


@settings(max_examples=300)
@given(st.data())
def test_from_bytes_of_mutated_records_raises_only_bad_record(data: st.DataObject) -> None:
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del raw[at : at + data.draw(st.integers(1, 8))]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    _parses_or_refuses(bytes(raw))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


PATHS = _paths(VALID_DOC)[1:]


@settings(max_examples=400)
@given(st.sampled_from(PATHS), json_values, st.booleans())
def test_from_bytes_of_records_with_a_field_changed_raises_only_bad_record(
    path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    doc = orjson.loads(VALID[len(migration.MAGIC) :])
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    _parses_or_refuses(migration.MAGIC + orjson.dumps(doc))


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_what_nests_too_deeply_to_serialize_again_is_refused() -> None:
    session, _ = opened(Registry(limits(), spelling=NATIVE))
    deepest = _nested(migration.MAX_DEPTH)
    record = export(session, Frozen(deepest, 0))
    assert Record.from_bytes(record.to_bytes(), max_bytes=MAX) == record
    with pytest.raises(ValueError, match="nested"):
        export(session, Frozen(_nested(migration.MAX_DEPTH + 1), 0))
    doc = orjson.loads(record.to_bytes()[len(migration.MAGIC) :])
    # (orjson writes at most 254 levels: the text is put together by hand)
    head = migration.MAGIC + orjson.dumps({**doc, "config": None})[: -len(b"}")]
    for depth in (migration.MAX_DEPTH + 1, 300, 1000):
        body = b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)
        assert body.count(b"{") == depth
        with pytest.raises(BadRecord, match="nested"):
            Record.from_bytes(
                head.replace(b'"config":null', b'"config":' + body) + b"}", max_bytes=MAX
            )


def test_input_the_engine_had_not_taken_travels_with_the_record() -> None:
    registry = Registry(limits(), spelling=NATIVE)
    session, _ = opened(registry)
    session.client_seq = 3
    audio = bytes(range(256)) * 4  # decoded PCM16, as the engine gets it: bytes
    pending = (
        ({"type": "input_audio_buffer.append", "client_event_seq": 2, "audio": audio}, 1024),
        ({"type": "input.text.append", "client_event_seq": 3, "text": "hé"}, 0),
    )
    record = export(session, Frozen({"k": 1}, 3, pending))
    back = Record.from_bytes(record.to_bytes(), max_bytes=1 << 20)
    assert back.pending_input == pending
    assert back.client_seq == 3
    with pytest.raises(ValueError):
        attrs.evolve(record, pending_input=(({"no": "type"}, 0),))
    with pytest.raises(ValueError):
        attrs.evolve(record, pending_input=(({"type": "x"}, -1),))


def test_an_assigned_session_keeps_its_id_and_fixed_token_across_a_move() -> None:
    """A telephony call's session (``Grant.assigned``): the id and token its door derived,
    never rotated, here and on the node that adopts its record; a second open of the
    same id is refused while it lives."""
    registry = Registry(limits(), spelling=NATIVE)
    token = "T" * 43
    old, given = registry.admit({}, "twilio:AC", assigned=Assigned("sess_call", token))
    assert (old.id, given) == ("sess_call", token)
    with pytest.raises(ProtocolError) as info:
        registry.admit({}, "twilio:AC", assigned=Assigned("sess_call", token))
    assert info.value.code == ErrorCode.SESSION_RESUME_CONFLICT
    assert registry.slots_held == 1  # the refusal took no slot
    old.handshake_delivered(0.0)
    old.detach(1, 0.0)
    attempt = old.begin_resume(token, 0, 1.0)
    assert attempt.new_token == token
    assert old.commit_resume(attempt, 1.0) is not None
    old.emit(text(1), 1.0)

    data = export(old, Frozen({"n": 1}, 0)).to_bytes()
    assert orjson.loads(data[len(migration.MAGIC) :])["fixed"] is True
    moved = restore(Record.from_bytes(data, max_bytes=MAX), limits(), now=5.0)
    assert moved.id == "sess_call" and moved.credentials.is_fixed
    again = moved.begin_resume(token, 0, 6.0)
    assert again.new_token == token and moved.credentials.check(token)
    # A record of a rotating session says nothing of it, and restores a rotating one.
    plain, _ = opened(Registry(limits(), spelling=NATIVE))
    plain_data = export(plain, Frozen({"n": 1}, 0)).to_bytes()
    assert "fixed" not in orjson.loads(plain_data[len(migration.MAGIC) :])
    assert not restore(
        Record.from_bytes(plain_data, max_bytes=MAX), limits(), 5.0
    ).credentials.is_fixed


def test_a_record_s_fixed_flag_is_checked() -> None:
    session, _ = opened(Registry(limits(), spelling=NATIVE))
    record = export(session, Frozen({"n": 1}, 0))
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="fixed_token"):
            attrs.evolve(record, fixed_token=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pending"):
        attrs.evolve(record, fixed_token=True, pending_digest=b"\0" * 32)
