"""Signals and measures for the audio tests."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def sine(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 10_000) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * freq * t) * amplitude).astype("<i2").tobytes()


def samples(pcm: bytes) -> NDArray[np.float64]:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def chunks(pcm: bytes, rate: int, ms: int = 20) -> list[bytes]:
    size = rate * ms // 1000 * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


def peak_hz(x: NDArray[np.float64], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def rms(x: NDArray[np.float64]) -> float:
    return float(np.sqrt(np.mean(x**2)))


def snr_db(reference: NDArray[np.float64], decoded: NDArray[np.float64], max_lag: int) -> float:
    """SNR of ``decoded`` against ``reference`` at the codec's delay (the best of 0..max_lag),
    over the middle half so that start-up and flush do not count."""
    n = len(reference)
    lo, hi = n // 4, 3 * n // 4
    seg = decoded[lo:hi]
    # correlation[k] pairs seg with reference shifted by max_lag - k samples
    correlation = np.correlate(reference[lo - max_lag : hi], seg, mode="valid")
    lag = max_lag - int(np.argmax(correlation))
    ref = reference[lo - lag : hi - lag]
    return float(10 * np.log10(np.sum(ref**2) / np.sum((seg - ref) ** 2)))
