"""Many models as one: ``torch.func.vmap`` over a whole training step, for seeds, ensembles and grids.

N members are N copies of the parameters, stacked along a new leading axis ([`stack`][gamfunc.training.ensemble.stack]), each with
its own step state (optimiser moments, BatchNorm running statistics, step counter) and its own
hyperparameters. [`vmap_step`][gamfunc.training.ensemble.vmap_step] turns a function that builds one member's step from its
hyperparameters into one step of all members:

```python
def build(lr, rho, alpha):           # each argument: a constant schedule t -> this member's value
    return gamfunc.make_step(gamfunc.gam(rho, alpha), gamfunc.sgd(lr, momentum=0.9), loss_fn)

grid = {"lr": torch.full((9,), 0.05), "rho": rhos.repeat_interleave(3), "alpha": alphas.repeat(3)}
ens = gamfunc.ensemble.vmap_step(build, grid)
state = ens.init(stacked_params)
stacked_params, state, metrics = ens(stacked_params, state, batch)   # metrics[k]: shape (9,)
```

Each member's update equals that member's own step (tested against a Python loop over members, every
estimator and optimiser). A hyperparameter reaches the factories as a constant schedule, so it can be
any argument that takes a schedule (``lr``, ``rho``, ``alpha``, ``weight_decay`` of both optimisers,
[`gamfunc.gam_accelerated`][gamfunc.estimators.gam_accelerated.gam_accelerated]'s ``rho_prime``, ``alpha``, ``beta`` and ``gamma``, and a schedule built
from them, such as ``lambda t: lr(t) * cosine(t)``); a member whose loss or update is not finite is skipped alone.
Everything inside the step runs per tensor under ``vmap``, since ``torch._foreach`` kernels have no
batching rule; outside ``vmap`` the same step keeps its ``_foreach`` kernels.

References:
    Horace He and Richard Zou, "functorch: JAX-like composable function transforms for PyTorch",
    2021 (the model-ensembling tutorial of ``torch.func``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from gamfunc.training.state import StepState
from gamfunc.training.step import Step

__all__ = ["VmappedStep", "stack", "unstack", "vmap_step"]


def stack(trees: list) -> Any:
    """The pytrees ``trees`` as one, every tensor stacked along a new axis 0.

    Args:
        trees: a non-empty list of pytrees of one structure.

    Returns:
        One pytree of that structure; each tensor leaf is ``torch.stack`` of the members' leaves,
            any other leaf the first member's.

    Raises:
        ValueError: ``trees`` is empty or its pytrees differ in structure.
    """
    if not trees:
        raise ValueError("stack needs at least one tree")
    leaves, specs = zip(*(pytree.tree_flatten(t) for t in trees), strict=True)
    if any(s != specs[0] for s in specs):
        raise ValueError("stack needs trees of one structure (the same keys everywhere)")
    out = [
        torch.stack(parts) if isinstance(parts[0], Tensor) else parts[0]
        for parts in zip(*leaves, strict=True)
    ]
    return pytree.tree_unflatten(out, specs[0])


def unstack(tree) -> list:
    """The members of a stacked pytree: ``unstack(stack(ts))`` gives ``ts`` back.

    Args:
        tree: a pytree whose tensors share their size N along axis 0.

    Returns:
        A list of N pytrees, the i-th holding index i of every tensor.

    Raises:
        ValueError: the tensors of ``tree`` differ in their leading size.
    """
    leaves, spec = pytree.tree_flatten(tree)
    sizes = {t.shape[0] for t in leaves if isinstance(t, Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"unstack needs one leading size; got {sorted(sizes)}")
    (n,) = sizes
    return [
        pytree.tree_unflatten([t[i] if isinstance(t, Tensor) else t for t in leaves], spec)
        for i in range(n)
    ]


def _constant(value: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda t: value


class VmappedStep:
    """The step of N members at once; made by [`vmap_step`][gamfunc.training.ensemble.vmap_step].

    Args:
        build: ``build(**h) -> Step`` for one member.
        hparams: name -> tensor of N values, one per member.
        batch_axis: the batch's axis of members, or None for one batch for all.
        randomness: ``torch.func.vmap``'s ``randomness``.
    """

    def __init__(
        self, build: Callable[..., Step], hparams: dict[str, Tensor], batch_axis, randomness
    ):
        self.build, self.hparams = build, hparams
        self.batch_axis, self.randomness = batch_axis, randomness
        self.members = next(iter(hparams.values())).shape[0]

    def _member(self, h: dict[str, Tensor]) -> Step:
        return self.build(**{k: _constant(v) for k, v in h.items()})

    def init(self, params, buffers=None) -> StepState:
        """The stacked states of the members, from stacked ``params`` (and ``buffers``)."""
        self._check(params, "params")

        def one(h, p, b):
            return self._member(h).init(p, b)

        dims = (0, 0, 0 if buffers is not None else None)
        return torch.func.vmap(one, in_dims=dims, randomness=self.randomness)(
            self.hparams, params, buffers
        )

    def __call__(self, params, state, batch):
        """``(params, state, metrics)`` of every member after one step; ``metrics[k]`` has one
        entry per member."""

        def one(h, p, s, b):
            return self._member(h)(p, s, b)

        dims = (0, 0, 0, self.batch_axis)
        return torch.func.vmap(one, in_dims=dims, randomness=self.randomness)(
            self.hparams, params, state, batch
        )

    def _check(self, tree, name: str) -> None:
        sizes = {t.shape[0] for t in pytree.tree_leaves(tree) if isinstance(t, Tensor)}
        if sizes != {self.members}:
            raise ValueError(
                f"{name} must be stacked over the {self.members} members on axis 0 "
                f"(gamfunc.ensemble.stack); got leading sizes {sorted(sizes)}"
            )


def vmap_step(
    build: Callable[..., Step],
    hparams: dict[str, Tensor],
    *,
    batch_axis: int | None = None,
    randomness: str = "error",
) -> VmappedStep:
    """One training step of N members, each with its own parameters, state and hyperparameters.

    Args:
        build: ``build(**h) -> Step`` ([`gamfunc.make_step`][gamfunc.make_step]) for one member, each ``h[k]`` a
            constant schedule ``t -> value`` to give any factory argument that takes a schedule.
        hparams: ``{name: tensor of N values}``: the members' hyperparameters (a grid flattened, or
            the same value N times for seeds of one setting).
        batch_axis: None (every member sees the same batch) or 0 (the batch is stacked per member).
        randomness: ``torch.func.vmap``'s: "error", "same" or "different" (dropout).

    Returns:
        A [`VmappedStep`][gamfunc.training.ensemble.VmappedStep]: ``init(params, buffers=None)`` and ``step(params, state, batch)``
            over stacked params and states. ``torch.compile`` it as any function.

    Raises:
        ValueError: ``hparams`` is empty or its tensors are not 1-d of one length.
    """
    if not isinstance(hparams, dict) or not hparams:
        raise ValueError(
            "hparams must be a non-empty dict {name: 1-d tensor of the members' values}"
        )
    lengths = {k: tuple(v.shape) for k, v in hparams.items() if isinstance(v, Tensor)}
    if len(lengths) != len(hparams) or len({s for s in lengths.values()}) != 1:
        raise ValueError(f"hparams must be 1-d tensors of one length; got shapes {lengths}")
    if len(next(iter(lengths.values()))) != 1:
        raise ValueError(f"hparams must be 1-d tensors of one length; got shapes {lengths}")
    if batch_axis not in (None, 0):
        raise ValueError(f"batch_axis must be None or 0; got {batch_axis!r}")
    return VmappedStep(build, hparams, batch_axis, randomness)
