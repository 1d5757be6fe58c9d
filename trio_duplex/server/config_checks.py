"""What a ``ServerConfig`` field's value must be: the rules its validators apply, and the
error that names the field, the value and the rule broken."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs


class ConfigError(ValueError):
    """ServerConfig refused ``value`` for ``field``: it breaks ``rule``."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        if isinstance(value, str) and "://" in value:
            value = redacted_url(value)  # a store URL's password is never shown
        super().__init__(f"{field} {rule}, got {value!r}")
        self.field = field
        self.value = value
        self.rule = rule  # e.g. "must be at least 0"


class NeedsCompanion(ConfigError):
    """A field set without another one it needs (checked once all fields are known)."""


@attrs.frozen
class Rule:
    rule: str
    holds: Callable[[Any], bool]

    def __call__(self, _: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not self.holds(value):
            raise ConfigError(attribute.name, value, self.rule)


def at_least(bound: int) -> Rule:
    return Rule(f"must be at least {bound}", lambda value: value >= bound)


def at_most(bound: int) -> Rule:
    return Rule(f"must be at most {bound}", lambda value: value <= bound)


def above(bound: int) -> Rule:
    return Rule(f"must be greater than {bound}", lambda value: value > bound)


path = Rule(
    "must start with '/' and hold no query",
    lambda value: value.startswith("/") and "?" not in value,
)
optional_path = Rule(
    "must be empty (none) or start with '/' and hold no query",
    lambda value: value == "" or (value.startswith("/") and "?" not in value),
)


def _is_origin(value: str) -> bool:
    """``*``, or an origin as a browser sends it: ``scheme://host[:port]``, no path."""
    scheme, sep, rest = value.partition("://")
    return value == "*" or (bool(scheme and sep and rest) and "/" not in rest and " " not in rest)


def strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""The store's rule for node ids (cluster/keys.py, not imported here: the cluster
package loads the Redis client); tests/cluster/test_serve.py checks that the two agree."""

node_id = Rule(
    f"must match {NODE_ID.pattern}",
    lambda value: value is None or bool(NODE_ID.fullmatch(value)),
)


_REDIS_URL = re.compile(
    r"rediss?://[^/\s?#]+(/[0-9]+)?/?|redis\+sentinel://[^/\s?#]+/[A-Za-z0-9._-]+(/[0-9]+)?/?",
    re.ASCII,
)
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:,]+)(?::([0-9]{1,5}))?", re.ASCII)


def _is_redis_url(value: str) -> bool:
    """One of the store's three URL forms, each host's port (if any) a number from 1 to
    65535 (urlsplit's own ``port`` raises ValueError for anything else, which must not
    reach a traceback)."""
    if _REDIS_URL.fullmatch(value) is None:
        return False
    scheme, _, rest = value.partition("://")
    hosts = rest.partition("/")[0].rpartition("@")[2]
    if "," in hosts and scheme != "redis+sentinel":
        return False
    for host in hosts.split(","):
        found = _HOST_PORT.fullmatch(host)
        if found is None or (found[2] is not None and not 0 < int(found[2]) < 65536):
            return False
    return True


def redacted_url(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: for a repr or a message."""
    scheme, _, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")  # as urlsplit: the last @ ends the password
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"


redis_url = Rule(
    "must be redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://... (TLS) or "
    "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB], a port a number from 1 to 65535",
    lambda value: value is None or _is_redis_url(value),
)
ws_url = Rule(
    "must be a ws:// or wss:// URL",
    lambda value: value is None or re.fullmatch(r"wss?://[^/\s]+(/\S*)?", value) is not None,
)
_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+:.*")  # an HTTP field name (token), ':'
headers = Rule("must be 'NAME: VALUE'", lambda value: all(map(_HEADER.fullmatch, value)))


def url_repr(url: str | None) -> str:
    """A URL as a repr shows it: its password (``redis://:PASSWORD@``) masked."""
    return repr(None if url is None else redacted_url(url))


def headers_repr(headers: tuple[str, ...]) -> str:
    """Header names only: a value may be a credential."""
    # (One with no ':' is not a NAME at all: perhaps the value alone, so not shown.)
    return repr(tuple(f"{h.partition(':')[0]}: ***" if ":" in h else "***" for h in headers))


VOICES = ("auto", "piper", "flite", "espeak-ng")
"""``--speech-voice``'s kinds (engines/speech/_synthesise.py's ``choose_voice`` reads them;
not imported here: the speech package loads numpy and its parts)."""


def _is_voice(value: str) -> bool:
    kind, sep, rest = value.partition(":")
    return value in VOICES or (kind in VOICES[1:] and bool(sep) and bool(rest.strip()))


speech_voice = Rule(
    "must be auto, piper, piper:VOICE.onnx, flite, flite:VOICE, espeak-ng or espeak-ng:VOICE",
    lambda value: _is_voice(value),
)
speech_model = Rule("must not be empty", lambda value: value is None or bool(value.strip()))

positive_or_none = Rule("must be at least 1", lambda value: value is None or value >= 1)
port_or_none = Rule(
    "must be a port from 0 to 65535", lambda value: value is None or 0 <= value <= 65535
)
MIN_SECRET_CHARS = 16


def secret(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """The cluster's shared secret: long enough to sign with. Never echoed back."""
    if value is not None and len(value.strip()) < MIN_SECRET_CHARS:
        raise ConfigError(
            attribute.name, "<hidden>", f"must be at least {MIN_SECRET_CHARS} characters"
        )


_PUBLIC_URL = re.compile(
    r"https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
public_url = Rule(
    "must be http(s)://HOST[:PORT], with no path, query or trailing /",
    lambda value: value is None or _PUBLIC_URL.fullmatch(value) is not None,
)
account_sid = Rule(
    "must be AC followed by 32 hex digits",
    lambda value: value is None or re.fullmatch(r"AC[0-9a-f]{32}", value) is not None,
)

origins = Rule(
    "must be * or an origin such as https://app.example.com (no path, no trailing /)",
    lambda value: all(_is_origin(origin) for origin in value),
)


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _is_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _is_port_range(value: str | None) -> bool:
    if value is None:
        return True
    low, sep, high = value.partition("-")
    if not (sep and low.isascii() and low.isdigit() and high.isascii() and high.isdigit()):
        return False
    return 1 <= int(low) <= int(high) <= 65535


def _is_ice_server(value: str) -> bool:
    url, *credentials = value.split(",")
    if not url.startswith(("stun:", "turn:", "turns:")) or len(url) < 6:
        return False
    return len(credentials) == (0 if url.startswith("stun:") else 2)


ips = Rule("must be IP addresses", lambda value: all(_is_ip(v) for v in value))
networks = Rule(
    "must be CIDRs such as 10.0.0.0/8 or addresses",
    lambda value: all(_is_network(v) for v in value),
)
port_range = Rule("must be LOW-HIGH, two ports, LOW <= HIGH", _is_port_range)
ice_servers = Rule(
    "must be stun:HOST:PORT, or turn:HOST:PORT[?transport=udp],USER,CREDENTIAL",
    lambda value: all(_is_ice_server(v) for v in value),
)


def ice_servers_repr(value: tuple[str, ...]) -> str:
    """ICE servers, their TURN credentials hidden."""
    return repr(tuple(v.split(",", 1)[0] + (",<hidden>" if "," in v else "") for v in value))
