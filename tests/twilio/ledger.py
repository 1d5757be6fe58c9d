"""The ledger engine (``--engine tests.twilio.ledger:factory``): a phone call's engine
whose audio says, byte for byte, what it is and what the engine received, so that a test
listening through the fake Twilio can tell exactly which frames of which response the
caller heard, in what order, how many times, and which of the caller's chunks reached the
engine (docs/plans/telephony.md §7.5).

Why bytes survive: the engine runs at 8 kHz (``audio_rate``), the call's rate, so the
server converts μ-law ↔ PCM16 by its tables alone (no resampler), and every μ-law code
but 0x7F (-0, which encodes back as 0xFF) is its own PCM16 value's code. So the engine
writes PCM16 ``ULAW_DECODE[code]`` and the caller hears ``code``; the caller sends
``code`` and the engine reads ``ULAW_ENCODE[pcm]``.

The codes (disjoint sets, none 0x7F or 0xFF, μ-law's silence):

* an output frame (20 ms, 160 codes): ``FRAME_SYNC``, the response number as a digit,
  the frame's index as two digits (``DIGIT``: 0x10 + 0..99), then 156 body codes:
  ``FILL`` for a spoken response; for the report, the ledger's JSON as nibbles
  (``NIBBLE``: 0x80 + 0..15) padded with ``FILL``. A frame cut by a ``clear`` is a
  segment shorter than 160 between two syncs (``parse_heard``).
* an input chunk (20 ms, 160 codes, what the fake sends as one ``media``):
  ``INPUT_SYNC``, its number as two digits, 157 ``INPUT_FILL``. The engine reads the
  caller's audio as a stream of such blocks; anything else (silence, a chunk cut short)
  counts as ``bad`` and the engine looks for the next ``INPUT_SYNC``.

What it does: a key ``1``…``9`` starts a response of that many seconds of frames, paced
in real time (a frame every 20 ms against absolute deadlines, as ``voice`` paces); ``*``
a response of ``BURST_S`` seconds sent at once, as one batch (a model faster than real
time: the call's channel holds what Twilio may not take yet); ``#``
starts the report, a response whose body is the ledger: the chunks received (as runs of
consecutive numbers, in the order they came), the bad blocks, the keys and how often the
engine was restored; ``0`` ends the session (an assistant that hangs up: the server
closes the stream). Keys pressed while a response plays wait for it to end. Every key
is recorded. It migrates (``snapshot``/``restore``): the ledger, the responses waiting,
the one playing and the index of its next frame.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np
import trio

from trio_duplex.audio._g711 import ULAW_DECODE, ULAW_ENCODE
from trio_duplex.engines.api import INPUT_DTMF, Engine, EngineSession, Event, check_dtmf

RATE: Final = 8000
FRAME: Final = 160
"""Codes (samples) a frame: 20 ms."""
FRAME_S: Final = FRAME / RATE
FRAME_SYNC: Final = 0x01
INPUT_SYNC: Final = 0x02
FILL: Final = 0xA5
INPUT_FILL: Final = 0xB5
DIGIT0: Final = 0x10
NIBBLE0: Final = 0x80
HEADER: Final = 4
"""Codes of a frame's header: sync, response, index (two digits)."""
REPORT_KEY: Final = "#"
BURST_KEY: Final = "*"
HANG_UP_KEY: Final = "0"
BURST_S: Final = 6
_APPEND: Final = "input_audio_buffer.append"
_STATE: Final = "ledger/1"


def digit(n: int) -> int:
    if not 0 <= n < 100:
        raise ValueError(f"a digit code holds 0..99, not {n}")
    return DIGIT0 + n


def undigit(code: int) -> int | None:
    n = code - DIGIT0
    return n if 0 <= n < 100 else None


def pcm_of(codes: bytes) -> bytes:
    """The PCM16 whose μ-law codes are ``codes``."""
    return ULAW_DECODE[np.frombuffer(codes, dtype=np.uint8)].astype("<i2").tobytes()


def codes_of(pcm: bytes) -> bytes:
    """μ-law codes of PCM16 (the server's table)."""
    samples = np.frombuffer(pcm, dtype="<i2")
    return ULAW_ENCODE[samples.view(np.uint16)].tobytes()


# -- what the caller sends ---------------------------------------------------------------


