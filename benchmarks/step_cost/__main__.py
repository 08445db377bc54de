"""``python -m benchmarks.step_cost``: see :mod:`benchmarks.step_cost` and benchmarks/README.md."""

import signal
import sys

from benchmarks.step_cost.cli import main

if __name__ == "__main__":
    # Stopped from outside (`timeout`): unwind, so that the pre-compile workers, which run in
    # sessions of their own, are ended too; the JSON keeps what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
