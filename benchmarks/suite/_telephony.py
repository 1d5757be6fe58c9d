"""Scenario 10: phone calls (issue 29, docs/plans/telephony.md §8) against WebSocket voice
sessions per core, on the same ``voice`` engine (``benchmarks/probes/call_engine.py``'s
``StampedVoice``: the engine as built, noting the microphone's lateness).

- **Calls per core at real time.** One ``serve --twilio-public-url`` (its auth token in
  its environment) per ramp, on CPU 0, takes a ramp of phone calls from two load
  generators (``clients/telephony.py``, on CPU 1), each call placed through the fake
  Twilio (``trio_duplex/testing/twilio_provider.py``: the signed webhook, the TwiML, the
  Media Streams WebSocket; μ-law ``media`` JSON every 20 ms up, the server's ``media``
  played on the fake's clock and its marks echoed as they play); the same server and
  schedule take a ramp of ``/v1/duplex`` sessions on the binary lane in ``g711_ulaw`` at
  8 kHz both ways (the same G.711 and resampling work in the core: the ratio is the
  Twilio dialect's and channel's cost). Both ask a reply every ``tel_every`` seconds (a
  key, DTMF ``5``; the text ``5``): the same 120 ms of speech. Rounds interleaved, as
  scenarios 3 and 9 do.
- **A step holds** when every call was carried and none died, the playout ran dry inside
  replies for at most ``tel_underrun`` of the audio received, and the microphone's
  lateness at the engine (each append's arrival against the session's own audio clock,
  less its best of the last 5 s: scenario 9's) has p99 ≤ ``voice_threshold_ms``, in one of
  its windows. The playout judged is the fake's (``gaps``; for a session the same clock
  over its frames' arrival) *started ``tel_jitter_ms`` (20 ms) after a reply's first
  byte*, as a real one with a jitter buffer of one frame: the fake's own, which plays the
  first byte at once, runs dry ~5 ms in every reply on an idle server, both ways alike,
  because the core's 24 → 8 kHz resampler holds 5 ms back (a reply's first μ-law frame is
  120 bytes, its last 200), so it could never meet 1 %. Its figure is kept beside
  (``raw_underrun_pct``).
- **Reported**: the largest N that held; N per core by CPU (1 / the slope of the server's
  CPU against N over the steps whose CPU grew, scenario 9's ``per_core``); the CPU per
  call at the most calls the CPU grew to; each a row, calls against sessions, with their
  ratio per round. The reply's wait (key → first audio at the fake) is in the raw data.

- **The audio gap across a deploy** (``deploy_gap``): ``tel_deploy_calls`` calls on three
  ``--cluster`` nodes (one redis-server) behind the readiness-routing balancer
  (``trio_duplex/testing/balancer.py``), all homed on one, which is SIGTERMed mid-reply;
  per call the last audio heard on the old stream to the first on the new one, split at
  the close, the ``<Redirect>``'s TwiML, ``start`` and the first ``media``; the calls lost.

Not built here: the audio heard twice at the seam, and the plan's
``--twilio-input-chunk`` lever (no such flag on the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import queue
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks.suite._calls import interleaved, merge_steps, read_recorder, run_fleet, tree
from benchmarks.suite._procs import (
    PY,
    BenchError,
    Proc,
    free_port,
    pinned,
    redis,
    start_server,
)
from benchmarks.suite._scenarios import row
from benchmarks.suite._stats import percentile
from benchmarks.suite._suite import SERVER_CPU, Suite
from trio_duplex.testing.balancer import Balancer, open_balancer, reserve
from trio_duplex.testing.twilio_provider import FakeCall, FakeTwilio, run_scenario

ENGINE = "benchmarks.probes.call_engine:StampedVoice"
PHONE = "phone calls (fake Twilio, μ-law JSON)"
WS = "WebSocket sessions, binary lane, g711_ulaw"
SHARES = 2
TOKEN_ENV = "TRIO_DUPLEX_TWILIO_AUTH_TOKEN"
OUT_ENV = "DUPLEX_BENCH_CALLS_OUT"
KEPT = ("underrun_pct", "raw_underrun_pct", "mic_late_p99_ms", "server_cpu_util", "held_slo")


def server_argv(port: int, log_level: str) -> list[str]:
    return [
        PY, "-m", "trio_duplex", "serve",
        "--host", "127.0.0.1", "--port", str(port), "--engine", ENGINE,
        "--twilio-public-url", f"http://127.0.0.1:{port}",
        "--max-sessions", "20000", "--max-connections", "20000",
        "--max-connections-per-ip", "20000",
        "--journal-max-bytes", str(64 * 2**20), "--max-event-bytes", str(2**20),
        "--drain-timeout", "1", "--log-level", log_level,
    ]  # fmt: skip


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def server(suite: Suite) -> Iterator[tuple[Proc, str, Path]]:
    """The bench server (a fresh auth token in its environment and the load generators',
    never on a command line); its recorder's file, readable once the block is over."""
    port = free_port()
    fd, name = tempfile.mkstemp(prefix="telephony-bench-", suffix=".json")
    os.close(fd)
    out = Path(name)
    token = secrets.token_hex(16)
    with _environ({TOKEN_ENV: token, OUT_ENV: str(out)}):
        argv = pinned(server_argv(port, suite.log_level), SERVER_CPU if suite.pin else None)
        proc, _ = start_server(
            "trio-duplex --twilio", argv, probe=f"ws://127.0.0.1:{port}/v1/duplex"
        )
        try:
            yield proc, f"http://127.0.0.1:{port}", out
        finally:
            proc.stop()


