"""The GPU check's result file: every case of ``tests/gpu_check.py`` on this machine, as
``benchmarks/results/gpu_check_<device>.json`` (``--out`` elsewhere), which ``python -m
benchmarks.report`` summarises in RESULTS.md.

    python -m benchmarks.gpu_check                     # every case, on the CUDA device
    python -m benchmarks.gpu_check --models resnet     # a part: --models, --estimators

The cases and their machinery are the tests' own (``pytest -m gpu tests/library/test_gpu_check.py`` runs the
same cases, one test each); this module adds the run's metadata and writes the file.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks import _common

TESTS = Path(__file__).resolve().parents[1] / "tests"


def main(argv=None) -> int:
    """Run the cases that the flags select and write their JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``): the flags of ``tests/gpu_check.py``
            (``--device``, ``--models``, ``--estimators``, ``--size``) and ``--out``.

    Returns:
        1 if a case failed, else 0.
    """
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import gpu_check

    ap = gpu_check.parser()
    ap.description = __doc__.splitlines()[0]
    ap.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.group:
        ap.error("--group: a worker of tests/gpu_check.py, not of this command")
    start = time.time()
    rows = gpu_check.run_selected(args)
    seconds = time.time() - start
    failed = sum(r["status"] != "pass" for r in rows)
    meta = _common.metadata("gpu_check", args.device)
    meta.update(seconds=round(seconds, 1), passed=len(rows) - failed, failed=failed)
    path = _common.save({"benchmark": "gpu_check", "meta": meta, "rows": rows}, args.out)
    print(f"{gpu_check.summary(rows, seconds)}; {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
