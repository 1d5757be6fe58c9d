"""The ``--call-*`` settings: what each takes, and what the media worker is given."""

from __future__ import annotations

import pytest

from trio_duplex.media.link import IceServer
from trio_duplex.server.calls.media_config import media_config
from trio_duplex.server.config import ServerConfig


def test_the_media_deployment_flags_need_calls() -> None:
    with pytest.raises(ValueError, match=r"^call_host needs --calls"):
        ServerConfig(call_host=("127.0.0.1",))
    with pytest.raises(ValueError, match=r"^call_allow_peer needs --calls"):
        ServerConfig(call_allow_peer=("127.0.0.0/8",))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("call_host", ("localhost",)),
        ("call_advertise", ("1.2.3",)),
        ("call_allow_peer", ("10.0.0.0/33",)),
        ("call_udp_ports", "2000"),
        ("call_udp_ports", "3000-2000"),
        ("call_udp_ports", "0-10"),
        ("call_ice_server", ("stun.example.com:3478",)),
        ("call_ice_server", ("turn:t.example.com:3478",)),  # TURN needs its credential
        ("call_ice_server", ("stun:s.example.com:3478,user,pass",)),
    ],
)
def test_bad_media_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field} "):
        ServerConfig(calls=True, **{field: value})  # type: ignore[arg-type]


def test_a_turn_credential_is_never_in_the_config_s_repr() -> None:
    config = ServerConfig(calls=True, call_ice_server=("turn:t.example.com:3478,u,s3cr3t-cred",))
    assert "s3cr3t-cred" not in repr(config)
    assert "turn:t.example.com:3478" in repr(config)


def test_the_worker_gets_the_flags_as_its_media_settings() -> None:
    config = ServerConfig(
        calls=True,
        host="0.0.0.0",
        call_allow_peer=("10.0.0.0/8",),
        call_udp_ports="40000-40100",
        call_consent_timeout_s=7.0,
        call_ice_server=("stun:s.example.com:3478", "turn:t.example.com:3478,u,c"),
    )
    media = media_config(config, 2.0)
    assert media.hosts is None  # a wildcard listen: every address but loopback
    assert media.allow_peers == ("10.0.0.0/8",) and media.udp_ports == (40000, 40100)
    assert media.ice_servers == (
        IceServer("stun:s.example.com:3478"),
        IceServer("turn:t.example.com:3478", "u", "c"),
    )
    # A silent peer is gone after about interval x (failures + 0.5): the flag's seconds.
    assert media.consent_interval_s * (media.consent_failures + 0.5) == pytest.approx(7.0)
    assert media_config(ServerConfig(calls=True), 2.0).hosts == ("127.0.0.1",)
    assert media_config(ServerConfig(calls=True, call_host=("10.1.2.3",)), 2.0).hosts == (
        "10.1.2.3",
    )
