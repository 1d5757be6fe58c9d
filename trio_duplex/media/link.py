"""The trio side of the media worker (issue 28): ``MediaLink`` runs one worker process
(``_worker.py``, aiortc under asyncio, in a process of its own: docs/plans/webrtc.md
§0.1) and multiplexes the server's calls over its stdin and stdout (``wire`` frames).

``await nursery.start(link.run)`` starts the worker and returns once it has said READY
(or once its first start has failed: ``link.broken`` then says why while it retries).
``open_call(end)`` gives a call its ``CallPort``; the link's reader task hands each frame
the worker sends for that call to ``end.received`` and, if the worker dies or breaks the
framing, calls ``end.link_broken(why)`` on every open call: calls are not carried over to
the next worker, which is started after a backoff (as ``engines/speech/_pool.py`` does).
Past ``MAX_RESTARTS`` restarts in ``RESTART_WINDOW_S`` the link is broken for good.

What the link logs never holds an SDP (an ICE password and the DTLS fingerprint are the
call's credentials) nor a data-channel message.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import attrs
import trio

from ..settings import ENV_PREFIX
from .port import CallEnd, CallPort
from .wire import Frame, Kind, Reader, WireError, encode

log = logging.getLogger("trio_duplex.media")

WORKER: Final = Path(__file__).with_name("_worker.py")
START_TIMEOUT_S: Final = 30.0
"""Python's start and aiortc's import (~0.5 s of CPU; a busy machine takes longer)."""
WRITE_TIMEOUT_S: Final = 10.0
"""A write to the worker's stdin that takes longer: the worker is stuck, and is killed."""
MAX_QUEUED_BYTES: Final = 16 * 1024 * 1024
"""Frames waiting for the worker's stdin. The calls keep to their credits (256 KiB of text
and 120 s of ~60-byte packets each), so more means the worker has stopped reading."""
MAX_WRITE_BYTES: Final = 256 * 1024  # joined into one write
MAX_READ_BYTES: Final = 256 * 1024
MAX_RESTARTS: Final = 5  # in RESTART_WINDOW_S; one more and the link is broken for good
RESTART_WINDOW_S: Final = 60.0
BACKOFF_S: Final = (0.1, 0.3, 1.0, 3.0, 9.0)  # before the 1st, 2nd, ... restart in a window
STOP_TIMEOUT_S: Final = 5.0
"""At the end: SHUTDOWN, then this long for the worker to close its calls and exit."""
ICE_SERVERS_ENV: Final = "DUPLEX_MEDIA_ICE_SERVERS"
"""How STUN/TURN servers reach the worker: its environment, not its command line (which
every user of the machine can read), since a TURN server comes with a credential."""

_FROM_WORKER: Final = frozenset(
    {
        Kind.READY,
        Kind.ANSWER,
        Kind.FAILED,
        Kind.STATE,
        Kind.DC_OPEN,
        Kind.DC_TEXT,
        Kind.DC_DRAINED,
        Kind.DC_CLOSED,
        Kind.MIC,
        Kind.PLAYED,
        Kind.CLOSED,
        Kind.FAULT,
        Kind.STATS,
    }
)


