"""``python -m benchmarks.flood``: a client flooding through the SDK
(``benchmarks/probes/flood.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.flood", run_name="__main__", alter_sys=True)
