"""Ceiling: a bare `websockets` (asyncio) echo server, the fastest pure-Python pair we have.

Compression is off (trio-websocket has none), so every side moves the same bytes.
``?burst=K`` behaves as in ``bare_trio``.

    python -m benchmarks.suite.servers.bare_asyncio --port 8002
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from benchmarks.suite._workload import burst_frame, raise_nofile


async def handler(ws: ServerConnection) -> None:
    assert ws.request is not None  # set once the handshake is done, before the handler
    try:
        query = parse_qs(urlsplit(ws.request.path).query)
        burst = int(query.get("burst", ["0"])[0])
        for seq in range(1, burst + 1):
            await ws.send(burst_frame(seq))
        async for message in ws:
            await ws.send(message)
    except ConnectionClosed:
        pass


async def main(host: str, port: int) -> None:
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set_result, None)
    async with serve(handler, host, port, compression=None, max_size=16 * 2**20) as server:
        bound = next(iter(server.sockets)).getsockname()[1]
        print(f"bare websockets echo on ws://{host}:{bound}/v1/duplex", file=sys.stderr)
        await stop


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    raise_nofile()
    asyncio.run(main(args.host, args.port))


if __name__ == "__main__":
    cli()
