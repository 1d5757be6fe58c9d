"""trio_duplex.core.frames.ClientFrames: a client's frames checked, not decoded (the
pooled relay's front passes them on as they came).

- On any sequence of frames, well-formed or not, with random masking keys, cut at any
  points, it passes on exactly the data frames ``FrameReader`` accepts (verbatim, whole:
  parsed again they give FrameReader's messages), gives the same control frames
  (unmasked) and the same fault, with the same code and reason, at the same place
  (hypothesis). The one rule it leaves to the home: text that is not UTF-8.
- What it holds back is one incomplete frame, never part of one passed on.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.core.frames import (
    ClientFrames,
    Close,
    CloseCode,
    Control,
    FrameReader,
    Item,
    Opcode,
)

from .test_frames import BIG, KEY, close_payload, cut, frame, header, mask, typed

Spec = tuple[bytes, bool]
"""A frame's bytes, and whether it is a data frame (TEXT, BINARY, continuation)."""


def scan_all(
    scanner: ClientFrames, chunks: Sequence[bytes]
) -> tuple[bytes, int, list[Control | Close]]:
    """Every chunk scanned in turn: what was passed on, how many frames, the controls;
    after each chunk, what was passed on so far is whole frames."""
    passed, count, controls = b"", 0, []
    for chunk in chunks:
        out, n, more = scanner.scan(chunk)
        assert isinstance(out, bytes)
        passed += out
        count += n
        controls += more
        again = FrameReader(BIG)
        again.receive(passed)
        assert again.error is None and not again._buf  # whole frames, never a part
    return passed, count, controls


def masked(opcode: int, payload: bytes, key: bytes, *, fin: bool, form: int | None) -> bytes:
    return header(opcode, len(payload), fin=fin, form=form) + key + mask(payload, key)


@st.composite
def a_frame(draw: st.DrawFn) -> Spec:
    """A client frame, mostly by the rules (random keys, length forms, fragments),
    sometimes not (unmasked, reserved bits, unknown opcodes, control frames fragmented
    or long, fragments out of order, bad closes, lengths of 2**63 and more)."""
    opcode = draw(st.sampled_from([0, 1, 2] * 6 + [8, 9, 9, 10, 10, 3, 11]))
    fin = draw(st.sampled_from([True, True, False]))
    key = draw(st.binary(min_size=4, max_size=4))
    form = draw(st.sampled_from([None, None, None, 16, 64]))
    flaw = draw(st.sampled_from(["none"] * 30 + ["unmasked", "rsv", "huge", "top bit"]))
    if opcode == Opcode.CLOSE:
        payload = draw(
            st.one_of(
                st.builds(
                    close_payload,
                    st.sampled_from([1000, 1001, 1007, 3000, 4999, 1005, 999, 2000]),
                    st.text(max_size=8).map(str.encode),
                ),
                st.binary(max_size=5),  # a byte alone, a reason that is not UTF-8
            )
        )
    elif opcode >= 8:
        payload = draw(st.binary(max_size=12)) if draw(st.integers(0, 15)) else b"p" * 126
    else:  # UTF-8 either way: each fragment is, so is the message they make
        payload = draw(st.text(max_size=12)).encode()
    data = opcode < 8
    if flaw == "unmasked":
        return header(opcode, len(payload), fin=fin, masked=False, form=form) + payload, data
    if flaw == "rsv":
        rsv = draw(st.integers(1, 7))
        return header(opcode, len(payload), fin=fin, rsv=rsv, form=form) + key + payload, data
    if flaw == "huge":  # a header whose payload never comes (over any bound here)
        return header(opcode, draw(st.integers(1 << 16, 1 << 40)), fin=fin, form=64), data
    if flaw == "top bit":
        return header(opcode, draw(st.integers(1 << 63, (1 << 64) - 1)), fin=fin, form=64), data
    return masked(opcode, payload, key, fin=fin, form=form), data


