"""Ratios between rows, the Markdown table, and the run's metadata."""

from __future__ import annotations

import platform

import torch

from benchmarks import _common
from benchmarks.step_cost import authors_gam
from benchmarks.step_cost.methods import ACCELERATED, AUTHORS, BASELINE


def ratios(rows):
    """The columns of one model and precision, from the rows' median ms:

    - ``x_sgd``: images/s ÷ images/s of the eager ``torch_sgd`` row;
    - ``x_grad``: ms ÷ ms of gamfunc's ``gradient`` step in the same mode (compiled the same way);
    - ``x_authors``: ms ÷ ms of the eager ``authors_gam`` row;
    - ``x_floor``: for the rows with a ``floor`` (``*_every<k>``, LookSAM, LookGAM), ms ÷
      ``floor_ms`` = ((k − 1)·ms of the base step + ms of the full step)/k, both measured in the
      same mode in this run; for the other rows made of gradients only, ms ÷ (gradient
      evaluations × the ``gradient`` step's ms);
    - ``x_evals``: ms ÷ (gradient evaluations × the ``grad_eval`` row's ms in the same mode): what
      the step adds to its gradient evaluations. ``grad_eval`` is the cheapest plain evaluation of
      the mode (``torch.autograd.grad`` eager, compiled ``torch.func.grad`` compiled), so
      ``grad_eval_func``'s value is ``torch.func.grad`` against it;
    - ``x_sgd_peak``: peak memory ÷ the ``torch_sgd`` row's (CUDA)."""
    by = {(r["mode"], r["method"]): r for r in rows if r.get("ms")}
    base = by.get(("eager", BASELINE))
    authors = by.get(("eager", AUTHORS))
    for r in rows:
        if base and r.get("peak_mem_gib") and base.get("peak_mem_gib"):
            r["x_sgd_peak"] = r["peak_mem_gib"] / base["peak_mem_gib"]
        if not r.get("ms"):
            continue
        if base:
            r["x_sgd"] = r["img_s"] / base["img_s"]
        if authors:
            r["x_authors"] = r["ms"] / authors["ms"]
        grad = by.get((r["mode"], "gradient"))
        if grad and r["method"] != BASELINE:
            r["x_grad"] = r["ms"] / grad["ms"]
        if r.get("floor"):
            k, base_row, gam_row = r["floor"]
            parts = by.get((r["mode"], base_row)), by.get((r["mode"], gam_row))
            if all(parts):
                r["floor_ms"] = ((k - 1) * parts[0]["ms"] + parts[1]["ms"]) / k
                r["x_floor"] = r["ms"] / r["floor_ms"]
        elif grad and r["grads"]:
            r["x_floor"] = r["ms"] / (r["grads"] * grad["ms"])
        evals = by.get((r["mode"], "grad_eval"))
        if evals and r["grads"] and r["method"] not in (BASELINE, "grad_eval"):
            r["x_evals"] = r["ms"] / (r["grads"] * evals["ms"])


def vs_fp32(rows):
    """``x_fp32`` of every row but the fp32 NCHW ones: images/s ÷ images/s of the same model, mode
    and method in fp32 without channels-last in this run."""
    fp32 = {
        (r["model"], r["mode"], r["method"]): r
        for r in rows
        if r["dtype"] == "fp32" and not r["channels_last"]
    }
    for r in rows:
        ref = fp32.get((r["model"], r["mode"], r["method"]))
        if ref is not r and ref and ref.get("img_s") and r.get("img_s"):
            r["x_fp32"] = r["img_s"] / ref["img_s"]


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


COLUMNS = (
    "model",
    "dtype",
    "mode",
    "method",
    "ms/step",
    "img/s",
    "× eager SGD",
    "× grad step",
    "× authors' GAM",
    "× floor",
    "× grad evals",
    "× fp32",
    "peak GiB",
    "peak × SGD",
    "compile s",
    "recompiles",
    "note",
)


def table(rows) -> str:
    """The rows as a Markdown table (``compile s``: the cold compile of a worker where there was one)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        note = r["error"] or ""
        if r.get("cudagraph_skips"):
            note = f"CUDA graphs skipped ({r['cudagraph_skips']})"
        compile_s = r.get("compile_s")
        if r.get("compile_cold_s") is not None:
            compile_s = r["compile_cold_s"]
        cells = [
            r["model"],
            r["dtype"] + (" cl" if r["channels_last"] else ""),
            r["mode"],
            r["method"],
            fmt(r.get("ms"), ".2f"),
            fmt(r.get("img_s"), ".0f" if r.get("img_s", 0) >= 100 else ".3g"),
            fmt(r.get("x_sgd"), ".3f"),
            fmt(r.get("x_grad"), ".2f"),
            fmt(r.get("x_authors"), ".3f"),
            fmt(r.get("x_floor"), ".2f"),
            fmt(r.get("x_evals"), ".2f"),
            fmt(r.get("x_fp32"), ".2f"),
            fmt(r.get("peak_mem_gib"), ".2f"),
            fmt(r.get("x_sgd_peak"), ".2f"),
            fmt(compile_s, ".1f"),
            fmt(r.get("recompiles"), "d"),
            note.replace("|", "/").replace("\n", " ")[:120],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metadata(a, device) -> dict:
    """Date, versions, device (:func:`benchmarks._common.metadata`), the settings that change
    timings, and every argument."""
    return _common.metadata(
        "step_cost",
        device,
        quick=a.quick,
        platform=platform.platform(),
        **settings(a),
    )


def settings(a) -> dict:
    """The settings of a run that change its timings, and every argument."""
    return {
        "cpu_threads": torch.get_num_threads(),
        "no_loop_reorder": a.no_loop_reorder,
        "loop_ordering_after_fusion": torch._inductor.config.loop_ordering_after_fusion,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "recompile_limit": a.recompile_limit,
        "inductor_options": a.inductor_options,
        "accelerated": ACCELERATED,
        "authors_gam": authors_gam.SOURCE,
        "model_source": {},
        "args": vars(a),
    }
