"""Step cost of every gamfunc estimator, as images/s against an eager ``torch.optim.SGD`` step.

Times whole training steps (forward, backward, the estimator's extra passes, the SGD-momentum update)
for a plain ``nn.Module`` + ``torch.optim.SGD(momentum=0.9)`` step, the denominator of every ratio,
and for ``gamfunc.make_step(estimator, gamfunc.sgd(lr, momentum=0.9), loss_fn)`` with each estimator,
eager and under ``torch.compile(fullgraph=True)``. The loss is ``gamfunc.nn.functional(model)``'s, so
BatchNorm running statistics travel in the step state; bf16 is ``torch.autocast`` inside the loss with
fp32 parameters. ρ follows a cosine schedule, so its value changes at every step, as in training.

The unit of the "× grad evals" column is the ``grad_eval`` row: one plain evaluation of ∇L(θ) of the
functional loss, no update. Eager, that is ``torch.autograd.grad`` on leaf copies of the parameters, the
cheaper of the two eager ways; compiled, ``torch.func.grad`` under ``torch.compile`` (``torch.autograd.grad``
cannot be traced with ``fullgraph=True``). The ``grad_eval_func`` row is ``torch.func.grad`` in every mode.

Timing: CUDA events on GPU, ``time.perf_counter`` on CPU; after a warm-up, every method is timed once per
round, in a rotating order, and the median over rounds is reported (interleaving keeps a noisy machine's
drift out of the ratios). ``--inductor KEY=VALUE`` passes inductor options to every compile;
``--profile N`` runs N more steps of each method under ``torch.profiler`` after the timing and stores
kernel counts, device and host time per step and the top kernels (CPU: the top aten ops) in the JSON.

Commands (one H100; benchmarks/README.md has the others and what each column means):

    python benchmarks/step_cost.py --model resnet18 --modes eager,compile --compile-jobs 9 --out r18.json
    python benchmarks/step_cost.py --model resnet50,vit_s32 --modes eager --out r50_vit.json

The first takes about 7–8 minutes (the slowest compile is cut at ``--compile-timeout`` 360 s), the
second about 4–5.

CPU smoke run (seconds, no timing claims): ``python benchmarks/step_cost.py --tiny``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import datetime
import gc
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import typing
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for `reproduce`, when run as `python benchmarks/step_cost.py`
    sys.path.insert(0, str(ROOT))

import gamfunc  # noqa: E402
from gamfunc.optim import schedules  # noqa: E402

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")  # first jvp, from torch._decomp
warnings.filterwarnings("ignore", message=".*Profiler clears events.*")  # --profile, torch 2.11

BASELINE = "torch_sgd"
METHODS = (
    "grad_eval",
    "grad_eval_func",
    "gradient",
    "sam",
    "gnp",
    "gam_exact",
    "gam_reverse",
    "gam_fd",
    "gam_accelerated",
    "sam_gam",
    "gam_every10",
)
# name: (num_classes, image_size, batch size)
MODELS = {
    "resnet18": (10, 32, 128),
    "resnet50": (1000, 224, 64),
    "vit_s32": (1000, 224, 128),
    "tiny": (10, 8, 4),
}


# ------------------------------------------------------------------------------------------ models


class TinyNet(nn.Module):
    """Two conv-BN-ReLU layers and a linear head: the ``--tiny`` model (8×8 inputs)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.features(x))


def build_model(name: str) -> tuple[nn.Module, str]:
    """The network ``name`` and where it came from (``reproduce.models`` or a torchvision fallback)."""
    num_classes, image_size, _ = MODELS[name]
    if name == "tiny":
        return TinyNet(num_classes), "benchmarks.step_cost.TinyNet"
    try:
        from reproduce.models import build_model as reproduce_build
    except ImportError:
        reproduce_build = None
    if reproduce_build is not None:
        return reproduce_build(name, num_classes, image_size), "reproduce.models"
    import torchvision

    if name == "resnet18":  # CIFAR variant: 3×3 stride-1 stem, no max-pool
        net = torchvision.models.resnet18(num_classes=num_classes)
        net.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif name == "resnet50":
        net = torchvision.models.resnet50(num_classes=num_classes)
    else:  # ViT-S/32
        net = torchvision.models.VisionTransformer(
            image_size=image_size,
            patch_size=32,
            num_layers=12,
            num_heads=6,
            hidden_dim=384,
            mlp_dim=1536,
            num_classes=num_classes,
        )
    return net, "torchvision (fallback)"


# -------------------------------------------------------------------------------------- estimators


EVERY = re.compile(r"(gam|sam_gam)_every(\d+)")  # GAM on one step in k (paper Appendix C.3)


