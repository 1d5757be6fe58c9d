"""The wire JSON: our fast paths give exactly what the json module's own calls give."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.wire import MAX_DEPTH, ProtocolError, _loads, decode, encode

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def reference(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_encode_is_compact_json_dumps(value: Any) -> None:
    assert encode(value) == reference(value)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["", " ", "\n\t"]))
def test_loads_agrees_with_json_loads(value: Any, space: str) -> None:
    text = space + reference(value) + space
    assert _loads(text) == json.loads(text)


@pytest.mark.parametrize("bad", [math.nan, math.inf, {"a": [math.nan]}])
def test_encode_refuses_non_finite_floats(bad: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode(bad)


def test_encode_refuses_what_is_not_json() -> None:
    with pytest.raises(TypeError, match="bytes is not JSON serializable"):
        encode({"audio": b"\x00"})


def test_encode_of_a_cycle_raises_instead_of_hanging() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(RecursionError):
        encode(cycle)


@pytest.mark.parametrize("text", ['{"a":1} x', "", "{", "[1", "nul", "{} {}", '"a" 1'])
def test_loads_raises_what_json_loads_raises(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as ours:
        _loads(text)
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    assert (ours.value.msg, ours.value.pos) == (theirs.value.msg, theirs.value.pos)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("not json", "invalid_json"),
        ("[1]", "bad_event"),
        ("{} trailing", "invalid_json"),
        ("[" * 100_000, "invalid_json"),
    ],
)
def test_decode_errors_keep_their_codes(text: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(text)
    assert info.value.code == code


# -- what could be read but never sent back is refused as it is read --------------------


@pytest.mark.parametrize(
    "number", ["NaN", "Infinity", "-Infinity", "1e999999", "-1e400", "1.5e309"]
)
def test_non_finite_numbers_are_invalid_json(number: str) -> None:
    for text in (
        f'{{"type":"session.update","session":{{"x":{number}}}}}',
        f' {{"type":"e","v":[1,{number}]}}',  # the full path too (leading space)
    ):
        with pytest.raises(ProtocolError) as info:
            decode(text)
        assert info.value.code == "invalid_json"


def test_large_finite_numbers_are_kept() -> None:
    event = decode('{"type":"e","big":1.7976931348623157e308,"small":5e-324}')
    assert event["big"] == 1.7976931348623157e308 and event["small"] == 5e-324
    assert encode(event)  # and they can be sent back


def nested(depth: int, inner: str = "1") -> str:
    """An event whose field ``v`` nests ``depth - 1`` arrays deep (the event is 1)."""
    return '{"type":"e","v":' + "[" * (depth - 1) + inner + "]" * (depth - 1) + "}"


def test_nesting_up_to_the_bound_is_accepted_and_beyond_it_refused() -> None:
    assert decode(nested(MAX_DEPTH))["type"] == "e"
    with pytest.raises(ProtocolError) as info:
        decode(nested(MAX_DEPTH + 1))
    assert info.value.code == "bad_event"
    assert str(MAX_DEPTH) in info.value.message


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    event = decode(json.dumps({"type": "e", "text": "[{" * 500}))
    assert event["text"] == "[{" * 500


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 900])
def test_a_lone_surrogate_nested_deep_is_refused_without_recursion(depth: int) -> None:
    # Was: a recursive surrogate check hit the recursion limit around 500 deep (1011 and
    # a 127 KB traceback per connection).
    with pytest.raises(ProtocolError) as info:
        decode(nested(depth, '"\\ud800"'))
    assert info.value.code == "bad_event"


def test_a_lone_surrogate_is_refused_at_any_allowed_depth() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(nested(MAX_DEPTH, '"x\\udfff"'))
    assert info.value.message == "strings must not hold lone UTF-16 surrogates"
