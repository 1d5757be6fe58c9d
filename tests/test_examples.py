"""The README's promises, run as a user would: its custom engine, and barge-in through
the real server with the voice engine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from websockets.sync.client import connect

from trio_duplex import ServerConfig
from trio_duplex.engines.voice import VoiceEngine
from trio_duplex.testing import running_server

README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_block(after: str) -> str:
    """The first ```python block that follows the line containing ``after``."""
    text = README.read_text()
    start = text.index(after)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block after {after!r}"
    return match.group(1)


@pytest.mark.integration
def test_readme_custom_engine_runs_under_serve(
    serve: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "shout.py").write_text(_readme_block("## A custom engine"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = serve("--engine", "shout:Shout")
    with connect(server.url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        ws.send(json.dumps({"type": "input.text.append", "text": "hello"}))
        answer = json.loads(ws.recv(timeout=10))
        assert answer == {
            "type": "response.output_text.delta",
            "text": "HELLO",
            "server_event_seq": 1,
        }
        ws.send(json.dumps({"type": "input.text.append", "text": 5, "event_id": "e"}))
        error = json.loads(ws.recv(timeout=10))
        assert (error["code"], error["param"], error["event_id"]) == ("bad_event", "text", "e")


@pytest.mark.integration
def test_readme_asyncio_engine_runs_under_serve(
    serve: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "aioshout.py").write_text(_readme_block("### An engine written with asyncio"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = serve("--engine", "aioshout:AioShout")
    with connect(server.url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for word in ("hello", "again"):
            ws.send(json.dumps({"type": "input.text.append", "text": word}))
        answers = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
        assert [(a["server_event_seq"], a["text"]) for a in answers] == [(1, "HELLO"), (2, "AGAIN")]


@pytest.mark.integration
def test_readme_binary_lane_example_runs_against_serve(serve: Any) -> None:
    """The README's phone call: μ-law on the binary lane, built from the header table with
    the websockets package, against ``trio-duplex serve --engine voice`` (24 kHz PCM16)."""
    server = serve("--engine", "voice")
    code = _readme_block("## Audio on the binary lane")
    assert 'URL = "ws://127.0.0.1:8765/v1/duplex"' in code
    code = code.replace("ws://127.0.0.1:8765/v1/duplex", server.url)
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    ulaw = {"format": "g711_ulaw", "rate": 8000}
    assert namespace["created"]["session"]["audio"] == {
        "wire": "binary",
        "input": ulaw,
        "output": ulaw,
    }
    frames = namespace["frames"]
    seqs = [seq for seq, _ in frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # "hi": a 6-frame tone (120 ms) at 8 kHz μ-law, one byte a sample, the resampler's
    # tail flushed before response.done.
    assert abs(sum(len(audio) for _, audio in frames) - 6 * 160) <= 160
    assert any(audio.strip(b"\xff\x7f") for _, audio in frames)  # a tone, not silence


async def test_barge_in_through_the_server(autojump_clock: Any) -> None:
    """No audio frame is sequenced after response.cancel was processed."""
    async with running_server(ServerConfig(), VoiceEngine) as sim:
        client, _ = await sim.open_session()
        await client.send({"type": "input.text.append", "text": "a long sentence to speak"})
        events: list[dict[str, Any]] = []
        while sum(e["type"] == "response.output_audio.delta" for e in events) < 5:
            events.append(await client.receive())
        await client.send({"type": "response.cancel"})
        while events[-1]["type"] != "response.cancelled":
            events.append(await client.receive())
        await trio.sleep(1)  # virtual time: 50 more frames' worth, had it gone on
        await client.send({"type": "session.heartbeat"})
        assert (await client.receive())["type"] == "session.heartbeat_ack"  # nothing between
        kinds = [e["type"] for e in events]
        assert kinds[0] == "response.created"
        assert "response.done" not in kinds
        seqs = [e["server_event_seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        # the frames that raced the cancel are at most the one in flight
        assert kinds.count("response.output_audio.delta") <= 6


def test_the_testing_guide_example_runs() -> None:
    """docs/testing.md's race example, run as its reader would run it."""
    text = (README.parent / "docs" / "testing.md").read_text()
    start = text.index("## Example: `session.created` in flight")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/testing.md", "exec"), namespace)
    test = namespace["test_created_in_flight_when_the_peer_goes"]
    trio.run(test, None, clock=trio.testing.MockClock(autojump_threshold=0))


def _layout_paths() -> list[Path]:
    """Every path the README's Layout table names (a later bare name in a cell is relative
    to the first one's folder)."""
    text = README.read_text()
    table = text[text.index("## Layout") :]
    paths = []
    for row in re.findall(r"^\| (`[^|]*`) \|", table, re.M):
        names = re.findall(r"`([^`]+)`", row)
        first = Path(names[0])
        base = first if names[0].endswith("/") else first.parent
        paths.append(first)
        paths.extend(Path(n) if "/" in n.rstrip("/") else base / n for n in names[1:])
    return paths


def test_the_readme_layout_table_matches_the_tree() -> None:
    root = README.parent
    named = _layout_paths()
    missing = [str(p) for p in named if not (root / p).exists()]
    assert not missing, f"the README's layout names paths that do not exist: {missing}"
    described = {str(p) for p in named}
    folders = {str(p).rstrip("/") for p in named if (root / p).is_dir()}
    modules = sorted((root / "trio_duplex").rglob("*.py"))
    undescribed = [
        str(m.relative_to(root))
        for m in modules
        if m.name not in ("__init__.py", "__main__.py")
        and str(m.relative_to(root)) not in described
        and str(m.parent.relative_to(root)) not in folders
    ]
    assert not undescribed, f"modules the README's layout does not mention: {undescribed}"
