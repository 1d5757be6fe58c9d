"""The demo page in a real headless Chromium against a real ``trio-duplex serve --engine
voice --demo``: it opens a session, sends the (fake) microphone on the binary lane and
the server receives it, plays the engine's audio through its jitter buffer, resumes
after "drop connection" with every event once and in order, and stops playback at once
on barge-in (the button, or the microphone's level).

What the page saw is read from its DOM (``data-testid``) and from ``window.demo``; what
the server saw from its ``/metrics`` and from the session's final ``usage``. Every wait
is on a page or server condition with a deadline, never a sleep.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Browser, expect
from prometheus_client.parser import text_string_to_metric_families

from trio_duplex.engines.voice import frame_count

from ..helpers import Serve, ServerProcess
from .page import WAIT_MS, Demo

pytestmark = pytest.mark.integration

SHORT = "one two three four"
LONG = " ".join(["barge", "in", "while", "the", "engine", "speaks", "this", "long", "sentence"] * 3)


def audio_ms(text: str) -> int:
    """The milliseconds of audio the voice engine speaks ``text`` as (20 ms frames)."""
    return frame_count(text) * 20


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """The value of one sample of the server's ``/metrics``."""
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def until_server(check: Callable[[], bool], timeout: float = WAIT_MS / 1000) -> None:
    """Poll the server's observable state until ``check`` holds, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.05)  # a poll interval of an outside process, not a wait for an outcome


@pytest.fixture
def demo(browser: Browser, demo_server: ServerProcess) -> Iterator[Demo]:
    with Demo.in_new_context(browser, demo_server) as page:
        yield page


def test_the_page_opens_a_session(demo: Demo, demo_server: ServerProcess) -> None:
    session_id = demo.page.get_by_test_id("session-id").text_content() or ""
    assert session_id.startswith("sess_")
    assert metric(demo_server, "trio_duplex_sessions", state="attached") >= 1
    assert demo.seen()["states"][-1] == "attached"


def test_microphone_audio_reaches_the_server(demo: Demo, demo_server: ServerProcess) -> None:
    events_in = metric(demo_server, "trio_duplex_events_total", direction="in")
    microphone = demo.page.get_by_role("button", name="Microphone")
    microphone.click()
    # A second of audio, the fake microphone's tone among it (the level the page measured).
    demo.until("(d) => d.micChunks >= 50 && d.maxLevel > 0.2")
    expect(microphone).to_have_attribute("aria-pressed", "true")
    microphone.click()  # off again
    expect(microphone).to_have_attribute("aria-pressed", "false")
    # The session's usage, in its session.closed, has every millisecond the page sent:
    # its counter (rendered from the client's stats, so maybe a chunk behind when read
    # at once: this was flaky) comes to exactly the server's figure.
    demo.page.get_by_role("button", name="Close session").click()
    demo.until("(d) => d.closed !== null")
    closed = demo.seen()["closed"]
    assert closed["type"] == "session.closed"
    received_ms = closed["usage"]["audio_ms_in"]
    assert received_ms >= 1000
    expect(demo.page.get_by_test_id("audio-in-ms")).to_have_text(str(received_ms), timeout=WAIT_MS)
    # ... and the server counted each 20 ms chunk as a client event.
    until_server(
        lambda: (
            metric(demo_server, "trio_duplex_events_total", direction="in")
            >= events_in + received_ms // 20
        )
    )


def test_the_engines_audio_is_played_through_the_jitter_buffer(demo: Demo) -> None:
    demo.speak(SHORT)
    demo.until("(d) => d.responses.done === 1")
    expected = audio_ms(SHORT)
    assert demo.number("audio-out-ms") == expected
    # The playback worklet consumed every sample, then its buffer was empty.
    demo.until("(d, ms) => d.played === ms * 24 && d.buffered === 0", expected)
    expect(demo.page.get_by_test_id("audio-played-ms")).to_have_text(str(expected))
    assert (demo.page.get_by_test_id("transcript").text_content() or "") == SHORT
    rows = demo.page.get_by_test_id("timeline").locator("tr")
    expect(rows.filter(has_text="response.done")).to_have_count(1)
    expect(rows.filter(has_text="input.text.append")).to_have_count(1)


def test_drop_connection_resumes_with_no_event_lost_or_duplicated(
    demo: Demo, demo_server: ServerProcess
) -> None:
    resumed = metric(demo_server, "trio_duplex_resumes_total", result="ok")
    demo.speak(SHORT)
    demo.until("(d) => d.lastSeq >= 20")  # the engine is streaming
    demo.page.get_by_role("button", name="Drop connection").click()
    expect(demo.page.get_by_test_id("resumes")).to_have_text("1", timeout=WAIT_MS)
    expect(demo.page.get_by_test_id("state")).to_have_text("attached")
    demo.until("(d) => d.responses.done === 1")
    seen = demo.seen()
    assert "resuming" in seen["states"]
    # Every server event once, in order: seqs 1..N with no gap and no duplicate.
    assert seen["seqs"] == list(range(1, seen["lastSeq"] + 1))
    assert demo.number("seq-gaps") == 0
    assert demo.number("audio-out-ms") == audio_ms(SHORT)  # no audio lost
    assert metric(demo_server, "trio_duplex_resumes_total", result="ok") == resumed + 1


def stopped_at_once(demo: Demo) -> None:
    """After a barge-in: response.cancelled came, the jitter buffer is empty, and no
    more audio is played (several playback reports later, not a sample more)."""
    demo.until("(d) => d.responses.cancelled === 1 && d.flushes >= 1 && d.buffered === 0")
    seen = demo.seen()
    demo.until("(d, reports) => d.reports >= reports + 5", seen["reports"])
    later = demo.seen()
    assert later["played"] == seen["played"] == seen["playedAtFlush"] > 0
    assert later["responses"]["done"] == 0
    assert demo.number("buffered-ms") == 0
    assert demo.number("audio-played-ms") < audio_ms(LONG)


def test_barge_in_stops_playback_at_once(demo: Demo) -> None:
    demo.speak(LONG)
    demo.until("(d) => d.played >= 24 * 200")  # 200 ms played
    demo.page.get_by_role("button", name="Barge in").click()
    stopped_at_once(demo)
    rows = demo.page.get_by_test_id("timeline").locator("tr")
    expect(rows.filter(has_text="response.cancel")).to_have_count(2)  # sent, and the answer


def test_speaking_into_the_microphone_barges_in(demo: Demo) -> None:
    demo.speak(LONG)
    demo.until("(d) => d.played >= 24 * 100")
    microphone = demo.page.get_by_role("button", name="Microphone")
    microphone.click()
    # The fake microphone's tone comes round within its loop (1.5 s): over the threshold.
    stopped_at_once(demo)
    assert demo.number("barge-ins") == 1
    rows = demo.page.get_by_test_id("timeline").locator("tr")
    cells = rows.filter(has_text="barge-in").locator("td")
    expect(cells).to_have_text(["", "• page", "barge-in", "voice"])
    microphone.click()


def test_the_page_is_the_origin_allow_origin_names(browser: Browser, serve: Serve) -> None:
    # Same-origin: the page's Origin header is its own, which --allow-origin may name.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    origin = f"http://127.0.0.1:{port}"
    server = serve("--engine", "voice", "--demo", "--port", str(port), "--allow-origin", origin)
    context = browser.new_context()
    try:
        demo = Demo(context.new_page(), server)
        demo.open()
        demo.check_clean()
    finally:
        context.close()
