"""Every test here is an aiortc peer on 127.0.0.1 alone (``loopback_for_the_test``)."""

from __future__ import annotations

import pytest

from ..media.rtc import loopback_for_the_test


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_for_the_test(monkeypatch)
