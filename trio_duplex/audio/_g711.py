"""G.711 μ-law and A-law (ITU-T G.711), as numpy lookup tables.

The tables are computed once at import from the reference algorithm (Sun's g711.c, which
CPython's audioop also follows, so the two agree bit for bit: tests/audio checks all
65536 samples and all 256 codes). Encoding indexes a 65536-entry table by the int16
sample viewed as uint16; decoding a 256-entry table by the code. audioop itself is not
used: it is deprecated (a DeprecationWarning on 3.11, gone in 3.13).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

_SEG_SHIFT: Final = 4
_QUANT_MASK: Final = 0x0F
_ULAW_BIAS: Final = 0x84
_ULAW_CLIP: Final = 8159  # in 14-bit units


def _all_samples() -> NDArray[np.int32]:
    """Every int16 value, in the order of its uint16 view (0, 1, ..., 32767, -32768, ..., -1)."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)


def _ulaw_encode_table() -> NDArray[np.uint8]:
    pcm = _all_samples() >> 2  # 14-bit
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(pcm), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg_end = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
    seg = np.searchsorted(seg_end, magnitude, side="left")
    code = (seg << _SEG_SHIFT) | ((magnitude >> (seg + 1)) & _QUANT_MASK)
    code = np.where(seg >= 8, 0x7F, code)  # past the top segment (the clip): the loudest code
    return (code ^ mask).astype(np.uint8)


def _alaw_encode_table() -> NDArray[np.uint8]:
    pcm = _all_samples() >> 3  # 13-bit
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    magnitude = np.where(pcm >= 0, pcm, -pcm - 1)
    seg_end = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    seg = np.searchsorted(seg_end, magnitude, side="left")  # 13 bits: never 8
    shift = np.where(seg < 2, 1, seg)
    code = (seg << _SEG_SHIFT) | ((magnitude >> shift) & _QUANT_MASK)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode_table() -> NDArray[np.int16]:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & _QUANT_MASK) << 3) + _ULAW_BIAS) << ((u & 0x70) >> _SEG_SHIFT)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype("<i2")


def _alaw_decode_table() -> NDArray[np.int16]:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> _SEG_SHIFT
    t = (a & _QUANT_MASK) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype("<i2")


ULAW_ENCODE: Final = _ulaw_encode_table()
ALAW_ENCODE: Final = _alaw_encode_table()
ULAW_DECODE: Final = _ulaw_decode_table()
ALAW_DECODE: Final = _alaw_decode_table()


def encode(table: NDArray[np.uint8], samples: NDArray[np.int16]) -> bytes:
    """PCM16 samples -> one G.711 code per sample."""
    return table[samples.view(np.uint16)].tobytes()


def decode(table: NDArray[np.int16], codes: bytes) -> NDArray[np.int16]:
    """G.711 codes -> PCM16 samples (two bytes of output per byte of input)."""
    return table[np.frombuffer(codes, dtype=np.uint8)]
