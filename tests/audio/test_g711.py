"""The G.711 tables against CPython's audioop, bit for bit (audioop only as the oracle)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from trio_duplex.audio import AudioFormat, Decoder, Encoder, _g711

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

EVERY_SAMPLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16)
EVERY_CODE = bytes(range(256))


@pytest.mark.parametrize(("table", "oracle"), [("ULAW", "lin2ulaw"), ("ALAW", "lin2alaw")])
def test_encode_tables_match_audioop_for_all_65536_samples(table: str, oracle: str) -> None:
    pcm = EVERY_SAMPLE.astype("<i2").tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expected = getattr(audioop, oracle)(pcm, 2)
    assert _g711.encode(getattr(_g711, f"{table}_ENCODE"), EVERY_SAMPLE) == expected


@pytest.mark.parametrize(("table", "oracle"), [("ULAW", "ulaw2lin"), ("ALAW", "alaw2lin")])
def test_decode_tables_match_audioop_for_all_256_codes(table: str, oracle: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expected = getattr(audioop, oracle)(EVERY_CODE, 2)
    assert _g711.decode(getattr(_g711, f"{table}_DECODE"), EVERY_CODE).tobytes() == expected


@pytest.mark.parametrize("fmt", ["g711_ulaw", "g711_alaw"])
def test_an_8k_engine_speaks_g711_sample_for_sample(fmt: str) -> None:
    wire = AudioFormat(fmt, 8000)
    pcm = EVERY_SAMPLE.astype("<i2").tobytes()
    [payload] = Encoder(wire, 8000).encode(pcm)
    assert len(payload) == 65536
    decoded = Decoder(wire, 8000).decode(payload)
    # Companding keeps the 8 bits that matter: within one step of its segment.
    error = np.abs(np.frombuffer(decoded, "<i2").astype(int) - EVERY_SAMPLE.astype(int))
    assert error.max() <= 1024
