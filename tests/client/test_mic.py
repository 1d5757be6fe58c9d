"""``trio-duplex connect --mic FILE.wav``: the file streamed as input audio, at real-time
pace, beside typed lines; the echo engine's answer written by ``--speaker`` shows what
the server received. In process against the server in memory (virtual time), then as
subprocesses against a real ``trio-duplex serve``."""

from __future__ import annotations

import io
import json
import os
import selectors
import subprocess
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from trio_duplex.client.mic import FRAME_SECONDS, TAIL_SILENCE_S, stream
from trio_duplex.client.terminal import Printer, build_parser, run

from .. import helpers, speech_audio
from ..speech_audio import (
    RATE,
    VOICES,
    at_rate,
    is_speech,
    judge,
    needs_speech,
    reply_to,
    said,
    sentences,
)
from .test_terminal import Screen, Serve, connect_command, out_lines, terminal

Samples = np.ndarray[tuple[int], np.dtype[np.int16]]
TAIL_FRAMES = round(TAIL_SILENCE_S / FRAME_SECONDS)


def write_wav(path: Path, samples: np.ndarray, rate: int, channels: int = 1) -> Path:
    """``samples`` (interleaved when stereo) as a PCM16 WAV file."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())
    return path


def read_wav(path: Path) -> tuple[int, Samples]:
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        rate = wav.getframerate()
        return rate, np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")


def noise(count: int, seed: int = 7) -> Samples:
    """Loud random samples: any lost, repeated or reordered frame changes them."""
    return np.random.default_rng(seed).integers(-20000, 20000, count, dtype=np.int16)


def two_tones(rate: int, seconds: float) -> np.ndarray:
    """Stereo, interleaved: 440 Hz on the left, 1000 Hz on the right, both at 8000."""
    t = np.arange(int(rate * seconds)) / rate
    left = 8000 * np.sin(2 * np.pi * 440 * t)
    right = 8000 * np.sin(2 * np.pi * 1000 * t)
    return np.round(np.stack((left, right), axis=1).reshape(-1)).astype(np.int16)


def tone_level(samples: Samples, rate: int, hz: float) -> float:
    """The amplitude of the ``hz`` component of ``samples``."""
    t = np.arange(len(samples)) / rate
    wave_ = np.exp(-2j * np.pi * hz * t)
    return float(2 * abs(np.dot(samples.astype(np.float64), wave_)) / len(samples))


def sound(samples: Samples) -> Samples:
    """``samples`` from the first to the last one that is not near silence."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > 200)
    return samples[loud[0] : loud[-1] + 1]


# -- in process: the server in memory, virtual time ---------------------------------------


