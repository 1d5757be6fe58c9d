"""Audio on the wire: formats, their negotiation at open, and per-session codecs.

The server converts between what a client sends or receives (pcm16 at 8-48 kHz, G.711
μ-law/A-law at 8 kHz, Opus in 20 ms packets) and the PCM16 its engine declared
(``audio_rate``). Resampling: python-soxr (libsoxr); Opus: the optional extra
``trio-duplex[opus]`` (opuslib-next over the system's libopus).
"""

from ._codecs import MAX_CONVERTED_MS, AudioError, Decoder, Encoder
from ._config import ENGINE_RATES, FORMATS, RATES, AudioConfig, AudioFormat, negotiate
from ._opus import available as opus_available
from ._resample import Resampler

__all__ = [
    "ENGINE_RATES",
    "FORMATS",
    "MAX_CONVERTED_MS",
    "RATES",
    "AudioConfig",
    "AudioError",
    "AudioFormat",
    "Decoder",
    "Encoder",
    "Resampler",
    "negotiate",
    "opus_available",
]