def fleet(
    suite: Suite, proc: Proc, url: str, kind: str, steps: Sequence[int]
) -> tuple[list[dict[str, Any]], list[dict[str, float]]]:
    """Scenario 10's load generators (``_calls.run_fleet``)."""
    p = suite.plan
    args = [
        "--kind", kind, "--url", url, "--every", str(p.tel_every),
        "--jitter-ms", str(p.tel_jitter_ms), "--ws-frame-ms", str(p.tel_ws_frame_ms),
    ]  # fmt: skip
    return run_fleet(
        suite, proc, "telephony", args, steps,
        opening=p.tel_open, settle=p.tel_settle, measure=p.tel_measure, windows=p.tel_windows,
        # Every load generator has started by then: the fake's imports and tables take
        # ~1 s of CPU, and 5 s were seen on a machine with a load of 12.
        lead_s=8.0,
    )  # fmt: skip


def merge(
    suite: Suite, shares: list[dict[str, Any]], samples: list[dict[str, float]],
    recorder: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Scenario 10's steps (``_calls.merge_steps``): each window from every share's part
    together, the engine's microphone lateness in it, and the server's CPU at its
    edges."""
    judge = functools.partial(window, suite)
    return merge_steps(shares, samples, suite.plan.tel_windows, recorder, judge, KEPT)


def window(
    suite: Suite, parts: list[dict[str, Any]], got: list[dict[str, Any]],
    a: dict[str, float], b: dict[str, float], mic_t: list[float], mic_late: list[float],
) -> dict[str, Any]:  # fmt: skip
    """One measured window of a step, every share's together."""
    p = suite.plan
    dry = [x for w in got for x in w["dry_ms"]]
    dry_jb = [x for w in got for x in w["dry_jb_ms"]]
    audio_s = sum(w["audio_s"] for w in got)
    waits = [x for w in got for x in w["wait_ms"]]
    answered = [x for x in waits if x >= 0]
    late = [x * 1000 for t, x in zip(mic_t, mic_late, strict=True) if a["t"] <= t < b["t"]]
    replies = sum(w["replies"] for w in got)
    step: dict[str, Any] = {
        "sessions": parts[0]["sessions"],
        "held": sum(part["held"] for part in parts),
        "dead": sum(part["dead"] for part in parts),
        "audio_s": round(audio_s, 3),
        # The share of the replies' audio a playout ran dry for, in % (NaN with no audio):
        # the fake's (and Playout's), which starts at a reply's first byte, and one that
        # starts tel_jitter_ms later (the SLO's: see the module's docstring).
        "raw_dry_ms": round(sum(dry), 3),
        "raw_underrun_pct": sum(dry) / 10 / audio_s if audio_s else math.nan,
        "raw_replies_dry": sum(w["replies_dry"] for w in got),
        "dry_ms": round(sum(dry_jb), 3),
        "dry_max_ms": max(dry_jb, default=0.0),
        "underrun_pct": sum(dry_jb) / 10 / audio_s if audio_s else math.nan,
        "replies": replies,
        "replies_dry": sum(w["replies_dry_jb"] for w in got),
        "unanswered": len(waits) - len(answered),
        "wait_p50_ms": percentile(answered, 50) if answered else math.nan,
        "wait_p99_ms": percentile(answered, 99) if answered else math.nan,
        "mic_late_p99_ms": percentile(late, 99) if late else math.nan,
        "mic_chunks": len(late),
        "client_cpu_util": max(w["client_cpu_util"] for w in got),
        "client_lag_p99_ms": max(w["client_lag_p99_ms"] for w in got),
        "server_cpu_util": (b["cpu"] - a["cpu"]) / (b["t"] - a["t"]),
        "server_rss": b["rss"],
        "errors": {k: v for w in got for k, v in w["errors"].items()},
        "failures": {k: v for part in parts for k, v in part["failures"].items()},
    }
    step["held_slo"] = bool(
        step["held"] >= step["sessions"]
        and not step["dead"]
        and step["underrun_pct"] <= p.tel_underrun * 100
        and step["mic_late_p99_ms"] <= p.voice_threshold_ms
    )
    return step


def say_step(kind: str, step: dict[str, Any]) -> None:
    print(
        f"  10 {kind} n={step['sessions']} held={step['held']} "
        f"underrun={step['underrun_pct']:.2f}% ({step['replies_dry']}/{step['replies']} replies, "
        f"max {step['dry_max_ms']:.1f} ms; raw {step['raw_underrun_pct']:.1f}%) "
        f"wait p99={step['wait_p99_ms']:.0f} ms "
        f"mic late p99={step['mic_late_p99_ms']:.1f} ms "
        f"server cpu={step['server_cpu_util']:.0%} client cpu={step['client_cpu_util']:.0%} "
        f"{'ok' if step['held_slo'] else 'FAIL'}",
        flush=True,
        file=sys.stderr,
    )


def ramp_run(suite: Suite, kind: str, steps: Sequence[int]) -> dict[str, Any]:
    with server(suite) as (proc, url, out):
        before = tree(proc)
        shares, samples = fleet(suite, proc, url, kind, steps)
    merged = merge(suite, shares, samples, read_recorder(out))
    for step in merged:
        say_step(kind, step)
    return {"before": before, "steps": merged}


def telephony(suite: Suite) -> None:
    p = suite.plan
    if not suite.available("duplex"):
        suite.say(f"10 telephony skipped: {suite.missing['duplex']}")
        return
    plan = {PHONE: ("phone", p.tel_steps), WS: ("ws", p.tel_ws_steps)}
    ramps = interleaved(suite, "10 telephony", p.tel_rounds, plan, ramp_run)
    suite.raw["10 telephony"] = ramps.raw()
    found, cores, each, at = ramps.found, ramps.cores, ramps.each, ramps.at
    slo = (
        f"underrun ≤ {p.tel_underrun:.0%} of the replies' audio, "
        f"mic p99 ≤ {p.voice_threshold_ms:g} ms"
    )
    tops = [
        f"{kind}: {sum(n == steps[-1] for n in found[name])} of {len(found[name])}"
        for name, (kind, steps) in plan.items()
        if any(n == steps[-1] for n in found[name])
    ]
    topped = f"; the ramp's top held (a floor, not the knee) in rounds of {', '.join(tops)}"
    row(suite, "10", f"phone calls held, {slo} (server on 1 core)", found[PHONE], WS,
        found[WS], note="largest N of the ramp that held; the voice engine both ways"
        + (topped if tops else ""))  # fmt: skip
    row(suite, "10", "phone calls per core, from server CPU per call", cores[PHONE], WS,
        cores[WS], note="1 / the slope of CPU against N over the steps whose CPU grew")  # fmt: skip
    row(suite, "10", "server CPU per call, at the most calls its CPU grew to", each[PHONE],
        WS, each[WS], higher_is_better=False, unit="%",
        note=f"% of a core, fixed costs in; N = {at[PHONE]} calls, {at[WS]} sessions")  # fmt: skip
    deploy_gap(suite)


DEPLOY_ACCOUNT = "AC" + "d" * 32
DEPLOY_SECRET = "benchmark-cluster-secret-not-for-production"
DEPLOY_KEYS = "0123456789012345"
"""The long reply a SIGTERM interrupts: a key a reply (the ``voice`` engine speaks each
digit), 16 of them sent at once, so queued and spoken back to back (its ``max_queued``)."""
DEPLOY_HEARD = 3200
"""μ-law bytes (0.4 s) every call has heard of the reply when its home is SIGTERMed."""
DEPLOY_WAIT_S = 30.0
"""The bound on each wait of a deploy run (nodes, calls, the new streams' audio)."""
QUIET_S = 0.5
"""A reply is over once nothing has played for this long (the keys' replies run back to
back: no silence of this length inside the long reply)."""
SILENCE = b"\xff" * 160  # 20 ms of μ-law silence: the caller's line


def node_argv(port: int, redis_url: str, name: str, public: str, log_level: str) -> list[str]:
    """A cluster node of the deploy run: the ``voice`` engine (it migrates), Twilio's
    ``--twilio-public-url`` the balancer's (a ``<Redirect>`` lands on a ready node)."""
    return [
        PY, "-m", "trio_duplex", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--engine", "voice", "--relay-port", "0",
        "--cluster", redis_url, "--cluster-secret", DEPLOY_SECRET, "--node-id", name,
        "--twilio-public-url", public, "--twilio-account-sid", DEPLOY_ACCOUNT,
        "--log-level", log_level,
    ]  # fmt: skip


@contextlib.contextmanager
def balanced(
    ports: Sequence[int], sock: socket.socket
) -> Iterator[tuple[Balancer, trio.lowlevel.TrioToken]]:
    """The readiness-routing balancer (``trio_duplex/testing/balancer.py``) on ``sock``, in
    a thread of its own running trio; its trio token, to pull its levers from here."""
    got: queue.Queue[tuple[Balancer, trio.lowlevel.TrioToken, trio.Event] | BaseException]
    got = queue.Queue()

    async def serve() -> None:
        stop = trio.Event()
        async with open_balancer(ports, sock) as balancer:
            got.put((balancer, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()

    def main() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # (reported to the caller, which raises it)
            got.put(exc)

    thread = threading.Thread(target=main, daemon=True, name="balancer")
    thread.start()
    item = got.get(timeout=DEPLOY_WAIT_S)
    if isinstance(item, BaseException):
        raise BenchError(f"the balancer failed: {item!r}")
    balancer, token, stop = item
    try:
        yield balancer, token
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(DEPLOY_WAIT_S)


def _quiet(call: FakeCall) -> bool:
    if call.ended:
        return True
    if not call.played or call.buffered:
        return False
    last = call.played[-1]
    return call.clock.now() > last.at + len(last.data) / 8000 + QUIET_S


async def deploy_calls(
    public: str, token: str, n: int, avoid: Callable[[set[int]], None],
    others: set[int], sigterm: Callable[[], None], ports: list[int],
) -> list[FakeCall]:  # fmt: skip
    """``n`` calls placed while the balancer avoids ``others`` (so all are homed on the one
    left), then a control call on another node; each a caller's line of silence and the
    long reply asked; once every call has heard ``DEPLOY_HEARD`` of it, ``sigterm``; then
    each call's new stream waited for until its first audio is heard (or the call ends),
    and every reply until it is over. The calls, the control last."""
    control_port = ports[1]
    async with FakeTwilio(public, token, DEPLOY_ACCOUNT) as twilio:
        avoid(others)
        calls = [await twilio.place_call() for _ in range(n)]
        avoid(set(ports) - {control_port})  # the control call: elsewhere, not interrupted
        calls.append(await twilio.place_call())
        for call in calls:
            await call.wait_for(
                lambda c: (c.streams and c.streams[0].opened_at is not None) or c.ended,
                timeout=DEPLOY_WAIT_S,
            )
        avoid(set())  # the redirects go wherever is ready
        talking = True

        async def talk(call: FakeCall) -> None:
            while talking and not call.ended:
                try:
                    await call.send_audio(SILENCE)
                except Exception:  # (the stream changing under it: the next chunk goes on)
                    await asyncio.sleep(0.02)

        talkers = [asyncio.create_task(talk(call)) for call in calls]
        for call in calls:
            for key in DEPLOY_KEYS:
                await call.dtmf(key)
        for call in calls:
            await call.wait_for(
                lambda c: len(c.audio_heard(0)) >= DEPLOY_HEARD or c.ended,
                timeout=DEPLOY_WAIT_S,
            )
        sigterm()
        for call in calls:
            with contextlib.suppress(TimeoutError):
                await call.wait_for(
                    lambda c: any(p.stream == 1 for p in c.played) or c.ended,
                    timeout=DEPLOY_WAIT_S,
                )
        # Every reply played to its end (nothing arriving for QUIET_S): what each heard.
        deadline = time.monotonic() + DEPLOY_WAIT_S
        # (polling the records: a reply's end is a silence, no event says it)
        while time.monotonic() < deadline and not all(_quiet(c) for c in calls):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        talking = False
        for task in talkers:
            task.cancel()
        await asyncio.gather(*talkers, return_exceptions=True)
        for call in calls:
            with contextlib.suppress(Exception):
                await call.stop(timeout=5.0)
        return calls


def seam(call: FakeCall) -> dict[str, float] | None:
    """One call across the deploy, in ms from the end of the last audio it heard on the
    old stream: the old stream's close, the ``<Redirect>``'s TwiML answered, the new
    stream's ``start``, its first ``media`` received, its first audio played (``gap``).
    None: the call was lost (no new stream, or no audio heard on it)."""
    old = [p for p in call.played if p.stream == 0]
    new = [p for p in call.played if p.stream == 1]
    if len(call.streams) < 2 or not old or not new:
        return None
    first, second = call.streams[0], call.streams[1]
    end = old[-1].at + len(old[-1].data) / 8000
    closed = first.closed_at if first.closed_at is not None else math.nan
    twiml = next((f.at for f in call.fetches if f.at >= closed and "resume=1" in f.url), math.nan)
    media = next(
        (r.at for r in call.received if r.stream == 1 and r.message.get("event") == "media"),
        math.nan,
    )
    opened = second.opened_at if second.opened_at is not None else math.nan
    return {
        "close_ms": (closed - end) * 1000,
        "twiml_ms": (twiml - end) * 1000,
        "start_ms": (opened - end) * 1000,
        "media_ms": (media - end) * 1000,
        "gap_ms": (new[0].at - end) * 1000,
        "heard_before_ms": sum(len(p.data) for p in old) / 8,
        "heard_after_ms": sum(len(p.data) for p in new) / 8,
    }


def deploy_run(suite: Suite, n: int) -> dict[str, Any]:
    """Three nodes on one redis-server behind the balancer, ``n`` calls homed on the
    first, SIGTERMed mid-reply; every call's seam (None: lost)."""
    token = secrets.token_hex(16)
    with contextlib.ExitStack() as stack:
        _, redis_url = stack.enter_context(redis())
        sock = stack.enter_context(reserve())
        public = f"http://127.0.0.1:{sock.getsockname()[1]}"
        stack.enter_context(_environ({TOKEN_ENV: token}))
        nodes: list[Proc] = []
        for name in "abc":
            port = free_port()
            proc, _ = start_server(
                f"trio-duplex node {name}",
                node_argv(port, redis_url, name, public, suite.log_level),
                timeout=45.0,
                probe=f"ws://127.0.0.1:{port}/v1/duplex",
            )
            stack.callback(proc.stop)
            nodes.append(proc)
        ports = [int(p.argv[p.argv.index("--port") + 1]) for p in nodes]
        balancer, trio_token = stack.enter_context(balanced(ports, sock))
        deadline = time.monotonic() + DEPLOY_WAIT_S
        while len(balancer.ready) < len(ports):  # (polled every 0.1 s by the balancer)
            if time.monotonic() > deadline:
                raise BenchError(f"nodes not ready behind the balancer: {balancer.ready}")
            time.sleep(0.05)

        def avoid(found: set[int]) -> None:
            def put() -> None:
                balancer.avoid.clear()
                balancer.avoid.update(found)

            trio.from_thread.run_sync(put, trio_token=trio_token)

        at: list[float] = []

        def sigterm() -> None:
            # The deploy takes the node out of the balancer as it signals it (as an
            # orchestrator removes its endpoint): readiness alone, polled every 100 ms, is
            # slower than the drain's close (~20-40 ms here), and a <Redirect>'s stream
            # sent back to the draining node fails the call (seen: 1 call of 1 lost).
            avoid({ports[0]})
            at.append(time.monotonic())
            nodes[0].popen.send_signal(signal.SIGTERM)

        calls = run_scenario(
            deploy_calls, public, token, n, avoid, set(ports[1:]), sigterm, ports,
            timeout=DEPLOY_WAIT_S * 4,
        )  # fmt: skip
        home_exit = nodes[0].popen.wait(DEPLOY_WAIT_S)
        routed = [
            (round((r.at - at[0]) * 1000, 1), ports.index(r.port))
            for r in balancer.routes
            if at and r.at >= at[0]
        ]
    *calls, control = calls
    reference = len(control.audio_heard()) / 8 if len(control.streams) == 1 else math.nan
    seams = [seam(call) for call in calls]
    for s in seams:  # the audio heard twice: what the call heard beyond the control's
        if s is not None:
            s["repeated_ms"] = s["heard_before_ms"] + s["heard_after_ms"] - reference
    return {
        "calls": n,
        "lost": sum(s is None for s in seams),
        "seams": seams,
        "reference_ms": reference,
        "home_exit": home_exit,
        "home_streams": sum(1 for c in calls if c.streams and c.streams[0].closed_at is not None),
        "routed_after": routed,
        "fetches": [
            [(round((f.at - at[0]) * 1000, 1), f.status, "resume=1" in f.url) for f in c.fetches]
            for c in calls
        ],
        "failures": [c.failure for c in calls if c.failure],
    }


def deploy_gap(suite: Suite) -> None:
    """The audio gap across a deploy (docs/plans/telephony.md §8, first part): N calls
    (``tel_deploy_calls``) through the balancer, all homed on one of three ``--cluster``
    nodes (the balancer avoids the others while they are placed), the ``voice`` engine
    speaking a long reply; that node SIGTERMed once every call heard 0.4 s of it. Per
    call, from the end of the last audio heard on the old stream: the old stream's close,
    the ``<Redirect>``'s TwiML answer, the new stream's ``start``, its first ``media``, its
    first audio heard (the gap); p50/p99/max; the calls lost (must be 0).

    Not measured: the audio heard twice at the seam (the ``voice`` engine's tones do not
    say which frame they are, as tests/twilio/ledger.py's do), and the plan's fake
    providers in 2 processes (one here, in the bench process, with the balancer)."""
    p = suite.plan
    if p.tel_deploy_calls < 1:
        return
    if shutil.which("redis-server") is None:
        suite.say("10 telephony: deploy gap skipped: redis-server is not installed")
        return
    try:
        result = deploy_run(suite, p.tel_deploy_calls)
    except BenchError as exc:
        suite.fail("10 telephony / deploy gap", exc)
        return
    kept = [s for s in result["seams"] if s is not None]
    summary: dict[str, Any] = {"calls": result["calls"], "lost": result["lost"]}
    for key in ("close_ms", "twiml_ms", "start_ms", "media_ms", "gap_ms", "repeated_ms"):
        values = [s[key] for s in kept if not math.isnan(s[key])]
        summary[key] = {
            "p50": percentile(values, 50) if values else math.nan,
            "p99": percentile(values, 99) if values else math.nan,
            "max": max(values, default=math.nan),
        }
    result["summary"] = summary
    suite.raw["10 telephony deploy"] = result
    gap = summary["gap_ms"]
    print(
        f"  10 deploy calls={result['calls']} lost={result['lost']} "
        f"gap p50={gap['p50']:.0f} p99={gap['p99']:.0f} max={gap['max']:.0f} ms "
        f"repeated p50={summary['repeated_ms']['p50']:.0f} "
        f"max={summary['repeated_ms']['max']:.0f} ms "
        + " ".join(f"{k[:-3]} p50={summary[k]['p50']:.0f}" for k in
                   ("close_ms", "twiml_ms", "start_ms", "media_ms"))
        + " (ms from the last audio heard)",
        flush=True,
        file=sys.stderr,
    )  # fmt: skip
    note = (
        f"{result['calls']} calls homed on 1 of 3 --cluster nodes, SIGTERMed mid-reply; "
        "last audio heard on the old stream → first on the new"
    )
    for q in ("p50", "p99", "max"):
        row(suite, "10", f"deploy: audio gap per call, {q}", [gap[q]], "", [],
            higher_is_better=False, unit="ms", note=note)  # fmt: skip
    rep = summary["repeated_ms"]
    row(suite, "10", "deploy: audio heard twice per call, p50", [rep["p50"]], "", [],
        higher_is_better=False, unit="ms",
        note=f"heard in all, less a control call's (not interrupted); max {rep['max']:.0f} ms; "
        "negative: audio lost")  # fmt: skip
    row(suite, "10", "deploy: calls lost", [float(result["lost"])], "", [],
        higher_is_better=False, note="must be 0")  # fmt: skip
