"""``trio-duplex connect --dialect openai``: the flags' spelling and the printer's, alone
(what it does against a server: test_openai_realtime.py)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from trio_duplex.client.dialect import NATIVE, OPENAI, ClientDialect
from trio_duplex.client.terminal import Printer, _events_for, _opening, build_parser


def printed(event: dict[str, Any], dialect: ClientDialect = OPENAI) -> str:
    out = io.StringIO()
    Printer(out, io.StringIO(), dialect=dialect).event(event)
    return out.getvalue().rstrip("\n")


def test_the_printer_reads_openais_spelling() -> None:
    nested = {
        "type": "error",
        "event_id": "event_x1",
        "error": {
            "type": "invalid_request_error",
            "code": "bad_event",
            "message": "no",
            "event_id": "mine",
        },
    }
    assert printed(nested).endswith("error bad_event: no (event_id=mine)")
    delta = {"type": "response.output_text.delta", "server_event_seq": 3, "delta": "hello"}
    assert printed(delta).startswith("    3 response.output_text.delta hello")
    audio = {"type": "response.output_audio.delta", "server_event_seq": 4, "delta": "AAECAw=="}
    assert "delta=<4 bytes>" in printed(audio)
    native = {"type": "error", "code": "bad_event", "message": "no", "event_id": "e1"}
    assert printed(native, NATIVE).endswith("error bad_event: no (event_id=e1)")


def test_a_line_is_the_dialects_text_turn() -> None:
    assert [e["type"] for e in _events_for("hi", OPENAI)] == [
        "conversation.item.create",
        "response.create",
    ]
    assert _events_for("hi", NATIVE) == [{"type": "input.text.append", "text": "hi"}]
    assert _events_for('/event {"type": "response.cancel"}', OPENAI) == [
        {"type": "response.cancel"}
    ]


def test_the_flags_are_spelt_for_the_dialect() -> None:
    args = build_parser().parse_args(
        ["ws://h:1", "--dialect", "openai", "--audio-format", "g711_alaw", "--audio-wire", "json"]
    )
    opening = _opening(args)
    assert opening.urls == ("ws://h:1/v1/realtime",) and opening.dialect is OPENAI
    assert opening.config == {
        "audio": {
            "wire": "json",
            "input": {"format": {"type": "audio/pcma"}},
            "output": {"format": {"type": "audio/pcma"}},
        }
    }
    native = _opening(build_parser().parse_args(["ws://h:1", "--audio-format", "g711_alaw"]))
    assert native.urls == ("ws://h:1/v1/duplex",) and native.dialect is NATIVE
    assert native.config == {
        "audio": {"input": {"format": "g711_alaw"}, "output": {"format": "g711_alaw"}}
    }
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ws://h:1", "--dialect", "klingon"])
