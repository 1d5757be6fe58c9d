"""A typed wrapper of opuslib-next (ctypes over the system's libopus), the `opus` extra.

Nothing here is imported until Opus is asked for: without the extra, or without libopus
on the machine, ``available()`` is False and ``negotiate`` refuses the format.
"""

from __future__ import annotations

import functools
from typing import Any, Final

FRAME_S: Final = 0.020
"""Every packet we send holds one 20 ms frame."""

MAX_PACKET_S: Final = 0.120
"""The longest packet Opus defines (RFC 6716 §3.2.5): what one decode can yield at most."""

BITRATE: Final = 24_000
"""Bits/s of the encoder: wideband speech at this rate is transparent enough for a voice
session, about a fifth of 24 kHz PCM16's 384 kbit/s."""

APPLICATION: Final = "voip"
"""OPUS_APPLICATION_VOIP: tuned for speech intelligibility (SILK for speech, a high-pass
filter, more robust at low rates); AUDIO aims at music fidelity, which a voice session
does not carry."""


_BANDWIDTHS: Final = {8000: 1101, 16000: 1103, 24000: 1104, 48000: 1105}
"""OPUS_BANDWIDTH_NARROWBAND, _WIDEBAND, _SUPERWIDEBAND, _FULLBAND: the audio band a
sample rate carries (up to half of it)."""


class OpusDecodeError(Exception):
    """libopus refused a packet."""


@functools.cache
def _binding() -> Any:
    # The import itself loads libopus: opuslib_next raises a bare Exception without it.
    import opuslib_next  # type: ignore[import-untyped]

    return opuslib_next


@functools.cache  # a failed import is not cached, and it looks for libopus with `ldconfig -p`
def available() -> bool:
    """Whether the binding is installed and the system's libopus loads."""
    try:
        _binding()
    except Exception:
        return False
    return True


class OpusEncoder:
    """Mono PCM16 at ``rate`` -> one packet per 20 ms frame, of audio no wider than
    ``band_rate`` carries.

    An Opus packet has no sample rate of its own (libopus encodes from and decodes to any
    of 8/12/16/24/48 kHz, and RTP clocks it at 48 kHz whatever it holds): so the engine's
    PCM goes in as it is, with no resampler (neither its CPU nor its 10-30 ms delay), and
    the wire's rate only caps the band encoded.
    """

    def __init__(self, rate: int, band_rate: int) -> None:
        lib = _binding()
        self.frame_samples = int(rate * FRAME_S)
        self._encoder = lib.Encoder(rate, 1, APPLICATION)
        self._encoder.bitrate = BITRATE
        self._encoder.max_bandwidth = _BANDWIDTHS[min(rate, band_rate)]

    def encode(self, frame: bytes) -> bytes:
        """``frame``: exactly one 20 ms frame of PCM16."""
        packet: bytes = self._encoder.encode(frame, self.frame_samples)
        return packet


class OpusDecoder:
    """One packet -> mono PCM16 at ``rate``: at most 120 ms of it, whatever the packet."""

    def __init__(self, rate: int) -> None:
        lib = _binding()
        self._error: type[Exception] = lib.OpusError
        self._max_samples = int(rate * MAX_PACKET_S)
        self._decoder = lib.Decoder(rate, 1)

    def decode(self, packet: bytes) -> bytes:
        if not packet:
            # libopus would take an empty packet for a lost one and conceal it: 120 ms of
            # invented audio from nothing.
            raise OpusDecodeError("an empty Opus packet")
        try:
            pcm: bytes = self._decoder.decode(packet, self._max_samples)
        except self._error as exc:
            raise OpusDecodeError(str(exc)) from None
        return pcm
