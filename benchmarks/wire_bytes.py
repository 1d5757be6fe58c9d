"""``python -m benchmarks.wire_bytes``: bytes on the wire per second of audio
(``benchmarks/probes/wire_bytes.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.probes.wire_bytes", run_name="__main__", alter_sys=True)
