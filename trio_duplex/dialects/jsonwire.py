"""JSON under the wire's rules: compact text out, strict parsing in, large texts in slices.

The codec every JSON dialect and every JSON body the server reads share: pure, text in,
dicts out, dicts in, text out. What an event must hold is the dialect's (native.py);
this module knows JSON only. Its refusals are ProtocolErrors with the code the peer is
answered with (``invalid_json``, ``bad_event``).
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Callable, Generator, Iterator
from typing import Any

import orjson

from ..core.events import ErrorCode
from ..core.wire import ProtocolError

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _make_encode() -> Callable[[Any], str]:
    """``_encoder.encode`` without its per-call cost.

    ``JSONEncoder.encode`` builds a new C encoder (and a dict for cycle checks) on every
    call, which was a third of the JSON time per event. Build it once: same output, no
    cycle check (a cyclic event ends in RecursionError instead of ValueError)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    basestring = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or basestring is None:
        return _encoder.encode

    def default(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    try:
        chunks = make(None, default, basestring, None, ":", ",", False, False, False)
    except TypeError:  # another Python's signature: keep the plain path
        return _encoder.encode

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


_std_encode = _make_encode()

_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})
"""The leaf types orjson writes exactly as the json module does (ints: orjson raises
beyond 64 bits, and the fallback takes them)."""
_OrjsonError = orjson.JSONEncodeError
_dumps = orjson.dumps


_WALK_CONTAINERS = 64
"""``_floatless`` looks into at most this many arrays and objects, then says no (the json
module takes the value): a bound on its cost, and the end of a cycle's walk."""


def _floatless(value: dict[str, Any] | list[Any]) -> bool:
    """No float anywhere in ``value`` (a float is where orjson's text may differ: ``1e16``
    against ``1e+16``, NaN as ``null`` instead of an error; or, read back, where orjson
    turned an integer beyond 64 bits into one), and at most ``_WALK_CONTAINERS`` arrays
    and objects. A loop, not recursion; a flat event costs one pass over its values."""
    plain = _PLAIN
    stack: list[Any] = [value]
    budget = _WALK_CONTAINERS
    while stack:
        budget -= 1
        if budget < 0:
            return False
        item = stack.pop()
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind in plain:
                continue
            if kind is float:
                return False
            if kind is dict or kind is list:
                stack.append(child)
            elif isinstance(child, (str, int)) and not isinstance(child, float):
                continue  # enum members and other subclasses: written as their value
            else:
                return False  # tuples, subclasses of dict/list, the unknown: the json module
    return True


def encode(value: Any) -> str:
    """Compact JSON: the form that is sent and whose size the journal counts.

    The text is exactly the json module's (``separators=(",", ":")``, ``ensure_ascii=
    False``, ``allow_nan=False``), errors included: orjson writes it when the value holds
    no float (and only dicts, lists and plain leaves); anything else, or anything orjson
    refuses (an integer beyond 64 bits, a non-string key, a lone surrogate, a cycle, a
    type it does not know), is written by the json module's encoder as before."""
    if (type(value) is dict or type(value) is list) and _floatless(value):
        try:
            return _dumps(value).decode()
        except _OrjsonError:
            pass
    return _std_encode(value)


MAX_DEPTH = 32
"""How deeply arrays and objects may nest in a client event (the event itself is 1)."""


def _non_finite(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # 1e999 parses to inf, which could never be sent
        raise ValueError(f"{text} is out of range")
    return value


# NaN, Infinity and out-of-range floats are refused as they are parsed: an event that
# holds one could be read but never encoded again (echoed, journaled, sent back).
_decoder = json.JSONDecoder(parse_constant=_non_finite, parse_float=_finite)
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    _decoder  # type: ignore[arg-type]
)


_loads_fast = orjson.loads
_DecodeError = orjson.JSONDecodeError
ORJSON_FROM = 512
"""Texts of at least this many characters are parsed by orjson first: below it the json
module's scanner is as fast (a 100-byte text event); above, orjson's string scan wins (a
20 ms frame of base64 audio: 1,300 characters, about 2.5 times faster)."""


def _loads(text: str) -> Any:
    """``_decoder.decode(text)``, the json module's parse with NaN, Infinity and
    out-of-range numbers refused; from ``ORJSON_FROM`` characters, in one orjson call
    in the common case.

    orjson refuses everything the json module refuses, and a few texts it accepts (a
    NaN, 1e999, an escaped lone surrogate, nesting beyond 1024): any refusal goes to the
    json module, which then answers exactly as before. Where orjson accepts, its result
    is the json module's unless it holds a float (orjson reads an integer beyond 64
    bits as one): then the json module parses it again."""
    if len(text) < ORJSON_FROM:
        return _std_loads(text)
    try:
        value = _loads_fast(text)
    except _DecodeError:
        return _std_loads(text)
    if type(value) is dict or type(value) is list:
        if _floatless(value):
            return value
    elif type(value) in _PLAIN:
        return value
    return _std_loads(text)


def _std_loads(text: str) -> Any:
    """``_decoder.decode(text)`` with one C call in the common case (no surrounding
    space)."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return _decoder.decode(text)  # the full path, for its exact error or leading space
    if end != len(text):
        return _decoder.decode(text)
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_structure(value: object, surrogates: bool) -> None:
    """Refuse nesting deeper than MAX_DEPTH and (if ``surrogates``) strings that hold a
    lone surrogate. A loop with its own stack, not recursion: no input can reach the
    interpreter's recursion limit here."""
    for _ in _check_structure_steps(value, surrogates, math.inf):
        pass