async def test_the_server_receives_the_whole_file_in_order(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    # 24 kHz mono is what the echo engine takes and gives: no conversion on either side,
    # so what --speaker wrote is byte for byte what the server received.
    sent = noise(24_000 * 7 // 10 + 123)  # 0.7 s and a partial frame
    mic = write_wav(tmp_path / "in.wav", sent, 24_000)
    out = tmp_path / "out.wav"
    async with terminal(["--mic", str(mic), "--speaker", str(out), "--json"]) as term:
        start = trio.current_time()
        term.lines.close()
    assert term.exit_code == 0, term.err.getvalue()
    frames = -(-len(sent) // 480)  # the last one padded with silence
    # End of input waited for the whole file and its silence, sent in real time.
    assert trio.current_time() - start >= (frames + TAIL_FRAMES - 1) * FRAME_SECONDS
    rate, received = read_wav(out)
    assert rate == 24_000
    assert len(received) == (frames + TAIL_FRAMES) * 480
    assert np.array_equal(received[: len(sent)], sent)
    assert not received[len(sent) :].any()
    created = out_lines(term)[0]
    assert '"type":"session.created"' in created and '"wire":"binary"' in created
    err = term.err.getvalue()
    assert f"mic: streaming {mic} (0.71 s, 24000 Hz mono) as pcm16 at 24000 Hz" in err
    assert f"mic: end of {mic} ({(frames + TAIL_FRAMES) * FRAME_SECONDS:.2f} s sent" in err


@pytest.mark.parametrize(
    ("argv", "out_rate"),
    [
        ([], 24_000),
        (["--audio-format", "pcm16", "--audio-rate", "16000"], 16_000),
        (["--audio-format", "g711_ulaw"], 8_000),
        (["--audio-wire", "json", "--audio-format", "opus"], 48_000),
    ],
)
async def test_a_stereo_file_at_another_rate_is_downmixed_and_resampled(
    autojump_clock: trio.abc.Clock, tmp_path: Path, argv: list[str], out_rate: int
) -> None:
    seconds = 0.6
    mic = write_wav(tmp_path / "in.wav", two_tones(22_050, seconds), 22_050, channels=2)
    out = tmp_path / "out.wav"
    async with terminal(["--mic", str(mic), "--speaker", str(out), *argv]) as term:
        term.lines.close()
    assert term.exit_code == 0, term.err.getvalue()
    rate, received = read_wav(out)
    assert rate == out_rate
    heard = sound(received)
    assert abs(len(heard) / rate - seconds) < 0.03  # all of it, no more
    # Each channel's tone at half its level (the mean of the two), nothing else loud.
    middle = heard[len(heard) // 6 : -len(heard) // 6]
    for hz in (440, 1000):
        assert 3600 < tone_level(middle, rate, hz) < 4400, hz
    assert tone_level(middle, rate, 700) < 300


async def test_typed_lines_go_beside_the_mic(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    mic = write_wav(tmp_path / "in.wav", noise(24_000), 24_000)  # 1 s
    # No linger: only the wait for the mic keeps the session open after the typed line.
    async with terminal(["--mic", str(mic), "--linger", "0"]) as term:
        await term.wait_for("audio=<960 bytes>")  # the mic has started
        await term.type("typed while it plays")
        term.lines.close()
    assert term.exit_code == 0
    err = term.err.getvalue()
    assert err.index("mic: end of") < err.index("end of input: closing")
    lines = out_lines(term)
    audio = [i for i, line in enumerate(lines) if "response.output_audio.delta" in line]
    text = [i for i, line in enumerate(lines) if "typed while it plays" in line]
    assert len(audio) == 50 + TAIL_FRAMES
    assert len(text) == 1 and audio[0] < text[0] < audio[-1]


async def test_a_file_cut_short_mid_sample_streams_what_it_holds(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    mic = write_wav(tmp_path / "in.wav", two_tones(16_000, 0.2), 16_000, channels=2)
    mic.write_bytes(mic.read_bytes()[:-3])  # the header still counts the lost samples
    out = tmp_path / "out.wav"
    async with terminal(["--mic", str(mic), "--speaker", str(out)]) as term:
        term.lines.close()
    assert term.exit_code == 0, term.err.getvalue()
    rate, received = read_wav(out)
    assert abs(len(sound(received)) / rate - 0.2) < 0.03
    assert "mic: end of" in term.err.getvalue()


async def test_frames_are_sent_on_a_fixed_grid(autojump_clock: trio.abc.Clock) -> None:
    sent_at: list[float] = []

    async def send(payload: bytes) -> None:
        sent_at.append(trio.current_time() - start)
        # Each send takes 5 ms; the 10th waits 95 ms (flow control, say).
        await trio.sleep(0.095 if payload == b"9" else 0.005)

    start = trio.current_time()
    count = await stream((str(i).encode() for i in range(20)), send)
    assert count == 20
    # Never drifting: frame n at n * 20 ms, whatever the sends cost; the frames the long
    # send held back go at once, then the grid goes on.
    expected = [n * FRAME_SECONDS for n in range(10)]
    expected += [9 * FRAME_SECONDS + 0.095 + k * 0.005 for k in range(5)]  # catching up
    expected += [n * FRAME_SECONDS for n in range(15, 20)]
    assert sent_at == pytest.approx(expected, abs=1e-9)


def riff(fmt_tag: int, channels: int, rate: int, bits: int, data: bytes = b"\0" * 64) -> bytes:
    """A WAV file's bytes with any format tag (``wave`` writes only PCM)."""
    block = channels * bits // 8
    fmt = (
        fmt_tag.to_bytes(2, "little")
        + channels.to_bytes(2, "little")
        + rate.to_bytes(4, "little")
        + (rate * block).to_bytes(4, "little")
        + block.to_bytes(2, "little")
        + bits.to_bytes(2, "little")
    )
    body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt
    body += b"data" + len(data).to_bytes(4, "little") + data
    return b"RIFF" + len(body).to_bytes(4, "little") + body


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read {path}: No such file or directory"),
        (b"hello, not a wave\n", "{path} is not a PCM16 WAV file (file does not start with"),
        (b"", "{path} is not a PCM16 WAV file (truncated)"),
        (riff(3, 1, 16000, 32), "{path} is not a PCM16 WAV file (unknown format: 3)"),
        (riff(1, 1, 16000, 8), "{path} has 8-bit samples; --mic takes 16-bit PCM"),
        (riff(1, 3, 16000, 16), "{path} has 3 channels; --mic takes mono or stereo"),
        (riff(1, 1, 2000, 16), "{path} is sampled at 2000 Hz; --mic takes 4000-192000 Hz"),
    ],
    ids=["missing", "text", "empty", "float", "8-bit", "3-channels", "2-kHz"],
)
async def test_a_bad_wav_file_exits_2_before_connecting(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "in.wav"
    if content is not None:
        path.write_bytes(content)
    err = io.StringIO()
    _, lines = trio.open_memory_channel[str](0)
    _, presses = trio.open_memory_channel[int](0)
    args = build_parser().parse_args(["ws://unused", "--mic", str(path)])
    code = await run(args, lines=lines, interrupts=presses, printer=Printer(Screen(), err))
    assert code == 2
    assert err.getvalue().startswith("* --mic: " + message.format(path=path))
    assert len(err.getvalue().splitlines()) == 1


# -- subprocesses: a real server on 127.0.0.1 ---------------------------------------------


@pytest.mark.integration
def test_mic_and_speaker_through_a_real_server(serve: Serve, tmp_path: Path) -> None:
    server = serve("--engine", "echo")
    seconds = 0.5
    mic = write_wav(tmp_path / "in.wav", two_tones(44_100, seconds), 44_100, channels=2)
    out = tmp_path / "out.wav"
    done = subprocess.run(
        connect_command(server.url, "--mic", str(mic), "--speaker", str(out), "--linger", "0.3"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    frames = done.stdout.count("response.output_audio.delta")
    assert frames == round((seconds + TAIL_SILENCE_S) / FRAME_SECONDS)
    rate, received = read_wav(out)
    assert rate == 24_000 and len(received) == frames * 480
    heard = sound(received)
    assert abs(len(heard) / rate - seconds) < 0.03
    middle = heard[len(heard) // 6 : -len(heard) // 6]
    for hz in (440, 1000):
        assert 3600 < tone_level(middle, rate, hz) < 4400, hz
    assert "mic: end of" in done.stderr and "session.closed" in done.stdout


@pytest.mark.integration
def test_a_bad_mic_file_exits_2_through_the_command(tmp_path: Path) -> None:
    path = tmp_path / "in.wav"
    path.write_bytes(riff(1, 1, 16000, 24))
    done = subprocess.run(
        connect_command("ws://127.0.0.1:9", "--mic", str(path)),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr == f"* --mic: {path} has 24-bit samples; --mic takes 16-bit PCM\n"


def converse(url: str, mic: Path, out: Path, count: int) -> list[dict[str, Any]]:
    """``trio-duplex connect --mic MIC --speaker OUT --json`` until ``count`` turns are
    heard and the last one's reply has played; its events, then it ends (end of input)."""
    argv = connect_command(url, "--mic", str(mic), "--speaker", str(out), "--json")
    events: list[dict[str, Any]] = []
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        buffer = b""
        deadline = time.monotonic() + 120
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while not heard_all(events, count):
                left = deadline - time.monotonic()
                assert left > 0, [e["type"] for e in events]
                if selector.select(left):
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    assert chunk, [e["type"] for e in events]
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    events += [json.loads(line) for line in lines if line.startswith(b"{")]
        proc.stdin.close()  # end of input: the client closes the session
        assert proc.wait(30) == 0
    return events


def heard_all(events: list[dict[str, Any]], count: int) -> bool:
    kinds = [e["type"] for e in events]
    done = kinds.count("input_audio.transcript.done")
    started = kinds.count("input_audio_buffer.speech_started")
    return done >= count and done == started and kinds[-1] == "response.done"


@pytest.mark.integration
@pytest.mark.media
@needs_speech
def test_the_speech_engine_hears_sentences_through_mic_and_answers_through_speaker(
    speech_parts: None, serve: helpers.Serve, tmp_path: Path
) -> None:
    """Issue 26's "done when": the outside set's first sentences, in a WAV file per voice
    at the rate the voice writes (espeak-ng 22.05 kHz, flite 16 kHz: --mic resamples),
    are the microphone of ``trio-duplex connect``, two at once against one server; the
    engine hears them (pooled word error rate over all of them), answers each, and the
    answer --speaker writes is speech."""
    server = serve("--engine", "speech", ready_timeout=60)
    texts = sentences(MIC_SENTENCES)
    wavs = {voice: said_in_a_file(tmp_path, voice, texts) for voice in VOICES}
    outs = {voice: tmp_path / f"reply-{voice}.wav" for voice in VOICES}
    with ThreadPoolExecutor(len(VOICES)) as pool:
        talks = {v: pool.submit(converse, server.url, wavs[v], outs[v], len(texts)) for v in VOICES}
        events = {voice: talk.result() for voice, talk in talks.items()}
    heard = {
        v: [e["text"] for e in events[v] if e["type"] == "input_audio.transcript.done"]
        for v in VOICES
    }
    judge(texts * len(VOICES), [text for voice in VOICES for text in heard[voice]])
    for voice in VOICES:
        last = heard[voice][-1]
        deltas = [e for e in events[voice] if e["type"] == "response.output_text.delta"]
        last_id = deltas[-1]["response_id"]
        said = "".join(e["text"] for e in deltas if e["response_id"] == last_id)
        assert said == reply_to(last), said  # the last reply, whole
        rate, reply = read_wav(outs[voice])
        assert rate == 16_000 and len(reply) > rate  # "you said: ...": over a second
        assert is_speech(reply.tobytes())


MIC_SENTENCES = 6
"""Sentences each voice says into the microphone (in real time: ~25 s a voice)."""


def said_in_a_file(folder: Path, voice: str, texts: list[str]) -> Path:
    """``texts`` said by ``voice`` one after another, 1.5 s of silence after each (the
    turn ends, and the reply starts, before the next), in a WAV at the voice's own rate."""
    parts = [np.zeros(RATE // 2, dtype=np.int16)]
    for text in texts:
        parts += [
            np.frombuffer(said(text, voice), dtype=np.int16),
            np.zeros(RATE * 3 // 2, dtype=np.int16),
        ]
    pcm = np.concatenate(parts).tobytes()
    rate = 22_050 if voice == "espeak-ng" else RATE
    return speech_audio.write_wav(folder / f"{voice}.wav", at_rate(pcm, RATE, rate), rate)
