"""Load generator on trio-websocket: pipelined throughput and one-at-a-time latency.

The same client drives trio-duplex (``--proto duplex``: session.update, JSON replies,
acks every ``--ack-every`` events) and the bare echo server (``--proto bare``), so the
ratio between the two measures the server and the protocol, not the client library.

Speaks the stdout protocol of ``_procs.run_client``: ``@mark NAME`` lines around the
measured window, then one ``@result {json}`` line.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from benchmarks.suite._stats import percentiles
from benchmarks.suite._workload import (
    SESSION_CLOSE,
    SESSION_UPDATE,
    TEXT_DELTA,
    TEXT_FRAME,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
)


async def open_session(ws: WebSocketConnection) -> dict[str, Any]:
    await ws.send_message(SESSION_UPDATE)
    created: dict[str, Any] = json.loads(await ws.get_message())
    if created.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {created}")
    return created


async def close_session(ws: WebSocketConnection) -> None:
    with trio.move_on_after(3):
        await ws.send_message(SESSION_CLOSE)
        while True:
            event = json.loads(await ws.get_message())
            if event.get("type") in ("session.closed", "session.expired"):
                return


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    duplex = args.proto == "duplex"
    errors: collections.Counter[str] = collections.Counter()
    received = 0
    async with open_websocket_url(
        args.url, message_queue_size=args.window * 2 + 16, max_message_size=16 * 2**20
    ) as ws:
        if duplex:
            await open_session(ws)
        credit = trio.Semaphore(args.window)

        async def sender() -> None:
            while True:
                await credit.acquire()
                await ws.send_message(TEXT_FRAME)

        async def receiver() -> None:
            nonlocal received
            while True:
                message = await ws.get_message()
                if duplex:
                    event = json.loads(message)
                    kind = event["type"]
                    if kind != TEXT_DELTA:
                        errors[event.get("code", kind)] += 1
                        if kind == "error":
                            credit.release()  # the input was refused: it will not come back
                        continue
                    seq = event["server_event_seq"]
                    if seq % args.ack_every == 0:
                        await ws.send_message(ack(seq))
                received += 1
                credit.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(receiver)
            await trio.sleep(args.warmup)
            emit("mark", "window_start")
            n0, c0, t0 = received, cpu_seconds(), time.perf_counter()
            await trio.sleep(args.duration)
            n1, c1, t1 = received, cpu_seconds(), time.perf_counter()
            emit("mark", "window_end")
            nursery.cancel_scope.cancel()
        if duplex:
            await close_session(ws)
    return {
        "events": n1 - n0,
        "seconds": t1 - t0,
        "rate": (n1 - n0) / (t1 - t0),
        "client_cpu": c1 - c0,
        "errors": dict(errors),
    }


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    duplex = args.proto == "duplex"
    samples: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    async with open_websocket_url(
        args.url, message_queue_size=16, max_message_size=16 * 2**20
    ) as ws:
        if duplex:
            await open_session(ws)
        emit("mark", "window_start")
        c0 = cpu_seconds()
        clock = time.perf_counter_ns
        for i in range(args.warmup_events + args.samples):
            t0 = clock()
            await ws.send_message(TEXT_FRAME)
            message = await ws.get_message()
            t1 = clock()
            if duplex:
                event = json.loads(message)
                if event["type"] != TEXT_DELTA:
                    errors[event.get("code", event["type"])] += 1
                    continue
                seq = event["server_event_seq"]
                if seq % args.ack_every == 0:
                    await ws.send_message(ack(seq))
            if i >= args.warmup_events:
                samples.append((t1 - t0) / 1000)
        c1 = cpu_seconds()
        emit("mark", "window_end")
        if duplex:
            await close_session(ws)
    result: dict[str, Any] = {
        "samples": len(samples),
        "client_cpu": c1 - c0,
        "errors": dict(errors),
    }
    result.update({k + "_us": v for k, v in percentiles(samples, (50, 90, 99, 99.9)).items()})
    result["max_us"] = max(samples)
    return result


async def main(args: argparse.Namespace) -> None:
    with trio.fail_after(args.max_time):
        result = await (throughput(args) if args.mode == "throughput" else latency(args))
    emit("result", result)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["throughput", "latency"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--proto", choices=["duplex", "bare"], required=True)
    parser.add_argument("--window", type=int, default=100, help="events in flight")
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before the window")
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds")
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--warmup-events", type=int, default=300)
    parser.add_argument("--max-time", type=float, default=60.0)
    args = parser.parse_args()
    raise_nofile()
    trio.run(main, args)


if __name__ == "__main__":
    cli()
