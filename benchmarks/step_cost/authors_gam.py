"""The authors' GAM optimiser, eager ``nn.Module`` + ``torch.optim``: the ``authors_gam`` row.

It computes what the ``GAM`` optimiser of the authors' released code computes: ``gam/gam.py`` of
https://github.com/xxgege/GAM at commit 694133d9df9266a3df892087ca6b1be72ba610c0 (``GAM.step``,
``perturb_weights``, ``grad_norm_ascent``, ``gradient_decompose``, and ``disable_running_stats`` of
``gam/util.py``), with ``adaptive=False`` and one process. Written here, not copied, and in the same
shape: loops over the parameter tensors (no ``torch._foreach``), gradients kept as clones, the
perturbation added to the parameters in place and subtracted afterwards, so that its time is that of
the official optimiser on the same model.

One step, with ρ = ``rho`` (the code's ``grad_norm_rho``), ρ' = ``rho_prime`` (``grad_rho``),
α = ``alpha`` (``grad_beta_1``; ``grad_beta_3`` = 1 − α), β = ``beta`` (``grad_beta_2`` = 1 − β),
γ = ``gamma`` (``grad_gamma``) and ξ = ``eps`` (``perturb_eps``)::

    g0 = ∇L(θ)                                   BatchNorm running statistics updated here only
    g1 = ∇L(θ + e0),  e0 = ρ'·g0/(‖g0‖ + ξ)
    h0 = g1 − g0
    g2 = ∇L(θ2),      θ2 = θ + ρ·h0/(‖h0‖ + ξ)
    g3 = ∇L(θ2 + ρ'·g2/(‖g2‖ + ξ))
    h+ = α·g1 + (1 − α)·g3,   h− = g0 + |1 − β|·g2
    d  = h+ − γ·(h− − cos(h+, h−)·‖h−‖·h+/(‖h+‖ + ξ)),   cos = ⟨h+, h−⟩/(‖h+‖·‖h−‖ + ξ)

then the base optimiser steps along d (left in ``p.grad``). This is
``gamfunc.gam_accelerated(rho, rho_prime, alpha, beta, gamma, convention="official")`` to within ξ
(its h−⊥ divides by (‖h+‖ + ξ)², the code by (‖h+‖·‖h−‖ + ξ)·(‖h+‖ + ξ)/‖h−‖);
``tests/checkout/test_benchmark_step_cost.py`` checks the two directions agree in float64.

References:
    Zhang et al., "Gradient Norm Aware Minimization Seeks First-Order Flatness and Improves
    Generalization", CVPR 2023, Algorithm 2 (Appendix D), https://arxiv.org/abs/2303.03108.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

SOURCE = "https://github.com/xxgege/GAM/blob/694133d9df9266a3df892087ca6b1be72ba610c0/gam/gam.py"


@contextlib.contextmanager
def frozen_running_stats(model: nn.Module):
    """BatchNorm momentum 0 inside the block (batch statistics used, running statistics kept), as
    the authors' ``disable_running_stats``/``enable_running_stats``."""
    saved = {}
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            saved[m] = m.momentum
            m.momentum = 0
    try:
        yield
    finally:
        for m, momentum in saved.items():
            m.momentum = momentum


