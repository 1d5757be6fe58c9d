"""The ledger engine's codes survive the server's μ-law tables both ways, and what the
deploy test reads of them (frames heard, the report, the chunks received) reads back."""

from __future__ import annotations

import json

import pytest

from trio_duplex.audio import AudioFormat
from trio_duplex.audio._codecs import Decoder, Encoder

from .ledger import (
    FRAME,
    INPUT_SYNC,
    LedgerEngine,
    chunk_number,
    decode_report,
    expand_runs,
    frame_codes,
    input_chunk,
    parse_heard,
    pcm_of,
    report_frames,
)

ULAW_8K = AudioFormat("g711_ulaw", 8000)


def test_a_chunk_reaches_the_engine_as_its_codes() -> None:
    decoder = Decoder(ULAW_8K, 8000)
    engine = LedgerEngine()
    numbers = [0, 1, 99, 100, 4321, 9999]
    for n in numbers:
        engine._take({"type": "input_audio_buffer.append", "audio": decoder.decode(input_chunk(n))})
    assert expand_runs(engine.runs) == numbers and engine.bad == 0
    assert chunk_number(input_chunk(57)[:-1] + b"\x00") is None


def test_the_engine_counts_a_bad_block_and_finds_the_next_chunk() -> None:
    engine = LedgerEngine()
    codes = input_chunk(5) + bytes([0xFF]) * 40 + input_chunk(6) + input_chunk(6)
    engine._take({"type": "input_audio_buffer.append", "audio": pcm_of(codes)})
    assert engine.runs == [[5, 6], [6, 6]]  # a chunk twice shows as twice
    assert engine.bad == 1 and engine.report()["partial"] == 0


def test_frames_reach_the_caller_as_their_codes_and_a_cut_one_shows() -> None:
    encoder = Encoder(ULAW_8K, 8000)
    frames = [frame_codes(3, i) for i in range(4)]
    wire = b"".join(b for f in frames for b in encoder.encode(pcm_of(f)))
    assert wire == b"".join(frames)
    played = [(10.0, wire[: 2 * FRAME + 7])]  # a clear in the third frame
    heard, orphan = parse_heard(0, played)
    assert orphan == 0
    assert [(h.response, h.index, h.whole) for h in heard] == [
        (3, 0, True),
        (3, 1, True),
        (3, 2, False),
    ]
    assert heard[1].at == pytest.approx(10.0 + FRAME / 8000)
    heard, orphan = parse_heard(1, [(0.0, wire[FRAME + 2 :])])  # a frame begun elsewhere
    assert orphan == FRAME - 2 and [h.index for h in heard] == [2, 3]


def test_the_report_reads_back_whole_and_not_cut() -> None:
    report = {"runs": [[0, 149], [203, 504]], "bad": 0, "keys": ["6", "1", "#"]}
    frames = report_frames(9, report)
    heard, _ = parse_heard(0, [(0.0, b"".join(frames))])
    assert decode_report(heard) == report
    with pytest.raises(ValueError):
        decode_report(heard[:-1])


def test_a_snapshot_restores_through_json() -> None:
    engine = LedgerEngine()
    engine._take({"type": "input_audio_buffer.append", "audio": pcm_of(input_chunk(7)[:50])})
    engine._take({"type": "input.dtmf", "digit": "6"})
    engine.playing = engine._begin(engine.waiting.popleft())
    assert engine.playing is not None
    engine.playing["next"] = 42
    moved = LedgerEngine()
    moved.restore(json.loads(json.dumps(engine.snapshot())))
    assert moved.playing == engine.playing and moved._frames == engine._frames
    assert moved.restored == 1 and moved.keys == ["6"]
    moved._take({"type": "input_audio_buffer.append", "audio": pcm_of(input_chunk(7)[50:])})
    assert moved.runs == [[7, 7]]  # the half chunk the snapshot held, made whole
    assert bytes([INPUT_SYNC]) not in frame_codes(1, 1)
    with pytest.raises(ValueError):
        moved.restore({"state": "echo/3"})
