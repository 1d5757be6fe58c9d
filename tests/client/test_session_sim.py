"""``ClientSession`` against the real server, in memory and in virtual time: the server
runs on ``trio_duplex.testing``'s listener (``sim_server``), the client connects through
``Net`` (``open_stream``), and faults are injected on the server's side of each
connection (``FaultyStream``: cut, failing sends, held output) or by taking the network
down.
"""

from __future__ import annotations

import random

import attrs
import pytest
import trio

from trio_duplex import ServerConfig
from trio_duplex.client import (
    Attached,
    ClientOptions,
    ConnectionChange,
    Disconnected,
    EventTooLarge,
    ReconnectFailed,
    ReconnectPolicy,
    ResumeRefused,
    Retrying,
    ServerRefused,
    SessionEnded,
    SessionReplaced,
    connect,
)

from .helpers import FAST, Engines, client_for, next_of, sim_server, text, texts


async def test_open_send_receive_close(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server() as (sim, net):
        async with client_for(net, session={"voice": "x"}, on_change=changes.append) as session:
            assert session.config == {"voice": "x"} and session.generation == 1
            assert session.status == "attached" and "sess_" in repr(session)
            assert await session.send(text("one")) == 1
            assert await session.send(text("two")) == 2
            got = await texts(session, 2)
            assert [(e["text"], e["server_event_seq"]) for e in got] == [("one", 1), ("two", 2)]
            await session.aclose()
            assert [e["type"] for e in [e async for e in session]] == ["session.closed"]
            with pytest.raises(SessionEnded):
                await session.send(text("too late"))
        assert sim.server.slots_held == 0
    assert changes == [Attached(session.session_id or "", 1, resumed=False, resent=0)]


@pytest.mark.parametrize("seed", range(25))
async def test_random_faults_every_event_exactly_once(
    autojump_clock: trio.abc.Clock, seed: int
) -> None:
    rng = random.Random(seed)
    engines = Engines()
    sent = [f"m{i}" for i in range(60)]
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net, rng=random.Random(seed)) as session:

            async def sender() -> None:
                for value in sent:
                    await session.send(text(value))
                    await trio.sleep(rng.uniform(0, 0.03))

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(net.chaos, rng)
                    nursery.start_soon(sender)
                    got = await texts(session, len(sent))
        assert [e["text"] for e in got] == sent
        seqs = [e["server_event_seq"] for e in got]
        assert seqs == sorted(set(seqs))
        (engine,) = engines.made  # one session, never reopened
        assert [e["text"] for e in engine.received] == sent
        assert [e["client_event_seq"] for e in engine.received] == list(range(1, 61))
        assert sim.server.slots_held == 0


async def test_heartbeats_keep_an_idle_session_alive(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(idle_ttl_s=30)) as (_sim, net):
        async with client_for(net) as session:
            await trio.sleep(600)
            assert session.status == "attached" and session.generation == 1
            await session.send(text("still here"))
            assert (await texts(session, 1))[0]["text"] == "still here"


async def test_a_silent_server_is_noticed_and_the_session_resumed(
    autojump_clock: trio.abc.Clock,
) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server() as (_sim, net):
        async with client_for(net, on_change=changes.append) as session:
            net.streams[-1].hold()  # nothing the server sends arrives any more
            started = trio.current_time()
            await session.send(text("hello?"))
            assert (await texts(session, 1))[0]["text"] == "hello?"
            assert session.generation == 2
            # Found within one heartbeat interval plus its timeout.
            assert trio.current_time() - started <= 5 + 2 + 1
    assert isinstance(changes[1], Disconnected) and "heartbeat" in changes[1].reason


async def test_expired_grace_ends_with_resume_refused(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(disconnect_grace_s=2)) as (sim, net):
        async with client_for(net) as session:
            await net.outage(5)
            with pytest.raises(ResumeRefused) as caught:
                async for _ in session:
                    pass
            assert caught.value.code == "session_resume_expired"
            assert session.status == "failed"
            with pytest.raises(ResumeRefused):
                await session.send(text("x"))
        assert sim.server.slots_held == 0


