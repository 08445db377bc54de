"""The GPU check's result file: every case of ``tests/gpu_check.py`` on this machine, as
``benchmarks/results/gpu_check_<device>.json`` (``--out`` elsewhere), which ``python -m
benchmarks.report`` summarises in RESULTS.md.

    python -m benchmarks.gpu_check                     # every case, on the CUDA device
    python -m benchmarks.gpu_check --models resnet     # a part: --models, --estimators

The cases and their machinery are the tests' own (``pytest -m gpu tests/library/test_gpu_check.py``
runs the same cases, one test each): this module runs ``tests/gpu_check.py`` as a process of its own,
then adds the run's metadata to its rows and writes the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import _common

CHECK = Path(__file__).resolve().parents[1] / "tests" / "gpu_check.py"  # the cases, a script


def _run(cmd: list[str]) -> int:
    """Run ``cmd``, its output on ours, with the checkout first on its import path (the script's
    own folder, ``tests/``, is what Python puts there); its exit status."""
    root = str(CHECK.parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(cmd, env={**os.environ, "PYTHONPATH": path}).returncode


def main(argv=None) -> int:
    """Run the cases that the flags select and write their JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``): the flags of ``tests/gpu_check.py``
            (``--device``, ``--models``, ``--estimators``, ``--size``), passed on to it as a
            process of its own, and ``--out``.

    Returns:
        1 if a case failed, else 0; 2 for a refused command line.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/)")
    ap.add_argument("--device", default="cuda")
    args, rest = ap.parse_known_args(argv)
    if any(a == "--group" or a.startswith(("--group=", "--rows")) for a in rest):
        ap.error("--group and --rows: a worker's flags of tests/gpu_check.py, not of this command")
    with tempfile.TemporaryDirectory() as tmp:
        got = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(CHECK), "--device", args.device, "--rows", str(got), *rest]
        code = _run(cmd)
        if not got.is_file():
            return code or 1  # refused (2) or died before its rows
        ran = json.loads(got.read_text())
    rows = ran["rows"]
    failed = sum(r["status"] != "pass" for r in rows)
    meta = _common.metadata("gpu_check", args.device)
    meta.update(seconds=round(ran["seconds"], 1), passed=len(rows) - failed, failed=failed)
    path = _common.save({"benchmark": "gpu_check", "meta": meta, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
