"""Engines for ``trio-duplex serve --engine tests.server.speech_engines:...`` in
test_speech_serve.py: a speech session, or an echo one beside it on the same server (a
session opened with ``{"engine": "echo"}``), the neighbour whose frames must keep coming
while speech is recognised."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trio_duplex import Engine
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.speech import SpeechEngine, default_max_sessions


def speech_or_echo(config: Mapping[str, Any]) -> Engine:
    if config.get("engine") == "echo":
        return EchoEngine(config)
    return SpeechEngine(config)


# serve's --max-sessions default for this engine (checked by test_speech_serve.py).
speech_or_echo.default_max_sessions = default_max_sessions  # type: ignore[attr-defined]
