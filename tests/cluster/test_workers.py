"""``trio-duplex serve --workers N``: supervised worker processes sharing one port, with a
real supervisor, real workers and a real redis-server.

Which worker served a session is read from the log: in cluster mode every line names its
node (``[ID-w0]``), and each worker logs ``session ID opened`` once per session. Waits
poll real external state (the log, Redis, process tables) against a deadline.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import trio

from trio_duplex.cluster.store import HEARTBEAT_INTERVAL_S, NODE_TTL_S, Store

from ..helpers import READY, ServerProcess, Servers
from .conftest import SECRET, RedisServer
from .test_relay import drop, resume, text, ws_to
from .test_relay import receive as receive_event
from .test_relay import send as send_event
from .test_serve import TIMEOUT, clients, echo, open_many, until

pytestmark = pytest.mark.integration

MEMBERSHIP_BOUND_S = NODE_TTL_S + HEARTBEAT_INTERVAL_S
OPENED = re.compile(r"\[([A-Za-z0-9._-]+)\]: session (\S+) opened")
SPREAD = 40
"""Connections opened to see both workers serve: all on one of two workers by chance
(the kernel hashes each connection's ports) has odds of 2 ** -39."""

Workers = Callable[..., ServerProcess]


@pytest.fixture
def workers(redis_server: RedisServer, store: Store) -> Iterator[Workers]:
    """``workers(*flags)``: ``serve --workers 2 --cluster ... --node-id t`` on the emptied
    test Redis, ready. At the end the supervisor and every worker are killed and reaped,
    so that none outlives its test (and heartbeats into the next one's Redis)."""
    servers = Servers()

    def start(*flags: str) -> ServerProcess:
        return servers.start(
            *("--workers", "2", "--cluster", redis_server.url, "--cluster-secret", SECRET),
            *("--node-id", "t", *flags),
        )

    try:
        yield start
    finally:
        for server in servers.started:
            kill_tree(server.proc.pid)
        servers.stop_all()


def kill_tree(pid: int) -> None:
    try:
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def worker_pid(server: ServerProcess, node_id: str) -> int:
    """The pid the supervisor logged when the worker ``node_id`` became ready."""
    match = server.wait_for_line(rf"worker {re.escape(node_id)} ready \(pid (\d+)\)", TIMEOUT)
    return int(match.group(1))


def opened_by(server: ServerProcess) -> dict[str, str]:
    """Session id → the node id of the worker that logged its opening."""
    return {session: node for node, session in OPENED.findall(server.log)}


async def open_spread(server: ServerProcess, n: int) -> dict[str, str]:
    """Open ``n`` sessions at once on the shared URL, echo on each; session id → worker."""
    async with clients() as mine:
        opened, refused = await open_many(mine, [server.url] * n)
        assert (len(opened), refused) == (n, [])
        for ws in opened:
            await echo(ws, "hello")
    return opened_by(server)


def exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- the workers ------------------------------------------------------------------------------


async def test_each_worker_is_a_node_and_connections_spread_over_both(
    workers: Workers, store: Store
) -> None:
    server = workers()
    assert re.fullmatch(r"ws://127\.0\.0\.1:\d+/v1/duplex", server.url), server.url
    assert "(engine echo, 2 workers)" in server.log
    assert set(await store.nodes()) == {"t-w0", "t-w1"}
    # One "serving" line, the supervisor's, after both workers said they were ready.
    assert len(READY.findall(server.log)) == 1, server.log
    pids = {worker_pid(server, "t-w0"), worker_pid(server, "t-w1")}
    assert len(pids) == 2 and server.proc.pid not in pids

    by = await open_spread(server, SPREAD)
    assert len(by) == SPREAD  # each session opened once, on one worker
    counts = collections.Counter(by.values())
    assert set(counts) == {"t-w0", "t-w1"}, counts
    assert "Traceback" not in server.log


async def test_a_killed_worker_is_restarted_as_a_new_node_and_the_port_keeps_serving(
    workers: Workers, store: Store
) -> None:
    server = workers()
    victim = worker_pid(server, "t-w1")
    os.kill(victim, signal.SIGKILL)
    server.wait_for_line(
        rf"worker t-w1 \(pid {victim}\) exited unexpectedly \(killed by SIGKILL\); restarting",
        TIMEOUT,
    )
    reborn = worker_pid(server, "t-w1.1")
    assert reborn != victim

    async def restarted() -> bool:  # the dead node lapses; its successor is registered
        return set(await store.nodes()) == {"t-w0", "t-w1.1"}

    await until(restarted, MEMBERSHIP_BOUND_S + 1, "t-w1 replaced by t-w1.1")
    counts = collections.Counter((await open_spread(server, SPREAD)).values())
    assert set(counts) == {"t-w0", "t-w1.1"}, counts
    assert server.proc.poll() is None
    assert "Traceback" not in server.log


async def test_sigterm_drains_every_worker_and_the_supervisor_exits_0(
    workers: Workers, store: Store
) -> None:
    server = workers("--drain-timeout", "0")
    pids = [worker_pid(server, "t-w0"), worker_pid(server, "t-w1")]
    async with clients() as mine:
        opened, _ = await open_many(mine, [server.url] * 10)
        assert len(opened) == 10
        server.proc.send_signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(server.wait, TIMEOUT) == 0
    log = server.log
    for node in ("t-w0", "t-w1"):
        assert f"[{node}]: SIGTERM: draining" in log, log
        assert f"node {node} left" in log, log
    assert "second signal" not in log and "killing them" not in log, log
    assert "stopped (every worker exited 0)" in log, log
    assert all(exited(pid) for pid in pids)
    assert await store.nodes() == {}


async def test_a_second_signal_is_passed_on_and_the_workers_exit_at_once(
    workers: Workers,
) -> None:
    """Sessions of an engine that never ends keep the draining workers busy for a minute;
    a second SIGTERM to the supervisor reaches them, and they exit now (143)."""
    server = workers(
        *("--engine", "tests.server.stubborn_engine:Stubborn"),
        *("--drain-timeout", "60", "--engine-stop-timeout", "60"),
    )
    async with clients() as mine:
        opened, _ = await open_many(mine, [server.url] * 10)
        assert len(opened) == 10
        server.proc.send_signal(signal.SIGTERM)
        for node in ("t-w0", "t-w1"):
            server.wait_for_line(rf"\[{node}\]: SIGTERM: draining", TIMEOUT)
        server.proc.send_signal(signal.SIGTERM)
        status = await trio.to_thread.run_sync(server.wait, TIMEOUT)
    assert status == 128 + signal.SIGTERM, server.log
    assert "second signal (SIGTERM): passed on, the workers exit now" in server.log
    assert "exiting now, without finishing the drain" in server.log


async def test_a_worker_that_outlives_the_drain_bound_is_killed(
    workers: Workers, store: Store
) -> None:
    """A worker stopped with SIGSTOP cannot drain: once the bound has passed (drain 0 s +
    engine stop 0 s + margin) the supervisor kills it and exits with its status."""
    server = workers("--drain-timeout", "0", "--engine-stop-timeout", "0")
    stuck = worker_pid(server, "t-w1")
    os.kill(stuck, signal.SIGSTOP)
    server.proc.send_signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(server.wait, 30) == 128 + signal.SIGKILL
    assert "worker(s) t-w1 still running" in server.log, server.log
    assert exited(stuck)


async def test_settings_reach_the_workers_from_the_file_and_the_environment(
    redis_server: RedisServer, store: Store, tmp_path: Path
) -> None:
    config = tmp_path / "duplex.toml"
    config.write_text(
        f'workers = 2\ncluster = "{redis_server.url}"\npath = "/rt"\nnode_id = "f"\n',
        encoding="utf-8",
    )
    server = start_with_env(
        ("--port", "0", "--config", str(config)), TRIO_DUPLEX_CLUSTER_SECRET=SECRET
    )
    try:
        server.url = server.wait_for_line(READY, 15).group(1)
        assert server.url.endswith("/rt"), server.url
        assert set(await store.nodes()) == {"f-w0", "f-w1"}
        counts = collections.Counter((await open_spread(server, SPREAD)).values())
        assert set(counts) == {"f-w0", "f-w1"}, counts  # both serve /rt
        assert SECRET not in server.log
    finally:
        kill_tree(server.proc.pid)
        server.stop()


def start_with_env(args: tuple[str, ...], **env: str) -> ServerProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trio_duplex", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        env={**os.environ, **env},
    )
    server = ServerProcess(proc)
    server.start_reading()
    return server


