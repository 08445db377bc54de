"""What exact GAM's passes compute, in gradient passes of matmul and convolution FLOPs: any machine.

Each region of :mod:`benchmarks.flops.passes` (``grad``, ``jvp_of_grad``, ``vjp_of_grad``, and a
point of Algorithm 1, g and H·g/‖g‖, by forward-over-reverse ``point_fwd`` or reverse-over-reverse
``point_rev``) is traced as inductor receives it after autograd (functional, inductor's
decompositions) and its FLOPs are counted by ``torch.utils.flop_counter``, in units of the ``grad``
region's, four ways:

=====================  ================================================================================
``native``             the model as built, the graph as traced
``native_shared``      the same graph after :func:`gamfunc.graph_sharing.share_equal_work`
``elementary``         BatchNorm and LayerNorm in elementary operations (:func:`gamfunc.nn.elementary_norms`)
``elementary_shared``  both: what ``step.compile()`` runs for a model prepared as ``reproduce/`` does
=====================  ================================================================================

A count is a property of the graph, not of the machine: the same on a CPU and a GPU, and a floor
under the time (the elementwise work and the memory traffic come on top). Exact GAM's step is two
points and the update, so ``2 × point_fwd`` is its cost in gradient passes.

    python -m benchmarks.flops                   # ResNet-18, ResNet-50, ViT-S/32 (CPU, minutes)
    python -m benchmarks.flops --quick           # the tiny conv net, seconds
"""

from __future__ import annotations

import argparse

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

import gamfunc
from benchmarks import _common
from benchmarks.flops.passes import SHAPES, build, loss_of, regions
from gamfunc import tree
from gamfunc.compiling.graph_sharing import share_equal_work

ROWS = ("grad", "jvp_of_grad", "vjp_of_grad", "point_fwd", "point_rev")
WAYS = ("native", "native_shared", "elementary", "elementary_shared")


def traced(fn, args, share: bool):
    """``fn`` as inductor receives it after autograd, with the sharing pass or without."""
    # Some of inductor's decompositions consult its lowerings: import them first.
    import torch._inductor.lowering
    from torch._inductor.decomposition import select_decomp_table

    functional = torch.func.functionalize(fn, remove="mutations_and_views")
    gm = make_fx(functional, tracing_mode="fake", decomposition_table=select_decomp_table())(*args)
    if share:
        share_equal_work(gm.graph)
        gm.recompile()
    return gm


def flops(fn, args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def count(model_name: str, batch_size: int, rows=ROWS) -> dict[str, dict[str, float]]:
    """``{row: {way: gradient passes}}`` for one model."""
    classes, size, _ = SHAPES[model_name]
    out: dict[str, dict[str, float]] = {r: {} for r in rows}
    for way in WAYS:
        torch.manual_seed(0)
        model = build(model_name)
        if way.startswith("elementary"):
            gamfunc.nn.elementary_norms(model)
        loss3, params, buffers = loss_of(model, False, torch.device("cpu"))
        x = torch.randn(batch_size, 3, size, size)
        batch = (x, torch.randint(0, classes, (batch_size,)))
        v = tree.normalize({k: torch.randn_like(p) for k, p in params.items()}, 1e-12)[0]
        args = (params, buffers, batch, v)
        fns = regions(loss3)
        unit = flops(fns["grad"], args)
        for row in rows:
            gm = traced(fns[row], args, share=way.endswith("shared"))
            out[row][way] = flops(gm, args) / unit
            print(f"{model_name:9s} {row:12s} {way:18s} {out[row][way]:6.3f}", flush=True)
    return out


MODELS = "resnet18,resnet50,vit_s32"


def main(argv=None) -> dict:
    """Count every region of every model, print a table, write the JSON.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        The result written: one row per model and region, a column per way of :data:`WAYS`.
    """
    ap = _common.add_flags(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--models", default=None, help=f"default {MODELS} (--quick: tiny)")
    ap.add_argument("--batch", type=int, default=2, help="FLOP ratios do not depend on it")
    ap.add_argument("--only", default=",".join(ROWS))
    a = ap.parse_args(argv)
    a.models = a.models or ("tiny" if a.quick else MODELS)
    rows = tuple(r for r in ROWS if r in a.only.split(","))
    unit = "matmul and convolution FLOPs of one gradient pass (forward and backward)"
    # A count is a property of the graph, the same on every machine: the JSON names no device.
    meta = _common.metadata("flops", "cpu", quick=a.quick, unit=unit, batch=a.batch)
    meta["slug"] = "any"
    result = {"benchmark": "flops", "meta": meta, "rows": []}
    for m in a.models.split(","):
        for region, ways in count(m, a.batch, rows).items():
            result["rows"].append({"model": m, "region": region, **ways})
    columns = [("model", "model", ""), ("region", "region", "")]
    columns += [(w, w, ".3f") for w in WAYS]
    path = _common.save(result, a.out)
    print(f"\n{_common.table(columns, result['rows'])}\n\nJSON: {path}")
    return result


if __name__ == "__main__":
    main()
