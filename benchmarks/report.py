"""``python -m benchmarks.report``: ``benchmarks/RESULTS.md`` from the JSON files in ``benchmarks/results/``.

One section per benchmark and one table per file (a device), each headed by the device, the date and
the torch version of its run; then the hand-curated findings of ``benchmarks/notes.json``: what the
guides state in words and no benchmark command measures, each with its device, date, torch and how it
was measured. ``tests/checkout/test_benchmark_report.py`` checks that the committed RESULTS.md is what this
command writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import RESULTS, table

OUT = Path(__file__).resolve().parent / "RESULTS.md"
NOTES = Path(__file__).resolve().parent / "notes.json"
# what every entry of notes.json holds; ``rows`` are ``[what was measured, the result]`` pairs and
# ``guide`` the document, from the repository root, that states the finding in words
NOTE_KEYS = ("title", "guide", "device", "date", "torch", "how", "finding", "rows")
NOTES_TITLE = "Measured outside these commands"

# The rows of step_cost's --facade (benchmarks/step_cost/facade.py): the "facade" list of a step_cost
# result, or the rows of a step_cost_facade one (--facade=only).
FACADE_ONLY = "step_cost_facade"
FACADE_COLUMNS = (
    ("model", "model", ""),
    ("dtype", "dtype", ""),
    ("channels-last", "channels_last", ""),
    ("estimator", "estimator", ""),
    ("H·v", "hvp", ""),
    ("mode", "mode", ""),
    ("method", "method", ""),
    ("base", "base", ""),
    ("batch", "batch", ""),
    ("ms/step", "ms", ".2f"),
    ("img/s", "img_s", ".1f"),
    ("facade ÷ make_step", "x_make_step", ".3f"),
    ("per round", "x_make_step_rounds", ""),
    ("facade ÷ davda54", "x_davda54", ".3f"),
    ("per round", "x_davda54_rounds", ""),
    ("note", "error", ""),
)

# benchmark: (title, what its numbers are, columns)
SECTIONS = {
    "step_cost": (
        "What a step costs",
        "`python -m benchmarks.step_cost`: whole training steps of each estimator. × grad step is "
        "ms ÷ the `gradient` step of the same model compiled the same way in the same run; "
        "× authors' GAM is ms ÷ the authors' eager GAM optimiser; × eager SGD is images/s ÷ an "
        "eager `torch.optim.SGD` step's.",
        (
            ("model", "model", ""),
            ("dtype", "dtype", ""),
            ("mode", "mode", ""),
            ("method", "method", ""),
            ("ms/step", "ms", ".2f"),
            ("× grad step", "x_grad", ".2f"),
            ("× authors' GAM", "x_authors", ".3f"),
            ("× eager SGD", "x_sgd", ".3f"),
            ("× floor", "x_floor", ".2f"),
            ("peak GiB", "peak_mem_gib", ".2f"),
            ("compile s", "compile_cold_s", ".0f"),
            ("note", "error", ""),
        ),
    ),
    "step_cost_facade": (
        "The torch.optim facade's speed",
        "`python -m benchmarks.step_cost --facade=only`: the `gamfunc.torch_optim` facade over a "
        "fused `torch.optim` optimiser against `make_step` with the equivalent gamfunc optimiser "
        "(facade ÷ make_step, images/s), both compiled, and the eager facade SAM against "
        "davda54/sam's two-pass SAM (facade ÷ davda54); per round: the median and, in brackets, the "
        "first and third quartiles of that ratio taken round by round. The rounds are interleaved, "
        "so each pair ran close in time: where the host bounds the step, the machine's speed "
        "drifts by several percent from round to round, and the median of the paired ratios is "
        "the steadier figure.",
        FACADE_COLUMNS,
    ),
    "first_step": (
        "The first step",
        "`python -m benchmarks.first_step`: seconds from the end of the model's set-up (set-up s: "
        "the model, batch and step built, in the cold process) to the end of the first step "
        "(first) and to the end of the first step in the mode's steady form (ready: for a graph "
        "mode, the step that captures the graph after three eager ones), cold (an empty inductor "
        "cache) and warm (the same cache again), each in a fresh process; then ms per step, all "
        "cells of a model timed in one process in interleaved rounds. Modes: `eager`; `graph`, the "
        "eager step replayed as one CUDA graph (`gamfunc.cuda_graph`); `pass`, "
        '`step.compile(scope="pass")`; `pass-graph`, both; `step`, `step.compile()`. × compiled '
        "grad is ms ÷ the compiled gradient step of the same model in the same run (by pass with a "
        "graph where measured). jobs: how many first-step processes ran side by side, sharing the "
        "GPU and the CPU cores, in the run that measured the row.",
        (
            ("model", "model", ""),
            ("dtype", "precision", ""),
            ("estimator", "estimator", ""),
            ("mode", "mode", ""),
            ("jobs", "jobs", ""),
            ("set-up s", "cold.setup_s", ".1f"),
            ("cold first s", "cold.first_after_setup_s", ".1f"),
            ("cold ready s", "cold.ready_after_setup_s", ".1f"),
            ("warm first s", "warm.first_after_setup_s", ".1f"),
            ("warm ready s", "warm.ready_after_setup_s", ".1f"),
            ("ms/step", "ms", ".2f"),
            ("× compiled grad", "x_grad", ".2f"),
            ("note", "note", ""),
        ),
    ),
    "data_parallel": (
        "Data-parallel scaling against DDP",
        "`python -m benchmarks.data_parallel`: images/s of one step on 1 GPU and on N, each on a "
        "batch already on the device; efficiency = N-GPU images/s ÷ (N × 1-GPU images/s). "
        "`ddp` is the anchor: DistributedDataParallel around the compiled `nn.Module`. A "
        "`train_*` row with a loader: `reproduce/train.py` on a JPEG folder through that "
        "`--loader` (loader img/s), data path cost = 1 − that ÷ the in-memory rate at the same "
        "count of GPUs.",
        (
            ("run", "run", ""),
            ("GPUs", "gpus", ""),
            ("perturbation", "perturbation", ""),
            ("1 GPU img/s", "one.images_per_s", ".1f"),
            ("N GPUs img/s", "many.images_per_s", ".1f"),
            ("efficiency", "efficiency", ".3f"),
            ("loader", "loader", ""),
            ("loader img/s", "folder.images_per_s", ".1f"),
            ("data path cost", "data_path_cost", ".3f"),
        ),
    ),
    "input_pipeline": (
        "The input pipeline's cost",
        "`python -m benchmarks.input_pipeline`: images/s of each loader alone and, with "
        "`--load_ms`, what it adds to a stand-in step of that length (× stand-in step = fed ÷ "
        "alone − 1).",
        (
            ("pipeline", "pipeline", ""),
            ("images/s", "images_per_s", ".0f"),
            ("first epoch start s", "first_epoch_start_s", ".3f"),
            ("epoch start s", "epoch_start_s", ".3f"),
            ("fed step ms", "loaded_ms", ".3f"),
            ("× stand-in step", "loaded_cost", "+.3f"),
        ),
    ),
    "flops": (
        "FLOPs per pass",
        "`python -m benchmarks.flops`: matmul and convolution FLOPs of each region of exact GAM, "
        "in gradient passes, as traced for inductor: with `gamfunc.graph_sharing` (`_shared`) or "
        "without, with torch's norms (`native`) or elementary ones. A property of the graph: the "
        "same on any machine.",
        (
            ("model", "model", ""),
            ("region", "region", ""),
            ("native", "native", ".3f"),
            ("native shared", "native_shared", ".3f"),
            ("elementary", "elementary", ".3f"),
            ("elementary shared", "elementary_shared", ".3f"),
        ),
    ),
    "flops_passes": (
        "Exact GAM's passes, timed",
        "`python -m benchmarks.flops.passes`: each region compiled, in units of a compiled "
        "gradient pass of the same model in the same run.",
        (
            ("region", "region", ""),
            ("ms", "ms", ".2f"),
            ("× grad", "x_grad", ".2f"),
            ("peak GiB", "peak_gib", ".2f"),
            ("× grad mem", "x_grad_mem", ".2f"),
            ("error", "error", ""),
        ),
    ),
    "vmap_members": (
        "Many models in one step",
        "`python -m benchmarks.vmap_members`: one vmapped step of N members of the MNIST-1D MLP "
        "(exact GAM over SGD momentum) against their N steps one after another.",
        (
            ("members", "members", ""),
            ("vmapped ms", "vmapped_ms", ".2f"),
            ("looped ms", "looped_ms", ".2f"),
            ("looped ÷ vmapped", "looped_over_vmapped", ".2f"),
        ),
    ),
    "hessian_cost": (
        "The cost of the Hessian metrics",
        "`python -m benchmarks.hessian_cost`: gamfunc's top eigenvalues and Hessian trace against "
        "PyHessian-style double backward; ratio is seconds ÷ the PyHessian row above it.",
        (
            ("method", "method", ""),
            ("seconds", "seconds", ".4f"),
            ("ratio", "ratio_to_baseline", ".2f"),
            ("H·v products", "hvps", ""),
        ),
    ),
    "gpu_check": (
        "The GPU check",
        "`pytest -m gpu tests/library/test_gpu_check.py`: every estimator × {fp32, bf16} × {ResNet, ViT} "
        "(those with state, LookSAM, Friendly-SAM, LookGAM, the authors' Friendly-SAM, MSAM and "
        "RWP, over a trajectory on the ResNet) "
        '× {eager, `scope="pass"` with CUDA graphs, `scope="step"`, `gamfunc.cuda_graph`}, '
        "each update against the float64 step; beside them the ensemble (each member against its "
        "own step), the facade (against `make_step`) and the policies' graphed steps (against the "
        "same step eager); one row per kind of case, with the largest error ÷ tolerance among its "
        "cases.",
        (
            ("mode", "mode", ""),
            ("precision", "precision", ""),
            ("cases", "cases", ""),
            ("passed", "passed", ""),
            ("largest error ÷ tolerance", "worst", ".3f"),
        ),
    ),
}


# What a section says while no result of its benchmark is in the results folder: the command
# that makes one. Absolute times come from a GPU only.
PENDING = {
    "first_step": "Not yet measured on a GPU. `python -m benchmarks.first_step` makes the table "
    "(`--quick` checks on the CPU that the command runs; its numbers are no result).",
}


def columns(benchmark: str) -> tuple:
    """The columns of ``benchmark``'s table, as its command prints them and RESULTS.md shows them.

    Args:
        benchmark: a key of :data:`SECTIONS`.

    Returns:
        ``(header, key, spec)`` triples for `benchmarks._common.table`.
    """
    return SECTIONS[benchmark][2]


def first_step_rows(rows: list[dict]) -> list[dict]:
    """The first-step rows with each phase's first and ready step counted from the end of its
    set-up (``first_s`` and ``ready_s`` count from its start).

    Args:
        rows: the rows of a ``first_step`` result.

    Returns:
        Copies with ``first_after_setup_s`` and ``ready_after_setup_s`` in each phase that ran.
    """
    out = []
    for r in rows:
        r = dict(r)
        for phase in ("cold", "warm"):
            p = r.get(phase)
            if (
                isinstance(p, dict)
                and p.get("setup_s") is not None
                and p.get("first_s") is not None
            ):
                r[phase] = {
                    **p,
                    "first_after_setup_s": p["first_s"] - p["setup_s"],
                    "ready_after_setup_s": p["ready_s"] - p["setup_s"],
                }
        out.append(r)
    return out


def _gpu_check_rows(rows: list[dict]) -> list[dict]:
    """The GPU check's cases summarised per (mode, precision)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        s = out.setdefault(
            (r["mode"], r["precision"]),
            {"mode": r["mode"], "precision": r["precision"], "cases": 0, "passed": 0, "worst": 0.0},
        )
        s["cases"] += 1
        s["passed"] += r["status"] == "pass"
        if r.get("update_rel_err") is not None:
            s["worst"] = max(s["worst"], r["update_rel_err"] / r["tolerance"])
    return list(out.values())