def method_names(only) -> list[str]:
    """``only`` in a stable order: METHODS first, then the ``*_every<k>`` names by base and k."""
    matches = (EVERY.fullmatch(m) for m in only if m not in METHODS)
    extra = sorted((m[1], int(m[2]), m[0]) for m in matches if m)
    return [m for m in METHODS if m in only] + [name for *_, name in extra]


def build_methods(a, names=()) -> dict[str, tuple]:
    """name -> (estimator, every, base, gradient evaluations per step or None where HVPs are not
    gradients). ``names`` may add ``gam_every<k>`` (GAM on one step in k, plain gradient steps
    between) and ``sam_gam_every<k>`` (SAM+GAM on one step in k, SAM steps between)."""
    rho = schedules.cosine(a.rho, total_steps=100_000)
    rho_prime = schedules.cosine(a.rho, total_steps=100_000)
    fd_grads = a.composite_hvp == "fd"
    gam = gamfunc.gam(rho, a.alpha, hvp=a.composite_hvp)
    sam = gamfunc.sam(rho)
    sam_gam = gamfunc.gam(rho, a.alpha, hvp=a.composite_hvp, oracle=sam)
    methods = {
        "grad_eval": (None, 1, None, 1.0),
        "grad_eval_func": (None, 1, None, 1.0),
        "gradient": (gamfunc.gradient(), 1, None, 1.0),
        "sam": (sam, 1, None, 2.0),
        "gnp": (gamfunc.gnp(a.alpha), 1, None, 2.0),
        "gam_exact": (gamfunc.gam(rho, a.alpha, hvp="exact"), 1, None, None),
        "gam_reverse": (gamfunc.gam(rho, a.alpha, hvp="reverse"), 1, None, None),
        "gam_fd": (gamfunc.gam(rho, a.alpha, hvp="fd"), 1, None, 4.0),
        "gam_accelerated": (
            gamfunc.gam_accelerated(rho, rho_prime, alpha=0.5, beta=0.5, gamma=0.1),
            1,
            None,
            4.0,
        ),
        "sam_gam": (sam_gam, 1, None, 5.0 if fd_grads else None),
    }
    for name in ["gam_every10", *names]:
        match = EVERY.fullmatch(name)
        if match is None:
            continue
        k = int(match[2])
        if match[1] == "gam":  # k - 1 gradient steps and one GAM step of 4 gradients
            methods[name] = (gam, k, None, (k + 3) / k if fd_grads else None)
        else:  # k - 1 SAM steps of 2 gradients and one SAM+GAM step of 5
            methods[name] = (sam_gam, k, sam, (2 * k + 3) / k if fd_grads else None)
    return methods


# ----------------------------------------------------------------------------------------- runners


def autocast(device: torch.device, dtype: str):
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