async def test_reconnecting_gives_up_after_max_attempts(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=1.0, max_attempts=4, deadline=60)
    async with sim_server() as (_sim, net):
        async with client_for(
            net,
            options=ClientOptions(reconnect=policy),
            on_change=changes.append,
            rng=random.Random(1),
        ) as session:
            net.down = True
            await net.cut()
            with pytest.raises(ReconnectFailed) as caught:
                await session.receive()
    assert caught.value.attempts == 4 and "network is down" in caught.value.last_error
    retries = [c for c in changes if isinstance(c, Retrying)]
    assert [r.attempt for r in retries] == [1, 2, 3, 4]
    for retry in retries:
        base = min(1.0, 0.1 * 2 ** (retry.attempt - 1))
        assert base / 2 <= retry.delay <= base


async def test_retries_of_the_first_connection_are_numbered_from_1(
    autojump_clock: trio.abc.Clock,
) -> None:
    changes: list[ConnectionChange] = []
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=1.0, max_attempts=3, deadline=60)
    async with sim_server() as (_sim, net):
        net.down = True
        with pytest.raises(ReconnectFailed) as caught:
            async with client_for(
                net,
                options=ClientOptions(reconnect=policy),
                on_change=changes.append,
                rng=random.Random(1),
            ):
                raise AssertionError("not reached")
    assert caught.value.attempts == 3
    retries = [c for c in changes if isinstance(c, Retrying)]
    assert [r.attempt for r in retries] == [1, 2]  # the first attempt is no retry
    assert [r.error for r in retries] == ["network is down"] * 2
    assert 0.05 <= retries[0].delay <= 0.1  # the first retry's delay, not the second's


async def test_without_retry_open_a_failed_first_connection_raises_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    changes: list[ConnectionChange] = []
    policy = ReconnectPolicy(retry_open=False)
    async with sim_server() as (_sim, net):
        net.down = True
        started = trio.current_time()
        with pytest.raises(ReconnectFailed) as caught:
            async with client_for(
                net, options=ClientOptions(reconnect=policy), on_change=changes.append
            ):
                raise AssertionError("not reached")
        assert trio.current_time() == started
        assert (caught.value.attempts, caught.value.last_error) == (1, "network is down")
        assert changes == []
        # Once attached, an outage is retried as usual.
        net.down = False
        async with client_for(
            net, options=ClientOptions(reconnect=policy), on_change=changes.append
        ) as session:
            await net.cut()
            await session.send(text("after the cut"))
            assert (await next_of(session, "response.output_text.delta"))["text"] == (
                "after the cut"
            )
    assert any(isinstance(c, Disconnected) for c in changes)
    assert sum(isinstance(c, Attached) for c in changes) == 2


async def test_the_overall_deadline_bounds_reconnecting(autojump_clock: trio.abc.Clock) -> None:
    policy = ReconnectPolicy(initial_delay=1, max_delay=1, max_attempts=1000, deadline=10)
    async with sim_server() as (_sim, net):
        async with client_for(net, options=ClientOptions(reconnect=policy)) as session:
            net.down = True
            await net.cut()
            lost = trio.current_time()
            with pytest.raises(ReconnectFailed) as caught:
                await session.receive()
            assert 10 <= trio.current_time() - lost <= 11
            assert caught.value.elapsed >= 10


async def test_a_wrong_token_is_refused_at_connect(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net, detach_on_exit=True) as session:
            state = session.resume_state()
        with pytest.raises(ResumeRefused) as caught:
            async with client_for(net, resume=attrs.evolve(state, resume_token="forged")):
                raise AssertionError("not reached")
        assert caught.value.code == "invalid_resume_token" and caught.value.close_code == 4001


