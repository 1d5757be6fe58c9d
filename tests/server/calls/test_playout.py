"""``Playout`` alone: tables of what the channel tells it and what it says back.

Each step is one input (a text sent, a packet sent, the client's clear, the worker's
report); its expected outputs are written short: ``started r1`` (an
``output_audio_buffer.started`` for ``r1``), ``CLEAR`` (the command), ``muted`` (the
packet is dropped). No I/O, no clock.
"""

from __future__ import annotations

import itertools
import json

import pytest

from trio_duplex.server.calls.playout import Command, Playout

Step = tuple[object, ...]


def text(kind: str, **fields: object) -> str:
    """A frame as the OpenAI dialect writes it: compact, ``type`` first."""
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


def created(rid: str) -> str:
    return text("response.created", response={"id": rid, "status": "in_progress"})


def done(rid: str, status: str = "completed") -> str:
    return text("response.done", response={"id": rid, "status": status, "output": []})


SPEECH = text("input_audio_buffer.speech_started", audio_start_ms=0, item_id="item_1")


def drive(steps: list[Step]) -> list[list[str]]:
    """Run ``steps``; each one's outputs, short, checking every event's shape."""
    playout = Playout(ids=itertools.count(1))
    seen = 0
    said: list[list[str]] = []
    for step in steps:
        name, *args = step
        if name == "audio":
            (seq,) = args
            assert isinstance(seq, int)
            said.append([] if playout.sent_audio(seq) else ["muted"])
            continue
        if name == "text":
            (frame,) = args
            assert isinstance(frame, str)
            outputs = playout.sent_text(frame)
        elif name == "clear":
            outputs = playout.client_clear()
        else:
            assert name == "played"
            (seq,) = args
            assert isinstance(seq, int)
            outputs = playout.played(seq)
        short = []
        for out in outputs:
            if out is Command.CLEAR:
                short.append("CLEAR")
                continue
            assert isinstance(out, str)
            event = json.loads(out)
            seen += 1
            # Unsequenced transport events, each with its own id.
            assert event.keys() == {"type", "event_id", "response_id"}, event
            assert event["event_id"] == f"event_rtc_{seen}"
            assert event["type"].startswith("output_audio_buffer.")
            short.append(f"{event['type'].rsplit('.', 1)[1]} {event['response_id']}")
        said.append(short)
    return said


