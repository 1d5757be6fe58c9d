"""``MarkBook`` alone: tables of what the channel tells it and what it sends Twilio.

Each step is one input (a frame queued, a text written, an echo, a clear, the fence,
``finish``); its expected outputs are written short: ``media 3,4`` (one ``media``
carrying frames 3 and 4 whole: each frame's payload is its seq's byte, so the driver
reads them back), ``mark 4``, ``clear``, and ``ack 4`` when the frontier moved to 4
(``take_acks``). A real-time trickle is played against a fake Twilio to count its marks.
Then a hypothesis state machine drives any interleaving and checks the frontier against
a model of what Twilio has provably played, that every mark has a reason and none due is
missed, and that once a response or the stream ends all of it is marked and drains. No
I/O, no clock.
"""

from __future__ import annotations

import base64
import json
import math
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_duplex.dialects import binary
from trio_duplex.server.twilio.marks import (
    BadOutputFrame,
    MarkBook,
    OutOfOrder,
    parse_output_frame,
    sniff,
)

SID = "MZ" + "0123456789abcdef" * 2
FRAME = 160
"""20 ms of μ-law at 8 kHz."""

Step = tuple[object, ...]


def text(kind: str, seq: int | None = None, **fields: object) -> str:
    """A frame as the native dialect writes it: compact, ``type`` first and
    ``server_event_seq`` (when journaled) last."""
    event: dict[str, object] = {"type": kind, **fields}
    if seq is not None:
        event["server_event_seq"] = seq
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def payload(seq: int, size: int = FRAME) -> bytes:
    return bytes([seq % 256]) * size


def short(out: str, sizes: dict[int, int]) -> str:
    """One outbound message, short; checks its shape exactly."""
    message = json.loads(out)
    assert json.dumps(message, separators=(",", ":")) == out  # compact
    assert message["streamSid"] == SID
    kind = message["event"]
    if kind == "clear":
        assert message.keys() == {"event", "streamSid"}
        return "clear"
    if kind == "mark":
        assert message.keys() == {"event", "streamSid", "mark"}
        assert message["mark"].keys() == {"name"}
        return f"mark {message['mark']['name']}"
    assert kind == "media", message
    assert message.keys() == {"event", "streamSid", "media"}
    assert message["media"].keys() == {"payload"}
    data = base64.b64decode(message["media"]["payload"], validate=True)
    seqs: list[int] = []
    at = 0
    while at < len(data):
        seq = next(s for s in sizes if s % 256 == data[at] and s not in seqs)
        size = sizes[seq]
        assert data[at : at + size] == payload(seq, size), "frames go out whole, in order"
        seqs.append(seq)
        at += size
    return "media " + ",".join(map(str, seqs))


def drive(book: MarkBook, steps: list[Step]) -> list[list[str]]:
    sizes: dict[int, int] = {}
    said: list[list[str]] = []
    for step in steps:
        name, *args = step
        if name == "audio":
            seq = args[0]
            size = args[1] if len(args) > 1 else FRAME
            assert isinstance(seq, int) and isinstance(size, int)
            sizes[seq] = size
            outputs = book.queued(seq, payload(seq, size))
        elif name == "text":
            frame = args[0]
            assert isinstance(frame, str)
            outputs = book.text(frame)
        elif name == "echo":
            mark = args[0]
            assert isinstance(mark, str)
            outputs = book.echoed(mark)
        elif name == "clear":
            outputs = book.clear()
        elif name == "finish":
            outputs = book.finish()
        else:
            assert name == "fence", name
            outputs = book.fence()
        shown = [short(out, sizes) for out in outputs]
        ack = book.take_acks()
        if ack is not None:
            shown.append(f"ack {ack}")
        said.append(shown)
    return said


def trickle(
    first: int, last: int, *, every: int = 5, since: int = 0
) -> list[tuple[Step, list[str]]]:
    """Frames that each find the queue empty (a real-time engine's): each goes out alone,
    and a mark follows every ``every`` frames of them (the interval: 5 at the defaults,
    ``since`` of them already sent unmarked before ``first``)."""
    steps: list[tuple[Step, list[str]]] = []
    for seq in range(first, last + 1):
        since += 1
        said = [f"media {seq}"]
        if since == every:
            said.append(f"mark {seq}")
            since = 0
        steps.append((("audio", seq), said))
    return steps


