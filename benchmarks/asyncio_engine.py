"""``python -m benchmarks.asyncio_engine``: an asyncio engine's per-event cost
(``benchmarks/probes/asyncio_engine.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.asyncio_engine", run_name="__main__", alter_sys=True)
