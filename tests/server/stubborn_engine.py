"""An engine for ``trio-duplex serve --engine tests.server.stubborn_engine:Stubborn``
(test_serve_cli.py): it answers nothing and ignores its cancellation, like a model call
in a thread that cannot be abandoned. Only the end of the process stops it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import trio

from trio_duplex import Engine, EngineSession


class Stubborn(Engine):
    accepts = frozenset({"input.text.append"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    async def run(self, session: EngineSession) -> None:
        never = threading.Event()
        await trio.to_thread.run_sync(never.wait, abandon_on_cancel=False)
