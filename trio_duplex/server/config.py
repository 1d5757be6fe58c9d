"""The server's configuration, and the ``trio-duplex serve`` flags its fields define.
Validated at construction: a ServerConfig that exists is valid.

The core reads only its ``core_limits`` (core/limits.py); the rest is the deployment's:
listeners, TLS, auth, client tokens, the cluster, the workers, the upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..core.events import DEFAULT_PATH
from ..core.limits import KiB, Limits, MiB, first_message_bytes
from . import config_checks as check

REALTIME_PATH = "/v1/realtime"
"""Where the OpenAI Realtime dialect is served by default (``--realtime-path``)."""

SECONDS = "SECONDS"
BYTES = "BYTES"


@attrs.frozen
class Flag:
    """Marks a ServerConfig field as a ``trio-duplex serve`` flag (``metadata={FLAG: ...}``).

    The flag is ``--`` and the field's name, ``_`` as ``-``, a trailing ``_s`` dropped; its
    default and type are the field's, its values are checked by the field's validators.
    """

    help: str
    metavar: str | None = None  # None: argparse's, the field's name in capitals
    shown: str | None = None
    """The default as ``--help`` and the README say it, when the value would not do."""


FLAG = "trio_duplex.flag"


def _flag(help: str, metavar: str | None = None, shown: str | None = None) -> dict[str, Flag]:
    return {FLAG: Flag(help, metavar, shown)}


_CLUSTER_ONLY = (
    "node_id",
    "advertise_url",
    "cluster_max_sessions",
    "cluster_secret",
    "relay_port",
    "cluster_ca",
    "cluster_redis_ca",
)
"""Flags that mean nothing without --cluster."""

_CALLS_ONLY = (
    "call_host",
    "call_advertise",
    "call_ice_server",
    "call_udp_ports",
    "call_allow_peer",
)
"""Deployment flags of the calls' media that mean nothing without --calls."""


MAX_WORKERS = 256

_WORKER_CONFLICTS = {
    "metrics_port": "cannot be shared by --workers (each worker serves /metrics on its own "
    "listener); leave it 0",
    "advertise_url": "cannot be given with --workers (each worker advertises its own relay "
    "listener)",
    "relay_port": "must be 0 with --workers (each worker opens its own)",
}
"""Settings one port-sharing worker cannot have in common with the others."""