def input_chunk(number: int) -> bytes:
    """The μ-law of the caller's chunk ``number`` (0..9999): one ``media`` message."""
    return bytes(
        [INPUT_SYNC, digit(number // 100), digit(number % 100), *([INPUT_FILL] * (FRAME - 3))]
    )


def chunk_number(ulaw: bytes) -> int | None:
    """The number of an ``input_chunk``, or None if ``ulaw`` is not one."""
    if len(ulaw) != FRAME or ulaw[0] != INPUT_SYNC or ulaw.count(INPUT_FILL) != FRAME - 3:
        return None
    hi, lo = undigit(ulaw[1]), undigit(ulaw[2])
    return None if hi is None or lo is None else hi * 100 + lo


# -- what the engine says ----------------------------------------------------------------


def frame_codes(response: int, index: int, body: bytes = b"") -> bytes:
    if len(body) > FRAME - HEADER:
        raise ValueError("a frame's body holds 156 codes")
    head = bytes([FRAME_SYNC, digit(response), digit(index // 100), digit(index % 100)])
    return head + body + bytes([FILL]) * (FRAME - HEADER - len(body))


def report_frames(response: int, report: Mapping[str, Any]) -> list[bytes]:
    """The report's frames: its JSON as nibbles, 156 a frame."""
    text = json.dumps(report, separators=(",", ":")).encode()
    nibbles = bytes(NIBBLE0 + n for byte in text for n in (byte >> 4, byte & 0x0F))
    room = FRAME - HEADER
    return [
        frame_codes(response, i, nibbles[at : at + room])
        for i, at in enumerate(range(0, len(nibbles), room))
    ]


@attrs.frozen
class Heard:
    """One frame as the caller heard it: a segment of the audio from a sync on."""

    stream: int
    response: int | None
    """None: cut before its header was whole."""
    index: int | None
    codes: bytes
    at: float
    """When its first code played."""

    @property
    def whole(self) -> bool:
        return len(self.codes) == FRAME


def parse_heard(stream: int, played: Sequence[tuple[float, bytes]]) -> tuple[list[Heard], int]:
    """One stream's played audio (each piece with when it started) as the frames heard,
    in order, and how many codes came before the first sync (a frame begun elsewhere)."""
    data = b"".join(piece for _, piece in played)
    offsets = list(itertools.accumulate((len(piece) for _, piece in played), initial=0))

    def when(position: int) -> float:
        n = bisect.bisect_right(offsets, position) - 1
        return played[n][0] + (position - offsets[n]) / RATE

    starts = [i for i, code in enumerate(data) if code == FRAME_SYNC]
    heard: list[Heard] = []
    for n, begin in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(data)
        codes = data[begin:end]
        response = index = None
        if len(codes) >= HEADER:
            r, hi, lo = undigit(codes[1]), undigit(codes[2]), undigit(codes[3])
            if r is not None and hi is not None and lo is not None:
                response, index = r, hi * 100 + lo
        heard.append(Heard(stream, response, index, codes, when(begin)))
    return heard, starts[0] if starts else len(data)


def decode_report(frames: Sequence[Heard]) -> dict[str, Any]:
    """The report's JSON from its frames (whole, in order)."""
    nibbles = b"".join(f.codes[HEADER:] for f in frames).rstrip(bytes([FILL]))
    values = [code - NIBBLE0 for code in nibbles]
    if len(values) % 2 or not all(0 <= v < 16 for v in values):
        raise ValueError("the report's body is not nibbles")
    text = bytes((values[i] << 4) | values[i + 1] for i in range(0, len(values), 2))
    report: dict[str, Any] = json.loads(text)
    return report


def expand_runs(runs: Sequence[Sequence[int]]) -> list[int]:
    return [n for first, last in runs for n in range(first, last + 1)]


# -- the engine --------------------------------------------------------------------------


class LedgerEngine(Engine):
    """See the module docstring."""

    accepts = frozenset({_APPEND, INPUT_DTMF})
    audio_rate: int | None = RATE

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        del config
        self.runs: list[list[int]] = []
        """The chunks received, in order, as runs of consecutive numbers."""
        self.bad = 0
        self.keys: list[str] = []
        self.restored = 0
        self.responses = 0
        self.waiting: deque[str] = deque()
        """Keys whose responses wait for the one playing."""
        self.playing: dict[str, Any] | None = None
        """``{"id", "key", "response", "report", "next"}``: the response playing (the
        report it says, for ``#``) and its next frame; its frames are ``_frames``."""
        self._frames: list[bytes] = []
        self._codes = bytearray()

    def check(self, event: Event) -> None:
        if event["type"] == INPUT_DTMF:
            check_dtmf(event)

    async def run(self, session: EngineSession) -> None:
        start = 0.0  # when frame 0 of the response playing was (would have been) due
        if self.playing is not None:
            start = trio.current_time() - self.playing["next"] * FRAME_S
        while True:
            playing = self.playing
            if playing is None and self.waiting:
                if self.waiting[0] == HANG_UP_KEY:
                    return
                playing = self._begin(self.waiting.popleft())
                if playing is not None:
                    await session.send({"type": "response.created", "response_id": playing["id"]})
                    self.playing = playing
                    start = trio.current_time()
                continue
            if playing is not None and trio.current_time() >= start + playing["next"] * FRAME_S:
                index = playing["next"]
                if playing["key"] == BURST_KEY and index < len(self._frames):
                    await session.send_many(  # all or none of them (a migration's stop)
                        [
                            {
                                "type": "response.output_audio.delta",
                                "response_id": playing["id"],
                                "audio": pcm_of(frame),
                            }
                            for frame in self._frames[index:]
                        ]
                    )
                    playing["next"] = len(self._frames)
                    start = trio.current_time() - playing["next"] * FRAME_S
                elif index < len(self._frames):
                    audio = pcm_of(self._frames[index])
                    await session.send(
                        {
                            "type": "response.output_audio.delta",
                            "response_id": playing["id"],
                            "audio": audio,
                        }
                    )
                    playing["next"] = index + 1
                else:
                    await session.send({"type": "response.done", "response_id": playing["id"]})
                    self.playing = None
                continue
            due = math.inf if playing is None else start + playing["next"] * FRAME_S
            with trio.move_on_at(due):
                try:
                    batch = await session.receive_batch()
                except trio.EndOfChannel:
                    return
                for event in batch:  # (no await: the state is whole at every checkpoint)
                    self._take(event)

    def _take(self, event: Event) -> None:
        if event["type"] == INPUT_DTMF:
            self.keys.append(event["digit"])
            self.waiting.append(event["digit"])
            return
        self._codes += codes_of(event["audio"])
        codes = self._codes
        while len(codes) >= FRAME:
            number = chunk_number(bytes(codes[:FRAME]))
            if number is None:
                self.bad += 1
                sync = codes.find(INPUT_SYNC, 1)
                del codes[: FRAME if sync < 0 else sync]
                continue
            del codes[:FRAME]
            if self.runs and self.runs[-1][1] + 1 == number:
                self.runs[-1][1] = number
            else:
                self.runs.append([number, number])

    def _begin(self, key: str) -> dict[str, Any] | None:
        if key not in (REPORT_KEY, BURST_KEY) and key not in "123456789":
            return None
        self.responses += 1
        playing = {
            "id": f"resp_{self.responses}",
            "key": key,
            "response": self.responses,
            "report": self.report() if key == REPORT_KEY else None,
            "next": 0,
        }
        self._frames = frames_of(playing)
        return playing

    def report(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "bad": self.bad,
            "keys": self.keys,
            "restored": self.restored,
            "partial": len(self._codes),
        }

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": _STATE,
            "runs": self.runs,
            "bad": self.bad,
            "keys": self.keys,
            "restored": self.restored,
            "responses": self.responses,
            "waiting": list(self.waiting),
            "playing": self.playing,
            "codes": bytes(self._codes).hex(),
        }

    def restore(self, state: bytes | dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("state") != _STATE:
            raise ValueError("not a snapshot of the ledger engine")
        self.runs = [list(run) for run in state["runs"]]
        self.bad = int(state["bad"])
        self.keys = list(state["keys"])
        self.restored = int(state["restored"]) + 1
        self.responses = int(state["responses"])
        self.waiting = deque(state["waiting"])
        self.playing = state["playing"]
        self._frames = [] if self.playing is None else frames_of(self.playing)
        self._codes = bytearray.fromhex(state["codes"])


def frames_of(playing: Mapping[str, Any]) -> list[bytes]:
    """A response's frames: the report's, or ``key`` seconds of a spoken one's."""
    response = int(playing["response"])
    key = playing["key"]
    if key == REPORT_KEY:
        return report_frames(response, playing["report"])
    seconds = BURST_S if key == BURST_KEY else int(key)
    return [frame_codes(response, i) for i in range(round(seconds / FRAME_S))]


def factory(config: Mapping[str, Any]) -> Engine:
    return LedgerEngine(config)
