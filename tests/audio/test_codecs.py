"""Decoder and Encoder: passthrough, resampling, Opus, and what the network may throw at them."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_duplex.audio import (
    FORMATS,
    MAX_CONVERTED_MS,
    AudioError,
    AudioFormat,
    Decoder,
    Encoder,
    opus_available,
)
from trio_duplex.audio._config import RATES
from trio_duplex.audio._resample import MAX_DELAY_S
from trio_duplex.core.events import ErrorCode

from .helpers import chunks, peak_hz, rms, samples, sine, snr_db

# CI installs libopus (.ci/run) and the binding (the test extra): there a missing Opus is a
# failure, not a skip.
requires_opus = pytest.mark.skipif(
    not opus_available() and os.environ.get("CI") != "true",
    reason="Opus needs libopus and the `opus` extra",
)


def wire_formats() -> list[AudioFormat]:
    return [AudioFormat(fmt, rate) for fmt in FORMATS for rate in RATES[fmt]]


# -- pcm16 ---------------------------------------------------------------------------------


def test_pcm16_at_the_engines_rate_is_passed_through_as_the_same_object() -> None:
    wire = AudioFormat("pcm16", 24000)
    payload = sine(1000, 24000, 0.02)
    assert Decoder(wire, 24000).decode(payload) is payload
    [out] = Encoder(wire, 24000).encode(payload)
    assert out is payload
    assert Encoder(wire, 24000).encode(b"") == []


@pytest.mark.parametrize("rate", [16000, 24000])
def test_an_odd_pcm16_payload_is_a_bad_event(rate: int) -> None:
    with pytest.raises(AudioError) as caught:
        Decoder(AudioFormat("pcm16", rate), 24000).decode(b"\x00\x01\x02")
    assert caught.value.code == ErrorCode.BAD_EVENT
    assert caught.value.param == "audio"


@pytest.mark.parametrize("wire", wire_formats(), ids=str)
def test_odd_engine_audio_is_the_engines_bug(wire: AudioFormat) -> None:
    if wire.format == "opus" and not opus_available():
        pytest.skip("no libopus")
    with pytest.raises(ValueError):
        Encoder(wire, 24000).encode(b"\x00\x01\x02")


# -- resampling ------------------------------------------------------------------------------


def test_a_1khz_sine_through_24k_8k_24k_in_20ms_chunks_keeps_its_pitch_and_level() -> None:
    down, up = (
        Encoder(AudioFormat("pcm16", 8000), 24000),
        Decoder(AudioFormat("pcm16", 8000), 24000),
    )
    wire = b"".join(p for c in chunks(sine(1000, 24000), 24000) for p in down.encode(c))
    back = b"".join(up.decode(p) for p in chunks(wire, 8000))
    # Streamed, each direction holds back at most its filter's delay.
    assert 8000 * (1 - MAX_DELAY_S) <= len(wire) // 2 <= 8000
    assert 24000 * (1 - 2 * MAX_DELAY_S) <= len(back) // 2 <= 24000
    for pcm, rate in [(wire, 8000), (back, 24000)]:
        steady = samples(pcm)[rate // 10 :]  # past the filters' start-up
        assert peak_hz(steady, rate) == pytest.approx(1000, abs=5)
        assert rms(steady) == pytest.approx(10_000 / np.sqrt(2), rel=0.02)


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
def test_streamed_chunks_resample_seamlessly(rate: int) -> None:
    """20 ms at a time or all at once: the same audio, so the chunks join without clicks."""
    pcm = sine(440, 24000)
    streamed = Encoder(AudioFormat("pcm16", rate), 24000)
    whole = Encoder(AudioFormat("pcm16", rate), 24000)
    a = b"".join(p for c in chunks(pcm, 24000) for p in streamed.encode(c)) + b"".join(
        streamed.flush()
    )
    b = b"".join(whole.encode(pcm)) + b"".join(whole.flush())
    assert len(a) == len(b) == rate * 2
    # A few LSBs of dither and rounding; a seam would click by thousands.
    assert np.max(np.abs(samples(a) - samples(b))) <= 4


def test_flush_releases_what_the_resampler_holds_then_starts_afresh() -> None:
    encoder = Encoder(AudioFormat("g711_ulaw", 8000), 24000)
    for _ in range(2):
        out = [p for c in chunks(sine(1000, 24000), 24000) for p in encoder.encode(c)]
        assert all(len(p) <= 160 for p in out)  # never a burst: at most 20 ms per chunk
        tail = encoder.flush()
        assert sum(map(len, out + tail)) == 8000  # 1 s at 8 kHz, one byte per sample
    assert encoder.flush() == []


@pytest.mark.parametrize("fmt", ["g711_ulaw", "g711_alaw"])
def test_g711_to_a_24k_engine_keeps_the_tone(fmt: str) -> None:
    encoder, decoder = (
        Encoder(AudioFormat(fmt, 8000), 24000),
        Decoder(AudioFormat(fmt, 8000), 24000),
    )
    wire = [p for c in chunks(sine(1000, 24000), 24000) for p in encoder.encode(c)]
    back = samples(b"".join(decoder.decode(p) for p in wire))[2400:]
    assert peak_hz(back, 24000) == pytest.approx(1000, abs=5)
    assert rms(back) == pytest.approx(10_000 / np.sqrt(2), rel=0.03)


# -- Opus ------------------------------------------------------------------------------------


@requires_opus
@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_opus_round_trip_one_packet_per_20ms_with_a_decent_snr(rate: int) -> None:
    encoder, decoder = (
        Encoder(AudioFormat("opus", rate), 24000),
        Decoder(AudioFormat("opus", rate), 24000),
    )
    pcm = sine(1000, 24000)
    packets = [encoder.encode(c) for c in chunks(pcm, 24000)]
    # No resampler on the Opus path: one packet per 20 ms chunk from the first, and each
    # decodes to 20 ms at the engine's rate again.
    assert [len(p) for p in packets] == [1] * 50
    assert encoder.flush() == []
    back = samples(b"".join(decoder.decode(p) for ps in packets for p in ps))
    assert len(back) == 24000
    # Opus is perceptual, not waveform-exact: a 1 kHz tone at 24 kbit/s comes back 15-22 dB
    # above its error (measured); a wrong rate, byte order or frame split gives <= 0 dB.
    assert snr_db(samples(pcm), back, max_lag=2400) >= 10
    assert peak_hz(back[4800:], 24000) == pytest.approx(1000, abs=5)


@requires_opus
def test_the_opus_rate_caps_the_band_encoded() -> None:
    """A 6 kHz tone fits a 48 kHz Opus stream's band, not an 8 kHz one's (4 kHz)."""
    levels = {}
    for rate in (8000, 48000):
        encoder, decoder = (
            Encoder(AudioFormat("opus", rate), 24000),
            Decoder(AudioFormat("opus", rate), 24000),
        )
        wire = [p for c in chunks(sine(6000, 24000), 24000) for p in encoder.encode(c)]
        levels[rate] = rms(samples(b"".join(decoder.decode(p) for p in wire))[4800:])
    assert levels[48000] > 10_000 / np.sqrt(2) / 2
    assert levels[8000] < levels[48000] / 10


@requires_opus
def test_opus_flush_pads_the_last_packet_with_silence() -> None:
    encoder = Encoder(AudioFormat("opus", 24000), 24000)  # no resampler: exact counts
    assert encoder.encode(bytes(480 * 2 * 2 + 100 * 2)) != []
    [padded] = encoder.flush()
    assert len(Decoder(AudioFormat("opus", 24000), 24000).decode(padded)) == 480 * 2
    assert encoder.flush() == []
    assert len(encoder.encode(bytes(479 * 2))) == 0
    assert len(encoder.encode(bytes(2))) == 1


@requires_opus
@pytest.mark.parametrize(
    "payload", [b"", b"\xff\xff\xff\xff", b"\x03"], ids=["empty", "bad", "code3-cut"]
)
def test_a_packet_libopus_refuses_is_a_bad_event(payload: bytes) -> None:
    with pytest.raises(AudioError) as caught:
        Decoder(AudioFormat("opus", 48000), 24000).decode(payload)
    assert caught.value.code == ErrorCode.BAD_EVENT
    assert caught.value.param == "audio"


# -- fuzz: the network side ------------------------------------------------------------------


def decoders() -> list[AudioFormat]:
    return [w for w in wire_formats() if w.format != "opus" or opus_available()]


@pytest.mark.parametrize("wire", decoders(), ids=str)
@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=1500), max_size=4))
def test_decoders_take_any_bytes_and_bound_their_output(
    wire: AudioFormat, payloads: list[bytes]
) -> None:
    decoder = Decoder(wire, 48000)
    for payload in payloads:
        try:
            out = decoder.decode(payload)
        except AudioError:
            continue
        assert len(out) % 2 == 0
        if wire.format == "opus":
            assert len(out) <= 0.120 * 48000 * 2 + 2 * 48000 * MAX_DELAY_S
        else:
            width = 2 if wire.format == "pcm16" else 1
            assert (
                len(out) <= len(payload) * 2 // width * 48000 / wire.rate + 4 * 48000 * MAX_DELAY_S
            )


@pytest.mark.parametrize(
    ("fmt", "rate", "sample_bytes"),
    [("g711_ulaw", 8000, 1), ("g711_alaw", 8000, 1), ("pcm16", 16000, 2)],
)
def test_a_converted_payload_holds_at_most_max_converted_ms(
    fmt: str, rate: int, sample_bytes: int
) -> None:
    """Converting costs CPU in one uninterruptible call: a payload's audio is bounded."""
    decoder = Decoder(AudioFormat(fmt, rate), 24000)
    limit = MAX_CONVERTED_MS * rate // 1000 * sample_bytes
    assert len(decoder.decode(bytes(limit))) > 0
    with pytest.raises(AudioError, match=f"at most {MAX_CONVERTED_MS} ms"):
        decoder.decode(bytes(limit + sample_bytes))


def test_pcm16_at_the_engines_rate_is_not_bounded_by_duration() -> None:
    big = bytes(24000 * 2 * 10)  # 10 s, passed through: only max_event_bytes bounds it
    assert Decoder(AudioFormat("pcm16", 24000), 24000).decode(big) is big