@attrs.frozen
class IceServer:
    """A STUN or TURN server for the worker's ICE (``urls`` as in ``RTCIceServer``)."""

    urls: str
    username: str | None = None
    credential: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class MediaConfig:
    """The worker's settings (docs/plans/webrtc.md §1.2, §1.4, §2.4)."""

    hosts: tuple[str, ...] | None = ("127.0.0.1",)
    """The addresses of its host candidates; None: every address but loopback (aioice's
    own choice, for a wildcard listen)."""
    allow_peers: tuple[str, ...] = ()
    """CIDRs whose datagrams are answered; empty: any."""
    udp_ports: tuple[int, int] | None = None
    """Bind its UDP sockets in this range (inclusive); None: any port."""
    ice_servers: tuple[IceServer, ...] = ()
    consent_interval_s: float = 2.0
    consent_failures: int = 3
    """A peer gone silent is ``failed`` after about interval x (failures + 0.5)."""
    close_timeout_s: float = 2.0
    log_level: str = "WARNING"

    @staticmethod
    def hosts_for(listen_host: str) -> tuple[str, ...] | None:
        """The default ``hosts`` for a server listening on ``listen_host``: that address
        when it is one (``127.0.0.1`` -> only loopback candidates), else None (a
        wildcard: every address of the machine but loopback)."""
        try:
            address = ipaddress.ip_address(listen_host)
        except ValueError:
            return ("127.0.0.1",) if listen_host == "localhost" else None
        return None if address.is_unspecified else (str(address),)

    def argument(self) -> str:
        """CONFIG_JSON: everything but the ICE servers."""
        return json.dumps(
            {
                "hosts": None if self.hosts is None else list(self.hosts),
                "allow_peers": list(self.allow_peers),
                "udp_ports": None if self.udp_ports is None else list(self.udp_ports),
                "consent_interval_s": self.consent_interval_s,
                "consent_failures": self.consent_failures,
                "close_timeout_s": self.close_timeout_s,
                "log_level": self.log_level,
            }
        )

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        # The server's settings (API keys, the cluster secret, Redis passwords) stay with it.
        env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX)}
        env.pop(ICE_SERVERS_ENV, None)
        if self.ice_servers:
            env[ICE_SERVERS_ENV] = json.dumps([attrs.asdict(s) for s in self.ice_servers])
        return env


@attrs.frozen
class LinkStats:
    running: bool  # a worker is serving
    calls: int  # open on it
    restarts: int  # workers restarted since the link started
    broken: str | None  # why no worker serves now, if none does
    pid: int | None


class _Fault(Exception):
    """The worker broke the link: it is killed and restarted."""


