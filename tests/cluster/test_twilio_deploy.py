"""A phone call that survives a deploy (docs/plans/telephony.md §4, §7.5): three cluster
nodes behind a load balancer, the fake Twilio placing a call through it, and the node
serving the call SIGTERMed while the caller hears a long reply. The call goes on, on
another node, after Twilio's ``<Redirect>``: the caller hears the whole reply, in order,
repeated only where the old node's last echoes had not come back, and every chunk of the
caller's audio taken before the fence reaches the engine exactly once.

Real ``trio-duplex serve --cluster`` processes, a real redis-server, the test balancer
(trio_duplex/testing/balancer.py: a node gets new connections while its ``/readyz`` is 200),
the fake Twilio (trio_duplex/testing/twilio_provider.py, written from Twilio's reference)
and the ledger engine (tests/twilio/ledger.py), whose audio says which frame of which
response it is, and whose report (a response too, to ``#``) says which of the caller's
chunks it received.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import re
import signal
import time
from collections.abc import Callable
from typing import Any, Final

import attrs
import pytest
import trio

from trio_duplex.cluster.store import Store
from trio_duplex.testing.balancer import Balancer, open_balancer, reserve
from trio_duplex.testing.twilio_provider import FakeCall, FakeTwilio, run_scenario

from ..helpers import ServerProcess, Servers, free_port
from ..twilio.ledger import (
    BURST_KEY,
    FRAME,
    FRAME_S,
    HANG_UP_KEY,
    HEADER,
    RATE,
    Heard,
    chunk_number,
    decode_report,
    expand_runs,
    frame_codes,
    input_chunk,
    parse_heard,
)
from .conftest import RedisServer, node_flags

pytestmark = pytest.mark.integration

TOKEN: Final = "twilio-deploy-test-auth-token-0123456789"
ACCOUNT: Final = "AC" + "5" * 32
TIMEOUT: Final = 20.0
STARTUP_S: Final = 45.0
"""Three nodes start side by side: a loaded CI machine takes more than the usual 15 s."""
LONG_KEY, LONG_FRAMES = "6", 300
"""The reply a SIGTERM interrupts: 6 s of 20 ms frames, paced in real time (``*``: all
at once, the channel holding what Twilio may not take yet)."""
SHORT_KEY, SHORT_FRAMES = "1", 50
HEARD_FIRST: Final = RATE + 3 * FRAME + FRAME // 2
"""Codes of the long reply the caller hears before the interruption: 53.5 frames."""
LEAD_S: Final = 0.5
"""``--twilio-max-buffered``: the most audio sent and not confirmed played."""
SEAM_MARGIN_S: Final = 0.25
"""The caller's chunks sent this long before the seam (the ``clear`` reaching the fake;
the balancer's cut) reached the old node before it: those must all reach the engine.
Those sent later may or may not (§4.3: what Twilio sends between a fence and the close
is dropped, and so is what the channel holds unread then, its half-made 40 ms append
included; a cut loses what is in flight). On loopback the window is a few ms; the margin
is for a loaded machine, where this process (the balancer, the fake) and the nodes stall
for 100 ms at a time (a run at load 11 on 2 cores lost a chunk sent 0.1 s before)."""


def _serving(nodes: list[ServerProcess], stream_sid: str, verb: str) -> int:
    """The node whose door took the stream (``opens`` or ``resumes`` its session)."""
    pattern = re.compile(rf"call CA[0-9a-f]{{32}}: stream {stream_sid} {verb} session sess_")
    found = [i for i, node in enumerate(nodes) if pattern.search(node.log)]
    if not found:  # (a log line may still be on its way through the reader thread)
        for i, node in enumerate(nodes):
            if node.proc.poll() is None:
                with contextlib.suppress(AssertionError):
                    node.wait_for_line(pattern, 1.0)
                    found.append(i)
    assert len(found) == 1, (stream_sid, verb, [n.log for n in nodes])
    return found[0]


def _heard(call: FakeCall, stream: int) -> bytes:
    return call.audio_heard(stream)


def _has_frame(call: FakeCall, stream: int, response: int, index: int) -> bool:
    head = frame_codes(response, index)[:HEADER]
    return head in _heard(call, stream)


def _report_heard(call: FakeCall, stream: int, response: int) -> dict[str, Any] | None:
    frames = [f for f in _frames(call, stream) if f.response == response and f.whole]
    try:
        return decode_report(frames) if frames else None
    except ValueError:
        return None


def _frames(call: FakeCall, stream: int) -> list[Heard]:
    played = [(p.at, p.data) for p in call.played if p.stream == stream]
    return parse_heard(stream, played)[0]


@attrs.define(eq=False)
class Outcome:
    serving: int
    """The index of the node that served the call first (its home)."""
    seam_at: float
    """When the test interrupted the stream (``time.monotonic()``, the fake's clock)."""
    call: FakeCall
    chunks_sent: list[tuple[float, int, int]]
    """(when, stream, number) of every caller's chunk the fake sent on a stream."""


async def _scenario(
    base_url: str,
    nodes: list[ServerProcess],
    interrupt: Callable[[int], None],
    twilio_options: tuple[bool, bool],
    long_key: str,
) -> Outcome:
    echo_cleared, follow_drop = twilio_options
    async with FakeTwilio(
        base_url,
        TOKEN,
        ACCOUNT,
        echo_cleared_marks=echo_cleared,
        follow_redirect_on_drop=follow_drop,
    ) as twilio:
        call = await twilio.place_call()
        sending = True

        async def talk() -> None:  # the caller's line: a tagged chunk every 20 ms
            number = 0
            while sending and not call.ended:
                try:
                    await call.send_audio(input_chunk(number))
                except Exception:
                    return
                number += 1

        talker = asyncio.create_task(talk())
        first_sid = call.streams[0].stream_sid
        serving = await asyncio.to_thread(_serving, nodes, first_sid, "opens")
        await call.dtmf(long_key)
        # Once the caller has heard a second and a bit of the long reply (not on a mark's
        # boundary: one every 100 ms of audio sent at once): the interruption.
        await call.wait_for(lambda c: len(_heard(c, 0)) >= HEARD_FIRST, timeout=TIMEOUT)
        seam_at = time.monotonic()
        interrupt(serving)
        await call.wait_for(lambda c: len(c.streams) >= 2, timeout=TIMEOUT)
        await call.wait_for(
            lambda c: _has_frame(c, 1, 1, LONG_FRAMES - 1) or c.ended, timeout=TIMEOUT
        )
        assert not call.ended, (call.state, call.failure, call.streams)
        await call.dtmf(SHORT_KEY)  # after the resume: a new reply, heard
        await call.wait_for(lambda c: _has_frame(c, 1, 2, SHORT_FRAMES - 1), timeout=TIMEOUT)
        await call.dtmf("#")  # the engine's report: what it received
        await call.wait_for(lambda c: _report_heard(c, 1, 3) is not None, timeout=TIMEOUT)
        sending = False
        await talker
        await call.stop(timeout=TIMEOUT)
        chunks = []
        for sent in call.sent:
            media = sent.message.get("media")
            if sent.message.get("event") == "media" and isinstance(media, dict):
                number = chunk_number(base64.b64decode(media["payload"]))
                assert number is not None
                chunks.append((sent.at, sent.stream, number))
        return Outcome(serving, seam_at, call, chunks)


Interrupt = Callable[[list[ServerProcess], Balancer, trio.lowlevel.TrioToken, int], None]
"""What interrupts the call's first stream, given the nodes, the balancer, the test's
trio token and the index of the node serving the call (run in the fake's thread)."""


async def _call_through_a_balancer(
    servers: Servers,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    interrupt: Interrupt,
    twilio_options: tuple[bool, bool],
    long_key: str = LONG_KEY,
) -> tuple[list[ServerProcess], Balancer, Outcome]:
    """Three nodes behind the balancer, and a call through it, interrupted mid-reply
    (``twilio_options``: the fake's ``echo_cleared_marks``, ``follow_redirect_on_drop``)."""
    monkeypatch.setenv("TRIO_DUPLEX_TWILIO_AUTH_TOKEN", TOKEN)  # (not on a command line)
    with reserve() as sock:
        public = f"http://127.0.0.1:{sock.getsockname()[1]}"
        flags = (
            *("--relay-port", "0", "--engine", "tests.twilio.ledger:factory"),
            *("--twilio-public-url", public, "--twilio-account-sid", ACCOUNT),
        )
        cluster = servers.start_many(
            *((*node_flags(redis_server, name), *flags) for name in "abc"),
            ready_timeout=STARTUP_S,
        )
        balancer: Balancer
        async with open_balancer([n.port for n in cluster], sock) as balancer:
            assert balancer.ready == [n.port for n in cluster]
            token = trio.lowlevel.current_trio_token()
            with trio.fail_after(TIMEOUT * 4):
                run = functools.partial(run_scenario, timeout=TIMEOUT * 4)
                outcome = await trio.to_thread.run_sync(
                    run,
                    _scenario,
                    public,
                    cluster,
                    functools.partial(interrupt, cluster, balancer, token),
                    twilio_options,
                    long_key,
                )
    return cluster, balancer, outcome


def _check_the_reply_and_the_caller(
    outcome: Outcome, seam_at: float, long_key: str = LONG_KEY
) -> dict[str, Any]:
    """What the caller heard of the interrupted reply and after, and what the engine
    received of the caller's chunks (its report, returned), across the seam."""
    call = outcome.call
    # The interrupted reply: every frame heard, in order, at most twice, the repeated
    # ones only just before the seam (what played after the last echo the old node took).
    before = [f for f in _frames(call, 0) if f.response == 1]
    after = [f for f in _frames(call, 1) if f.response == 1]
    whole_before = [f.index for f in before if f.whole and f.index is not None]
    whole_after = [f.index for f in after if f.whole and f.index is not None]
    assert whole_before == list(range(len(whole_before))), whole_before
    assert whole_after, "nothing of the reply after the resume"
    resumed_from = whole_after[0]
    assert whole_after == list(range(resumed_from, LONG_FRAMES)), whole_after
    assert all(f.whole for f in before[:-1]), [len(f.codes) for f in before]  # the last: cut
    assert resumed_from <= len(whole_before), (resumed_from, len(whole_before))  # none lost
    repeated = whole_before[resumed_from:]
    assert len(repeated) * FRAME_S <= LEAD_S, (resumed_from, len(whole_before))
    assert not [f for f in _frames(call, 1) if f.response is None or f.response < 1]
    # The caller heard nothing but the ledger's frames (no stray audio at the seam).
    _, orphan = parse_heard(0, [(p.at, p.data) for p in call.played if p.stream == 0])
    assert orphan == 0
    heard_after, orphan = parse_heard(1, [(p.at, p.data) for p in call.played if p.stream == 1])
    assert orphan == 0

    # A key after the resume: a new reply, heard whole, in order.
    short = [f.index for f in heard_after if f.response == 2]
    assert short == list(range(SHORT_FRAMES)), short
    report = _report_heard(call, 1, 3)
    assert report is not None
    assert report["keys"] == [long_key, SHORT_KEY, "#"]
    assert report["bad"] == 0 and report["partial"] == 0, report

    # The caller's chunks: each received at most once, in order; every one sent before the
    # seam received; on the new stream, every one sent before the '#'.
    received = expand_runs(report["runs"])
    assert received == sorted(set(received)), report["runs"]
    on_first = [n for at, s, n in outcome.chunks_sent if s == 0]
    early = [n for at, s, n in outcome.chunks_sent if s == 0 and at < seam_at - SEAM_MARGIN_S]
    report_key_at = next(s.at for s in call.sent if s.message.get("dtmf", {}).get("digit") == "#")
    on_second = [n for at, s, n in outcome.chunks_sent if s == 1 and at < report_key_at]
    from_first = [n for n in received if n in set(on_first)]
    assert from_first == on_first[: len(from_first)], "a chunk of the first stream lost"
    assert len(from_first) >= len(early), (len(from_first), len(early))
    assert [n for n in received if n not in set(on_first)] == on_second
    assert len(on_second) >= 1
    return report


def _session_of(node: ServerProcess, stream_sid: str) -> str:
    opened = re.search(rf"stream {stream_sid} opens session (sess_[0-9a-f]+)", node.log)
    assert opened is not None, node.log
    return opened.group(1)


def _assert_clean_logs(cluster: list[ServerProcess]) -> None:
    """No error, no traceback, and no secret (the auth token, a ticket) in any log."""
    for node in cluster:
        assert " ERROR " not in node.log and "Traceback" not in node.log, node.log
        assert TOKEN not in node.log and not re.search(r"v1\.[or]\.\d", node.log), node.log


def _sigterm(nodes: list[ServerProcess], _b: Balancer, _t: object, serving: int) -> None:
    nodes[serving].proc.send_signal(signal.SIGTERM)


@pytest.mark.parametrize(
    ("echo_cleared", "long_key"),
    [(True, LONG_KEY), (False, LONG_KEY), (True, BURST_KEY)],
    ids=["cleared-echoed", "cleared-dropped", "burst"],
)
async def test_a_call_survives_a_deploy_through_its_redirect(
    servers: Servers,
    redis_server: RedisServer,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    echo_cleared: bool,
    long_key: str,
) -> None:
    """SIGTERM the node serving the call: its drain fences the session (``clear``),
    hands it over and closes the stream; Twilio's ``<Redirect>`` lands on another node,
    which adopts it. Twilio's page says a ``clear`` echoes the marks it dropped; the
    other reading (it drops them) is run too: the frontier must not move on either. The
    burst: the whole reply is in the session's journal at the SIGTERM, most of it not yet
    sent to Twilio: the record carries it, and the new node replays it, paced."""
    cluster, balancer, outcome = await _call_through_a_balancer(
        servers, redis_server, monkeypatch, _sigterm, (echo_cleared, False), long_key
    )
    call = outcome.call
    old, ports = cluster[outcome.serving], [n.port for n in cluster]

    # The old node: a clear, then its close (1000) ran the <Redirect>.
    first, second = call.streams[0], call.streams[1]
    assert first.ended_by == "server_close" and first.close_code == 1000, first
    assert first.closed_at is not None
    clears = [t for t in call.clears if t >= outcome.seam_at]
    assert clears and clears[0] <= first.closed_at, (call.clears, first)
    assert old.wait(TIMEOUT) == 0
    # The redirect followed: a resume's TwiML fetched after the close.
    redirects = [f for f in call.fetches if "resume=1" in f.url]
    assert redirects and redirects[0].at >= first.closed_at, call.fetches
    assert redirects[0].status == 200 and "<Stream" in redirects[0].body
    assert 'value="v1.r.' in redirects[0].body  # a resume ticket
    # The new stream on another node, which resumed the call's session.
    assert second.stream_sid != first.stream_sid
    assert second.ended_by == "stop", second
    new = _serving(cluster, second.stream_sid, "resumes")
    assert new != outcome.serving
    assert len(call.streams) == 2 and call.state == "completed", (call.streams, call.failure)
    routed = {r.port for r in balancer.routes if r.at >= first.closed_at}
    assert ports[outcome.serving] not in routed, balancer.routes

    report = _check_the_reply_and_the_caller(outcome, clears[0], long_key)
    assert report["restored"] == 1  # adopted from the migration record: restored once

    # The session ended by the caller's stop, on the new node; no error anywhere.
    session = _session_of(old, first.stream_sid)
    assert f"session {session} handed over to the cluster" in old.log
    assert f"session {session} adopted (migrated here)" in cluster[new].log
    cluster[new].wait_for_line(rf"session {session} ended: client_close", TIMEOUT)
    _assert_clean_logs(cluster)


def _drop(
    nodes: list[ServerProcess], balancer: Balancer, token: trio.lowlevel.TrioToken, serving: int
) -> None:
    port = nodes[serving].port

    async def drop() -> int:  # (in the balancer's trio loop)
        balancer.avoid.add(port)  # the reconnect goes elsewhere
        return await balancer.cut(port)

    assert trio.from_thread.run(drop, trio_token=token) >= 1  # the stream at least


async def test_a_dropped_call_is_relayed_to_its_session_home(
    servers: Servers, redis_server: RedisServer, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream dropped by the network (the balancer cuts it: no close from anyone),
    the fake told to follow the ``<Redirect>`` on a drop (Twilio's behaviour there is
    UNCONFIRMED, telephony.md §1.2: this tests our side), and the reconnect sent to a
    node that is not the session's home: that node relays the resume to the home, whose
    session goes on (its engine never moved), and the reply plays on from the frontier."""
    cluster, _, outcome = await _call_through_a_balancer(
        servers, redis_server, monkeypatch, _drop, (True, True)
    )
    call = outcome.call
    home = cluster[outcome.serving]
    first, second = call.streams[0], call.streams[1]
    assert first.ended_by == "drop", first
    assert second.ended_by == "stop" and len(call.streams) == 2, call.streams
    redirects = [f for f in call.fetches if "resume=1" in f.url]
    assert redirects and redirects[0].status == 200 and 'value="v1.r.' in redirects[0].body
    new = _serving(cluster, second.stream_sid, "resumes")
    assert new != outcome.serving

    report = _check_the_reply_and_the_caller(outcome, outcome.seam_at)
    assert report["restored"] == 0  # the engine stayed home

    session = _session_of(home, first.stream_sid)
    assert f"session {session}: relaying its resume to its home node" in cluster[new].log
    home.wait_for_line(rf"session {session} ended: client_close", TIMEOUT)
    _assert_clean_logs(cluster)


async def test_a_call_whose_session_ended_is_hung_up_by_its_redirect(
    cluster: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine ends the call's session (the ledger's ``0``: an assistant that hangs
    up); the server closes the stream and Twilio runs the ``<Redirect>``: a node of a
    cluster answers ``<Hangup/>`` at once, as a single server does, rather than
    reconnecting a stream to a session no resume can find (the door asks the cluster's
    store, claiming nothing: ``Store.findable``). Before, a cluster node answered every
    redirect with a ``<Connect>`` until ``--twilio-max-redirects`` ran out, the caller
    hearing silence meanwhile."""
    monkeypatch.setenv("TRIO_DUPLEX_TWILIO_AUTH_TOKEN", TOKEN)
    port = free_port()
    node = cluster(
        "a",
        *("--port", str(port), "--engine", "tests.twilio.ledger:factory"),
        *("--twilio-public-url", f"http://127.0.0.1:{port}", "--twilio-account-sid", ACCOUNT),
    )

    async def scenario(base: str) -> FakeCall:
        async with FakeTwilio(base, TOKEN, ACCOUNT) as twilio:
            call = await twilio.place_call()
            await call.dtmf(HANG_UP_KEY)
            await call.wait_ended(timeout=TIMEOUT)
            return call

    call = await trio.to_thread.run_sync(run_scenario, scenario, f"http://127.0.0.1:{port}")
    assert len(call.streams) == 1 and call.streams[0].ended_by == "server_close", call.streams
    redirects = [f for f in call.fetches if "resume=1" in f.url]
    assert len(redirects) == 1, call.fetches
    assert redirects[0].status == 200 and "<Hangup/>" in redirects[0].body, redirects[0]
    assert call.state == "completed", (call.state, call.failure)
    node.wait_for_line(r"call CA[0-9a-f]{32}: its session is gone; hanging up", TIMEOUT)
    _assert_clean_logs([node])
