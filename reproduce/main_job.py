"""The main job's documented output, from one committed run: run it, keep its JSON, write the docs.

The main job is ``python reproduce/train.py`` with no arguments (the ``mnist1d`` preset: SGD and SGD +
GAM on MNIST-1D). Three documents quote it: the table it prints and how long it takes, in
``reproduce/train.py``'s docstring, ``docs/guides/reproduce.md`` ("Main job") and the README. Each
of those numbers comes from ``reproduce/results/main_job.json`` through this module:

```bash
python -m reproduce.main_job           # runs the main job and its short form, writes the JSON and the docs
python -m reproduce.main_job --docs    # writes the docs from the committed JSON alone
```

The JSON holds the platform the run was made on (CPU model, cores, torch, Python, date), the command,
its wall-clock time, the summaries of ``runs/mnist1d/comparison.json``, and the same for the short
form (`SHORT`: 5 epochs, the same metrics), which ``tests/checkout/test_main_job.py`` runs again. Training
rounds differently on another CPU or torch version, and 4,000 steps of SGD carry a last-bit
difference into the accuracies (65.50 here against 66.20 on another machine, the same code); 5
epochs do not: their printed rows agree across CPU instruction sets (AVX-512 against AVX2, checked with
``MKL_CBWR`` and ``ATEN_CPU_CAPABILITY``) and their losses to about 1e-8. So the test reruns the short
form on any CPU and holds its rows and losses to the JSON's, and reruns the whole job where the CPU
model and torch version are the JSON's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as _platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the checkout's root on sys.path (reproduce/__init__.py)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproduce.run import report

__all__ = [
    "COMMAND",
    "DOCS",
    "JSON",
    "SHORT",
    "cpu_model",
    "duration",
    "main",
    "platform",
    "render_docs",
    "rows",
    "run",
]

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "reproduce" / "results" / "main_job.json"
COMMAND = ["reproduce/train.py"]  # the main job, as the docs write it
SHORT = ["reproduce/train.py", "--epochs=5"]  # what tests/checkout/test_main_job.py runs on any CPU
DOCS = {
    "readme": ROOT / "README.md",
    "guide": ROOT / "docs" / "guides" / "reproduce.md",
    "train": ROOT / "reproduce" / "train.py",
}


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere), without the
    trademark signs."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1]
                break
    except OSError:
        pass
    name = name or _platform.processor() or _platform.machine()
    return " ".join(re.sub(r"\((R|TM|tm|r)\)", "", name).split())


def platform() -> dict:
    """Where a run is made: CPU model, cores, torch, Python, and the date (UTC)."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": _platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }


def run(argv: list[str], logdir: Path) -> dict:
    """Run ``python <argv> --logdir=<logdir>`` from the checkout's root, as a user would.

    Returns:
        ``{"command", "wall_seconds", "printed", "summaries"}``: the command as documented
        (without ``--logdir``), its wall-clock time, the rows of the table it printed (header and
        rule first) and the summaries of its ``comparison.json``.

    Raises:
        RuntimeError: the command failed (its output's end is in the message).
    """
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *argv, f"--logdir={logdir}", "--progress=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    lines = proc.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("estimator "))
    printed = lines[first : first + 4]
    summaries = json.loads((logdir / "mnist1d" / "comparison.json").read_text())
    return {
        "command": "python " + " ".join(argv),
        "wall_seconds": round(seconds, 1),
        "printed": printed,
        "summaries": summaries,
    }


def rows(summaries: list[dict], machine_columns: bool = True) -> list[str]:
    """The table the main job prints for ``summaries`` (`reproduce.run.report.table`), header and
    rule first; without ``machine_columns`` each row ends before img/s and time, which vary with
    the machine."""
    lines = report.table(summaries).splitlines()
    if machine_columns:
        return lines
    cut = lines[0].index("img/s") - 4  # the img/s column: "img/s" right-aligned in 9 characters
    return [line[:cut].rstrip() for line in lines]


def duration(record: dict) -> str:
    """The main job's time as the docs say it: ``about N minute(s) on 2 CPU cores (S s on CPU,
    torch T)``, from the committed run."""
    seconds = record["main"]["wall_seconds"]
    minutes = max(1, round(seconds / 60))
    p = record["platform"]
    return (
        f"about {minutes} minute{'s' * (minutes > 1)} on {p['cores']} CPU cores "
        f"({seconds:.0f} s on {p['cpu']}, torch {p['torch']})"
    )


_DURATION = re.compile(r"about \d+ minutes? on \d+ CPU cores \([^()]*\)")
_FENCE = re.compile(r"(```(?:text)?\n)estimator [^`]*?(\n```)")


def _replace_once(pattern: re.Pattern, text: str, new, where: str) -> str:
    out, n = pattern.subn(new, text, count=1)
    if n != 1:
        raise ValueError(f"{where}: found no place for the main job's {pattern.pattern!r}")
    return out


def render_docs(record: dict) -> dict[Path, str]:
    """Each document quoting the main job, its text rewritten from ``record`` (the JSON): the
    duration phrase (`duration`) everywhere, the printed table in the guide and in train.py's
    docstring. Writing them is a no-op when the docs already say what the JSON says.

    Raises:
        ValueError: a document has no place for a number (the message names it).
    """
    table = "\n".join(rows(record["main"]["summaries"]))
    span = duration(record)
    out = {}
    for key, path in DOCS.items():
        text = path.read_text()
        text = _replace_once(_DURATION, text, span, str(path))
        if key != "readme":
            text = _replace_once(_FENCE, text, lambda m: m.group(1) + table + m.group(2), str(path))
        out[path] = text
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the main job and its short form (or, with ``--docs``, only read the JSON) and write
    the JSON and the docs."""
    ap = argparse.ArgumentParser(prog="python -m reproduce.main_job", description=__doc__)
    ap.add_argument("--docs", action="store_true", help="write the docs from the committed JSON")
    args = ap.parse_args(argv)
    if args.docs:
        record = json.loads(JSON.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main_run = run(COMMAND, Path(tmp) / "main")
            short = run(SHORT, Path(tmp) / "short")
        record = {"platform": platform(), "main": main_run, "short": short}
        report.write_json(JSON, record)
        print("\n".join(main_run["printed"]))
        print(f"{main_run['wall_seconds']} s; {JSON.relative_to(ROOT)}")
    for path, text in render_docs(record).items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
