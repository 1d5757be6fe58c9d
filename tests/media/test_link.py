"""MediaLink (trio_duplex/media/link.py) with the real worker: calls multiplexed over its
pipes, an aiortc client (asyncio, in a thread of its own) as the peer, and a worker that
dies, breaks the framing or never starts."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import trio

from trio_duplex.media import link as link_module
from trio_duplex.media import wire
from trio_duplex.media.link import IceServer, MediaConfig, MediaLink
from trio_duplex.media.wire import Kind

from .rtc import WAIT_S, Client, loopback_only, opus_packets

T = TypeVar("T")
CONFIG = MediaConfig(allow_peers=("127.0.0.0/8",), log_level="INFO")


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)
    loopback_only()


class End:
    """A CallEnd that records what the link hands it."""

    def __init__(self) -> None:
        self.frames: list[tuple[Kind, bytes]] = []
        self.broken: str | None = None
        self._changed = trio.Event()

    def received(self, kind: Kind, payload: bytes) -> None:
        self.frames.append((kind, payload))
        self._changed.set()

    def link_broken(self, why: str) -> None:
        assert self.broken is None, "link_broken twice"
        self.broken = why
        self._changed.set()

    async def until(self, test: Callable[[], bool]) -> None:
        with trio.fail_after(WAIT_S):
            while not test():
                self._changed = trio.Event()
                await self._changed.wait()

    async def next(self, kind: Kind) -> bytes:
        await self.until(lambda: any(k == kind for k, _ in self.frames) or bool(self.broken))
        assert self.broken is None, self.broken
        return next(p for k, p in self.frames if k == kind)

    def of(self, kind: Kind) -> list[bytes]:
        return [p for k, p in self.frames if k == kind]


def offer_payload(sdp: str) -> bytes:
    return json.dumps({"sdp": sdp}).encode()


async def an_offer() -> str:
    """A client's offer (its peer connection closed: enough for the worker to answer)."""

    async def make() -> str:
        client = Client()
        try:
            return await client.offer()
        finally:
            await client.close()

    return await trio.to_thread.run_sync(asyncio.run, make())


async def test_a_call_through_the_link_text_audio_and_mic(nursery: trio.Nursery) -> None:
    link = MediaLink(CONFIG)
    await nursery.start(link.run)
    assert link.broken is None and link.stats().running
    end = End()
    port = link.open_call(end)
    token = trio.lowlevel.current_trio_token()

    async def answer(sdp: str) -> str:
        port.send(Kind.OFFER, offer_payload(sdp))
        return (await end.next(Kind.ANSWER)).decode()

    async def heard_text() -> bytes:
        return await end.next(Kind.DC_TEXT)

    async def speak() -> None:
        await end.next(Kind.DC_OPEN)
        port.send(Kind.DC_TEXT, b'{"type":"session.created"}')
        for seq, packet in enumerate(opus_packets(25), 1):
            port.send(Kind.AUDIO, wire.pack_audio(seq, packet))
        await end.until(
            lambda: any(wire.unpack_played(p)[:2] == (25, True) for p in end.of(Kind.PLAYED))
        )

    async def in_trio(afn: Callable[[], Awaitable[T]]) -> T:
        """``afn()`` run in the test's trio loop, the client's asyncio loop running on."""

        def call() -> T:
            return trio.from_thread.run(afn, trio_token=token)

        return await asyncio.to_thread(call)

    async def peer() -> None:  # asyncio, in the thread
        client = Client()
        sdp = await client.offer()
        await client.answer(await in_trio(functools.partial(answer, sdp)))
        await client.until(lambda: client.dc.readyState == "open")
        client.dc.send("hello")
        assert await in_trio(heard_text) == b"hello"
        await in_trio(speak)
        await client.until(lambda: bool(client.messages) and client.loud_frames >= 10)
        assert client.messages == ['{"type":"session.created"}']
        await client.close()

    await trio.to_thread.run_sync(asyncio.run, peer())
    await end.until(lambda: bool(end.of(Kind.CLOSED)))
    assert [p for p in end.of(Kind.STATE)] == [b"connected", b"closed"]
    assert {len(p) for p in end.of(Kind.MIC)} == {1920}
    assert end.broken is None
    port.release()


