"""``python -m benchmarks.report``: a results file as the suite's table and plot
(``benchmarks/suite/report.py``).
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.suite.report", run_name="__main__", alter_sys=True)
