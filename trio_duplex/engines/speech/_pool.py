"""The shared recogniser: ``RecogniserPool``, a few worker processes (``_whisper.py``, one
model each) that every speech session of a server sends its turns to.

A model costs ~280 MB and a decode 0.15-0.5 s of CPU on one thread, so a server runs one
worker per core it may use (``shared_pool``: one pool per ``trio.run``, started by the first
session that asks, owned by a system task so that its children are killed and reaped when
the run ends), and memory does not grow with sessions. Final transcripts wait for a worker
in FIFO order; a partial one is decoded only if a worker is idle at that moment (else
``None`` at once: partials never queue, and never delay a final). A worker that dies,
breaks the protocol or overruns ``DECODE_TIMEOUT_S`` fails only the request it held
(``RecogniserFailed``) and is restarted after a backoff; past ``MAX_RESTARTS`` restarts in
a minute the pool is broken and every request fails at once, saying why.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, Final

import attrs
import trio

from ...settings import ENV_PREFIX
from . import _whisper
from ._capacity import cores
from ._models import ModelChoice

log = logging.getLogger("trio_duplex.engines.speech")

MAX_TURN_BYTES: Final = _whisper.MAX_REQUEST_BYTES  # 30 s of 16 kHz PCM16
DECODE_TIMEOUT_S: Final = 30.0
"""One request's answer, once a worker has it (a 30 s window costs ~0.5 s of CPU)."""
START_TIMEOUT_S: Final = 60.0
"""Python's start, the model's hash and load (~0.6 s of CPU; a busy machine takes longer)."""
WAIT_TIMEOUT_S: Final = 90.0
"""A final's whole wait, in the queue and at a worker."""
MAX_ANSWER_BYTES: Final = 64 * 1024  # a worker's line (448 tokens of text are ~2 KB)
MAX_QUEUED_BYTES: Final = 64 * MAX_TURN_BYTES
"""Finals waiting for a worker, in bytes of audio (each session has at most one)."""
MAX_RESTARTS: Final = 5  # in RESTART_WINDOW_S; one more and the pool is broken
RESTART_WINDOW_S: Final = 60.0
BACKOFF_S: Final = (0.1, 0.3, 1.0, 3.0, 9.0)  # before the 1st, 2nd, ... restart in a window


class RecogniserFailed(RuntimeError):
    """A request's worker died, broke the protocol or did not answer in time, or the pool
    is broken or overloaded."""


class _Fatal(Exception):
    """The model cannot be loaded (missing, or not the packaged one): not retried."""


class _Fault(Exception):
    """The worker misbehaved: it is killed and restarted."""


@attrs.frozen
class PoolStats:
    size: int  # workers the pool runs
    alive: int  # of them, loaded and serving
    busy: int  # decoding a request
    queued: int  # finals waiting for a worker
    restarts: int  # workers restarted since the pool started
    decodes: int  # requests answered with a transcript
    failures: int  # requests failed with RecogniserFailed
    broken: str | None  # why every request fails, if it does
    pids: tuple[int, ...]  # the live workers' process ids (for their RSS)


@attrs.define(eq=False)
class _Job:
    pcm: bytes
    done: trio.Event = attrs.Factory(trio.Event)
    text: str | None = None
    error: str | None = None
    abandoned: bool = False  # the caller left (cancelled): the answer is dropped

    def finish(self, text: str | None = None, error: str | None = None) -> None:
        if not self.done.is_set():
            self.text, self.error = text, error
            self.done.set()


@attrs.define(eq=False)
class _Worker:
    process: trio.Process | None = None
    pid: int | None = None
    wake: trio.Event = attrs.Factory(trio.Event)
    given: _Job | None = None  # handed over while idle, not yet sent
    job: _Job | None = None  # sent, its answer awaited
    died: str | None = None  # the watcher saw its process end


