"""The media link's framing (trio_duplex/media/wire.py): frames survive any split of the
stream, and anything that is not a frame of it is a WireError, never a guess."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_duplex.media import wire
from trio_duplex.media.wire import Frame, Kind, Reader, WireError

_frames = st.lists(
    st.builds(
        Frame,
        st.sampled_from(list(Kind)),
        st.integers(0, wire.MAX_CALL),
        st.binary(max_size=300),
    ),
    max_size=12,
)


@given(_frames, st.lists(st.integers(0, 4000), max_size=8))
def test_frames_come_back_whole_and_in_order_however_the_stream_is_split(
    frames: list[Frame], cuts: list[int]
) -> None:
    data = b"".join(wire.encode(f.kind, f.call, f.payload) for f in frames)
    reader = Reader()
    got: list[Frame] = []
    start = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        got += reader.feed(data[start:cut])
        start = cut
    got += reader.feed(data[start:])
    assert got == frames
    assert reader.held == 0


def test_an_unknown_kind_breaks_the_stream_for_good() -> None:
    reader = Reader()
    good = wire.encode(Kind.CLOSE, 3)
    with pytest.raises(WireError, match="kind 99"):
        reader.feed(good + wire.HEAD.pack(99, 3, 0))
    with pytest.raises(WireError):
        reader.feed(good)  # (nothing parsed after a break)


def test_a_payload_over_the_bound_is_refused_from_its_head() -> None:
    reader = Reader()
    with pytest.raises(WireError, match="payload"):
        reader.feed(wire.HEAD.pack(Kind.MIC, 1, wire.MAX_PAYLOAD + 1))  # (no body needed)
    with pytest.raises(WireError):
        wire.encode(Kind.MIC, 1, bytes(wire.MAX_PAYLOAD + 1))
    assert (
        len(wire.encode(Kind.MIC, 1, bytes(wire.MAX_PAYLOAD))) == wire.HEAD_SIZE + wire.MAX_PAYLOAD
    )


def test_a_call_must_be_a_u32() -> None:
    with pytest.raises(WireError):
        wire.encode(Kind.CLOSE, -1)
    with pytest.raises(WireError):
        wire.encode(Kind.CLOSE, wire.MAX_CALL + 1)


@given(st.integers(0, 2**64 - 1), st.binary(max_size=200))
def test_audio_payloads_roundtrip(seq: int, packet: bytes) -> None:
    assert wire.unpack_audio(wire.pack_audio(seq, packet)) == (seq, packet)


@given(st.integers(0, 2**64 - 1), st.booleans(), st.booleans(), st.integers(0, 2**64 - 1))
def test_fixed_payloads_roundtrip(seq: int, drained: bool, cleared: bool, ns: int) -> None:
    assert wire.unpack_played(wire.pack_played(seq, drained=drained, cleared=cleared)) == (
        seq,
        drained,
        cleared,
    )
    assert wire.unpack_stats(wire.pack_stats(seq, ns)) == (seq, ns)
    assert wire.unpack_drained(wire.pack_drained(seq % 2**32)) == seq % 2**32


@pytest.mark.parametrize(
    ("unpack", "payload"),
    [
        (wire.unpack_audio, b"\x00" * 7),
        (wire.unpack_drained, b"\x00" * 5),
        (wire.unpack_played, b"\x00" * 9),
        (wire.unpack_played, b"\x00" * 8 + b"\x02\x00"),
        (wire.unpack_stats, b"\x00" * 15),
    ],
)
def test_a_fixed_payload_of_the_wrong_shape_is_a_wire_error(unpack: object, payload: bytes) -> None:
    assert callable(unpack)
    with pytest.raises(WireError):
        unpack(payload)


def test_the_module_imports_nothing_but_the_standard_library() -> None:
    # (the worker loads it by path, without the package on sys.path)
    import ast
    import sys
    from pathlib import Path

    tree = ast.parse(Path(wire.__file__).read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        (n.module or "").split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0
    }
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative
    assert names <= sys.stdlib_module_names | {"__future__"}
