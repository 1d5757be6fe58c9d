"""The engine's side of a session's recogniser process (``_recognise.py`` run as a
script; its docstring says why a process): ``RemoteRecogniser``."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Final

import trio

from . import _recognise
from ._recognise import MAX_REQUEST_BYTES, Heard, Hearing

START_TIMEOUT_S: Final = 30.0
"""Python's start and the model's load (0.5 s of CPU; a busy machine takes longer)."""
FEED_TIMEOUT_S: Final = 30.0
"""One request's answer (a turn's end costs up to 0.3 s of CPU)."""
STOP_TIMEOUT_S: Final = 2.0


class RecogniserFailed(RuntimeError):
    """The recogniser's process died, broke its protocol, or did not answer in time."""


def _heard_from_json(rows: Any) -> list[Hearing]:
    return [
        Hearing(Heard(kind), int(offset), str(text), float(start))
        for kind, offset, text, start in rows
    ]


class RemoteRecogniser:
    """A session's recogniser in its child process: ``feed`` as ``Recogniser.feed``, but
    awaited, with the event loop free meanwhile. Start with ``start``, end with
    ``aclose`` (which also kills a child that does not leave within ``STOP_TIMEOUT_S``)."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self._pending = b""
        self.in_turn = False
        self.fed = 0

    @classmethod
    async def start(cls, max_turn_bytes: int) -> RemoteRecogniser:
        process = await trio.lowlevel.open_process(
            [sys.executable, _recognise.__file__, str(max_turn_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        recogniser = cls(process)
        try:
            with trio.fail_after(START_TIMEOUT_S):
                ready = await recogniser._line()
        except BaseException:
            with trio.CancelScope(shield=True):
                await recogniser.aclose()
            raise
        if ready.get("ready") is not True:
            await recogniser.aclose()
            raise RecogniserFailed(f"the recogniser did not start: {ready!r}")
        return recogniser

    async def feed(self, pcm: bytes) -> list[Hearing]:
        if len(pcm) > MAX_REQUEST_BYTES:
            raise ValueError(f"at most {MAX_REQUEST_BYTES} bytes at once")
        with trio.fail_after(FEED_TIMEOUT_S):
            try:
                await self._process.stdin.send_all(len(pcm).to_bytes(4, "big") + pcm)
            except trio.BrokenResourceError as exc:
                raise RecogniserFailed(
                    f"the recogniser's process ended (status {self._process.poll()})"
                ) from exc
            answer = await self._line()
        try:
            heard = _heard_from_json(answer["heard"])
            self.in_turn = bool(answer["in_turn"])
            self.fed = int(answer["fed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RecogniserFailed(f"the recogniser answered {answer!r}") from exc
        return heard

    async def _line(self) -> Any:
        stdout = self._process.stdout
        while b"\n" not in self._pending:
            data = await stdout.receive_some(65536)
            if not data:
                raise RecogniserFailed(
                    f"the recogniser's process ended (status {self._process.poll()})"
                )
            self._pending += data
            if len(self._pending) > MAX_REQUEST_BYTES:  # no answer is that long
                raise RecogniserFailed("the recogniser's answer is too long")
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError as exc:
            raise RecogniserFailed(f"the recogniser answered {line[:80]!r}") from exc

    async def aclose(self) -> None:
        """Close its stdin (it exits), wait a little, then kill it; always reaped."""
        process = self._process
        with trio.CancelScope(shield=True):
            await process.stdin.aclose()
            with trio.move_on_after(STOP_TIMEOUT_S):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.stdout.aclose()
