"""``MarkBook``: a Twilio stream's played frontier and its pacing (sans-IO).

Twilio plays what it is sent and echoes a ``mark`` once the audio sent before it has
played (docs/plans/telephony.md §1.2). So the call's channel sends, after its outbound
audio, a ``mark`` named by the ``server_event_seq`` of the last audio frame it carries,
and each echo becomes ``session.event_ack`` of that seq: the core's acked frontier *is*
what the caller heard (§0.3), the journal forgets only that, and a resume replays the rest
(§4.3). The same marks pace the stream (§0.4): audio sent and not yet confirmed played
(the *lead*) stays at most ``max_buffered_s``, the rest waits here, at most
``max_queued_s`` of it, and past that ``may_write`` is False (the session's
backpressure). Twilio itself would buffer ten minutes; we never let it.

This is the state machine alone: no I/O, no clock, no awaits. The channel tells it what
the session wrote (``queued``: a kind-2 frame's audio, ``text``: any text frame), what
Twilio echoed (``echoed``), when to cut the audio off (``clear`` for a barge-in,
``fence`` for a migration) and that the stream ends (``finish``); each returns the
Twilio messages to send now, in order (compact JSON texts), and ``take_acks`` hands over
the frontier when it moved.

The rules (§3.4), and what this module decided where §3.4 leaves room:

* Sending: while the lead is below ``max_buffered_s``, queued frames go out coalesced
  into one ``media`` of at most ``max_media_s`` (a trickle that finds the queue empty
  goes out frame by frame: no added delay). **A frame is never split**: acks are per
  seq, so a piece of a frame could never be marked; a frame longer than ``max_media_s``
  goes alone, and the lead bound is then ``max_buffered_s`` plus that frame.
* A ``mark`` named by the last frame's seq follows the audio sent since the last mark
  when it is due: when at least ``mark_interval_s`` of that audio went, at a response's
  end (the audio before a ``response.done`` or ``response.output_audio.done``, queued or
  already sent; coalescing stops there so the mark falls on the end), **when the lead is
  full** (else, with ``mark_interval_s`` longer than the room left, nothing would be
  echoed and the stream would stall), and while ``closing`` once the queue is empty (the
  stream's last audio: its echo proves it played, and ``drained`` waits for it).
  **An empty queue alone is no reason**: a real-time engine's audio comes frame by frame
  (20 ms each), each finding the queue empty, and a mark after each would be 50 marks a
  second out and 50 echoes in, whatever ``mark_interval_s`` says; so such a trickle goes
  out a ``media`` per frame and a mark per ``mark_interval_s`` of it, and one at its
  response's end. Mid-response, the last frames sent may then wait unmarked (the
  frontier stays before them) until more audio fills the interval, the response ends or
  the stream closes; none waits for good: every response ends with a ``response.done``
  or a ``response.cancelled`` (whose clear drops it), and the fence drops it too.
  **At most ``max_buffered_s / mark_interval_s + 1`` marks are outstanding**: a run of
  short responses would otherwise put a mark after each. A mark due while that many are
  out waits, its audio unmarked, and goes out on the next echo that leaves it due.
* ``echoed(name)``: the head of the FIFO of marks sent is popped, its audio leaves the
  lead, and the frontier moves. **An echo of a later mark in the FIFO pops every mark
  up to it** (counted ``marks_skipped``): Twilio plays in order, so that echo proves the
  earlier audio played too, and a lost echo cannot wedge the stream (§3.4 counts such a
  name stale; this is as safe and cannot stall). A name in the *cleared* set is removed
  from it and counted ``marks_cleared``, no ack; any other name is ``marks_stale``.
* **The frontier** is the newest seq seen before the oldest audio frame not yet proven
  played: an echoed mark named N proves every frame up to N, and texts (which Twilio
  never carries) take their place in seq order. So a text written while nothing is
  queued or unconfirmed is acked at once, and a text written after audio is acked once a
  mark after that audio comes back (with the texts up to the next unproven frame), never
  before: the frontier never passes a frame that was sent and not proven played.
* ``clear()`` (the barge-in's, on ``response.cancelled`` with anything queued or
  unconfirmed): sends ``clear``, drops the queue, moves the outstanding marks to the
  cleared set and sets the lead to 0. **The audio it dropped counts as done**: the
  frontier may pass it at once (the ``response.cancelled`` itself is acked then),
  because that response was cancelled: a resume must not replay its audio, and the
  core sends none of it after the cancel either (docs/protocol.md "Decision (delay)").
  So the frontier passes no audio that was not proven played except audio a cancel cut
  off (done with, whether heard or not); the marks after the clear are never stuck
  behind the cleared ones.
* ``fence()`` (the migration's, §4.1): sends ``clear`` and freezes everything: no audio
  is sent, no ack is given after it (the frontier is final; what was not proven played is
  replayed by the next stream), the queue is dropped and later frames are dropped.
* ``session.closed``/``session.expired`` set ``closing`` (as ``finish()`` does, for a
  close without one): what is unmarked is marked once the queue is empty, and the
  channel closes once ``drained`` (nothing queued, nothing sent and unconfirmed, marked
  or not). A clear or the fence leaves nothing to wait for: what they cut off is
  dropped here, marked or not, as Twilio drops it (a mark after it would prove nothing).

Every bound holds by construction: the queue by ``may_write`` (the writer's credit:
``max_queued_s`` plus the one frame that crossed it), the FIFO as above, the cleared set
at four FIFOs' worth (the oldest names forgotten first: a later echo of one is stale),
the pending response ends by the queue (one per queued frame at most). Seqs must come in
increasing order across ``queued`` and ``text`` (the session writes in seq order);
``OutOfOrder`` otherwise.
"""

