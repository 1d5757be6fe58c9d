"""The ``trio-duplex`` command: ``serve`` runs a server, ``connect`` a terminal client."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import ipaddress
import logging
import math
import os
import signal
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs
import trio

from .core.limits import KiB, MiB
from .engines.api import PROXY, EngineFactory, load_engine_factory
from .logs import FORMATS, LEVELS, configure, register_key_file, register_secret
from .server.config import BYTES, FLAG, Flag, ServerConfig
from .server.config_checks import ConfigError, NeedsCompanion
from .server.server import DuplexServer
from .settings import Layers

log = logging.getLogger("trio_duplex")

EXIT_ABANDONED = 70  # EX_SOFTWARE (sysexits.h)
"""The exit status of ``serve`` when it stopped with abandoned engines still running."""


def serve_flags() -> list[tuple[str, attrs.Attribute[Any], Flag]]:
    """``(flag, field, Flag)`` for each ServerConfig field marked as a ``serve`` flag."""
    fields = attrs.fields(attrs.resolve_types(ServerConfig))
    return [
        ("--" + f.name.removesuffix("_s").replace("_", "-"), f, f.metadata[FLAG])
        for f in fields
        if FLAG in f.metadata
    ]


def shown_default(field: attrs.Attribute[Any]) -> str:
    """The default as ``--help`` (and the README) show it: 8 MiB, 30, 127.0.0.1."""
    value: Any = field.default
    if field.metadata[FLAG].shown is not None:
        return str(field.metadata[FLAG].shown)
    if field.metadata[FLAG].metavar == BYTES and value % KiB == 0:
        return f"{value // MiB} MiB" if value % MiB == 0 else f"{value // KiB} KiB"
    return f"{value:g}" if isinstance(value, float) else str(value)


_KINDS: dict[object, Callable[[str], Any]] = {
    int: int,
    float: float,
    str: str,
    str | None: str,
    int | None: int,
    tuple[str, ...]: str,  # a repeatable flag
}


def _parse(field: attrs.Attribute[Any]) -> Callable[[str], Any]:
    """Text to the field's type, then checked by ServerConfig's own validators."""
    kind = _KINDS[field.type]

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            number = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {number}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if field.validator is None:  # checked with the others (TLS: both or neither)
            return value
        given: Any = (value,) if _repeatable(field) else value
        try:  # every other field at its default: a refusal is this value's
            ServerConfig(**{field.name: given})
        except NeedsCompanion:  # not the value's fault: checked with the others
            pass
        except ConfigError as exc:
            # A secret is not echoed; a field with a repr of its own (a URL's password
            # hidden) is shown by it.
            shown = "the value" if field.repr is False else repr(text)
            if callable(field.repr):
                shown = field.repr(given)
            raise argparse.ArgumentTypeError(f"{shown} {exc.rule}") from None
        return value

    return parse


def _repeatable(field: attrs.Attribute[Any]) -> bool:
    return bool(field.type == tuple[str, ...])


def _serve_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="run a trio-duplex server", description="Run a server.")
    p.add_argument(
        "--engine",
        default="echo",
        help="echo, voice, speech, realtime-proxy (with --upstream), or "
        "package.module:factory (echo)",
    )
    for flag, field, meta in serve_flags():
        default: Any = field.default
        if field.type is bool:  # a switch: --reuse-port
            p.add_argument(
                flag, dest=field.name, action="store_true", help=f"{meta.help} ({meta.shown})"
            )
            continue
        p.add_argument(
            flag,
            dest=field.name,
            type=_parse(field),
            default=list(default) if _repeatable(field) else default,
            action="append" if _repeatable(field) else "store",
            metavar=meta.metavar,
            help=f"{meta.help} ({shown_default(field)})",
        )
    p.add_argument(
        "--log-level", default="info", type=str.lower, choices=LEVELS, help="any case (info)"
    )
    p.add_argument(
        "--log-format",
        default="text",
        type=str.lower,
        choices=FORMATS,
        help="json: one object per line (text)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of these settings, keys named like the flags (max_sessions); "
        "a flag wins over TRIO_DUPLEX_<FLAG> in the environment, which wins over the file",
    )
    # A worker of --workers tells its supervisor it is ready on this inherited pipe.
    p.add_argument("--ready-fd", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(func=_serve)
    return p


def _flag_of(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _import_from_cwd()
    try:
        config = ServerConfig(**{f.name: getattr(args, f.name) for _, f, _ in serve_flags()})
        if config.cluster is not None and config.node_id is None:
            # Chosen here (not when joining) so that every log line can name it.
            from .cluster.node import default_node_id

            config = attrs.evolve(config, node_id=default_node_id())
        _register_secrets(config)  # before anything can log
        factory = _engine_factory(args.engine, config)
        config = _engine_defaults(factory, config, getattr(args, "defaulted", frozenset()))
        server = DuplexServer(config, factory)  # reads the TLS files: TLSError
    except ConfigError as exc:
        parser.error(f"{_flag_of(exc.field)} {exc.rule.replace('tls_', '--tls-')}")
    except ValueError as exc:
        parser.error(str(exc))
    if config.workers > 1:
        assert config.node_id is not None  # --workers needs --cluster
        longest = f"{config.node_id}-w{config.workers - 1}.99999"  # room for restarts
        if len(longest) > 128:
            parser.error(f"--node-id is too long for the workers' ids ({longest})")
        from .workers import supervise

        configure(args.log_level, args.log_format, config.node_id)
        return supervise(config, args.engine, args.serve_args, config.node_id)
    configure(args.log_level, args.log_format, config.node_id)
    _describe(factory)
    failed: list[OSError] = []
    # Everything loaded so far lives as long as the process: keep it out of the cyclic
    # collector's full passes, which otherwise walk it all (~11 ms here, a visible share
    # of a 20 ms audio frame's latency budget) every time one runs.
    gc.freeze()
    unjoined: list[str] = []
    try:
        ready_fd = getattr(args, "ready_fd", None)  # a worker of --workers
        worker = () if ready_fd is None else (ready_fd,)
        trio.run(_serve_until_signalled, server, args.engine, *worker)
    except* OSError as group:  # raised inside a nursery: it arrives in a group
        failed.extend(e for e in group.exceptions if isinstance(e, OSError))
    except* Exception as group:
        unjoined.extend(_unjoined(config, group))  # or raises the group again
    if unjoined:
        print(f"trio-duplex: {unjoined[0]}", file=sys.stderr)
        return 2
    if failed:
        print(
            f"trio-duplex: cannot listen on {config.host}:{config.port}: {failed[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


def _register_secrets(config: ServerConfig) -> None:
    """The secrets the settings hold, masked in every log line (logs.py); the proxy's
    factory registers its upstream key and header values itself."""
    register_secret(config.cluster_secret, config.twilio_auth_token)
    for url in (config.cluster, config.upstream):
        password = None if url is None else urllib.parse.urlsplit(url).password
        if password:
            register_secret(password, urllib.parse.unquote(password))
    register_key_file(config.api_key_file)
    for server in config.call_ice_server:  # turn:HOST:PORT,USER,CREDENTIAL
        _, *credentials = server.split(",")
        if len(credentials) == 2:
            register_secret(credentials[1])


def _engine_factory(engine: str, config: ServerConfig) -> EngineFactory:
    """``--engine``'s factory; ``realtime-proxy`` is built from ``--upstream``.
    ValueError: it cannot be loaded, or ``--upstream`` without that engine."""
    if engine == PROXY:
        from .engines.realtime_proxy import proxy_factory

        return proxy_factory(config.upstream, config.upstream_header)
    if config.upstream is not None or config.upstream_header:
        raise ValueError(f"--upstream and --upstream-header need --engine {PROXY}")
    speech = (config.speech_model, config.speech_voice, config.speech_recognisers)
    if engine != "speech" and speech != (None, "auto", None):
        raise ValueError(
            "--speech-model, --speech-voice and --speech-recognisers need --engine speech"
        )
    if engine == "speech":  # its parts chosen once, here: a missing one is said plainly
        from .engines.speech import SpeechFactory, SpeechUnavailable

        try:
            return SpeechFactory.choose(*speech)
        except SpeechUnavailable as exc:
            raise ValueError(str(exc)) from None
    return load_engine_factory(engine)


def _describe(factory: EngineFactory) -> None:
    """Log what the engine runs on, if it says (``--engine speech``: its model and voice)."""
    describe = getattr(factory, "describe", None)
    if callable(describe):
        log.info("%s", describe())


def _engine_defaults(
    factory: EngineFactory, config: ServerConfig, defaulted: frozenset[str]
) -> ServerConfig:
    """The engine's own defaults for the settings given nowhere (flag, environment,
    file): a factory with ``default_max_sessions()`` (``speech``: from the CPU cores)
    sets ``--max-sessions``."""
    default_max_sessions = getattr(factory, "default_max_sessions", None)
    if "max_sessions" in defaulted and callable(default_max_sessions):
        return attrs.evolve(config, max_sessions=int(default_max_sessions()))
    return config


def _unjoined(config: ServerConfig, group: BaseExceptionGroup[Exception]) -> list[str]:
    """--cluster: why the node could not join (its store did not answer at start). Any
    other error is raised again. (The cluster module is imported only with --cluster:
    it loads the Redis client.)"""
    if config.cluster is not None:
        from .cluster.node import ClusterUnavailable

        leaves = _leaves(group)
        if all(isinstance(e, ClusterUnavailable) for e in leaves):
            return [str(e) for e in leaves]
    raise group


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions in ``error``, out of their (nested) groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


def _import_from_cwd() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does, so that
    the ``trio-duplex`` script loads ``--engine shout:Shout`` from ./shout.py too."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


async def _serve_until_signalled(
    server: DuplexServer, engine: str, ready_fd: int | None = None
) -> None:
    """Serve until a signal has drained the server; a second signal exits at once.

    Both ways out that cannot wait for trio leave through ``_exit_now``: a task that
    ignores cancellation (an abandoned engine) can be neither awaited nor stopped, so
    neither cancelling the nursery nor returning from trio.run would ever finish."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def serve(*, task_status: trio.TaskStatus[int]) -> None:
                await server.run_tcp(task_status=task_status)
                left = server.abandoned_engines
                if left:
                    log.error(
                        "stopped, but %d abandoned engine(s) ignored cancellation and still "
                        "run: exiting without them (status %d)",
                        left,
                        EXIT_ABANDONED,
                    )
                    _exit_now(EXIT_ABANDONED)
                nursery.cancel_scope.cancel()  # drained: stop waiting for signals

            port = await nursery.start(serve)
            _announce(server, engine, port, ready_fd)
            async for signum in signals:
                _on_signal(server, signum)
    log.info("stopped")


