"""Where exact GAM's time goes: the cost of each differentiation pass, in compiled gradient passes.

Algorithm 1 needs, at two points (θ and θ_adv), the gradient g = ∇L and f = ∇‖∇L‖ = H·g/‖g‖. This
script times, for one model, each way of forming them as a compiled region of its own (inductor,
CUDA graphs on GPU, results copied out as :mod:`gamfunc.compile` does), in units of one compiled
gradient pass (``grad``) of the same model measured in the same process:

==================  =====================================================================================
``grad``            g: ``torch.func.grad`` (one forward, one backward): the unit
``jvp_of_grad``     g and H·v for a fixed v: ``torch.func.jvp`` of ``grad`` (forward-over-reverse)
``vjp_of_grad``     g and H·v for a fixed v: ``torch.func.vjp`` of ``grad`` (reverse-over-reverse)
``point_split``     g, then f by ``jvp_of_grad`` at v = g/‖g‖: two regions (a gradient pass, then a
                    forward-over-reverse pass that recomputes g as its primal)
``point_fwd``       the same two computations in one region (inductor may share the primal)
``point_rev``       g and f in one region by reverse-over-reverse: f is the gradient of ‖g‖ through
                    the graph of g itself, so g is computed once
==================  =====================================================================================

Each row's peak memory (CUDA) is ``max_memory_allocated`` during its calls minus what was allocated
before, ÷ the ``grad`` row's. Exact GAM costs two points plus the optimiser update, so
``2 × point_*`` bounds its step in gradient passes.

    python -m benchmarks.flops.passes --model resnet50 --dtype bf16 --channels-last --out r50.json

CPU smoke run (no timing claims): ``python -m benchmarks.flops.passes --quick --backend eager``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gamfunc
from benchmarks import _common
from benchmarks.report import columns
from benchmarks.step_cost.timing import time_steps
from gamfunc import tree
from gamfunc.compiling.compile import compile_with, fresh
from gamfunc.hvps import math_attention
from gamfunc.loss import grad_fn

# name: (classes, image size, batch)
SHAPES = {
    "tiny": (10, 8, 4),
    "resnet18": (10, 32, 128),
    "resnet50": (1000, 224, 64),
    "vit_s32": (1000, 224, 256),
}
ROWS = ("grad", "jvp_of_grad", "vjp_of_grad", "point_split", "point_fwd", "point_rev")


def build(name: str):
    classes, size, _ = SHAPES[name]
    if name == "tiny":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.GELU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * size * size, classes),
        )
    from reproduce.models import build_model

    return build_model(name, classes, size)


def loss_of(model, bf16: bool, device):
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    if not bf16:
        return loss_fn, params, buffers

    def bf16_loss(p, batch, b):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, new = loss_fn(p, batch, b)
        return loss.float(), new

    return bf16_loss, params, buffers


def regions(loss3, eps=1e-12):
    """The functions timed, each ``(params, buffers, batch, v) -> tensors``."""

    def loss_at(buffers):
        return lambda p, batch: loss3(p, batch, buffers)

    def grad(params, buffers, batch, v):
        g, (loss, _aux) = grad_fn(loss_at(buffers), batch)(params)
        return g, loss

    def jvp_of_grad(params, buffers, batch, v):
        with math_attention():
            g, hv, (loss, _aux) = torch.func.jvp(
                grad_fn(loss_at(buffers), batch), (params,), (v,), has_aux=True
            )
        return g, hv, loss

    def vjp_of_grad(params, buffers, batch, v):
        with math_attention():
            g, vjp_fn, (loss, _aux) = torch.func.vjp(
                grad_fn(loss_at(buffers), batch), params, has_aux=True
            )
            (hv,) = vjp_fn(v)
        return g, hv, loss

    def unit(g):
        return tree.scale(g, (tree.norm(g) + eps).reciprocal())

    def point_fwd(params, buffers, batch, v):
        g, _ = grad(params, buffers, batch, v)
        _, hv, loss = jvp_of_grad(params, buffers, batch, unit(g))
        return g, hv, loss

    def point_rev(params, buffers, batch, v):
        with math_attention():
            g, vjp_fn, (loss, _aux) = torch.func.vjp(
                grad_fn(loss_at(buffers), batch), params, has_aux=True
            )
            (hv,) = vjp_fn(unit(g))
        return g, hv, loss

    return {
        "grad": grad,
        "jvp_of_grad": jvp_of_grad,
        "vjp_of_grad": vjp_of_grad,
        "point_fwd": point_fwd,
        "point_rev": point_rev,
    }


def main(argv=None) -> dict:
    """Time every region against the gradient pass, print a table, write the JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        The result written.
    """
    ap = _common.add_flags(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--model", default=None, choices=sorted(SHAPES), help="resnet18 (quick: tiny)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--batch", type=int, default=0, help="0: the model's default")
    ap.add_argument(
        "--elementary-norms", action="store_true", help="gamfunc.nn.elementary_norms on the model"
    )
    ap.add_argument(
        "--no-sharing", action="store_true", help="compile without gamfunc.graph_sharing's pass"
    )
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--mode", default=None, help="torch.compile mode; GPU default reduce-overhead")
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--steps", type=int, default=None, help="steps per sample (10; quick 1)")
    ap.add_argument("--repeats", type=int, default=None, help="samples (5; quick 1)")
    ap.add_argument("--compile-only", action="store_true", help="fill inductor's caches and stop")
    a = ap.parse_args(argv)
    a.model = a.model or ("tiny" if a.quick else "resnet18")
    a.steps = a.steps or (1 if a.quick else 10)
    a.repeats = a.repeats or (1 if a.quick else 5)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mode = a.mode or ("reduce-overhead" if device.type == "cuda" else None)
    classes, size, batch_size = SHAPES[a.model]
    batch_size = a.batch or batch_size
    torch.manual_seed(0)
    model = build(a.model).to(device)
    if a.elementary_norms:
        gamfunc.nn.elementary_norms(model)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    loss3, params, buffers = loss_of(model, a.dtype == "bf16", device)
    x = torch.randn(batch_size, 3, size, size, device=device).to(memory_format=fmt)
    batch = (x, torch.randint(0, classes, (batch_size,), device=device))
    v = tree.normalize({k: torch.randn_like(p) for k, p in params.items()}, 1e-12)[0]
    no_pass = a.no_sharing and a.backend == "inductor"
    options = {"options": {"post_grad_custom_pre_pass": None}} if no_pass else {}
    compile_fn = compile_with(True, mode, {"backend": a.backend, **options})
    fns = {k: compile_fn(fresh(f)) for k, f in regions(loss3).items()}
    grad_c = fns["grad"]

    def point_split():
        g, _ = grad_c(params, buffers, batch, v)
        u = tree.scale(g, (tree.norm(g) + 1e-12).reciprocal())
        return fns["jvp_of_grad"](params, buffers, batch, u)

    calls = {k: (lambda f=f: f(params, buffers, batch, v)) for k, f in fns.items()}
    calls["point_split"] = point_split
    wanted = ["grad"] + [r for r in a.only.split(",") if r in calls and r != "grad"]
    rows: dict[str, dict] = {}
    for name in wanted:
        call = calls[name]
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t = time.perf_counter()
        try:
            call()
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # a region that cannot run (forward-mode AD of BN under autocast)
            rows[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
            print(f"{name:12s} fails: {rows[name]['error']}", flush=True)
            continue
        first = time.perf_counter() - t
        for _ in range(2):
            call()
        row = {"first_call_s": round(first, 1)}
        if device.type == "cuda":
            row["peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
        rows[name] = row
        print(f"{name:12s} ready in {first:.1f} s", flush=True)
    if a.compile_only:
        return {"rows": [{"region": name, **rows[name]} for name in wanted]}
    live = [n for n in wanted if "error" not in rows[n]]
    samples: dict[str, list[float]] = {n: [] for n in live}
    for r in range(a.repeats):
        order = live[r % len(live) :] + live[: r % len(live)]
        for name in order:
            samples[name].append(time_steps(calls[name], a.steps, device))
    unit_ms = statistics.median(samples["grad"])
    unit_mem = rows["grad"].get("peak_gib")
    for name in live:
        ms = statistics.median(samples[name])
        rows[name] |= {"ms": ms, "x_grad": ms / unit_ms, "samples_ms": samples[name]}
        if unit_mem:
            rows[name]["x_grad_mem"] = rows[name]["peak_gib"] / unit_mem
    meta = _common.metadata(
        "flops_passes", device, quick=a.quick, model=a.model, dtype=a.dtype, batch=batch_size
    )
    meta.update(channels_last=a.channels_last, args=vars(a))
    out = [{"region": name, **rows[name]} for name in wanted]
    result = {"benchmark": "flops_passes", "meta": meta, "rows": out}
    path = _common.save(result, a.out)
    print(f"\n{a.model} {a.dtype} channels_last={a.channels_last} batch {batch_size}, {device}\n")
    print(f"{_common.table(PASS_COLUMNS, out)}\n\nJSON: {path}")
    return result


PASS_COLUMNS = columns("flops_passes")


if __name__ == "__main__":
    main()