class _Life:
    """One worker process, from its start to its end: its calls and its stdin's queue."""

    def __init__(self) -> None:
        self.ends: dict[int, CallEnd] = {}
        self.closed: set[int] = set()  # released, the worker's CLOSED still awaited
        self.queue: collections.deque[bytes] = collections.deque()
        self.queued = 0
        self.wake = trio.Event()
        self.dead: str | None = None
        self.next_call = 1

    def put(self, frame: bytes) -> None:
        if self.dead is not None:
            raise trio.BrokenResourceError(self.dead)
        if self.queued + len(frame) > MAX_QUEUED_BYTES:
            raise _Fault(f"it stopped reading its input ({self.queued} bytes queued)")
        self.queue.append(frame)
        self.queued += len(frame)
        self.wake.set()

    def take(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while self.queue and (not parts or size + len(self.queue[0]) <= MAX_WRITE_BYTES):
            part = self.queue.popleft()
            parts.append(part)
            size += len(part)
        self.queued -= size
        return b"".join(parts)


class _Port:
    """A ``CallPort``: one call on one worker's life."""

    __slots__ = ("_call", "_life", "_link", "_released")

    def __init__(self, link: MediaLink, life: _Life, call: int) -> None:
        self._link = link
        self._life = life
        self._call = call
        self._released = False

    @property
    def call(self) -> int:
        return self._call

    @property
    def broken(self) -> bool:
        return self._life.dead is not None

    def send(self, kind: Kind, payload: bytes = b"") -> None:
        if self._released:
            raise trio.ClosedResourceError("the call was released")
        self._link._send(self._life, self._call, kind, payload)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        life = self._life
        if life.ends.pop(self._call, None) is None or life.dead is not None:
            return  # (the worker said CLOSED, or died: the number is free)
        life.closed.add(self._call)  # free once the worker says CLOSED
        with contextlib.suppress(trio.BrokenResourceError):
            self._link._send(life, self._call, Kind.CLOSE, b"")

    def __repr__(self) -> str:
        return f"<media call {self._call}{' broken' if self.broken else ''}>"


class MediaLink:
    """One media worker for a server process, restarted when it fails."""

    def __init__(
        self, config: MediaConfig | None = None, *, command: list[str] | None = None
    ) -> None:
        self.config = MediaConfig() if config is None else config
        self._command = command  # (tests: another program in the worker's place)
        self._life: _Life | None = None  # serving
        self._broken: str | None = "the media worker has not started"
        self._failed = False  # broken for good
        self._restarts: collections.deque[float] = collections.deque()
        self._restarted = 0
        self._pid: int | None = None
        self._changed = trio.Event()

    # -- the calls' side ------------------------------------------------------------------

    @property
    def broken(self) -> str | None:
        """Why no worker serves now (None while one does)."""
        return self._broken

    def open_call(self, end: CallEnd) -> CallPort:
        """A new call on the running worker; ``trio.BrokenResourceError`` if none runs."""
        life = self._life
        if life is None or life.dead is not None:
            raise trio.BrokenResourceError(self._broken or "the media worker is not running")
        call = life.next_call
        while call == 0 or call in life.ends or call in life.closed:
            call = (call + 1) & 0xFFFFFFFF
        life.next_call = (call + 1) & 0xFFFFFFFF
        life.ends[call] = end
        return _Port(self, life, call)

    def stats(self) -> LinkStats:
        life = self._life
        return LinkStats(
            running=life is not None and life.dead is None,
            calls=0 if life is None else len(life.ends),
            restarts=self._restarted,
            broken=self._broken,
            pid=self._pid,
        )

    async def changed(self) -> None:
        """Until a worker starts or ends."""
        await self._changed.wait()

    async def wait_running(self) -> None:
        """Until a worker serves (or the link is broken for good: then RuntimeError)."""
        while self._life is None:
            if self._failed:
                raise RuntimeError(self._broken)
            await self.changed()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _send(self, life: _Life, call: int, kind: Kind, payload: bytes) -> None:
        try:
            life.put(encode(kind, call, payload))
        except _Fault as exc:
            self._end(life, str(exc))
            raise trio.BrokenResourceError(life.dead) from None

    # -- the worker's side ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (then SHUTDOWN, and the worker is reaped). Started once
        the first worker is ready, or has failed to start (``broken`` says why)."""
        started = False

        def ready() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        try:
            while True:
                try:
                    reason = await self._life_of_a_worker(ready)
                except OSError as exc:  # (no process: out of memory or of processes)
                    reason = f"could not start: {exc}"
                self._broken = f"the media worker {reason}"
                now = trio.current_time()
                while self._restarts and self._restarts[0] <= now - RESTART_WINDOW_S:
                    self._restarts.popleft()
                if len(self._restarts) >= MAX_RESTARTS:
                    self._broken = (
                        f"the media worker is broken: it failed {MAX_RESTARTS + 1} times in "
                        f"{RESTART_WINDOW_S:.0f} s (the last: {reason})"
                    )
                    self._failed = True
                    log.error("%s", self._broken)
                    self._notify()
                    ready()
                    await trio.sleep_forever()
                log.warning("the media worker %s: restarting it", reason)
                self._notify()
                ready()
                await trio.sleep(BACKOFF_S[len(self._restarts)])
                self._restarts.append(trio.current_time())
                self._restarted += 1
        finally:
            self._broken = "the media link has stopped"
            self._notify()

    async def _life_of_a_worker(self, ready: Callable[[], None]) -> str:
        """One worker process, from its start to its end: why it ended."""
        command = self._command or [
            sys.executable,
            "-P",  # (the package stays off its sys.path: the worker imports none of it)
            str(WORKER),
            self.config.argument(),
        ]
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.config.environment(os.environ),
        )
        life = _Life()
        try:
            assert process.stdout is not None and process.stdin is not None
            reader = Reader()
            first: list[Frame] = []
            try:
                with trio.fail_after(START_TIMEOUT_S):
                    while not first:
                        data = await process.stdout.receive_some(MAX_READ_BYTES)
                        if not data:
                            return f"did not start (status {await _status(process)})"
                        first = reader.feed(data)
            except trio.TooSlowError:
                return f"did not start within {START_TIMEOUT_S:.0f} s"
            except WireError as exc:
                return f"did not start: {exc}"
            if first[0].kind != Kind.READY or first[0].call != 0:
                return f"did not start: it sent {first[0].kind.name} first"
            self._life, self._pid, self._broken = life, process.pid, None
            self._notify()
            ready()
            log.info("the media worker started (pid %d)", process.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, life, process.stdin, nursery.cancel_scope)
                nursery.start_soon(self._watch, life, process, nursery.cancel_scope)
                try:
                    self._dispatch(life, first[1:])
                    await self._read(life, process, reader)
                except _Fault as exc:
                    self._end(life, str(exc))
                nursery.cancel_scope.cancel()
            assert life.dead is not None
            return life.dead
        finally:
            orderly = life.dead is None  # (the link stops: else the worker failed)
            self._end(life, "has stopped")
            with trio.CancelScope(shield=True):
                await self._stop(process, orderly)
                self._pid = None
                self._notify()

    async def _stop(self, process: trio.Process, orderly: bool) -> None:
        """An orderly stop: SHUTDOWN, a while for the worker to close its calls (their
        peers see a DTLS close) and exit, then kill. A failed worker is killed at once."""
        if orderly and process.returncode is None:
            assert process.stdin is not None
            with trio.move_on_after(STOP_TIMEOUT_S):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await process.stdin.send_all(encode(Kind.SHUTDOWN, 0))
                    await process.stdin.aclose()
                await process.wait()
        process.kill()
        await process.wait()
        if process.stdin is not None:
            await process.stdin.aclose()
        if process.stdout is not None:
            await process.stdout.aclose()

    def _end(self, life: _Life, why: str) -> None:
        """The worker is gone: every open call hears it once."""
        if life.dead is not None:
            return
        life.dead = why
        life.wake.set()
        if self._life is life:
            self._life = None
            self._broken = f"the media worker {why}"
            self._notify()
        ends, life.ends = life.ends, {}
        life.closed.clear()
        life.queue.clear()
        life.queued = 0
        for end in ends.values():
            try:
                end.link_broken(f"the media worker {why}")
            except Exception:
                log.exception("a call's end failed on hearing that the media worker broke")

    async def _read(self, life: _Life, process: trio.Process, reader: Reader) -> None:
        assert process.stdout is not None
        while True:
            data = await process.stdout.receive_some(MAX_READ_BYTES)
            if not data:
                raise _Fault(f"died (status {await _status(process)})")
            try:
                frames = reader.feed(data)
            except WireError as exc:
                raise _Fault(f"broke the framing: {exc}") from None
            self._dispatch(life, frames)

    def _dispatch(self, life: _Life, frames: list[Frame]) -> None:
        for kind, call, payload in frames:
            if kind not in _FROM_WORKER:
                raise _Fault(f"sent a {kind.name} frame")
            if call == 0:
                continue  # (READY again: nothing to do)
            if kind == Kind.CLOSED:
                life.closed.discard(call)
            end = life.ends.get(call)
            if end is None:
                continue  # a released call's last frames
            if kind == Kind.CLOSED:
                del life.ends[call]  # (its port's release has nothing more to free)
            try:
                end.received(kind, payload)
            except Exception:
                log.exception(
                    "call %d's end failed on a %s frame: the call is cut", call, kind.name
                )
                if life.ends.pop(call, None) is not None:
                    life.closed.add(call)
                    with contextlib.suppress(trio.BrokenResourceError):
                        self._send(life, call, Kind.CLOSE, b"")
                with contextlib.suppress(Exception):
                    end.link_broken("the call's end failed")

    async def _write(
        self, life: _Life, stdin: trio.abc.SendStream, scope: trio.CancelScope
    ) -> None:
        try:
            while life.dead is None:
                if not life.queue:
                    life.wake = trio.Event()
                    await life.wake.wait()
                    continue
                data = life.take()
                with trio.move_on_after(WRITE_TIMEOUT_S) as timer:
                    await stdin.send_all(data)
                if timer.cancelled_caught:
                    self._end(life, f"did not read its input for {WRITE_TIMEOUT_S:.0f} s")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._end(life, "closed its input")
        scope.cancel()

    async def _watch(self, life: _Life, process: trio.Process, scope: trio.CancelScope) -> None:
        status = await process.wait()
        self._end(life, f"died (status {status})")
        scope.cancel()


async def _status(process: trio.Process) -> int | None:
    with trio.move_on_after(1.0):
        return await process.wait()
    return process.returncode