def _announce(server: DuplexServer, engine: str, port: int, ready_fd: int | None) -> None:
    """Say where the server listens (a worker tells its supervisor too), and warn when
    anyone who can reach it may open sessions."""
    host = server.config.host
    shown = f"[{host}]" if ":" in host else host
    if ready_fd is None:
        log.info(
            "serving %s://%s:%d%s (engine %s)",
            server.scheme,
            shown,
            port,
            server.config.path,
            engine,
        )
        if server.config.realtime_path:
            log.info(
                "OpenAI Realtime at %s://%s:%d%s", server.scheme, shown, port,
                server.config.realtime_path,
            )  # fmt: skip
        if server.config.calls:
            web = "https" if server.scheme == "wss" else "http"
            log.info("WebRTC calls at %s://%s:%d/v1/realtime/calls", web, shown, port)
        if server.config.demo:
            log.info(
                "demo page at %s://%s:%d/",
                "https" if server.scheme == "wss" else "http",
                shown,
                port,
            )
    else:  # a worker: its supervisor says "serving" once they all are ready
        log.info(
            "worker listening on %s://%s:%d%s (engine %s, the port shared)",
            server.scheme,
            shown,
            port,
            server.config.path,
            engine,
        )
        _say_ready(ready_fd)
    if server.gate.open and not _loopback(host):
        log.warning(
            "listening on %s with no authentication: anyone who can reach the port "
            "can open sessions and hold their slots",
            host or "every address",
        )


