"""Engines for ``trio-duplex serve --engine tests.server.speech_engines:...`` in
test_speech_serve.py: a speech session, or an echo one beside it on the same server (a
session opened with ``{"engine": "echo"}``), the neighbour whose frames must keep coming
while speech is recognised; or one whose responder fails (``{"engine": "broken"}``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from trio_duplex import Engine
from trio_duplex.engines.echo import EchoEngine
from trio_duplex.engines.speech import SpeechEngine, default_max_sessions


async def broken(transcript: str) -> AsyncIterator[str]:
    """A responder whose model call fails."""
    yield "one moment,"
    raise RuntimeError(f"the model failed on {transcript!r}")


def speech_or_echo(config: Mapping[str, Any]) -> Engine:
    if config.get("engine") == "echo":
        return EchoEngine(config)
    if config.get("engine") == "broken":
        return SpeechEngine(config, responder=broken)
    return SpeechEngine(config)


# serve's --max-sessions default for this engine (checked by test_speech_serve.py).
speech_or_echo.default_max_sessions = default_max_sessions  # type: ignore[attr-defined]