class AuthorsGAM(torch.optim.Optimizer):
    """The authors' GAM optimiser around ``base_optimizer`` (see the module docstring).

    Args:
        model: the network (its BatchNorm layers keep their running statistics after the first pass).
        base_optimizer: a ``torch.optim`` optimiser over the model's parameters; it takes the step.
        rho, rho_prime: ρ and ρ', floats or functions of the step count (from 0) returning floats.
        alpha, beta, gamma: α, β, γ.
        eps: ξ.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> net = torch.nn.Linear(3, 2)
        >>> opt = AuthorsGAM(net, torch.optim.SGD(net.parameters(), lr=0.1), 0.2, 0.02, 0.6, 0.5, 0.03)
        >>> x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
        >>> def closure():
        ...     opt.zero_grad()
        ...     with torch.enable_grad():
        ...         loss = F.cross_entropy(net(x), y)
        ...     loss.backward()
        ...     return loss.detach()
        >>> loss = opt.step(closure)
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: torch.optim.Optimizer,
        rho: float | Callable[[int], float],
        rho_prime: float | Callable[[int], float],
        alpha: float,
        beta: float,
        gamma: float,
        eps: float = 1e-12,
    ):
        params = [p for g in base_optimizer.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = base_optimizer.param_groups  # one set of groups, as the authors'
        self.model, self.base_optimizer = model, base_optimizer
        self.rho_fn, self.rho_prime_fn = rho, rho_prime
        self.alpha, self.beta, self.gamma, self.eps = alpha, beta, gamma, eps
        self.t = 0
        self._read_rho()

    def _read_rho(self):
        def read(v):
            return v(self.t) if callable(v) else v

        self.rho, self.rho_prime = read(self.rho_fn), read(self.rho_prime_fn)

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield p

    def _norm(self, key: str | None = None):
        """‖p.grad‖ over all parameters, or of the saved tensors ``state[p][key]``."""
        total = 0.0
        for p in self._params():
            g = p.grad if key is None else self.state[p][key]
            total += torch.sum(g**2)
        return torch.sqrt(total)

    def _ascend(self, radius: float, key: str, accumulate: bool = False):
        """θ += radius·grad/(‖grad‖ + ξ), the shift kept in ``state[p][key]`` (added to it with
        ``accumulate``) to be undone by :meth:`_restore`."""
        scale = radius / (self._norm() + self.eps)
        for p in self._params():
            shift = p.grad * scale.to(p)
            p.add_(shift)
            state = self.state[p]
            if accumulate:
                state[key] += shift
            else:
                state[key] = shift

    def _restore(self, key: str):
        for group in self.param_groups:
            for p in group["params"]:
                if key in self.state[p]:
                    p.sub_(self.state[p][key])

    def _decompose(self):
        """p.grad (= g3) <- h+ − γ·h−⊥, with h− kept as ``state[p]["h_minus"]``."""
        inner = 0.0
        for p in self._params():
            state = self.state[p]
            state["h_minus"] = state["g0"] + abs(1 - self.beta) * state["g2"]
            p.grad = self.alpha * state["g1"] + (1 - self.alpha) * p.grad.clone()
            inner += torch.sum(state["h_minus"] * p.grad)
        plus_norm, minus_norm = self._norm(), self._norm("h_minus")
        cosine = inner / (plus_norm * minus_norm + self.eps)
        for p in self._params():
            h_minus = self.state[p]["h_minus"]
            perp = h_minus - cosine * minus_norm * p.grad / (plus_norm + self.eps)
            p.grad.add_(perp, alpha=-self.gamma)

    @torch.no_grad()
    def step(self, closure):
        """One GAM step; ``closure()`` zeroes the gradients, runs forward (under
        ``torch.enable_grad()``) and backward, and returns what the first call's value should be."""
        out = closure()  # g0 at θ, BatchNorm running statistics updated
        for p in self._params():
            self.state[p]["g0"] = p.grad.clone()
        self._ascend(self.rho_prime, "e0")
        with frozen_running_stats(self.model):
            closure()  # g1 at θ + e0
            self._restore("e0")
            for p in self._params():
                self.state[p]["g1"] = p.grad.clone()
                p.grad -= self.state[p]["g0"]  # h0
            self._ascend(self.rho, "e12")
            closure()  # g2 at θ2
            for p in self._params():
                self.state[p]["g2"] = p.grad.clone()
            self._ascend(self.rho_prime, "e12", accumulate=True)
            closure()  # g3 at θ2 + ρ'·ĝ2
            self._decompose()
            self._restore("e12")
        self.base_optimizer.step()
        self.t += 1
        self._read_rho()
        return out

    def zero_grad(self, set_to_none: bool = False):
        # The authors' optimiser zeroes in place (their default), so each closure writes into
        # the same gradient tensors.
        self.base_optimizer.zero_grad(set_to_none)
