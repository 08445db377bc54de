"""``python -m benchmarks.data_parallel``: see :mod:`benchmarks.data_parallel.driver`."""

import sys

from benchmarks.data_parallel.driver import main

if __name__ == "__main__":
    sys.exit(main())
