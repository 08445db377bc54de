"""Every estimator in every precision through the public API, each step against float64: the GPU check.

``pytest -m gpu tests/library/test_gpu_check.py`` runs it on a CUDA machine (about 8 minutes on one
H100), one test per case; this module is its machinery. ``python tests/gpu_check.py`` runs the same
cases and prints a line for each; ``python tests/gpu_check.py --group MODEL:PRECISION:MODE`` is one of
its worker processes. From a checkout, ``python -m benchmarks.gpu_check`` runs them too and writes
their JSON to ``benchmarks/results/``. The module needs gamfunc, torch and tests/' own ``registry`` and
``models`` (the networks, written as reproduce/ writes them), nothing of the repository around it.

Cases: the estimators of :data:`CHECKED` (built by ``tests/registry.py``'s ``ESTIMATORS``) × {fp32,
bf16 (:func:`gamfunc.precision.bf16`)} × {a CIFAR ResNet with BatchNorm in channels-last, a small
ViT} × {eager, ``scope="pass"`` with CUDA graphs (``mode="reduce-overhead"``), ``scope="step"``, the
eager step replayed as one CUDA graph (:func:`gamfunc.cuda_graph`)}, plus the vmapped ensemble and the
``torch.optim`` facade on the device. The estimators with state of :data:`STATEFUL` run on the ResNet
only: its BatchNorm statistics travel in the step's state beside theirs.

Each compiled step of an estimator without state is called three times from the same parameters and
state (CUDA graphs: warm-up, recording, replay), and every result is checked after the last call, so
a replay that overwrote an earlier result is caught. An estimator with state (LookSAM's stored
component, Friendly-SAM's running mean, LookGAM's stored correction, all in ``StepState.est``) is
right only if its state is, so its case is a trajectory of :func:`trajectory` steps, each step from
the last one's parameters and state: its full and its reusing branch each run three times (warm-up,
recording, replay), and every step's update θ_t − θ_0 is checked against the float64 trajectory's
after the last step. The reference is the same step (or trajectory) of the same network in float64,
eager, on the same device. The relative error of the update ‖Δθ − Δθ₆₄‖/‖Δθ₆₄‖ must stay under the
precision's tolerance: fp32 (TF32 off) ``1e-4``, the rounding of cuDNN's convolution algorithms with
room; bf16 8·2⁻⁸, eight units of bfloat16's rounding (``tests/library/test_precision.py`` measures 1–5 units
on the CPU); an estimator that multiplies gradient rounding multiplies its tolerance by the same
factor (:func:`amplification`). The ResNet uses GELU: with ReLU, ∇L jumps where a rounding flips a
unit on or off, and a finite difference or a perturbed gradient is then not a rounding away from its
float64 value.

Groups of cases (model, precision, mode) run in worker processes in parallel (:func:`run_all`), so
their compiles overlap; every whole-step case is a group of its own.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a worker, run as a script: registry and models
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from models import CifarResNet, ViT  # noqa: E402
from registry import ESTIMATORS  # noqa: E402

import gamfunc  # noqa: E402
from gamfunc import tree  # noqa: E402
from gamfunc.loss import bind  # noqa: E402
from gamfunc.wrappers.precision import bf16  # noqa: E402
from gamfunc.wrappers.regional import compile_passes  # noqa: E402

__all__ = [
    "CHECKED",
    "MODES",
    "PRECISIONS",
    "STATEFUL",
    "TOLERANCE",
    "cases",
    "parser",
    "run_all",
    "run_group",
    "run_selected",
    "summary",
    "trajectory",
]

# One of each kind of estimator: every H·v backend, each oracle, both accelerated forms' passes.
CHECKED = (
    "gradient",
    "sam",
    "asam",
    "gnp_exact",
    "gam_exact",
    "gam_reverse",
    "gam_fd",
    "sam+gam",
    "gam_accelerated_paper",
    "gsam",
    "wsam",
    "looksam",
    "friendly_sam",
    "look_gam",
    "wsam_decoupled",
    "gsam_adaptive",
    "asam_masked",
    "friendly_sam_authors",
    "msam",
    "rwp",
)
# The estimators with state, each checked along a trajectory (trajectory()), on STATEFUL_MODELS.
STATEFUL = ("looksam", "friendly_sam", "look_gam", "friendly_sam_authors", "msam", "rwp")
STATEFUL_MODELS = ("resnet",)
PRECISIONS = ("fp32", "bf16")
MODES = ("eager", "pass", "step", "graph")
MODELS = ("resnet", "vit")
EXTRAS = (("vit", "fp32", "eager", "ensemble"), ("vit", "bf16", "eager", "ensemble"))
EXTRAS += (("resnet", "fp32", "eager", "facade"),)
# CUDA only: a `when=` policy's step in CUDA graphs against the same step eager (`_policy_graph`)
GRAPH_EXTRAS = (("resnet", "fp32", "graph", "adaptive"), ("resnet", "fp32", "graph", "late"))
TOLERANCE = {"fp32": 1e-4, "bf16": 8 * 2.0**-8}
# Estimators by the seconds their whole-step compile took on an H100, costliest first.
STEP_COST = (
    "look_gam",
    "sam+gam",
    "gam_exact",
    "gam_reverse",
    "gam_accelerated_paper",
    "looksam",
    "gnp_exact",
    "gam_fd",
    "asam",
    "gradient",
    "sam",
    "gsam",
    "wsam",
    "friendly_sam",
    "wsam_decoupled",
    "gsam_adaptive",
    "asam_masked",
    "friendly_sam_authors",
    "msam",
    "rwp",
)


def models_of(name: str) -> tuple[str, ...]:
    """The models ``name`` is checked on: :data:`STATEFUL_MODELS` for an estimator with state, every
    model for the others."""
    return STATEFUL_MODELS if name in STATEFUL else MODELS


def trajectory(name: str) -> int:
    """The steps of ``name``'s case: 1 without state (its compiled step is called :data:`CALLS`
    times from one state instead); with state, enough that each branch of its cycle (every = k)
    runs :data:`CALLS` times, from the first full step: k·(CALLS − 1) + 1 (7 for k = 3, 3 for a
    state without cycle)."""
    if name not in STATEFUL:
        return 1
    return ESTIMATORS[name]().every * (CALLS - 1) + 1


def amplification(name: str, reuse_ratio: float = 1.0) -> float:
    """How much an estimator multiplies gradient rounding: 1; 1 + 2·α·ρ/r for a finite-difference
    H·v, which takes the difference of two rounded gradients, divides it by r and scales it by α·ρ;
    |1 − a| + a for WSAM, whose direction (1 − a)·g + a·g_adv, a = γ/(1 − γ), sums two rounded
    gradients with these weights (17 at γ = 0.9), in either form (the decoupled one moves θ by
    lr·a·(g_adv − g) after the update); 1 + α·‖g_s‖/‖g_v‖ for LookSAM, whose steps
    between add α·‖g‖·g_v/‖g_v‖: g_v = g_s − ⟨ĝ, g_s⟩·ĝ, the part of SAM's gradient g_s orthogonal
    to g = ∇L, is a difference of rounded gradients, each off by a rounding of ‖g_s‖, so its
    direction is off by that over ‖g_v‖ = ‖g_s‖·sin∠(g, g_s), and the step by α·‖g‖ times that
    (``reuse_ratio`` = ‖g_s‖/‖g_v‖ = 1/sin∠(g, g_s), the largest over the full steps of the float64
    trajectory whose g_v a later step reuses: :func:`reference`).

    Args:
        name: a key of ``ESTIMATORS``.
        reuse_ratio: LookSAM's ‖g_s‖/‖g_v‖ (ignored for the other estimators).

    Returns:
        The factor on the precision's tolerance.
    """
    h = ESTIMATORS[name]().hparams
    if name in ("wsam", "wsam_decoupled"):
        a = float(h["gamma"]) / (1 - float(h["gamma"]))
        return abs(1 - a) + a
    if name == "looksam":
        return 1 + float(h["alpha"]) * reuse_ratio
    radius = getattr(h.get("hvp"), "radius", None)  # only a finite difference has one
    if radius is None:
        return 1.0
    return 1 + 2 * float(h["alpha"]) * float(h["rho"]) / float(radius)


def cases(device: str = "cuda") -> list[tuple[str, str, str, str]]:
    """Every case ``(model, precision, mode, estimator)`` of the check on ``device``: all modes on
    CUDA, the eager ones elsewhere, then the ensemble and facade cases (and on CUDA the adaptive
    policy's graphed step)."""
    cuda = device.startswith("cuda")
    modes = MODES if cuda else ("eager",)
    grid = [
        (m, p, mode, e)
        for mode in modes
        for m in MODELS
        for p in PRECISIONS
        for e in CHECKED
        if m in models_of(e)
    ]
    return grid + list(EXTRAS) + (list(GRAPH_EXTRAS) if cuda else [])


BATCH = 32  # images per batch


def build(model: str, device: torch.device, dtype=torch.float32, size: int = BATCH):
    """``(module, batch)``: the network (seeded) and one batch of ``size`` images of 16×16, on
    ``device``."""
    torch.manual_seed(0)
    if model == "resnet":
        # GELU: ∇L is then continuous, so the finite differences of fd and accelerated GAM compare
        # with float64 at rounding tolerance (with ReLU a rounding flips which units are active).
        net = CifarResNet([1, 1], num_classes=10, act=torch.nn.functional.gelu)
    else:
        net = ViT(image_size=16, patch=4, dim=64, depth=2, heads=4, mlp_dim=128, num_classes=10)
    net = net.to(device, dtype)
    if model == "resnet":
        net = net.to(memory_format=torch.channels_last)
    return net, data(model, device, dtype, size=size)


def data(model: str, device: torch.device, dtype=torch.float32, seed: int = 1, size: int = BATCH):
    """One batch of ``size`` images of 16×16 and their labels, drawn from ``seed``, on ``device``
    (channels-last for the ResNet): seed 1 is :func:`build`'s, a trajectory's step t takes 1 + t."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 3, 16, 16, generator=g)
    y = torch.randint(0, 10, (size,), generator=g)
    x = x.to(device, dtype)
    if model == "resnet":
        x = x.to(memory_format=torch.channels_last)
    return x, y.to(device)


CALLS = 3  # a compiled step's calls from one state: CUDA graphs warm up, record, replay


def _update(new, old):
    return {k: (new[k].double() - old[k].double()) for k in old}


def _rel(a, b) -> float:
    num = float(tree.norm(tree.sub(a, b)))
    den = float(tree.norm(b))
    return num / den if den > 0 else num


class Reference(NamedTuple):
    """The float64 trajectory: each step's update θ_t − θ_0 and loss, and for LookSAM the largest
    ‖g_s‖/‖g_v‖ of a full step whose g_v a later step reuses (1.0 for the others)."""

    updates: list
    losses: list
    reuse_ratio: float = 1.0


@functools.cache
def reference(
    model: str, estimator: str, device: torch.device, steps: int = 1, size: int = BATCH
) -> Reference:
    """The float64 eager trajectory of ``steps`` steps of ``estimator`` on the batches of
    :func:`batches` (see :class:`Reference`), computed once per process for all the precisions
    that compare with it."""
    net, _ = build(model, device, torch.float64)
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    step = gamfunc.make_step(ESTIMATORS[estimator](), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
    new, state, updates, losses, ratio = params, step.init(params, buffers), [], [], 1.0
    for t, batch in enumerate(batches(model, device, torch.float64, steps, size)):
        if estimator == "looksam" and int(state.cycle) % step.every == 0 and t < steps - 1:
            ratio = max(ratio, _reuse_ratio(step, new, state, batch))
        new, state, m = step(new, state, batch)
        updates.append(_update(new, params))
        losses.append(float(m["loss"]))
    return Reference(updates, losses, ratio)


def _reuse_ratio(step, params, state, batch) -> float:
    """‖g_s‖/‖g_v‖ of LookSAM's full step at ``params``: its direction g_s and the g_v it stores."""
    with torch.no_grad():
        est = step.estimator.run(
            params, batch, bind(step.loss_fn, state), step=state.step, state=state.est
        )
    return float(tree.norm(est.direction) / tree.norm(est.state.g_v))


def batches(model: str, device: torch.device, dtype, steps: int, size: int = BATCH) -> list:
    """The batches of a trajectory of ``steps`` steps, a new one each step (seeds 1, 2, ...), so
    that a state carried from one step to the next (a running mean, a stored component) meets
    gradients of other batches, as in training."""
    return [data(model, device, dtype, seed=1 + t, size=size) for t in range(steps)]


def _run(step, params, state, model, device, steps: int, calls: int, size: int) -> list:
    """``(new params, metrics)`` of each call: ``steps`` steps in a row from ``params`` and
    ``state`` on :func:`batches` (a trajectory), or with ``steps`` = 1 ``calls`` calls from the
    same ones on the same batch."""
    if steps == 1:
        batch = data(model, device, size=size)
        return [step(params, state, batch)[::2] for _ in range(calls)]
    outs = []
    for batch in batches(model, device, torch.float32, steps, size):
        params, state, metrics = step(params, state, batch)
        outs.append((params, metrics))
    return outs


def run_group(
    model: str, precision: str, mode: str, device: torch.device, names=CHECKED, size: int = BATCH
):
    """The rows of one (model, precision, mode) group: each estimator of ``names``, its error against
    float64, on batches of ``size`` images."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    net, _ = build(model, device)
    loss_fn, params, buffers = gamfunc.nn.functionalize(net)
    loss = bf16(loss_fn) if precision == "bf16" else loss_fn
    if mode == "pass":  # one set of compiled passes for every estimator of the group
        loss = compile_passes(loss, mode="reduce-overhead" if device.type == "cuda" else None)
    rows = []
    for name in names:
        row = {"model": model, "precision": precision, "mode": mode, "estimator": name}
        try:
            steps = trajectory(name)
            wants, want_losses, reuse_ratio = reference(model, name, device, steps, size)
            step = gamfunc.make_step(ESTIMATORS[name](), gamfunc.sgd(lr=0.1, momentum=0.9), loss)
            if mode == "step":
                step = step.compile()
            if mode == "graph":  # the eager step replayed as one CUDA graph
                step = gamfunc.cuda_graph(step, warmup=1)
            state = step.init(params, buffers)
            t0 = time.perf_counter()
            calls = 1 if mode == "eager" else CALLS
            outs = _run(step, params, state, model, device, steps, calls, size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            if steps == 1:  # every call against the one step
                wants, want_losses = wants * len(outs), want_losses * len(outs)
            pairs = list(zip(outs, wants, want_losses, strict=True))
            errors = [_rel(_update(new, params), want) for (new, _), want, _ in pairs]
            loss_errors = [abs(float(m["loss"]) - w) / abs(w) for (_, m), _, w in pairs]
            row["steps"] = steps
            row["update_rel_err"] = max(errors)
            row["loss_rel_err"] = max(loss_errors)
            row["skipped"] = max(int(m["skipped"]) for _, m in outs)
            tol = TOLERANCE[precision] * amplification(name, reuse_ratio)
            row["tolerance"] = tol
            if name == "looksam":
                row["reuse_ratio"] = reuse_ratio
            ok = row["update_rel_err"] < tol and row["loss_rel_err"] < tol and row["skipped"] == 0
            row["status"] = "pass" if ok else "fail"
        except Exception as e:  # a case that raises is a failed case, reported
            _failed(row, e)
        rows.append(row)
    return rows


def _without_buffers(loss_fn):
    """The two-argument loss of a network without buffers (the ViT)."""

    def plain(params, batch):
        return loss_fn(params, batch, {})[0]

    return plain


def extras(device: torch.device, size: int = BATCH) -> list[dict]:
    """The vmapped ensemble (each member against its own step) and the torch.optim facade (against
    ``make_step``), eager, fp32 and bf16, and on CUDA the adaptive and late policies' steps in
    CUDA graphs (`_policy_graph`), on batches of ``size`` images."""
    rows = []
    for precision in PRECISIONS:
        row = {"model": "vit", "precision": precision, "mode": "eager", "estimator": "ensemble"}
        try:
            net, batch = build("vit", device, size=size)
            loss_fn, params, _ = gamfunc.nn.functionalize(net)
            plain = _without_buffers(loss_fn)
            loss = bf16(plain) if precision == "bf16" else plain
            lrs = torch.tensor([0.05, 0.1, 0.2], device=device)

            def member(lr, loss=loss):
                return gamfunc.make_step(gamfunc.gam(0.05, 0.5), gamfunc.sgd(lr=lr), loss)

            ens = gamfunc.ensemble.vmap_step(member, {"lr": lrs})  # lr: a constant schedule
            stacked = gamfunc.ensemble.stack([params] * len(lrs))
            new, _, _ = ens(stacked, ens.init(stacked), batch)
            errs = []
            for i, lr in enumerate(lrs.tolist()):
                single = member(lr)
                want, _, _ = single(params, single.init(params), batch)
                got = {k: v[i] for k, v in new.items()}
                errs.append(_rel(_update(got, params), _update(want, params)))
            row["update_rel_err"], row["tolerance"] = max(errs), TOLERANCE[precision]
            row["status"] = "pass" if row["update_rel_err"] < row["tolerance"] else "fail"
        except Exception as e:
            _failed(row, e)
        rows.append(row)
    row = {"model": "resnet", "precision": "fp32", "mode": "eager", "estimator": "facade"}
    try:
        from gamfunc.torch_optim import GAM

        torch.backends.cudnn.allow_tf32 = False
        net, batch = build("resnet", device, size=size)
        loss_fn, params, buffers = gamfunc.nn.functionalize(copy.deepcopy(net))
        step = gamfunc.make_step(gamfunc.gam(0.05, 0.5), gamfunc.sgd(lr=0.1), loss_fn)
        want, _, _ = step(params, step.init(params, buffers), batch)
        opt = GAM(net, gamfunc.sgd(lr=0.1), rho=0.05, alpha=0.5)
        opt.step(batch)
        got = {k: p.detach() for k, p in net.named_parameters()}
        row["update_rel_err"] = _rel(_update(got, params), _update(want, params))
        row["tolerance"] = TOLERANCE["fp32"]
        row["status"] = "pass" if row["update_rel_err"] < row["tolerance"] else "fail"
    except Exception as e:
        _failed(row, e)
    rows.append(row)
    if device.type == "cuda":
        rows += [_policy_graph(device, extra[3], size) for extra in GRAPH_EXTRAS]
    return rows


def _failed(row: dict, e: Exception) -> None:
    """Mark ``row`` a failed case: the error's type and first line, and its traceback's end."""
    first = (str(e).splitlines() or [""])[0][:300]
    row.update(status="fail", error=f"{type(e).__name__}: {first}")
    row["trace"] = traceback.format_exc().splitlines()[-8:]


def _policy_graph(device: torch.device, name: str, size: int = BATCH) -> dict:
    """fd GAM (``gam_fd``) on the ResNet (its BatchNorm statistics in the state), fp32, under the
    policy ``name`` over 8 steps: ``adaptive`` (AE-SAM's trigger; its probe replayed as a graph,
    then the chosen branch's) or ``late`` (flat from step 4; the branch chosen on the host). The
    step replayed as CUDA graphs against the same step eager, over a trajectory: each step's choice
    must agree, both branches must run (a policy that is never or always flat would test one
    graph), and each update stay within fp32's tolerance times fd GAM's :func:`amplification`, as
    its whole-step case does."""
    row = {"model": "resnet", "precision": "fp32", "mode": "graph", "estimator": name}
    try:
        torch.backends.cudnn.allow_tf32 = False
        net, _ = build("resnet", device, size=size)
        loss_fn, params, buffers = gamfunc.nn.functionalize(net)
        steps = 8
        policy = {
            "adaptive": lambda: gamfunc.when.adaptive(steps, lambda1=1.2, lambda2=1.2),  # 4 of 8
            "late": lambda: gamfunc.when.late(4),
        }[name]()
        opt = gamfunc.sgd(0.1, momentum=0.9)
        step = gamfunc.make_step(ESTIMATORS["gam_fd"](), opt, loss_fn, when=policy)
        graphed = gamfunc.cuda_graph(step, warmup=1)
        eager, graph = (params, step.init(params, buffers)), (params, graphed.init(params, buffers))
        errs, choices = [], []
        for batch in batches("resnet", device, torch.float32, steps, size):
            *eager, m_e = step(*eager, batch)
            *graph, m_g = graphed(*graph, batch)
            choices.append((int(m_e["full_step"]), int(m_g["full_step"])))
            errs.append(_rel(_update(graph[0], params), _update(eager[0], params)))
        row["update_rel_err"] = max(errs)
        row["tolerance"] = TOLERANCE["fp32"] * amplification("gam_fd")
        row["flat_steps"] = sum(e for e, _ in choices)
        agree = all(e == g for e, g in choices)
        both = 0 < row["flat_steps"] < steps
        ok = agree and both and row["update_rel_err"] < row["tolerance"]
        row["status"] = "pass" if ok else "fail"
        if not agree:
            row["error"] = f"choices (eager, graphed) differ: {choices}"
        elif not both:
            row["error"] = f"one branch only: {row['flat_steps']} flat steps of {steps}"
    except Exception as e:
        _failed(row, e)
    return row


def _line(r: dict) -> str:
    err, tol = r.get("update_rel_err"), r.get("tolerance")
    what = f"rel err {err:.2e} ({err / tol:.2f} of tol)" if err is not None else r.get("error", "")
    return (
        f"{r['status']:8s} {r['model']:6s} {r['precision']:4s} {r['mode']:5s} "
        f"{r['estimator']:12s} {what}"
    )


def _group_rows(group: str, out: str) -> list[dict]:
    """The rows a worker printed, each also printed as a line; a worker that died is one failed row."""
    got = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("ROWS ")]
    if got:
        rows = got[0]
    else:
        model, precision, mode = ([*group.split(":"), "fp32", "-"])[:3]
        tail = " | ".join(out.strip().splitlines()[-6:])
        rows = [
            {
                "model": model,
                "precision": precision if precision in PRECISIONS else "fp32",
                "mode": mode,
                "estimator": "-",
                "status": "fail",
                "error": f"worker died: {tail}",
            }
        ]
    for r in rows:
        print(_line(r), flush=True)
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line's flags (``python -m benchmarks.gpu_check`` adds ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--group", default="", help="MODEL:PRECISION:MODE, or extras (a worker)")
    ap.add_argument("--estimators", default=",".join(CHECKED))
    ap.add_argument("--models", default=",".join(MODELS), help="of " + ",".join(MODELS))
    ap.add_argument("--size", type=int, default=BATCH, help="images per batch")
    ap.add_argument("--rows", default="", help="also write every case's row to this JSON file")
    return ap


def run_selected(args: argparse.Namespace) -> list[dict]:
    """Every case of the models and estimators ``args`` names (:func:`run_all`), each printed as a
    line as its group ends.

    Raises:
        SystemExit: ``--models`` names a model not in :data:`MODELS` (argparse's exit status 2).
    """
    models = tuple(args.models.split(","))
    if not set(models) <= set(MODELS):
        parser().error(f"--models: each of {', '.join(MODELS)}; got {args.models}")
    return run_all(args.device, size=args.size, models=models, names=args.estimators.split(","))


def summary(rows: list[dict], seconds: float) -> str:
    """The last line: cases passed and failed, and the seconds they took."""
    failed = sum(r["status"] != "pass" for r in rows)
    return f"gpu_check: {len(rows) - failed} passed, {failed} failed in {seconds:.1f} s"


def main(argv=None) -> int:
    """The command line: with ``--group``, one worker's group (its rows printed as one line of
    JSON); without, every case (:func:`run_selected`) and a summary line.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        1 if a case failed, else 0.
    """
    args = parser().parse_args(argv)
    if not args.group:
        start = time.time()
        rows = run_selected(args)
        seconds = time.time() - start
        if args.rows:
            Path(args.rows).write_text(json.dumps({"seconds": seconds, "rows": rows}))
        print(summary(rows, seconds))
        return 1 if any(r["status"] != "pass" for r in rows) else 0
    device = torch.device(args.device)
    if args.group == "extras":
        rows = extras(device, args.size)
    else:
        model, precision, mode = args.group.split(":")
        rows = run_group(model, precision, mode, device, args.estimators.split(","), args.size)
    # NaN and ±inf (an error that overflowed) travel as JSON's NaN/Infinity: json.loads reads them
    print("ROWS " + json.dumps(rows), flush=True)
    return 0


def groups(device: str, models=MODELS, names=CHECKED, extra: bool = True) -> list[tuple[str, list]]:
    """The worker groups ``(MODEL:PRECISION:MODE or extras, estimators)``, longest first, so that
    the pool's workers end together: a group of compiled passes (one compile per new pass, every
    estimator in turn), then each whole-step case alone, the costliest estimators first, then the
    CUDA-graph and eager groups."""
    modes = MODES if device.startswith("cuda") else ("eager",)

    def parts(mode):
        if mode != "step":
            return [list(names)]
        cost = sorted(names, key=lambda n: STEP_COST.index(n) if n in STEP_COST else 0)
        return [[n] for n in cost]

    order = [m for m in ("pass", "step", "graph", "eager") if m in modes]
    found = [
        (f"{m}:{p}:{mode}", on_model)
        for mode in order
        for part in parts(mode)
        for m in models
        for p in PRECISIONS
        if (on_model := [n for n in part if m in models_of(n)])
    ]
    return found + ([("extras", list(names))] if extra else [])


def run_all(
    device: str = "cuda", workers: int | None = None, size: int = BATCH, **selection
) -> list[dict]:
    """Every case of the check, each group in a worker process, ``workers`` at a time.

    Args:
        device: where the steps run.
        workers: groups at once (default: the cores less two, 8 to 16).
        size: images per batch.
        **selection: ``models``, ``names``, ``extra`` of :func:`groups`.

    Returns:
        One row per case: model, precision, mode, estimator, ``status`` (``pass`` or ``fail``),
        the errors against float64 and the tolerance, or the error that ended the case.
    """
    workers = workers or max(8, min(16, (os.cpu_count() or 8) - 2))
    # a worker imports the gamfunc this process imported: the checkout's (pytest's pythonpath) or
    # the installed one
    lib = str(Path(gamfunc.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (lib, os.environ.get("PYTHONPATH")) if p),
        "TORCHINDUCTOR_COMPILE_THREADS": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "2"),
    }
    if device == "cpu":  # workers side by side on the cores: threads of one would wait on another's
        env.setdefault("OMP_NUM_THREADS", "1")
    logs = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    pending, running, rows = groups(device, **selection), [], []
    while pending or running:
        while pending and len(running) < workers:
            g, part = pending.pop(0)
            cmd = [sys.executable, __file__, "--device", device, "--group", g]
            cmd += ["--estimators", ",".join(part), "--size", str(size)]
            log = open(logs / f"{g.replace(':', '_')}_{part[0]}.log", "w+")  # noqa: SIM115
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((g, proc, log))
        done = [r for r in running if r[1].poll() is not None]
        if not done:
            time.sleep(0.5)
            continue
        for g, proc, log in done:
            running.remove((g, proc, log))
            log.seek(0)
            rows += _group_rows(g, log.read())
            log.close()
    return rows


if __name__ == "__main__":
    sys.exit(main())
