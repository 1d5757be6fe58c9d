"""``python -m benchmarks.transcode``: server CPU per 20 ms frame, per audio path
(``benchmarks/probes/transcode.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.transcode", run_name="__main__", alter_sys=True)
