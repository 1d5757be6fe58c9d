"""The demo page's WebRTC mode (``/?transport=webrtc`` on ``serve --demo --calls``) in a
real headless Chromium: the JavaScript client's ``transport: "webrtc"`` opens the session
as a call (OpenAI's dialect on the data channel, the fake microphone and the reply as
media tracks), a typed turn is answered with audio the page plays, and "Drop
connection" closes the peer connection: a new call resumes the session, every event
once and in order. (The page's WebSocket mode: test_demo_page.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Playwright, expect

from ..helpers import Serve, ServerProcess
from .conftest import chromium, write_mic_wav
from .page import WAIT_MS, Demo

pytestmark = pytest.mark.integration

CALL_ARGS = (
    "--allow-loopback-in-peer-connection",  # offer 127.0.0.1, where the server listens
    "--disable-features=WebRtcHideLocalIpsWithMdns",  # raw addresses, not .local names
)


@pytest.fixture(scope="module")
def call_browser(
    playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "mic.wav"
    write_mic_wav(wav)
    with chromium(playwright, wav, CALL_ARGS) as browser:
        yield browser


@pytest.fixture(scope="module")
def call_server(serve_module: Serve) -> ServerProcess:
    return serve_module(
        "--engine", "voice", "--demo", "--calls", "--call-allow-peer", "127.0.0.0/8"
    )


def inbound_energy(demo: Demo) -> float:
    """What the page's <audio> has played of the call's audio: the track's frames
    received with energy (a MediaStream's track has no stats of its own here, so the
    page's element is sampled through an AudioContext analyser)."""
    value: float = demo.page.evaluate(
        """async () => {
          const stream = document.getElementById("remote-audio").srcObject;
          if (!stream) return 0;
          const context = new AudioContext();
          const analyser = context.createAnalyser();
          context.createMediaStreamSource(stream).connect(analyser);
          const samples = new Float32Array(analyser.fftSize);
          let most = 0;
          for (let i = 0; i < 40; i++) {
            await new Promise((resolve) => setTimeout(resolve, 25));
            analyser.getFloatTimeDomainData(samples);
            for (const s of samples) most = Math.max(most, Math.abs(s));
          }
          await context.close();
          return most;
        }"""
    )
    return value


def test_the_demo_holds_its_session_as_a_call_and_resumes_it(
    call_browser: Browser, call_server: ServerProcess
) -> None:
    context = call_browser.new_context()
    try:
        demo = Demo(context.new_page(), call_server)
        demo.page.goto(demo.origin + "/?transport=webrtc")
        expect(demo.page.get_by_test_id("state")).to_have_text("attached", timeout=WAIT_MS)
        expect(demo.page.get_by_test_id("transport")).to_have_text("WebRTC")
        assert (demo.page.get_by_test_id("session-id").text_content() or "").startswith("sess_")
        # A typed turn: the voice engine's reply, its transcript on the data channel and
        # its audio on the track, which the page plays.
        demo.speak("one two three four five six seven eight nine ten")
        demo.until("(d) => d.responses.created >= 1")
        assert inbound_energy(demo) > 0.01  # (a silent track measures 0)
        demo.until("(d) => d.responses.done >= 1")
        expect(demo.page.get_by_test_id("transcript")).not_to_have_text("")
        # Drop the connection: the peer connection closes, a new call resumes.
        demo.page.get_by_role("button", name="Drop connection").click()
        demo.until("(d) => d.states.includes('detached') || d.states.includes('resuming')")
        expect(demo.page.get_by_test_id("state")).to_have_text("attached", timeout=WAIT_MS)
        expect(demo.page.get_by_test_id("resumes")).to_have_text("1")
        demo.speak("and once more")
        demo.until("(d) => d.responses.done >= 2")
        seen = demo.seen()
        seqs = seen["seqs"]
        assert seqs == sorted(set(seqs)) and seen["duplicates"] == 0, seqs
        assert call_server.log.count("session ") >= 1 and "Traceback" not in call_server.log
        demo.check_clean()
    finally:
        context.close()