def _on_signal(server: DuplexServer, signum: int) -> None:
    """SIGHUP re-reads the key file; a first SIGINT or SIGTERM drains, a second exits."""
    if signum == signal.SIGHUP:
        if server.config.api_key_file is None:
            log.info("SIGHUP: no --api-key-file to re-read")
        else:
            register_key_file(server.config.api_key_file)  # its new keys too
            server.reload_keys()
        return
    if server.shutting_down:
        log.warning(
            "second signal (%s): exiting now, without finishing the drain (status %d)",
            signal.Signals(signum).name,
            128 + signum,
        )
        _exit_now(128 + signum)
    log.info(
        "%s: draining for %ss",
        signal.Signals(signum).name,
        server.config.drain_timeout_s,
    )
    server.begin_shutdown()


def _say_ready(fd: int) -> None:
    """Tell the supervisor (workers.py) that this worker serves: a line on its pipe."""
    try:
        os.write(fd, b"ready\n")
    except OSError as exc:  # the supervisor is gone: it is its death signal's to stop us
        log.warning("could not tell the supervisor this worker is ready: %s", exc)
    finally:
        os.close(fd)


def _loopback(host: str) -> bool:
    """Is ``host`` reachable only from this machine (a loopback address, or localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name (or "" for every address): assume it is reachable
        return False


def _exit_now(status: int) -> NoReturn:
    """End the process now, from inside trio.run: flush the logs, then ``os._exit``."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["connect"]:
        from .client.terminal import main as connect_main

        return int(connect_main(argv[1:]))
    parser = argparse.ArgumentParser(prog="trio-duplex", description=__doc__)
    version = importlib.metadata.version("trio-duplex")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    sub = parser.add_subparsers(dest="command", required=True)
    layers = Layers.take(_serve_parser(sub))  # flags win; the rest: environment, file
    sub.add_parser("connect", help="interactive terminal client (see: trio-duplex connect -h)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        # --workers runs the same command line in each worker: its arguments after "serve".
        args.serve_args = argv[argv.index("serve") + 1 :]
        layers.fill(args, os.environ)
    return int(args.func(parser, args))
