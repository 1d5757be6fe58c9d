"""``python -m benchmarks.soak``: the server's memory under a long mixed load
(``benchmarks/probes/soak.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.soak", run_name="__main__", alter_sys=True)
