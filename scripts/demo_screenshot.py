"""Take docs/demo.png: the demo page in use, in a headless Chromium.

Starts ``trio-duplex serve --engine voice --demo`` on a free port, opens the page in
Debian's Chromium through Playwright (the ``test`` extra), speaks a sentence, drops the
connection while the engine streams (the session resumes), then barges in on a second
response, and saves a screenshot of the page with its timeline and counters::

    python scripts/demo_screenshot.py [OUTPUT.png]
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "demo.png"
WAIT_MS = 20_000


def until(page: Page, predicate: str) -> None:
    page.wait_for_function(f"() => ({predicate})(window.demo)", timeout=WAIT_MS)


def speak(page: Page, text: str) -> None:
    page.get_by_label("Text to send (a typed turn)").fill(text)
    page.get_by_role("button", name="Send").click()


def use_the_page(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.get_by_test_id("state")).to_have_text("attached", timeout=WAIT_MS)
    # The fake microphone beeps: a threshold above its beeps, so that only the button
    # barges in here (tests/browser checks the level's barge-in).
    page.get_by_label("Barge-in threshold").fill("0.5")
    page.get_by_role("button", name="Microphone").click()
    until(page, "(d) => d.micChunks >= 25")
    speak(page, "hello there this is full duplex audio over one resumable session")
    until(page, "(d) => d.lastSeq >= 60")
    page.get_by_role("button", name="Drop connection").click()
    expect(page.get_by_test_id("resumes")).to_have_text("1", timeout=WAIT_MS)
    until(page, "(d) => d.responses.done === 1")
    speak(page, "now barge in while the engine is still speaking this sentence")
    page.wait_for_function(
        "() => document.getElementById('transcript').textContent.split(' ').length >= 4",
        timeout=WAIT_MS,
    )
    page.get_by_role("button", name="Barge in").click()
    until(page, "(d) => d.responses.cancelled === 1 && d.buffered === 0")


def main() -> int:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    command = [sys.executable, "-m", "trio_duplex", "serve", "--engine", "voice", "--demo"]
    server = subprocess.Popen(
        [*command, "--port", "0"], stderr=subprocess.PIPE, text=True, encoding="utf-8"
    )
    try:
        assert server.stderr is not None
        for line in server.stderr:  # the ready line: "serving ws://127.0.0.1:PORT/v1/duplex"
            if match := re.search(r"serving ws://([^/]+)/", line):
                break
        else:
            raise SystemExit("the server exited before it was ready")
        # Keep reading its log, so that a full pipe never blocks it.
        threading.Thread(target=server.stderr.read, daemon=True).start()
        with sync_playwright() as driver:
            browser = driver.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--use-fake-ui-for-media-stream",
                    "--use-fake-device-for-media-stream",  # a microphone that beeps
                    "--autoplay-policy=no-user-gesture-required",
                ],
            )
            page = browser.new_page(viewport={"width": 1200, "height": 820})
            use_the_page(page, f"http://{match.group(1)}/")
            page.screenshot(path=str(output))
            browser.close()
    finally:
        server.terminate()
        server.wait(15)
    print(f"wrote {output} ({output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