class TorchSGD:
    """The baseline: ``nn.Module`` forward/backward and ``torch.optim.SGD(momentum=0.9)``, eager."""

    def __init__(self, model, batch, lr, device, dtype):
        self.model, self.batch = copy.deepcopy(model).train(), batch
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.device, self.dtype = device, dtype
        self.every, self.compiled = 1, False

    def __call__(self):
        x, y = self.batch
        self.opt.zero_grad(set_to_none=True)
        with autocast(self.device, self.dtype):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()

    def set_lr(self, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr


def split_mode(mode: str) -> tuple[str, str]:
    """``(scope, torch.compile mode)`` of a ``--modes`` entry: "pass" and "pass-<mode>" are
    ``step.compile(scope="pass")`` (:mod:`gamfunc.regional`: each gradient or H·v pass compiled, the
    step around them eager), anything else the whole step (``scope="step"``)."""
    if mode == "pass":
        return "pass", "compile"
    if mode.startswith("pass-"):
        return "pass", mode.removeprefix("pass-")
    return "step", mode


def compile_options(mode: str, inductor=None) -> dict:
    """The inductor options a compile in ``mode`` runs with: the mode's own
    (``torch._inductor.list_mode_options``), then ``inductor`` (``--inductor``) over them."""
    mode = split_mode(mode)[1]
    base = {} if mode in ("eager", "compile") else torch._inductor.list_mode_options(mode)
    return {**base, **(inductor or {})}


class Functional:
    """A ``gamfunc.make_step`` step on ``gamfunc.nn.functional(model)``'s loss, eager or compiled
    (``step.compile(fullgraph=True, mode=..., scope=..., options=inductor)``, see :func:`split_mode`)."""

    def __init__(self, step, params, buffers, batch, mode, every, inductor=None):
        self.step, self.batch, self.every = step, batch, every
        self.compiled = mode != "eager"
        self.cuda_graphs = self.compiled and bool(
            compile_options(mode, inductor).get("triton.cudagraphs")
        )
        kwargs = {"options": dict(inductor)} if inductor else {}
        scope, base = split_mode(mode)
        if base not in ("eager", "compile"):
            kwargs["mode"] = base
        self.fn = step.compile(fullgraph=True, scope=scope, **kwargs) if self.compiled else step
        self.params = {k: v.clone() for k, v in params.items()}
        self.state = step.init(self.params, {k: v.clone() for k, v in buffers.items()})

    def __call__(self):
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        self.params, self.state, _ = self.fn(self.params, self.state, self.batch)

    def set_lr(self, lr):
        # A new 0-d tensor for a constant lr: how a scheduler drives the step without recompiling.
        old = self.state["opt"]["lr"]
        self.state["opt"] = {
            **self.state["opt"],
            "lr": torch.tensor(lr, dtype=old.dtype, device=old.device),
        }


def autograd_grad(loss_fn):
    """``(params, batch, buffers) -> (∇L(θ), new_buffers)`` through ``torch.autograd.grad``: leaf
    copies of the parameters, one forward under ``torch.enable_grad()``, one backward. The same
    result as ``torch.func.grad(loss_fn, has_aux=True)``, without functorch's wrapping (eager only:
    ``torch.compile(fullgraph=True)`` cannot trace ``torch.autograd.grad``)."""

    def grad(params, batch, buffers):
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
            loss, aux = loss_fn(leaves, batch, buffers)
            grads = torch.autograd.grad(
                loss, list(leaves.values()), allow_unused=True, materialize_grads=True
            )
        return dict(zip(leaves, grads, strict=True)), aux

    return grad


class GradEval:
    """One plain evaluation of ∇L(θ) of the functional loss (BatchNorm buffers as its third
    argument), without an update. ``impl="autograd"`` (the ``grad_eval`` row, the unit of "× grad
    evals"): ``torch.autograd.grad`` eager, compiled ``torch.func.grad`` in compiled modes, where
    ``torch.autograd.grad`` cannot be traced; ``impl="func"`` (``grad_eval_func``):
    ``torch.func.grad`` in every mode."""

    def __init__(self, loss_fn, params, buffers, batch, mode, impl="autograd", inductor=None):
        if impl not in ("autograd", "func"):
            raise ValueError(f"impl must be 'autograd' or 'func'; got {impl!r}")
        self.batch, self.every = batch, 1
        self.compiled = mode != "eager"
        options = compile_options(mode, inductor)
        self.cuda_graphs = self.compiled and bool(options.get("triton.cudagraphs"))
        if self.compiled:
            grad = torch.func.grad(loss_fn, has_aux=True)
            self.fn = torch.compile(grad, fullgraph=True, options=options)
            self.impl = "torch.func.grad"
        elif impl == "autograd":
            self.fn, self.impl = autograd_grad(loss_fn), "torch.autograd.grad"
        else:
            self.fn, self.impl = torch.func.grad(loss_fn, has_aux=True), "torch.func.grad"
        self.params = {k: v.clone() for k, v in params.items()}
        self.buffers = {k: v.clone() for k, v in buffers.items()}

    def __call__(self):
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        self.grads, _ = self.fn(self.params, self.batch, self.buffers)

    def set_lr(self, lr):
        pass  # no optimiser


def functional_loss(model, device, dtype):
    loss_fn, params, buffers = gamfunc.nn.functional(model)
    if dtype == "fp32":
        return loss_fn, params, buffers

    def bf16_loss(params, batch, buffers):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, new_buffers = loss_fn(params, batch, buffers)
        return loss.float(), new_buffers

    return bf16_loss, params, buffers


# ------------------------------------------------------------------------------------------ timing


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(run, n: int, device) -> float:
    """Milliseconds per step over ``n`` consecutive steps."""
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    t = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t) * 1e3 / n


TOP = 15  # kernels (CUDA) or aten ops (CPU) kept per profiled method
NAME_CHARS = 80


def _top(table: dict, n_steps: int, time_key: str) -> list[dict]:
    """``table`` name -> [calls, µs] as the ``TOP`` entries with the most µs, per step."""
    top = sorted(table.items(), key=lambda kv: -kv[1][1])[:TOP]
    return [
        {"name": name[:NAME_CHARS], "calls_per_step": calls / n_steps, time_key: us / n_steps}
        for name, (calls, us) in top
    ]


