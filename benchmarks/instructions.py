"""``python -m benchmarks.instructions``: the server's instructions per event
(``benchmarks/probes/instructions.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.instructions", run_name="__main__", alter_sys=True)
