"""The calls benchmark's engine (``--engine benchmarks.probes.call_engine:StampedVoice``):
the built-in ``voice`` engine, unchanged, seen through a session that notes what the
benchmark (``benchmarks/suite/_calls.py``, scenario 9) cannot see from outside the server.

- **Microphone lateness.** For each ``input_audio_buffer.append`` the engine reads, how
  late it came against its session's own audio clock: the arrival time less the audio
  received up to its end (at 24 kHz PCM16), less the smallest such offset of the
  session's last ``WINDOW_S`` seconds: the lateness of its newest sample, whatever the
  appends' sizes. (Counted to its start instead, an append of half the usual size, as a
  phone call's channel makes when a key flushes 20 ms of its 40 ms batch, lowers the
  least by the difference, and every whole append after it reads that much late for
  ``WINDOW_S``; with appends of one size both ways give the same figure.) A server
  keeping up reads each 20 ms chunk within a few milliseconds of its schedule, whatever
  the constant delay before it (the jitter buffer's); a server falling behind reads them
  later and later. It is scenario 3's
  "added latency", on the way in. (The window: audio lost on the way, a chunk the
  worker's jitter buffer or its 200 ms bound dropped, would otherwise count as lateness
  for the rest of the session; here for ``WINDOW_S`` at most.)
- **The engine's send time of each audio frame** (``CLOCK_MONOTONIC``, just before
  ``send``) and the frame's ``server_event_seq``, when ``DUPLEX_BENCH_CALLS_STAMP`` is
  set. The media worker's ``STATS(seq, t_sent)`` (the RTP send time, same clock, same
  machine) reaches ``RECORDER.sent`` through the server's ``call_media_stats`` hook
  (``benchmarks/probes/call_server.py`` sets it): their difference is the media path's
  latency. Seqs are per session, so the benchmark stamps with one call open.

One change to the engine's work, none to its output: each word's tone is computed once
(``_tone_frames``, memoised: the same bytes). The engine computes 480 sines per 20 ms
frame in Python, ~1 % of a core per session, which would otherwise be most of what a
WebSocket voice session costs the server, and is the same for a call: the benchmark
compares the transports.

Everything is kept in memory and written once, at exit, to ``DUPLEX_BENCH_CALLS_OUT``
(JSON), so that measuring costs the server no I/O. The environment variables are the
benchmark's engine's, read by it; the server itself reads none of them.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from array import array
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, Final, cast

from trio_duplex.engines import voice
from trio_duplex.engines.api import EngineSession, Event
from trio_duplex.engines.voice import SAMPLE_RATE, VoiceEngine

OUT_ENV: Final = "DUPLEX_BENCH_CALLS_OUT"
STAMP_ENV: Final = "DUPLEX_BENCH_CALLS_STAMP"
AUDIO_DELTA: Final = "response.output_audio.delta"
BYTES_PER_S: Final = SAMPLE_RATE * 2
WINDOW_S: Final = 5.0


class Recorder:
    """What the engine and the server's stats hook note, in this process."""

    def __init__(self) -> None:
        self.mic_t = array("d")  # monotonic seconds of each append read
        self.mic_late = array("d")  # its lateness, seconds
        self.stamping = False
        self.engine_ns: dict[int, int] = {}  # seq -> the engine's send time
        self.rtp_ns: dict[int, int] = {}  # seq -> the worker's RTP send time

    def sent(self, seq: int, sent_ns: int) -> None:
        """The server's ``call_media_stats`` hook: one RTP packet went out."""
        self.rtp_ns[seq] = sent_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "mic_t": self.mic_t.tolist(),
            "mic_late": self.mic_late.tolist(),
            "engine_ns": self.engine_ns,
            "rtp_ns": self.rtp_ns,
        }

    def dump(self, path: str) -> None:
        with open(path, "w") as out:
            json.dump(self.as_dict(), out, separators=(",", ":"))


RECORDER: Final = Recorder()


class _Noting:
    """The session as the voice engine sees it: the same, noting as it goes."""

    def __init__(self, session: EngineSession, recorder: Recorder) -> None:
        self._session = session
        self._recorder = recorder
        self._heard = 0  # PCM16 bytes of microphone audio read
        # (arrival, arrival - audio time), rising offsets: the first is the window's least
        self._least: deque[tuple[float, float]] = deque()

    @property
    def config(self) -> Mapping[str, Any]:
        return self._session.config

    async def receive(self, **kwargs: Any) -> Event:
        event = await self._session.receive(**kwargs)
        if event.get("type") == "input_audio_buffer.append":
            now = time.monotonic()
            self._heard += len(event["audio"])
            offset = now - self._heard / BYTES_PER_S
            least = self._least
            while least and least[-1][1] >= offset:
                least.pop()
            least.append((now, offset))
            while least[0][0] < now - WINDOW_S:
                least.popleft()
            self._recorder.mic_t.append(now)
            self._recorder.mic_late.append(offset - least[0][1])
        return event

    async def send(self, event: Event) -> None:
        if self._recorder.stamping and event.get("type") == AUDIO_DELTA:
            t = time.monotonic_ns()
            await self._session.send(event)
            self._recorder.engine_ns[self._session.sent_seq()] = t
        else:
            await self._session.send(event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class StampedVoice(VoiceEngine):
    """``voice``, through ``_Noting``."""

    async def run(self, session: EngineSession) -> None:
        await super().run(cast(EngineSession, _Noting(session, RECORDER)))


_computed = voice._tone_frames


@functools.cache
def _tone(word: str, pitch: float, frames: int) -> tuple[tuple[str | None, bytes], ...]:
    return tuple(_computed(word, pitch, frames))


def _tone_frames(
    word: str, pitch: float, frames: int, first: int = 0
) -> Iterator[tuple[str | None, bytes]]:
    return iter(_tone(word, pitch, frames)[first:])


def _setup() -> None:
    voice._tone_frames = _tone_frames
    RECORDER.stamping = bool(os.environ.get(STAMP_ENV))
    path = os.environ.get(OUT_ENV)
    if path:
        atexit.register(RECORDER.dump, path)


_setup()
