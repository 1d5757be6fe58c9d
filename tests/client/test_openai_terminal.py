"""``trio-duplex connect --dialect openai``: the flags' spelling and the printer's, alone
and, in process, against the server's ``/v1/realtime`` in memory (virtual time)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import trio

from trio_duplex.client.dialect import NATIVE, OPENAI, ClientDialect
from trio_duplex.client.terminal import Printer, _events_for, _opening, build_parser

from .test_terminal import Serve, out_lines, piped, terminal


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


async def test_lines_are_turns_over_v1_realtime(autojump_clock: trio.abc.Clock) -> None:
    session = json.dumps({"output_modalities": ["text"]})
    async with terminal(["--dialect", "openai", "--session", session]) as term:
        await term.type("hello", '/event {"type": "response.cancel", "event_id": "mine"}')
        await term.wait_for("response.done")
        term.net.down = True
        await term.net.cut()  # resumed by the upgrade's query
        await term.wait_for("retry 2", "err")
        term.net.down = False
        await term.type("again")
        await term.wait_for("again")
        term.lines.close()
    assert term.exit_code == 0
    texts = [line.split() for line in out_lines(term) if "response.output_text.delta" in line]
    assert [words[2] for words in texts] == ["hello", "again"]
    err = term.err.getvalue()
    assert "* connected: session sess_" in err and "resumed session sess_" in err
    assert term.sim.server.slots_held == 0


@pytest.mark.integration
def test_driven_through_a_pipe_over_v1_realtime(serve: Serve) -> None:
    server = serve("--engine", "echo")
    host = server.url.rsplit("/v1/", 1)[0]  # no path: the dialect's is added
    lines = [f"line {i}" for i in range(20)]
    done = piped(lines, host, "--dialect", "openai", "--linger", "0.3")
    out = done.stdout.splitlines()
    texts = [
        line.split(maxsplit=2)[2]
        for line in out
        if " response.output_audio_transcript.delta " in line
        or " response.output_text.delta " in line
    ]
    assert [text.split(" response_id=")[0] for text in texts] == lines
    assert "session.closed" in out[-1] and "client_close" in out[-1]
    assert "* connected: session sess_" in done.stderr
