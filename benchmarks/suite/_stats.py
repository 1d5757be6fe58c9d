"""Pure numbers: percentiles, medians with their spread, paired ratios, the text table.

Nothing here touches a clock, a socket or a process, so it is what the smoke test checks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

TIMES = "\u00d7"  # the multiplication sign of "0.93x"
DASH = "\u2013"  # the en dash of "min-max"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    Same definition as numpy's default (``method="linear"``): p50 of [1, 2, 3, 4] is 2.5.
    """
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not in 0..100")
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def percentiles(
    values: Sequence[float], qs: Iterable[float] = (50, 90, 99, 99.9)
) -> dict[str, float]:
    """``{"p50": .., "p99": .., "p999": ..}`` for the given percentiles (99.9 -> "p999")."""
    return {_pname(q): percentile(values, q) for q in qs}


def ms_summary(values: Sequence[float]) -> dict[str, float]:
    """``n``, ``p50_ms``, ``p99_ms`` and ``max_ms`` of durations in seconds (NaN for none)."""
    if not values:
        return {"n": 0, "p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "max_ms": max(values) * 1e3,
    }


def _pname(q: float) -> str:
    return "p" + (f"{q:g}".replace(".", ""))


@attrs.frozen
class Summary:
    """Median of several runs with their min and max."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary:
        data = [v for v in values if v is not None and not math.isnan(v)]
        if not data:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(data), min(data), max(data), len(data))

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


def paired_ratios(ours: Sequence[float | None], base: Sequence[float | None]) -> list[float]:
    """``ours[i] / base[i]`` for runs made side by side; pairs with a 0 or None are skipped."""
    return [a / b for a, b in zip(ours, base, strict=False) if b not in (0, None) and a is not None]


@attrs.frozen
class Row:
    """One line of the report: our figure, the baseline's, and their ratio."""

    scenario: str
    metric: str
    ours: Summary
    baseline_name: str
    baseline: Summary
    ratio: Summary
    higher_is_better: bool = True
    target: str = ""
    target_ratio: float | None = None  # met when ratio >= it (higher better) or <= it
    target_abs: float | None = None  # met when ours.median is on the good side of it
    unit: str = ""
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target_ratio is not None:
            value = self.ratio.median
            if math.isnan(value):
                return None
            if self.higher_is_better:
                return value >= self.target_ratio
            return value <= self.target_ratio
        if self.target_abs is not None:
            value = self.ours.median
            if math.isnan(value):
                return None
            return value >= self.target_abs if self.higher_is_better else value <= self.target_abs
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "ours": self.ours.as_dict(),
            "baseline_name": self.baseline_name,
            "baseline": self.baseline.as_dict(),
            "ratio": self.ratio.as_dict(),
            "higher_is_better": self.higher_is_better,
            "target": self.target,
            "target_ratio": self.target_ratio,
            "target_abs": self.target_abs,
            "met": self.met,
            "note": self.note,
        }


def fmt_num(value: float) -> str:
    """Short human form: 3 significant digits, thousands grouped, no exponent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    mag = abs(value)
    if mag >= 1000:
        return f"{value:,.0f}"
    if mag >= 100:
        return f"{value:.0f}"
    if mag >= 10:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}"
    if mag == 0:
        return "0"
    return f"{value:.3g}"


def fmt_summary(s: Summary, unit: str = "") -> str:
    if s.n == 0:
        return "n/a"
    text = fmt_num(s.median)
    if s.n > 1:
        text += f" ({fmt_num(s.min)}{DASH}{fmt_num(s.max)})"
    return f"{text} {unit}".rstrip()


def fmt_ratio(s: Summary) -> str:
    if s.n == 0:
        return "n/a"
    text = f"{s.median:.2f}{TIMES}"
    if s.n > 1:
        text += f" ({s.min:.2f}{DASH}{s.max:.2f})"
    return text


def verdict(row: Row) -> str:
    met = row.met
    if not row.target:
        return ""
    return f"{row.target} " + {True: "✓", False: "✗ MISS", None: "?"}[met]


HEADERS = ("#", "metric", "trio-duplex", "baseline", "baseline value", "ratio", "target")


def row_cells(row: Row) -> tuple[str, ...]:
    return (
        row.scenario,
        row.metric,
        fmt_summary(row.ours, row.unit),
        row.baseline_name,
        fmt_summary(row.baseline, row.unit),
        fmt_ratio(row.ratio),
        verdict(row),
    )


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table, one row per figure, columns padded to fit."""
    cells = [HEADERS, *(row_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = []
    for n, line in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(rows: Sequence[Row]) -> str:
    """The same table in Markdown, for docs/benchmarks.md."""
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        out.append("| " + " | ".join(c.replace("|", "/") for c in row_cells(row)) + " |")
    return "\n".join(out)


def largest_passing(steps: Sequence[tuple[int, float]], limit: float) -> int:
    """Largest session count of a rising ramp whose value stayed at or below ``limit``.

    ``steps`` are ``(sessions, p99)`` in the order run; the ramp counts as failed from the
    first step over the limit on, so a lucky later step cannot raise the answer.
    """
    best = 0
    for sessions, value in steps:
        if value > limit or math.isnan(value):
            break
        best = max(best, sessions)
    return best
