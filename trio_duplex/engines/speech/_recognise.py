"""The recogniser: PocketSphinx's endpointer and decoder for one session, synchronous.

Everything here blocks (0.1-0.2 s of CPU per second of audio, 0.5 s to load the model):
the engine calls it only from worker threads (``trio.to_thread.run_sync``), one call at a
time per session. pocketsphinx is imported here, lazily, so that the package loads
without the ``speech`` extra.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import attrs

SAMPLE_RATE: Final = 16_000
"""PocketSphinx's English model hears 16 kHz mono PCM16: the engine's ``audio_rate``."""
BYTES_PER_SECOND: Final = SAMPLE_RATE * 2
PARTIAL_EVERY_BYTES: Final = BYTES_PER_SECOND // 5  # a partial transcript per 200 ms


class Heard(enum.Enum):
    STARTED = "started"  # the endpointer found speech: a turn begins (barge-in)
    PARTIAL = "partial"  # the decoder's best guess so far for the turn
    DONE = "done"  # the endpointer found the speech's end (or the turn hit its cap)


@attrs.frozen
class Hearing:
    """One thing the recogniser heard, at ``offset``: bytes of audio fed to it so far
    (this call's included) when it heard it."""

    kind: Heard
    offset: int
    text: str = ""
    start_s: float = 0.0  # STARTED: where the speech began, in seconds of audio fed


class Recogniser:
    """An ``Endpointer`` (voice activity, 30 ms frames) in front of a ``Decoder``.

    ``feed`` takes any amount of audio and keeps the part of a frame left over. A turn
    starts where the endpointer finds speech and ends where it finds its end; one longer
    than ``max_turn_bytes`` is ended there (the endpointer's speech goes on into a new
    turn).
    """

    def __init__(self, max_turn_bytes: int) -> None:
        from pocketsphinx import Decoder, Endpointer  # the `speech` extra

        self._endpointer: Any = Endpointer()
        self._decoder: Any = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL")
        self._frame: int = self._endpointer.frame_bytes
        self._rest = b""
        self._fed = 0  # bytes fed so far, the leftover part of a frame included
        self._in_turn = False
        self._turn_bytes = 0
        self._guessed = 0  # the offset of the last partial transcript
        self.max_turn_bytes = max_turn_bytes

    @property
    def in_turn(self) -> bool:
        return self._in_turn

    @property
    def fed(self) -> int:
        """Bytes of audio fed so far."""
        return self._fed

    def feed(self, pcm: bytes) -> list[Hearing]:
        """Recognise ``pcm`` (16 kHz mono PCM16): what was heard, in order, with the turn's
        partial transcript last if a turn is still going on."""
        heard: list[Hearing] = []
        data = self._rest + pcm
        base = self._fed - len(self._rest)  # the stream offset of data[0]
        frame = self._frame
        end = len(data) - len(data) % frame
        for start in range(0, end, frame):
            self._frame_in(data[start : start + frame], base + start + frame, heard)
        self._rest = data[end:]
        self._fed += len(pcm)
        if self._in_turn and self._fed - self._guessed >= PARTIAL_EVERY_BYTES:
            self._guessed = self._fed  # (a guess costs a search: not on every 20 ms)
            heard.append(Hearing(Heard.PARTIAL, self._fed, self._hypothesis()))
        return heard

    def _frame_in(self, frame: bytes, offset: int, heard: list[Hearing]) -> None:
        endpointer = self._endpointer
        speech = endpointer.process(frame)
        if speech is None:
            return
        if not self._in_turn:
            self._decoder.start_utt()
            self._in_turn = True
            self._turn_bytes = 0
            # (The endpointer says so a window after the speech began: offset is later.)
            heard.append(Hearing(Heard.STARTED, offset, start_s=endpointer.speech_start))
        self._decoder.process_raw(speech, False, False)
        self._turn_bytes += len(speech)
        if not endpointer.in_speech or self._turn_bytes >= self.max_turn_bytes:
            self._decoder.end_utt()
            self._in_turn = False
            heard.append(Hearing(Heard.DONE, offset, self._hypothesis()))

    def _hypothesis(self) -> str:
        hyp = self._decoder.hyp()
        return "" if hyp is None else " ".join(str(hyp.hypstr).split())