@st.composite
def a_message(draw: st.DrawFn) -> list[Spec]:
    """A message in 1 to 12 fragments by the rules (random keys and length forms; a
    continuation counts its header against the bound), or one frame of any kind."""
    if draw(st.booleans()):
        return [draw(a_frame())]
    parts = draw(st.lists(st.text(max_size=8).map(str.encode), min_size=1, max_size=12))
    opcode = draw(st.sampled_from([Opcode.TEXT, Opcode.BINARY]))
    specs = []
    for n, part in enumerate(parts):
        key = draw(st.binary(min_size=4, max_size=4))
        form = draw(st.sampled_from([None, None, 16, 64]))
        op = opcode if n == 0 else Opcode.CONT
        specs.append((masked(op, part, key, fin=n == len(parts) - 1, form=form), True))
    return specs


@settings(max_examples=800, deadline=None, database=None)
@given(
    pieces=st.lists(a_message(), max_size=8),
    bound=st.one_of(st.integers(0, 300), st.just(BIG)),
    data=st.data(),
)
def test_a_scan_agrees_with_the_frame_reader_however_cut(
    pieces: list[list[Spec]], bound: int, data: st.DataObject
) -> None:
    specs = [spec for piece in pieces for spec in piece]
    stream = b"".join(f for f, _ in specs)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    chunks = cut(stream, points)
    reader = FrameReader(bound)
    items: list[Item] = []
    for chunk in chunks:
        items += reader.receive(chunk)
    scanner = ClientFrames(bound)
    passed, count, controls = scan_all(scanner, chunks)
    # The same fault, or none.
    if reader.error is None:
        assert scanner.error is None
    else:
        assert scanner.error is not None
        assert (scanner.error.code, scanner.error.reason) == (
            reader.error.code,
            reader.error.reason,
        )
    # The same control frames, unmasked.
    assert typed(controls) == typed(i for i in items if isinstance(i, (Control, Close)))
    # The data frames of a prefix of the stream, verbatim (none in part), how many...
    prefixes = [
        (b"".join(f for f, is_data in specs[:k] if is_data), sum(d for _, d in specs[:k]))
        for k in range(len(specs) + 1)
    ]
    assert (passed, count) in prefixes
    # ...which parsed again are FrameReader's messages.
    again = FrameReader(BIG)
    assert typed(again.receive(passed)) == typed(i for i in items if isinstance(i, (str, bytes)))
    assert again.error is None
    # Held: the start of one incomplete frame at most (of at most the bound), none
    # after a close or a fault.
    starts = [len(stream) - len(b"".join(f for f, _ in specs[k:])) for k in range(len(specs))]
    assert not scanner.holding or len(stream) - scanner.holding in starts
    assert scanner.holding < max(bound, 125) + 14
    if scanner.error is not None or any(isinstance(c, Close) for c in controls):
        assert scanner.holding == 0


def test_frames_are_passed_on_verbatim_and_whole_across_any_split() -> None:
    keys = [b"\x01\x02\x03\x04", b"\xff\x00\xff\x00", KEY, b"\x00\x00\x00\x00"]
    messages = [
        masked(Opcode.TEXT, "héllo".encode(), keys[0], fin=True, form=None),
        masked(Opcode.BINARY, b"\x00" * 70_000, keys[1], fin=True, form=None),
        masked(Opcode.TEXT, b"ab", keys[2], fin=False, form=None),  # in two fragments
        masked(Opcode.CONT, b"c", keys[3], fin=True, form=None),
        masked(Opcode.BINARY, b"x" * 300, keys[0], fin=True, form=None),
    ]
    ping = frame(Opcode.PING, b"p")
    close = frame(Opcode.CLOSE, close_payload(1001, b"bye"))
    stream = messages[0] + messages[1] + ping + messages[2] + ping + b"".join(messages[3:])
    stream += close + frame(Opcode.TEXT, b"past the close")
    for size in (1, 2, 3, 7, 1000, 65536, len(stream)):
        scanner = ClientFrames(BIG)
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        passed, count, controls = scan_all(scanner, chunks)
        assert passed == b"".join(messages) and count == len(messages), size
        assert typed(controls) == typed(
            [Control(Opcode.PING, b"p"), Control(Opcode.PING, b"p"), Close(1001, "bye")]
        )
        assert scanner.holding == 0 and scanner.error is None


