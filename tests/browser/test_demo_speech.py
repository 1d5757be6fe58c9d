"""The demo page in a real headless Chromium against a real ``trio-duplex serve --engine
speech --demo``: a conversation. Chromium's fake microphone plays a sentence that
espeak-ng says at test time (then silence, for the end of the turn); the page shows what
the engine heard and its reply, and plays the reply's audio. A typed turn is answered
aloud too, and speech over a reply stops its playback (the server's barge-in).

PocketSphinx hears espeak-ng's voice poorly (docs/speech.md): the sentence is one it gets
right, and the checks ask for its key words.
"""

from __future__ import annotations

import subprocess
import wave
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]
from playwright.sync_api import Browser, Playwright, expect

from ..helpers import Serve, ServerProcess
from ..speech_audio import WEATHER, needs_speech
from .conftest import MIC_RATE, chromium
from .page import WAIT_MS, Demo

pytestmark = [pytest.mark.integration, needs_speech]

LEAD_S = 0.5  # silence before the sentence ...
TAIL_S = 5.5  # ... and after it: the turn ends and its reply plays whole before the loop
KEY_WORDS = {"what", "weather"}  # WEATHER is heard as "what is the weather like to do" (or "dig")


def write_sentence_wav(path: Path, text: str) -> None:
    """``text`` said by espeak-ng, at the microphone's rate, between silences (Chromium
    plays the file in a loop)."""
    spoken = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text],
        capture_output=True,
        check=True,
    )
    assert spoken.returncode == 0
    with wave.open(str(path), "rb") as file:
        rate = file.getframerate()
        pcm = np.frombuffer(file.readframes(file.getnframes()), dtype=np.int16)
    at_mic_rate = soxr.resample(pcm, rate, MIC_RATE).astype(np.int16)
    silence = np.zeros(int(LEAD_S * MIC_RATE), dtype=np.int16)
    tail = np.zeros(int(TAIL_S * MIC_RATE), dtype=np.int16)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(MIC_RATE)
        file.writeframes(np.concatenate([silence, at_mic_rate, tail]).tobytes())


@pytest.fixture(scope="module")
def speaking_browser(
    playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "sentence.wav"
    write_sentence_wav(wav, WEATHER)
    with chromium(playwright, wav) as browser:
        yield browser


@pytest.fixture(scope="module")
def speech_server(serve_module: Serve) -> ServerProcess:
    return serve_module("--engine", "speech", "--demo")


@pytest.fixture
def demo(speaking_browser: Browser, speech_server: ServerProcess) -> Iterator[Demo]:
    with Demo.in_new_context(speaking_browser, speech_server) as page:
        yield page


def reply(demo: Demo) -> str:
    return demo.page.get_by_test_id("transcript").text_content() or ""


def test_a_spoken_sentence_is_heard_and_answered_aloud(demo: Demo) -> None:
    microphone = demo.page.get_by_role("button", name="Microphone")
    microphone.click()
    expect(microphone).to_have_attribute("aria-pressed", "true")
    demo.until("(d) => d.heard.length >= 1")
    seen = demo.seen()
    heard = seen["heard"][0]
    assert KEY_WORDS <= set(heard.split()), heard
    # Before it, "You said" grew word by word as the first pass firmed them up.
    firming = seen["firming"]
    assert firming, "no transcript.delta shown"
    assert all(later.startswith(f"{earlier} ") for earlier, later in pairwise(firming))
    assert "  " not in firming[-1] and firming[-1] == firming[-1].strip()
    heard_box = demo.page.get_by_test_id("heard")
    expect(heard_box).to_have_text(heard)
    expect(heard_box).to_have_attribute("data-final", "true")
    # Then the reply: its text, and its audio played through the jitter buffer (a
    # second of it, at the page's 24 kHz), played whole.
    demo.until("(d, from) => d.played >= from + 24_000", seen["played"])
    demo.until("(d) => d.responses.done === 1")
    assert reply(demo) == f"you said: {heard}."
    microphone.click()
    rows = demo.page.get_by_test_id("timeline").locator("tr")
    expect(rows.filter(has_text="input_audio.transcript.done")).to_have_count(1)


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
    # The sentence that barged in is a turn of its own, answered.
    demo.until("(d) => d.heard.length >= 1 && d.responses.done === 1")
    assert reply(demo) == f"you said: {demo.seen()['heard'][0]}."
    expect(demo.page.get_by_test_id("server-barge-ins")).to_have_text("1", timeout=WAIT_MS)
