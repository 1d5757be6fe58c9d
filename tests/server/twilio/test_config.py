"""The ``--twilio-*`` settings: what each takes, what they need of each other, and that
the auth token is never shown."""

from __future__ import annotations

from typing import Any

import pytest

from trio_duplex.server.config import ServerConfig

TOKEN = "0123456789abcdef0123456789abcdef"
PUBLIC = "https://voice.example.com"


def test_phone_calls_are_on_with_a_token_or_unsigned_only() -> None:
    assert not ServerConfig().twilio
    assert ServerConfig(twilio_auth_token=TOKEN, twilio_public_url=PUBLIC).twilio
    assert ServerConfig(twilio_insecure_no_signature=True).twilio


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"twilio_auth_token": TOKEN}, r"^twilio_auth_token needs --twilio-public-url"),
        (
            {"twilio_insecure_no_signature": True, "cluster": "redis://127.0.0.1:1/0",
             "cluster_secret": "s" * 20},
            r"^twilio_insecure_no_signature is refused with --cluster",
        ),
        (
            {"twilio_insecure_no_signature": True, "twilio_auth_token": TOKEN,
             "twilio_public_url": PUBLIC},
            r"contradicts --twilio-auth-token",
        ),
        (
            {"twilio_insecure_no_signature": True, "twilio_max_buffered_s": 0.15},
            r"^twilio_max_buffered_s must be at least twice --twilio-mark-interval",
        ),
        ({"twilio_insecure_no_signature": True, "twilio_path": "/v1/duplex"}, r"another endpoint"),
        ({"twilio_insecure_no_signature": True, "twilio_path": "/v1/realtime/calls"}, r"another"),
        ({"twilio_public_url": "https://voice.example.com/"}, r"^twilio_public_url must be"),
        ({"twilio_public_url": "ftp://voice.example.com"}, r"^twilio_public_url must be"),
        ({"twilio_public_url": "https://voice.example.com/x"}, r"^twilio_public_url must be"),
        ({"twilio_account_sid": "AC123"}, r"^twilio_account_sid must be AC"),
        ({"twilio_auth_token": "short"}, r"^twilio_auth_token must be at least 16"),
        ({"twilio_ticket_ttl_s": 0}, r"^twilio_ticket_ttl_s must be greater than 0"),
        ({"twilio_path": "v1/twilio"}, r"^twilio_path must start with '/'"),
    ],
)  # fmt: skip
def test_bad_or_incomplete_settings_are_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ServerConfig(**settings)


def test_good_public_urls_are_taken() -> None:
    for url in ("https://voice.example.com", "http://127.0.0.1:8080", "https://[::1]:8443"):
        assert ServerConfig(twilio_auth_token=TOKEN, twilio_public_url=url).twilio_public_url == url


def test_the_auth_token_is_never_shown() -> None:
    config = ServerConfig(twilio_auth_token=TOKEN, twilio_public_url=PUBLIC)
    assert TOKEN not in repr(config)
    with pytest.raises(ValueError) as info:
        ServerConfig(twilio_auth_token=TOKEN[:15])
    assert TOKEN[:15] not in str(info.value)