async def test_a_wrong_path_fails_at_once(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        started = trio.current_time()
        with pytest.raises(ServerRefused) as caught:
            async with connect("ws://sim/nowhere", open_stream=net.open_stream, options=FAST):
                raise AssertionError("not reached")
        assert "HTTP 404" in str(caught.value) and trio.current_time() == started
        assert len(net.streams) == 1  # not retried


async def test_opening_waits_for_a_free_slot(autojump_clock: trio.abc.Clock) -> None:
    changes: list[ConnectionChange] = []
    async with sim_server(ServerConfig(max_sessions=1)) as (_sim, net):
        async with client_for(net) as first, trio.open_nursery() as nursery:

            async def second() -> None:
                async with client_for(net, on_change=changes.append) as session:
                    await session.send(text("in"))
                    assert (await texts(session, 1))[0]["text"] == "in"

            nursery.start_soon(second)
            await trio.sleep(1)
            await first.aclose()
    assert any(isinstance(c, Retrying) and "resource_exhausted" in c.error for c in changes)


async def test_detach_then_resume_from_a_new_client(autojump_clock: trio.abc.Clock) -> None:
    engines = Engines()
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net, detach_on_exit=True) as session:
            await session.send(text("a"))
            await texts(session, 1)
            await session.confirm()
            state = session.resume_state()
        assert sim.server.slots_held == 1  # detached, not closed
        await engines.made[0].emit("while away")
        async with client_for(net, resume=state) as session:
            assert session.generation == 2
            assert (await texts(session, 1))[0]["text"] == "while away"
            assert await session.send(text("b")) == 2  # numbering goes on from the server's
            assert (await texts(session, 1))[0]["text"] == "b"
        assert [e["client_event_seq"] for e in engines.made[0].received] == [1, 2]
        assert sim.server.slots_held == 0


