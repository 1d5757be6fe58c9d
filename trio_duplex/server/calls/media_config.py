"""The media worker's settings (media/link.py's ``MediaConfig``) from the server's
``--call-*`` flags."""

from __future__ import annotations

import logging

from ...media.link import IceServer, MediaConfig
from ..config import ServerConfig

CONSENT_FAILURES = 3
"""ICE consent checks missed in a row before a peer is gone (aioice's: 6)."""


def ice_server(value: str) -> IceServer:
    """``stun:HOST:PORT`` or ``turn:HOST:PORT[?transport=udp],USER,CREDENTIAL`` (the flag's
    form, checked by config_checks.ice_servers)."""
    url, *credentials = value.split(",")
    if credentials:
        return IceServer(url, credentials[0], credentials[1])
    return IceServer(url)


def media_config(config: ServerConfig, close_timeout_s: float) -> MediaConfig:
    ports = None
    if config.call_udp_ports is not None:
        low, _, high = config.call_udp_ports.partition("-")
        ports = (int(low), int(high))
    # A peer gone silent is noticed after about interval x (failures + 0.5).
    interval = config.call_consent_timeout_s / (CONSENT_FAILURES + 0.5)
    return MediaConfig(
        hosts=config.call_host or MediaConfig.hosts_for(config.host),
        allow_peers=config.call_allow_peer,
        udp_ports=ports,
        ice_servers=tuple(ice_server(v) for v in config.call_ice_server),
        consent_interval_s=interval,
        consent_failures=CONSENT_FAILURES,
        close_timeout_s=close_timeout_s,
        log_level=worker_log_level(),
    )


def worker_log_level() -> str:
    """The worker's log level: DEBUG while the server's own log is at DEBUG, else
    WARNING. Asked when the worker starts (the server's logging is set up after the
    server is built)."""
    debug = logging.getLogger("trio_duplex").isEnabledFor(logging.DEBUG)
    return "DEBUG" if debug else "WARNING"


__all__ = ["media_config", "worker_log_level"]
