"""The media worker (trio_duplex/media/_worker.py) against Debian's headless Chromium:
the page posts what the agents SDK posts (``createOffer().sdp``: no candidates, no
end-of-candidates), and the call connects by peer-reflexive discovery on the worker's
127.0.0.1 host candidate (docs/plans/webrtc.md §1.4). Text both ways on ``oai-events``,
our Opus packets heard with energy (``getStats``), the fake microphone's audio as MIC
chunks, and the page's ``pc.close()`` as ``STATE closed``.

Playwright's async API under ``asyncio.run`` (the worker's harness is asyncio too); the
page comes from a local ``http.server`` (127.0.0.1 is a secure context for
``getUserMedia``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright

from trio_duplex.media import wire
from trio_duplex.media.wire import Kind

from ..media.rtc import CONFIG, WorkerProcess, opus_packets, rms
from .conftest import CHROMIUM, static_origin, write_mic_wav

PAGE = '<!doctype html><html><head><link rel="icon" href="data:,"></head><body></body></html>'

OFFER = """async () => {
  const pc = new RTCPeerConnection();
  window.pc = pc;
  window.messages = [];
  const dc = pc.createDataChannel("oai-events");
  window.dc = dc;
  dc.onmessage = (e) => window.messages.push(e.data);
  window.dcOpen = new Promise((resolve) => { dc.onopen = resolve; });
  pc.ontrack = (e) => {
    // Played, not muted: inbound-rtp's totalAudioEnergy counts only audio played out
    // (a muted element shows 0 and concealed samples).
    const audio = new Audio();
    audio.autoplay = true;
    audio.srcObject = e.streams[0] || new MediaStream([e.track]);
    document.body.appendChild(audio);
  };
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(mic.getTracks()[0], mic);
  await pc.setLocalDescription(await pc.createOffer());
  return pc.localDescription.sdp.replace(/^a=(candidate|end-of-candidates).*\\r\\n/gm, "");
}"""

INBOUND = """async () => {
  // No event says stats changed: poll them, until all 100 packets are in (or 10 s).
  const inbound = async () => {
    const out = {};
    (await pc.getStats()).forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        Object.assign(out, {
          energy: s.totalAudioEnergy, samples: s.totalSamplesReceived,
          packets: s.packetsReceived, lost: s.packetsLost,
        });
      }
    });
    return out;
  };
  const deadline = Date.now() + 10000;
  let stats = await inbound();
  while (!(stats.packets >= 100) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    stats = await inbound();
  }
  return stats;
}"""


@pytest.fixture
def page_url(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "index.html").write_text(PAGE)
    with static_origin(tmp_path) as origin:
        yield f"{origin}/index.html"


def test_chromium_calls_the_media_worker(page_url: str, tmp_path: Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    wav = tmp_path / "mic.wav"
    write_mic_wav(wav)

    async def main() -> None:
        worker = await WorkerProcess.start({**CONFIG, "log_level": "WARNING"})
        try:
            async with async_playwright() as driver:
                browser = await driver.chromium.launch(
                    executable_path=CHROMIUM,
                    headless=True,
                    args=[
                        "--no-sandbox",
                        "--use-fake-ui-for-media-stream",
                        "--use-fake-device-for-media-stream",
                        f"--use-file-for-fake-audio-capture={wav}",
                        "--autoplay-policy=no-user-gesture-required",
                        "--allow-loopback-in-peer-connection",
                        "--disable-features=WebRtcHideLocalIpsWithMdns",
                    ],
                )
                try:
                    await call(worker, await browser.new_page())
                finally:
                    await browser.close()
        finally:
            assert await worker.stop() == 0

    async def call(worker: WorkerProcess, page: Any) -> None:
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await page.goto(page_url)
        offer = await page.evaluate(OFFER)
        assert "a=candidate" not in offer and "a=end-of-candidates" not in offer
        worker.offer(1, offer, max_event_bytes=65536)
        answer = (await worker.next(1, Kind.ANSWER)).payload.decode()
        await page.evaluate("(sdp) => pc.setRemoteDescription({type: 'answer', sdp})", answer)
        await worker.next(1, Kind.DC_OPEN)
        await page.evaluate("() => window.dcOpen")
        assert (await worker.next(1, Kind.STATE)).payload == b"connected"

        worker.send(Kind.DC_TEXT, 1, b'{"type":"session.created"}')
        await page.wait_for_function("() => window.messages.length > 0")
        assert await page.evaluate("() => window.messages") == ['{"type":"session.created"}']
        await page.evaluate('() => dc.send(\'{"type":"session.update"}\')')
        assert (await worker.next(1, Kind.DC_TEXT)).payload == b'{"type":"session.update"}'

        for seq, packet in enumerate(opus_packets(100), 1):  # 2 s of a tone
            worker.send(Kind.AUDIO, 1, wire.pack_audio(seq, packet))
        await worker.wait_for(
            lambda f: (
                f.call == 1
                and f.kind == Kind.PLAYED
                and wire.unpack_played(f.payload) == (100, True, False)
            )
        )
        inbound = await page.evaluate(INBOUND)
        assert inbound["packets"] == 100 and inbound["lost"] == 0, inbound
        assert inbound["energy"] > 0.01, inbound

        await worker.wait_for(
            lambda f: f.call == 1 and f.kind == Kind.MIC and rms(f.payload) > 1000
        )
        assert {len(f.payload) for f in worker.of(1, Kind.MIC)} == {1920}

        await page.evaluate("() => pc.close()")
        await worker.next(1, Kind.CLOSED)
        assert [f.payload for f in worker.of(1, Kind.STATE)] == [b"connected", b"closed"]
        assert errors == []

    asyncio.run(main())
