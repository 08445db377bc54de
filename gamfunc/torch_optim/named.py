"""The facade named after its estimator: [`GAM`][gamfunc.torch_optim.GAM] (paper Algorithm 1) and
[`SAM`][gamfunc.torch_optim.SAM] choose the estimator and take its hyperparameters;
[`TorchBase`][gamfunc.torch_optim.TorchBase] names the form over a ``torch.optim`` base optimiser.
Each is a [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer], whose options they take."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import nn

from gamfunc.estimators import Estimator, gam, sam
from gamfunc.torch_optim.base import is_torch
from gamfunc.torch_optim.checks import check_model, check_options
from gamfunc.torch_optim.habits import GUIDE
from gamfunc.torch_optim.optimizer import FlatnessOptimizer

__all__ = ["GAM", "SAM", "TorchBase"]


class GAM(FlatnessOptimizer):
    r"""[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with
    [`gamfunc.gam`][gamfunc.estimators.gam.gam]: paper Algorithm 1.

    The direction, with g = ∇L(θ), f = H·g/‖g‖ and θ_adv = θ + ρ·f/‖f‖:

    $$
    d = \nabla L_{\mathrm{oracle}}(\theta) + \alpha\,\rho\,H(\theta_{\mathrm{adv}})\,
    \frac{g_{\mathrm{adv}}}{\lVert g_{\mathrm{adv}}\rVert},
    $$

    ρ is ``rho``, α is ``alpha``; H·v comes from ``hvp``, ∇L_oracle from ``oracle``.

    Args:
        model: the module to train (see [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]).
        optimizer: the base optimiser: a gamfunc one, a ``torch.optim.Optimizer`` over the model's
            parameters, or an optimiser class (or gamfunc factory) with its keyword arguments in
            ``**base_kwargs``: ``GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05,
            alpha=0.1)``.
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        alpha: α >= 0, the weight of first-order flatness, or a schedule.
        hvp: the H·v backend: ``"exact"`` (forward-over-reverse, the default: Algorithm 1),
            ``"reverse"`` or ``"fd"``, or a value of [`gamfunc.hvps`][gamfunc.hvps] such as
            ``hvps.fd(radius=1e-3)``. Eager, fd is the cheaper; a closure that calls
            ``backward()`` needs fd. [`gamfunc.gam`][gamfunc.estimators.gam.gam] says how to
            choose; ``docs/guides/benchmarks.md`` (*Which H·v backend costs what*) what each costs.
        oracle: the estimator of ∇L_oracle (``gamfunc.sam(rho)`` gives SAM + GAM); the gradient by
            default.
        eps: ξ >= 0 in every normalisation.
        adaptive: every ascent in ASAM's scale-invariant geometry (the authors' ``adaptive=True``).
        base_optimizer: the base optimiser by keyword (davda54/sam's name), instead of
            ``optimizer``.
        criterion: ``criterion(outputs, targets)`` for ``step((inputs, targets))``.
        loss: ``loss(model, batch)`` for ``step(batch)`` with a batch of any form (a dict of
            tensors), in place of ``criterion``.
        when: which steps are flat (a policy of [`gamfunc.when`][gamfunc.training.when]; None: every
            step), as [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]'s.
        every: run GAM on every ``every``-th step and ``base`` on the others.
        base: the estimator of the other steps, the gradient by default.
        on_nonfinite: ``"skip"``, ``"raise"`` or ``"ignore"``.
        compile: ``False``, ``True`` or ``"pass"`` (the estimator's passes), or ``"step"`` (the
            whole step, with a gamfunc base optimiser).
        compile_options: keyword arguments of ``torch.compile``.
        accumulate: micro-batches per ``step((inputs, targets))``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        max_grad_norm: clip the direction to this global norm before the base optimiser.
        cuda_graph: replay each ``step((inputs, targets))`` as one CUDA graph.
        **base_kwargs: the keyword arguments of an optimiser class or factory given as
            ``optimizer``; ``params=`` gives a ``torch.optim`` class its param groups.

    Raises:
        TypeError: no base optimiser, or keyword arguments for an optimiser already built; as
            [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer].
        ValueError: an invalid hyperparameter (naming it), or an option as
            [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer].

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import GAM
        >>> model = torch.nn.Linear(4, 3)
        >>> opt = GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.1)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))

    References:
        Zhang, Xu, Li, Song, Zhu, "Gradient Norm Aware Minimization Seeks First-Order Flatness and
        Improves Generalization", CVPR 2023, https://arxiv.org/abs/2303.03108.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer=None,
        *,
        rho,
        alpha,
        hvp="exact",
        oracle: Estimator | None = None,
        eps: float = 1e-12,
        adaptive: bool = False,
        base_optimizer=None,
        criterion: Callable = F.cross_entropy,
        loss: Callable | None = None,
        when=None,
        every: int = 1,
        base: Estimator | None = None,
        on_nonfinite: str = "skip",
        compile: bool | str = False,
        compile_options: dict[str, Any] | None = None,
        accumulate: int = 1,
        precision: str = "fp32",
        max_grad_norm: float | None = None,
        cuda_graph: bool = False,
        **base_kwargs,
    ):
        check_model(model, type(self).__name__)
        check_options(type(self).__name__, optimizer, base_optimizer, base_kwargs)
        estimator = gam(rho, alpha, hvp=hvp, oracle=oracle, eps=eps, adaptive=adaptive)
        super().__init__(
            model,
            estimator,
            optimizer,
            criterion,
            loss=loss,
            base_optimizer=base_optimizer,
            when=when,
            every=every,
            base=base,
            on_nonfinite=on_nonfinite,
            compile=compile,
            compile_options=compile_options,
            accumulate=accumulate,
            precision=precision,
            max_grad_norm=max_grad_norm,
            cuda_graph=cuda_graph,
            **base_kwargs,
        )