class _Lines:
    """A worker's stdout as JSON lines, each at most ``MAX_ANSWER_BYTES``."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._pending = bytearray()

    async def line(self) -> dict[str, Any]:
        while (end := self._pending.find(b"\n")) < 0:
            if len(self._pending) > MAX_ANSWER_BYTES:
                raise _Fault("its answer is too long")
            data = await self._stream.receive_some(MAX_ANSWER_BYTES)
            if not data:
                raise _Fault("its process ended")
            self._pending += data
        line = bytes(self._pending[:end])
        del self._pending[: end + 1]
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise _Fault(f"it answered {line[:80]!r}")
        return answer


class RecogniserPool:
    """``size`` workers of ``model``; serving while ``run`` runs (``open_pool`` or
    ``shared_pool`` run it)."""

    def __init__(self, model: ModelChoice, size: int | None = None) -> None:
        self.model = model
        self.size = cores() if size is None else size
        if self.size < 1:
            raise ValueError("a recogniser pool needs at least one worker")
        self._workers = [_Worker() for _ in range(self.size)]
        self._idle: collections.deque[_Worker] = collections.deque()
        self._queue: collections.deque[_Job] = collections.deque()
        self._queued_bytes = 0
        self._restarts: collections.deque[float] = collections.deque()  # times, in a window
        self._restarted = 0
        self._decodes = 0
        self._failures = 0
        self._broken: str | None = None
        self._changed = trio.Event()  # a worker started, died, or the pool broke

    # -- the callers' side ----------------------------------------------------------------

    async def transcribe(self, pcm16: bytes, *, partial: bool = False) -> str | None:
        """What ``pcm16`` (16 kHz mono PCM16, a whole turn of at most ``MAX_TURN_BYTES``)
        says. A final waits for a worker (FIFO); a partial returns None at once unless one
        is idle. Raises RecogniserFailed (the module docstring says when)."""
        if len(pcm16) > MAX_TURN_BYTES or len(pcm16) % 2:
            raise ValueError(f"a turn is whole samples, at most {MAX_TURN_BYTES} bytes")
        if self._broken is not None:
            raise RecogniserFailed(self._broken)
        if partial and not self._idle:
            return None
        if self._queued_bytes + len(pcm16) > MAX_QUEUED_BYTES:
            self._failures += 1
            raise RecogniserFailed("the speech recogniser is overloaded: too many turns queued")
        job = _Job(pcm16)
        self._enqueue(job)
        try:
            with trio.move_on_after(WAIT_TIMEOUT_S):
                await job.done.wait()
        finally:
            if not job.done.is_set():  # cancelled, or out of time: the answer is dropped
                job.abandoned = True
                self._unqueue(job)
        if not job.done.is_set():
            self._failures += 1
            raise RecogniserFailed(f"no transcript within {WAIT_TIMEOUT_S:.0f} s")
        if job.error is not None:
            self._failures += 1
            raise RecogniserFailed(job.error)
        assert job.text is not None
        return job.text

    def idle(self) -> int:
        """Workers free right now."""
        return len(self._idle)

    def stats(self) -> PoolStats:
        alive = [w for w in self._workers if w.process is not None and w.died is None]
        return PoolStats(
            size=self.size,
            alive=len(alive),
            busy=sum(1 for w in self._workers if w.job is not None),
            queued=len(self._queue),
            restarts=self._restarted,
            decodes=self._decodes,
            failures=self._failures,
            broken=self._broken,
            pids=tuple(w.pid for w in alive if w.pid is not None),
        )

    async def wait_ready(self) -> None:
        """Until every worker is serving, or the pool is broken."""
        while self._broken is None and self.stats().alive < self.size:
            await self.changed()

    async def changed(self) -> None:
        """Until a worker starts or ends, or the pool breaks."""
        await self._changed.wait()

    # -- dispatch ---------------------------------------------------------------------------

    def _enqueue(self, job: _Job, *, front: bool = False) -> None:
        if front:
            self._queue.appendleft(job)
        else:
            self._queue.append(job)
        self._queued_bytes += len(job.pcm)
        self._dispatch()

    def _unqueue(self, job: _Job) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(job)
            self._queued_bytes -= len(job.pcm)

    def _dispatch(self) -> None:
        """Hand queued jobs to idle workers: after it, one of the two is empty."""
        while self._queue and self._idle:
            job = self._queue.popleft()
            self._queued_bytes -= len(job.pcm)
            worker = self._idle.popleft()
            worker.given = job
            worker.wake.set()

    def _next_job(self) -> _Job | None:
        if not self._queue:
            return None
        job = self._queue.popleft()
        self._queued_bytes -= len(job.pcm)
        return job

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _break(self, reason: str, *, stopped: bool = False) -> None:
        if self._broken is None:
            self._broken = reason
            if not stopped:
                log.warning("%s", reason)
        while self._queue:
            self._failures += 1
            self._next_job().finish(error=reason)  # type: ignore[union-attr]
        self._notify()

    # -- the workers' side ------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until cancelled; then every worker is killed and reaped."""
        if not self.model.is_path:
            log.info("fetching model %s", self.model.source)
        try:
            async with trio.open_nursery() as nursery:
                for worker in self._workers:
                    nursery.start_soon(self._slot, worker)
        finally:
            self._break("the speech recogniser has stopped", stopped=True)

    async def _slot(self, worker: _Worker) -> None:
        """One worker, started and restarted until the pool breaks."""
        while self._broken is None:
            try:
                reason = await self._life(worker)
            except _Fatal as exc:
                self._break(f"the speech recogniser cannot start: {exc}")
                return
            except OSError as exc:  # (no process: out of memory or of processes)
                reason = f"could not start: {exc}"
            now = trio.current_time()
            while self._restarts and self._restarts[0] <= now - RESTART_WINDOW_S:
                self._restarts.popleft()
            if len(self._restarts) >= MAX_RESTARTS:
                self._break(
                    f"the speech recogniser is broken: its workers failed {MAX_RESTARTS + 1} "
                    f"times in {RESTART_WINDOW_S:.0f} s (the last: {reason})"
                )
                return
            log.warning("a speech recogniser worker %s: restarting it", reason)
            await trio.sleep(BACKOFF_S[len(self._restarts)])
            self._restarts.append(trio.current_time())
            self._restarted += 1

    async def _life(self, worker: _Worker) -> str:
        """One process of ``worker``, from its start to its end: why it ended."""
        model = self.model
        command = [
            sys.executable,
            "-P",  # (not the script's directory on sys.path: it holds the engine's modules)
            _whisper.__file__,
            model.source,
            "1" if model.is_path else "0",
            model.expected_sha256 or "-",
        ]
        worker.died = None
        # The server's settings (API keys, the cluster secret, Redis passwords) stay with it.
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        try:
            assert process.stdout is not None and process.stdin is not None
            lines = _Lines(process.stdout)
            try:
                with trio.fail_after(START_TIMEOUT_S):
                    ready = await lines.line()
            except trio.TooSlowError:
                return f"did not load its model within {START_TIMEOUT_S:.0f} s"
            except _Fault as exc:
                return f"did not start: {exc} (status {await _status(process)})"
            if "fatal" in ready:
                raise _Fatal(str(ready["fatal"])[:500])
            if ready.get("ready") is not True:
                return f"did not start: it said {str(ready)[:80]}"
            worker.process, worker.pid = process, process.pid
            self._notify()
            reason = "ended while idle"  # (unless _work returns: the watcher cancels it)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, worker, nursery.cancel_scope)
                reason = await self._work(worker, process.stdin, lines)
                nursery.cancel_scope.cancel()
            if process.returncode is not None or worker.died is not None:
                return f"died (status {await _status(process)}): {reason}"
            return reason
        finally:
            with trio.CancelScope(shield=True):
                process.kill()
                await process.wait()
                await process.stdin.aclose()  # type: ignore[union-attr]
                await process.stdout.aclose()  # type: ignore[union-attr]
                worker.process = worker.pid = None
                self._notify()

    async def _watch(self, worker: _Worker, scope: trio.CancelScope) -> None:
        """Notice a worker's process ending while it is idle (a busy one's stdout ends)."""
        assert worker.process is not None
        status = await worker.process.wait()
        worker.died = f"died (status {status})"
        if worker.job is None:
            scope.cancel()

    async def _work(self, worker: _Worker, stdin: trio.abc.SendStream, lines: _Lines) -> str:
        """Decode jobs until the worker fails: why it failed."""
        while True:
            job = self._next_job()
            if job is None:
                worker.wake = trio.Event()
                self._idle.append(worker)
                try:
                    await worker.wake.wait()
                except BaseException:  # its process died (the watcher), or the pool stops
                    with contextlib.suppress(ValueError):
                        self._idle.remove(worker)
                    given, worker.given = worker.given, None
                    if given is not None and worker.died is not None:
                        self._enqueue(given, front=True)  # (never sent: another worker's)
                    elif given is not None:
                        given.finish(error="the speech recogniser has stopped")
                    raise
                job, worker.given = worker.given, None
                assert job is not None  # (_dispatch gives a job before it wakes a worker)
            if job.abandoned:
                continue
            worker.job = job
            try:
                answer = await self._ask(stdin, lines, job.pcm)
            except _Fault as exc:
                job.finish(error=f"the speech recogniser's worker failed: {exc}")
                return str(exc)
            except BaseException:
                job.finish(error="the speech recogniser has stopped")
                raise
            finally:
                worker.job = None
            if isinstance(answer.get("text"), str):
                self._decodes += 1
                job.finish(text=answer["text"])
            elif "error" in answer:
                job.finish(error=f"the speech recogniser failed: {str(answer['error'])[:200]}")
            else:
                job.finish(error="the speech recogniser's worker broke its protocol")
                return f"answered {str(answer)[:80]}"

    async def _ask(self, stdin: trio.abc.SendStream, lines: _Lines, pcm: bytes) -> dict[str, Any]:
        with trio.move_on_after(DECODE_TIMEOUT_S):
            try:
                await stdin.send_all(len(pcm).to_bytes(4, "big") + pcm)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _Fault("its process ended") from exc
            return await lines.line()
        raise _Fault(f"did not answer within {DECODE_TIMEOUT_S:.0f} s")


