"""What the tables of ``benchmarks.workers`` share: the p99 that counts as held, part 1's
target, and a median with its min-max.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from benchmarks.suite._stats import DASH

THRESHOLD_MS = 20.0
CPU_TARGET = 1.10
"""Part 1's target: --workers 2's CPU per session within 10 % of --workers 1's."""


def mid(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float], fmt: str, unit: str = "") -> str:
    if not values:
        return DASH
    shown = f"{mid(values):{fmt}}{unit}"
    return shown + (f" ({min(values):{fmt}}{DASH}{max(values):{fmt}})" if len(values) > 1 else "")
