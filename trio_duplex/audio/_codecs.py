"""Per-session transcoding between the wire's audio and the engine's PCM16.

A ``Decoder`` faces the network: whatever bytes arrive, it returns PCM16 or raises
``AudioError``, and its output is bounded by its input:

* pcm16: ``len(payload) * engine_rate / rate`` bytes (plus the resampler's few samples);
* g711: ``2 * len(payload) * engine_rate / 8000`` bytes, at most 12 times the payload;
* opus: one packet yields at most 120 ms (the longest Opus defines), whatever its size;
* and a pcm16 or g711 payload that must be resampled holds at most
  ``MAX_CONVERTED_MS`` of audio, else ``AudioError``: resampling costs ~1.3 ms of CPU
  per second of audio, in one call that no other session can interrupt, so a 15 MiB
  message of 8 kHz PCM16 would hold the event loop for over a second. (Audio at the
  engine's rate is not resampled: only ``max_event_bytes`` bounds it.)

A resampler (pcm16 and g711 at another rate than the engine's) holds back 10-30 ms of
audio (see _resample.py), released with the next chunk; an ``Encoder``'s ``flush``
releases it at the end of a stretch of audio. Opus needs none: libopus encodes from and
decodes to the engine's rate itself, and the wire's rate only caps the band encoded.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.events import ErrorCode
from ..core.wire import ProtocolError
from . import _g711, _opus
from ._config import ENGINE_RATES, AudioFormat
from ._resample import Resampler, Samples

MAX_CONVERTED_MS = 2000
"""The most audio one pcm16 or g711 message may carry when the server resamples it."""


class AudioError(ProtocolError):
    """A payload that cannot be decoded (odd PCM16 length, a packet libopus refuses):
    answered with ``error{code: "bad_event", param: "audio"}``; the session goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BAD_EVENT, message, param="audio")


def _samples(pcm: bytes) -> Samples:
    return np.frombuffer(pcm, dtype="<i2")


def _check_engine_rate(engine_rate: int) -> None:
    if engine_rate not in ENGINE_RATES:
        raise ValueError(f"an engine's audio rate must be one of {ENGINE_RATES}: {engine_rate}")


class Decoder:
    """Wire payloads -> the engine's PCM16 (mono, little-endian), for one session."""

    def __init__(self, wire: AudioFormat, engine_rate: int) -> None:
        _check_engine_rate(engine_rate)
        self.wire = wire
        self.engine_rate = engine_rate
        self._passthrough = wire.format == "pcm16" and wire.rate == engine_rate
        self._opus = _opus.OpusDecoder(engine_rate) if wire.format == "opus" else None
        self._resampler = (
            None
            if wire.rate == engine_rate or self._opus is not None
            else Resampler(wire.rate, engine_rate)
        )
        self._table = {"g711_ulaw": _g711.ULAW_DECODE, "g711_alaw": _g711.ALAW_DECODE}.get(
            wire.format
        )

    def decode(self, payload: bytes) -> bytes:
        """One message's audio -> PCM16 (possibly empty while the resampler fills)."""
        if self._passthrough:
            if len(payload) % 2:
                raise AudioError("pcm16 audio must be a whole number of 2-byte samples")
            return payload
        if self._resampler is not None:
            per_ms = self.wire.rate // 1000 * (1 if self._table is not None else 2)
            if len(payload) > MAX_CONVERTED_MS * per_ms:
                raise AudioError(
                    f"at most {MAX_CONVERTED_MS} ms of {self.wire.format} audio per message "
                    f"at {self.wire.rate} Hz (it is resampled); send smaller chunks"
                )
        if self._table is not None:
            samples = _g711.decode(self._table, payload)
        elif self._opus is not None:
            try:
                samples = _samples(self._opus.decode(payload))
            except _opus.OpusDecodeError as exc:
                raise AudioError(f"not an Opus packet: {exc}") from None
        else:
            if len(payload) % 2:
                raise AudioError("pcm16 audio must be a whole number of 2-byte samples")
            samples = _samples(payload)
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        return samples.tobytes()


class Encoder:
    """The engine's PCM16 -> wire payloads, for one session.

    pcm16 and g711 give at most one payload per ``encode`` (none while the resampler
    fills); opus gives one packet per complete 20 ms frame and buffers the rest.
    """

    def __init__(self, wire: AudioFormat, engine_rate: int) -> None:
        _check_engine_rate(engine_rate)
        self.wire = wire
        self.engine_rate = engine_rate
        self._passthrough = wire.format == "pcm16" and wire.rate == engine_rate
        self._opus = _opus.OpusEncoder(engine_rate, wire.rate) if wire.format == "opus" else None
        self._resampler = (
            None
            if wire.rate == engine_rate or self._opus is not None
            else Resampler(engine_rate, wire.rate)
        )
        self._pending = bytearray()  # opus: the engine's PCM16 short of a 20 ms frame
        table = {"g711_ulaw": _g711.ULAW_ENCODE, "g711_alaw": _g711.ALAW_ENCODE}.get(wire.format)
        self._pack: Callable[[Samples], bytes] = (
            (lambda samples: _g711.encode(table, samples))
            if table is not None
            else (lambda samples: samples.tobytes())
        )

    def encode(self, pcm: bytes) -> list[bytes]:
        """PCM16 at the engine's rate -> 0..n payloads. ValueError for an odd length."""
        if len(pcm) % 2:
            raise ValueError(f"engine audio must be whole PCM16 samples, got {len(pcm)} bytes")
        if self._passthrough:
            return [pcm] if pcm else []
        samples = _samples(pcm)
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        return self._emit(samples, flush=False)

    def flush(self) -> list[bytes]:
        """End of a stretch of audio (a response's end): what the resampler and the Opus
        buffer hold, the last packet padded with silence; then ready for more."""
        if self._resampler is None:
            tail: Samples = np.zeros(0, dtype=np.int16)
        else:
            tail = self._resampler.drain()
        return self._emit(tail, flush=True)

    def _emit(self, samples: Samples, *, flush: bool) -> list[bytes]:
        if self._opus is None:
            return [self._pack(samples)] if len(samples) else []
        self._pending += samples.tobytes()
        frame = self._opus.frame_samples * 2
        if flush and len(self._pending) % frame:
            self._pending += bytes(frame - len(self._pending) % frame)
        whole = len(self._pending) - len(self._pending) % frame
        packets = [
            self._opus.encode(bytes(self._pending[i : i + frame])) for i in range(0, whole, frame)
        ]
        del self._pending[:whole]
        return packets