def gpu_check_notes(result: dict) -> list[str]:
    """The lines under a GPU check's table: the parts its rows come from (``meta.parts``: each
    command's flags, date, cases and note) and every case that did not pass, with its error."""
    lines = []
    for part in result["meta"].get("parts", []):
        args = f"`{part['args']}`" if part.get("args") else "the full check"
        when = part["date"][:16].replace("T", " ")
        note = f": {part['note']}" if part.get("note") else ""
        cases = f"{part['cases']} case{'s' * (part['cases'] != 1)}"
        lines.append(f"- {cases} from {args} of {when}{note}.")
    for r in result["rows"]:
        if r["status"] == "pass":
            continue
        case = f"{r['model']} {r['precision']} {r['mode']} {r['estimator']}"
        if r.get("update_rel_err") is not None:
            why = f"relative error {r['update_rel_err']:.3g} against a tolerance of {r['tolerance']:.3g}"
        else:
            why = str(r.get("error", "no error recorded")).split(" | ")[0][:160]
        lines.append(f"- Failed: {case}: {why}.")
    return ["", *lines] if lines else []


def heading(meta: dict) -> str:
    """A table's heading: device (× GPUs), date, torch."""
    name = meta["device_name"]
    if meta.get("gpus", 0) > 1:
        name = f"{meta['gpus']} × {name}"
    return f"{name}, {meta['date'][:10]}, torch {meta['torch']}"


