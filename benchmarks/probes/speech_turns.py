"""The turn detector alone in background noise (``benchmarks.speech``'s noise step).

Each sentence (trimmed to its speech: :func:`trim`) is fed to a fresh ``TurnDetector``
(the engine's defaults) 20 ms at a time, as frames arrive: 1 s of white noise, the
sentence with the same noise mixed in, then ``TAIL_S`` of noise. The turn end delay is
the stream time from the sentence's end to the end of the frame whose feed returned
``STOPPED``: how long the detector held the turn open after the speech (the engine's
``silence_duration_ms`` plus up to a window). A sentence with no ``STOPPED`` in the tail
is held open for all of it; ``STOPPED`` before the sentence's end is a split. Stream
time, not wall time: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

RATE: Final = 16_000
FRAME: Final = RATE // 50  # 20 ms of samples
LEAD_S: Final = 1.0
TAIL_S: Final = 3.0


def trim(samples: npt.NDArray[np.int16], below_db: float = 40.0) -> npt.NDArray[np.int16]:
    """The speech of a synthesised sentence: without the silence a synthesiser puts
    around it (espeak-ng ends each with 380 ms, flite starts with ~220), cut at the first
    and last 10 ms whose peak is within ``below_db`` of the loudest, so that its last
    sample is the end of speech."""
    block = RATE // 100
    usable = len(samples) - len(samples) % block
    if usable == 0:
        return samples
    peaks = np.abs(samples[:usable].astype(np.int32)).reshape(-1, block).max(axis=1)
    loud = np.nonzero(peaks >= peaks.max() * 10 ** (-below_db / 20))[0]
    return samples[loud[0] * block : (loud[-1] + 1) * block]


def noise(samples: int, peak: int, seed: int) -> npt.NDArray[np.int16]:
    rng = np.random.default_rng(seed)
    return rng.integers(-peak, peak + 1, samples).astype(np.int16)


def turn_ends(sentence: npt.NDArray[np.int16], peak: int, seed: int) -> dict[str, Any]:
    """One sentence in noise peaking at ``peak``: the detector's turn starts and stops
    (stream ms) and the turn end delay (ms, ``math.inf`` when held past the tail)."""
    from trio_duplex.engines.speech._detector import Kind, TurnDetector, TurnSettings
    from trio_duplex.engines.speech._vad import VadStream, vad_model

    lead, tail = int(LEAD_S * RATE), int(TAIL_S * RATE)
    sentence = trim(sentence)
    speech = np.concatenate((np.zeros(lead, np.int16), sentence, np.zeros(tail, np.int16)))
    mixed = np.clip(speech.astype(np.int32) + noise(len(speech), peak, seed), -32768, 32767)
    pcm = mixed.astype("<i2").tobytes()
    end_ms = 1000 * (lead + len(sentence)) / RATE
    detector = TurnDetector(TurnSettings(), VadStream(vad_model()))
    starts, delay = 0, math.inf
    splits = 0
    for at in range(0, len(pcm), 2 * FRAME):
        for found in detector.feed(pcm[at : at + 2 * FRAME]):
            if found.kind is Kind.STARTED:
                starts += 1
            elif detector.fed_ms <= end_ms:
                splits += 1
            elif math.isinf(delay):
                delay = detector.fed_ms - end_ms
    return {"starts": starts, "splits": splits, "delay_ms": delay}


def noise_turn_ends(
    sentences: Sequence[npt.NDArray[np.int16]], peaks: Sequence[int]
) -> list[dict[str, Any]]:
    """Per noise peak: the turn end delay over the sentences (p50, p90, max; held-open
    sentences count as ``math.inf``), turns started, splits."""
    rows = []
    for peak in peaks:
        runs = [turn_ends(s, peak, seed=i) for i, s in enumerate(sentences)]
        delays = sorted(r["delay_ms"] for r in runs)
        finite = [d for d in delays if math.isfinite(d)]
        rows.append(
            {
                "peak": peak,
                "sentences": len(runs),
                "starts": sum(r["starts"] for r in runs),
                "splits": sum(r["splits"] for r in runs),
                "held_open": len(delays) - len(finite),
                "p50_ms": delays[len(delays) // 2],
                "p90_ms": delays[min(len(delays) - 1, math.ceil(0.9 * len(delays)) - 1)],
                "max_ms": delays[-1],
                "min_ms": delays[0],
                "mean_finite_ms": sum(finite) / len(finite) if finite else math.inf,
            }
        )
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| noise peak (dBFS) | turn end delay p50 / p90 / max (ms) | held open past "
        f"{TAIL_S:g} s | turns started / sentences | split mid-sentence |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        peak = r["peak"]
        dbfs = "-inf" if peak == 0 else f"{20 * math.log10(peak / 32768):.0f}"
        shown = [
            ("held" if math.isinf(r[k]) else f"{r[k]:.0f}") for k in ("p50_ms", "p90_ms", "max_ms")
        ]
        lines.append(
            f"| {peak} ({dbfs}) | {' / '.join(shown)} | {r['held_open']} "
            f"| {r['starts']} / {r['sentences']} | {r['splits']} |"
        )
    return "\n".join(lines)
