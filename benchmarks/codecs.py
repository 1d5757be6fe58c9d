"""``python -m benchmarks.codecs``: CPU per 20 ms frame of the audio codecs
(``benchmarks/probes/codecs.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.codecs", run_name="__main__", alter_sys=True)