def profile_steps(runner, n: int, device) -> dict:
    """Run ``n`` more steps (rounded up to a multiple of ``every``) under ``torch.profiler.profile``,
    CPU and CUDA activities on CUDA, and summarise them per step.

    ``host_ms``: wall time of the loop that issues the steps, without waiting for the device, under
    the profiler (which slows the host); ``host_ms_unprofiled``: the same loop just before, without
    it. CUDA: ``device_kernels`` and ``device_ms`` (kernel count and summed kernel time),
    ``device_memops`` and ``device_memops_ms`` (memcpy and memset), ``graph_launches``
    (``cudaGraphLaunch`` calls) and ``top_kernels``. Kernels replayed from a CUDA graph appear one by
    one only where CUPTI traces graph nodes; otherwise a replay is a graph launch with no kernels, and
    ``note`` says so. CPU: ``aten_ops`` (every ``aten::`` call, nested ones too) and ``top_ops`` by
    self CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    steps = n if runner.every == 1 else runner.every * math.ceil(n / runner.every)
    cuda = device.type == "cuda"
    out = {"steps": steps}

    def host_ms() -> float:  # issuing the steps, without waiting for the device
        t = time.perf_counter()
        for _ in range(steps):
            runner()
        return (time.perf_counter() - t) * 1e3 / steps

    sync(device)
    out["host_ms_unprofiled"] = host_ms()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        out["host_ms"] = host_ms()
        sync(device)
    events = prof.events()
    if cuda:
        kernels, memops, launches = {}, {}, 0
        for e in events:
            if e.device_type == DeviceType.CPU:
                launches += e.name == "cudaGraphLaunch"
                continue
            if e.device_type != DeviceType.CUDA:
                continue
            # Device-side annotations span kernels: counting them would count twice.
            # (torch 2.11 has no activity_type on its events: tell them apart by name.)
            kind = getattr(e, "activity_type", None) or ""
            memop = e.name.startswith(("Memcpy", "Memset")) or "memcpy" in kind or "memset" in kind
            if memop:
                table = memops
            elif kind == "kernel" or not (kind or getattr(e, "is_user_annotation", False)):
                table = kernels
            else:
                continue
            entry = table.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us()
        out["device_kernels"] = sum(c for c, _ in kernels.values()) / steps
        out["device_ms"] = sum(us for _, us in kernels.values()) / steps / 1e3
        out["device_memops"] = sum(c for c, _ in memops.values()) / steps
        out["device_memops_ms"] = sum(us for _, us in memops.values()) / steps / 1e3
        out["graph_launches"] = launches / steps
        out["top_kernels"] = _top(kernels, steps, "us_per_step")
        if launches:
            out["note"] = (
                "CUDA graphs: kernels replayed from a graph are counted only where the profiler "
                "traced them one by one"
                + ("" if kernels else "; it traced none, so device_* hold no graph work")
            )
    else:
        ops = {}
        for e in events:
            if e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
                entry = ops.setdefault(e.name, [0, 0.0])
                entry[0] += 1
                entry[1] += e.self_cpu_time_total
        out["aten_ops"] = sum(c for c, _ in ops.values()) / steps
        out["top_ops"] = _top(ops, steps, "self_us_per_step")
    return out


def profile_summary(p: dict) -> str:
    """One line of ``profile_steps``' result."""
    if "error" in p:
        return f"profile failed, {p['error'][:200]}"
    s = f"profile over {p['steps']} steps: host {p['host_ms']:.3f} ms/step"
    s += f" ({p['host_ms_unprofiled']:.3f} unprofiled)"
    if "device_kernels" in p:
        s += f", {p['device_kernels']:.1f} kernels/step, device {p['device_ms']:.3f} ms/step"
        if p["graph_launches"]:
            s += f", {p['graph_launches']:.1f} graph launches/step"
        top = p["top_kernels"]
    else:
        s += f", {p['aten_ops']:.1f} aten ops/step"
        top = p["top_ops"]
    if top:
        us = top[0].get("us_per_step", top[0].get("self_us_per_step"))
        s += f"; top: {top[0]['name'][:60]} {us:.1f} µs/step"
    return s


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f} s] {msg}", file=sys.stderr, flush=True)


