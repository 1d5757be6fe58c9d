"""Baseline: a bare trio-websocket echo server, the floor under trio-duplex's own transport.

Echoes every message as it came. ``?burst=K`` in the URL makes it first send K frames the
size and shape of a replayed event (the resume baseline of scenario 6).

    python -m benchmarks.suite.servers.bare_trio --port 8001
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from urllib.parse import parse_qs, urlsplit

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from benchmarks.suite._workload import burst_frame, raise_nofile


async def handler(request: WebSocketRequest) -> None:
    try:
        query = parse_qs(urlsplit(request.path).query)
        burst = int(query.get("burst", ["0"])[0])
        ws = await request.accept()
        for seq in range(1, burst + 1):
            await ws.send_message(burst_frame(seq))
        while True:
            await ws.send_message(await ws.get_message())
    except ConnectionClosed:
        pass
    except Exception as exc:  # never let one connection take the server down
        print(f"bare_trio: handler error {exc!r}", file=sys.stderr)


async def main(host: str, port: int, queue: int) -> None:
    async with trio.open_nursery() as nursery:
        servers = await nursery.start(
            functools.partial(
                serve_websocket,
                handler,
                host,
                port,
                None,
                message_queue_size=queue,
                max_message_size=16 * 2**20,
            )
        )
        bound = servers.port
        print(f"bare trio-websocket echo on ws://{host}:{bound}/v1/duplex", file=sys.stderr)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--queue", type=int, default=1, help="trio-websocket message_queue_size")
    args = parser.parse_args()
    raise_nofile()
    trio.run(main, args.host, args.port, args.queue)


if __name__ == "__main__":
    cli()
