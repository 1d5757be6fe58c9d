"""trio-duplex: resumable full-duplex realtime sessions over WebSocket, on trio.

What a user needs is here: the server (``DuplexServer``, ``ServerConfig``), the engine
API (``Engine``, ``EngineSession``, ``BadEvent``), the protocol error and version, the
``Observer`` hook, and the ``client`` package. The simulation kit for tests is
``trio_duplex.testing``; built-in engines are in ``trio_duplex.engines``.
"""

from . import client
from .core.events import PROTOCOL_VERSION
from .core.wire import ProtocolError
from .engines.api import BadEvent, Engine, EngineFactory, EngineSession, Event, load_engine_factory
from .server.config import ServerConfig
from .server.server import DuplexServer
from .server.sessions.owner import Observer

__all__ = [
    "PROTOCOL_VERSION",
    "BadEvent",
    "DuplexServer",
    "Engine",
    "EngineFactory",
    "EngineSession",
    "Event",
    "Observer",
    "ProtocolError",
    "ServerConfig",
    "client",
    "load_engine_factory",
]
__version__ = "0.1.0"
