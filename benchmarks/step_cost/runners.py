"""Runners: one object per timed row, called once per training step.

Every runner has ``__call__()`` (one step), ``every`` (steps per cycle of its every-k schedule) and ``compiled``.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F

import gamfunc
from benchmarks.step_cost.authors_gam import AuthorsGAM
from benchmarks.step_cost.methods import ACCELERATED, AUTHORS, BASELINE, rho_at, rho_schedule
from gamfunc.loss import gradient_pass


def autocast(device: torch.device, dtype: str):
    """bf16 autocast around an ``nn.Module``'s forward (the eager rows); nothing for fp32."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


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


class AuthorsStep:
    """The authors' GAM optimiser (:class:`.authors_gam.AuthorsGAM`) around
    ``torch.optim.SGD(lr, momentum=0.9)``, eager, as their training loop calls it: a closure that
    zeroes the gradients, runs the forward (bf16: under autocast) and the backward. ρ and ρ' follow
    the cosine of the functional rows, read as Python floats once per step; α, β, γ are
    :data:`.methods.ACCELERATED`'s."""

    def __init__(self, model, batch, lr, rho, device, dtype):
        self.model, self.batch = copy.deepcopy(model).train(), batch
        base = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        hp = {k: v for k, v in ACCELERATED.items() if k != "convention"}
        schedule = lambda t: rho_at(rho, t)  # noqa: E731
        self.opt = AuthorsGAM(self.model, base, schedule, schedule, **hp)
        self.device, self.dtype = device, dtype
        self.every, self.compiled = 1, False

    def closure(self):
        x, y = self.batch
        self.opt.zero_grad()
        with torch.enable_grad(), autocast(self.device, self.dtype):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss.detach()

    def __call__(self):
        self.opt.step(self.closure)


class Functional:
    """A ``gamfunc.make_step`` step on ``gamfunc.nn.functionalize(model)``'s loss, eager or compiled
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


def gradient_eval(loss_fn):
    """``(params, batch, buffers) -> (∇L(θ), new_buffers)`` by ``gamfunc.loss.gradient_pass``, the
    pass every step is made of: eagerly ``torch.autograd.grad`` on detached leaf copies of the
    parameters, under ``torch.compile`` ``torch.func.grad``."""

    def grad(params, batch, buffers):
        p = gradient_pass(lambda q, b: loss_fn(q, b, buffers), params, batch)
        return p.grad, p.aux

    return grad


class GradEval:
    """One plain evaluation of ∇L(θ) of the functional loss (BatchNorm buffers as its third
    argument), without an update. ``impl="autograd"`` (the ``grad_eval`` row, the unit of "× grad
    evals"): :func:`gradient_eval`, so ``torch.autograd.grad`` eager and ``torch.func.grad``
    compiled, where ``torch.autograd.grad`` cannot be traced; ``impl="func"`` (``grad_eval_func``):
    ``torch.func.grad`` in every mode."""

    def __init__(self, loss_fn, params, buffers, batch, mode, impl="autograd", inductor=None):
        if impl not in ("autograd", "func"):
            raise ValueError(f"impl must be 'autograd' or 'func'; got {impl!r}")
        self.batch, self.every = batch, 1
        self.compiled = mode != "eager"
        options = compile_options(mode, inductor)
        self.cuda_graphs = self.compiled and bool(options.get("triton.cudagraphs"))
        if impl == "autograd":
            fn = gradient_eval(loss_fn)
            self.impl = "torch.func.grad" if self.compiled else "torch.autograd.grad"
        else:
            fn, self.impl = torch.func.grad(loss_fn, has_aux=True), "torch.func.grad"
        self.fn = torch.compile(fn, fullgraph=True, options=options) if self.compiled else fn
        self.params = {k: v.clone() for k, v in params.items()}
        self.buffers = {k: v.clone() for k, v in buffers.items()}

    def __call__(self):
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        self.grads, _ = self.fn(self.params, self.batch, self.buffers)


def runner_factory(method, mode, g, methods, a, device):
    """A function that builds the runner of ``method`` in ``mode`` on the prepared group ``g``
    (:func:`.models.prepare`)."""
    if method == BASELINE:
        return lambda: TorchSGD(g.model, g.batch, a.lr, device, g.dtype)
    if method == AUTHORS:
        return lambda: AuthorsStep(g.model, g.batch, a.lr, a.rho, device, g.dtype)
    if method in ("grad_eval", "grad_eval_func"):
        impl = "func" if method == "grad_eval_func" else "autograd"
        return lambda: GradEval(
            g.loss_fn, g.params, g.buffers, g.batch, mode, impl, a.inductor_options
        )
    m = methods[method]
    # lr and ρ follow schedules that change at every step, so the recompile check sees what a
    # scheduled training run feeds the compiled step.
    opt = gamfunc.sgd(lr=rho_schedule(a.lr), momentum=0.9)
    step = gamfunc.make_step(
        m.estimator, opt, g.loss_fn, every=m.every, base=m.base, on_nonfinite=a.on_nonfinite
    )
    # step.every: the row's every=k, or the cycle of an estimator that brings its own (LookSAM)
    return lambda: Functional(
        step, g.params, g.buffers, g.batch, mode, step.every, a.inductor_options
    )
