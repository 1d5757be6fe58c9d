"""The speech benchmark's tables (``benchmarks/probes/speech.py``): markdown from the
load generator's results, and the verdict of a step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from benchmarks.suite._stats import percentiles


def holds(step: Mapping[str, Any], threshold_ms: float) -> bool:
    """Real time held: both frame delays' p99 within the threshold, every turn answered,
    nothing refused, lost or in error."""
    neighbour = step["neighbour_delay"].get("p99_ms", float("inf"))
    reply = step["reply_frame_delay"].get("p99_ms", float("inf"))
    if step["sessions"] == 0:  # the baseline: the neighbour alone
        return bool(neighbour <= threshold_ms and not step["errors"] and step["dead"] == 0)
    return bool(
        neighbour <= threshold_ms
        and reply <= threshold_ms
        and step["turns"] > 0
        and step["unanswered"] == 0
        and not step["errors"]
        and not step["refused"]
        and step["dead"] == 0
    )


def _ms(summary: Mapping[str, Any], key: str) -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mib(step: Mapping[str, Any], kind: str | None = None) -> str:
    memory = step.get("memory")
    if not memory:
        return "-"
    if kind is None:
        return f"{memory['rss_mib']:.0f}"
    entry = memory["procs"].get(kind)
    return "-" if entry is None else f"{entry['rss_mib']:.0f} ({entry['count']})"


def ramp_table(steps: list[dict[str, Any]], threshold_ms: float) -> str:
    lines = [
        "| N | round | neighbour p99 / max (ms) | reply frames p99 (ms) | end of speech → "
        "reply p50 / p90 / p99 (ms, turns) | → speech_stopped p50 / p90 (ms) | → transcript "
        "p50 (ms) | unanswered | turns started / sentences | server CPU (with children) "
        "| RSS (MiB) | others' CPU | load | holds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        nb, rf, er = s["neighbour_delay"], s["reply_frame_delay"], s["end_to_reply"]
        stop, et = s.get("turn_end_delay", {}), s["end_to_transcript"]
        m = s["machine"]
        lines.append(
            f"| {s['sessions']} | {s.get('round', '-')} "
            f"| {_ms(nb, 'p99_ms')} / {_ms(nb, 'max_ms')} "
            f"| {_ms(rf, 'p99_ms')} | {_ms(er, 'p50_ms')} / {_ms(er, 'p90_ms')} / "
            f"{_ms(er, 'p99_ms')} ({er['n']}) | {_ms(stop, 'p50_ms')} / {_ms(stop, 'p90_ms')} "
            f"| {_ms(et, 'p50_ms')} | {s['unanswered']} "
            f"| {s.get('speech_started', '-')} / {s.get('sentences', '-')} "
            f"| {s.get('server_cpu_share', 0):.0%} | {_mib(s)} | {m['other_share']:.0%} "
            f"| {m.get('loadavg_1m_before', 0):.2f} | {'yes' if holds(s, threshold_ms) else 'no'} |"
        )
    return "\n".join(lines)


def noise_table(steps: list[dict[str, Any]]) -> str:
    lines = [
        "| noise peak (dBFS) | end of speech → speech_stopped p50 / p90 / max (ms, turns) "
        "| turns started / sentences | split mid-sentence | end of speech → reply p50 (ms) |",
        "|---|---|---|---|---|",
    ]
    for s in steps:
        peak = s["noise_peak"]
        dbfs = "-inf" if peak == 0 else f"{20 * np.log10(peak / 32768):.0f}"
        stop = s.get("turn_end_delay", {"n": 0})
        lines.append(
            f"| {peak} ({dbfs}) | {_ms(stop, 'p50_ms')} / {_ms(stop, 'p90_ms')} / "
            f"{_ms(stop, 'max_ms')} ({stop['n']}) | {s.get('speech_started', '-')} / "
            f"{s.get('sentences', '-')} | {s.get('splits', '-')} "
            f"| {_ms(s['end_to_reply'], 'p50_ms')} |"
        )
    return "\n".join(lines)


def memory_table(steps: list[dict[str, Any]]) -> str:
    lines = [
        "| sessions | server RSS (MiB) | recognisers RSS (MiB, processes) | voice RSS "
        "(MiB, processes) | other children | total RSS (MiB) | total PSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        memory = s.get("memory") or {"pss_mib": 0}
        lines.append(
            f"| {s['sessions']} | {_mib(s, 'server')} | {_mib(s, 'recognisers')} "
            f"| {_mib(s, 'voice')} | {_mib(s, 'other')} | {_mib(s)} | {memory['pss_mib']:.0f} |"
        )
    slope = rss_slope(steps)
    if slope:
        lines.append("")
        lines += [f"Per extra session, {a} → {b} sessions: RSS {rss:+.1f} MiB, PSS {pss:+.1f} MiB"
                  for a, b, rss, pss in slope]  # fmt: skip
    return "\n".join(lines)


def rss_slope(steps: list[dict[str, Any]]) -> list[tuple[int, int, float, float]]:
    """(fewest, each larger N, RSS and PSS per extra session in MiB)."""
    measured = sorted((s for s in steps if s.get("memory")), key=lambda s: s["sessions"])
    if len(measured) < 2:
        return []
    first = measured[0]
    out = []
    for s in measured[1:]:
        extra = s["sessions"] - first["sessions"]
        if extra > 0:
            rss = (s["memory"]["rss_mib"] - first["memory"]["rss_mib"]) / extra
            pss = (s["memory"]["pss_mib"] - first["memory"]["pss_mib"]) / extra
            out.append((first["sessions"], s["sessions"], round(rss, 1), round(pss, 1)))
    return out


def pooled(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """End of speech → reply over every turn of these steps (all rounds pooled)."""
    latencies = [x / 1000 for s in steps for x in s["latencies_ms"]]
    if not latencies:
        return {"n": 0}
    p = percentiles(latencies, (50, 90, 99))
    return {"n": len(latencies), **{f"{k}_ms": v * 1000 for k, v in p.items()}}


def admission_table(steps: list[dict[str, Any]]) -> str:
    lines = [
        "| round | offered | admitted | refused | reply frames p99 (ms) "
        "| end of speech → reply p50 / p90 (ms) | unanswered |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in steps:
        er = a["end_to_reply"]
        lines.append(
            f"| {a['round']} | {a['sessions']} | {a['opened']} | {a['refused']} "
            f"| {_ms(a['reply_frame_delay'], 'p99_ms')} "
            f"| {_ms(er, 'p50_ms')} / {_ms(er, 'p90_ms')} | {a['unanswered']} |"
        )
    return "\n".join(lines)
