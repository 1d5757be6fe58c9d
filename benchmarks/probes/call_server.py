"""``python -m benchmarks.probes.call_server SERVE_FLAGS...``: ``trio-duplex serve`` as
the command line would run it, with ``ServerConfig.call_media_stats`` set to the calls
benchmark's recorder (``benchmarks/probes/call_engine.py``), so that the media worker
sends a ``STATS(seq, t_sent)`` per RTP packet and the server hands each one to it.

That field is a hook for benchmarks, not a setting: no flag, environment variable or
file sets it, which is why the benchmark starts its server through this module (the
same ``cli.main``, given a ``DuplexServer`` that evolves the parsed configuration).
"""

from __future__ import annotations

import sys
from typing import Any

import attrs

from benchmarks.probes.call_engine import RECORDER
from trio_duplex import cli
from trio_duplex.server.server import DuplexServer


def _with_stats(config: Any, factory: Any) -> DuplexServer:
    return DuplexServer(attrs.evolve(config, call_media_stats=RECORDER.sent), factory)


if __name__ == "__main__":
    cli.DuplexServer = _with_stats  # type: ignore[attr-defined,assignment]
    sys.exit(cli.main(["serve", *sys.argv[1:]]))
