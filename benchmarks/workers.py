"""``python -m benchmarks.workers``: voice sessions, ``--workers 2`` against 1
(``benchmarks/probes/workers/``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.workers", run_name="__main__", alter_sys=True)
