"""The native dialect's JSON: our fast paths give exactly what the json module's own calls give."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.wire import ProtocolError
from trio_duplex.dialects import jsonwire, native
from trio_duplex.dialects.jsonwire import MAX_DEPTH, _loads, encode
from trio_duplex.dialects.native import decode, decode_steps

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


# -- large messages, decoded in slices -------------------------------------------------------


def run_steps(text: str | bytes) -> tuple[dict[str, Any], int]:
    """Drive ``decode_steps`` to its end: the event, and how many times it yielded."""
    steps = decode_steps(text)
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, yields
        yields += 1


def outcome(decoder: Any, text: str | bytes) -> object:
    try:
        return decoder(text)
    except ProtocolError as exc:
        return ("error", exc.code)


def stepped(text: str | bytes) -> dict[str, Any]:
    return run_steps(text)[0]


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
spaces = st.text(alphabet=" \t\n\r", max_size=2)


@st.composite
def event_texts(draw: st.DrawFn) -> str:
    """Event-shaped JSON texts, with odd spacing, and sometimes damaged."""
    members = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=5))
    if draw(st.booleans()):
        members["type"] = draw(st.text(max_size=8))
    parts = [
        draw(spaces)
        + json.dumps(k)
        + draw(spaces)
        + ":"
        + draw(spaces)
        + json.dumps(v, ensure_ascii=draw(st.booleans()))
        for k, v in members.items()
    ]
    text = draw(spaces) + "{" + draw(spaces) + ",".join(parts) + draw(spaces) + "}" + draw(spaces)
    damage = draw(st.sampled_from(["none", "none", "cut", "insert", "delete"]))
    if damage != "none" and text:
        at = draw(st.integers(0, len(text) - 1))
        if damage == "cut":
            text = text[:at]
        elif damage == "insert":
            text = text[:at] + draw(st.sampled_from(list('{}[]",:\\ \x01x0'))) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


@settings(max_examples=600, deadline=None)
@given(event_texts())
def test_sliced_decoding_gives_what_decode_gives(text: str) -> None:
    # Every text through the sliced path (thresholds cut down to a few characters).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "LARGE", 0)
        patch.setattr(jsonwire, "SLICE", 3)
        patch.setattr(jsonwire, "_WALK_SLICE", 2)
        expected = outcome(decode, text)
        if text.lstrip(" \t\n\r")[:1] != "{":
            # Not an object: refused unparsed (decode would say bad_event or invalid_json).
            assert outcome(stepped, text) == ("error", "bad_event")
        else:
            assert outcome(stepped, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"type":"x","s":"\\ud800"}',  # a lone surrogate by escape
        '{"type":"x","s":"a\\"b","t":"\\u00e9\\n"}',  # escapes: the C parser's string
        '{"type":"x","n":' + "[" * 40 + "]" * 40 + "}",  # too deep
        '{"type":"x","n":NaN}',
        '{"type":"x","n":1e999}',
        '{"type":"x","s":"a\x01b"}',  # a raw control character
        '{"type":"x","s":"never closed}',
        '{"type":"x"} trailing',
        '{"type":"x",}',
        '{"type":"x","event_id":7}',
        '{"type":3}',
        '{"a":1,"a":2,"type":"x"}',  # the last of a repeated key wins, as in decode
    ],
)
def test_sliced_decoding_of_edge_cases(text: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "LARGE", 0)
        patch.setattr(jsonwire, "SLICE", 4)
        assert outcome(stepped, text) == outcome(decode, text)


def test_a_large_audio_append_is_decoded_in_many_small_steps() -> None:
    # Was: one 14 MiB message was parsed in one go on the event loop, stalling every
    # other session for its length. Now it yields at least once per SLICE characters.
    audio = "QUJD" * (1 << 20)  # 4 MiB of base64
    text = json.dumps({"type": "input_audio_buffer.append", "audio": audio, "event_id": "e"})
    event, yields = run_steps(text)
    assert event == {"type": "input_audio_buffer.append", "audio": audio, "event_id": "e"}
    assert yields >= len(text) // jsonwire.SLICE
    # Small messages take the plain path: no yield.
    assert run_steps('{"type":"x"}') == ({"type": "x"}, 0)


def test_a_large_text_that_is_not_an_object_is_refused_unparsed() -> None:
    text = "[" + "1," * jsonwire.LARGE + "1]"
    assert outcome(stepped, text) == ("error", "bad_event")


# -- the orjson paths give the json module's results, errors included ------------------

PAD = "p" * jsonwire.ORJSON_FROM  # a text this long is parsed by orjson first


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_long_texts_parse_as_json_loads_does(value: Any) -> None:
    text = reference({"pad": PAD, "v": value})
    assert len(text) >= jsonwire.ORJSON_FROM
    parsed = _loads(text)
    assert parsed == json.loads(text)
    assert reference(parsed) == text  # the same types too (an int stays an int)


@pytest.mark.parametrize(
    "inner",
    ["18446744073709551616", "-9223372036854775809", "123456789012345678901234567890"],
)
def test_long_texts_keep_integers_beyond_64_bits(inner: str) -> None:
    # orjson alone reads these as floats.
    event = decode(f'{{"type":"e","pad":"{PAD}","n":[{inner}]}}')
    assert event["n"] == [int(inner)]


@pytest.mark.parametrize("number", ["NaN", "1e999", "-Infinity"])
def test_long_texts_refuse_non_finite_numbers(number: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(f'{{"type":"e","pad":"{PAD}","x":{number}}}')
    assert info.value.code == "invalid_json"


def test_long_texts_refuse_lone_surrogates_as_bad_event() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(f'{{"type":"e","pad":"{PAD}","x":"\\udc00"}}')
    assert info.value.code == "bad_event"


def test_long_texts_refuse_deep_nesting_as_bad_event() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(nested(MAX_DEPTH + 1).replace('"e"', f'"e","pad":"{PAD}"'))
    assert info.value.code == "bad_event"


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**64},  # orjson refuses beyond 64 bits
        {"n": -(2**63) - 1},
        {"t": (1, "a")},  # a tuple, as a list
        {1: "int key"},
        {"s": "lone \udc00 surrogate"},
        {"f": 1e16, "g": 1e-05, "h": -0.0},  # floats: orjson writes 1e16 and 1e-5
        [{"a": [{"b": [1]}]}] * 100,  # more containers than the walk looks into
    ],
)
def test_encode_is_the_json_module_s_where_orjson_differs(value: Any) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert encode(value) == expected


def test_encode_writes_enum_members_as_their_values() -> None:
    import enum

    class Kind(enum.StrEnum):
        DELTA = "response.output_text.delta"

    class Level(enum.IntEnum):
        HIGH = 3

    value = {"type": Kind.DELTA, "level": Level.HIGH, "list": [Kind.DELTA]}
    assert (
        encode(value)
        == '{"type":"response.output_text.delta","level":3,"list":["response.output_text.delta"]}'
    )