async def test_calls_get_their_own_numbers_and_a_released_one_is_closed(
    nursery: trio.Nursery,
) -> None:
    link = MediaLink(CONFIG)
    await nursery.start(link.run)
    ends = [End(), End()]
    ports = [link.open_call(e) for e in ends]
    assert ports[0].call != ports[1].call
    sdp = await an_offer()
    for port in ports:
        port.send(Kind.OFFER, offer_payload(sdp))
    for end in ends:
        await end.next(Kind.ANSWER)
    assert link.stats().calls == 2
    ports[0].release()
    with pytest.raises(trio.ClosedResourceError):
        ports[0].send(Kind.CLEAR)
    # The worker closes it; its CLOSED goes to no one (the end was released).
    ports[1].send(Kind.CLOSE)
    await ends[1].next(Kind.CLOSED)
    assert not ends[0].of(Kind.CLOSED)
    assert link.stats().calls == 0
    ports[1].release()
    third = link.open_call(End())
    assert third.call not in (ports[0].call, ports[1].call)


async def test_a_killed_worker_breaks_every_call_and_is_restarted(nursery: trio.Nursery) -> None:
    link = MediaLink(CONFIG)
    await nursery.start(link.run)
    ends = [End(), End(), End()]
    ports = [link.open_call(e) for e in ends]
    sdp = await an_offer()
    ports[0].send(Kind.OFFER, offer_payload(sdp))
    await ends[0].next(Kind.ANSWER)
    first = link.stats().pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    for end in ends:
        await end.until(lambda end=end: end.broken is not None)  # type: ignore[misc]
        assert end.broken is not None and "died" in end.broken
    assert all(p.broken for p in ports)
    with pytest.raises(trio.BrokenResourceError):
        ports[1].send(Kind.CLEAR)
    with pytest.raises(trio.BrokenResourceError):
        link.open_call(End())  # (until the restart)
    await link.wait_running()
    assert link.stats().restarts == 1 and link.stats().pid not in (None, first)
    end = End()
    port = link.open_call(end)
    port.send(Kind.OFFER, offer_payload(sdp))
    await end.next(Kind.ANSWER)
    assert all(e.broken is not None for e in ends)  # (the old calls are not carried over)


