"""Who may open a session (``Gate``): API keys, another verifier, client tokens, and a
session's resume token for its resume.

With ``--api-key-file FILE`` (or ``--auth module:callable``) every upgrade must present a
credential (``bearer``): ``Authorization: Bearer CREDENTIAL``, or (browsers cannot set
headers on a WebSocket) an offered subprotocol ``trio-duplex.bearer.CREDENTIAL`` or
OpenAI's ``openai-insecure-api-key.CREDENTIAL``, never selected. The credential is an API
key (keys.py), whose ``NAME`` becomes the session's principal; a client token (``POST
/v1/client_tokens``, or OpenAI's ``POST /v1/realtime/client_secrets``: one use, a TTL,
maybe a locked configuration, bounded per principal and in bytes: tokens.py,
client_secrets.py); or the current resume token of a live session, which allows exactly
one thing: the first message (or the upgrade's ``?resume=``) is that session's resume.
The verifier, if any, looks at the headers first. Anything else is refused with 401
before the upgrade, with nothing said about which part was wrong.

Keys are kept as SHA-256 digests and every comparison runs against every key, in
constant time (``hmac.compare_digest``); no key is ever logged or in a ``repr``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import trio
from websockets.datastructures import Headers, MultipleValuesError
from websockets.http11 import Request

from ...core.opening import OPEN, Grant
from ...core.wire import ConfigBudget, ProtocolError
from ...dialects.jsonwire import decode_object, encode
from ..config import ServerConfig
from . import client_secrets
from .client_secrets import CLIENT_SECRETS_PATH
from .keys import KeyFileError, KeyRing, Verifier, load_verifier
from .throttle import Failures, Throttled
from .tokens import ClientToken, ClientTokens, Refused, TokenLimits, digest

log = logging.getLogger("trio_duplex")

BEARER_SUBPROTOCOL = "trio-duplex.bearer."
"""An offered subprotocol that carries a credential (never selected)."""
OPENAI_KEY_SUBPROTOCOL = "openai-insecure-api-key."
"""OpenAI's form of the same (browsers; the Node SDK always offers it): never selected."""
_CARRIERS = (BEARER_SUBPROTOCOL, OPENAI_KEY_SUBPROTOCOL)


def presented(headers: Mapping[str, str], offered: Iterable[str]) -> str | None:
    """The credential an upgrade presents: ``Authorization: Bearer X``, else the first
    offered subprotocol ``trio-duplex.bearer.X`` or ``openai-insecure-api-key.X``."""
    authorization = headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for protocol in offered:
        for prefix in _CARRIERS:
            if protocol.startswith(prefix) and len(protocol) > len(prefix):
                return protocol[len(prefix) :]
    return None


def bearer(request: Request) -> str | None:
    """The bearer credential of an upgrade, wherever it travels (``presented``); None
    when there is none, or ``Authorization`` is sent twice (which one would be meant?).
    A dialect that opens a session from its upgrade takes a resume's token from here."""
    offered = [
        value.strip()
        for header in request.headers.get_all("Sec-WebSocket-Protocol")
        for value in header.split(",")
    ]
    authorization = request.headers.get_all("Authorization")
    if len(authorization) > 1:
        return None
    return presented({"Authorization": "".join(authorization)}, offered)


def carries_credential(subprotocol: str) -> bool:
    """Is this offered subprotocol a credential's carrier? Such is never selected."""
    return subprotocol.startswith(_CARRIERS)


TOKENS_PATH = "/v1/client_tokens"
"""``POST`` here with an API key: a short-lived client token for a browser."""
POST_PATHS = (TOKENS_PATH, CLIENT_SECRETS_PATH)
"""The paths that take a POST (``Gate.answer_post``)."""


def _json_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