class SAM(FlatnessOptimizer):
    r"""[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] with
    [`gamfunc.sam`][gamfunc.estimators.sam.sam]: the direction ∇L(θ + ρ·g/(‖g‖ + ξ)), g = ∇L(θ).

    ρ is ``rho``, ξ is ``eps``. The base optimiser is given as for
    [`GAM`][gamfunc.torch_optim.GAM].

    Args:
        model: the module to train.
        optimizer: the base optimiser, as for [`GAM`][gamfunc.torch_optim.GAM].
        rho: ρ >= 0, the radius of the ascent, or a schedule of the step count.
        eps: ξ >= 0.
        base_optimizer: the base optimiser by keyword, instead of ``optimizer``.
        criterion: ``criterion(outputs, targets)`` for ``step((inputs, targets))``.
        loss: ``loss(model, batch)`` for ``step(batch)`` with a batch of any form (a dict of
            tensors), in place of ``criterion``.
        when: which steps are flat (a policy of [`gamfunc.when`][gamfunc.training.when]; None: every
            step), as [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]'s.
        every: run SAM on every ``every``-th step and ``base`` on the others.
        base: the estimator of the other steps, the gradient by default.
        on_nonfinite: ``"skip"``, ``"raise"`` or ``"ignore"``.
        compile: ``False``, ``True`` or ``"pass"`` (the estimator's passes), or ``"step"``.
        compile_options: keyword arguments of ``torch.compile``.
        accumulate: micro-batches per ``step((inputs, targets))``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        max_grad_norm: clip the direction to this global norm before the base optimiser.
        cuda_graph: replay each ``step((inputs, targets))`` as one CUDA graph.
        **base_kwargs: the keyword arguments of an optimiser class or factory given as
            ``optimizer``; ``params=`` gives a ``torch.optim`` class its param groups.

    Raises:
        TypeError: no base optimiser, keyword arguments for an optimiser already built, or
            davda54/sam's ``adaptive=`` (ASAM is ``gamfunc.asam``).
        ValueError: an invalid ``rho`` or ``eps`` (naming it), or an invalid option.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import SAM
        >>> model = torch.nn.Linear(4, 3)
        >>> opt = SAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))

    References:
        Foret, Kleiner, Mobahi, Neyshabur, "Sharpness-Aware Minimization for Efficiently Improving
        Generalization", ICLR 2021, https://arxiv.org/abs/2010.01412.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer=None,
        *,
        rho,
        eps: float = 1e-12,
        base_optimizer=None,
        criterion: Callable = F.cross_entropy,
        loss: Callable | None = None,
        when=None,
        every: int = 1,
        base: Estimator | None = None,
        on_nonfinite: str = "skip",
        compile: bool | str = False,
        compile_options: dict[str, Any] | None = None,
        accumulate: int = 1,
        precision: str = "fp32",
        max_grad_norm: float | None = None,
        cuda_graph: bool = False,
        **base_kwargs,
    ):
        check_model(model, type(self).__name__)
        if "adaptive" in base_kwargs:
            adaptive = base_kwargs["adaptive"]
            raise TypeError(
                f"SAM(..., adaptive={adaptive!r}): SAM takes no adaptive=; "
                + (
                    "davda54/sam's adaptive=True is ASAM: write FlatnessOptimizer(model, "
                    "gamfunc.asam(rho), base_optimizer, ...)"
                    if adaptive
                    else "davda54/sam's adaptive=False is this SAM: drop adaptive=False "
                    "(ASAM is FlatnessOptimizer(model, gamfunc.asam(rho), base_optimizer, ...))"
                )
                + f" (see {GUIDE})"
            )
        check_options(type(self).__name__, optimizer, base_optimizer, base_kwargs)
        super().__init__(
            model,
            sam(rho, eps=eps),
            optimizer,
            criterion,
            loss=loss,
            base_optimizer=base_optimizer,
            when=when,
            every=every,
            base=base,
            on_nonfinite=on_nonfinite,
            compile=compile,
            compile_options=compile_options,
            accumulate=accumulate,
            precision=precision,
            max_grad_norm=max_grad_norm,
            cuda_graph=cuda_graph,
            **base_kwargs,
        )


class TorchBase(FlatnessOptimizer):
    """[`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer] over a ``torch.optim`` base
    optimiser, named so.

    It adds nothing to the facade: the step is make_step's, the base optimiser joined to it by a
    ``gamfunc.torch_optim.bridge.TorchBridge``. ``param_groups`` and ``state`` are the
    base optimiser's own; ``state_dict()`` holds its ``state_dict()`` under ``"base"``.

    Args:
        model: the module.
        estimator: a gamfunc estimator.
        base_optimizer: a ``torch.optim.Optimizer`` over the model's parameters (any subclass), or
            such a class with its keyword arguments in ``**options``.
        criterion: ``criterion(outputs, targets)`` for ``step((inputs, targets))``.
        **options: the options of [`FlatnessOptimizer`][gamfunc.torch_optim.FlatnessOptimizer]
            (``every``, ``compile``, ``precision``, ...), and the keyword arguments of a class.

    Raises:
        TypeError: ``base_optimizer`` is not a ``torch.optim`` optimiser or class.

    Example:
        >>> import torch, gamfunc
        >>> from gamfunc.torch_optim import TorchBase
        >>> model = torch.nn.Linear(4, 3)
        >>> base = torch.optim.Adam(model.parameters(), lr=1e-3)
        >>> opt = TorchBase(model, gamfunc.gam(0.05, 0.1), base)
        >>> loss = opt.step((torch.randn(8, 4), torch.randint(0, 3, (8,))))
    """

    def __init__(
        self,
        model: nn.Module,
        estimator: Estimator,
        base_optimizer,
        criterion: Callable = F.cross_entropy,
        **options,
    ):
        if not is_torch(base_optimizer):
            raise TypeError(
                "base_optimizer must be a torch.optim.Optimizer over model.parameters() or its "
                f"class; got {type(base_optimizer).__name__}"
            )
        super().__init__(model, estimator, base_optimizer, criterion, **options)
