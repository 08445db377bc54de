"""What every benchmark shares: its two flags, the device's name and slug, the run's metadata, where
its JSON goes, and a Markdown table.

A result file is ``{"benchmark": NAME, "meta": {...}, "rows": [...], ...}``; ``meta`` names the
device, the number of GPUs, the date and the torch version. ``python -m benchmarks.report`` builds
``benchmarks/RESULTS.md`` from the files in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import tempfile
from pathlib import Path

import torch

from reproduce.run.report import write_json

RESULTS = Path(__file__).resolve().parent / "results"


def add_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--quick`` and ``--out`` to ``parser``.

    Args:
        parser: a benchmark's parser.

    Returns:
        The same parser.
    """
    parser.add_argument("--quick", action="store_true", help="a small run of every code path")
    parser.add_argument(
        "--out",
        default=None,
        help="JSON file (default: benchmarks/results/<benchmark>_<device>.json)",
    )
    return parser


def device_name(device: torch.device | str) -> str:
    """The device as a person names it: the GPU's product name, else the CPU's.

    Args:
        device: a torch device or its string.

    Returns:
        ``torch.cuda.get_device_name`` for a CUDA device, the processor's name otherwise.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def slug(name: str, gpus: int = 1) -> str:
    """A short file-name form of a GPU: ``h100``, ``2xh200``, ``rtx4090``.

    Args:
        name: the GPU's name (:func:`device_name`), e.g. ``NVIDIA H100 80GB HBM3``.
        gpus: how many of it the run used.

    Returns:
        The GPU's model, lower case, with a ``<gpus>x`` prefix for several.

    Raises:
        ValueError: if ``gpus`` is below 1.
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1; got {gpus}")
    words = [w for w in re.split(r"[\s_-]+", name.lower()) if w not in ("nvidia", "geforce", "")]
    model = next((i for i, w in enumerate(words) if re.search(r"\d", w)), None)
    if model is None:
        base = "".join(words) or "gpu"
    elif words[model].isdigit() and model > 0:  # "rtx 4090"
        base = words[model - 1] + words[model]
    else:
        base = words[model]
    return f"{gpus}x{base}" if gpus > 1 else base


def metadata(
    benchmark: str, device: torch.device | str, gpus: int = 1, quick: bool = False, **extra
) -> dict:
    """The run's metadata: what, on which device, when, with which torch.

    Args:
        benchmark: the benchmark's name (its module).
        device: the device it ran on.
        gpus: how many GPUs it used (ignored for a CPU run, whose ``gpus`` is 0).
        quick: whether it was a ``--quick`` run (whose JSON :func:`out_path` keeps out of
            ``benchmarks/results/``).
        **extra: more entries (the run's settings).

    Returns:
        A dict with ``benchmark``, ``device``, ``device_name``, ``gpus``, ``slug``, ``date`` (UTC,
            ISO 8601), ``torch``, ``cuda``, ``python``, ``quick`` and ``extra``'s entries.
    """
    device = torch.device(device)
    name = device_name(device)
    return {
        "benchmark": benchmark,
        "device": str(device),
        "device_name": name,
        "gpus": gpus if device.type == "cuda" else 0,
        "slug": slug(name, gpus) if device.type == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "quick": quick,
        **extra,
    }


def out_path(out: str | None, meta: dict) -> Path:
    """Where a run's JSON goes: ``out``, else ``benchmarks/results/`` and :func:`file_name`, or
    for a ``--quick`` run, whose numbers are no result, the same name in the temporary folder.

    Args:
        out: the ``--out`` flag's value, or None.
        meta: the run's :func:`metadata`.

    Returns:
        The path.
    """
    if out:
        return Path(out)
    folder = Path(tempfile.gettempdir()) if meta.get("quick") else RESULTS
    return folder / file_name(meta)


def file_name(meta: dict) -> str:
    """A result's file name: ``<benchmark>_<slug>.json``, or ``<benchmark>_<part>_<slug>.json`` for a
    run that measured one part of a benchmark (``meta["part"]``: a model, a group of estimators).

    Args:
        meta: the run's :func:`metadata`.

    Returns:
        The file name.
    """
    part = [meta["part"]] if meta.get("part") else []
    return "_".join([meta["benchmark"], *part, meta["slug"]]) + ".json"


def save(result: dict, out: str | None) -> Path:
    """Write ``result`` (with its ``meta``) as strict JSON where :func:`out_path` says.

    Args:
        result: ``{"benchmark", "meta", "rows", ...}``.
        out: the ``--out`` flag's value, or None.

    Returns:
        The path written.
    """
    path = out_path(out, result["meta"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    return path


def cell(value, spec: str = "") -> str:
    """One table cell: ``—`` for None, a number by ``spec``, anything else as text (its first
    120 characters)."""
    if value is None:
        return "—"
    if isinstance(value, float) and spec:
        return format(value, spec)
    text = " ".join(str(value).replace("|", "/").split())
    return text if len(text) <= 120 else text[:119] + "…"


def table(columns, rows) -> str:
    """A Markdown table.

    Args:
        columns: ``(header, key, spec)`` triples; ``key`` is a row's key or a dotted path into it
            (``one.images_per_s``), ``spec`` a format spec for floats.
        rows: dicts.

    Returns:
        The table, one line per row.
    """
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append(
            "| " + " | ".join(cell(get(row, key), spec) for _, key, spec in columns) + " |"
        )
    return "\n".join(lines)


def get(row: dict, key: str):
    """``row[key]``, following a dotted ``key`` through nested dicts; None where a part is missing."""
    value = row
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value
