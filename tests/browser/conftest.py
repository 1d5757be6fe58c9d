"""A real headless Chromium (Debian's ``/usr/bin/chromium``, see .ci/run) driven by
Playwright's sync API, with a fake microphone that plays a WAV file written here, and a
``trio-duplex serve --engine voice --demo`` subprocess for it to open the page of.

The tests are plain (not trio) functions: Playwright's sync API runs its own event loop,
which must not be nested in pytest-trio's.
"""

from __future__ import annotations

import functools
import http.server
import math
import os
import struct
import threading
import wave
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Playwright, sync_playwright

from ..helpers import Serve, ServerProcess

CHROMIUM = "/usr/bin/chromium"
MIC_RATE = 48_000
TONE_S = 0.3  # the fake microphone: a loud tone (the user speaks) ...
SILENCE_S = 1.2  # ... then silence; Chromium plays the file in a loop
TONE_AMPLITUDE = 0.5


def write_mic_wav(path: Path) -> None:
    """A 440 Hz tone then silence, mono PCM16: loud enough to pass the page's barge-in
    threshold, quiet in between."""
    tone = [
        round(TONE_AMPLITUDE * 32767 * math.sin(2 * math.pi * 440 * n / MIC_RATE))
        for n in range(int(TONE_S * MIC_RATE))
    ]
    samples = tone + [0] * int(SILENCE_S * MIC_RATE)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(MIC_RATE)
        file.writeframes(struct.pack(f"<{len(samples)}h", *samples))


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    with sync_playwright() as driver:
        yield driver


@contextmanager
def chromium(
    playwright: Playwright, microphone: Path, extra_args: Sequence[str] = ()
) -> Iterator[Browser]:
    """Headless Chromium whose fake microphone plays ``microphone`` (a WAV), in a loop,
    launched with ``extra_args`` too; closed on leaving."""
    browser = playwright.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=[
            "--no-sandbox",  # CI and these sessions run as root
            "--use-fake-ui-for-media-stream",  # grant the microphone without asking
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}",
            "--autoplay-policy=no-user-gesture-required",
            *extra_args,
        ],
    )
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="module")
def browser(playwright: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = tmp_path_factory.mktemp("mic") / "mic.wav"
    write_mic_wav(wav)
    with chromium(playwright, wav) as browser:
        yield browser


@pytest.fixture(scope="module")
def demo_server(serve_module: Serve) -> ServerProcess:
    return serve_module("--engine", "voice", "--demo")


@contextmanager
def static_origin(folder: Path) -> Iterator[str]:
    """``folder``'s files served by an ``http.server`` of their own on 127.0.0.1 (a page
    of another origin than the server's); its origin, ``http://127.0.0.1:PORT``."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
