"""Turn a results JSON into the Markdown table and the scenario 3 plot.

python -m benchmarks.report benchmarks/results/bench-....json [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.suite._stats import Row, Summary, format_markdown, format_table


def rows_from_json(data: dict[str, Any]) -> list[Row]:
    return [
        Row(
            scenario=r["scenario"],
            metric=r["metric"],
            ours=_summary(r["ours"]),
            baseline_name=r["baseline_name"],
            baseline=_summary(r["baseline"]),
            ratio=_summary(r["ratio"]),
            higher_is_better=r["higher_is_better"],
            target=r["target"],
            target_ratio=r.get("target_ratio"),
            target_abs=r.get("target_abs"),
            unit=r.get("unit", ""),
            note=r.get("note", ""),
        )
        for r in data["rows"]
    ]


def _summary(d: dict[str, Any]) -> Summary:
    def num(key: str) -> float:
        value = d.get(key)
        return math.nan if value is None else float(value)

    return Summary(num("median"), num("min"), num("max"), int(d.get("n", 0)))


def plot_voice(voice: dict[str, Any], path: Path, threshold_ms: float = 20.0) -> Path | None:
    """p50 and p99 added latency against session count, trio-duplex and the baseline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ramps: dict[str, list[dict[str, Any]]] = voice.get("ramps", {})
    if not any(ramps.values()):
        return None
    colors = {
        "trio-duplex": "tab:blue",
        "trio-duplex binary lane": "tab:green",
        "bare trio-websocket": "tab:orange",
    }
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for name, runs in ramps.items():
        color = colors.get(name)
        for i, run in enumerate(runs):
            steps = [s for s in run["steps"] if not math.isnan(s.get("p99_ms", math.nan))]
            if not steps:
                continue
            xs = [s["sessions"] for s in steps]
            style = "-" if run.get("phase") == "fine" else ":"
            label99 = f"{name} p99" if i == 0 else None
            label50 = f"{name} p50" if i == 0 else None
            ax.plot(xs, [s["p99_ms"] for s in steps], style, marker="o", ms=3, color=color,
                    label=label99)  # fmt: skip
            ax.plot(xs, [s["p50_ms"] for s in steps], style, marker=".", ms=2, color=color,
                    alpha=0.45, label=label50)  # fmt: skip
    ax.axhline(threshold_ms, color="red", lw=1, ls="--", label=f"{threshold_ms:g} ms limit")
    ax.text(
        0.99,
        0.02,
        "dotted: coarse ramp (finds the knee)   solid: fine ramps (they decide)",
        transform=ax.transAxes,
        ha="right",
        fontsize=8,
        color="0.3",
    )
    ax.set_yscale("log")
    ax.set_xlabel("concurrent voice sessions (50 frames/s each way, server on one core)")
    ax.set_ylabel("added latency, ms (log)")
    ax.set_title("Scenario 3: echo latency of 20 ms audio frames vs session count")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--plot", type=Path, help="write scenario 3's plot here (PNG)")
    parser.add_argument("--text", action="store_true", help="plain table instead of Markdown")
    args = parser.parse_args()
    data = json.loads(args.results.read_text())
    rows = rows_from_json(data)
    print(format_table(rows) if args.text else format_markdown(rows))
    if args.plot:
        voice = data.get("raw", {}).get("3 voice", {})
        print(plot_voice(voice, args.plot) or "no scenario 3 data to plot")


if __name__ == "__main__":
    main()
