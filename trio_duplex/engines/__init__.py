"""Engines: what produces a session's output.

``api`` is the whole engine API (``Engine``, ``EngineSession``, ``BadEvent``,
``ConfigLocked``, ``can_migrate``, ``UpstreamLost``); ``echo`` and ``voice`` are the
built-in engines, and the examples to learn it from; ``speech`` wraps real speech
models (Whisper, Silero VAD and Piper: the ``speech`` and ``piper`` extras);
``realtime_proxy`` puts resume in front of an existing OpenAI-Realtime-style endpoint;
``turns`` is the turn loop (queue, one response at a time, barge-in) that ``voice`` and
``speech`` share.
"""

from .api import (
    BUILTIN,
    BadEvent,
    ConfigLocked,
    Engine,
    EngineFactory,
    EngineSession,
    Event,
    UpstreamLost,
    can_migrate,
    load_engine_factory,
)

__all__ = [
    "BUILTIN",
    "BadEvent",
    "ConfigLocked",
    "Engine",
    "EngineFactory",
    "EngineSession",
    "Event",
    "UpstreamLost",
    "can_migrate",
    "load_engine_factory",
]