def real_time(frames: int, echo_after: int) -> list[tuple[Step, list[str]]]:
    """One response's ``frames`` frames as a real-time engine writes them (each finds the
    queue empty), a mark's echo coming back ``echo_after`` frames after it, then the
    response's end texts and the echoes still due."""
    steps = trickle(1, frames)  # a mark per 5 frames: the defaults' interval
    late: list[str] = []
    for seq in reversed(range(5, frames + 1, 5)):
        if seq + echo_after <= frames:
            steps.insert(seq + echo_after, (("echo", str(seq)), [f"ack {seq}"]))
        else:
            late.insert(0, str(seq))
    end = frames + 1
    if frames % 5:
        late.append(str(frames))
    ends = [f"mark {frames}"] if frames % 5 else [] if late else [f"ack {end}"]
    done = [] if late else [f"ack {end + 1}"]
    steps.append((("text", text("response.output_audio.done", end, response_id="r1")), ends))
    steps.append((("text", text("response.done", end + 1, response_id="r1")), done))
    for index, name in enumerate(late):
        acked = end + 1 if index == len(late) - 1 else int(name)
        steps.append((("echo", name), [f"ack {acked}"]))
    return steps


# Defaults: a lead of 4000 bytes (0.5 s), a mark per 800 bytes (0.1 s: five frames),
# media of at most 800 bytes (five frames), at most 4000 // 800 + 1 = 6 marks out.
TABLES: dict[str, tuple[dict[str, Any], list[tuple[Step, list[str]]]]] = {
    "a trickle goes out frame by frame, a mark per interval and at the response's end": (
        {},
        [
            *trickle(1, 7),  # (a mark after 5: not after each frame, though each empties the queue)
            (("text", text("response.output_text.delta", 8, text="hi")), []),
            (("echo", "5"), ["ack 5"]),  # 6 and 7 unproven: the text waits
            (("text", text("response.done", 9, response_id="r1")), ["mark 7"]),
            (("echo", "7"), ["ack 9"]),  # the texts after it too
        ],
    ),
    "a real-time trickle of 25 frames (0.5 s) sends ceil(25/5) marks, not 25": (
        {},
        real_time(25, 2),  # (test_a_real_time_trickle_... counts them: at most 25/5 + 1)
    ),
    "a real-time trickle ending mid-interval gets its last mark at the response's end": (
        {},
        real_time(23, 3),
    ),
    "a response's end marks audio already sent (and only once)": (
        {},
        [
            *trickle(1, 2),
            (("text", text("response.output_audio.done", 3, response_id="r1")), ["mark 2"]),
            (("text", text("response.done", 4, response_id="r1")), []),  # nothing unmarked
            (("echo", "2"), ["ack 4"]),
            (("text", text("response.done", 5, response_id="r2")), ["ack 5"]),  # no audio
        ],
    ),
    "text with nothing queued or unconfirmed is acked at once": (
        {},
        [
            (("text", text("response.created", 1, response_id="r1")), ["ack 1"]),
            (("text", text("response.output_text.delta", 2, text="hi")), ["ack 2"]),
            (("text", text("session.updated", 3, session={})), ["ack 3"]),
            (("text", text("input.consumed", None, client_event_seq=4)), []),  # no seq
        ],
    ),
    "text between audio waits for the mark after the audio before it": (
        {"mark_interval_s": 0.02},  # a mark per frame
        [
            *trickle(1, 1, every=1),
            (("text", text("response.output_text.delta", 2, text="a")), []),
            *trickle(3, 3, every=1),
            (("text", text("response.output_text.delta", 4, text="b")), []),
            (("echo", "1"), ["ack 2"]),  # frame 1 played: the text after it is done
            (("echo", "3"), ["ack 4"]),
        ],
    ),
    "text between frames of one unmarked stretch waits for the mark after both": (
        {"max_buffered_s": 0.04, "mark_interval_s": 0.02},  # two frames out, 3 marks
        [
            *trickle(1, 2, every=1),
            (("audio", 3), []),  # the lead is full: it waits
            (("text", text("response.output_text.delta", 4, text="a")), []),
            (("audio", 5), []),
            (("echo", "1"), ["media 3,5", "mark 5", "ack 1"]),
            (("echo", "2"), ["ack 2"]),  # 3 sent, not proven: the text waits
            (("echo", "5"), ["ack 5"]),
        ],
    ),
    "a burst is coalesced into media of at most max_media, a mark per interval": (
        {},
        [
            *[(("audio", s, 800), [f"media {s}", f"mark {s}"]) for s in range(1, 6)],
            *[(("audio", s), []) for s in range(6, 17)],  # the lead is full (4000)
            (("echo", "1"), ["media 6,7,8,9,10", "mark 10", "ack 1"]),
            (("echo", "2"), ["media 11,12,13,14,15", "mark 15", "ack 2"]),
            (("echo", "3"), ["media 16", "ack 3"]),  # 160 < 800, the lead not full: no mark
            (("echo", "4"), ["ack 4"]),
            (("echo", "5"), ["ack 5"]),
            (("echo", "10"), ["ack 10"]),
            (("echo", "15"), ["ack 15"]),  # 16 unproven
            (("text", text("response.done", 17, response_id="r1")), ["mark 16"]),
            (("echo", "16"), ["ack 17"]),
        ],
    ),
    "a mark when the lead is full, even before an interval of audio went": (
        {"max_media_s": 0.04, "max_buffered_s": 0.02},  # lead 160, media 320, 1 mark out
        [
            (("audio", 1), ["media 1", "mark 1"]),  # 160 < 800, yet a mark
            *[(("audio", s), []) for s in range(2, 8)],
            (("echo", "1"), ["media 2,3", "mark 3", "ack 1"]),
            (("audio", 8), []),
            (("echo", "3"), ["media 4,5", "mark 5", "ack 3"]),
        ],
    ),
    "a mark per interval of audio, not after every media": (
        {"max_media_s": 0.02, "mark_interval_s": 0.04, "max_buffered_s": 0.06},
        [
            # a lead of three frames, a media per frame, a mark per two, 2 marks out
            (("audio", 1), ["media 1"]),
            (("audio", 2), ["media 2", "mark 2"]),
            (("audio", 3), ["media 3", "mark 3"]),  # the lead is full: a mark
            (("audio", 4), []),
            (("audio", 5), []),
            (("echo", "2"), ["media 4", "media 5", "mark 5", "ack 2"]),
            (("echo", "3"), ["ack 3"]),
            (("echo", "5"), ["ack 5"]),
        ],
    ),
    "a response's end gets a mark even with the next response queued behind it": (
        {"max_buffered_s": 0.02},  # one frame out at a time
        [
            (("audio", 1), ["media 1", "mark 1"]),  # (the lead is full)
            (("audio", 2), []),
            (("text", text("response.done", 3, response_id="r1")), []),
            (("text", text("response.created", 4, response_id="r2")), []),
            (("audio", 5), []),
            (("audio", 6), []),
            (("echo", "1"), ["media 2", "mark 2", "ack 1"]),  # not coalesced past the end
            (("echo", "2"), ["media 5,6", "mark 6", "ack 4"]),
            (("echo", "6"), ["ack 6"]),
        ],
    ),
    "a queued response's end stops the media on it, its mark there": (
        {"max_buffered_s": 0.1},  # lead 800: a burst queues behind it
        [
            (("audio", 1, 800), ["media 1", "mark 1"]),
            (("audio", 2), []),
            (("audio", 3), []),
            (("text", text("response.done", 4, response_id="r1")), []),
            (("audio", 5), []),
            (("echo", "1"), ["media 2,3", "mark 3", "media 5", "ack 1"]),
            (("echo", "3"), ["ack 4"]),  # 5 unmarked mid-response
        ],
    ),
    "at most max_buffered/mark_interval + 1 marks out; a due mark waits for an echo": (
        {},
        [
            *[
                step
                for s in range(1, 12, 2)  # six one-frame responses, a mark at each end
                for step in [
                    (("audio", s), [f"media {s}"]),
                    (("text", text("response.done", s + 1, response_id="r")), [f"mark {s}"]),
                ]
            ],
            (("audio", 13), ["media 13"]),
            (("text", text("response.done", 14, response_id="r")), []),  # six out: waits
            (("audio", 15), ["media 15"]),
            (("echo", "1"), ["mark 15", "ack 2"]),  # (the waiting mark falls on 15)
            (("echo", "3"), ["ack 4"]),
            (("echo", "11"), ["ack 12"]),  # (5..9 popped by it: in-order play)
            (("echo", "15"), ["ack 15"]),
        ],
    ),
    "the lead bound: nothing more goes out until an echo frees room": (
        {"max_buffered_s": 0.04, "max_media_s": 0.02, "mark_interval_s": 0.02},
        [
            *trickle(1, 2, every=1),
            (("audio", 3), []),  # lead 320 = max: waits
            (("audio", 4), []),
            (("echo", "1"), ["media 3", "mark 3", "ack 1"]),
            (("echo", "2"), ["media 4", "mark 4", "ack 2"]),
            (("echo", "4"), ["ack 4"]),  # (3 popped by it: in-order play)
        ],
    ),
    "a frame longer than max_media goes alone, whole": (
        {},
        [
            (("audio", 1, 2000), ["media 1", "mark 1"]),
            (("audio", 2, 3000), ["media 2", "mark 2"]),  # lead 2000 < 4000
            (("audio", 3), []),  # lead 5000: over by one media
            (("echo", "1"), ["media 3", "ack 1"]),
            (("text", text("response.done", 4, response_id="r1")), ["mark 3"]),
            (("echo", "2"), ["ack 2"]),
            (("echo", "3"), ["ack 4"]),
        ],
    ),
    "stale echoes are ignored": (
        {},
        [
            *trickle(1, 5),
            (("echo", "99"), []),
            (("echo", "garbage"), []),
            (("echo", ""), []),
            (("echo", "4"), []),  # never a mark: stale
            (("echo", "5"), ["ack 5"]),
            (("echo", "5"), []),  # twice: stale
        ],
    ),
    "a closing stream's last audio is marked, its echo drains it": (
        {},
        [
            *trickle(1, 3),
            (("text", text("session.closed", reason="client_close")), ["mark 3"]),
            (("echo", "3"), ["ack 3"]),
        ],
    ),
    "closing with audio queued: the mark falls on the last of it, when it goes": (
        {"max_media_s": 0.02},  # a media per frame
        [
            *[(("audio", s, 800), [f"media {s}", f"mark {s}"]) for s in range(1, 6)],
            (("audio", 6), []),  # the lead is full
            (("audio", 7), []),
            (("text", text("session.expired", reason="idle_ttl_expired")), []),
            (("echo", "1"), ["media 6", "media 7", "mark 7", "ack 1"]),  # 320 < 800
            (("echo", "5"), ["ack 5"]),
            (("echo", "7"), ["ack 7"]),
        ],
    ),
    "finish, for a close with no terminal text, marks the same": (
        {},
        [
            *trickle(1, 2),
            (("finish",), ["mark 2"]),
            (("audio", 3), ["media 3", "mark 3"]),  # (closing: every frame's the last)
            (("echo", "3"), ["ack 3"]),
        ],
    ),
    "a clear: its marks' echoes ack nothing, the marks after it are acked": (
        {"mark_interval_s": 0.02},
        [
            *trickle(1, 2, every=1),
            (("text", text("response.cancelled", 3, response_id="r1")), ["clear", "ack 3"]),
            (("echo", "1"), []),  # (Twilio may echo cleared marks: not proof of play)
            *trickle(4, 4, every=1),
            (("echo", "2"), []),
            (("echo", "4"), ["ack 4"]),
        ],
    ),
    "a cancel clears audio sent unmarked, too": (
        {},
        [
            *trickle(1, 7),
            (("text", text("response.cancelled", 8, response_id="r1")), ["clear", "ack 8"]),
            (("echo", "5"), []),
            *trickle(9, 10),
            (("text", text("response.done", 11, response_id="r2")), ["mark 10"]),
            (("echo", "10"), ["ack 11"]),
        ],
    ),
    "a cancel with nothing queued or unconfirmed sends no clear": (
        {},
        [
            *trickle(1, 1),
            (("text", text("response.output_audio.done", 2, response_id="r1")), ["mark 1"]),
            (("echo", "1"), ["ack 2"]),
            (("text", text("response.cancelled", 3, response_id="r1")), ["ack 3"]),
        ],
    ),
    "a cancel drops what is queued, too": (
        {"max_buffered_s": 0.02},
        [
            *trickle(1, 1, every=1),  # (the lead is full: a mark)
            (("audio", 2), []),
            (("audio", 3), []),
            (("clear",), ["clear", "ack 3"]),
            (("echo", "1"), []),
            *trickle(4, 4, every=1),
            (("echo", "4"), ["ack 4"]),
        ],
    ),
    "the fence: clear, and nothing is sent or acked after it": (
        {"max_buffered_s": 0.02},
        [
            *trickle(1, 1, every=1),
            (("audio", 2), []),
            (("fence",), ["clear"]),
            (("echo", "1"), []),  # the frontier is final
            (("audio", 3), []),
            (("text", text("response.done", 4, response_id="r1")), []),
            (("text", text("session.closed", reason="client_close")), []),
            (("finish",), []),
            (("text", text("response.cancelled", 5, response_id="r1")), []),
            (("fence",), []),
            (("clear",), []),
        ],
    ),
    "the fence keeps the frontier before audio not proven played": (
        {},
        [
            (("text", text("response.created", 1, response_id="r1")), ["ack 1"]),
            *trickle(2, 8),
            (("echo", "6"), ["ack 6"]),
            (("fence",), ["clear"]),  # (7 and 8 unmarked: dropped, nothing to wait for)
            (("echo", "8"), []),
        ],
    ),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_tables(name: str) -> None:
    config, table = TABLES[name]
    book = MarkBook(SID, **config)
    steps = [step for step, _ in table]
    assert drive(book, steps) == [expected for _, expected in table]


@pytest.mark.parametrize("frames", [1, 4, 5, 6, 23, 25, 60])
@pytest.mark.parametrize("delay", [0, 1, 7, 20])
@pytest.mark.parametrize("end", ["response.output_audio.done", "response.done", "session.closed"])
def test_a_real_time_trickle_sends_a_mark_per_interval_and_at_its_end(
    frames: int, delay: int, end: str
) -> None:
    """A real-time engine writes a frame every 20 ms and Twilio plays it as it comes,
    echoing a mark ``delay`` frames after its audio played: at the defaults (a mark per
    0.1 s) one response of ``frames`` frames sends a ``media`` per frame and at most
    ``ceil(frames / 5) + 1`` marks (the measured engine's 25 frames: 6, not 25), and yet
    its end is marked: once every echo is in, all of it is proven played and acked."""
    book = MarkBook(SID)
    received = 0  # bytes Twilio has, played as they come
    echoes: deque[tuple[int, str]] = deque()  # (the tick it comes back, its name)
    marks: list[str] = []
    media = 0
    tick = 0

    def twilio(outputs: list[str]) -> None:
        nonlocal received, media
        for out in outputs:
            message = json.loads(out)
            if message["event"] == "media":
                received += len(base64.b64decode(message["media"]["payload"]))
                media += 1
            else:
                assert message["event"] == "mark", message
                marks.append(message["mark"]["name"])
                echoes.append((tick + delay, message["mark"]["name"]))

    def echo_due() -> None:
        while echoes and echoes[0][0] <= tick:
            twilio(book.echoed(echoes.popleft()[1]))

    for seq in range(1, frames + 1):
        tick = seq
        twilio(book.queued(seq, payload(seq)))
        echo_due()
    last = frames + 1 if end != "session.closed" else frames
    twilio(book.text(text(end, None if end == "session.closed" else last, response_id="r")))
    while echoes:
        tick += 1
        echo_due()
    assert (media, received) == (frames, frames * FRAME)  # frame by frame, no delay
    assert len(marks) <= math.ceil(frames / 5) + 1, marks
    assert book.marks_sent == len(marks) and marks[-1] == str(frames)  # the end is marked
    assert book.drained and book.frontier == last
    assert book.take_acks() == last


def test_counters() -> None:
    book = MarkBook(SID, mark_interval_s=0.02)  # a mark per frame
    drive(
        book,
        [
            ("audio", 1),
            ("audio", 2),
            ("echo", "1"),
            ("echo", "nope"),
            ("text", text("response.cancelled", 3)),
            ("echo", "2"),
            ("audio", 4),
            ("fence",),
        ],
    )
    assert (book.marks_sent, book.marks_echoed, book.marks_stale) == (3, 1, 1)
    assert (book.marks_cleared, book.clears_cancel, book.clears_fence) == (1, 1, 1)
    assert (book.media_sent, book.audio_bytes_out) == (3, 3 * FRAME)
    assert book.cleared_pending == 1  # mark 4, never echoed


def test_an_echo_past_the_head_pops_through_it() -> None:
    book = MarkBook(SID, mark_interval_s=0.02)
    drive(book, [("audio", 1), ("audio", 2), ("audio", 3)])
    assert book.outstanding == 3
    assert book.echoed("2") == []
    assert (book.take_acks(), book.outstanding, book.marks_skipped) == (2, 1, 1)
    book.echoed("1")
    assert book.marks_stale == 1
    assert book.lead_bytes == FRAME


def test_may_write_holds_the_queue_at_max_queued() -> None:
    book = MarkBook(SID, max_queued_s=0.1, max_buffered_s=0.02, max_media_s=0.02)  # 800 queued
    book.queued(1, payload(1))  # sent: the lead is full
    seq = 2
    while book.may_write:
        book.queued(seq, payload(seq))
        seq += 1
    assert book.queued_bytes == 800 and seq == 7
    book.echoed("1")
    assert book.may_write and book.queued_bytes == 800 - FRAME


def test_closing_and_drained() -> None:
    book = MarkBook(SID)
    assert book.drained and not book.closing
    assert [json.loads(m)["event"] for m in book.queued(1, payload(1))] == ["media"]
    assert not book.drained and book.outstanding == 0  # sent, unmarked: not drained
    marked = book.text(text("session.closed", reason="client_close"))
    assert [json.loads(m)["mark"]["name"] for m in marked] == ["1"]
    assert book.closing and not book.drained
    book.echoed("1")
    assert book.drained
    assert MarkBook(SID).text(text("session.expired", reason="idle_ttl_expired")) == []


@pytest.mark.parametrize("cut", ["clear", "fence"])
def test_a_clear_or_the_fence_leaves_nothing_unmarked_to_wait_for(cut: str) -> None:
    """Audio sent unmarked and then cut off is dropped with it: the close waits for
    nothing (no mark could prove it played: Twilio dropped it)."""
    book = MarkBook(SID)
    drive(book, [("audio", 1), ("audio", 2)])
    assert not book.drained and book.outstanding == 0
    assert [json.loads(m)["event"] for m in getattr(book, cut)()] == ["clear"]
    assert book.drained and book.lead_bytes == 0
    assert book.finish() == [] and book.drained  # (and closing marks nothing after it)


def test_seqs_must_increase() -> None:
    book = MarkBook(SID)
    book.queued(3, payload(3))
    with pytest.raises(OutOfOrder):
        book.queued(3, payload(3))
    with pytest.raises(OutOfOrder):
        book.text(text("response.done", 2))
    book.text(text("response.done", 4))


def test_bad_configuration() -> None:
    for field in (
        "max_buffered_s",
        "mark_interval_s",
        "max_queued_s",
        "max_media_s",
        "bytes_per_s",
    ):
        with pytest.raises(ValueError, match=field):
            config: dict[str, Any] = {field: 0.0}
            MarkBook(SID, **config)


def test_stream_sid_is_encoded_as_json() -> None:
    book = MarkBook('a"b\\c')
    out = book.queued(1, b"\xff") + book.text(text("response.done", 2))
    assert [json.loads(m)["event"] for m in out] == ["media", "mark"]
    out += book.clear()
    assert [json.loads(m)["streamSid"] for m in out] == ['a"b\\c'] * 3


# -- sniffing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (text("response.done", 7, response_id="r"), ("response.done", 7)),
        (text("session.closed", reason="x"), ("session.closed", None)),
        ('{"response_id":"r","type":"response.done","server_event_seq":9}', ("response.done", 9)),
        ('{"type":"response.done","server_event_seq":9,"x":1}', ("response.done", 9)),
        ('{"type":"error","error":{"param":"server_event_seq"}}', ("error", None)),
        ('{"type":"x","a":{"server_event_seq":5}}', ("x", None)),  # nested: not the frame's
        ('{"type":"x","a":"\\"server_event_seq\\":5}"}', ("x", None)),  # inside a string
        ('{"type":"x","a":"b\\\\","server_event_seq":5}', ("x", 5)),
        ('{"type":"re\\u0073ponse.done","server_event_seq":2}', ("response.done", 2)),
        ('{"type":"x","server_event_seq":true}', ("x", None)),
        ('{"type":"x","server_event_seq":-1}', ("x", None)),
        ("not json", (None, None)),
        ("[1]", (None, None)),
        ('{"type":1}', (None, None)),
    ],
)
def test_sniff(frame: str, expected: tuple[str | None, int | None]) -> None:
    assert sniff(frame) == expected


