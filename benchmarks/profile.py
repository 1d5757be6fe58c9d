"""``python -m benchmarks.profile``: the loaded server's CPU or memory profile
(``benchmarks/probes/profile.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.profile", run_name="__main__", alter_sys=True)
