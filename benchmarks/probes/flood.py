"""A client flooding through the SDK: events/s and refusals.

    python -m benchmarks.flood [--seconds 3] [--rounds 3] [--nice -10]

One ``trio-duplex serve --engine echo`` (pinned to CPU 0) per round; in this process
(pinned to CPU 1), ``trio_duplex.client.connect`` and a loop of ``session.send`` of small
text events (``input.text.append``, the text its own number) as fast as the SDK lets it,
for N seconds, while another task reads the echoes. Then it waits (bounded) for the echo
of the last event. Reported per round: events/s sent and echoed (over the sending
window), the refusals the session received (``error`` events with ``input_backpressure``
or ``unexpected_client_event_seq``: the target is 0) and any other error, and
whether the echoes came back exactly once and in order (each number once, rising).

The SDK's pacing by ``limits.max_pending_input`` and ``input.consumed`` (docs/protocol.md,
"Input flow control") is what keeps the refusals at 0; against a server or SDK without it, the
same script counts what a flooding client meets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

import trio

from benchmarks.suite._procs import PY, free_port, pinned, start_server
from benchmarks.suite._stats import DASH
from benchmarks.suite._suite import duplex_flags
from trio_duplex.client import connect

REFUSALS = ("input_backpressure", "unexpected_client_event_seq")


async def flood(url: str, seconds: float, drain: float) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    echoed: list[int] = []
    all_echoed = trio.Event()
    sent = 0
    sending = True
    t_end = 0.0
    async with connect(url, {}) as session:

        async def reader() -> None:
            async for event in session:
                if event["type"] == "response.output_text.delta":
                    echoed.append(int(event["text"]))
                    if not sending and len(echoed) >= sent:
                        all_echoed.set()
                elif event["type"] == "error":
                    errors[str(event.get("code"))] += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            t0 = time.perf_counter()
            stop = t0 + seconds
            while time.perf_counter() < stop:
                await session.send({"type": "input.text.append", "text": str(sent)})
                sent += 1
            t_end = time.perf_counter()
            sending = False
            echoed_at_end = len(echoed)
            if echoed_at_end < sent:
                with trio.move_on_after(drain):  # a refused event never comes back
                    await all_echoed.wait()
            nursery.cancel_scope.cancel()
    window = t_end - t0
    in_order = echoed == sorted(set(echoed))
    return {
        "sent": sent,
        "echoed": len(echoed),
        "sent_per_s": sent / window,
        "echoed_per_s": echoed_at_end / window,
        "refusals": sum(errors[c] for c in REFUSALS),
        "errors": dict(errors),
        "exactly_once_in_order": in_order and echoed == list(range(sent)),
        "unique_in_order": in_order,
    }


def run_round(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    flags = duplex_flags(port)
    flags[flags.index("--log-level") + 1] = "warning"
    argv = [*args.server_cmd.split(), *flags]
    if args.nice:
        argv = ["nice", "-n", str(args.nice), *argv]
    probe = f"ws://127.0.0.1:{port}/v1/duplex"
    proc, url = start_server("trio-duplex", pinned(argv, "0"), probe=probe)
    try:
        a = proc.snapshot()
        result = trio.run(flood, url, args.seconds, args.drain)
        b = proc.snapshot()
        result["server_cpu_s"] = b["cpu"] - a["cpu"]
        return result
    finally:
        proc.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flood", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="sending window per round")
    parser.add_argument("--drain", type=float, default=10.0, help="wait for the last echo")
    parser.add_argument("--nice", type=int, default=0, help="niceness of server and client")
    parser.add_argument("--server-cmd", default=f"{PY} -m trio_duplex serve")
    parser.add_argument("--json", action="store_true", help="print every round as JSON too")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        result = run_round(args)
        runs.append(result)
        print(f"  round {r + 1}: sent {result['sent']:,} ({result['sent_per_s']:,.0f}/s), "
              f"echoed {result['echoed']:,}, refusals {result['refusals']}, "
              f"errors {result['errors'] or 'none'}, exactly once in order: "
              f"{result['exactly_once_in_order']}", file=sys.stderr, flush=True)  # fmt: skip

    def med(key: str) -> str:
        xs = [float(r[key]) for r in runs]
        return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}{DASH}{max(xs):,.0f})"

    print(f"SDK flood: {args.rounds} rounds of {args.seconds:g} s; median (min{DASH}max)")
    print("| events/s sent | events/s echoed | refusals (total) | other errors "
          "| exactly once, in order |")  # fmt: skip
    print("|---|---|---|---|---|")
    other = Counter[str]()
    for run in runs:
        other.update({k: v for k, v in run["errors"].items() if k not in REFUSALS})
    ok = sum(run["exactly_once_in_order"] for run in runs)
    refused = sum(run["refusals"] for run in runs)
    print(f"| {med('sent_per_s')} | {med('echoed_per_s')} | {refused} "
          f"| {dict(other) or 'none'} | {ok} of {len(runs)} rounds |")  # fmt: skip
    if args.json:
        print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
