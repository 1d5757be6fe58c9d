"""trio-duplex: resumable full-duplex realtime sessions over WebSocket, on trio."""

from . import client
from ._config import ServerConfig
from ._core import Registry, Session, State
from ._engine import BadEvent, Engine, EngineFactory, EngineSession, Event, load_engine_factory
from ._protocol import PROTOCOL_VERSION, ProtocolError
from ._server import DuplexServer

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