def setup(row, make_runner, a, device, batch_bytes):
    """Build a runner, time its first call(s) (the compile), warm it up, count recompiles as lr and ρ
    change at every step, and measure its peak memory. Fills ``row``; returns the runner."""
    gc.collect()
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    skips0 = cudagraph_skips()
    runner = make_runner()
    first_calls = 2 if runner.every > 1 and runner.compiled else 1  # both branches compile
    t = time.perf_counter()
    for _ in range(first_calls):
        runner()
    sync(device)
    row["compile_s" if runner.compiled else "first_call_s"] = time.perf_counter() - t
    if a.compile_only:
        return runner
    if device.type == "cuda":  # what compiling and autotuning allocated is not the step's
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(a.warmup):
        runner()
    if runner.compiled:  # over a full cycle of `every`, so that both branches run again
        check = max(a.recompile_steps, runner.every + 1 if runner.every > 1 else 0)
        graphs = dynamo_graphs()
        for i in range(check):
            runner.set_lr(a.lr * (1 + 0.01 * (i + 1)))
            runner()
        runner.set_lr(a.lr)
        row["recompiles"] = dynamo_graphs() - graphs
        row["cudagraph_skips"] = cudagraph_skips() - skips0
    sync(device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base + batch_bytes
        row["peak_mem_gib"] = peak / 2**30
    return runner


def interleaved(runners: dict, a, device) -> tuple[dict, dict]:
    """ms/step samples per runner, one per round, runners in a rotating order; and the errors of
    runners that failed while timed (they leave the rounds)."""
    names = list(runners)
    samples, errors = {k: [] for k in names}, {}
    for r in range(a.repeats if names else 0):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if name in errors:
                continue
            runner = runners[name]
            n = a.block if runner.every == 1 else runner.every * math.ceil(a.block / runner.every)
            try:
                samples[name].append(time_steps(runner, n, device))
            except Exception as e:
                errors[name] = f"timing: {type(e).__name__}: {str(e).strip()[:300]}"
    return {k: v for k, v in samples.items() if k not in errors}, errors


# ------------------------------------------------------------------------------ one model and dtype


def prepare(model_name, dtype, a, device):
    """The model, one fixed random batch, and the functional loss with its params and buffers."""
    num_classes, image_size, default_batch = MODELS[model_name]
    bs = a.batch_size or default_batch
    torch.manual_seed(0)
    model, source = build_model(model_name)
    model = model.to(device).train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(bs, 3, image_size, image_size, generator=gen)
    y = torch.randint(0, num_classes, (bs,), generator=gen)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    batch = (x.to(device), y.to(device))
    loss_fn, params, buffers = functional_loss(model, device, dtype)
    return argparse.Namespace(
        model=model, source=source, batch=batch, loss_fn=loss_fn, params=params, buffers=buffers
    )


def runner_factory(method, mode, dtype, g, methods, a, device):
    if method == BASELINE:
        return lambda: TorchSGD(g.model, g.batch, a.lr, device, dtype)
    if method in ("grad_eval", "grad_eval_func"):
        impl = "func" if method == "grad_eval_func" else "autograd"
        return lambda: GradEval(
            g.loss_fn, g.params, g.buffers, g.batch, mode, impl, a.inductor_options
        )
    est, every, base, _ = methods[method]
    opt = gamfunc.sgd(lr=a.lr, momentum=0.9)
    step = gamfunc.make_step(
        est, opt, g.loss_fn, every=every, base=base, on_nonfinite=a.on_nonfinite
    )
    return lambda: Functional(step, g.params, g.buffers, g.batch, mode, every, a.inductor_options)


def run_group(model_name, dtype, a, device, meta, save=None) -> list[dict]:
    """Set up, then time (interleaved), the baseline and every selected method in every mode.
    ``save(rows)`` is called once all are set up, before the timing."""
    g = prepare(model_name, dtype, a, device)
    meta["model_source"][model_name] = g.source
    batch_bytes = sum(t.numel() * t.element_size() for t in g.batch)
    methods = build_methods(a, a.only)
    plan = [] if a.compile_only else [(BASELINE, "eager")]
    plan += [(m, mode) for mode in a.modes for m in method_names(a.only)]
    rows = {
        (method, mode): {
            "model": model_name,
            "dtype": dtype,
            "mode": mode,
            "method": method,
            "batch": g.batch[0].shape[0],
            "grads": methods[method][3] if method in methods else None,
            "error": None,
        }
        for method, mode in plan
    }
    runners = {}

    def set_up(method, mode, pre=None):
        row, key = rows[(method, mode)], f"{model_name} {dtype} {method}/{mode}"
        if pre is not None:
            row["compile_cold_s"] = pre.get("compile_s")
            if pre["error"] and "out of memory" not in pre["error"].lower():
                row["error"] = f"pre-compile: {pre['error']}"
                log(f"{key}: skipped, {row['error'][:160]}")
                return
        try:
            make = runner_factory(method, mode, dtype, g, methods, a, device)
            runners[(method, mode)] = setup(row, make, a, device, batch_bytes)
            if hasattr(runners[(method, mode)], "impl"):
                row["grad_impl"] = runners[(method, mode)].impl
            log(
                f"{key}: ready"
                + (f", compile {row['compile_s']:.1f} s" if "compile_s" in row else "")
            )
        except Exception as e:  # one failing method must not end the run
            row["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
            log(f"{key}: FAILED, {row['error'][:200]}")
            runners.pop((method, mode), None)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    compiled = [p for p in plan if p[1] != "eager"]
    use_pool = a.compile_jobs > 0 and not a.compile_only
    pool = Precompiler(
        a, [(model_name, dtype, mode, m) for m, mode in compiled] if use_pool else []
    )
    try:
        for method, mode in plan:  # eager ones first, while the workers compile the others
            if mode == "eager":
                set_up(method, mode)
        if use_pool:  # each compiled step as soon as its worker has filled the caches
            for (_, _, mode, method), pre in pool.completed():
                set_up(method, mode, pre)
        else:
            for method, mode in compiled:
                set_up(method, mode)
    finally:
        pool.close()  # no worker may run while steps are timed
    if save is not None:
        save(list(rows.values()))
    if not a.compile_only:
        log(f"{model_name} {dtype}: timing {len(runners)} steps, {a.repeats} rounds")
        samples, errors = interleaved(runners, a, device)
        for key, error in errors.items():
            rows[key]["error"] = error
        for key, ms in samples.items():
            row = rows[key]
            row.update(ms=statistics.median(ms), ms_samples=ms)
            row["img_s"] = row["batch"] / row["ms"] * 1e3
        _ratios(list(rows.values()))
        if a.profile:  # after all timing, so that the profiler never runs beside a timed step
            for key in samples:
                method, mode = key
                try:
                    rows[key]["profile"] = profile_steps(runners[key], a.profile, device)
                except Exception as e:
                    rows[key]["profile"] = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
                log(
                    f"{model_name} {dtype} {method}/{mode}: {profile_summary(rows[key]['profile'])}"
                )
    return list(rows.values())


def release(device):
    """Drop the compiled graphs and cached memory of a finished group."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _ratios(rows):
    """× eager torch.optim SGD (images/s), × the plain gradient step of the same mode (ms),
    × floor = ms over (gradient evaluations × the gradient step's ms), and × grad evals = ms over
    (gradient evaluations × the ``grad_eval`` row's ms in the same mode): what the step adds to its
    gradient evaluations. ``grad_eval`` is the cheapest plain evaluation of the mode
    (``torch.autograd.grad`` eager, compiled ``torch.func.grad`` compiled), so ``grad_eval_func``'s
    × grad evals is ``torch.func.grad`` against it."""
    by = {(r["mode"], r["method"]): r for r in rows if r.get("ms")}
    base = by.get(("eager", BASELINE))
    for r in rows:
        if not r.get("ms"):
            continue
        if base:
            r["x_sgd"] = r["img_s"] / base["img_s"]
        grad = by.get((r["mode"], "gradient"))
        if grad and r["method"] != BASELINE:
            r["x_grad"] = r["ms"] / grad["ms"]
            if r["grads"]:
                r["x_floor"] = r["ms"] / (r["grads"] * grad["ms"])
        evals = by.get((r["mode"], "grad_eval"))
        if evals and r["grads"] and r["method"] not in (BASELINE, "grad_eval"):
            r["x_evals"] = r["ms"] / (r["grads"] * evals["ms"])


def _vs_fp32(rows):
    fp32 = {(r["model"], r["mode"], r["method"]): r for r in rows if r["dtype"] == "fp32"}
    for r in rows:
        ref = fp32.get((r["model"], r["mode"], r["method"]))
        if r["dtype"] != "fp32" and ref and ref.get("img_s") and r.get("img_s"):
            r["x_fp32"] = r["img_s"] / ref["img_s"]


# ------------------------------------------------------------------------------ pre-compile workers


FORWARDED = (
    "device",
    "threads",
    "batch_size",
    "lr",
    "rho",
    "alpha",
    "composite_hvp",
    "on_nonfinite",
    "recompile_limit",
)


class Precompiler:
    """Compiles steps once in parallel worker processes (this script with ``--compile-only``), so that
    the compiles in this process hit inductor's on-disk caches and take seconds. A worker still
    running after ``--compile-timeout`` seconds is ended, with its compile subprocesses.

    A job is (model, dtype, mode, method); its result ``{"compile_s": cold compile seconds,
    "error": ...}``. ``close()`` ends whatever still runs."""

    def __init__(self, a, jobs):
        self.a, self.pending, self.running, self.results = a, list(jobs), {}, {}
        threads = max(2, (os.cpu_count() or 2) // max(1, a.compile_jobs))
        self.env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
        self.tmp = Path(tempfile.mkdtemp(prefix="step_cost_"))
        self.common = []
        for k in FORWARDED:
            if getattr(a, k) is not None:
                self.common += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
        for flag in ("tiny", "no_loop_reorder", "channels_last"):
            if getattr(a, flag):
                self.common.append(f"--{flag.replace('_', '-')}")
        for item in a.inductor:  # the same compile, so that the workers fill the right caches
            self.common += ["--inductor", item]
        if jobs:
            log(
                f"pre-compiling {len(jobs)} steps, {a.compile_jobs} at a time, {threads} threads "
                f"each; worker logs in {self.tmp}"
            )
        self.poll()

    def poll(self):
        for job, (proc, t0, out, logf) in list(self.running.items()):
            if proc.poll() is None and time.perf_counter() - t0 < self.a.compile_timeout:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and its compile subprocesses
                proc.wait()
                res = {"error": f"compile did not finish in {self.a.compile_timeout:.0f} s"}
            elif out.exists():
                row = json.loads(out.read_text())["rows"][0]
                res = {"compile_s": row.get("compile_s"), "error": row.get("error")}
            else:
                tail = out.with_suffix(".log").read_text()[-300:]
                res = {"error": f"worker exited with {proc.returncode}: {tail}"}
            logf.close()
            del self.running[job]
            self.results[job] = res
            status = res["error"] or f"cold compile {res['compile_s']:.1f} s"
            log(f"pre-compiled {'/'.join(job)}: {status[:200]}")
        while self.pending and len(self.running) < self.a.compile_jobs:
            job = self.pending.pop(0)
            model, dtype, mode, method = job
            out = self.tmp / f"{'_'.join(job)}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--compile-only",
                "--out",
                str(out),
            ]
            cmd += ["--model", model, "--dtype", dtype, "--modes", mode, "--only", method]
            logf = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed when the worker ends
            proc = subprocess.Popen(
                cmd + self.common,
                env=self.env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.running[job] = (proc, time.perf_counter(), out, logf)

    def completed(self):
        """Yield ``(job, result)`` as the workers finish, in the order they finish."""
        seen = set()
        while self.pending or self.running or len(seen) < len(self.results):
            for job in [j for j in self.results if j not in seen]:
                seen.add(job)
                yield job, self.results[job]
            if self.pending or self.running:
                time.sleep(0.5)
                self.poll()

    def close(self):
        for proc, _, _, logf in self.running.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            logf.close()
        self.running.clear()


# ---------------------------------------------------------------------------------------- reports


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def table(rows) -> str:
    head = (
        "| model | dtype | mode | method | ms/step | img/s | × eager SGD | × grad step | × floor "
        "| × grad evals | × fp32 | peak GiB | compile s | recompiles | note |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        note = r["error"] or ""
        if r.get("cudagraph_skips"):
            note = f"CUDA graphs skipped ({r['cudagraph_skips']})"
        compile_s = r.get("compile_s")
        if r.get("compile_cold_s") is not None:
            compile_s = r["compile_cold_s"]
        cells = [
            r["model"],
            r["dtype"],
            r["mode"],
            r["method"],
            fmt(r.get("ms"), ".2f"),
            fmt(r.get("img_s"), ".0f" if r.get("img_s", 0) >= 100 else ".3g"),
            fmt(r.get("x_sgd"), ".3f"),
            fmt(r.get("x_grad"), ".2f"),
            fmt(r.get("x_floor"), ".2f"),
            fmt(r.get("x_evals"), ".2f"),
            fmt(r.get("x_fp32"), ".2f"),
            fmt(r.get("peak_mem_gib"), ".2f"),
            fmt(compile_s, ".1f"),
            fmt(r.get("recompiles"), "d"),
            note.replace("|", "/").replace("\n", " ")[:120],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metadata(a, device) -> dict:
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "no_loop_reorder": a.no_loop_reorder,
        "loop_ordering_after_fusion": torch._inductor.config.loop_ordering_after_fusion,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "recompile_limit": a.recompile_limit,
        "inductor_options": a.inductor_options,
        "model_source": {},
        "args": vars(a),
    }
    return meta


# -------------------------------------------------------------------------------------------- CLI


def inductor_options(items) -> dict:
    """``--inductor KEY=VALUE`` items as an options dict: VALUE by ``ast.literal_eval`` (``True``,
    ``8``, ``"x"``, ``(1, 2)``), else the string itself, also where the option is a string. A later
    item overrides an earlier one with the same KEY. Raises ``ValueError`` naming ``--inductor`` on
    an item without ``=``, an option inductor does not know, or a value of the wrong type."""
    from torch._inductor import config

    known = config.get_config_copy()
    options = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--inductor: expected KEY=VALUE, got {item!r}")
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"--inductor: unknown inductor option {key!r}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            value = raw
        kind = config.get_type(name)
        if kind is str and not isinstance(value, str):
            value = raw  # a string option whose text also reads as a literal (e.g. "1")
        if kind is float and type(value) is int:
            value = float(value)
        plain = typing.get_origin(kind) is None and isinstance(
            kind, type
        )  # as torch.compile checks
        if plain and not isinstance(value, kind):
            raise ValueError(
                f"--inductor: {key} must be {kind.__name__}; got {value!r} ({type(value).__name__})"
            )
        options[key] = value
    return options


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def csv(s):
        return [v for v in s.split(",") if v]

    p.add_argument("--model", type=csv, default=None, help=f"comma list of {sorted(MODELS)}")
    p.add_argument(
        "--modes",
        type=csv,
        default=None,
        help='eager,compile,reduce-overhead,...; pass, pass-reduce-overhead: step.compile(scope="pass")',
    )
    p.add_argument("--dtype", type=csv, default=["fp32"], help="fp32,bf16")
    p.add_argument(
        "--only",
        type=csv,
        default=list(METHODS),
        help=f"comma list of {METHODS}, or gam_every<k> / sam_gam_every<k> (k >= 2); grad_eval: "
        "one plain gradient (torch.autograd.grad eager, compiled torch.func.grad compiled), the unit of "
        "× grad evals; grad_eval_func: torch.func.grad in every mode",
    )
    p.add_argument("--repeats", type=int, default=None, help="timing rounds (median over them)")
    p.add_argument("--warmup", type=int, default=None, help="steps after the first call")
    p.add_argument("--block", type=int, default=None, help="steps per timed sample")
    p.add_argument("--recompile-steps", type=int, default=3, help="steps with a new lr each")
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's")
    p.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (--tiny: 1)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rho", type=float, default=0.05, help="peak of ρ's cosine schedule")
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument(
        "--composite-hvp",
        default="fd",
        help="hvp of sam_gam and the *_every<k> methods (fd/exact/reverse)",
    )
    p.add_argument("--on-nonfinite", default="skip", help="make_step's on_nonfinite")
    p.add_argument("--channels-last", action="store_true", help="channels-last model and inputs")
    p.add_argument(
        "--no-loop-reorder",
        action="store_true",
        help="torch._inductor.config.loop_ordering_after_fusion = False",
    )
    p.add_argument("--compile-jobs", type=int, default=0, help="parallel pre-compile workers")
    p.add_argument("--compile-timeout", type=float, default=360.0, help="seconds per worker")
    p.add_argument(
        "--recompile-limit", type=int, default=64, help="torch._dynamo.config.recompile_limit"
    )
    p.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="inductor option for every compile (repeatable), e.g. combo_kernels=True; VALUE is a "
        "Python literal, else a string",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timing, N more steps of each method under torch.profiler (JSON: profile)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny model, batch 4, CPU, seconds")
    p.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)  # workers
    p.add_argument("--out", default=None, help="JSON output path")
    a = p.parse_args(argv)
    tiny = a.tiny
    a.model = a.model or (["tiny"] if tiny else ["resnet18"])
    a.modes = a.modes or (["eager"] if tiny else ["eager", "compile"])
    a.repeats = a.repeats or (2 if tiny else 5)
    a.warmup = a.warmup if a.warmup is not None else (1 if tiny else 3)
    a.block = a.block or (1 if tiny else 5)
    a.device = a.device or ("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    # One thread for the smoke run: on a busy machine, OpenMP threads that wait on each other
    # stall tiny steps by two orders of magnitude.
    a.threads = a.threads or (1 if tiny else None)
    for name, values, allowed in (
        ("model", a.model, MODELS),
        ("dtype", a.dtype, ("fp32", "bf16")),
        ("only", [m for m in a.only if not _every_ok(m)], (*METHODS, BASELINE)),
        ("composite-hvp", [a.composite_hvp], gamfunc.hvp.BACKENDS),
        ("on-nonfinite", [a.on_nonfinite], ("skip", "raise", "ignore")),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {sorted(allowed)}")
    for name in ("repeats", "block"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.profile < 0:
        p.error("--profile must be >= 0")
    try:
        a.inductor_options = inductor_options(a.inductor)
    except ValueError as e:
        p.error(str(e))
    return a


def _every_ok(name: str) -> bool:
    match = EVERY.fullmatch(name)
    return match is not None and int(match[2]) >= 2


def main(argv=None) -> dict:
    a = parse(argv)
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.no_loop_reorder:
        # Workaround for an inductor assertion in loop reordering (torch 2.11, CUDA; issue 5).
        torch._inductor.config.loop_ordering_after_fusion = False
    # Every gamfunc step compiles the same function, so each method adds a dynamo cache entry to it.
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, a.recompile_limit
    )
    meta = metadata(a, device)
    rows = []
    result = {"meta": meta, "rows": rows}

    def save(partial=()):  # after every phase, so that a run cut short keeps what it measured
        if a.out:
            text = json.dumps({**result, "rows": rows + list(partial)}, indent=1, default=repr)
            Path(a.out).write_text(text)

    for model_name in a.model:
        for dtype in a.dtype:
            rows += run_group(model_name, dtype, a, device, meta, save)
            release(device)
            _vs_fp32(rows)
            save()
    if not a.compile_only:
        header = f"{meta['device_name']}, torch {meta['torch']}, {meta['date']}"
        if a.inductor_options:
            header += "; inductor " + ", ".join(f"{k}={v!r}" for k, v in a.inductor_options.items())
        print(f"\n{header}\n")
        print(table(rows))
    return result


if __name__ == "__main__":
    main()
