"""Turn detection: where a session's speech starts and stops, from its VAD probabilities.

Sans-IO and synchronous: :class:`TurnDetector` takes audio as it arrives (any chunking,
16 kHz mono PCM16) and returns what the audio showed, in order. Its rules, per 32 ms VAD
window (``p`` the window's speech probability):

* a window is *speech* when ``p >= threshold`` and *quiet* when ``p < threshold - 0.15``
  (at least 0.01: Silero's own hysteresis); a window between the two is neither;
* a turn STARTS once ``min_speech_ms`` of speech windows came within twice that span
  (a short word's stop closure may fall between them); its ``at_ms`` is the first of them;
* it STOPS once ``silence_duration_ms`` passed since its first quiet window with no speech
  window since (hysteresis windows count as silence, as in Silero's iterator); ``at_ms`` is
  that first quiet window. A turn reaching ``max_turn_s`` stops there (``at_ms`` the cut),
  and speech going on past the cut starts a new turn;
* a STOPPED carries the turn's audio: from ``prefix_padding_ms`` before its onset (its first
  speech window, or the start of the run of unsure windows leading into it, at most
  :data:`LEAD_IN_MS` before; never before the previous turn's end) to its end plus
  :data:`TAIL_MS` of the silence.

What it keeps is bounded in bytes: outside a turn, the pre-roll (``prefix_padding_ms``,
:data:`LEAD_IN_MS` and the speech windows that may yet start a turn, ~1 s); in a turn, the
turn so far, at most ``prefix_padding_ms`` + :data:`LEAD_IN_MS` + ``max_turn_s``.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._vad import RATE, WINDOW_BYTES, WINDOW_MS, VadStream

BYTES_PER_MS: Final = RATE * 2 // 1000
MAX_AUDIO_S: Final = 30.0
"""The longest turn audio a STOPPED may carry (the recogniser's limit): prefix padding,
:data:`LEAD_IN_MS` and ``max_turn_s`` together may not exceed it."""
TAIL_MS: Final = 192
"""Audio kept after a turn's end (its first quiet window), 6 windows: Silero's probability
falls under the quiet mark before a soft ending is over (a final "th", the release of a
final "p"): up to ~130 ms early on the outside set's sentences in silence, ~170 ms under
white noise, and Whisper hears a clipped last word worse than a little silence."""
LEAD_IN_MS: Final = 512
"""How far before a turn's first speech window its audio may reach back to where the VAD
grew unsure (no quiet window since): Silero can hover near the threshold for ~0.5 s at the
start of a voice it hears poorly (an opening "s", flite after noise), and the prefix
padding alone would then clip the first word."""
QUIET_BELOW: Final = 0.15
"""How far under ``threshold`` a window's probability must fall to count as quiet."""


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low} to {high}, not {value!r}")
    return float(value)


