"""Where a relayed resume's time goes: the front node's steps, done one by one from here.

For each of ``--sessions`` sessions opened on the home node (and dropped), time what a
relaying node does (``cluster/placement.py`` ``resume_elsewhere``, ``cluster/pool/``)
with the same calls: the store's ``locate`` (one Lua script through coredis), a new
pooled peer connection to the home's relay endpoint (TCP, the signed upgrade, the
home's signature check and proof: paid once per pair of nodes, then kept), and the
``session.resume`` over a kept peer connection (a channel opened, the resume sent) to
``session.resumed``. For comparison, a ``websockets`` client's connect to the home's
public endpoint. Speaks the ``@result`` protocol of ``benchmarks.cluster``.
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
from trio_duplex.cluster.pool import FrontChannel, Kind, Link, Pool, message_frame
from trio_duplex.cluster.pool.ws_frames import ServerFrames
from trio_duplex.cluster.relay import RelayKeys, relay_url
from trio_duplex.cluster.store import open_store

now = time.perf_counter


async def open_dropped(url: str) -> dict[str, Any]:
    async with connect(url, compression=None, proxy=None, ping_interval=None) as ws:
        await ws.send(SESSION_UPDATE)
        created: dict[str, Any] = json.loads(await ws.recv())
        ws.stream.socket.close()  # type: ignore[attr-defined]  # dropped, no close frame
    await trio.sleep(0.02)
    return created


async def resume_over(link: Link, session_id: str, token: str) -> dict[str, Any]:
    """A channel on ``link`` resuming ``session_id``: the home's first answer."""
    items: list[tuple[int, bytes]] = []
    answered = trio.Event()
    parser = ServerFrames()  # (the front passes the home's frames on whole: read here)

    def deliver(frames: bytes, count: int, controls: list[tuple[int, bytes]]) -> bool:
        items.extend(parser.feed(frames))
        answered.set()
        return False

    async with trio.open_nursery() as nursery:
        channel = FrontChannel(link, link.new_channel_id(), deliver, nursery)
        link.add(channel)
        link.put(Kind.OPEN, channel.id, f"{session_id} native".encode("ascii"))
        await channel.send(message_frame(resume(session_id, token, 0)))
        await answered.wait()
        channel.end(reset=True)  # dropped: the session detaches at home
    answer: dict[str, Any] = json.loads(items[0][1])
    return answer


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts: dict[str, list[float]] = {k: [] for k in ("locate", "relay_connect", "resume",
                                                      "public_connect")}  # fmt: skip
    keys = RelayKeys.derive(args.secret)
    async with open_store(args.store) as store, trio.open_nursery() as nursery:
        store.sign_with(args.secret)  # (the store's records are sealed with it)
        kept: Link | None = None
        for _ in range(args.sessions):
            created = await open_dropped(args.home)
            sid = created["session_id"]
            t0 = now()
            located = await store.locate(sid, "probe")
            t1 = now()
            if located.kind != "home" or located.url is None or located.node_id is None:
                raise RuntimeError(f"the store does not place {sid} at a live home: {located}")
            fresh = Pool("probe", keys, 10.0, 10.0, nursery=nursery)
            link = await fresh.link_to(located.node_id, relay_url(located.url))
            t2 = now()
            if kept is None:
                kept = link  # the one every resume goes over, as a front keeps it
            else:
                link.cut()
            t3 = now()
            resumed = await resume_over(kept, sid, created["resume_token"])
            t4 = now()
            if resumed.get("type") != "session.resumed":
                raise RuntimeError(f"expected session.resumed, got {resumed}")
            t5 = now()
            async with connect(args.home, compression=None, proxy=None, ping_interval=None):
                t6 = now()
            parts["locate"].append(t1 - t0)
            parts["relay_connect"].append(t2 - t1)
            parts["resume"].append(t4 - t3)
            parts["public_connect"].append(t6 - t5)
        nursery.cancel_scope.cancel()
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
