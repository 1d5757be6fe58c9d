"""``python -m benchmarks``: the suite (``benchmarks/suite/main.py``)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.suite.main", run_name="__main__", alter_sys=True)