def _check_structure_steps(value: object, surrogates: bool, every: float) -> Iterator[None]:
    """``_check_structure``, yielding after each ``every`` items looked at."""
    stack: list[tuple[object, int]] = [(value, 1)]
    count = 0
    while stack:
        count += 1
        if count >= every:
            count = 0
            yield
        item, depth = stack.pop()
        if isinstance(item, str):
            if surrogates and _SURROGATE.search(item) is not None:
                raise ProtocolError(
                    ErrorCode.BAD_EVENT, "strings must not hold lone UTF-16 surrogates"
                )
            continue
        if isinstance(item, dict):
            children: list[object] = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise ProtocolError(
                ErrorCode.BAD_EVENT, f"arrays and objects may nest at most {MAX_DEPTH} deep"
            )
        stack.extend((child, depth + 1) for child in children)


def _invalid_json() -> ProtocolError:
    # A new one each time: a raised exception keeps its traceback, and so the text.
    return ProtocolError(ErrorCode.INVALID_JSON, "frame is not valid JSON")


def decode_object(text: str, not_object: str = "the JSON must be an object") -> dict[str, Any]:
    """Parse ``text`` as one JSON object under the wire's rules (no NaN or Infinity,
    nesting at most MAX_DEPTH, no lone surrogates), without an event's own checks: the
    decoder of every JSON body the server reads, over HTTP too (auth.py).

    Raises ProtocolError(invalid_json) for text that is not JSON, ProtocolError(bad_event)
    with ``not_object`` for JSON that is not an object, or for the rules."""
    try:
        event = _loads(text)
    except (ValueError, RecursionError):
        raise _invalid_json() from None
    if not isinstance(event, dict):
        raise ProtocolError(ErrorCode.BAD_EVENT, not_object)
    # Valid UTF-8 on the wire can still decode to a lone surrogate through a \u escape;
    # echoing such a string could never be encoded, so refuse it here. Both walks are
    # skipped by a cheap test of the text first (a nest needs that many brackets).
    surrogates = "\\ud" in text or "\\uD" in text
    if surrogates or text.count("[") + text.count("{") > MAX_DEPTH:
        _check_structure(event, surrogates)
    return event


# -- large messages, in slices ---------------------------------------------------------

LARGE = 64 * 1024
"""Messages of at least this many characters are decoded in slices (``object_steps``)."""
SLICE = 256 * 1024
"""About how many characters a sliced decode scans between two yields."""
_WALK_SLICE = 16 * 1024
"""How many values a sliced structure check looks at between two yields."""


_STRING_STOP = re.compile(r'["\\\x00-\x1f]')
_SPACE = re.compile(r"[ \t\n\r]*")


def object_steps(text: str) -> Generator[None, None, dict[str, Any]]:
    """``decode_object(text, "an event must be a JSON object")`` as a generator that
    yields between slices of work, so that a driver can let other tasks run while a
    large message is decoded; its return value is the object, and it raises what
    ``decode_object`` raises.

    It takes the top-level object one member at a time, and scans a string member
    without escapes (base64 audio, plain text) ``SLICE`` characters at a time, with the
    checks ``decode_object`` makes done in slices too. A member of another kind (an
    array, an object, a string with escapes) is parsed in one call of the C parser, and
    so blocks for as long as that takes. A text that does not begin with ``{`` is
    refused as not an object, unparsed. The result is ``decode_object``'s for every text
    (tests/dialects/test_native.py checks it); meant for texts from ``LARGE`` on.
    """
    event: dict[str, Any] = {}
    at = _SPACE.match(text).end()  # type: ignore[union-attr]  # (it matches "" at least)
    if text[at : at + 1] != "{":
        raise ProtocolError(ErrorCode.BAD_EVENT, "an event must be a JSON object")
    at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    end = len(text)
    try:
        if text[at : at + 1] == "}":
            at += 1
        else:
            while True:
                if text[at : at + 1] != '"':
                    raise _invalid_json()
                key, at = _scan(text, at)
                at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
                if text[at : at + 1] != ":":
                    raise _invalid_json()
                at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
                if text[at : at + 1] == '"':
                    value, at = yield from _string_steps(text, at)
                else:
                    value, at = _scan(text, at)
                    yield
                event[key] = value
                at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
                separator = text[at : at + 1]
                at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
                if separator == "}":
                    break
                if separator != ",":
                    raise _invalid_json()
    except (ValueError, RecursionError, StopIteration):
        raise _invalid_json() from None
    if _SPACE.match(text, at).end() != end:  # type: ignore[union-attr]
        raise _invalid_json()  # extra data after the object
    surrogates = nested = False
    brackets = 0
    for start in range(0, end, SLICE):
        stop = min(end, start + SLICE + 2)  # "\ud" across the cut is seen whole
        surrogates = surrogates or text.find("\\ud", start, stop) >= 0
        surrogates = surrogates or text.find("\\uD", start, stop) >= 0
        brackets += text.count("[", start, start + SLICE) + text.count("{", start, start + SLICE)
        yield
    nested = brackets > MAX_DEPTH
    if surrogates or nested:
        yield from _check_structure_steps(event, surrogates, _WALK_SLICE)
    return event


def _string_steps(text: str, at: int) -> Generator[None, None, tuple[str, int]]:
    """The string that opens at ``text[at]``, and where it ends: without escapes or
    control characters it is scanned in slices; otherwise the C parser takes it."""
    start = at + 1
    scan = start
    end = len(text)
    while True:
        found = _STRING_STOP.search(text, scan, min(end, scan + SLICE))
        if found is not None:
            if text[found.start()] != '"':  # an escape or a control character
                value: str
                value, after = _scan(text, at)
                return value, after
            return text[start : found.start()], found.end()
        scan += SLICE
        if scan >= end:
            raise _invalid_json()  # never closed
        yield
