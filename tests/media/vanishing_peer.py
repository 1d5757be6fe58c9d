"""A peer that vanishes: ``python -m tests.media.vanishing_peer`` prints its offer (a JSON
line), reads the answer (a JSON line), prints ``"open"`` once its data channel is open,
then waits to be killed, which closes nothing (no DTLS close): the worker must notice by
ICE consent alone."""

from __future__ import annotations

import asyncio
import json
import sys

from .rtc import Client, loopback_only


async def main() -> None:
    loopback_only()
    client = Client()
    print(json.dumps(await client.offer()), flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    await client.answer(json.loads(line))
    await client.until(lambda: client.dc.readyState == "open")
    print(json.dumps("open"), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
