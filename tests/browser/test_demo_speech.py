"""The demo page in a real headless Chromium against a real ``trio-duplex serve --engine
speech --demo``: a conversation. Chromium's fake microphone plays the outside set's first
sentences, said at test time by espeak-ng and flite in turn (tests/speech_audio.py), each
followed by silence for the end of its turn; the page shows what the engine heard (judged
by pooled word error rate) and its reply, and plays the reply's audio. A typed turn is
answered aloud too, and speech over a reply stops its playback (the server's barge-in).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, Playwright, expect

from ..helpers import Serve, ServerProcess
from ..speech_audio import (
    RATE,
    VOICES,
    at_rate,
    judge,
    needs_speech,
    reply_to,
    said,
    sentences,
    write_wav,
)
from .conftest import MIC_RATE, chromium
from .page import WAIT_MS, Demo

pytestmark = [pytest.mark.integration, pytest.mark.media, needs_speech]

COUNT = 6  # sentences, the voices taking turns: ~30 s of the microphone
LEAD_S = 0.5  # silence before the first sentence ...
GAP_S = 1.5  # ... after each (the turn ends; the next one barges in on its reply) ...
TAIL_S = 5.5  # ... and after the last: its reply plays whole before the file loops
TURNS_MS = 60_000  # the wait for every turn heard (the microphone plays in real time)


def write_sentences_wav(path: Path, texts: list[str]) -> None:
    """``texts`` said by the voices in turn, at the microphone's rate, between silences
    (Chromium plays the file in a loop)."""
    parts = [np.zeros(int(LEAD_S * RATE), dtype=np.int16)]
    for n, text in enumerate(texts):
        parts.append(np.frombuffer(said(text, VOICES[n % len(VOICES)]), dtype=np.int16))
        parts.append(np.zeros(int(GAP_S * RATE), dtype=np.int16))
    parts.append(np.zeros(int(TAIL_S * RATE), dtype=np.int16))
    write_wav(path, at_rate(np.concatenate(parts).tobytes(), RATE, MIC_RATE), MIC_RATE)


@pytest.fixture(scope="module")
def speaking_browser(
    playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "sentence.wav"
    write_sentences_wav(wav, sentences(COUNT))
    with chromium(playwright, wav) as browser:
        yield browser


@pytest.fixture(scope="module")
def speech_server(speech_parts: None, serve_module: Serve) -> ServerProcess:
    return serve_module("--engine", "speech", "--demo", ready_timeout=60)


@pytest.fixture
def demo(speaking_browser: Browser, speech_server: ServerProcess) -> Iterator[Demo]:
    with Demo.in_new_context(speaking_browser, speech_server) as page:
        yield page


def reply(demo: Demo) -> str:
    return demo.page.get_by_test_id("transcript").text_content() or ""


def test_spoken_sentences_are_heard_right_and_answered_aloud(demo: Demo) -> None:
    microphone = demo.page.get_by_role("button", name="Microphone")
    microphone.click()
    expect(microphone).to_have_attribute("aria-pressed", "true")
    texts = sentences(COUNT)
    demo.page.wait_for_function(
        "(n) => window.demo.heard.length >= n", arg=len(texts), timeout=TURNS_MS
    )
    seen = demo.seen()
    heard = seen["heard"][: len(texts)]
    judge(texts, heard)
    # Before each, "You said" grew word by word as the partial decodes firmed them up.
    firming = seen["firming"]
    assert firming, "no transcript.delta shown"
    grown = [(a, b) for a, b in pairwise(firming) if b.startswith(a)]
    assert all(later.startswith(f"{earlier} ") for earlier, later in grown), firming
    heard_box = demo.page.get_by_test_id("heard")
    expect(heard_box).to_have_text(heard[-1])
    expect(heard_box).to_have_attribute("data-final", "true")
    # Then the last one's reply: its text, and its audio played through the jitter
    # buffer (a second of it, at the page's 24 kHz), played whole.
    demo.until("(d, from) => d.played >= from + 24_000", seen["played"])
    demo.until("(d) => d.responses.done >= 1 && d.buffered === 0")
    assert reply(demo) == reply_to(heard[-1])
    microphone.click()
    rows = demo.page.get_by_test_id("timeline").locator("tr")
    expect(rows.filter(has_text="input_audio.transcript.done")).to_have_count(len(texts))


def test_a_typed_turn_is_answered_aloud(demo: Demo) -> None:
    demo.speak("hello")
    demo.until("(d) => d.responses.done === 1")
    assert reply(demo) == "you said: hello."
    assert demo.number("audio-out-ms") > 500
    demo.until("(d) => d.played > 24 * 500 && d.buffered === 0")
    assert demo.seen()["heard"] == []  # the microphone was off: nothing heard


def test_speaking_over_a_reply_stops_its_playback(demo: Demo) -> None:
    # The page's own level barge-in out of the way (its threshold at the top): the stop
    # must come from the server's speech_started.
    demo.page.get_by_label("Barge-in threshold").fill("0.5")
    demo.speak(" ".join(["this reply is long enough to be spoken over"] * 3))
    demo.until("(d) => d.played >= 24 * 200")  # 200 ms of the reply played
    demo.page.get_by_role("button", name="Microphone").click()
    demo.until("(d) => d.responses.cancelled === 1 && d.flushes >= 1 && d.buffered === 0")
    seen = demo.seen()
    assert seen["serverBargeIns"] == 1
    assert seen["bargeIns"] == 0  # not the page's threshold
    demo.until("(d, reports) => d.reports >= reports + 5", seen["reports"])
    assert demo.seen()["played"] == seen["played"] == seen["playedAtFlush"]
    assert seen["responses"]["done"] == 0
    # The sentence that barged in is a turn of its own, answered (its reply starts; the
    # file's next sentence barges in on that one in turn, so it may not end).
    demo.until("(d) => d.heard.length >= 1 && d.responses.created >= 2")
    expect(demo.page.get_by_test_id("transcript")).to_contain_text("you said:", timeout=WAIT_MS)
