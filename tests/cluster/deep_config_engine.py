"""An echo engine that, told ``deepen``, nests its session's configuration 600 deep in
place (the dict it was built with is the session's): a real way, for a test served by
``trio-duplex serve --engine tests.cluster.deep_config_engine:DeepConfigEcho``, to make
one session's migration record fail to export (``copy.deepcopy`` raises RecursionError)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trio_duplex.engines.api import EngineSession
from trio_duplex.engines.echo import EchoEngine

DEPTH = 600


class DeepConfigEcho(EchoEngine):
    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._shared = config

    async def run(self, session: EngineSession) -> None:
        async for event in session:
            if event.get("text") == "deepen" and isinstance(self._shared, dict):
                tree: list[Any] = []
                for _ in range(DEPTH):
                    tree = [tree]
                self._shared["tree"] = tree
            await self._answer(session, event)
