"""Engines: what produces a session's output.

``api`` is the whole engine API (``Engine``, ``EngineSession``, ``BadEvent``,
``can_migrate``); ``echo`` and ``voice`` are the built-in engines, and the examples to
learn it from.
"""

from .api import (
    BUILTIN,
    BadEvent,
    Engine,
    EngineFactory,
    EngineSession,
    Event,
    can_migrate,
    load_engine_factory,
)

__all__ = [
    "BUILTIN",
    "BadEvent",
    "Engine",
    "EngineFactory",
    "EngineSession",
    "Event",
    "can_migrate",
    "load_engine_factory",
]
