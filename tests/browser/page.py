"""The demo page in a test: what it shows (its DOM, ``window.demo``) and its controls."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from playwright.sync_api import Browser, Page, expect

from ..helpers import ServerProcess

WAIT_MS = 15_000  # the deadline of every wait on the page


class Watched:
    """A page whose script errors, console errors and every request it makes (HTTP and
    WebSocket) are kept, from now on."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("websocket", lambda ws: self.requests.append(ws.url))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)


class Demo(Watched):
    """The demo page, open on a session of its own."""

    def __init__(self, page: Page, server: ServerProcess) -> None:
        super().__init__(page)
        self.origin = f"http://127.0.0.1:{server.port}"

    @classmethod
    @contextmanager
    def in_new_context(cls, browser: Browser, server: ServerProcess) -> Iterator[Demo]:
        """The page opened in a fresh browser context; on leaving, checked clean (no
        script error, no request elsewhere) and its context closed."""
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        try:
            demo = cls(context.new_page(), server)
            demo.open()
            yield demo
            demo.check_clean()
        finally:
            context.close()

    def open(self) -> None:
        self.page.goto(self.origin + "/")
        expect(self.page.get_by_test_id("state")).to_have_text("attached", timeout=WAIT_MS)

    def number(self, test_id: str) -> int:
        return int(self.page.get_by_test_id(test_id).text_content() or "")

    def seen(self) -> dict[str, Any]:
        """``window.demo``: what the page saw (seqs, playback reports, states, ...)."""
        value: dict[str, Any] = self.page.evaluate("() => window.demo")
        return value

    def until(self, predicate: str, arg: object = None) -> None:
        """Wait until ``predicate`` (a JS function of ``window.demo`` and ``arg``) holds."""
        self.page.wait_for_function(
            f"(arg) => ({predicate})(window.demo, arg)", arg=arg, timeout=WAIT_MS
        )

    def speak(self, text: str) -> None:
        self.page.get_by_label("Text to send (a typed turn)").fill(text)
        self.page.get_by_role("button", name="Send").click()

    def check_clean(self) -> None:
        """No script error, no CSP refusal, nothing fetched from another origin."""
        assert self.errors == []
        assert self.seen()["cspViolations"] == []
        ws_origin = self.origin.replace("http://", "ws://")
        outside = [url for url in self.requests if not url.startswith((self.origin, ws_origin))]
        assert outside == []
