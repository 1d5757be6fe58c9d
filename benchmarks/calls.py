"""``python -m benchmarks.calls [--quick] [--nice -10]``: the suite's scenario 9 alone, WebRTC
calls against WebSocket voice sessions (``benchmarks/suite/_calls.py``); the same as
``python -m benchmarks --only 9``.
"""

import sys

from benchmarks.suite.main import main

if __name__ == "__main__":
    sys.exit(main(["--only", "9", *sys.argv[1:]]))