@attrs.frozen(kw_only=True)
class ServerConfig:
    host: str = attrs.field(default="127.0.0.1", metadata=_flag("address to listen on"))
    port: int = attrs.field(
        default=8765,
        validator=[check.at_least(0), check.at_most(65535)],
        metadata=_flag("TCP port, 0 for any free"),
    )
    path: str = attrs.field(
        default=DEFAULT_PATH, validator=check.path, metadata=_flag("WebSocket endpoint path")
    )
    realtime_path: str = attrs.field(
        default=REALTIME_PATH,
        validator=check.optional_path,
        metadata=_flag(
            "WebSocket endpoint speaking the OpenAI Realtime dialect; empty: none", "PATH"
        ),
    )
    # TLS: both or neither (checked in __attrs_post_init__); the front door reads the
    # files (server/front/tls.py).
    tls_cert: str | None = attrs.field(
        default=None,
        metadata=_flag("PEM certificate chain; with --tls-key, serve wss://", "FILE", "none"),
    )
    tls_key: str | None = attrs.field(
        default=None, metadata=_flag("PEM private key of --tls-cert", "FILE", "none")
    )
    allow_origin: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.origins,
        metadata=_flag(
            "an upgrade or token request whose Origin header is another gets HTTP 403; "
            "repeatable, * for any",
            "ORIGIN",
            "the Host's own",
        ),
    )
    api_key_file: str | None = attrs.field(
        default=None,
        metadata=_flag(
            "NAME:KEY lines; with it every new session must present a key (re-read on SIGHUP)",
            "FILE",
            "none",
        ),
    )
    auth: str | None = attrs.field(
        default=None,
        metadata=_flag(
            "package.module:callable taking an upgrade's headers, returning a principal or "
            "None (refused: 401); every new session must pass it or present an API key",
            "SPEC",
            "none",
        ),
    )
    client_token_max_ttl_s: float = attrs.field(
        default=600.0,
        validator=check.above(0),
        metadata=_flag("longest life of a client token (POST /v1/client_tokens)", SECONDS),
    )
    client_token_max_bytes: int = attrs.field(
        default=64 * MiB,
        validator=check.at_least(1),
        metadata=_flag(
            "client tokens outstanding on this server, in bytes (each token's locked "
            "configuration as compact JSON, plus 512); beyond: HTTP 503",
            BYTES,
        ),
    )
    client_token_max_per_key: int = attrs.field(
        default=1_000,
        validator=check.at_least(1),
        metadata=_flag(
            "client tokens outstanding for one principal (an API key's NAME, or --auth's); "
            "beyond: HTTP 429 for it alone",
            "N",
        ),
    )
    client_token_max_bytes_per_key: int = attrs.field(
        default=4 * MiB,
        validator=check.at_least(1),
        metadata=_flag(
            "client tokens outstanding for one principal, in bytes as --client-token-max-bytes "
            "counts them, at most half of it; beyond: HTTP 429 for it alone",
            BYTES,
        ),
    )
    max_sessions: int = attrs.field(
        default=64, validator=check.at_least(1), metadata=_flag("session slots")
    )
    disconnect_grace_s: float = attrs.field(
        default=30.0,
        validator=check.at_least(0),
        metadata=_flag("how long a detached session waits for a resume", SECONDS),
    )
    unconfirmed_grace_s: float = attrs.field(
        default=5.0,
        validator=check.at_least(0),
        metadata=_flag(
            "how long instead (at most --disconnect-grace) when the client sent nothing "
            "after session.created, which may never have reached it",
            SECONDS,
        ),
    )
    idle_ttl_s: float = attrs.field(
        default=300.0,
        validator=check.above(0),
        metadata=_flag("attached session expires after this long without client events", SECONDS),
    )
    journal_max_bytes: int = attrs.field(
        default=8 * MiB,
        validator=check.at_least(1),
        metadata=_flag("journal bound per session, compact JSON bytes", BYTES),
    )
    journal_ttl_s: float = attrs.field(
        default=60.0,
        validator=check.above(0),
        metadata=_flag("journal entries older than this are dropped", SECONDS),
    )
    max_event_bytes: int = attrs.field(
        default=15 * MiB,
        validator=check.at_least(1),
        metadata=_flag("largest client message in UTF-8 bytes; larger closes 1009", BYTES),
    )
    max_config_bytes: int = attrs.field(
        default=64 * KiB,
        validator=check.at_least(1),
        metadata=_flag(
            "largest session configuration, compact JSON bytes; it also bounds a "
            "connection's first message (plus 4 KiB)",
            BYTES,
        ),
    )
    max_input_bytes: int = attrs.field(
        default=16 * MiB,
        validator=check.at_least(1),
        metadata=_flag("client events queued for the engine, in bytes", BYTES),
    )
    max_output_bytes: int = attrs.field(
        default=16 * MiB,
        validator=check.at_least(1),
        metadata=_flag(
            "frames queued for one connection; past it the client is cut (4003), "
            "the engine waits past half",
            BYTES,
        ),
    )
    write_timeout_s: float = attrs.field(
        default=20.0,
        validator=check.above(0),
        metadata=_flag("time one write may wait for the client to read, else cut", SECONDS),
    )
    handshake_timeout_s: float = attrs.field(
        default=10.0,
        validator=check.above(0),
        metadata=_flag("time allowed for the whole HTTP upgrade", SECONDS),
    )
    max_connections: int = attrs.field(
        default=10_000,
        validator=check.at_least(1),
        metadata=_flag("open TCP connections, handshakes included; beyond: HTTP 503"),
    )
    max_connections_per_ip: int = attrs.field(
        default=1_000,
        validator=check.at_least(1),
        metadata=_flag("open TCP connections from one IP address; beyond: HTTP 503"),
    )
    config_timeout_s: float = attrs.field(
        default=10.0,
        validator=check.above(0),
        metadata=_flag("time allowed for the first message", SECONDS),
    )
    replay_timeout_s: float = attrs.field(
        default=20.0,
        validator=check.above(0),
        metadata=_flag("time a resume may take to write its replay, else it is aborted", SECONDS),
    )
    drain_timeout_s: float = attrs.field(
        default=5.0,
        validator=check.at_least(0),
        metadata=_flag("on SIGINT/SIGTERM, time sessions get before they are closed", SECONDS),
    )
    engine_stop_timeout_s: float = attrs.field(
        default=5.0,
        validator=check.at_least(0),
        metadata=_flag(
            "time a cancelled engine gets to return before it is abandoned and its slot freed",
            SECONDS,
        ),
    )
    loop_lag_warning_s: float = attrs.field(
        default=0.1,
        validator=check.at_least(0),
        metadata=_flag("warn when the event loop is blocked longer than this; 0: off", SECONDS),
    )
    metrics_port: int = attrs.field(
        default=0,
        validator=[check.at_least(0), check.at_most(65535)],
        metadata=_flag(
            "serve /metrics, /healthz, /readyz on this port (same host) instead of the "
            "main one; 0: on the main one"
        ),
    )
    demo: bool = attrs.field(
        default=False,
        metadata=_flag(
            "also serve the browser demo page at GET / and its assets at /demo/... "
            "(docs/browser.md)",
            shown="off",
        ),
    )
    # Cluster mode (docs/cluster.md): membership and cluster-wide admission.
    cluster: str | None = attrs.field(
        default=None,
        validator=check.redis_url,
        repr=check.url_repr,
        metadata=_flag(
            "join a cluster through the Redis (>= 7) or Valkey at this URL; none: one "
            "process, no outside service",
            "redis://HOST:PORT/DB",
            "none",
        ),
    )
    node_id: str | None = attrs.field(
        default=None,
        validator=check.node_id,
        metadata=_flag(
            "this node's id in the cluster, [A-Za-z0-9._-]{1,128}", "ID", "HOST-PID-RANDOM"
        ),
    )
    advertise_url: str | None = attrs.field(
        default=None,
        validator=check.ws_url,
        metadata=_flag(
            "the URL other nodes reach this one on; by default the listening address "
            "(the machine's name if it listens on every address)",
            "URL",
            "ws(s)://HOST:PORT/PATH",
        ),
    )
    cluster_max_sessions: int | None = attrs.field(
        default=None,
        validator=check.positive_or_none,
        metadata=_flag(
            "sessions across the whole cluster, on top of each node's --max-sessions; "
            "an open is refused (resource_exhausted) at the cap or while the store is "
            "unreachable",
            "N",
            "no cap",
        ),
    )
    cluster_secret: str | None = attrs.field(
        default=None,
        repr=False,
        validator=check.secret,
        metadata=_flag(
            "the secret every node of the cluster shares, signing the requests by which one "
            "node relays a resume to another (required with --cluster; better given as "
            "TRIO_DUPLEX_CLUSTER_SECRET, which ps does not show)",
            "SECRET",
            "none",
        ),
    )
    relay_port: int | None = attrs.field(
        default=None,
        validator=check.port_or_none,
        metadata=_flag(
            "a second listener, on --host, for the resumes other nodes relay to this one "
            "(0: any free port), advertised instead of the main one, and the only one "
            "that takes them; none: the main listener takes them",
            "PORT",
            "none",
        ),
    )
    cluster_ca: str | None = attrs.field(
        default=None,
        metadata=_flag(
            "the CA certificates (PEM) a relay trusts when it dials another node's wss:// "
            "URL (a cluster's private CA); none: the system's",
            "FILE",
            "system CAs",
        ),
    )
    cluster_redis_ca: str | None = attrs.field(
        default=None,
        metadata=_flag(
            "the CA certificates (PEM) a rediss:// --cluster store's certificate is checked "
            "against; none: the system's (the store's password: in the URL or, better, "
            "TRIO_DUPLEX_REDIS_PASSWORD)",
            "FILE",
            "system CAs",
        ),
    )
    # Worker processes (docs/cluster.md, "Worker processes").
    workers: int = attrs.field(
        default=1,
        validator=[check.at_least(1), check.at_most(MAX_WORKERS)],
        metadata=_flag(
            "server processes sharing the port (SO_REUSEPORT), each a node of the cluster, "
            "supervised: one that dies is restarted, SIGTERM drains them all; more than 1 "
            "needs --cluster",
            "N",
        ),
    )
    reuse_port: bool = attrs.field(
        default=False,
        metadata=_flag(
            "set SO_REUSEPORT on the listening sockets, so that several processes can "
            "listen on one port (--workers sets it for its workers)",
            shown="off",
        ),
    )
    upstream: str | None = attrs.field(
        default=None,
        validator=check.ws_url,
        repr=check.url_repr,
        metadata=_flag(
            "--engine realtime-proxy: the OpenAI-Realtime-style endpoint each session "
            "connects to (API key from TRIO_DUPLEX_UPSTREAM_API_KEY)",
            "URL",
            "none",
        ),
    )
    upstream_header: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.headers,
        repr=check.headers_repr,
        metadata=_flag(
            "--engine realtime-proxy: a header sent to the upstream; repeatable",
            "'NAME: VALUE'",
            "none",
        ),
    )
    # The speech engine (docs/speech.md): what it hears and speaks with.
    speech_model: str | None = attrs.field(
        default=None,
        validator=check.speech_model,
        metadata=_flag(
            "--engine speech: the Whisper model, a directory holding model.bin (a path: "
            "has a '/', starts with '.' or '~', or exists; never fetched) or a "
            "faster-whisper model name (fetched from the Hugging Face hub if not cached)",
            "PATH|NAME",
            "the packaged tiny.en",
        ),
    )
    speech_voice: str = attrs.field(
        default="auto",
        validator=check.speech_voice,
        metadata=_flag(
            "--engine speech: piper (the bundled joe voice; the piper extra), "
            "piper:VOICE.onnx, flite, flite:VOICE, espeak-ng or espeak-ng:VOICE; auto: "
            "piper if installed, else flite if on PATH, else espeak-ng",
            "VOICE",
        ),
    )
    speech_recognisers: int | None = attrs.field(
        default=None,
        validator=check.positive_or_none,
        metadata=_flag(
            "--engine speech: recogniser processes (one Whisper model each) the speech "
            "sessions share",
            "N",
            "one per core",
        ),
    )
    # WebRTC calls (docs/webrtc.md): OpenAI's POST /v1/realtime/calls, served by a media
    # worker process (aiortc; the webrtc extra).
    calls: bool = attrs.field(
        default=False,
        metadata=_flag(
            "serve WebRTC calls at POST /v1/realtime/calls (OpenAI's flow: an SDP offer, "
            "events on the oai-events data channel, Opus audio) through a media worker "
            "process; needs the webrtc extra and libopus",
            shown="off",
        ),
    )
    call_answer_timeout_s: float = attrs.field(
        default=5.0,
        validator=check.above(0),
        metadata=_flag("--calls: the media worker's SDP answer within this, else 503", SECONDS),
    )
    call_setup_timeout_s: float = attrs.field(
        default=10.0,
        validator=check.above(0),
        metadata=_flag(
            "--calls: from the answer to the data channel open (ICE, DTLS, SCTP), else the "
            "call is dropped",
            SECONDS,
        ),
    )
    call_consent_timeout_s: float = attrs.field(
        default=7.0,
        validator=check.above(0),
        metadata=_flag(
            "--calls: a peer that stops answering ICE consent checks for about this long "
            "is gone (its session detaches, as a dropped WebSocket's does)",
            SECONDS,
        ),
    )
    call_max_setup: int = attrs.field(
        default=16,
        validator=check.at_least(1),
        metadata=_flag(
            "--calls: calls between their POST and their data channel open; over it 503", "N"
        ),
    )
    call_max_sdp_bytes: int = attrs.field(
        default=32 * KiB,
        validator=[check.at_least(1 * KiB), check.at_most(1 * MiB)],
        metadata=_flag("--calls: the largest SDP offer taken; over it 413", BYTES),
    )
    call_host: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.ips,
        metadata=_flag(
            "--calls: the addresses of the answer's host candidates; repeatable",
            "IP",
            "--host if an address, else every address but loopback",
        ),
    )
    call_advertise: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.ips,
        metadata=_flag(
            "--calls: also offer each host candidate at this address (1:1 NAT: the "
            "public IP of a cloud VM or a container host); repeatable",
            "IP",
            "none",
        ),
    )
    call_ice_server: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.ice_servers,
        repr=check.ice_servers_repr,
        metadata=_flag(
            "--calls: a STUN (stun:HOST:PORT) or TURN (turn:HOST:PORT,USER,CREDENTIAL) "
            "server for the worker's ICE; repeatable; none: no server is ever contacted",
            "URL",
            "none",
        ),
    )
    call_udp_ports: str | None = attrs.field(
        default=None,
        validator=check.port_range,
        metadata=_flag("--calls: bind the calls' UDP sockets in this range", "LOW-HIGH", "any"),
    )
    call_allow_peer: tuple[str, ...] = attrs.field(
        default=(),
        converter=check.strings,
        validator=check.networks,
        metadata=_flag(
            "--calls: answer ICE from these networks only (and drop offered candidates "
            "outside them); repeatable",
            "CIDR",
            "any",
        ),
    )
    # Phone calls (docs/telephony.md): Twilio Media Streams at --twilio-path, its TwiML
    # webhook at {path}/twiml; on with an auth token (or, in development, without
    # signatures).
    twilio_path: str = attrs.field(
        default="/v1/twilio",
        validator=check.path,
        metadata=_flag(
            "Twilio Media Streams' WebSocket path; {path}/twiml is the voice webhook, "
            "{path}/status the stream's status callback",
            "PATH",
        ),
    )
    twilio_auth_token: str | None = attrs.field(
        default=None,
        repr=False,
        validator=check.secret,
        metadata=_flag(
            "serve phone calls: the Twilio account's Auth Token, which signs its requests "
            "(X-Twilio-Signature) and keys the calls' tickets (better given as "
            "TRIO_DUPLEX_TWILIO_AUTH_TOKEN, which ps does not show)",
            "TOKEN",
            "off",
        ),
    )
    twilio_account_sid: str | None = attrs.field(
        default=None,
        validator=check.account_sid,
        metadata=_flag("phone calls of this Twilio account only (recommended)", "AC...", "any"),
    )
    twilio_public_url: str | None = attrs.field(
        default=None,
        validator=check.public_url,
        metadata=_flag(
            "the base URL Twilio is configured with (https://voice.example.com): what its "
            "signatures cover and what the TwiML's stream URL is built from (required with "
            "--twilio-auth-token)",
            "URL",
            "none",
        ),
    )
    twilio_insecure_no_signature: bool = attrs.field(
        default=False,
        metadata=_flag(
            "development only: serve phone calls without an auth token, taking unsigned "
            "requests (the calls' tickets are still required; refused with --cluster)",
            shown="off",
        ),
    )
    twilio_ticket_ttl_s: float = attrs.field(
        default=60.0,
        validator=[check.above(0), check.at_most(3600)],
        metadata=_flag(
            "a call's ticket, from its TwiML to its stream's start, lives this long", SECONDS
        ),
    )
    twilio_max_redirects: int = attrs.field(
        default=3,
        validator=[check.at_least(1), check.at_most(100)],
        metadata=_flag("failed reconnects of a call in a row before its TwiML hangs up", "N"),
    )
    twilio_max_buffered_s: float = attrs.field(
        default=0.5,
        validator=[check.above(0), check.at_most(60)],
        metadata=_flag(
            "a call's audio sent to Twilio and not yet confirmed played (by a mark) at most",
            SECONDS,
        ),
    )
    twilio_mark_interval_s: float = attrs.field(
        default=0.1,
        validator=[check.above(0), check.at_most(10)],
        metadata=_flag(
            "audio between two marks: how finely the server knows what the caller heard",
            SECONDS,
        ),
    )
    twilio_max_queued_s: float = attrs.field(
        default=20.0,
        validator=[check.above(0), check.at_most(600)],
        metadata=_flag(
            "a call's audio waiting to be sent to Twilio at most; past it the engine waits",
            SECONDS,
        ),
    )
    # Not flags: WebSocket keepalive and queue depths are tuned by embedders, not operators.
    ping_interval_s: float = attrs.field(default=20.0, validator=check.above(0))
    ping_timeout_s: float = attrs.field(default=20.0, validator=check.above(0))
    max_pending_input: int = attrs.field(default=256, validator=check.at_least(1))
    """Client events queued for the engine before ``input_backpressure``."""
    max_pending_output: int = attrs.field(default=256, validator=check.at_least(1))
    """Frames queued for a connection before the engine's ``send`` waits."""
    # Not a setting: a benchmark's hook (benchmarks/probes/call_server.py sets it).
    call_media_stats: Callable[[int, int], None] | None = attrs.field(
        default=None, repr=False, eq=False
    )
    """With one, each call's OFFER asks its media worker for ``STATS`` (media/wire.py),
    and each is handed to it as ``(seq, sent_ns)``: the output audio frame of
    ``server_event_seq`` ``seq`` went out as RTP at ``sent_ns`` (``time.monotonic_ns``
    in the worker, the same clock as the server's). Seqs are per session."""

    def __attrs_post_init__(self) -> None:
        if self.client_token_max_bytes_per_key * 2 > self.client_token_max_bytes:
            # So that one principal at its share never leaves another none.
            raise check.NeedsCompanion(
                "client_token_max_bytes_per_key",
                self.client_token_max_bytes_per_key,
                f"must be at most half of --client-token-max-bytes ({self.client_token_max_bytes})",
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = (
                ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            )
            raise check.ConfigError(
                given, getattr(self, given), f"needs {missing} too (TLS takes both)"
            )
        if self.demo and (self.path == "/" or self.path.startswith("/demo/")):
            # The page's paths are answered before any upgrade: the endpoint would be hidden.
            raise check.ConfigError("path", self.path, "is taken by --demo (/ and /demo/...)")
        if self.realtime_path == self.path:
            raise check.ConfigError("realtime_path", self.realtime_path, "is --path already")
        if self.demo and (self.realtime_path == "/" or self.realtime_path.startswith("/demo/")):
            raise check.ConfigError(
                "realtime_path", self.realtime_path, "is taken by --demo (/ and /demo/...)"
            )
        if self.cluster is None:
            for name in _CLUSTER_ONLY:
                if getattr(self, name) is not None:
                    value = "<hidden>" if name == "cluster_secret" else getattr(self, name)
                    raise check.NeedsCompanion(name, value, "needs --cluster")
        if not self.calls:
            for name in _CALLS_ONLY:
                if getattr(self, name):
                    raise check.NeedsCompanion(name, getattr(self, name), "needs --calls")
        self._check_twilio()
        if self.workers > 1:
            if self.cluster is None:
                raise check.NeedsCompanion(
                    "workers",
                    self.workers,
                    "needs --cluster (each worker is a node of a cluster, so that a resume "
                    "the kernel hands to another worker can reach its session)",
                )
            for name, rule in _WORKER_CONFLICTS.items():
                value = getattr(self, name)
                if value and not (name == "relay_port" and value == 0):
                    raise check.NeedsCompanion(name, value, rule)
        if self.cluster_redis_ca is not None and not str(self.cluster).startswith("rediss://"):
            raise check.NeedsCompanion(
                "cluster_redis_ca", self.cluster_redis_ca, "needs a rediss:// --cluster (TLS)"
            )
        if self.cluster is not None and self.cluster_secret is None:
            raise check.NeedsCompanion(
                "cluster",
                self.cluster,
                "needs --cluster-secret (or TRIO_DUPLEX_CLUSTER_SECRET): the nodes sign "
                "relayed resumes with it",
            )

    @property
    def twilio(self) -> bool:
        """Phone calls are served (an auth token, or development's unsigned calls)."""
        return self.twilio_auth_token is not None or self.twilio_insecure_no_signature

    def _check_twilio(self) -> None:
        if self.twilio_auth_token is not None and self.twilio_public_url is None:
            raise check.NeedsCompanion(
                "twilio_auth_token",
                "<hidden>",
                "needs --twilio-public-url: the URL Twilio requests is what it signs",
            )
        if self.twilio_insecure_no_signature:
            if self.cluster is not None:
                raise check.NeedsCompanion(
                    "twilio_insecure_no_signature",
                    True,
                    "is refused with --cluster (the calls' ticket key is one process's)",
                )
            if self.twilio_auth_token is not None:
                raise check.NeedsCompanion(
                    "twilio_insecure_no_signature", True, "contradicts --twilio-auth-token"
                )
        if self.twilio_max_buffered_s < 2 * self.twilio_mark_interval_s:
            raise check.NeedsCompanion(
                "twilio_max_buffered_s",
                self.twilio_max_buffered_s,
                "must be at least twice --twilio-mark-interval (the lead must cover an echo)",
            )
        if self.twilio:
            taken = {self.path, self.realtime_path, "/v1/realtime/calls"}
            if self.twilio_path in taken or self.twilio_path.startswith("/v1/realtime/calls/"):
                raise check.ConfigError(
                    "twilio_path", self.twilio_path, "is another endpoint's path"
                )

    @property
    def core_limits(self) -> Limits:
        """The fields the core's rules read (sessions, admission, the journal, the input
        bounds), as the core takes them."""
        return Limits(
            max_sessions=self.max_sessions,
            disconnect_grace_s=self.disconnect_grace_s,
            unconfirmed_grace_s=self.unconfirmed_grace_s,
            idle_ttl_s=self.idle_ttl_s,
            journal_max_bytes=self.journal_max_bytes,
            journal_ttl_s=self.journal_ttl_s,
            max_event_bytes=self.max_event_bytes,
            max_config_bytes=self.max_config_bytes,
            max_pending_input=self.max_pending_input,
            max_input_bytes=self.max_input_bytes,
        )

    def limits(self) -> dict[str, Any]:
        """The ``limits`` object of ``session.created``."""
        return self.core_limits.advertised()

    @property
    def first_message_bytes(self) -> int:
        """The largest message a connection may send before it carries a session."""
        # (Not through core_limits: it is read on every connection's handshake.)
        return first_message_bytes(self.max_event_bytes, self.max_config_bytes)
