"""The turn detector's rules on drawn VAD probabilities (a scripted VAD in place of the
model): turns alternate, start and stop where the rules say, carry exactly their slice of
the stream, never overlap, stay within their bounds, and do not depend on the chunking."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.engines.speech._detector import (
    LEAD_IN_MS,
    TAIL_MS,
    Detected,
    Kind,
    TurnDetector,
    TurnSettings,
)
from trio_duplex.engines.speech._vad import WINDOW_BYTES, WINDOW_MS, VadStream, vad_model

from .listening import BYTES_PER_MS


class _Scripted(VadStream):
    """Window ``i``'s probability is ``script[i]`` (0.0 past its end)."""

    def __init__(self, script: list[float]) -> None:
        super().__init__(vad_model())
        self._script = script
        self._bytes = 0

    def feed(self, pcm16: bytes) -> list[float]:
        done = self._bytes // WINDOW_BYTES
        self._bytes += len(pcm16)
        now = self._bytes // WINDOW_BYTES
        self.windows = now
        return [self._script[i] if i < len(self._script) else 0.0 for i in range(done, now)]


_runs = st.lists(
    st.tuples(st.sampled_from([0.0, 0.2, 0.4, 0.45, 0.6, 0.95]), st.integers(1, 25)),
    min_size=1,
    max_size=30,
)
_settings = st.builds(
    TurnSettings,
    threshold=st.sampled_from([0.3, 0.5, 0.7]),
    prefix_padding_ms=st.integers(0, 800),
    silence_duration_ms=st.integers(0, 700),
    min_speech_ms=st.integers(0, 200),
    max_turn_s=st.sampled_from([1.0, 2.0, 5.0]),
)


def _feed(
    turn: TurnSettings, script: list[float], stream: bytes, sizes: list[int]
) -> tuple[list[Detected], int]:
    """The detections, and the most the detector held between two feeds."""
    detector = TurnDetector(turn, _Scripted(script))
    found: list[Detected] = []
    most = at = 0
    while at < len(stream):
        for size in sizes:
            found += detector.feed(stream[at : at + size])
            at += size
            most = max(most, len(detector.held()))
            if detector.in_turn:
                assert detector.held() == detector.turn_audio()
    return found, most


@settings(max_examples=100, deadline=None)
@given(turn=_settings, runs=_runs, sizes=st.lists(st.integers(300, 5_000), min_size=1, max_size=4))
def test_the_rules_hold_for_any_probabilities(
    turn: TurnSettings, runs: list[tuple[float, int]], sizes: list[int]
) -> None:
    script = [p for p, n in runs for _ in range(n)]
    stream = random.Random(len(script)).randbytes((len(script) + 2) * WINDOW_BYTES)
    found, most = _feed(turn, script, stream, sizes)
    assert found == _feed(turn, script, stream, [len(stream)])[0]  # any chunking

    kinds = [d.kind for d in found]
    assert all(kind is (Kind.STOPPED if i % 2 else Kind.STARTED) for i, kind in enumerate(kinds))

    def p(window: int) -> float:
        return script[window] if window < len(script) else 0.0

    min_windows = max(1, math.ceil(turn.min_speech_ms / WINDOW_MS))
    quiet_windows = max(1, math.ceil(turn.silence_duration_ms / WINDOW_MS))
    max_ms = math.floor(turn.max_turn_s * 1000 / WINDOW_MS) * WINDOW_MS
    prefix = turn.prefix_padding_ms * BYTES_PER_MS
    previous_end = 0
    for started, stopped in zip(found[::2], found[1::2], strict=False):
        first = round(started.at_ms / WINDOW_MS)
        assert p(first) >= turn.threshold  # it starts at a speech window
        assert stopped.at_ms > started.at_ms
        cut = stopped.at_ms == started.at_ms + max_ms
        if not cut:  # a silence stop: its first quiet window, then no speech window
            quiet = round(stopped.at_ms / WINDOW_MS)
            assert p(quiet) < turn.quiet_below
            assert all(p(w) < turn.threshold for w in range(quiet, quiet + quiet_windows))
        # Its audio: exactly a slice of the stream, after the previous turn's.
        start = stream.find(stopped.audio)
        end = start + len(stopped.audio)
        assert start >= previous_end
        tail = min(TAIL_MS * BYTES_PER_MS, quiet_windows * WINDOW_BYTES)
        assert end == stopped.at_ms * BYTES_PER_MS + (0 if cut else tail)
        earliest = max(previous_end, first * WINDOW_BYTES - prefix - LEAD_IN_MS * BYTES_PER_MS)
        assert earliest <= start <= max(previous_end, first * WINDOW_BYTES - prefix)
        previous_end = end
    # Bounded: the pre-roll outside a turn, the turn so far inside one.
    lead = (turn.prefix_padding_ms + LEAD_IN_MS) * BYTES_PER_MS
    assert most <= max(
        lead + (2 * min_windows + 1) * WINDOW_BYTES,
        lead + max_ms * BYTES_PER_MS + WINDOW_BYTES,
    )


def test_a_scripted_turn() -> None:
    """The rules by hand: 3 speech windows start it (a quiet one between them is let
    through), 10 quiet windows (300 ms) stop it at the first of them."""
    script = [0.0] * 20 + [0.9, 0.1, 0.9, 0.9] + [0.9] * 10 + [0.1] * 9 + [0.9] + [0.1] * 12
    turn = TurnSettings()
    stream = bytes(len(script) * WINDOW_BYTES)
    found, _ = _feed(turn, script, stream, [640])
    assert [(d.kind, d.at_ms) for d in found] == [
        (Kind.STARTED, 20 * WINDOW_MS),
        (Kind.STOPPED, 44 * WINDOW_MS),
    ]
    # Its audio: from 300 ms before the first quiet window's run-up (window 20: the window
    # after the last quiet one) to 192 ms past its end.
    assert len(found[1].audio) == (44 - 20) * WINDOW_BYTES + (300 + TAIL_MS) * BYTES_PER_MS
