"""The ``trio-duplex`` command: ``serve`` runs a server, ``connect`` a terminal client."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence

import trio

from .core.config import MiB, ServerConfig
from .engines.api import load_engine_factory
from .server.server import DuplexServer

log = logging.getLogger("trio_duplex")


def _number(
    kind: Callable[[str], float], *, minimum: float, strict: bool
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            bound = f"greater than {minimum}" if strict else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    return parse


_seconds = _number(float, minimum=0, strict=True)
_seconds0 = _number(float, minimum=0, strict=False)
_count = _number(int, minimum=1, strict=False)


def _port(text: str) -> int:
    value = int(_number(int, minimum=0, strict=False)(text))
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return value


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run a trio-duplex server", description="Run a server.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=_port, default=8765, help="TCP port, 0 for any free (8765)")
    p.add_argument("--path", default="/v1/duplex", help="WebSocket endpoint path (/v1/duplex)")
    p.add_argument("--engine", default="echo", help="echo, voice, or package.module:factory (echo)")
    p.add_argument("--max-sessions", type=_count, default=64, help="session slots (64)")
    p.add_argument(
        "--disconnect-grace",
        type=_seconds0,
        default=30.0,
        metavar="SECONDS",
        help="how long a detached session waits for a resume (30)",
    )
    p.add_argument(
        "--idle-ttl",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="attached session expires after this long without client events (300)",
    )
    p.add_argument(
        "--journal-max-bytes",
        type=_count,
        default=8 * MiB,
        metavar="BYTES",
        help="journal bound per session, compact JSON bytes (8 MiB)",
    )
    p.add_argument(
        "--journal-ttl",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="journal entries older than this are dropped (60)",
    )
    p.add_argument(
        "--max-event-bytes",
        type=_count,
        default=15 * MiB,
        metavar="BYTES",
        help="largest client message in UTF-8 bytes; larger closes 1009 (15 MiB)",
    )
    p.add_argument(
        "--config-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="time allowed for the first message (10)",
    )
    p.add_argument(
        "--drain-timeout",
        type=_seconds0,
        default=5.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, time sessions get before they are closed (5)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    p.set_defaults(func=_serve)


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        config = ServerConfig(
            host=args.host,
            port=int(args.port),
            path=args.path,
            max_sessions=int(args.max_sessions),
            disconnect_grace_s=args.disconnect_grace,
            idle_ttl_s=args.idle_ttl,
            journal_max_bytes=int(args.journal_max_bytes),
            journal_ttl_s=args.journal_ttl,
            max_event_bytes=int(args.max_event_bytes),
            config_timeout_s=args.config_timeout,
            drain_timeout_s=args.drain_timeout,
        )
        factory = load_engine_factory(args.engine)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    server = DuplexServer(config, factory)
    failed: list[OSError] = []
    # Everything loaded so far lives as long as the process: keep it out of the cyclic
    # collector's full passes, which otherwise walk it all (~11 ms here, a visible share
    # of a 20 ms audio frame's latency budget) every time one runs.
    gc.freeze()
    try:
        trio.run(_serve_until_signalled, server, args.engine)
    except* OSError as group:  # raised inside a nursery: it arrives in a group
        failed.extend(e for e in group.exceptions if isinstance(e, OSError))
    if failed:
        print(
            f"trio-duplex: cannot listen on {config.host}:{config.port}: {failed[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


async def _serve_until_signalled(server: DuplexServer, engine: str) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def serve(*, task_status: trio.TaskStatus[int]) -> None:
                await server.run_tcp(task_status=task_status)
                nursery.cancel_scope.cancel()  # drained: stop waiting for signals

            port = await nursery.start(serve)
            host = server.config.host
            shown = f"[{host}]" if ":" in host else host
            log.info("serving ws://%s:%d%s (engine %s)", shown, port, server.config.path, engine)
            async for signum in signals:
                if server.shutting_down:
                    log.warning("second signal: stopping now")
                    nursery.cancel_scope.cancel()
                    break
                log.info(
                    "%s: draining for %ss",
                    signal.Signals(signum).name,
                    server.config.drain_timeout_s,
                )
                server.begin_shutdown()
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["connect"]:
        from .client.terminal import main as connect_main

        return int(connect_main(argv[1:]))
    parser = argparse.ArgumentParser(prog="trio-duplex", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("connect", help="interactive terminal client (see: trio-duplex connect -h)")
    args = parser.parse_args(argv)
    return int(args.func(parser, args))
