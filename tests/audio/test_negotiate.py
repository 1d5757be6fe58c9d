"""negotiate(): the defaults, and each refusal with the field it names."""

from __future__ import annotations

import pytest

from trio_duplex.audio import (
    FORMATS,
    AudioConfig,
    AudioFormat,
    _opus,
    negotiate,
    opus_available,
)
from trio_duplex.audio import _config as config
from trio_duplex.core.events import ErrorCode
from trio_duplex.core.wire import ProtocolError


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_the_default_is_json_and_pcm16_at_the_engines_rate(rate: int) -> None:
    expected = AudioConfig("json", AudioFormat("pcm16", rate), AudioFormat("pcm16", rate))
    assert negotiate(None, rate) == expected
    assert negotiate({}, rate) == expected
    assert negotiate({"input": {}, "output": {}}, rate) == expected


def test_as_event() -> None:
    cfg = negotiate({"wire": "binary", "output": {"format": "g711_alaw"}}, 24000)
    assert cfg.as_event() == {
        "wire": "binary",
        "input": {"format": "pcm16", "rate": 24000},
        "output": {"format": "g711_alaw", "rate": 8000},
    }


@pytest.mark.parametrize(
    ("fmt", "rate"), [("pcm16", 24000), ("g711_ulaw", 8000), ("g711_alaw", 8000), ("opus", 48000)]
)
def test_a_missing_rate_defaults_by_format(fmt: str, rate: int) -> None:
    if fmt == "opus" and not opus_available():
        pytest.skip("no libopus")
    cfg = negotiate({"input": {"format": fmt}, "output": {"format": fmt}}, 24000)
    assert cfg.input == cfg.output == AudioFormat(fmt, rate)


def test_every_format_and_rate_it_allows_is_accepted() -> None:
    assert set(config.RATES) == set(FORMATS)
    for fmt, rates in config.RATES.items():
        for rate in rates:
            assert negotiate({"input": {"format": fmt, "rate": rate}}, 16000).input == AudioFormat(
                fmt, rate
            )


REFUSALS: list[tuple[object, str]] = [
    ("binary", "session.audio"),
    ([], "session.audio"),
    ({"codec": "pcm16"}, "session.audio.codec"),
    ({"wire": "text"}, "session.audio.wire"),
    ({"wire": None}, "session.audio.wire"),
    ({"wire": 1}, "session.audio.wire"),
    ({"input": "pcm16"}, "session.audio.input"),
    ({"input": None}, "session.audio.input"),
    ({"output": ["pcm16"]}, "session.audio.output"),
    ({"input": {"format": "pcm16", "channels": 1}}, "session.audio.input.channels"),
    ({"input": {"format": "mp3"}}, "session.audio.input.format"),
    ({"output": {"format": "PCM16"}}, "session.audio.output.format"),
    ({"output": {"format": 16}}, "session.audio.output.format"),
    ({"input": {"rate": 44100}}, "session.audio.input.rate"),
    ({"input": {"rate": "24000"}}, "session.audio.input.rate"),
    ({"input": {"rate": 24000.0}}, "session.audio.input.rate"),
    ({"input": {"rate": True}}, "session.audio.input.rate"),
    ({"output": {"rate": None}}, "session.audio.output.rate"),
    ({"input": {"format": "g711_ulaw", "rate": 16000}}, "session.audio.input.rate"),
    ({"output": {"format": "g711_alaw", "rate": 24000}}, "session.audio.output.rate"),
    ({"output": {"format": "opus", "rate": 12000}}, "session.audio.output.rate"),
]


@pytest.mark.parametrize(("requested", "param"), REFUSALS)
def test_refusals_name_the_field(requested: object, param: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        negotiate(requested, 24000)
    assert caught.value.code == ErrorCode.UNSUPPORTED_AUDIO_FORMAT
    assert caught.value.param == param
    assert not caught.value.retryable


@pytest.mark.parametrize("direction", ["input", "output"])
def test_opus_without_the_extra_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, direction: str
) -> None:
    monkeypatch.setattr(_opus, "available", lambda: False)
    with pytest.raises(ProtocolError) as caught:
        negotiate({direction: {"format": "opus"}}, 24000)
    assert caught.value.code == ErrorCode.UNSUPPORTED_AUDIO_FORMAT
    assert caught.value.param == f"session.audio.{direction}.format"
    assert "trio-duplex[opus]" in caught.value.message


def test_an_engine_rate_outside_the_list_is_the_servers_bug() -> None:
    with pytest.raises(ValueError):
        negotiate(None, 22050)


def test_an_audio_format_that_exists_is_valid() -> None:
    with pytest.raises(ValueError):
        AudioFormat("g711_ulaw", 16000)
    with pytest.raises(ValueError):
        AudioFormat("flac", 16000)