def test_what_came_in_one_piece_is_passed_on_as_that_piece() -> None:
    frames = frame(Opcode.TEXT, b"one") + frame(Opcode.BINARY, b"two")
    out, count, controls = ClientFrames(BIG).scan(frames)
    assert out is frames and count == 2 and controls == []  # no copy


def test_text_that_is_not_utf8_is_left_to_the_home() -> None:
    # The home's FrameReader refuses it (1007); the scan passes it on as it came.
    bad = frame(Opcode.TEXT, b"\xc3\x28") + frame(Opcode.TEXT, b"\xe2", fin=False)
    bad += frame(Opcode.CONT, b"\x28")
    scanner = ClientFrames(BIG)
    assert scanner.scan(bad) == (bad, 3, [])
    assert scanner.error is None
    reader = FrameReader(BIG)
    assert reader.receive(bad) == []
    assert reader.error is not None and reader.error.code == CloseCode.INVALID_DATA


def test_a_close_s_payload_is_checked_as_the_reader_checks_it() -> None:
    for payload, code in [
        (b"\x03", CloseCode.PROTOCOL_ERROR),
        (close_payload(1005), CloseCode.PROTOCOL_ERROR),
        (close_payload(1000, b"\xff"), CloseCode.INVALID_DATA),
    ]:
        before = frame(Opcode.TEXT, b"before")
        scanner = ClientFrames(BIG)
        assert scanner.scan(before + frame(Opcode.CLOSE, payload)) == (before, 1, [])
        assert scanner.error is not None and scanner.error.code == code
        assert scanner.scan(frame(Opcode.TEXT, b"later")) == (b"", 0, [])


def test_empty_continuations_meet_the_bound_as_in_the_reader() -> None:
    # Each empty fragment counts its header (6 bytes): the bound is met without payload.
    stream = frame(Opcode.BINARY, b"", fin=False) + frame(Opcode.CONT, b"", fin=False) * 20
    for bound in (0, 5, 6, 30, 60, 125, 126, 200):
        reader, scanner = FrameReader(bound), ClientFrames(bound)
        reader.receive(stream)
        out, count, _ = scanner.scan(stream)
        assert (scanner.error is None) == (reader.error is None), bound
        if reader.error is not None:
            assert scanner.error is not None and scanner.error.code == CloseCode.TOO_BIG
            assert count == len(out) // 6 < 21
        else:
            assert (out, count) == (stream, 21)


def test_a_bound_raised_later_applies_from_the_next_frame() -> None:
    scanner = ClientFrames(4)
    assert scanner.scan(frame(Opcode.TEXT, b"1234"))[1] == 1
    scanner.max = 10
    assert scanner.scan(frame(Opcode.TEXT, b"1234567890"))[1] == 1
    assert scanner.scan(frame(Opcode.TEXT, b"12345678901"))[1] == 0
    assert scanner.error is not None and scanner.error.code == CloseCode.TOO_BIG


@pytest.mark.parametrize("size", [125, 126, 65535, 65536])
def test_a_large_frame_is_held_until_whole_and_refused_from_its_header(size: int) -> None:
    whole = frame(Opcode.BINARY, b"z" * size)
    scanner = ClientFrames(size)
    for a, b in itertools.pairwise([0, 1, 3, 9, 14, size // 2, len(whole) - 1]):
        assert scanner.scan(whole[a:b]) == (b"", 0, [])
        assert scanner.holding == b
    assert scanner.scan(whole[len(whole) - 1 :]) == (whole, 1, [])
    assert scanner.holding == 0
    small = ClientFrames(size - 1)  # over the bound: known from the header alone
    assert small.scan(whole[: len(header(Opcode.BINARY, size))]) == (b"", 0, [])
    assert small.error is not None and small.error.code == CloseCode.TOO_BIG
