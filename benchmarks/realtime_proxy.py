"""``python -m benchmarks.realtime_proxy``: what the ``realtime-proxy`` engine costs
(``benchmarks/probes/realtime_proxy.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.realtime_proxy", run_name="__main__", alter_sys=True)