@pytest.mark.parametrize("how", ["detach at once", "detach_on_exit at once"])
async def test_a_session_detached_before_it_said_anything_keeps_its_whole_grace(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    """The server keeps a session whose client never spoke after session.created only
    ``unconfirmed_grace_s`` (5 s): the client's first frame speaks, even in a detach."""
    config = ServerConfig(disconnect_grace_s=30, unconfirmed_grace_s=5)
    async with sim_server(config) as (sim, net):
        async with client_for(net, detach_on_exit=how != "detach at once") as session:
            if how == "detach at once":
                state = await session.detach()
            else:
                state = session.resume_state()
        await trio.sleep(20)  # past the unconfirmed grace, within the whole one
        assert sim.server.slots_held == 1
        async with client_for(net, resume=state) as session:
            assert session.generation == 2
            await session.send(text("still here"))
            assert (await texts(session, 1))[0]["text"] == "still here"


async def test_a_detach_overrides_a_close_that_cannot_get_through(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with sim_server() as (sim, net):
        async with client_for(net) as session, trio.open_nursery() as nursery:
            net.down = True
            await net.cut()
            nursery.start_soon(session.aclose)  # waits: the network is down
            await trio.sleep(1)
            seen = [session.status]
            with pytest.raises(SessionEnded):
                await session.send(text("too late"))
            state = await session.detach()  # aclose returns too
            seen.append(session.status)
            assert seen == ["closing", "ended"]
        assert sim.server.slots_held == 1  # the close never arrived: the session is kept
        net.down = False
        async with client_for(net, resume=state) as resumed:
            assert resumed.generation == 2
        assert sim.server.slots_held == 0


async def test_explicit_detach_returns_the_resume_state(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        async with client_for(net) as session:
            await session.send(text("a"))
            await texts(session, 1)
            state = await session.detach()
            assert state.last_server_event_seq == 1 and session.status == "ended"
            with pytest.raises(SessionEnded):
                await session.send(text("b"))
        assert sim.server.slots_held == 1
        async with client_for(net, resume=state):
            pass
        assert sim.server.slots_held == 0


async def test_a_takeover_ends_the_older_client(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as first:
            async with client_for(net, resume=first.resume_state()) as second:
                assert await next_of(first, "session.replaced")
                with pytest.raises(SessionReplaced) as caught:
                    await first.receive()
                assert caught.value.generation == 2
                await second.send(text("mine now"))
                assert (await texts(second, 1))[0]["text"] == "mine now"


async def test_server_shutdown_is_surfaced_then_ends(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(drain_timeout_s=3)) as (sim, net):
        async with client_for(net) as session:
            sim.server.begin_shutdown()
            events = [event async for event in session]
            assert [e["type"] for e in events] == ["session.going_away", "session.closed"]
            assert events[0]["time_left_ms"] == 3000 and events[1]["reason"] == "server_shutdown"


async def test_a_journal_gap_is_surfaced_as_resync_required(
    autojump_clock: trio.abc.Clock,
) -> None:
    engines = Engines()
    async with sim_server(ServerConfig(journal_max_bytes=300), engines) as (_sim, net):
        async with client_for(net) as session:
            net.down = True
            await net.cut()
            for i in range(10):
                await engines.made[0].emit(f"lost {i:02}" + "." * 40)
            net.down = False
            resync = await next_of(session, "session.resync_required")
            assert resync["reason"] == "journal_gap" and resync["dropped_through_seq"] == 8
            held = await texts(session, 2)  # what the journal still held follows the notice
            assert [(e["text"][:7], e["server_event_seq"]) for e in held] == [
                ("lost 08", 9),
                ("lost 09", 10),
            ]
            await session.send(text("after"))
            after = (await texts(session, 1))[0]
            assert (after["text"], after["server_event_seq"]) == ("after", 11)


async def test_cancelled_send_queues_nothing(autojump_clock: trio.abc.Clock) -> None:
    engines = Engines()
    options = attrs.evolve(FAST, max_unconfirmed_events=2)
    async with sim_server(engines=engines) as (_sim, net):
        async with client_for(net, options=options) as session:
            net.down = True
            await net.cut()
            await session.send(text("a"))
            await session.send(text("b"))
            with trio.move_on_after(0.5) as scope:
                await session.send(text("c"))  # the resend buffer is full
            assert scope.cancelled_caught and session.state.next_client_seq == 3
            net.down = False
            await session.confirm()
            assert [e["text"] for e in await texts(session, 2)] == ["a", "b"]
            assert await session.send(text("c")) == 3
            await texts(session, 1)
        assert [e["text"] for e in engines.made[0].received] == ["a", "b", "c"]


async def test_cancelled_receive_loses_nothing(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as session:
            for i in range(20):
                await session.send(text(str(i)))
            got: list[str] = []
            while len(got) < 20:
                with trio.move_on_after(0.0001):
                    got.append((await session.receive())["text"])
            assert got == [str(i) for i in range(20)]


async def test_an_error_in_the_block_comes_out_unchanged(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        with pytest.raises(KeyError):
            async with client_for(net):
                raise KeyError("mine")
        assert sim.server.slots_held == 0  # closed, not left detached


async def test_a_cancelled_block_still_closes_the_session(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (sim, net):
        with trio.move_on_after(1) as scope:
            async with client_for(net):
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert sim.server.slots_held == 0


async def test_leaving_is_bounded_when_the_server_is_gone(autojump_clock: trio.abc.Clock) -> None:
    options = attrs.evolve(FAST, close_timeout=3)
    async with sim_server() as (_sim, net):
        async with client_for(net, options=options):
            net.down = True
            await net.cut()
            left = trio.current_time()
        assert trio.current_time() - left <= 3.01
        net.down = False  # the server will expire it after its grace


async def test_confirm_returns_once_the_server_has_read_everything(
    autojump_clock: trio.abc.Clock,
) -> None:
    engines = Engines(gated=True)  # the engine answers nothing
    async with sim_server(engines=engines) as (sim, net):
        async with client_for(net) as session:
            for i in range(5):
                await session.send(text(str(i)))
            await session.confirm()
            assert sim.server.sessions.registry.sessions[session.session_id or ""].client_seq == 5
            assert not session.state.outbox
            engines.made[0].release(5)
            assert len(await texts(session, 5)) == 5


async def test_refused_events_come_back_as_error_events(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server() as (_sim, net):
        async with client_for(net) as session:
            await session.send({"type": "no.such.event", "event_id": "e1"})
            error = await next_of(session, "error")
            assert (error["code"], error["event_id"]) == ("unknown_event", "e1")
            await session.send(text("fine"))
            assert (await texts(session, 1))[0]["text"] == "fine"


async def test_oversized_event_is_refused_locally(autojump_clock: trio.abc.Clock) -> None:
    async with sim_server(ServerConfig(max_event_bytes=200)) as (_sim, net):
        async with client_for(net) as session:
            assert session.limits.max_event_bytes == 200
            with pytest.raises(EventTooLarge):
                await session.send(text("x" * 300))
            assert await session.send(text("small")) == 1
