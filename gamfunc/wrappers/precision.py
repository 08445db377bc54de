"""Mixed precision for multi-pass steps: bf16/fp16 autocast inside every loss evaluation, fp32 outside.

Parameters, gradients, directions, optimiser state and all tree math stay in the parameters' dtype
(fp32); only the operations inside ``loss_fn`` run in low precision, under ``torch.autocast``. Because
every pass of a SAM/GAM step (clean, perturbed, H·v) is a ``loss_fn`` evaluation, each of them is
autocast, and each perturbation θ + ρ·v is formed in fp32.

* ``bf16``: [`bf16`][gamfunc.wrappers.precision.bf16] (= [`autocast`][gamfunc.wrappers.precision.autocast] with ``torch.bfloat16``). bf16 has fp32's exponent
  range, so no loss scale is needed.
* ``fp16``: [`fp16`][gamfunc.wrappers.precision.fp16], autocast with ``torch.float16`` and a dynamic loss scale S, as
  ``torch.amp.GradScaler``: every gradient (and every H·v) is formed as ∇(S·L) and unscaled once,
  g = ∇(S·L)/S, so that small backward activations do not underflow in fp16. An overflow (an inf or
  nan anywhere in the step) makes the direction non-finite, and [`gamfunc.make_step`][gamfunc.make_step]'s
  ``on_nonfinite="skip"`` then leaves parameters, optimiser state and BatchNorm buffers unchanged
  (``metrics["skipped"] = 1``), with no host read once compiled. S lives in the step state as tensors,
  ``state.loss = LossScale(scale=fp32, growth_tracker=int32)``, and is updated as GradScaler's
  ``update()``: halved (``backoff_factor``) after a skipped step, doubled (``growth_factor``) after
  ``growth_interval`` taken steps in a row; ``metrics["loss_scale"]`` reports it.

Wrap the plain loss first, then accumulate or distribute the result (the loss scale must sit
innermost, where the loss is differentiated):

```python
from gamfunc.wrappers.accumulate import accumulate
from gamfunc.wrappers.precision import mixed

loss_fn = mixed(loss_fn, "fp16")                             # or "bf16", "fp32"
loss_fn = accumulate(loss_fn, 4)                             # optional
step = gamfunc.make_step(estimator, optimizer, loss_fn)
state = step.init(params, buffers)                           # state.loss: a LossScale for fp16
```

Exact H·v (``hvp="exact"``, ``"reverse"``) differentiates the backward pass, so [`Autocast`][gamfunc.wrappers.precision.Autocast] runs
it under autocast too. With autocast inside the loss alone, forward-mode AD through the backward pass
meets float32 tangents of bfloat16 values wherever a layer forms one (CUDA autocast's float32
``log_softmax``, ``softmax``, ``layer_norm``; LayerNorm's float32 weight, and BatchNorm's where
[`gamfunc.nn.autocast_batchnorm`][gamfunc.nn.autocast_batchnorm] did not make it safe, on any device)
and the next matrix product fails, with an error that names these wrappers. Where no layer forms one
(on the CPU: linear and convolution layers, activations, cross-entropy, and BatchNorm through
[`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]), exact H·v with autocast inside the loss runs
and equals the wrapper's bit for bit. Put autocast in these wrappers, not inside ``loss_fn``: they run
in both cases.

Warning:
    ``torch.compile`` on CPU (inductor's C++ backend) fails to build reverse-over-reverse
    through BatchNorm in bf16/fp16 ("conflicting declaration 'auto at_BFloat16_tmp_acc2_vec'"); such
    steps run eagerly on CPU.

References:
    Micikevicius et al., "Mixed Precision Training", ICLR 2018, https://arxiv.org/abs/1710.03740.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple, cast

import torch
from torch import Tensor

from gamfunc import hvps, tree
from gamfunc.checks import check_int, check_positive
from gamfunc.hvps import of_gradient, read_through, resolve
from gamfunc.loss import Objective, Pass, gradient_pass, loss_and_aux
from gamfunc.tree import Tree

__all__ = [
    "PRECISIONS",
    "Autocast",
    "LossScale",
    "LossScaled",
    "autocast",
    "bf16",
    "fp16",
    "mixed",
    "update_scale",
]

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, eq=False)
class Autocast(Objective):
    """``loss_fn`` evaluated under ``torch.autocast``, its loss cast back to the parameters' dtype.

    Built by [`autocast`][gamfunc.wrappers.precision.autocast] ([`bf16`][gamfunc.wrappers.precision.bf16], [`fp16`][gamfunc.wrappers.precision.fp16]). Gradients are formed as in
    ``torch.amp``: the forward pass under autocast, the backward pass outside it, in the dtypes autocast
    chose for the forward operations.

    Exact Hessian-vector products (``hvp="exact"`` and ``"reverse"``) differentiate that backward
    pass, and run it under autocast as well. Forward-mode AD through the backward pass otherwise
    meets mixed dtypes: the derivative formulas of BatchNorm, LayerNorm (on any device) and of the
    operations CUDA autocast computes in float32 (``log_softmax``, ``softmax``, ``layer_norm``,
    ``nll_loss``) return float32 tangents for bfloat16 values, and the next matrix product of the
    backward pass, which autocast no longer covers, raises ``expected mat1 and mat2 to have the same
    dtype``. Under autocast that product casts the tangent as it casts the value. The finite-difference
    backend keeps the plain gradient passes, so that its two gradients are formed alike.

    Attributes:
        loss_fn: the plain loss: ``loss_fn(params, batch)`` or the buffered form.
        dtype: ``torch.bfloat16`` or ``torch.float16``.
    """

    loss_fn: Callable
    dtype: torch.dtype

    def __post_init__(self):
        if self.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16; got {self.dtype}")
        _check_plain(self.loss_fn)

    def __call__(self, params: Tree, batch, *args, **kwargs):
        first = next(iter(params.values()))
        with torch.autocast(first.device.type, dtype=self.dtype):
            out = self.loss_fn(params, batch, *args, **kwargs)
        if isinstance(out, tuple):
            return out[0].to(first.dtype), out[1]
        return out.to(first.dtype)

    def gradient_pass(self, params: Tree, batch) -> Pass:
        return gradient_pass(self.__call__, params, batch)

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        with self.context(backend, params):
            return backend(self.__call__, params, batch, v, clean=clean)

    def context(self, backend, params: Tree):
        """The context an H·v of ``backend`` runs in: autocast for the backends that differentiate
        the backward pass ([`gamfunc.hvps.SECOND_ORDER`][gamfunc.hvps.SECOND_ORDER]), none for the others."""
        if backend not in hvps.SECOND_ORDER:
            return contextlib.nullcontext()
        return torch.autocast(next(iter(params.values())).device.type, dtype=self.dtype)


def autocast(loss_fn: Callable, dtype: torch.dtype) -> Autocast:
    """``loss_fn`` evaluated under ``torch.autocast(device, dtype)``, its loss cast to the params' dtype.

    The device type is that of the parameters. Everything outside the call (gradients, tree math,
    optimiser) keeps the parameters' dtype; BatchNorm running statistics stay fp32. Exact H·v runs
    its backward pass under autocast too ([`Autocast`][gamfunc.wrappers.precision.Autocast]).

    Args:
        loss_fn: ``loss_fn(params, batch, *rest) -> loss`` or ``(loss, aux)``.
        dtype: ``torch.bfloat16`` or ``torch.float16``.

    Returns:
        An [`Autocast`][gamfunc.wrappers.precision.Autocast] Objective.

    Example:
        >>> import torch
        >>> loss_fn = lambda p, x: (x @ p["w"]).pow(2).mean()
        >>> autocast(loss_fn, torch.bfloat16)({"w": torch.ones(3)}, torch.ones(2, 3)).dtype
        torch.float32
    """
    return Autocast(loss_fn, dtype)


def _check_plain(loss_fn) -> None:
    if isinstance(loss_fn, Objective):
        raise TypeError(
            "precision wrappers must wrap the plain loss_fn (autocast and the loss scale act where "
            "the loss is differentiated); wrap accumulation or data parallel around them instead"
        )


def bf16(loss_fn: Callable) -> Autocast:
    """``loss_fn`` under bf16 autocast, with no loss scale.

    Args:
        loss_fn: the loss (two-argument or buffered).

    Returns:
        [`autocast`][gamfunc.wrappers.precision.autocast] of ``loss_fn`` with ``torch.bfloat16``.
    """
    return autocast(loss_fn, torch.bfloat16)


class LossScale(NamedTuple):
    """The dynamic loss scale of [`fp16`][gamfunc.wrappers.precision.fp16], kept in the step state as ``state.loss``.

    Attributes:
        scale: S, 0-d float32 (GradScaler's ``_scale``).
        growth_tracker: 0-d int32, taken steps in a row since S last changed (GradScaler's
            ``_growth_tracker``).
    """

    scale: Tensor
    growth_tracker: Tensor


def update_scale(
    loss_scale: LossScale,
    finite: Tensor,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> LossScale:
    """The dynamic loss scale after one step, as ``torch.amp.GradScaler.update``, without a branch.

    With S = ``scale`` and t = ``growth_tracker``:

    ```text
    finite:      t ← t + 1;  if t = growth_interval: S ← S·growth_factor (if finite), t ← 0
    not finite:  S ← S·backoff_factor,  t ← 0
    ```

    Args:
        loss_scale: the [`LossScale`][gamfunc.wrappers.precision.LossScale] before the step.
        finite: 0-d bool, whether the step's loss, gradients and update were finite.
        growth_factor: S's factor after ``growth_interval`` finite steps in a row.
        backoff_factor: S's factor after a step that was not finite.
        growth_interval: finite steps in a row before S grows.

    Returns:
        The [`LossScale`][gamfunc.wrappers.precision.LossScale] after the step.

    Raises:
        TypeError: ``loss_scale`` is not a [`LossScale`][gamfunc.wrappers.precision.LossScale].

    Example:
        >>> s = LossScale(torch.tensor(8.0), torch.tensor(0, dtype=torch.int32))
        >>> float(update_scale(s, torch.tensor(False)).scale)
        4.0
    """
    if not isinstance(loss_scale, LossScale):
        raise TypeError(
            f"loss_scale must be a gamfunc.precision.LossScale; got {type(loss_scale).__name__}"
        )
    scale, tracker = loss_scale
    finite = finite.to(scale.device)
    successful = tracker + 1
    grow = successful >= growth_interval
    grown = scale * growth_factor
    grown = torch.where(torch.isfinite(grown), grown, scale)
    new_scale = torch.where(finite, torch.where(grow, grown, scale), scale * backoff_factor)
    new_tracker = torch.where(finite & ~grow, successful, torch.zeros_like(tracker))
    return LossScale(new_scale, new_tracker)


@dataclass(frozen=True, eq=False)
class LossScaled(Objective):
    """An fp16 loss whose gradients and H·v are formed from S·L and unscaled once: g = ∇(S·L)/S.

    Built by [`fp16`][gamfunc.wrappers.precision.fp16]. S is ``scale`` once bound to a step state ([`bind`][gamfunc.wrappers.precision.LossScaled.bind]), else
    ``init_scale``. Calling it gives the unscaled loss.

    Attributes:
        loss_fn: the autocast loss it scales.
        init_scale: S of the first step.
        growth_factor: S's factor after ``growth_interval`` finite steps in a row.
        backoff_factor: S's factor after a step that was not finite.
        growth_interval: the finite steps in a row before S grows.
        scale: S, once bound to a step state; None before.
    """

    loss_fn: Autocast
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    scale: Tensor | None = None

    def __post_init__(self):
        if not isinstance(self.loss_fn, Autocast):
            raise TypeError("LossScaled wraps the Autocast loss that gamfunc.precision.fp16 builds")

    def _s(self):
        return self.scale if self.scale is not None else self.init_scale

    def _scaled(self, params: Tree, batch):
        loss, aux = loss_and_aux(self.loss_fn, params, batch)
        return loss * self._s(), (loss.detach(), aux)

    def _unscale(self, t: Tree) -> Tree:
        s = self._s()
        if isinstance(s, Tensor):
            return tree.scale(t, (1.0 / s).to(next(iter(t.values())).dtype))
        return tree.scale(t, 1.0 / s)

    def _unscale_pass(self, p: Pass) -> Pass:
        loss, aux = p.aux
        return Pass(self._unscale(p.grad), loss, aux)

    def __call__(self, params: Tree, batch, *args, **kwargs):
        return self.loss_fn(params, batch, *args, **kwargs)

    def gradient_pass(self, params: Tree, batch) -> Pass:
        return self._unscale_pass(gradient_pass(self._scaled, params, batch))

    def hvp(self, backend, params: Tree, batch, v, clean: Pass | None):
        if of_gradient(v) and clean is not None:
            v, clean = resolve(v, clean)
        v_scaled = read_through(v, self._unscale)
        with self.loss_fn.context(backend, params):
            shv, sclean = backend(self._scaled, params, batch, v_scaled)
        return self._unscale(shv), clean if clean is not None else self._unscale_pass(sclean)

    # Step state (the protocol of gamfunc.loss.Objective): S is read from and written to
    # state.loss, a LossScale.
    def bind(self, state) -> LossScaled:
        """Bound to ``state``: S is ``state.loss.scale``, or ``init_scale`` for a state without a
        loss scale (``state.loss == ()``)."""
        empty = isinstance(state.loss, tuple) and len(state.loss) == 0
        scale = self.scale if empty else self._state(state).scale
        return replace(cast(LossScaled, super().bind(state)), scale=scale)

    def init_state(self, params: Tree) -> LossScale:
        device = next(iter(params.values())).device
        return LossScale(
            torch.full((), self.init_scale, dtype=torch.float32, device=device),
            torch.zeros((), dtype=torch.int32, device=device),
        )

    def next_state(self, state, finite: Tensor) -> tuple[LossScale, dict]:
        new = update_scale(
            self._state(state),
            finite,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )
        return new, {"loss_scale": new.scale}

    @staticmethod
    def _state(state) -> LossScale:
        if not isinstance(state.loss, LossScale):
            raise TypeError(
                f"state.loss must be the LossScale of an fp16 loss; got "
                f"{type(state.loss).__name__}: make the state with the step's init(params)"
            )
        return state.loss


def fp16(
    loss_fn: Callable,
    init_scale: float = 2.0**16,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> LossScaled:
    """``loss_fn`` under fp16 autocast with a dynamic loss scale in the step state (GradScaler's rules).

    Every gradient g_j of the step (g0..g3 of accelerated GAM, both of SAM, the H·v of GAM) is
    ∇(S·L)(θ_j)/S with the same S; a step in which any of them overflows is skipped by
    [`gamfunc.make_step`][gamfunc.make_step] (``on_nonfinite="skip"``, required) and S is halved; S doubles after
    ``growth_interval`` taken steps in a row. The arguments and defaults are those of
    ``torch.amp.GradScaler``.

    Args:
        loss_fn: the plain loss (two-argument or buffered form), not an Objective.
        init_scale: S at the first step (> 0).
        growth_factor: factor S grows by (> 1).
        backoff_factor: factor S shrinks by after an overflow (in (0, 1)).
        growth_interval: taken steps in a row before S grows (integer >= 1).

    Returns:
        A [`LossScaled`][gamfunc.wrappers.precision.LossScaled] Objective.

    Example:
        A step whose gradients fit in fp16 at S = 2¹⁶ is taken; one whose scaled gradients overflow
        is skipped (the parameters stay) and halves S:

        >>> import torch, gamfunc
        >>> from gamfunc.wrappers.precision import fp16
        >>> loss_fn = fp16(lambda p, b: ((b[0] @ p["w"] - b[1]) ** 2).mean())
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), loss_fn)
        >>> params = {"w": torch.zeros(3)}
        >>> state = step.init(params)
        >>> x, y = torch.full((8, 3), 0.5), torch.full((8,), 0.25)
        >>> params, state, metrics = step(params, state, (x, y))
        >>> float(metrics["loss_scale"]), int(metrics["skipped"])
        (65536.0, 0)
        >>> new, state, metrics = step(params, state, (100 * x, 100 * y))
        >>> float(metrics["loss_scale"]), int(metrics["skipped"]), torch.equal(new["w"], params["w"])
        (32768.0, 1, True)
    """
    check_positive("init_scale", init_scale)
    if not (isinstance(growth_factor, int | float) and 1 < growth_factor < float("inf")):
        raise ValueError(f"growth_factor must be a finite number > 1; got {growth_factor!r}")
    if not (isinstance(backoff_factor, int | float) and 0 < backoff_factor < 1):
        raise ValueError(f"backoff_factor must be a number in (0, 1); got {backoff_factor!r}")
    check_int("growth_interval", growth_interval)
    return LossScaled(
        autocast(loss_fn, torch.float16),
        float(init_scale),
        float(growth_factor),
        float(backoff_factor),
        growth_interval,
    )


def mixed(loss_fn: Callable, precision: str) -> Callable:
    """``loss_fn`` in ``precision``: the one call behind a ``--precision`` flag.

    Args:
        loss_fn: the loss (two-argument or buffered).
        precision: "fp32", "bf16" or "fp16".

    Returns:
        ``loss_fn`` itself for "fp32", [`bf16`][gamfunc.wrappers.precision.bf16] of it for "bf16",
            [`fp16`][gamfunc.wrappers.precision.fp16] of it (GradScaler's defaults) for "fp16".

    Raises:
        ValueError: ``precision`` is none of these.
    """
    if precision == "fp32":
        return loss_fn
    if precision == "bf16":
        return bf16(loss_fn)
    if precision == "fp16":
        return fp16(loss_fn)
    raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