@attrs.define(eq=False, repr=False)
class Gate:
    """Who may open a session: the API keys, another verifier (``--auth``), the client
    tokens issued from them, and the live sessions' resume tokens (``holder_of``)."""

    config: ServerConfig
    holder_of: Callable[[str], str | None]
    """The id of the live session whose valid resume token a credential is, if any."""
    keys: KeyRing | None = None
    verifier: Verifier | None = None
    tokens: ClientTokens = attrs.field(init=False)
    elsewhere: bool = False
    """Cluster mode: a credential nothing here knows may be the resume token of a session
    on another node; it is let through to send that resume (``Grant.elsewhere``)."""
    resuming_paths: frozenset[str] = frozenset()
    """The paths whose upgrade resumes a session named in its query (``?resume=ID``:
    OpenAI's, ``--realtime-path``): there the bearer is the resume token."""
    failures: Failures = attrs.field(factory=Failures, init=False)
    """Cluster mode: such credentials whose resume failed, by address."""
    _refusals_quiet_until: dict[Refused, float] = attrs.field(factory=dict, init=False)
    _refusals_left_out: dict[Refused, int] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self.tokens = ClientTokens(
            TokenLimits(
                config.client_token_max_bytes,
                config.client_token_max_per_key,
                config.client_token_max_bytes_per_key,
            )
        )

    @classmethod
    def of(
        cls,
        config: ServerConfig,
        holder_of: Callable[[str], str | None],
        keys: KeyRing | None = None,
        verifier: Verifier | None = None,
    ) -> Gate:
        """The gate ``config`` asks for (``--api-key-file``, ``--auth``), unless given.
        ValueError (KeyFileError): a file or verifier that cannot be used."""
        if keys is None and config.api_key_file is not None:
            keys = KeyRing.load(config.api_key_file)
        if verifier is None and config.auth is not None:
            verifier = load_verifier(config.auth)
        return cls(config, holder_of, keys, verifier)

    def __repr__(self) -> str:
        return f"<Gate keys={self.keys!r} verifier={self.verifier is not None}>"

    @property
    def open(self) -> bool:
        """No authentication: neither API keys nor a verifier."""
        return self.keys is None and self.verifier is None

    def authorize(self, request: Request, peer: str | None = None) -> Grant | Throttled | None:
        """What the upgrade's credential allows (auth.py), or None: 401; Throttled:
        ``peer``'s unknown credentials failed too often (cluster mode). On one of
        ``resuming_paths`` with ``?resume=``: ``authorize_resume``."""
        if self.resuming_paths:
            url = urlsplit(request.path)
            if url.path in self.resuming_paths and "resume" in parse_qs(url.query, True):
                return self.authorize_resume(request, peer)
        if self.verifier is not None:
            who = self._verified(request.headers)
            if who is not None:
                return Grant(who)
        credential = bearer(request)
        if credential is None:
            return None
        principal = None if self.keys is None else self.keys.principal(credential)
        if principal is not None:
            return Grant(principal)
        now = trio.current_time()
        client = self.tokens.take(credential, now)
        if client is not None:  # spent now: it opens this one session
            return Grant(client.principal, locked=client.locked())
        return self._resume_grant(credential, peer, now)

    def authorize_resume(
        self, request: Request, peer: str | None = None
    ) -> Grant | Throttled | None:
        """An upgrade that resumes a session from its query (``/v1/realtime?resume=ID``):
        its bearer is that session's resume token, standing in for the API key. It is
        looked up as a resume token only, never as a key or a client token (none is
        spent, no verifier asked): a live session's token here grants that session's
        resume; in a cluster an unknown one may resume elsewhere, as ``authorize`` lets
        it. The resume itself then checks the token, in constant time, and the session
        keeps its principal. None: 401, as for any credential nothing here knows."""
        credential = bearer(request)
        if credential is None:
            return None
        return self._resume_grant(credential, peer, trio.current_time())

    def _resume_grant(
        self, credential: str, peer: str | None, now: float
    ) -> Grant | Throttled | None:
        session_id = self.holder_of(credential)
        if session_id is not None:
            return Grant(None, resume_of=session_id)
        if not self.elsewhere:
            return None
        if not self.failures.allows(peer, now):
            return Throttled(RETRY_AFTER_FAILURES_S)
        return Grant(None, elsewhere=digest(credential))

    def resume_failed(self, peer: str | None) -> None:
        """A connection let through for a credential nothing here knew (``elsewhere``)
        did not resume: ``peer`` is a step nearer to ``Throttled``."""
        self.failures.failed(peer, trio.current_time())

    def answer_post(self, path: str, headers: Headers, body: bytes) -> tuple[int, bytes]:
        """A POST of one of ``POST_PATHS`` (else 404): its status and JSON body."""
        if path == CLIENT_SECRETS_PATH:
            return self.issue_client_secret(headers, body)
        if path == TOKENS_PATH:
            return self.issue_token(headers, body)
        return 404, b'{"error": "no such endpoint"}'

    @staticmethod
    def post_error(path: str, status: int, message: str) -> bytes:
        """A POST's refusal as its endpoint words errors (fixed ``message``s only)."""
        if path == CLIENT_SECRETS_PATH:
            return client_secrets.error(status, message)
        return _json_error(message)

    def issue_token(self, headers: Headers, body: bytes) -> tuple[int, bytes]:
        """``POST /v1/client_tokens`` with an API key: a one-use token for one session,
        within ``ttl_s`` (60 s, at most ``--client-token-max-ttl``), and with ``session``
        a configuration that session gets and cannot change. The answer's status and
        JSON body (docs/protocol.md, "Client tokens")."""
        if self.open:
            return 404, b'{"error": "authentication is off: no client tokens"}'
        asker = self._asker(headers)
        if asker is None:
            return 401, b'{"error": "an API key is required"}'
        request = _body(body)
        if isinstance(request, str):
            return 400, _json_error(request)
        ttl = request.get("ttl_s", 60)
        most = self.config.client_token_max_ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= most:
            return 400, _json_error(f"ttl_s must be a number in (0, {most:g}]")
        locked = request.get("session")
        config = None
        if locked is not None:
            if not isinstance(locked, dict):
                return 400, b'{"error": "session must be an object"}'
            try:
                ConfigBudget.of(locked, self.config.max_config_bytes)
            except ProtocolError as exc:
                return 400, _json_error(exc.message)
            config = encode(locked).encode()  # kept compact, parsed again when spent
        token = self._issue(asker, ttl, config)
        if token is Refused.PRINCIPAL_FULL:
            return 429, b'{"error": "this key has too many client tokens outstanding"}'
        if token is Refused.STORE_FULL:
            return 503, b'{"error": "too many client tokens outstanding; retry later"}'
        assert isinstance(token, str)
        expires_at = int(time.time() + ttl)
        return 200, json.dumps({"token": token, "expires_at": expires_at}).encode()

    def issue_client_secret(self, headers: Headers, body: bytes) -> tuple[int, bytes]:
        """``POST /v1/realtime/client_secrets`` (client_secrets.py): the same token as
        ``issue_token``, asked and answered in OpenAI's shape."""
        error = client_secrets.error
        if self.open:
            return 404, error(404, "authentication is off: no client secrets")
        asker = self._asker(headers)
        if asker is None:
            return 401, error(401, "an API key is required")
        parsed = _body(body)
        if isinstance(parsed, str):
            return 400, error(400, parsed, None, "invalid_json")
        try:
            asked = client_secrets.request(
                parsed, self.config.client_token_max_ttl_s, self.config.max_config_bytes
            )
        except client_secrets.Refusal as refusal:
            return refusal.status, refusal.body
        token = self._issue(asker, asked.seconds, asked.locked)
        if token is Refused.PRINCIPAL_FULL:
            return 429, error(429, "this key has too many client secrets outstanding")
        if token is Refused.STORE_FULL:
            return 503, error(503, "too many client secrets outstanding; retry later")
        assert isinstance(token, str)
        expires_at = int(time.time() + asked.seconds)
        return 200, client_secrets.answer(token, expires_at, asked.session)

    def _asker(self, headers: Headers) -> tuple[str, bytes | None] | None:
        """Who asks for a token (an API key's principal and digest, or the verifier's
        principal and None), or None: 401."""
        authorization = headers.get_all("Authorization")
        credential = None
        if len(authorization) == 1:
            credential = presented({"Authorization": authorization[0]}, ())
        if credential is not None and self.keys is not None:
            principal = self.keys.principal(credential)
            if principal is not None:
                return principal, digest(credential)
        if self.verifier is not None:
            principal = self._verified(headers)
            if principal is not None:
                return principal, None
        return None

    def _issue(
        self, asker: tuple[str, bytes | None], ttl: float, config: bytes | None
    ) -> str | Refused:
        """A new client token for ``asker``, or why not (logged, at its rate)."""
        principal, key = asker
        now = trio.current_time()
        token = self.tokens.issue(ClientToken(principal, now + ttl, config, key), now)
        if isinstance(token, Refused):
            self._say_refused(token, principal, now)
        else:
            log.info("client token issued to %s for %gs", principal, ttl)
        return token

    def _say_refused(self, why: Refused, principal: str, now: float) -> None:
        """Log a refused token, at most once per ``REFUSAL_QUIET_S`` for each reason: a
        client that retries at once must not flood the log."""
        self._refusals_left_out[why] = self._refusals_left_out.get(why, 0) + 1
        if now < self._refusals_quiet_until.get(why, -math.inf):
            return
        self._refusals_quiet_until[why] = now + REFUSAL_QUIET_S
        more = self._refusals_left_out.pop(why) - 1
        also = f" ({more} more refused since the last line)" if more else ""
        if why is Refused.PRINCIPAL_FULL:
            count, size = self.tokens.held_by(principal)
            message = "client token refused to %s: it holds %d tokens, %d bytes%s"
            log.info(message, principal, count, size, also)
        else:
            message = "client token refused to %s: %d bytes held (--client-token-max-bytes)%s"
            log.warning(message, principal, self.tokens.held_bytes, also)

    def _verified(self, headers: Headers) -> str | None:
        """The ``--auth`` verifier's principal for ``headers``, or None (refused)."""
        assert self.verifier is not None
        try:
            who = self.verifier(headers)
        except MultipleValuesError:  # a header it reads once was sent twice: the client's
            return None
        except Exception as exc:  # a broken verifier refuses; the client is not told why
            log.error("the --auth verifier failed; the request is refused", exc_info=exc)
            return None
        return who if isinstance(who, str) and who else None

    def reload_keys(self) -> frozenset[str] | None:
        """Read ``--api-key-file`` again (SIGHUP); on a bad file keep the keys in use
        (None). The client tokens of every key no longer in it are revoked; returns the
        names no longer in it (their sessions are the caller's to end)."""
        path = self.config.api_key_file
        if path is None:
            return None
        try:
            keys = KeyRing.load(path)
        except KeyFileError as exc:
            log.error("API keys not reloaded, the old ones stay in use: %s", exc)
            return None
        gone = frozenset() if self.keys is None else self.keys.names - keys.names
        self.keys = keys
        revoked = self.tokens.revoke(keys.holds())
        log.info(
            "API keys reloaded from %s: %d keys; %d client tokens of removed keys revoked",
            path,
            len(keys),
            revoked,
        )
        return gone


REFUSAL_QUIET_S = 10.0
"""A refused client token is logged at most this often, for each reason."""
RETRY_AFTER_FAILURES_S = 5
"""The ``Retry-After`` of an upgrade refused for its address's failures."""


def _body(body: bytes) -> dict[str, Any] | str:
    """A token request's body: the JSON object, parsed by the wire's decoder under the
    wire's rules; else the 400's message. An empty body is ``{}``."""
    if not body.strip():
        return {}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    try:
        return decode_object(text, "the body must be a JSON object")
    except ProtocolError as exc:
        return "the body is not JSON" if exc.code == "invalid_json" else exc.message


__all__ = [
    "BEARER_SUBPROTOCOL",
    "CLIENT_SECRETS_PATH",
    "OPEN",
    "OPENAI_KEY_SUBPROTOCOL",
    "POST_PATHS",
    "RETRY_AFTER_FAILURES_S",
    "TOKENS_PATH",
    "ClientToken",
    "ClientTokens",
    "Failures",
    "Gate",
    "Grant",
    "KeyFileError",
    "KeyRing",
    "Throttled",
    "Verifier",
    "bearer",
    "carries_credential",
    "digest",
    "load_verifier",
    "presented",
]
