"""``python -m benchmarks [--quick] [--only 1,3]``: run the suite, print the table, write JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

from benchmarks.suite._calls import calls
from benchmarks.suite._dialects import dialects
from benchmarks.suite._plan import FULL, QUICK
from benchmarks.suite._procs import ROOT, LoadMeter, install_reaper, machine_info, stop_all
from benchmarks.suite._scenarios import SCENARIOS as BASE_SCENARIOS
from benchmarks.suite._stats import format_table
from benchmarks.suite._suite import Suite
from benchmarks.suite._telephony import telephony
from benchmarks.suite._workload import raise_nofile
from benchmarks.suite.report import plot_voice

SCENARIOS = {**BASE_SCENARIOS, "8": dialects, "9": calls, "10": telephony}
RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="trio-duplex against bare baselines, interleaved, medians with min-max.",
    )
    parser.add_argument("--quick", action="store_true", help="the short suite (< 3 minutes)")
    parser.add_argument(
        "--only",
        default="1,2,3,4,5,6,8",
        help="comma-separated scenarios (7 runs inside 1 and 4; 9, the WebRTC calls, and 10, "
        "the phone calls, only if named)",
    )
    parser.add_argument("--out", type=Path, help="JSON to write (default: benchmarks/results/)")
    parser.add_argument("--plot", type=Path, help="scenario 3 plot (default: next to the JSON)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server/client to cores")
    parser.add_argument(
        "--duplex-cmd",
        default=None,
        help="command that starts the trio-duplex server (default: python -m trio_duplex serve)",
    )
    parser.add_argument("--log-level", default="info", help="trio-duplex --log-level (its default)")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run every server and load generator at this niceness (negative needs root): "
        "on a shared machine, -10 keeps other work from taking their cores",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_reaper()
    raise_nofile()  # children inherit it
    if args.nice:
        try:  # children inherit the niceness, so every side runs at the same priority
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as exc:
            print(f"--nice {args.nice} refused ({exc}); running at the default", file=sys.stderr)
    plan = QUICK if args.quick else FULL
    suite = Suite(plan=plan, pin=not args.no_pin, log_level=args.log_level)
    if args.duplex_cmd:
        suite.duplex_cmd = shlex.split(args.duplex_cmd)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SCENARIOS and s != "7"]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2

    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    machine = machine_info()
    print(
        f"trio-duplex benchmarks ({plan.name}) on {machine['cores']} cores, "
        f"{machine['cpu_model']}, Python {machine['python']}",
        file=sys.stderr,
        flush=True,
    )
    suite.check()
    timings: dict[str, float] = {}
    load: dict[str, dict[str, float]] = {}
    whole = LoadMeter()
    try:
        for key in SCENARIOS:
            if key not in wanted:
                continue
            s0 = time.monotonic()
            meter = LoadMeter()
            print(f"== scenario {key}", file=sys.stderr, flush=True)
            suite.begin(plan.budget[key])
            try:
                SCENARIOS[key](suite)
            except Exception as exc:
                suite.fail(f"scenario {key}", exc)
            timings[key] = round(time.monotonic() - s0, 1)
            load[key] = meter.read()
            if load[key]["other_share"] > 0.1 or load[key]["steal_share"] > 0.05:
                suite.say(
                    f"scenario {key}: other processes used {load[key]['other_share']:.0%} and "
                    f"the hypervisor stole {load[key]['steal_share']:.0%} of the machine; "
                    "its figures are noisy"
                )
    finally:
        stop_all()
    elapsed = time.monotonic() - t0
    load["all"] = whole.read()

    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"bench-{stamp}-{plan.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = None
    if "3 voice" in suite.raw:
        png = args.plot or out.with_suffix(".voice.png")
        plot = plot_voice(suite.raw["3 voice"], png, plan.voice_threshold_ms)
    data = {
        "command": "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv),
        "plan": plan.name,
        "started": started.isoformat(),
        "elapsed_s": round(elapsed, 1),
        "scenario_seconds": timings,
        "background_load": load,
        "machine": machine,
        "pinning": "server on CPU 0, load generator on CPU 1" if suite.pin else "none",
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "rows": [r.as_dict() for r in suite.rows],
        "notes": suite.notes,
        "errors": suite.errors,
        "raw": suite.raw,
        "plot": str(plot) if plot else None,
        "cwd": str(ROOT),
    }
    out.write_text(json.dumps(data, indent=1, default=str))
    print()
    print(format_table(suite.rows))
    print()
    for note in suite.notes:
        print("note: " + note)
    for err in suite.errors:
        print("ERROR: " + err.splitlines()[0])
    print(f"\n{plan.name} suite: {elapsed:.0f}s; per scenario {timings}")
    print(
        f"background: other processes used {load['all']['other_share']:.0%} of the machine, "
        f"steal {load['all']['steal_share']:.0%}"
    )
    print(f"results: {out}" + (f"\nplot: {plot}" if plot else ""))
    return 1 if suite.errors else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        stop_all()
        print("interrupted: every process this run started has been stopped", file=sys.stderr)
        sys.exit(130)