from __future__ import annotations

import base64
import json
import re
from collections import deque
from typing import Any, Final

import attrs

from ...dialects.binary import HEADER_SIZE, OUTPUT_AUDIO
from ...dialects.jsonwire import encode


class BadOutputFrame(ValueError):
    """A binary frame that is not a well-formed kind-2 (output audio) message."""

    def __init__(self) -> None:
        super().__init__("not a kind-2 output audio frame")


class OutOfOrder(ValueError):
    """A frame's ``server_event_seq`` not above every seq seen before on this stream."""

    def __init__(self) -> None:
        super().__init__("server_event_seq out of order")


_OUTPUT_PREFIX: Final = bytes((OUTPUT_AUDIO, 0, 0, 0))


def parse_output_frame(frame: bytes) -> tuple[int, bytes]:
    """A kind-2 binary message's ``server_event_seq`` and payload (dialects/binary.py's
    layout: kind 2, flags and reserved 0, the seq big-endian, then the audio)."""
    if len(frame) < HEADER_SIZE or frame[:4] != _OUTPUT_PREFIX:
        raise BadOutputFrame()
    return int.from_bytes(frame[4:HEADER_SIZE], "big"), frame[HEADER_SIZE:]


# -- the text frames' sniffing ------------------------------------------------------------

CANCELLED: Final = "response.cancelled"
RESPONSE_ENDS: Final = frozenset({"response.done", "response.output_audio.done"})
"""Engine events that end a response's audio (with ``response.cancelled``: the runner's
``_AUDIO_ENDS``); a mark follows the audio before them."""
TERMINALS: Final = frozenset({"session.closed", "session.expired"})

_TYPE_PREFIX: Final = '{"type":"'
_TYPE_AT: Final = len(_TYPE_PREFIX)
_TYPE_MAX: Final = 128
_SEQ_KEY: Final = '"server_event_seq":'
_TAIL_SEQ: Final = re.compile(r'[{,]"server_event_seq":(0|[1-9][0-9]{0,18})\}\Z')
_TAIL: Final = 1 + len(_SEQ_KEY) + 19 + 1
"""The longest tail ``_TAIL_SEQ`` matches: the scan from the end reads no more."""


def sniff(frame: str) -> tuple[str | None, int | None]:
    """A text frame's ``type`` and top-level ``server_event_seq`` (None for either when
    it has none).

    The dialect writes compact JSON, ``type`` first (every constructor and engine does)
    and ``server_event_seq`` last (``Session.emit`` adds it): so the type is read by
    prefix and the seq by a bounded scan of the frame's end. In compact JSON a text
    ending in ``,"server_event_seq":N}`` has that key at the top level (the ``"`` before
    it opens a string, and the last ``}`` closes the outer object). A frame of another
    shape is parsed whole (correct, slower; none is expected)."""
    kind: str | None = None
    if frame.startswith(_TYPE_PREFIX):
        end = frame.find('"', _TYPE_AT, _TYPE_AT + _TYPE_MAX)
        if end > 0 and "\\" not in frame[_TYPE_AT:end]:
            kind = frame[_TYPE_AT:end]
    match = _TAIL_SEQ.search(frame, max(0, len(frame) - _TAIL))
    seq = int(match.group(1)) if match is not None else None
    if kind is not None and (seq is not None or _SEQ_KEY not in frame):
        return kind, seq
    try:
        event = json.loads(frame)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(event, dict):
        return None, None
    found = event.get("type")
    value = event.get("server_event_seq")
    good = type(value) is int and value >= 0
    return (found if isinstance(found, str) else None), (value if good else None)


