"""The soak's load generator: many sessions of four kinds over raw asyncio sockets.

Started by ``python -m benchmarks.soak`` (one or more of these processes, each with its
share of the sessions); see that module and docs/benchmarks.md. Every session lives in
a slot, and a slot whose session ends (closed, cut, refused) starts a new one of its kind,
so the mix stays constant for the whole run.

- ``voice``: opens a session and talks in turns: 20 ms audio frames at real-time pace
  for ``--talk`` seconds (1-3), then a question (``input.text.append``, one or two
  words: 0.1 to 0.9 s of speech), then ``--pause`` seconds of quiet (60-180). It reads
  everything the engine says, acks as trio_duplex.client does by default (every 32
  events, or 0.5 s after the oldest one not acked), checks that ``server_event_seq``
  runs 1, 2, 3, ..., and closes after its ``--lifetime`` (60-240 s).
- ``hostile``: never reads after the HTTP upgrade (its socket's receive buffer is 4 KiB,
  so the server's queue, not the kernel's, takes the backlog). It asks for an answer
  (1.2 s of speech, about 80 KB), then sends an audio frame every 200 ms and, every
  500 ms, something the server must answer: a heartbeat, invalid JSON, JSON that is not
  an object, an unknown event type, an invalid ack, a binary frame. It goes on until the
  server cuts it (a write fails); the slot then opens a new one 0-5 s later.
- ``resume``: a voice session whose engine events carry ``client_event_seq`` and whose
  pause is ``--resume-pause`` (10-20 s). It drops its socket without a close frame in the
  middle of an answer (the first answer ``--drop-after`` seconds, 3-10, after its last
  resume), resumes with ``last_received_server_event_seq``, resends the events the
  server did not get (``last_received_client_event_seq``; the mic keeps producing frames
  while it is away), and checks exactly-once in both directions: server events
  contiguous across every resume (no gap, no duplicate, no ``session.resync_required``),
  and each question answered exactly once, in order (the k-th ``response.created`` is
  ``resp_k``; with the echo engine, the k-th text echo is the k-th question).
- ``abuse``: per cycle (every 5-15 s), opens a session, sends a valid event fragmented
  in three frames with a ping between the fragments (it must be answered as one event),
  then breaks the connection in turn with a message over ``max_event_bytes`` (one frame,
  announced by its header only: expects 1009), the same spread over two fragments
  (1009), and an unmasked frame (1002); then resumes the session and closes it.

Frames are masked with a fresh key each (websockets' C ``apply_mask``), the handshake
is written by hand, and one ticker task drives every session's 20 ms frames in four
5 ms buckets: economical enough for 1,000 sessions on one core.

Speaks the stdout protocol of ``benchmarks.suite._procs``: ``@stats {json}`` every
``--stats-every`` seconds (cumulative), then ``@result {json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import random
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from benchmarks.suite._stats import percentile
from benchmarks.suite._workload import (
    AUDIO_B64,
    AUDIO_DELTA,
    AUDIO_FRAME,
    SESSION_CLOSE,
    SESSION_UPDATE,
    TEXT_DELTA,
    ack,
    cpu_seconds,
    emit,
    raise_nofile,
    resume,
)

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

KINDS: Final = ("voice", "hostile", "resume", "abuse")
TICK_S: Final = 0.005
BUCKETS: Final = 4  # 4 buckets of 5 ms: each session is ticked once per 20 ms frame
ACK_EVERY: Final = 32
ACK_DELAY: Final = 0.5
"""A reader acks like trio_duplex.client's default AckPolicy: 32 events, or 0.5 s after
the oldest one it has not acked."""
WRITE_LIMIT: Final = 64 * 1024
"""A session whose socket has this much unsent skips its audio frame (counted)."""
HOSTILE_RCVBUF: Final = 4096
TERMINAL: Final = frozenset({"session.closed", "session.expired"})
FATAL: Final = frozenset(
    {
        "config_timeout",
        "resource_exhausted",
        "server_shutting_down",
        "invalid_session_resume",
        "session_resume_expired",
        "invalid_resume_token",
        "session_resume_conflict",
    }
)
"""The error codes that end a connection: only these answer an ``expect``."""
ANSWER_ENDS: Final = frozenset({"response.done", "response.cancelled"})
WORDS: Final = "hello there how are you doing today please tell me about the weather".split()

_HEARTBEAT: Final = b'{"type":"session.heartbeat"}'
_AUDIO_BYTES: Final = AUDIO_FRAME.encode()
_AUDIO_SEQ_HEAD: Final = (
    b'{"type":"input_audio_buffer.append","audio":"' + AUDIO_B64.encode() + b'","client_event_seq":'
)
_HOSTILE_JUNK: Final = (  # (opcode, payload): each one answered into a queue nobody reads
    (1, _HEARTBEAT),  # session.heartbeat_ack
    (1, b"{not json"),  # invalid_json
    (1, b"[1,2,3]"),  # bad_event: not an object
    (1, b'{"type":"no.such.event"}'),  # unknown_event
    (1, b'{"type":"session.event_ack","server_event_seq":-1}'),  # invalid_event_ack
    (2, b"\x00binary"),  # a binary frame: bad_event
)
_ANSWER_FILL: Final = "hello there weather"  # 1.2 s of speech: 59 frames, about 80 KB


class Gone(Exception):
    """The connection ended (``code``: the server's close code, 1006 without one)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def frame(payload: bytes, opcode: int = 1, fin: bool = True, *, mask: bool = True) -> bytes:
    """One client frame (RFC 6455), masked with a fresh key unless ``mask`` is False."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | opcode
    bit = 0x80 if mask else 0
    if n < 126:
        head = bytes((b0, bit | n))
    elif n < 65536:
        head = struct.pack("!BBH", b0, bit | 126, n)
    else:
        head = struct.pack("!BBQ", b0, bit | 127, n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


def header_only(length: int, opcode: int, fin: bool, filler: int) -> bytes:
    """A masked frame header announcing ``length`` payload bytes, then only ``filler`` of
    them: what a client that tries to push a huge message sends first."""
    key = os.urandom(4)
    head = struct.pack("!BBQ", (0x80 if fin else 0) | opcode, 0xFF, length) + key
    return head + apply_mask(b"a" * filler, key)


class Gen:
    """One load-generator process: the counters, the ticker, the slots."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        url = urlsplit(args.url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        self.path = url.path or "/"
        self.echo = args.engine == "echo"
        self.rng = random.Random(args.seed)
        self.counts: collections.Counter[str] = collections.Counter()
        self.live: collections.Counter[str] = collections.Counter()
        self.violations: list[str] = []
        self.cut_ages: list[float] = []
        self.uncut_ages: list[float] = []  # hostile readers still connected at the end
        self.resume_ms: list[float] = []
        self.lateness: list[float] = []
        self.lateness_max = 0.0
        self.buckets: list[dict[Peer, None]] = [{} for _ in range(BUCKETS)]
        self.next_bucket = 0
        self.stopping = False
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ bookkeeping
    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def violation(self, text: str) -> None:
        self.count("eo.violations")
        if len(self.violations) < 50:
            self.violations.append(text)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def subscribe(self, peer: Peer) -> None:
        self.buckets[self.next_bucket][peer] = None
        self.next_bucket = (self.next_bucket + 1) % BUCKETS

    def unsubscribe(self, peer: Peer) -> None:
        for bucket in self.buckets:
            bucket.pop(peer, None)

    # ------------------------------------------------------------------ the loops
    async def ticker(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        slot = 0
        while not self.stopping:
            due += TICK_S
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            late = loop.time() - due
            self.lateness.append(late)
            self.lateness_max = max(self.lateness_max, late)
            if late > 0.1:  # far behind: drop the missed ticks rather than burst them
                self.count("ticker.resynced")
                due = loop.time()
            for peer in list(self.buckets[slot]):
                peer.tick()
            slot = (slot + 1) % BUCKETS

    async def slot(self, kind: str, start_after: float) -> None:
        await asyncio.sleep(start_after)
        factory = PEERS[kind]
        while not self.stopping:
            peer = factory(self)
            try:
                await peer.run()
            except (OSError, TimeoutError, Gone) as exc:
                self.count(f"{kind}.failed.{_reason(exc)}")
                await asyncio.sleep(0.5 + self.rng.random())
            except Exception as exc:  # a bug of ours: say so, keep the slot going
                self.count(f"{kind}.crashed.{type(exc).__name__}")
                if self.counts[f"{kind}.crashed.{type(exc).__name__}"] <= 3:
                    traceback.print_exc()
                await asyncio.sleep(1.0)
            finally:
                peer.end()

    def stats(self) -> dict[str, Any]:
        late = self.lateness
        self.lateness = []
        return {
            "counts": dict(self.counts),
            "live": dict(self.live),
            "tick_late_p99_ms": round(percentile(late, 99) * 1000, 2) if late else None,
            "tick_late_max_ms": round(self.lateness_max * 1000, 2),
            "cpu_s": round(cpu_seconds(), 2),
        }

    async def reporter(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.args.stats_every)
            emit_stats(self.stats())


def emit_stats(stats: dict[str, Any]) -> None:
    print("@stats " + json.dumps(stats, separators=(",", ":")), flush=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, Gone):
        return f"closed_{exc.code}"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return type(exc).__name__


class Link(asyncio.Protocol):
    """One client WebSocket: the HTTP upgrade, masked frames out, server frames in.

    Text messages go to ``peer.on_message``; pings are answered, a close is echoed.
    ``lost`` resolves with the server's close code (1006 if it sent none) once the
    connection is gone. With ``read=False`` it stops reading after the upgrade for good.
    """

    def __init__(self, peer: Peer, read: bool) -> None:
        loop = asyncio.get_running_loop()
        self.peer = peer
        self.read = read
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[int] = loop.create_future()
        self.close_code: int | None = None
        self.gone = False  # aborted by us or lost: nothing more is dispatched
        self.sent_close = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        gen = self.peer.gen
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(
            f"GET {gen.path} HTTP/1.1\r\nHost: {gen.host}:{gen.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        buf = self.buf
        buf += data
        if not self.upgraded.done():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[: buf.find(b"\r\n")])
            del buf[: end + 4]
            if not status.startswith(b"HTTP/1.1 101"):
                self.upgraded.set_exception(ConnectionRefusedError(status.decode("latin-1")))
                self.abort()
                return
            self.upgraded.set_result(None)
            if not self.read:
                assert self.transport is not None
                self.transport.pause_reading()
                buf.clear()
                return
        self._parse()

    def _parse(self) -> None:
        buf = self.buf
        n = len(buf)
        i = 0
        while n - i >= 2:
            b0, b1 = buf[i], buf[i + 1]
            length = b1 & 0x7F
            head = 2
            if length == 126:
                if n - i < 4:
                    break
                length, head = int.from_bytes(buf[i + 2 : i + 4], "big"), 4
            elif length == 127:
                if n - i < 10:
                    break
                length, head = int.from_bytes(buf[i + 2 : i + 10], "big"), 10
            if n - i - head < length:
                break
            payload = bytes(buf[i + head : i + head + length])
            i += head + length
            opcode = b0 & 0x0F
            if opcode == 1:
                self.peer.on_message(self, payload)
                if self.gone:
                    return
            elif opcode == 9:
                self.send(payload, 10)
            elif opcode == 8:
                self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                if not self.sent_close:
                    self.send(payload[:2], 8)
                    self.sent_close = True
                if self.transport is not None:
                    self.transport.close()
                break
        del buf[:i]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.gone = True
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionResetError("closed during the upgrade"))
        if not self.lost.done():
            self.lost.set_result(self.close_code if self.close_code is not None else 1006)
        self.peer.on_lost(self)

    # what peers call
    def send(self, payload: bytes, opcode: int = 1, fin: bool = True) -> None:
        transport = self.transport
        if transport is not None and not self.gone and not transport.is_closing():
            transport.write(frame(payload, opcode, fin))

    def write_raw(self, data: bytes) -> None:
        if self.transport is not None and not self.gone and not self.transport.is_closing():
            self.transport.write(data)

    def backlog(self) -> int:
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def abort(self) -> None:
        """Drop the socket: no close frame (the server sees a reset)."""
        self.gone = True
        if self.transport is not None:
            self.transport.abort()

    async def close(self, within: float = 2.0) -> None:
        """Send a close frame and wait for the server's; abort if it does not come."""
        if not self.gone and not self.sent_close:
            self.sent_close = True
            self.send(struct.pack("!H", 1000), 8)
        try:
            async with asyncio.timeout(within):
                await asyncio.shield(self.lost)
        except TimeoutError:
            self.abort()


async def dial(peer: Peer, *, read: bool = True, rcvbuf: int | None = None) -> Link:
    """Connect and upgrade; raises OSError (refused, reset, not 101) or TimeoutError."""
    gen = peer.gen
    loop = asyncio.get_running_loop()
    link = Link(peer, read)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        async with asyncio.timeout(gen.args.open_timeout):
            await loop.sock_connect(sock, (gen.host, gen.port))
            await loop.create_connection(lambda: link, sock=sock)
            await link.upgraded
    except BaseException:
        link.abort()
        sock.close()
        raise
    return link


class Peer:
    """One session of the soak, in one slot; subclasses are the kinds."""

    kind: ClassVar[str] = ""

    def __init__(self, gen: Gen) -> None:
        self.gen = gen
        self.rng = gen.rng
        self.link: Link | None = None
        self.waiting: tuple[frozenset[str], asyncio.Future[dict[str, Any]]] | None = None
        self.counted_live = False

    async def run(self) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        pass

    def on_message(self, link: Link, payload: bytes) -> None:
        event: dict[str, Any] = json.loads(payload)
        if event["type"] == "error":
            self.gen.count(f"{self.kind}.error.{event.get('code')}")
        self.wake(event)

    def on_lost(self, link: Link) -> None:
        if self.waiting is not None and link is self.link:
            self.wake({"type": "_gone", "code": link.lost.result()})

    def wake(self, event: dict[str, Any]) -> None:
        waiting = self.waiting
        kind = event["type"]
        if kind == "error" and event.get("code") not in FATAL:
            return
        if waiting is not None and (kind in waiting[0] or kind == "_gone"):
            self.waiting = None
            if not waiting[1].done():
                waiting[1].set_result(event)

    async def expect(self, *types: str, within: float = 10.0) -> dict[str, Any]:
        """The next event of one of ``types`` (or an ``error`` that ends the connection);
        raises Gone if the connection ends first, TimeoutError after ``within`` seconds."""
        link = self.link
        if link is None or link.gone:
            raise Gone(link.lost.result() if link is not None and link.lost.done() else 1006)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting = (frozenset((*types, "error")), fut)
        try:
            event = await asyncio.wait_for(fut, within)
        finally:
            self.waiting = None
        if event["type"] == "_gone":
            raise Gone(int(event["code"]))
        return event

    def go_live(self) -> None:
        self.counted_live = True
        self.gen.live[self.kind] += 1

    def end(self) -> None:
        """The slot is done with this session: stop its ticks, drop its socket."""
        self.gen.unsubscribe(self)
        if self.counted_live:
            self.counted_live = False
            self.gen.live[self.kind] -= 1
        if self.link is not None and not self.link.gone:
            self.link.abort()

    async def nap(self, seconds: float) -> None:
        """Sleep, waking early when the run stops."""
        gen = self.gen
        if not gen.stopping:
            await asyncio.wait([gen.stopped], timeout=seconds)


class Voice(Peer):
    """Talk turns at real-time pace, reading every answer; see the module docstring."""

    kind = "voice"

    def __init__(self, gen: Gen) -> None:
        super().__init__(gen)
        self.talking = False
        self.attached = False
        self.closing = False
        self.ended = False  # the session's terminal event arrived
        self.last_seq = 0
        self.acked = 0
        self.asked = 0  # questions sent
        self.answered = 0  # answers started (response.created; echo: the text came back)
        self.finished = 0  # answers ended (response.done / cancelled; echo: same as above)
        self.events = 0
        self.session_id = ""
        self.token = ""
        self.generation = 0
        self.unacked_since = 0.0  # loop time of the oldest event not acked, 0: none

    async def open(self) -> bool:
        """Open the session; False if the server refused it (counted)."""
        self.link = await dial(self)
        self.link.send(SESSION_UPDATE.encode())
        created = await self.expect("session.created")
        if created["type"] != "session.created":
            self.gen.count(f"{self.kind}.refused.{created.get('code')}")
            await self.link.close()
            await self.nap(1.0)
            return False
        self.session_id = created["session_id"]
        self.token = created["resume_token"]
        self.generation = created["attachment_generation"]
        self.attached = True
        self.gen.count(f"{self.kind}.opened")
        self.go_live()
        self.gen.subscribe(self)
        return True

    async def run(self) -> None:
        if not await self.open():
            return
        gen, rng, args = self.gen, self.rng, self.gen.args
        loop = asyncio.get_running_loop()
        end = loop.time() + rng.uniform(*args.lifetime)
        pause = self.pause()
        # A random phase in the turn cycle: turns come at their steady rate from the
        # start, instead of every session taking its first turn at once.
        await self.nap(rng.uniform(0.0, (sum(args.talk) + sum(pause)) / 2))
        while not gen.stopping and loop.time() < end and not self.ended:
            if not await self.check():
                return
            self.talking = True
            await self.nap(rng.uniform(*args.talk))
            self.talking = False
            if not await self.check():
                return
            if gen.stopping:
                break
            if self.finished == self.asked:  # one question at a time
                self.ask()
            await self.nap(rng.uniform(*pause))
        if await self.check():
            await self.wind_up()

    def pause(self) -> tuple[float, float]:
        pause: tuple[float, float] = self.gen.args.pause
        return pause

    async def check(self) -> bool:
        """Still attached? A voice session whose connection the server ended is over
        (counted); a resumer resumes instead."""
        return await self.still_attached()

    async def wind_up(self) -> None:
        await self.finish()

    async def still_attached(self) -> bool:
        """False if the server ended the connection (counted); a resumer resumes instead."""
        link = self.link
        if link is not None and link.gone and not self.closing:
            self.gen.count(f"{self.kind}.server_closed.{link.lost.result()}")
            return False
        return True

    async def finish(self) -> None:
        self.talking = False
        if self.ended or self.link is None or self.link.gone:
            return
        self.closing = True
        self.link.send(SESSION_CLOSE.encode())
        try:
            event = await self.expect(*TERMINAL, within=10)
        except (Gone, TimeoutError) as exc:
            self.gen.count(f"{self.kind}.close_failed.{_reason(exc)}")
            return
        if event["type"] == "session.closed":
            self.gen.count(f"{self.kind}.closed")
        else:
            self.gen.count(f"{self.kind}.close_failed.{event.get('code', event['type'])}")
        await self.link.close()

    def question(self) -> str:
        """One or two words: 0.1 to 0.9 s of speech. The voice engine synthesises every
        frame in Python (about 0.4 ms each), which is the server's largest cost here.
        With the echo engine the text is numbered, so each echo names its question."""
        words = " ".join(self.rng.sample(WORDS, self.rng.randint(1, 2)))
        return f"q{self.asked} {words}" if self.gen.echo else words

    def ask(self) -> None:
        self.asked += 1
        text = json.dumps({"type": "input.text.append", "text": self.question()})
        self.send_engine_event(text.encode())

    def send_engine_event(self, payload: bytes) -> None:
        if self.link is not None:
            self.link.send(payload)

    def tick(self) -> None:
        self.ack_if_due()
        if not self.talking:
            return
        gen = self.gen
        gen.count("audio.due")
        link = self.link
        if link is None or link.gone or link.backlog() > WRITE_LIMIT:
            gen.count("audio.skipped")
            return
        link.send(_AUDIO_BYTES)
        gen.count("audio.sent")

    def on_message(self, link: Link, payload: bytes) -> None:
        self.handle(link, json.loads(payload))

    def handle(self, link: Link, event: dict[str, Any]) -> None:
        gen = self.gen
        kind = event["type"]
        seq = event.get("server_event_seq")
        if seq is not None:
            self.check_seq(seq, kind)
            self.events += 1
            gen.count("events")
            if seq - self.acked >= ACK_EVERY:
                self.ack(link)
            elif not self.unacked_since:
                self.unacked_since = asyncio.get_running_loop().time()
            if kind == AUDIO_DELTA:
                gen.count("events.audio")
            elif kind == "response.created":
                self.answer_started(event)
            elif kind in ANSWER_ENDS:
                self.finished += 1
            elif kind == TEXT_DELTA and gen.echo:
                self.answer_started(event)
                self.finished += 1
        elif kind == "error":
            gen.count(f"{self.kind}.error.{event.get('code')}")
            self.on_error(event)
        elif kind == "session.resync_required":
            gen.count("eo.resync_required")
            gen.violation(f"{self.kind} {self.session_id}: {event}")
            self.last_seq = int(event.get("dropped_through_seq", self.last_seq))
        elif kind in TERMINAL:
            self.ended = True
            self.talking = False
        self.wake(event)

    def ack(self, link: Link) -> None:
        link.send(ack(self.last_seq).encode())
        self.acked = self.last_seq
        self.unacked_since = 0.0

    def ack_if_due(self) -> None:
        link = self.link
        if (
            self.unacked_since
            and link is not None
            and not link.gone
            and self.attached
            and asyncio.get_running_loop().time() - self.unacked_since >= ACK_DELAY
        ):
            self.ack(link)

    def check_seq(self, seq: int, kind: str) -> None:
        gen = self.gen
        expected = self.last_seq + 1
        if seq != expected:
            what = "duplicate" if seq < expected else "gap"
            gen.count(f"eo.{what}")
            gen.violation(
                f"{self.kind} {self.session_id} gen {self.generation}: "
                f"{kind} seq {seq} after {self.last_seq} ({what})"
            )
        self.last_seq = max(self.last_seq, seq)

    def answer_started(self, event: dict[str, Any]) -> None:
        self.answered += 1

    def on_error(self, event: dict[str, Any]) -> None:
        pass


class Resume(Voice):
    """A voice session that drops its socket mid-answer and resumes; checks exactly-once."""

    kind = "resume"

    def __init__(self, gen: Gen) -> None:
        super().__init__(gen)
        self.drop_at = 0.0
        self.dropping = False
        self.resumed: asyncio.Future[bool] | None = None
        self.questions: dict[int, str] = {}
        self.failed = False
        # Engine events sent but not yet known to be received, by client seq; the client
        # seq that each heartbeat in flight confirms.
        self.client_seq = 0
        self.unconfirmed: collections.deque[tuple[int, bytes]] = collections.deque()
        self.heartbeats: collections.deque[int] = collections.deque()
        self.ticks = 0

    async def open(self) -> bool:
        if not await super().open():
            return False
        self.schedule_drop()
        return True

    def schedule_drop(self) -> None:
        lo, hi = self.gen.args.drop_after
        self.drop_at = asyncio.get_running_loop().time() + self.rng.uniform(lo, hi)

    def pause(self) -> tuple[float, float]:
        pause: tuple[float, float] = self.gen.args.resume_pause
        return pause

    async def check(self) -> bool:
        return await self.reattach()

    async def wind_up(self) -> None:
        await self.settle()

    async def reattach(self) -> bool:
        """Wait for a resume in progress, or resume after a loss we did not cause."""
        if self.resumed is not None:
            ok = await self.resumed
            self.resumed = None
            if not ok:
                return False
        link = self.link
        if link is not None and link.gone and not self.ended:
            self.gen.count(f"resume.server_closed.{link.lost.result()}")
            self.drop(already_gone=True)
            return await self.reattach()
        return not self.ended and not self.failed

    async def settle(self) -> None:
        """Stop asking, let the last answer end, check the books, then close."""
        self.talking = False
        self.drop_at = float("inf")
        try:
            async with asyncio.timeout(15):
                while self.finished < self.asked and not self.ended:
                    await asyncio.sleep(0.1)
                    if not await self.reattach():
                        return
        except TimeoutError:
            pass
        if self.ended:
            return
        gen = self.gen
        if self.answered != self.asked:
            gen.count("eo.unanswered")
            gen.violation(
                f"resume {self.session_id}: {self.asked} questions, {self.answered} answers"
            )
        gen.count("resume.sessions_checked")
        gen.count("resume.events_checked", self.events)
        await self.finish()

    # ------------------------------------------------------------ client events
    def send_engine_event(self, payload: bytes) -> None:
        """Number it, keep it until the server has shown it holds it, send if attached."""
        self.client_seq += 1
        seq = self.client_seq
        body = payload[:-1] + b',"client_event_seq":' + str(seq).encode() + b"}"
        self.unconfirmed.append((seq, body))
        if self.attached and self.link is not None:
            self.link.send(body)

    def ask(self) -> None:
        self.asked += 1
        text = self.question()
        self.questions[self.asked] = text
        payload = json.dumps(
            {"type": "input.text.append", "text": text, "event_id": f"q{self.asked}"}
        )
        self.send_engine_event(payload.encode())

    def tick(self) -> None:
        self.ack_if_due()
        self.ticks += 1
        if self.ticks % 50 == 0 and self.attached and self.link is not None:
            # Everything sent before it is received once its ack arrives (the ordering
            # rule): the resend buffer is trimmed to that.
            self.heartbeats.append(self.client_seq)
            self.link.send(_HEARTBEAT)
        if not self.talking:
            return
        gen = self.gen
        gen.count("audio.due")
        link = self.link
        if self.attached and link is not None and link.backlog() > WRITE_LIMIT:
            gen.count("audio.skipped")
            return
        self.client_seq += 1
        body = _AUDIO_SEQ_HEAD + str(self.client_seq).encode() + b"}"
        self.unconfirmed.append((self.client_seq, body))
        if self.attached and link is not None:
            link.send(body)
            gen.count("audio.sent")
        else:
            gen.count("audio.buffered")  # sent after the resume

    def trim(self, upto: int) -> None:
        unconfirmed = self.unconfirmed
        while unconfirmed and unconfirmed[0][0] <= upto:
            unconfirmed.popleft()

    # ------------------------------------------------------------ server events
    def on_message(self, link: Link, payload: bytes) -> None:
        event: dict[str, Any] = json.loads(payload)
        kind = event["type"]
        if kind == "session.heartbeat_ack":
            if self.heartbeats:
                self.trim(self.heartbeats.popleft())
        elif kind == "session.resumed":
            self.on_resumed(link, event)
        else:
            self.handle(link, event)
            if (
                kind == AUDIO_DELTA
                and self.attached
                and not self.dropping
                and asyncio.get_running_loop().time() >= self.drop_at
            ):
                self.drop()  # in the middle of an answer

    def on_error(self, event: dict[str, Any]) -> None:
        """A question refused with input_backpressure was not received: ask it again,
        under a new client seq (later events may have been received)."""
        event_id = event.get("event_id")
        if event.get("code") != "input_backpressure" or not isinstance(event_id, str):
            return
        k = int(event_id[1:])
        marker = f'"event_id": "{event_id}"'.encode()
        self.unconfirmed = collections.deque(
            item for item in self.unconfirmed if marker not in item[1]
        )
        self.gen.count("resume.asked_again")
        payload = json.dumps(
            {"type": "input.text.append", "text": self.questions[k], "event_id": event_id}
        )
        self.send_engine_event(payload.encode())

    def answer_started(self, event: dict[str, Any]) -> None:
        self.answered += 1
        k = self.answered
        if self.gen.echo:
            expected = self.questions.get(k)
            if event.get("text") != expected:
                self.gen.count("eo.answer_order")
                self.gen.violation(
                    f"resume {self.session_id}: echo {k} is {event.get('text')!r}, "
                    f"asked {expected!r}"
                )
        elif event.get("response_id") != f"resp_{k}":
            self.gen.count("eo.answer_order")
            self.gen.violation(
                f"resume {self.session_id}: answer {k} is {event.get('response_id')} "
                f"({self.asked} asked)"
            )

    def drop(self, *, already_gone: bool = False) -> None:
        """Lose the connection (no close frame) and resume on a new one shortly."""
        self.attached = False
        self.dropping = True
        if not already_gone:
            self.gen.count("resume.drops")
            assert self.link is not None
            self.link.abort()
        self.resumed = asyncio.get_running_loop().create_future()
        self.gen.spawn(self.resume_after(self.rng.uniform(0.0, 0.5), self.resumed))

    async def resume_after(self, delay: float, done: asyncio.Future[bool]) -> None:
        gen = self.gen
        ok = False
        try:
            await asyncio.sleep(delay)
            t0 = time.perf_counter()
            self.link = await dial(self)
            self.link.send(resume(self.session_id, self.token, self.last_seq).encode())
            event = await self.expect("session.resumed", *TERMINAL, within=20)
            if event["type"] == "session.resumed":
                ok = True
                gen.count("resume.ok")
                gen.resume_ms.append((time.perf_counter() - t0) * 1000)
            else:
                gen.count(f"resume.refused.{event.get('code', event['type'])}")
        except (OSError, TimeoutError, Gone) as exc:
            gen.count(f"resume.failed.{_reason(exc)}")
        finally:
            self.dropping = False
            self.failed = not ok
            if not done.done():
                done.set_result(ok)

    def on_resumed(self, link: Link, event: dict[str, Any]) -> None:
        gen = self.gen
        if event["attachment_generation"] != self.generation + 1:
            gen.count("eo.generation")
            gen.violation(
                f"resume {self.session_id}: generation {event['attachment_generation']} "
                f"after {self.generation}"
            )
        self.generation = event["attachment_generation"]
        self.token = event["resume_token"]
        self.acked = max(self.acked, self.last_seq)  # the resume acked what we presented
        self.unacked_since = 0.0
        self.trim(int(event["last_received_client_event_seq"]))
        self.heartbeats.clear()
        self.attached = True
        for _, body in self.unconfirmed:
            link.send(body)
        gen.count("resume.resent", len(self.unconfirmed))
        self.schedule_drop()
        self.wake(event)


class Hostile(Peer):
    """Sends and never reads, until the server cuts it; see the module docstring."""

    kind = "hostile"

    def __init__(self, gen: Gen) -> None:
        super().__init__(gen)
        self.ticks = 0

    async def run(self) -> None:
        gen = self.gen
        self.link = link = await dial(self, read=False, rcvbuf=HOSTILE_RCVBUF)
        link.send(SESSION_UPDATE.encode())
        self.ask()
        gen.count("hostile.opened")
        self.go_live()
        t0 = time.monotonic()
        gen.subscribe(self)
        either: list[asyncio.Future[Any]] = [link.lost, gen.stopped]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if link.lost.done():
            gen.count("hostile.cut")
            gen.cut_ages.append(time.monotonic() - t0)
            gen.unsubscribe(self)
            await self.nap(self.rng.uniform(0.0, 5.0))  # a client's backoff: no waves
        else:
            gen.uncut_ages.append(time.monotonic() - t0)

    def ask(self) -> None:
        assert self.link is not None
        self.link.send(json.dumps({"type": "input.text.append", "text": _ANSWER_FILL}).encode())

    def tick(self) -> None:
        link = self.link
        if link is None or link.gone:
            return
        gen = self.gen
        if link.backlog() > WRITE_LIMIT:
            gen.count("hostile.skipped")
            return
        self.ticks = k = self.ticks + 1
        if k % 10 == 0:
            link.send(_AUDIO_BYTES)
        elif k % 25 == 12:
            opcode, junk = _HOSTILE_JUNK[(k // 25) % len(_HOSTILE_JUNK)]
            link.send(junk, opcode)
        else:
            return
        gen.count("hostile.frames_sent")


class Abuse(Peer):
    """Fragmented, oversize and malformed messages; see the module docstring."""

    kind = "abuse"
    variants: ClassVar[tuple[str, ...]] = ("oversize", "oversize_fragmented", "unmasked")

    async def run(self) -> None:
        gen = self.gen
        turn = self.rng.randrange(len(self.variants))
        self.go_live()
        while not gen.stopping:
            await self.cycle(self.variants[turn % len(self.variants)])
            turn += 1
            await self.nap(self.rng.uniform(5.0, 15.0))

    async def cycle(self, variant: str) -> None:
        gen = self.gen
        self.link = link = await dial(self)
        link.send(SESSION_UPDATE.encode())
        created = await self.expect("session.created")
        if created["type"] != "session.created":
            gen.count(f"abuse.refused.{created.get('code')}")
            await link.close()
            return
        gen.count("abuse.opened")
        # A valid event in three fragments, a ping between them: one event, no error.
        body = _AUDIO_BYTES
        third = len(body) // 3
        link.send(body[:third], 1, fin=False)
        link.send(b"soak", 9)
        link.send(body[third : 2 * third], 0, fin=False)
        link.send(body[2 * third :], 0, fin=True)
        link.send(_HEARTBEAT)
        answer = await self.expect("session.heartbeat_ack")
        if answer["type"] == "session.heartbeat_ack":
            gen.count("abuse.fragmented_ok")
        else:
            gen.count(f"abuse.fragmented_refused.{answer.get('code')}")
        limit = int(created["limits"]["max_event_bytes"])
        expected = 1002 if variant == "unmasked" else 1009
        if variant == "oversize":
            link.write_raw(header_only(limit + 1, 1, True, 4096))
        elif variant == "oversize_fragmented":
            link.send(b"a" * 1024, 1, fin=False)
            link.write_raw(header_only(limit - 1024 + 1, 0, True, 4096))
        else:
            link.write_raw(frame(_HEARTBEAT, mask=False))
        try:
            async with asyncio.timeout(10):
                code = await link.lost
        except TimeoutError:
            code = -1
            link.abort()
        outcome = "ok" if code == expected else f"unexpected_{code}"
        gen.count(f"abuse.{variant}.{outcome}")
        # The session is detached, not gone: resume it and close it, freeing its slot.
        self.link = link = await dial(self)
        link.send(resume(created["session_id"], created["resume_token"], 0).encode())
        event = await self.expect("session.resumed")
        if event["type"] != "session.resumed":
            gen.count(f"abuse.resume_refused.{event.get('code')}")
            await link.close()
            return
        link.send(SESSION_CLOSE.encode())
        closed = await self.expect(*TERMINAL)
        gen.count("abuse.closed" if closed["type"] == "session.closed" else "abuse.close_failed")
        await link.close()


PEERS: Final[dict[str, Callable[[Gen], Peer]]] = {
    "voice": Voice,
    "hostile": Hostile,
    "resume": Resume,
    "abuse": Abuse,
}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    gen = Gen(args)
    counts = dict(zip(KINDS, args.counts, strict=True))
    total = sum(counts.values())
    gen.spawn(gen.ticker())
    gen.spawn(gen.reporter())
    slots: list[asyncio.Task[None]] = []
    index = 0
    loop = asyncio.get_running_loop()
    for kind in KINDS:
        for _ in range(counts[kind]):
            # Opens spread evenly over the ramp, the kinds interleaved by their order.
            start = args.ramp * ((index * 7919) % max(total, 1)) / max(total, 1)
            slots.append(loop.create_task(gen.slot(kind, start)))
            index += 1
    await asyncio.sleep(args.duration)
    gen.stopping = True
    gen.stopped.set_result(None)
    t_stop = time.perf_counter()
    _, pending = await asyncio.wait(slots, timeout=args.finish_timeout)
    for task in pending:
        task.cancel()
    gen.count("slots.unfinished", len(pending))
    await asyncio.gather(*pending, return_exceptions=True)
    for task in list(gen.tasks):
        task.cancel()
    await asyncio.gather(*gen.tasks, return_exceptions=True)
    result = gen.stats()
    result.update(
        finish_s=round(time.perf_counter() - t_stop, 2),
        violations=gen.violations,
        hostile_cut_ages_s=[round(x, 2) for x in gen.cut_ages],
        hostile_uncut_ages_s=[round(x, 2) for x in gen.uncut_ages],
        resume_ms=[round(x, 2) for x in gen.resume_ms],
    )
    return result


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--counts", required=True, type=lambda s: [int(x) for x in s.split(",")],
        help="sessions of each kind: voice,hostile,resume,abuse",
    )  # fmt: skip
    parser.add_argument("--duration", type=float, required=True, help="seconds")
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds to open every slot")
    parser.add_argument("--engine", choices=["voice", "echo"], default="voice")
    parser.add_argument(
        "--lifetime", type=lambda s: tuple(float(x) for x in s.split(",")), default=(60.0, 240.0),
        help="MIN,MAX seconds a voice or resume session lives before it closes",
    )  # fmt: skip
    parser.add_argument(
        "--talk", type=lambda s: tuple(float(x) for x in s.split(",")), default=(1.0, 3.0),
        help="MIN,MAX seconds of audio per turn of a voice or resume session",
    )  # fmt: skip
    parser.add_argument(
        "--pause", type=lambda s: tuple(float(x) for x in s.split(",")), default=(60.0, 180.0),
        help="MIN,MAX seconds of quiet after a voice session's question",
    )  # fmt: skip
    parser.add_argument(
        "--resume-pause", type=lambda s: tuple(float(x) for x in s.split(",")),
        default=(10.0, 20.0), help="MIN,MAX seconds of quiet after a resumer's question",
    )  # fmt: skip
    parser.add_argument(
        "--drop-after", type=lambda s: tuple(float(x) for x in s.split(",")), default=(3.0, 10.0),
        help="MIN,MAX seconds between a resumer's drops",
    )  # fmt: skip
    parser.add_argument("--stats-every", type=float, default=5.0)
    parser.add_argument("--open-timeout", type=float, default=20.0)
    parser.add_argument("--finish-timeout", type=float, default=25.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if len(args.counts) != len(KINDS):
        parser.error(f"--counts needs {len(KINDS)} numbers")
    raise_nofile()
    result = asyncio.run(main(args))
    emit("result", result)
    sys.stdout.flush()


if __name__ == "__main__":
    cli()
