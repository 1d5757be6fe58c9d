"""A migration record names its session's dialect and carries its shaper's state; a
record written before dialects existed (no such fields) is a native session's."""

from __future__ import annotations

import attrs
import orjson
import pytest

from trio_duplex.core import migration
from trio_duplex.core.limits import Limits
from trio_duplex.core.migration import BadRecord, Frozen, Record, export
from trio_duplex.core.session import Registry
from trio_duplex.dialects import NATIVE

MAX = 1 << 22


def _record(frozen: Frozen) -> Record:
    registry = Registry(Limits(max_sessions=2), spelling=NATIVE)
    session, _ = registry.admit({"model": "m"})
    session.handshake_delivered(0.0)
    session.emit({"type": "response.output_text.delta", "text": "x"}, 0.0)
    return export(session, frozen)


def test_the_dialect_and_the_shaper_state_travel_with_the_record() -> None:
    state = {"response": {"id": "resp_1", "text": "x"}, "n": 3}
    record = _record(Frozen({}, 0, dialect="openai", shaper_state=state))
    back = Record.from_bytes(record.to_bytes(), max_bytes=MAX)
    assert (back.dialect, back.shaper_state) == ("openai", state)
    assert back == record


def test_a_record_without_a_dialect_is_native() -> None:
    record = _record(Frozen({}, 0))
    assert (record.dialect, record.shaper_state) == ("native", None)
    doc = orjson.loads(record.to_bytes()[len(migration.MAGIC) :])
    del doc["dialect"], doc["shaper"]  # as a node before dialects wrote it
    old = Record.from_bytes(migration.MAGIC + orjson.dumps(doc), max_bytes=MAX)
    assert (old.dialect, old.shaper_state) == ("native", None)


@pytest.mark.parametrize(
    ("field", "value"),
    [("dialect", 7), ("dialect", ""), ("dialect", "x" * 65), ("shaper", [1]), ("shaper", "s")],
)
def test_a_bad_dialect_or_shaper_state_is_a_bad_record(field: str, value: object) -> None:
    doc = orjson.loads(_record(Frozen({}, 0)).to_bytes()[len(migration.MAGIC) :])
    doc[field] = value
    with pytest.raises(BadRecord):
        Record.from_bytes(migration.MAGIC + orjson.dumps(doc), max_bytes=MAX)


def test_the_record_s_repr_names_no_shaper_state() -> None:
    record = _record(Frozen({}, 0, dialect="openai", shaper_state={"text": "secret words"}))
    assert "secret" not in repr(record)
    assert "secret" not in repr(attrs.evolve(record))