async def test_json_log_lines_name_their_node(workers: Workers) -> None:
    server = workers("--log-format", "json")
    await open_spread(server, 4)
    server.interrupt()
    assert await trio.to_thread.run_sync(server.wait, TIMEOUT) == 0
    lines = [json.loads(line) for line in server.log.splitlines() if line.strip()]
    by_node = collections.defaultdict(list)
    for line in lines:
        by_node[line["node_id"]].append(line["message"])
    assert set(by_node) == {"t", "t-w0", "t-w1"}, by_node
    assert any(m.startswith("serving ws://") for m in by_node["t"])
    opened = [m for node in ("t-w0", "t-w1") for m in by_node[node] if m.endswith(" opened")]
    assert len(opened) == 4, by_node


async def test_a_session_resumes_through_whichever_worker_the_kernel_picks(
    workers: Workers,
) -> None:
    """Every resume arrives on a new connection, which the kernel gives to either worker:
    on the session's home it resumes there, on the other it is relayed to the home. Each
    one works; the loop goes on until both kinds have happened (at least 6 resumes, at
    most 60: both kinds missing from 60 has odds of 2 ** -59)."""
    server = workers()
    async with ws_to(server.url) as first:
        await send_event(first, {"type": "session.update", "session": {}})
        created = await receive_event(first)
        assert created["type"] == "session.created", created
        await send_event(first, text(1, "1"))
        last = (await receive_event(first))["server_event_seq"]
        drop(first)
    sid = created["session_id"]
    home = server.wait_for_line(rf"\[([A-Za-z0-9._-]+)\]: session {sid} opened", TIMEOUT)[1]
    relaying = f"session {sid}: relaying its resume to its home node {home}"
    token, seq = created["resume_token"], 1
    for attempt in range(1, 61):
        async with ws_to(server.url) as again:
            await send_event(again, resume(created, token, last))
            resumed = await receive_event(again)
            assert resumed["type"] == "session.resumed", (attempt, resumed)
            assert resumed["last_received_client_event_seq"] == seq
            token, seq = resumed["resume_token"], seq + 1
            await send_event(again, text(seq, str(seq)))
            reply = await receive_event(again)
            assert reply["text"] == str(seq), reply
            last = reply["server_event_seq"]
            drop(again)
        relayed = server.log.count(relaying)  # the log may lag: then one more resume
        if attempt >= 6 and 0 < relayed < attempt:
            break
    else:
        raise AssertionError(f"60 resumes, {server.log.count(relaying)} relayed:\n{server.log}")
    # Every resume was taken by the home, directly or through the other worker.
    resumed_on = re.findall(rf"\[([A-Za-z0-9._-]+)\]: session {sid} resumed", server.log)
    assert set(resumed_on) == {home}, resumed_on
    assert "Traceback" not in server.log