async def _status(process: trio.Process) -> int | None:
    with trio.move_on_after(1.0):
        return await process.wait()
    return process.returncode


@contextlib.asynccontextmanager
async def open_pool(model: ModelChoice, size: int | None = None) -> AsyncIterator[RecogniserPool]:
    """A pool running for the block (its workers killed and reaped at the end)."""
    pool = RecogniserPool(model, size)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run)
        try:
            yield pool
        finally:
            nursery.cancel_scope.cancel()


_POOLS: trio.lowlevel.RunVar[dict[ModelChoice, RecogniserPool]] = trio.lowlevel.RunVar(
    "speech_recogniser_pools"
)


def shared_pool(model: ModelChoice, size: int | None = None) -> RecogniserPool:
    """This ``trio.run``'s pool of ``model`` (``size`` workers, default one per core: the
    first call's size counts), started by the first call in a system task that ends, its
    workers killed and reaped, with the run."""
    try:
        pools = _POOLS.get()
    except LookupError:
        pools = {}
        _POOLS.set(pools)
    pool = pools.get(model)
    if pool is None:
        pool = pools[model] = RecogniserPool(model, size)
        trio.lowlevel.spawn_system_task(_own, pool, name="trio_duplex.RecogniserPool")
    return pool


async def _own(pool: RecogniserPool) -> None:
    try:
        await pool.run()
    except Exception as exc:  # a system task must not raise (it would end the run)
        log.error("the speech recogniser pool failed: %r", exc)
