"""trio-duplex: resumable full-duplex realtime sessions over WebSocket, on trio."""

from . import client
from .core.config import ServerConfig
from .core.events import PROTOCOL_VERSION
from .core.session import Registry, Session, State
from .core.wire import ProtocolError
from .engines.api import BadEvent, Engine, EngineFactory, EngineSession, Event, load_engine_factory
from .server.server import DuplexServer

__all__ = [
    "PROTOCOL_VERSION",
    "BadEvent",
    "DuplexServer",
    "Engine",
    "EngineFactory",
    "EngineSession",
    "Event",
    "ProtocolError",
    "Registry",
    "ServerConfig",
    "Session",
    "State",
    "client",
    "load_engine_factory",
]
__version__ = "0.1.0"
