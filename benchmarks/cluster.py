"""``python -m benchmarks.cluster``: cluster mode on a local Redis
(``benchmarks/probes/cluster.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.cluster", run_name="__main__", alter_sys=True)
