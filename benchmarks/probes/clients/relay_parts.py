"""Where a relayed resume's time goes: the front node's steps, done one by one from here.

For each of ``--sessions`` sessions opened on the home node (and dropped), time what a
relaying node does (``server/server.py`` ``_resume_elsewhere``, ``cluster/relay.py``)
with the same calls: the store's ``locate`` (one Lua script through coredis), the
``websockets.trio`` connect to the home's relay endpoint with a signed header (TCP,
HTTP upgrade, the home's signature check), and the ``session.resume`` over it to
``session.resumed``. For comparison, the same client's connect to the home's public
endpoint. Speaks the ``@result`` protocol of ``benchmarks.cluster``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import trio
from websockets.trio.client import connect

from benchmarks.suite._stats import ms_summary
from benchmarks.suite._workload import SESSION_UPDATE, emit, resume
from trio_duplex.cluster.relay import HEADER, RelayKeys, relay_url, sign
from trio_duplex.cluster.store import open_store

now = time.perf_counter


async def open_dropped(url: str) -> dict[str, Any]:
    async with connect(url, compression=None, proxy=None, ping_interval=None) as ws:
        await ws.send(SESSION_UPDATE)
        created: dict[str, Any] = json.loads(await ws.recv())
        ws.stream.socket.close()  # type: ignore[attr-defined]  # dropped, no close frame
    await trio.sleep(0.02)
    return created


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts: dict[str, list[float]] = {k: [] for k in ("locate", "relay_connect", "resume",
                                                      "public_connect")}  # fmt: skip
    async with open_store(args.store) as store:
        store.sign_with(args.secret)  # (the store's records are sealed with it)
        for _ in range(args.sessions):
            created = await open_dropped(args.home)
            sid = created["session_id"]
            t0 = now()
            located = await store.locate(sid, "probe")
            t1 = now()
            if located.kind != "home" or located.url is None or located.node_id is None:
                raise RuntimeError(f"the store does not place {sid} at a live home: {located}")
            keys = RelayKeys.derive(args.secret)
            header = sign(keys, "probe", located.node_id, sid, time.time()).header
            async with connect(
                relay_url(located.url),
                additional_headers={HEADER: header},
                compression=None,
                proxy=None,
                ping_interval=None,
            ) as up:
                t2 = now()
                await up.send(resume(sid, created["resume_token"], 0))
                resumed = json.loads(await up.recv())
                t3 = now()
                if resumed.get("type") != "session.resumed":
                    raise RuntimeError(f"expected session.resumed, got {resumed}")
                await up.send(json.dumps({"type": "session.close"}))
            t4 = now()
            async with connect(args.home, compression=None, proxy=None, ping_interval=None):
                t5 = now()
            parts["locate"].append(t1 - t0)
            parts["relay_connect"].append(t2 - t1)
            parts["resume"].append(t3 - t2)
            parts["public_connect"].append(t5 - t4)
    return {key: ms_summary(values) for key, values in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)
    emit("result", trio.run(run, args))


if __name__ == "__main__":
    main()
