"""The store is not a single point of failure (docs/cluster.md): ``--cluster
redis+sentinel://...`` follows a failover of the primary, and a failover while sessions
stream and resume across nodes loses no event and no session.

Real processes started here on free ports: a primary redis-server, its replica, one
redis-sentinel (quorum 1, ``down-after-milliseconds`` 1000, ``failover-timeout`` 3000),
and two ``trio-duplex serve`` nodes. The failover is ``SENTINEL FAILOVER mymaster``;
everything in other processes is polled against a deadline. Slow (a failover takes a
few seconds): marked ``integration`` like the suite's other real-process tests.
"""

from __future__ import annotations

import gc
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import coredis
import pytest
import trio

from trio_duplex import ServerConfig
from trio_duplex.cluster.connect import CHECK_INTERVAL_S
from trio_duplex.cluster.signed import Sealer
from trio_duplex.cluster.store import StoreUnavailable, open_store
from trio_duplex.server.config_checks import ConfigError, NeedsCompanion

from ..helpers import Servers
from .conftest import SECRET, STARTUP_S, _answers_ping, _free_port
from .test_relay import closed_with, drop, open_session, receive, resume, send, text, ws_to
from .test_serve import TIMEOUT, until

pytestmark = pytest.mark.integration

SERVICE = "mymaster"
FAILOVER_S = 20.0
"""The deadline for Sentinel to promote the replica and reconfigure the old primary."""


def _start(command: list[str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_S
    while not _answers_ping(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"{command[0]} did not answer PING on port {port}")
        time.sleep(0.02)
    return process


@attrs.define
class Replicated:
    """A primary, its replica and a Sentinel watching them."""

    primary: int
    replica: int
    sentinel: int
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel}/{SERVICE}/0"

    def client(self, port: int) -> coredis.Redis[str]:
        return coredis.Redis("127.0.0.1", port, decode_responses=True)

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Replicated]:
    server, sentinel = shutil.which("redis-server"), shutil.which("redis-sentinel")
    assert server and sentinel, "redis-server and redis-sentinel must be installed"
    setup = Replicated(_free_port(), _free_port(), _free_port())
    plain = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
    try:
        setup.processes.append(
            _start([server, "--port", str(setup.primary), *plain], setup.primary)
        )
        setup.processes.append(
            _start(
                [
                    *(server, "--port", str(setup.replica), *plain),
                    *("--replicaof", "127.0.0.1", str(setup.primary)),
                ],
                setup.replica,
            )
        )
        config = tmp_path / "sentinel.conf"  # Sentinel rewrites its file: one of its own
        config.write_text(
            f"port {setup.sentinel}\nbind 127.0.0.1\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {setup.primary} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 3000\n"
        )
        setup.processes.append(_start([sentinel, str(config)], setup.sentinel))
        yield setup
    finally:
        setup.stop()


async def _sentinel_sees_the_replica(setup: Replicated) -> bool:
    async with setup.client(setup.sentinel) as sentinel:
        replicas: Any = await sentinel.sentinel_replicas(SERVICE)
    return any(
        int(r["port"]) == setup.replica and not r["is_sdown"] and not r["is_disconnected"]
        for r in replicas
    )


async def _primary_port(setup: Replicated) -> int:
    async with setup.client(setup.sentinel) as sentinel:
        address = await sentinel.sentinel_get_master_addr_by_name(SERVICE)
    assert address is not None
    return int(address[1])


async def _role(port: int, setup: Replicated) -> str:
    async with setup.client(port) as client:
        role: Any = await client.role()
    return str(role[0])


async def _refreshed_on(port: int, key: str, setup: Replicated) -> None:
    """Wait until ``key``'s TTL goes up on the Redis at ``port``: a node wrote there."""
    async with setup.client(port) as client:
        last = await client.pttl(key)

        async def refreshed() -> bool:
            nonlocal last
            now = await client.pttl(key)
            went_up, last = now > last, now
            return went_up

        await until(refreshed, 3 * TIMEOUT, f"{key} refreshed on port {port}")


