"""``python -m benchmarks.speech``: speech sessions held in real time on one core
(``benchmarks/probes/speech.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.speech", run_name="__main__", alter_sys=True)
