"""The loop-lag watchdog: a thread that says when something blocks the trio event loop.

An engine that calls blocking code from ``run`` (``time.sleep``, a model's synchronous
inference, a plain socket read) stops every session of the process, not only its own: at
50 audio frames a second, a stall of 100 ms is heard by every client. The watchdog makes
such a stall visible. Its thread asks the loop, every half threshold of real time, to run
a tiny callback (``TrioToken.run_sync_soon``); when one has waited longer than the
threshold, the loop is blocked. The thread then reads the loop thread's stack
(``sys._current_frames``), finds whose code is running and logs one WARNING; when the
callback finally runs, a second WARNING gives the stall's length.

Whose code: a ``SessionRunner`` method on the stack, or the coroutine of a
``SessionRunner.run`` among the running task's ancestors (an engine's own child tasks),
names the session; the location is the innermost frame of the engine's own code (the
files its class and base classes are defined in), else the innermost frame outside the
standard library, followed by the innermost frame if that is another.

Costs: nothing on the per-event path (a trio Instrument would be called on every task
step); one wake-up of the loop and of the thread per half threshold, busy or idle. The
loop gets no task or timer of its own, so MockClock's autojump is undisturbed: the
callback runs in trio's own entry-queue task, takes no lock and wakes no thread. The
thread is started and joined by ``watching_the_loop``, which DuplexServer.run holds for as
long as it serves.

Accuracy: a stall is reported only once the callback has waited longer than the
threshold, so never one shorter than it; every stall longer than 1.5 times the threshold
is reported. The length is counted from when the unanswered callback was posted, so it may
fall short of the truth by up to half the threshold. A stall inside C code that holds the
GIL throughout (a huge ``json.loads``) is seen only as it ends, since the thread needs the
GIL to look: its place is then where the loop has got to, next to the culprit.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from ...engines.api import Engine
from .runner import SessionRunner

log = logging.getLogger("trio_duplex")

THREAD_NAME = "trio-duplex loop watchdog"

_RUNNER_CODES = frozenset(
    value.__code__
    for value in vars(SessionRunner).values()
    if isinstance(value, types.FunctionType)
)
"""The code of every SessionRunner method: a frame running one has the runner as ``self``."""

_STDLIB = tuple(
    os.path.join(path, "") for path in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
)


@contextmanager
def watching_the_loop(threshold_s: float) -> Iterator[None]:
    """Watch the current trio run's loop for as long as the block runs: warn when it is
    blocked longer than ``threshold_s`` (0: no watching, no thread)."""
    if not 0 < threshold_s < math.inf:
        yield
        return
    root = trio.lowlevel.current_root_task()
    watchdog = _Watchdog(
        threshold_s, trio.lowlevel.current_trio_token(), threading.get_ident(), root
    )
    thread = threading.Thread(target=watchdog.watch, name=THREAD_NAME, daemon=True)
    thread.start()
    try:
        yield
    finally:
        watchdog.stop()
        thread.join()


QUIET_S = 10.0
"""After a stall is reported, further stalls within this time are counted, not logged:
the next report says how many and the longest (an engine that blocks every frame would
otherwise write two lines per frame)."""

_SILENT = "\x00"  # starts the ``where`` of a stall counted, not logged at WARNING


class _Watchdog:
    def __init__(
        self,
        threshold_s: float,
        token: trio.lowlevel.TrioToken,
        loop_thread: int,
        root: trio.lowlevel.Task | None,
    ) -> None:
        self._threshold_s = threshold_s
        self._reported_at = -math.inf
        self._unreported = 0
        self._longest = 0.0
        self._token = token
        self._loop_thread = loop_thread
        self._root = root
        self._stop = threading.Event()
        # Written by the loop, read by the thread: no lock (each store is atomic, and
        # ``_answered_at`` is stored first), so the callback makes no system call.
        self._answered = 0
        """The newest probe the loop has run, and when (``time.monotonic``)."""
        self._answered_at = 0.0
        self._session_id: str | None = None
        """The session whose engine blocked the loop in the current stall, if any."""

    def _answer(self, probe: int) -> None:
        """Run by the loop (in trio's entry-queue task): ``probe`` got through."""
        self._answered_at = time.monotonic()
        self._answered = probe

    def stop(self) -> None:
        self._stop.set()

    def watch(self) -> None:
        """The thread's body, until ``stop``: a probe every half threshold; one that has
        waited a threshold is a stall, reported once, and again when it got through."""
        threshold, period = self._threshold_s, self._threshold_s / 2
        probe, posted = 0, 0.0
        stall: str | None = None  # whose code blocked the loop, once reported
        while True:
            now = time.monotonic()
            if self._answered >= probe:  # the loop is running: post the next probe
                if stall is not None:
                    self._unblocked(self._answered_at - posted, stall)
                    stall = None
                probe, posted = probe + 1, now
                try:
                    self._token.run_sync_soon(self._answer, probe)
                except trio.RunFinishedError:
                    return
                wake = now + period
            elif stall is not None:  # still blocked: look again for its end
                wake = now + period
            elif now - posted >= threshold:
                stall = self._blocked()
                wake = now + period
            else:
                wake = posted + threshold
            if self._stop.wait(max(0.0, wake - time.monotonic())):
                if stall is not None:  # the loop got through and stopped us at once
                    end = self._answered_at if self._answered >= probe else time.monotonic()
                    self._unblocked(end - posted, stall)
                return

    def _blocked(self) -> str:
        """Report a stall: whose code is running now, and where (or, within QUIET_S of
        the last report, only count it)."""
        self._session_id = None
        try:
            where = self._where()
        except Exception as exc:  # never let the thread die over a stack it could not read
            where = f" (its stack could not be read: {exc!r})"
        if time.monotonic() < self._reported_at + QUIET_S:
            self._unreported += 1
            log.debug(
                "event loop blocked for over %gs%s (counted)",
                self._threshold_s,
                where,
                extra={"session_id": self._session_id},
            )
            return _SILENT + where
        earlier = ""
        if self._unreported:
            earlier = (
                f"; {self._unreported} more stalls since the last report, the longest "
                f"{self._longest:.3f}s"
            )
            self._unreported, self._longest = 0, 0.0
        log.warning(
            "event loop blocked for over %gs%s%s",
            self._threshold_s,
            where,
            earlier,
            extra={"session_id": self._session_id},
        )
        return where

    def _unblocked(self, seconds: float, where: str) -> None:
        if where.startswith(_SILENT):
            self._longest = max(self._longest, seconds)
            log.debug(
                "event loop unblocked after %.3fs%s (counted)",
                seconds,
                where[1:],
                extra={"session_id": self._session_id},
            )
            return
        self._reported_at = time.monotonic()
        log.warning(
            "event loop unblocked after %.3fs%s",
            seconds,
            where,
            extra={"session_id": self._session_id},
        )

    # -- whose code blocks it -------------------------------------------------------------

    def _where(self) -> str:
        """Which session (or task) is running on the loop thread, and where."""
        frame = sys._current_frames().get(self._loop_thread)
        chain: list[types.FrameType] = []  # innermost first
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        if not chain:
            return ""
        try:
            task = self._running_task(chain)
            runner = _runner_of(chain, task)
        except RuntimeError:  # a task tree changed while read (the loop runs Python too)
            task, runner = None, None
        if runner is not None:
            files = _engine_files(type(runner.engine))
            at = next((f for f in chain if f.f_code.co_filename in files), None)
            if at is None:
                at = _outside_stdlib(chain)
            who = f" by the engine of session {runner.session.id}"
            self._session_id = runner.session.id
        else:
            at = _outside_stdlib(chain)
            who = f" in task {task.name}" if task is not None else ""
        inside = "" if at is chain[0] else f" (inside {_place(chain[0])})"
        return f"{who}, at {_place(at)}{inside}"

    def _running_task(self, chain: list[types.FrameType]) -> trio.lowlevel.Task | None:
        """The trio task whose step is running: the one whose coroutine frame is the
        outermost such frame on the stack."""
        by_frame: dict[int, tuple[types.FrameType, trio.lowlevel.Task]] = {}
        todo = [] if self._root is None else [self._root]
        while todo:
            task = todo.pop()
            coroutine_frame = getattr(task.coro, "cr_frame", None)
            if isinstance(coroutine_frame, types.FrameType):
                by_frame[id(coroutine_frame)] = (coroutine_frame, task)
            for nursery in task.child_nurseries:
                todo.extend(nursery.child_tasks)
        for frame in reversed(chain):
            found = by_frame.get(id(frame))
            if found is not None and found[0] is frame:
                return found[1]
        return None


def _runner_of(
    chain: list[types.FrameType], task: trio.lowlevel.Task | None
) -> SessionRunner | None:
    """The session whose code runs: a runner's method on the stack (its engine's ``run``
    or ``check``), or a runner's ``run`` among the running task's ancestors (a task the
    engine started)."""
    frames = list(chain)
    while task is not None:
        coroutine_frame = getattr(task.coro, "cr_frame", None)
        if isinstance(coroutine_frame, types.FrameType):
            frames.append(coroutine_frame)
        nursery = task.parent_nursery
        task = None if nursery is None else nursery.parent_task
    for frame in frames:
        if frame.f_code in _RUNNER_CODES:
            runner = frame.f_locals.get("self")
            if isinstance(runner, SessionRunner):
                return runner
    return None


def _engine_files(cls: type) -> set[str]:
    """The files an engine class and its base classes (but Engine) define functions in."""
    files = set()
    for klass in cls.__mro__:
        if klass in (Engine, object):
            continue
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if isinstance(code, types.CodeType):
                files.add(code.co_filename)
    return files


def _outside_stdlib(chain: list[types.FrameType]) -> types.FrameType:
    """The innermost frame outside the standard library (else the innermost)."""
    for frame in chain:
        name = frame.f_code.co_filename
        if name.startswith("<frozen "):
            continue
        if not name.startswith(_STDLIB) or "-packages" in name:
            return frame
    return chain[0]


def _place(frame: types.FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_qualname}"