def _whole(name: str, value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


@attrs.frozen
class TurnSettings:
    """How turns are found: OpenAI's ``server_vad`` fields and two of our own. Bad values
    raise ValueError saying which field and why."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 300
    min_speech_ms: int = 96
    max_turn_s: float = 20.0

    def __attrs_post_init__(self) -> None:
        _number("turn_detection.threshold", self.threshold, 0.0, 1.0)
        _whole("turn_detection.prefix_padding_ms", self.prefix_padding_ms, 0, 5_000)
        _whole("turn_detection.silence_duration_ms", self.silence_duration_ms, 0, 10_000)
        _whole("min_speech_ms", self.min_speech_ms, 0, 1_000)
        _number("max_turn_s", self.max_turn_s, 1.0, MAX_AUDIO_S)
        if (self.prefix_padding_ms + LEAD_IN_MS) / 1000 + self.max_turn_s > MAX_AUDIO_S:
            raise ValueError(
                f"turn_detection.prefix_padding_ms ({self.prefix_padding_ms}) plus max_turn_s "
                f"({self.max_turn_s}) must be at most {MAX_AUDIO_S - LEAD_IN_MS / 1000:g} s "
                "of audio"
            )

    @classmethod
    def from_config(cls, turn_detection: Mapping[str, Any] | None) -> TurnSettings:
        """The settings a session's ``turn_detection`` names (``threshold``,
        ``prefix_padding_ms``, ``silence_duration_ms``; absent or null: the default); its
        other fields (``type``, ``create_response``, ...) are not ours to read."""
        if turn_detection is None:
            return cls()
        if not isinstance(turn_detection, Mapping):
            raise ValueError(f"turn_detection must be an object, not {turn_detection!r}")
        named = {
            key: turn_detection[key]
            for key in ("threshold", "prefix_padding_ms", "silence_duration_ms")
            if turn_detection.get(key) is not None
        }
        return cls(**named)

    @property
    def quiet_below(self) -> float:
        return max(self.threshold - QUIET_BELOW, 0.01)


class Kind(enum.Enum):
    STARTED = "started"
    STOPPED = "stopped"


@attrs.frozen
class Detected:
    """A turn's start or stop; ``at_ms`` is stream time (``audio_start_ms`` /
    ``audio_end_ms``)."""

    kind: Kind
    at_ms: float
    audio: bytes = attrs.field(default=b"", repr=lambda audio: f"<{len(audio)} bytes>")
    """STOPPED: the turn's PCM, its prefix padding (and lead-in) and :data:`TAIL_MS` after
    its end included."""


class TurnDetector:
    """One session's turns, from its audio (see the module's rules).

    ``vad`` must be fresh (no audio fed yet): its windows are this detector's timeline.
    ``start_ms`` is the stream time of the first byte fed (a restored session's detector,
    fed the old one's :meth:`held`, starts where that audio began).
    """

    def __init__(self, settings: TurnSettings, vad: VadStream, *, start_ms: float = 0.0) -> None:
        if vad.windows:
            raise ValueError("a TurnDetector needs a VadStream no audio was fed to")
        self.settings = settings
        self._vad = vad
        self._start_ms = start_ms
        self._prefix = settings.prefix_padding_ms * BYTES_PER_MS
        self._tail = TAIL_MS * BYTES_PER_MS
        self._min_windows = max(1, math.ceil(settings.min_speech_ms / WINDOW_MS))
        self._quiet_windows = max(1, math.ceil(settings.silence_duration_ms / WINDOW_MS))
        self._max_windows = math.floor(settings.max_turn_s * 1000 / WINDOW_MS)
        self._lead_in = math.ceil(LEAD_IN_MS / WINDOW_MS)
        self._kept = bytearray()  # stream bytes [_base, _fed)
        self._base = 0
        self._fed = 0
        self._window = 0  # the next window's index
        self._speech: deque[int] = deque(maxlen=self._min_windows)  # outside a turn
        self._onset = 0  # outside a turn: the window after the last quiet one
        self._floor = 0  # a turn's audio starts no earlier (the previous turn's end)
        self.in_turn = False
        self._start_window = 0
        self._turn_from = 0  # byte where the open turn's audio starts
        self._quiet_from: int | None = None  # the open turn's first quiet window

    @property
    def fed_ms(self) -> float:
        """Stream time at the end of the audio fed so far."""
        return self._start_ms + self._fed / BYTES_PER_MS

    def feed(self, pcm16: bytes) -> list[Detected]:
        """What ``pcm16`` (16 kHz mono PCM16, any length) completes, in order."""
        self._kept += pcm16
        self._fed += len(pcm16)
        found: list[Detected] = []
        for p in self._vad.feed(pcm16):
            detected = self._step(self._window, p)
            self._window += 1
            if detected is not None:
                found.append(detected)
        self._trim()
        return found

    def turn_audio(self) -> bytes:
        """The open turn's audio so far, prefix padding included (b"" outside a turn)."""
        return bytes(self._kept[self._turn_from - self._base :]) if self.in_turn else b""

    def turn_seconds(self) -> float:
        """The length of :meth:`turn_audio` (0.0 outside a turn)."""
        return (self._fed - self._turn_from) / (RATE * 2) if self.in_turn else 0.0

    def held(self) -> bytes:
        """The audio a new detector must be fed to hear what this one would: the open
        turn with its prefix padding, or outside a turn the pre-roll (prefix padding and
        any speech that may start a turn)."""
        return bytes(self._kept)

    def _ms(self, at: int) -> float:
        return self._start_ms + at / BYTES_PER_MS

    def _step(self, window: int, p: float) -> Detected | None:
        speech = p >= self.settings.threshold
        quiet = not speech and p < self.settings.quiet_below
        if not self.in_turn:
            recent = self._speech
            while recent and window - recent[0] >= 2 * self._min_windows:
                recent.popleft()  # too far back to start a turn with this one
            if quiet:
                self._onset = window + 1
            elif speech:
                recent.append(window)
                if len(recent) == self._min_windows:
                    return self._start(recent[0])
            return None
        if speech:
            self._quiet_from = None
        elif quiet and self._quiet_from is None:
            self._quiet_from = window
        end = (window + 1) * WINDOW_BYTES
        if self._quiet_from is not None and window + 1 - self._quiet_from >= self._quiet_windows:
            stop = self._quiet_from * WINDOW_BYTES
            return self._stop(window, stop, min(end, stop + self._tail))
        if window + 1 - self._start_window >= self._max_windows:
            return self._stop(window, end, end)
        return None

    def _lead(self) -> int:
        """Outside a turn, the window the next turn's audio would start from (before its
        prefix padding)."""
        first = self._speech[0] if self._speech else self._window
        return min(first, max(self._onset, first - self._lead_in))

    def _start(self, first: int) -> Detected:
        lead = self._lead()
        self._speech.clear()
        self.in_turn = True
        self._start_window = first
        self._quiet_from = None
        at = first * WINDOW_BYTES
        self._turn_from = max(self._floor, self._base, lead * WINDOW_BYTES - self._prefix)
        return Detected(Kind.STARTED, self._ms(at))

    def _stop(self, window: int, at: int, audio_end: int) -> Detected:
        audio = bytes(self._kept[self._turn_from - self._base : audio_end - self._base])
        self.in_turn = False
        self._quiet_from = None
        self._floor = audio_end
        self._onset = window + 1
        return Detected(Kind.STOPPED, self._ms(at), audio)

    def _trim(self) -> None:
        if self.in_turn:
            keep = self._turn_from
        else:
            keep = max(self._floor, self._lead() * WINDOW_BYTES - self._prefix)
        if keep > self._base:
            del self._kept[: keep - self._base]
            self._base = keep