TABLES: dict[str, list[tuple[Step, list[str]]]] = {
    "a response heard through": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("audio", 2), []),
        (("played", 1), ["started r1"]),
        (("audio", 3), []),
        (("text", done("r1")), []),  # its last packet is not played yet
        (("played", 2), []),
        (("played", 3), ["stopped r1"]),
        (("played", 3), []),  # (said once)
    ],
    "played out before its response.done": [
        (("text", created("r1")), []),
        (("audio", 4), []),
        (("played", 4), ["started r1"]),
        (("text", done("r1")), ["stopped r1"]),
    ],
    "one report past several packets starts and stops at once": [
        (("text", created("r1")), []),
        (("audio", 2), []),
        (("audio", 3), []),
        (("text", done("r1")), []),
        (("played", 3), ["started r1", "stopped r1"]),
    ],
    "back to back: each started and stopped in play order": [
        (("text", created("r1")), []),
        (("audio", 2), []),
        (("text", done("r1")), []),
        (("text", created("r2")), []),
        (("audio", 5), []),
        (("text", done("r2")), []),
        (("played", 5), ["started r1", "stopped r1", "started r2", "stopped r2"]),
    ],
    "the client's clear cuts off what plays, and mutes the rest of it": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("audio", 2), []),
        (("played", 1), ["started r1"]),
        (("clear",), ["CLEAR", "cleared r1"]),
        (("audio", 3), ["muted"]),
        (("played", 1), []),  # (the worker's answer to the clear)
        (("text", done("r1", "cancelled")), []),  # cleared once
        (("text", created("r2")), []),
        (("audio", 6), []),  # a new response is heard again
        (("played", 6), ["started r2"]),
    ],
    "the client's clear before any audio mutes the response being produced": [
        (("text", created("r1")), []),
        (("clear",), ["CLEAR", "cleared r1"]),  # (always answered)
        (("audio", 2), ["muted"]),
        (("text", done("r1")), []),
    ],
    "a clear after a cancelled response played out is still answered cleared": [
        # The agents SDK's interrupt(): response.cancel, then output_audio_buffer.clear
        # back to back; the cancel's response.done may come once all was played.
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("played", 1), ["started r1"]),
        (("text", done("r1", "cancelled")), ["stopped r1"]),
        (("clear",), ["CLEAR", "cleared r1"]),
    ],
    "a response a resume came back to midway takes the audio sent before its done": [
        # Its response.created was before the resume's point: never seen by this call.
        (("audio", 5), []),
        (("played", 5), []),  # (whose it is, nobody knows yet)
        (("audio", 6), []),
        (("text", done("r1")), ["started r1"]),
        (("played", 6), ["stopped r1"]),
        (("text", created("r2")), []),  # the next response is told as any other
        (("audio", 7), []),
        (("played", 7), ["started r2"]),
        (("text", done("r2")), ["stopped r2"]),
    ],
    "audio outside any response ends when the next response is created": [
        (("audio", 1), []),
        (("played", 1), []),
        (("text", created("r1")), []),
        (("audio", 2), []),
        (("played", 2), ["started r1"]),
        (("text", done("r1")), ["stopped r1"]),
    ],
    "a cancelled response with audio queued is cleared": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("text", done("r1", "cancelled")), ["CLEAR", "cleared r1"]),
        (("played", 1), []),
    ],
    "a cancelled response that had no audio: nothing": [
        (("text", created("r1")), []),
        (("text", done("r1", "cancelled")), []),
    ],
    "a cancelled response played out already: nothing to clear": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("played", 1), ["started r1"]),
        (("text", done("r1", "cancelled")), ["stopped r1"]),
    ],
    "speech while a response plays is a barge-in": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("audio", 2), []),
        (("played", 1), ["started r1"]),
        (("text", SPEECH), ["CLEAR", "cleared r1"]),
        (("audio", 3), ["muted"]),
        (("text", done("r1", "cancelled")), []),
    ],
    "speech while idle: nothing": [
        (("text", SPEECH), []),
        (("text", created("r1")), []),
        (("text", SPEECH), []),  # nothing of r1 queued yet
        (("audio", 2), []),
        (("played", 2), ["started r1"]),
    ],
    "a clear cuts off every response queued": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("text", done("r1")), []),
        (("text", created("r2")), []),
        (("audio", 3), []),
        (("clear",), ["CLEAR", "cleared r1", "cleared r2"]),
        (("audio", 4), ["muted"]),
    ],
    "a cancel of a later response without audio leaves the earlier one playing": [
        (("text", created("r1")), []),
        (("audio", 1), []),
        (("text", done("r1")), []),
        (("text", created("r2")), []),
        (("text", done("r2", "cancelled")), []),
        (("played", 1), ["started r1", "stopped r1"]),
    ],
    "other text is not looked at": [
        (("text", text("response.output_audio_transcript.delta", delta="hi")), []),
        (("text", text("session.created", session={})), []),
        (("text", '{"response":{"id":"r9"},"type":"response.created"}'), []),  # not first
        (("audio", 1), []),  # audio outside any response: played, nothing said
        (("played", 1), []),
    ],
    "a response.done of an unknown response: nothing": [
        (("text", done("nobody")), []),
        (("text", '{"type":"response.done"'), []),  # (broken JSON: looked at, ignored)
    ],
}


@pytest.mark.parametrize("name", list(TABLES))
def test_playout_tables(name: str) -> None:
    table = TABLES[name]
    assert drive([step for step, _ in table]) == [outputs for _, outputs in table]


def test_event_ids_are_unique_across_playouts() -> None:
    """Without a count of its own, a Playout takes the process's: a resumed call's new
    channel never repeats an id its client saw."""
    ids = []
    for _ in range(2):
        playout = Playout()
        playout.sent_text(created("r1"))
        playout.sent_audio(1)
        (started,) = playout.played(1)
        assert isinstance(started, str)
        ids.append(json.loads(started)["event_id"])
    assert ids[0] != ids[1] and all(i.startswith("event_rtc_") for i in ids)