# -- the book ---------------------------------------------------------------------------


@attrs.define(eq=False, slots=True)
class _Mark:
    name: str
    """``str(seq)`` of the last frame before it."""
    first: int
    """The seq of the first frame it proves (sent since the mark before it)."""
    nbytes: int
    """The audio sent since the mark before it: what leaves the lead on its echo."""


def _positive(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive")


@attrs.define(eq=False)
class MarkBook:
    """One Twilio stream's outbound audio: pacing, marks and the played frontier."""

    stream_sid: str
    max_buffered_s: float = attrs.field(default=0.5, kw_only=True, validator=_positive)
    mark_interval_s: float = attrs.field(default=0.1, kw_only=True, validator=_positive)
    max_queued_s: float = attrs.field(default=20.0, kw_only=True, validator=_positive)
    max_media_s: float = attrs.field(default=0.1, kw_only=True, validator=_positive)
    bytes_per_s: int = attrs.field(default=8000, kw_only=True, validator=_positive)
    """μ-law at 8 kHz: one byte a sample."""

    marks_sent: int = attrs.field(default=0, init=False)
    marks_echoed: int = attrs.field(default=0, init=False)
    """Echoes that proved play (the FIFO's head, or a later mark: see ``marks_skipped``)."""
    marks_skipped: int = attrs.field(default=0, init=False)
    """Marks popped, unechoed, by the echo of a later one."""
    marks_stale: int = attrs.field(default=0, init=False)
    marks_cleared: int = attrs.field(default=0, init=False)
    clears_cancel: int = attrs.field(default=0, init=False)
    clears_fence: int = attrs.field(default=0, init=False)
    media_sent: int = attrs.field(default=0, init=False)
    audio_bytes_out: int = attrs.field(default=0, init=False)
    audio_bytes_dropped: int = attrs.field(default=0, init=False)
    """Queued audio never sent: dropped by a clear or the fence, or written after it."""
    closing: bool = attrs.field(default=False, init=False)
    """A ``session.closed``/``session.expired`` was written (or ``finish()`` called):
    the last audio is marked, and the channel closes once ``drained``."""
    fenced: bool = attrs.field(default=False, init=False)

    _lead_max: int = attrs.field(init=False, repr=False)
    _interval: int = attrs.field(init=False, repr=False)
    _queue_max: int = attrs.field(init=False, repr=False)
    _media_max: int = attrs.field(init=False, repr=False)
    _fifo_max: int = attrs.field(init=False, repr=False)
    _cleared_max: int = attrs.field(init=False, repr=False)
    _media_head: str = attrs.field(init=False, repr=False)
    _mark_head: str = attrs.field(init=False, repr=False)
    _clear_text: str = attrs.field(init=False, repr=False)

    _queue: deque[tuple[int, bytes]] = attrs.field(init=False, factory=deque, repr=False)
    _queued_bytes: int = attrs.field(default=0, init=False, repr=False)
    _ends: deque[int] = attrs.field(init=False, factory=deque, repr=False)
    """Seqs of queued frames that end a response, oldest first."""
    _fifo: deque[_Mark] = attrs.field(init=False, factory=deque, repr=False)
    _cleared: dict[str, None] = attrs.field(init=False, factory=dict, repr=False)
    """Names of marks outstanding at a clear, oldest first (a dict: an ordered set)."""
    _lead: int = attrs.field(default=0, init=False, repr=False)
    _unmarked: int = attrs.field(default=0, init=False, repr=False)
    """Bytes sent since the last mark (part of the lead)."""
    _stretch_first: int | None = attrs.field(default=None, init=False, repr=False)
    """The first frame sent since the last mark (None: none)."""
    _last_sent: int = attrs.field(default=0, init=False, repr=False)
    """The seq of the last frame sent: the next mark's name."""
    _end_sent: bool = attrs.field(default=False, init=False, repr=False)
    """A response's last frame went out since the last mark: a mark is due."""
    _seen: int = attrs.field(default=0, init=False, repr=False)
    """The newest seq written (audio or text)."""
    _frontier: int = attrs.field(default=0, init=False, repr=False)
    _taken: int = attrs.field(default=0, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        rate = self.bytes_per_s
        self._lead_max = max(1, round(self.max_buffered_s * rate))
        self._interval = max(1, round(self.mark_interval_s * rate))
        self._queue_max = max(1, round(self.max_queued_s * rate))
        self._media_max = max(1, round(self.max_media_s * rate))
        self._fifo_max = self._lead_max // self._interval + 1
        self._cleared_max = 4 * self._fifo_max
        sid = encode(self.stream_sid)
        self._media_head = '{"event":"media","streamSid":' + sid + ',"media":{"payload":"'
        self._mark_head = '{"event":"mark","streamSid":' + sid + ',"mark":{"name":"'
        self._clear_text = '{"event":"clear","streamSid":' + sid + "}"

    # -- what the channel reads -----------------------------------------------------------

    @property
    def may_write(self) -> bool:
        """The queue is below ``max_queued_s``: the session may write another frame."""
        return self._queued_bytes < self._queue_max

    @property
    def drained(self) -> bool:
        """Nothing queued and nothing sent unconfirmed (cleared audio is not waited for)."""
        return not self._queue and not self._fifo and self._stretch_first is None

    @property
    def frontier(self) -> int:
        """The newest seq proven played (or done with: text, cleared audio)."""
        return self._frontier

    @property
    def lead_bytes(self) -> int:
        """Audio sent since the last clear and not yet proven played."""
        return self._lead

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def outstanding(self) -> int:
        """Marks sent and not yet echoed (nor cleared)."""
        return len(self._fifo)

    @property
    def cleared_pending(self) -> int:
        """Names of cleared marks kept for their echo (bounded)."""
        return len(self._cleared)

    def take_acks(self) -> int | None:
        """The frontier, if it moved since the last call (the channel's
        ``session.event_ack``); None if not."""
        if self._frontier <= self._taken:
            return None
        self._taken = self._frontier
        return self._frontier

    # -- inputs -------------------------------------------------------------------------

    def queued(self, seq: int, payload: bytes) -> list[str]:
        """The session wrote output audio ``payload`` (μ-law) as event ``seq``."""
        self._saw(seq)
        if self.fenced:
            self.audio_bytes_dropped += len(payload)
            return []
        if payload:
            self._queue.append((seq, payload))
            self._queued_bytes += len(payload)
        out = self._pump()
        self._advance()
        return out

    def text(self, frame: str) -> list[str]:
        """The session wrote a text frame (Twilio carries none: it only moves the
        frontier, ends a response, cancels or closes)."""
        kind, seq = sniff(frame)
        if seq is not None:
            self._saw(seq)
        out: list[str] = []
        if kind == CANCELLED:
            if self._queue or self._fifo or self._stretch_first is not None:
                out = self.clear()
        elif kind in RESPONSE_ENDS:
            queue = self._queue
            if queue:
                if not self._ends or self._ends[-1] != queue[-1][0]:
                    self._ends.append(queue[-1][0])
            elif self._stretch_first is not None:
                self._end_sent = True  # the response's last frame went out unmarked
        elif kind in TERMINALS:
            self.closing = True
        if not self.fenced:
            out += self._pump()
        self._advance()
        return out

    def echoed(self, name: str) -> list[str]:
        """Twilio echoed the mark ``name``."""
        fifo = self._fifo
        index = next((i for i, mark in enumerate(fifo) if mark.name == name), -1)
        if index < 0:
            if name in self._cleared:
                del self._cleared[name]
                self.marks_cleared += 1
            else:
                self.marks_stale += 1
            return []
        for _ in range(index + 1):
            self._lead -= fifo.popleft().nbytes
        self.marks_echoed += 1
        self.marks_skipped += index
        out = self._pump()
        self._advance()
        return out

    def clear(self) -> list[str]:
        """Cut off what the caller would hear (a barge-in: ``response.cancelled``):
        ``clear``, and the dropped audio counts as done. Nothing after the fence."""
        if self.fenced:
            return []
        self.clears_cancel += 1
        self._drop()
        self._advance()
        return [self._clear_text]

    def fence(self) -> list[str]:
        """The migration's fence: ``clear``, and nothing more is sent or acked."""
        if self.fenced:
            return []
        self.fenced = True
        self.clears_fence += 1
        self._drop()
        return [self._clear_text]

    def finish(self) -> list[str]:
        """The stream is ending (``session.closed``/``session.expired`` does this; a
        close without one may): from now on the audio sent is marked once the queue is
        empty, so that its echo can prove it played and ``drained`` can come."""
        self.closing = True
        if self.fenced:
            return []
        out = self._pump()
        self._advance()
        return out

    def unfence(self) -> list[str]:
        """The migration was given up and the session goes on here (to end soon, as it
        would have without one): audio is sent again; what the fence dropped counts as
        done, as a clear's does."""
        if not self.fenced:
            return []
        self.fenced = False
        out = self._pump()
        self._advance()
        return out

    # -- the rules ----------------------------------------------------------------------

    def _saw(self, seq: int) -> None:
        if seq <= self._seen:
            raise OutOfOrder()
        self._seen = seq

    def _drop(self) -> None:
        """Twilio drops what it buffered, we what we queued."""
        self.audio_bytes_dropped += self._queued_bytes
        self._queue.clear()
        self._queued_bytes = 0
        self._ends.clear()
        cleared = self._cleared
        for mark in self._fifo:
            cleared[mark.name] = None
        self._fifo.clear()
        while len(cleared) > self._cleared_max:
            del cleared[next(iter(cleared))]
        self._lead = 0
        self._unmarked = 0
        self._stretch_first = None
        self._end_sent = False

    def _pump(self) -> list[str]:
        out: list[str] = []
        self._mark_if_due(out)
        while self._queue and self._lead < self._lead_max:
            self._media(out)
            self._mark_if_due(out)
        return out

    def _media(self, out: list[str]) -> None:
        """One ``media`` of the queue's head frames: at most ``max_media_s`` (or one
        longer frame alone), ending at a response's end."""
        queue = self._queue
        ends = self._ends
        budget = self._media_max
        seq, payload = queue.popleft()
        if self._stretch_first is None:
            self._stretch_first = seq
        parts = [payload]
        size = len(payload)
        while True:
            if ends and ends[0] == seq:
                ends.popleft()
                self._end_sent = True
                break
            if not queue or size + len(queue[0][1]) > budget:
                break
            seq, payload = queue.popleft()
            parts.append(payload)
            size += len(payload)
        self._last_sent = seq
        self._queued_bytes -= size
        self._lead += size
        self._unmarked += size
        self.media_sent += 1
        self.audio_bytes_out += size
        chunk = parts[0] if len(parts) == 1 else b"".join(parts)
        out.append(self._media_head + base64.b64encode(chunk).decode("ascii") + '"}}')

    def _mark_if_due(self, out: list[str]) -> None:
        """A mark after the audio sent since the last one, if one is due and the FIFO
        has room."""
        first = self._stretch_first
        if first is None or len(self._fifo) >= self._fifo_max:
            return
        due = (
            self._end_sent
            or self._unmarked >= self._interval
            or self._lead >= self._lead_max  # no more audio goes out until an echo
            or (self.closing and not self._queue)  # the stream's last audio
        )
        if not due:
            return
        name = str(self._last_sent)
        self._fifo.append(_Mark(name, first, self._unmarked))
        self._unmarked = 0
        self._stretch_first = None
        self._end_sent = False
        self.marks_sent += 1
        out.append(self._mark_head + name + '"}}')

    def _advance(self) -> None:
        """The frontier: the newest seq seen before the oldest frame not proven played."""
        if self.fenced:
            return
        if self._fifo:
            oldest: int | None = self._fifo[0].first
        elif self._stretch_first is not None:
            oldest = self._stretch_first
        elif self._queue:
            oldest = self._queue[0][0]
        else:
            oldest = None
        target = self._seen if oldest is None else oldest - 1
        if target > self._frontier:
            self._frontier = target


__all__ = [
    "CANCELLED",
    "RESPONSE_ENDS",
    "TERMINALS",
    "BadOutputFrame",
    "MarkBook",
    "OutOfOrder",
    "parse_output_frame",
    "sniff",
]
