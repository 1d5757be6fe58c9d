"""``ScriptedEngine``: an engine whose output, end, failure and teardown the test decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ..engines.api import Engine, EngineSession, Event


class ScriptedEngine(Engine):
    """An engine whose output is gated by the test.

    Each ``input.text.append {text}`` is answered with ``response.output_text.delta`` once
    ``release`` lets it through (``gated=True``), or at once. ``fail_on`` makes the engine
    raise when that text arrives; ``finish_on`` makes it return. From the test: ``emit``
    sends output now, ``finish``/``fail`` end the engine now, and with
    ``hold_teardown=True`` a cancelled engine waits (shielded) for ``release_teardown``,
    like one that must free a model slot before it is gone.

    ``input_audio_buffer.append {audio}`` (24 kHz PCM16, ``audio_rate``) is echoed as
    ``response.output_audio.delta {audio}``, gated the same way.
    """

    accepts = frozenset({"input.text.append", "input_audio_buffer.append"})
    audio_rate: int | None = 24_000

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        gated: bool = False,
        fail_on: str | None = None,
        finish_on: str | None = None,
        hold_teardown: bool = False,
    ) -> None:
        self.config = dict(config or {})
        self.gated = gated
        self.fail_on = fail_on
        self.finish_on = finish_on
        self.received: list[Event] = []
        self.session: EngineSession | None = None
        self.started = trio.Event()
        self.cancelled = False
        self.teardown_gate: trio.Event | None = trio.Event() if hold_teardown else None
        self.tearing_down = trio.Event()
        self._failure: BaseException | None = None
        self._stop = trio.CancelScope()
        self._permits_send, self._permits = trio.open_memory_channel[None](1000)

    @classmethod
    def factory(cls, **options: Any) -> ScriptedFactory:
        """An EngineFactory that builds ScriptedEngines and keeps them in ``engines``."""
        return ScriptedFactory(options)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._permits_send.send_nowait(None)

    async def emit(self, text: str) -> None:
        """Send one output event now, from the test."""
        assert self.session is not None
        await self.session.send({"type": "response.output_text.delta", "text": text})

    def finish(self) -> None:
        """Make ``run`` return now (the session ends with ``engine_finished``)."""
        self._stop.cancel()

    def fail(self, error: BaseException | str = "scripted failure") -> None:
        """Make ``run`` raise now: a RuntimeError with that message, or ``error`` itself
        (any BaseException: an engine may raise KeyboardInterrupt or asyncio's
        CancelledError). The session ends with ``engine_error``."""
        self._failure = RuntimeError(error) if isinstance(error, str) else error
        self._stop.cancel()

    def release_teardown(self) -> None:
        assert self.teardown_gate is not None
        self.teardown_gate.set()

    async def run(self, session: EngineSession) -> None:
        self.session = session
        self.started.set()
        try:
            with self._stop:
                await self._serve(session)
            if self._failure is not None:
                raise self._failure
        except trio.Cancelled:
            self.cancelled = True
            self.tearing_down.set()
            if self.teardown_gate is not None:
                # Shielded, but bounded: a test that fails before releasing it must not
                # leave the server waiting forever.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + 3600):
                    await self.teardown_gate.wait()
            raise

    async def _serve(self, session: EngineSession) -> None:
        async for event in session:
            self.received.append(event)
            text = event.get("text")
            if text is not None and text == self.fail_on:
                raise RuntimeError(f"scripted failure on {text!r}")
            if text is not None and text == self.finish_on:
                return
            if self.gated:
                await self._permits.receive()
            if event["type"] == "input_audio_buffer.append":
                await session.send({"type": "response.output_audio.delta", "audio": event["audio"]})
            else:
                await session.send({"type": "response.output_text.delta", "text": text})


@attrs.define(eq=False)
class ScriptedFactory:
    """Builds a ScriptedEngine per session, with the same options; keeps every one."""

    options: dict[str, Any]
    engines: list[ScriptedEngine] = attrs.field(factory=list)

    def __call__(self, config: Mapping[str, Any]) -> ScriptedEngine:
        engine = ScriptedEngine(config, **self.options)
        self.engines.append(engine)
        return engine

    @property
    def last(self) -> ScriptedEngine:
        return self.engines[-1]