def _top(frame: str) -> tuple[str | None, int | None]:
    event = json.loads(frame)
    kind = event.get("type")
    seq = event.get("server_event_seq")
    return (kind if isinstance(kind, str) else None), (
        seq if type(seq) is int and seq >= 0 else None
    )


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["type", "server_event_seq", "a"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.one_of(st.text(max_size=12), st.sampled_from(["response.done", "a\\b", 'a"b'])),
    fields=st.dictionaries(st.sampled_from(["a", "server_event_seq", "b"]), _json, max_size=3),
    seq=st.none() | st.integers(0, 2**63 - 1),
)
def test_sniff_agrees_with_json(kind: str, fields: dict[str, object], seq: int | None) -> None:
    """On any compact frame (type first or not, the seq last or not, keys nested), the
    fast path reads what a full parse reads."""
    frame = text(kind, seq, **fields)
    assert sniff(frame) == _top(frame)
    body = dict(fields, type=kind)  # type last
    other = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    assert sniff(other) == _top(other)


# -- the output frame -------------------------------------------------------------------


def test_parse_output_frame() -> None:
    assert parse_output_frame(binary.output_message(2**40, b"abc")) == (2**40, b"abc")
    assert parse_output_frame(binary.output_message(1, b"")) == (1, b"")
    for bad in (
        b"",
        b"\x02\x00\x00\x00\x00",
        binary.input_message(1, b"x"),
        b"\x02\x01" + bytes(10),
    ):
        with pytest.raises(BadOutputFrame, match=r"^not a kind-2 output audio frame$"):
            parse_output_frame(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_parse_output_frame_fuzzed(data: bytes) -> None:
    try:
        kind, seq, body = binary.parse(data)
    except Exception:
        kind = 0
    if kind == binary.OUTPUT_AUDIO:
        assert parse_output_frame(data) == (seq, body)
    else:
        with pytest.raises(BadOutputFrame):
            parse_output_frame(data)


# -- any interleaving -------------------------------------------------------------------

TEXTS = [
    ("response.output_text.delta", True),
    ("response.created", True),
    ("response.done", True),
    ("response.output_audio.done", True),
    ("response.cancelled", True),
    ("input.consumed", False),
    ("session.closed", False),
]


class BookMachine(RuleBasedStateMachine):
    """Drives a MarkBook with any interleaving and follows its output with a model of
    Twilio: what was sent, which marks are out, which audio an echo proves played."""

    def __init__(self) -> None:
        super().__init__()
        self.configure(0.5, 0.1, 0.1, 1.0)

    @initialize(
        buffered=st.sampled_from([0.02, 0.05, 0.1, 0.5]),
        interval=st.sampled_from([0.02, 0.05, 0.1]),
        media=st.sampled_from([0.02, 0.04, 0.1]),
        queued=st.sampled_from([0.1, 0.5, 2.0]),
    )
    def configure(self, buffered: float, interval: float, media: float, queued: float) -> None:
        self.book = MarkBook(
            SID,
            max_buffered_s=buffered,
            mark_interval_s=interval,
            max_media_s=media,
            max_queued_s=queued,
        )
        self.lead_max = round(buffered * 8000)
        self.media_max = round(media * 8000)
        self.interval = round(interval * 8000)
        self.fifo_max = self.lead_max // self.interval + 1
        self.seq = 0
        self.sizes: dict[int, int] = {}
        self.unsent: deque[int] = deque()  # audio queued, not yet in a media
        self.sent_index: dict[int, int] = {}  # audio seq -> its media's index out
        self.unproven: list[int] = []  # audio sent, not proven or dropped
        self.proven: set[int] = set()
        self.dropped: set[int] = set()
        self.marks: list[str] = []  # every mark sent
        self.out_marks: deque[tuple[str, int, int]] = deque()  # name, index, bytes
        self.index = 0
        self.lead = 0
        self.since_mark = 0
        self.last_sent = 0
        self.frontier = 0
        self.fenced_at: int | None = None
        self.fence_cut: set[int] = set()  # audio the fence dropped (done with if unfenced)
        self.max_lead = 0
        self.stretch: list[int] = []  # audio sent since the last mark
        self.ends: set[int] = set()  # frames that end a response, not yet marked after
        self.closing = False

    # -- following the output ---------------------------------------------------------

    def follow(self, outputs: list[str]) -> None:
        for out in outputs:
            self.index += 1
            message = json.loads(out)
            assert message["streamSid"] == SID
            kind = message["event"]
            if kind == "media":
                assert self.fenced_at is None
                assert self.lead < self.lead_max, "media only while the lead is below max"
                data = base64.b64decode(message["media"]["payload"])
                at = 0
                count = 0
                while at < len(data):
                    seq = self.unsent.popleft()
                    size = self.sizes[seq]
                    assert data[at : at + size] == payload(seq, size)
                    at += size
                    count += 1
                    self.sent_index[seq] = self.index
                    self.unproven.append(seq)
                    self.stretch.append(seq)
                    self.last_sent = seq
                assert at == len(data) and count >= 1
                assert count == 1 or len(data) <= self.media_max
                self.lead += len(data)
                self.since_mark += len(data)
                self.max_lead = max(self.max_lead, self.lead)
            elif kind == "mark":
                name = message["mark"]["name"]
                assert self.since_mark > 0, "a mark follows audio"
                assert name == str(self.last_sent)
                assert not self.marks or int(name) > int(self.marks[-1])
                assert self.due(), "a mark has a reason (an empty queue is none)"
                self.ends.difference_update(self.stretch)
                self.stretch.clear()
                self.marks.append(name)
                self.out_marks.append((name, self.index, self.since_mark))
                self.since_mark = 0
            else:
                assert kind == "clear"
                self.out_marks.clear()
                if self.fenced_at is None:
                    self.dropped.update(self.unproven, self.unsent)
                else:
                    self.fence_cut.update(self.unproven, self.unsent)
                self.stretch.clear()
                self.ends.clear()
                self.unproven.clear()
                self.unsent.clear()
                self.lead = self.since_mark = 0

    def due(self) -> bool:
        """Is a mark due after the audio sent since the last one (§ the rules)?"""
        return bool(self.stretch) and (
            self.since_mark >= self.interval
            or self.lead >= self.lead_max
            or not self.ends.isdisjoint(self.stretch)
            or (self.closing and not self.unsent)
        )

    def echo(self, name: str) -> None:
        if name in [m for m, _, _ in self.out_marks]:
            while True:
                mark, index, size = self.out_marks.popleft()
                self.lead -= size
                for seq in [s for s in self.unproven if self.sent_index[s] < index]:
                    self.unproven.remove(seq)
                    self.proven.add(seq)
                if mark == name:
                    break
        self.follow(self.book.echoed(name))

    # -- rules ------------------------------------------------------------------------

    @precondition(lambda self: self.book.may_write)
    @rule(size=st.sampled_from([0, 1, 80, 160, 320, 800]))
    def audio(self, size: int) -> None:
        size = min(size, self.media_max)
        self.seq += 1
        self.sizes[self.seq] = size
        if size and self.fenced_at is None:
            self.unsent.append(self.seq)
        elif size == 0:
            self.proven.add(self.seq)  # nothing to play
        else:
            self.dropped.add(self.seq)
        self.follow(self.book.queued(self.seq, payload(self.seq, size)))

    @rule(which=st.sampled_from(TEXTS))
    def text(self, which: tuple[str, bool]) -> None:
        self.write(*which)

    def write(self, kind: str, journaled: bool) -> None:
        seq = None
        if journaled:
            self.seq += 1
            seq = self.seq
        if kind in ("response.done", "response.output_audio.done"):
            if self.unsent:
                self.ends.add(self.unsent[-1])
            elif self.stretch:
                self.ends.add(self.stretch[-1])
        elif kind == "session.closed":
            self.closing = True
        self.follow(self.book.text(text(kind, seq, response_id="r")))

    @rule()
    def finish(self) -> None:
        self.closing = True
        self.follow(self.book.finish())

    @rule()
    def echo_oldest(self) -> None:
        if self.out_marks:
            self.echo(self.out_marks[0][0])

    @rule(data=st.data())
    def echo_any_out(self, data: st.DataObject) -> None:
        """An echo past the FIFO's head (Twilio lost one, or reordered)."""
        if self.out_marks:
            self.echo(data.draw(st.sampled_from([m for m, _, _ in self.out_marks])))

    @rule(data=st.data())
    def echo_any_sent(self, data: st.DataObject) -> None:
        if self.marks:
            self.echo(data.draw(st.sampled_from(self.marks)))

    @rule(name=st.text(max_size=4) | st.integers(0, 40).map(str))
    def echo_random(self, name: str) -> None:
        self.echo(name)

    @rule()
    def clear(self) -> None:
        self.follow(self.book.clear())

    @precondition(lambda self: self.fenced_at is None)
    @rule()
    def fence(self) -> None:
        self.fenced_at = self.frontier
        self.follow(self.book.fence())

    @precondition(lambda self: self.fenced_at is not None)
    @rule()
    def unfence(self) -> None:
        self.fenced_at = None
        self.dropped.update(self.fence_cut)
        self.fence_cut.clear()
        self.follow(self.book.unfence())

    @rule(end=st.sampled_from(["response.done", "response.output_audio.done", "close", "finish"]))
    def drain(self, end: str) -> None:
        """The response ends (or the stream), then Twilio plays everything: every mark
        is echoed, in order, until none is out. Nothing is left unmarked."""
        if end == "finish":
            self.finish()
        else:
            self.write("session.closed" if end == "close" else end, end != "close")
        self.check_frontier()
        while self.out_marks:
            self.echo(self.out_marks[0][0])
            self.check_frontier()
        assert self.book.drained
        if self.fenced_at is None:
            assert not self.unproven and not self.unsent
            assert self.book.frontier == self.seq, "all done: the frontier reaches the end"

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def check_frontier(self) -> None:
        book = self.book
        ack = book.take_acks()
        if ack is not None:
            assert ack > self.frontier, "the frontier only moves on"
            self.frontier = ack
        assert book.frontier == self.frontier
        assert self.frontier <= self.seq
        if self.fenced_at is not None:
            assert self.frontier == self.fenced_at, "no ack after the fence"
        for seq in range(1, self.frontier + 1):
            if seq in self.sizes:
                assert seq in self.proven or seq in self.dropped, f"{seq} acked unplayed"
        assert book.take_acks() is None

    @invariant()
    def check_no_mark_missed(self) -> None:
        """A mark due goes out at once, unless the FIFO is full (an echo then sends it)."""
        if self.fenced_at is None and len(self.out_marks) < self.fifo_max:
            assert not self.due(), "a mark was due and not sent"

    @invariant()
    def check_bounds(self) -> None:
        book = self.book
        assert book.lead_bytes == self.lead
        assert self.lead <= self.lead_max + self.media_max
        assert book.outstanding == len(self.out_marks) <= self.fifo_max
        assert book.cleared_pending <= 4 * self.fifo_max
        assert book.queued_bytes == sum(self.sizes[s] for s in self.unsent)
        assert book.queued_bytes < round(book.max_queued_s * 8000) + self.media_max


TestBook = BookMachine.TestCase
TestBook.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_fence_given_up_sends_again_and_counts_what_it_dropped_as_done() -> None:
    book = MarkBook(SID)
    drive(book, [("audio", 1), ("audio", 2)])
    assert book.fence() and book.fenced
    assert book.queued(3, payload(3)) == []  # fenced: nothing goes out, nothing is acked
    assert book.take_acks() is None
    assert book.unfence() == [] and not book.fenced  # (nothing queued to send)
    assert book.take_acks() == 3  # what the fence dropped is done with
    sent = book.queued(4, payload(4)) + book.text(text("response.done", 5))
    assert [json.loads(message)["event"] for message in sent] == ["media", "mark"]
    assert book.unfence() == []  # (not fenced: nothing to do)