# -- the command line -------------------------------------------------------------------------


def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_duplex", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_workers_without_cluster_exit_2() -> None:
    result = run_serve("--workers", "2")
    assert result.returncode == 2
    assert "--workers needs --cluster" in result.stderr, result.stderr
    assert run_serve("--workers", "0").returncode == 2


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--metrics-port", "9100"), "--metrics-port cannot be shared by --workers"),
        (("--advertise-url", "ws://lb:1/v1/duplex"), "--advertise-url cannot be given with"),
        (("--relay-port", "9200"), "--relay-port must be 0 with --workers"),
    ],
)
def test_per_worker_settings_are_refused_with_workers(flags: tuple[str, ...], says: str) -> None:
    cluster = ("--cluster", "redis://127.0.0.1:1/0", "--cluster-secret", SECRET)
    result = run_serve("--workers", "2", *cluster, *flags)
    assert result.returncode == 2
    assert says in result.stderr, result.stderr


def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_status() -> None:
    """The store unreachable at start: each worker exits 2 with its one line; so does the
    supervisor, restarting nothing."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    result = run_serve(
        *("--workers", "2", "--cluster", f"redis://127.0.0.1:{closed}/0"),
        *("--cluster-secret", SECRET),
    )
    assert result.returncode == 2, result.stderr
    assert "cannot reach the cluster store" in result.stderr
    assert "restarting" not in result.stderr


def test_reuse_port_lets_two_servers_listen_on_one_port(
    serve: Callable[..., ServerProcess],
) -> None:
    first = serve("--reuse-port")
    second = serve("--reuse-port", "--port", str(first.port))
    assert second.url == first.url


def test_without_reuse_port_the_port_is_refused_to_a_second_server(
    serve: Callable[..., ServerProcess],
) -> None:
    """The control of the test above; and the supervisor too refuses a port already held
    by a socket without SO_REUSEPORT (exit 1, as a single server)."""
    first = serve()
    alone = run_serve("--port", str(first.port))
    assert alone.returncode == 1 and "cannot listen on" in alone.stderr, alone.stderr
    cluster = ("--cluster", "redis://127.0.0.1:1/0", "--cluster-secret", SECRET)
    supervised = run_serve("--port", str(first.port), "--workers", "2", *cluster)
    assert supervised.returncode == 1, supervised.stderr
    assert "cannot listen on" in supervised.stderr, supervised.stderr