def notes(entries: list[dict]) -> list[str]:
    """RESULTS.md's last section: one sub-section per hand-curated finding.

    Args:
        entries: the ``notes`` list of ``benchmarks/notes.json``, each a dict with the keys of
            :data:`NOTE_KEYS`.

    Returns:
        The section's lines: its heading and what it holds, then per entry a heading with its
        device, date and torch, the finding, how it was measured, the guide that states it and a
        table of its rows.

    Raises:
        ValueError: if an entry lacks a key of :data:`NOTE_KEYS`, a row is not a pair, or a cell
            is longer than a table cell shows (120 characters).
    """
    lines = [
        "",
        f"## {NOTES_TITLE}",
        "",
        "Findings that the guides state in words and that no command above measures, each a "
        "hand-curated entry of `benchmarks/notes.json` with its device, date, torch and how it was "
        "measured.",
    ]
    for entry in entries:
        missing = [k for k in NOTE_KEYS if k not in entry]
        if missing:
            raise ValueError(f"note {entry.get('title')!r} lacks {', '.join(missing)}")
        if not all(isinstance(r, list) and len(r) == 2 for r in entry["rows"]):
            raise ValueError(f"note {entry['title']!r}: every row is a [what, result] pair")
        if any(len(str(c)) > 120 for r in entry["rows"] for c in r):
            raise ValueError(f"note {entry['title']!r}: a cell over 120 characters would be cut")
        rows = [{"what": what, "result": result} for what, result in entry["rows"]]
        lines += [
            "",
            f"### {entry['title']} ({entry['device']}, {entry['date']}, torch {entry['torch']})",
            "",
            f"{entry['finding']} Measured: {entry['how']}. Stated in "
            f"[{entry['guide']}](../{entry['guide']}).",
            "",
            table((("measured", "what", ""), ("result", "result", "")), rows),
        ]
    return lines