async def test_the_store_follows_a_failover(replicated: Replicated) -> None:
    async with open_store(replicated.url, timeout_s=1.0) as store:
        store.sign_with(SECRET)
        await store.register("n1", "ws://n1:1/v1/duplex")
        await until(lambda: _sentinel_sees_the_replica(replicated), TIMEOUT, "the replica seen")
        async with replicated.client(replicated.sentinel) as sentinel:
            await sentinel.sentinel_failover(SERVICE)

        async def promoted() -> bool:
            return await _primary_port(replicated) == replicated.replica

        await until(promoted, FAILOVER_S, "the replica promoted")

        promoted_at = trio.current_time()
        assert store.failovers == 0
        async with replicated.client(replicated.replica) as new_primary:

            async def written() -> bool:
                try:
                    await store.register("n2", "ws://n2:1/v1/duplex")
                except StoreUnavailable:  # the old primary is read-only or gone a moment
                    return False
                return await new_primary.get("trio-duplex:node:n2") is not None

            # Within about a second of use, not when Sentinel gets round to the old
            # primary (which takes writes, then drops them, until it does).
            took = await until(written, FAILOVER_S, "a write reaching the new primary")
        assert took < 3 * CHECK_INTERVAL_S, took
        assert trio.current_time() - promoted_at < 3 * CHECK_INTERVAL_S
        assert store.failovers == 1
        assert set(await store.nodes()) == {"n1", "n2"}  # n1 came over with the data
    assert await _role(replicated.replica, replicated) == "master"


async def test_the_store_follows_a_failover_after_the_primary_is_killed(
    replicated: Replicated,
) -> None:
    async with open_store(replicated.url, timeout_s=0.5) as store:
        store.sign_with(SECRET)
        await store.register("n1", "ws://n1:1/v1/duplex")

        async def replicated_n1() -> bool:
            async with replicated.client(replicated.replica) as replica:
                return await replica.get("trio-duplex:node:n1") is not None

        await until(replicated_n1, TIMEOUT, "n1 on the replica")
        await until(lambda: _sentinel_sees_the_replica(replicated), TIMEOUT, "the replica seen")
        primary = replicated.processes[0]
        primary.kill()
        primary.wait()
        with pytest.raises(StoreUnavailable):  # until Sentinel has promoted the replica
            await store.nodes()

        async def written() -> bool:
            try:
                await store.register("n2", "ws://n2:1/v1/duplex", ttl_s=60)
            except StoreUnavailable:
                return False
            return True

        # down-after-milliseconds (1 s), then the election and the promotion.
        await until(written, FAILOVER_S, "a write reaching the promoted replica")
        assert "n2" in await store.nodes() and store.failovers == 1
    assert await _role(replicated.replica, replicated) == "master"


@attrs.define
class Stream:
    """A session streaming on its home while the store fails over."""

    sent: int = 0
    echoed: list[int] = attrs.field(factory=list)


