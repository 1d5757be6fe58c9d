"""A WAV file as the microphone (``trio-duplex connect --mic FILE.wav``).

``open_wav`` checks the file (PCM16, mono or stereo, any rate from 4 to 192 kHz) and
``Microphone.payloads`` turns it into the session's input audio: downmixed to mono,
resampled with soxr (the audio layer's ``Resampler``) to the wire's rate, cut into
20 ms frames and encoded in the wire's format (pcm16, G.711 or Opus), one payload per
frame, followed by ``TAIL_SILENCE_S`` of silence so that a recogniser's end-of-speech
detection fires after the file's last word. ``stream`` sends them at real-time pace.

The file is read 20 ms at a time on the event loop: a few KiB from a local file per
call, no longer than the resampling that follows it.
"""

from __future__ import annotations

import wave
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Final

import attrs
import numpy as np
import trio

from ..audio import AudioFormat, Encoder, Resampler

FRAME_SECONDS: Final = 0.02
"""The audio each payload carries, and the pace they are sent at."""
TAIL_SILENCE_S: Final = 1.0
"""Silence sent after the file, as a microphone would hear after the speaker stopped."""
MIN_RATE: Final = 4_000
MAX_RATE: Final = 192_000


class MicError(Exception):
    """The file cannot be the microphone; the message says why, naming the file."""


@attrs.frozen
class Microphone:
    """A checked PCM16 WAV file (the file is opened again for each ``payloads``)."""

    path: str
    channels: int
    rate: int
    frames: int
    """Its length in samples per channel."""

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def payloads(self, wire: AudioFormat) -> Iterator[bytes]:
        """The file, then ``TAIL_SILENCE_S`` of silence, as 20 ms payloads in ``wire``'s
        format (the last frame of the file padded with silence)."""
        frame = wire.rate * 20 // 1000  # samples per 20 ms at the wire's rate
        encoder = Encoder(wire, wire.rate)
        pending = np.zeros(0, dtype=np.int16)
        for samples in self._samples(wire.rate):
            pending = np.concatenate((pending, samples))
            whole = len(pending) - len(pending) % frame
            for start in range(0, whole, frame):
                yield from encoder.encode(pending[start : start + frame].tobytes())
            pending = pending[whole:]
        tail = np.zeros(frame * round(TAIL_SILENCE_S / FRAME_SECONDS), dtype=np.int16)
        if len(pending):  # the file's last partial frame, padded
            tail = np.concatenate((pending, np.zeros(frame - len(pending), dtype=np.int16), tail))
        for start in range(0, len(tail), frame):
            yield from encoder.encode(tail[start : start + frame].tobytes())
        yield from encoder.flush()

    def _samples(self, rate: int) -> Iterator[np.ndarray[tuple[int], np.dtype[np.int16]]]:
        """The file in 20 ms chunks, mono, at ``rate`` (the resampler's delay drained)."""
        resampler = None if rate == self.rate else Resampler(self.rate, rate)
        chunk = max(1, self.rate * 20 // 1000)
        with wave.open(self.path, "rb") as wav:
            while data := wav.readframes(chunk):
                whole = len(data) - len(data) % (2 * self.channels)  # a file cut mid-sample
                samples = np.frombuffer(data[:whole], dtype="<i2")
                if self.channels == 2:  # the mean of left and right (no clipping)
                    pairs = samples.reshape(-1, 2).astype(np.int32)
                    samples = ((pairs[:, 0] + pairs[:, 1]) // 2).astype(np.int16)
                yield samples if resampler is None else resampler.process(samples)
        if resampler is not None:
            yield resampler.drain()


def open_wav(path: str) -> Microphone:
    """``path`` checked as a microphone: MicError says what is wrong with it."""
    try:
        with wave.open(path, "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.getnframes()
    except OSError as exc:
        raise MicError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (wave.Error, EOFError) as exc:  # not RIFF/WAVE, a compressed or float format
        raise MicError(f"{path} is not a PCM16 WAV file ({str(exc) or 'truncated'})") from None
    if width != 2:
        raise MicError(f"{path} has {8 * width}-bit samples; --mic takes 16-bit PCM")
    if channels not in (1, 2):
        raise MicError(f"{path} has {channels} channels; --mic takes mono or stereo")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise MicError(f"{path} is sampled at {rate} Hz; --mic takes {MIN_RATE}-{MAX_RATE} Hz")
    return Microphone(path, channels, rate, frames)


async def stream(payloads: Iterable[bytes], send: Callable[[bytes], Awaitable[object]]) -> int:
    """Send each payload at real-time pace: the n-th at ``start + n * FRAME_SECONDS`` on
    trio's clock, so a slow send does not add up to drift. A send that waited longer
    than a frame (flow control, a reconnect) is caught up at once, as a microphone's
    buffer would be. Returns how many were sent."""
    start = trio.current_time()
    sent = 0
    for payload in payloads:
        await trio.sleep_until(start + sent * FRAME_SECONDS)
        await send(payload)
        sent += 1
    return sent