def render(folder: Path = RESULTS, notes_file: Path | None = NOTES) -> str:
    """RESULTS.md's text from the JSON files in ``folder`` and the findings of ``notes_file``.

    Args:
        folder: where the results are.
        notes_file: the hand-curated findings (``benchmarks/notes.json``); None or a missing file
            leaves their section out.

    Returns:
        The Markdown: a section per benchmark in :data:`SECTIONS`' order, a table per file, then
        the findings (:func:`notes`).

    Raises:
        ValueError: if a file names a benchmark that :data:`SECTIONS` does not know, or a note is
            malformed.
    """
    results: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("benchmark") not in SECTIONS:
            raise ValueError(f"{path.name}: unknown benchmark {result.get('benchmark')!r}")
        results.setdefault(result["benchmark"], []).append((path.name, result))
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python -m benchmarks.report` from `benchmarks/results/*.json`; do not edit "
        "by hand. Every ratio is between steps timed in the same run on the same device; compare "
        "absolute times only within one table. benchmarks/README.md says how to read each table.",
    ]
    for name, (title, about, columns) in SECTIONS.items():
        if name not in results:
            if name in PENDING:
                lines += ["", f"## {title}", "", about, "", PENDING[name]]
            continue
        lines += ["", f"## {title}", "", about]
        for file, result in sorted(results[name], key=lambda item: item[1]["meta"]["date"]):
            rows = result["rows"]
            if name == "gpu_check":
                rows = _gpu_check_rows(rows)
            elif name == "first_step":
                rows = first_step_rows(rows)
            lines += ["", f"### {heading(result['meta'])} (`results/{file}`)", ""]
            lines.append(table(columns, rows))
            if name == "gpu_check":
                lines += gpu_check_notes(result)
            if result.get("facade"):  # step_cost --facade
                lines += ["", "The `torch.optim` facade (`--facade`):", ""]
                lines.append(table(FACADE_COLUMNS, result["facade"]))
    if notes_file is not None and notes_file.is_file():
        lines += notes(json.loads(notes_file.read_text())["notes"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Write RESULTS.md (or ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    Path(a.out).write_text(render())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
