"""Which server URL each connection attempt uses (``connect`` takes one or several).

The policy, with no I/O (``session.py`` drives it):

* The first attempt goes to a URL picked at random (the session's ``rng``): a fleet of
  clients given the same list spreads its opens over the nodes instead of all landing on
  the first one. One URL (a load balancer's, say) is simply that URL.
* Every failed attempt moves on to the next URL, round robin. Each failed attempt counts
  as one attempt of ``ReconnectPolicy`` and waits its jittered backoff, as with one URL
  (so a fleet facing a cluster that is down does not multiply its load by the number of
  URLs). With ``retry_open=False`` an open fails only once every URL has failed, tried
  one after the other without backoff.
* A connection lost after it carried the session is resumed at the same URL first (the
  session's home node, if the URL names one), then round robin as above.
* A URL whose server said it is draining (``session.going_away {migrating: true}`` on the
  attached connection, or an attempt refused with ``server_shutting_down`` or closed
  with 1001) is skipped while other URLs remain: when no other URL is left unmarked, the
  marks are forgotten and the ring goes on in order. After ``migrating: true`` the next
  attempt is made as soon as the connection closes, with no backoff (with one URL: that
  URL again, which a load balancer sends to another node). The marks last one outage:
  they are forgotten once the session is attached again (by then a drained node may be
  back, restarted; one still draining refuses the attempt, which marks it again).
"""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Sequence

import attrs


def parse_urls(url_or_urls: str | Sequence[str]) -> tuple[str, ...]:
    """One URL as given, or a non-empty sequence of ``ws://`` URLs or of ``wss://`` ones.
    Raises ValueError for an empty sequence, one that is not all strings, or one that
    mixes schemes (or names a scheme other than these two)."""
    if isinstance(url_or_urls, str):
        return (url_or_urls,)
    urls = tuple(url_or_urls)
    if not urls:
        raise ValueError("connect needs at least one URL")
    if not all(isinstance(url, str) for url in urls):
        raise ValueError("every URL must be a string")
    schemes = {url.partition("://")[0].lower() if "://" in url else "" for url in urls}
    if not schemes <= {"ws", "wss"}:
        raise ValueError("every URL must start with ws:// or wss://")
    if len(schemes) > 1:
        raise ValueError("the URLs must be all ws:// or all wss://, not a mix")
    return urls


@attrs.define(eq=False)
class UrlRing:
    """The URLs of one session and where its next attempt goes (see the module's doc)."""

    urls: tuple[str, ...]
    index: int = 0
    draining: set[int] = attrs.field(factory=set)

    @classmethod
    def start(cls, urls: tuple[str, ...], rng: random.Random) -> UrlRing:
        """Begin at a random URL (no randomness is drawn for a single URL)."""
        return cls(urls, rng.randrange(len(urls)) if len(urls) > 1 else 0)

    @property
    def url(self) -> str:
        """The URL the next (or current) attempt uses."""
        return self.urls[self.index]

    @property
    def where(self) -> str:
        """The current URL's host and port, for logs (no credentials, path or query)."""
        try:
            parts = urllib.parse.urlsplit(self.url)
            host, port = parts.hostname, parts.port
        except ValueError:
            return "?"
        return f"{host}:{port}" if port is not None else str(host)

    def mark_draining(self) -> None:
        """The current URL's server is draining: skip it while others remain."""
        self.draining.add(self.index)

    def attached(self) -> None:
        """The session is attached (through the current URL): the outage is over, and
        with it what was learnt about draining nodes."""
        self.draining.clear()

    def advance(self) -> str:
        """Move on to the next URL not marked draining; if there is none, forget the
        marks and take the next one in order (with one URL: that URL again)."""
        count = len(self.urls)
        for step in range(1, count):
            candidate = (self.index + step) % count
            if candidate not in self.draining:
                self.index = candidate
                return self.url
        self.draining.clear()
        self.index = (self.index + 1) % count
        return self.url
