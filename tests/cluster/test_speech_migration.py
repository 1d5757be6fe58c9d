"""A speech session moved mid-sentence by a deploy (a cluster node's drain migrates it):
SIGTERM its node while the user is speaking, resume on another node, finish the sentence
there, and the transcript is the one the sentence gets without a move.

Real ``trio-duplex serve --engine speech`` nodes, a real redis-server, the ``websockets``
package as the client, and the outside set's first sentence said by espeak-ng at test
time (tests/speech_audio.py).

The moved transcript must equal the unmoved one word for word: recognition is
deterministic (the same samples give the same decode), and the snapshot carries the audio
the turn detector holds (since its last quiet point, the prefix padding included), so the
new node's detector hears the turn again from the same sample and decodes the same audio.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable
from typing import Any

import pytest
import trio
from websockets.exceptions import ConnectionClosed

from ..helpers import ServerProcess
from ..speech_audio import FRAME, frames, needs_speech, sentences, spoken, warm_up
from .test_relay import open_session, receive, resume, send, ws_to
from .test_serve import TIMEOUT

pytestmark = [pytest.mark.integration, pytest.mark.media, needs_speech]

Event = dict[str, Any]


def appends(pcm: bytes, first_seq: int = 1) -> list[Event]:
    return [
        {
            "type": "input_audio_buffer.append",
            "client_event_seq": seq,
            "audio": base64.b64encode(frame).decode(),
        }
        for seq, frame in enumerate(frames(pcm), first_seq)
    ]


async def heard_until(ws: Any, kind: str, heard: list[Event]) -> Event:
    while True:
        event = await receive(ws)
        if "server_event_seq" in event:
            heard.append(event)
        if event["type"] == kind:
            return event


async def test_sigterm_mid_sentence_moves_the_turn_and_loses_no_word(
    speech_parts: None, nodes: Callable[..., list[ServerProcess]]
) -> None:
    # (flite speaks the replies: what moves is the turn being heard, not the voice)
    speech = ("--engine", "speech", "--speech-recognisers", "1", "--speech-voice", "flite")
    a, b = nodes("ab", "--relay-port", "0", *speech)
    [text] = sentences(1)
    pcm = spoken(text)
    half = len(pcm) // 2 // FRAME * FRAME
    sent = appends(pcm)

    # Each node's recogniser pool starts with its first speech session: one turn each
    # first, so that no wait below (TIMEOUT an event) includes a pool's start.
    async def warm(url: str) -> None:
        await trio.to_thread.run_sync(warm_up, url)

    async with trio.open_nursery() as nursery:
        for node in (a, b):
            nursery.start_soon(warm, node.url)
    with trio.fail_after(TIMEOUT * 3):
        async with ws_to(b.url) as ws:  # the sentence without a move, for comparison
            await open_session(ws)
            for event in sent:
                await send(ws, event)
            whole = await heard_until(ws, "input_audio.transcript.done", [])
            await send(ws, {"type": "session.close"})
        heard: list[Event] = []
        async with ws_to(a.url) as ws:
            created = await open_session(ws)
            for event in sent[: half // FRAME]:
                await send(ws, event)
            await heard_until(ws, "input_audio_buffer.speech_started", heard)
            a.proc.send_signal(signal.SIGTERM)  # the deploy, mid-sentence
            with pytest.raises(ConnectionClosed):
                while True:
                    event = await receive(ws)
                    if "server_event_seq" in event:
                        heard.append(event)
        assert await trio.to_thread.run_sync(a.wait, TIMEOUT * 2) == 0
        async with ws_to(b.url) as ws:
            await send(ws, resume(created, created["resume_token"], heard[-1]["server_event_seq"]))
            resumed = await receive(ws)
            assert resumed["type"] == "session.resumed", resumed
            for event in sent[resumed["last_received_client_event_seq"] :]:
                await send(ws, event)  # the rest of the sentence, and what A never took
            done = await heard_until(ws, "input_audio.transcript.done", heard)
            await heard_until(ws, "response.created", heard)
            await send(ws, {"type": "session.close"})
    assert whole["text"].split(), whole  # (how well: tests/server/test_speech_serve.py)
    assert done["text"] == whole["text"]
    assert "handed over to the cluster" in a.log
    seqs = [e["server_event_seq"] for e in heard]
    assert seqs == list(range(1, len(seqs) + 1))  # none lost, none twice
    kinds = [e["type"] for e in heard]
    assert kinds.count("input_audio_buffer.speech_started") == 1  # not announced twice