def _fake_worker(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_a_worker_that_breaks_the_framing_is_cut_and_restarted(
    nursery: trio.Nursery,
) -> None:
    ready = wire.encode(Kind.READY, 0)
    code = (
        "import sys\n"
        f"sys.stdout.buffer.write({ready!r}); sys.stdout.flush()\n"
        "sys.stdin.buffer.read(9)\n"  # (the OFFER's head)
        "sys.stdout.buffer.write(b'\\xff' + bytes(8)); sys.stdout.flush()\n"
        "sys.stdin.buffer.read()\n"
    )
    link = MediaLink(CONFIG, command=_fake_worker(code))
    await nursery.start(link.run)
    end = End()
    port = link.open_call(end)
    port.send(Kind.OFFER, offer_payload("v=0"))
    await end.until(lambda: end.broken is not None)
    assert end.broken is not None and "framing" in end.broken
    await link.wait_running()
    assert link.stats().restarts == 1


async def test_a_worker_that_sends_a_servers_kind_is_cut(nursery: trio.Nursery) -> None:
    ready, offer = wire.encode(Kind.READY, 0), wire.encode(Kind.OFFER, 1, b"{}")
    code = (
        "import sys\n"
        f"sys.stdout.buffer.write({ready!r}); sys.stdout.flush()\n"
        "sys.stdin.buffer.read(9)\n"
        f"sys.stdout.buffer.write({offer!r}); sys.stdout.flush()\n"
        "sys.stdin.buffer.read()\n"
    )
    link = MediaLink(CONFIG, command=_fake_worker(code))
    await nursery.start(link.run)
    end = End()
    link.open_call(end).send(Kind.CLEAR)
    await end.until(lambda: end.broken is not None)
    assert end.broken == "the media worker sent a OFFER frame"


async def test_an_end_that_raises_is_cut_and_the_other_calls_go_on(
    nursery: trio.Nursery,
) -> None:
    frames = (
        wire.encode(Kind.STATE, 1, b"connected")
        + wire.encode(Kind.STATE, 2, b"connected")
        + wire.encode(Kind.STATE, 1, b"closed")
    )
    code = (
        "import sys\n"
        f"sys.stdout.buffer.write({wire.encode(Kind.READY, 0)!r}); sys.stdout.flush()\n"
        "sys.stdin.buffer.read(9)\n"
        f"sys.stdout.buffer.write({frames!r}); sys.stdout.flush()\n"
        "sys.stdin.buffer.read()\n"
    )

    class Raising(End):
        def received(self, kind: Kind, payload: bytes) -> None:
            super().received(kind, payload)
            raise RuntimeError("a bug in the shell")

    link = MediaLink(CONFIG, command=_fake_worker(code))
    await nursery.start(link.run)
    bad, good = Raising(), End()
    assert [link.open_call(bad).call, link.open_call(good).call] == [1, 2]
    link.open_call(End()).send(Kind.CLEAR)
    await good.next(Kind.STATE)
    await bad.until(lambda: bad.broken is not None)
    assert bad.broken == "the call's end failed" and bad.frames == [(Kind.STATE, b"connected")]
    assert good.broken is None and link.stats().running and link.stats().calls == 2


async def test_a_worker_failing_again_and_again_breaks_the_link_for_good(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "BACKOFF_S", (0.0,) * 5)
    link = MediaLink(CONFIG, command=_fake_worker("pass"))
    await nursery.start(link.run)
    with pytest.raises(RuntimeError, match="failed 6 times"):
        await link.wait_running()
    assert link.stats().restarts == link_module.MAX_RESTARTS
    with pytest.raises(trio.BrokenResourceError, match="broken"):
        link.open_call(End())


async def test_a_worker_that_never_says_ready_is_restarted(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "START_TIMEOUT_S", 0.5)
    link = MediaLink(CONFIG, command=_fake_worker("import sys; sys.stdin.buffer.read()"))
    await nursery.start(link.run)  # (started: its first start failed)
    assert link.broken is not None and "did not start within" in link.broken
    with pytest.raises(trio.BrokenResourceError, match="did not start"):
        link.open_call(End())


async def test_stopping_the_link_shuts_the_worker_down(nursery: trio.Nursery) -> None:
    link = MediaLink(CONFIG)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            await inner.start(link.run)
            end = End()
            link.open_call(end)
            pid = link.stats().pid
            scope.cancel()
    assert pid is not None
    assert end.broken is not None and "stopped" in end.broken
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # (reaped)


def test_ice_servers_reach_the_worker_by_its_environment_only() -> None:
    config = MediaConfig(ice_servers=(IceServer("turn:h:3478", "u", "s3cret"),))
    assert "s3cret" not in config.argument() and "s3cret" not in repr(config)
    env = config.environment({"PATH": "/bin", "TRIO_DUPLEX_API_KEY": "k"})
    assert "TRIO_DUPLEX_API_KEY" not in env and env["PATH"] == "/bin"
    servers = json.loads(env[link_module.ICE_SERVERS_ENV])
    assert servers == [{"urls": "turn:h:3478", "username": "u", "credential": "s3cret"}]
    assert link_module.ICE_SERVERS_ENV not in MediaConfig().environment(env)


def test_the_default_hosts_follow_the_listen_address() -> None:
    assert MediaConfig.hosts_for("127.0.0.1") == ("127.0.0.1",)
    assert MediaConfig.hosts_for("localhost") == ("127.0.0.1",)
    assert MediaConfig.hosts_for("192.0.2.7") == ("192.0.2.7",)
    assert MediaConfig.hosts_for("0.0.0.0") is None
    assert MediaConfig.hosts_for("::") is None
    assert MediaConfig.hosts_for("example.org") is None