async def test_a_failover_while_sessions_stream_and_resume_loses_nothing(
    servers: Servers, replicated: Replicated
) -> None:
    flags = ("--cluster", replicated.url, "--cluster-secret", SECRET, "--relay-port", "0")
    a, b = servers.start_many(*((*flags, "--node-id", name) for name in "ab"))
    await until(lambda: _sentinel_sees_the_replica(replicated), TIMEOUT, "the replica seen")
    stream = Stream()
    async with ws_to(a.url) as on_a:
        before = await open_session(on_a)
        key = f"trio-duplex:session:{before['session_id']}"

        async def on_the_replica() -> bool:  # (replication is asynchronous)
            async with replicated.client(replicated.replica) as replica:
                value = await replica.get(key)  # (sealed: signed.py)
                now_ms = int(time.time() * 1000)
                return value is not None and Sealer.of(SECRET).open(key, value, now_ms) == "a"

        await until(on_the_replica, TIMEOUT, "the directory entry replicated")

        async def keep_streaming(cancel: trio.CancelScope) -> None:
            while True:
                stream.sent += 1
                await send(on_a, text(stream.sent, f"word {stream.sent}"))
                echo = await receive(on_a)
                while "server_event_seq" not in echo:  # input.consumed: flow control
                    echo = await receive(on_a)
                assert echo["text"] == f"word {stream.sent}", echo
                stream.echoed.append(echo["server_event_seq"])
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_streaming, nursery.cancel_scope)
            async with replicated.client(replicated.sentinel) as sentinel:
                await sentinel.sentinel_failover(SERVICE)

            async def promoted() -> bool:
                return await _primary_port(replicated) == replicated.replica

            await until(promoted, FAILOVER_S, "the replica promoted")
            # A session opened now may be claimed on the old primary, which drops it.
            async with ws_to(a.url) as during_ws:
                during = await open_session(during_ws)
                drop(during_ws)
            # Both nodes heartbeat to the new primary (they reconnected to it).
            for node in "ab":
                await _refreshed_on(replicated.replica, f"trio-duplex:node:{node}", replicated)
            nursery.cancel_scope.cancel()
        drop(on_a)
    assert stream.echoed == list(range(1, len(stream.echoed) + 1)) and len(stream.echoed) > 10

    # The session opened before the failover resumes through the other node, whole.
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(before, before["resume_token"], 0))
        resumed = await receive(on_b)
        assert resumed["type"] == "session.resumed", resumed
        replayed: list[int] = []
        while len(replayed) < len(stream.echoed):
            event = await receive(on_b)
            if "server_event_seq" in event:
                replayed.append(event["server_event_seq"])
        assert replayed == stream.echoed
    # The one opened during it too: its home claimed its sessions again.
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(during, during["resume_token"], 0))
        assert (await receive(on_b))["type"] == "session.resumed"
    # A session opened after it is in the new primary's directory, and resumes anywhere.
    async with ws_to(a.url) as on_a:
        after = await open_session(on_a)
        drop(on_a)
    async with ws_to(b.url) as on_b:
        await send(on_b, resume(after, after["resume_token"], 0))
        assert (await receive(on_b))["type"] == "session.resumed"
        await send(on_b, {"type": "session.close"})
        events, code = await closed_with(on_b)
        assert [e["type"] for e in events] == ["session.closed"] and code == 1000
    assert "Traceback" not in a.log + b.log
    # Its home claimed its sessions again: on seeing the primary change, or (if its
    # last refresh before the failover had not reached the replica) on finding it lapsed.
    assert "the store's primary changed" in a.log or "was seen gone" in a.log, a.log


async def test_with_no_sentinel_answering_the_store_is_unavailable_and_leaks_nothing() -> None:
    url = f"redis+sentinel://127.0.0.1:{_free_port()},127.0.0.1:{_free_port()}/{SERVICE}/0"
    async with open_store(url, timeout_s=0.5) as store:
        store.sign_with(SECRET)
        for _ in range(2):  # (coredis's own connections warned here, at collection)
            with pytest.raises(StoreUnavailable, match="No primary found"):
                await store.nodes()
    gc.collect()  # an unclosed buffer's ResourceWarning is an error in this suite


def test_cluster_urls_and_their_companions_in_the_config() -> None:
    config = ServerConfig(cluster=f"redis+sentinel://s1:26379,s2:26379/{SERVICE}/0",
                          cluster_secret=SECRET)  # fmt: skip
    assert config.cluster is not None
    ServerConfig(cluster="rediss://r:6380/0", cluster_secret=SECRET, cluster_redis_ca="ca.pem")
    with pytest.raises(NeedsCompanion, match="needs a rediss:// --cluster"):
        ServerConfig(cluster="redis://r/0", cluster_secret=SECRET, cluster_redis_ca="ca.pem")
    with pytest.raises(NeedsCompanion, match="needs --cluster"):
        ServerConfig(cluster_ca="ca.pem")
    with pytest.raises(ConfigError, match="redis\\+sentinel://"):
        ServerConfig(cluster="redis+sentinel://s1:26379", cluster_secret=SECRET)
