"""The facade on a model with distributed hooks: ``fully_shard`` (FSDP2) or
``DistributedDataParallel``. Every pass of a step runs through the module's own autograd, so the
hooks all-gather the shards before the forward and reduce-scatter (or all-reduce) the gradients
after the backward, as they do for SGD.

```text
θ      = the step's parameters: DTensor copies of this rank's shards (FSDP2), or tensors (DDP)
pass p : module ← p; loss_r = loss of rank r's batch; backward; g = .grad  (the mean over ranks)
         loss = mean_r loss_r; BatchNorm's buffers: mean_r of each rank's       (one all-reduce)
step   : the estimator on θ and the passes' g, then the base optimiser
```

The estimators' tree math runs on the DTensors themselves: an elementwise operation acts on the
local shard, and a norm or an inner product ‖g‖² = Σ_r ‖g_r‖² sums each rank's shard and
all-reduces the partial sums (DTensor's ``Partial`` placement), so no rank ever gathers the full
parameters. One rank's step is then the single-process step on the concatenated batch, provided
every rank holds a batch of one size (the hooks average the ranks' gradients with equal weights).

Only estimators built on gradients run so: exact and reverse H·v differentiate the graph of a
gradient, which the hooks free after each backward; the finite difference
``hvp=gamfunc.hvps.fd()`` takes its place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from gamfunc._compat import distributed_hooks, dtensor_type
from gamfunc.loss import Pass
from gamfunc.optim.base import Transform, call_update
from gamfunc.torch_optim.module_grads import ModuleGradients, gradients_only
from gamfunc.wrappers.distributed import all_reduce_mean

# the first torch whose DTensors run every estimator's tree maths on fully_shard's shards (2.13
# refuses to add a reduced scalar to a shard, e.g. GSAM's projection, and to stack shard flags)
FULLY_SHARD_TORCH = (2, 14)
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])

__all__ = [
    "ShardedGradients",
    "hooked",
    "passes",
    "per_rank_bytes",
    "placed",
    "plain",
]


def hooked(model: nn.Module) -> bool:
    """Whether ``model`` (or a submodule) carries ``fully_shard``'s or ``DistributedDataParallel``'s
    hooks, so that the facade runs its passes through the module's autograd.

    Args:
        model: the facade's model.

    Returns:
        True for a sharded or DDP-wrapped model.
    """
    return distributed_hooks(model) is not None


def passes(
    model: nn.Module,
    estimator,
    base,
    criterion: Callable,
    loss: Callable | None,
    compile,
    precision: str,
    accumulate: int,
    cuda_graph: bool,
) -> ShardedGradients | None:
    """The loss of every pass of a facade over ``model`` where it is `hooked`, None otherwise, with
    one-line refusals of what a hooked model cannot run. The arguments are the facade's.

    Returns:
        A [`ShardedGradients`][gamfunc.torch_optim.sharded.ShardedGradients], or None.

    Raises:
        ValueError: an estimator that needs exact or reverse H·v (naming ``hvp=gamfunc.hvps.fd()``),
            ``compile=``, ``cuda_graph=True``, ``accumulate > 1`` or ``precision`` other than fp32,
            each naming the argument.
    """
    hooks = distributed_hooks(model)
    if hooks is None:
        return None
    if hooks.startswith("fully_shard") and TORCH < FULLY_SHARD_TORCH:
        raise RuntimeError(
            f"model: training a model under {hooks} through the facade needs torch >= "
            f"{'.'.join(map(str, FULLY_SHARD_TORCH))} (older DTensors cannot add a reduced scalar "
            f"to a shard); this is torch {torch.__version__}: upgrade torch, or wrap the model in "
            "DistributedDataParallel"
        )
    if not gradients_only(estimator, base):
        raise ValueError(
            f"estimator: a model under {hooks} runs each pass through its own autograd, whose hooks "
            "free the graph after each backward, so exact and reverse H·v cannot run: build the "
            "estimator with hvp=gamfunc.hvps.fd() (hvp='fd')"
        )
    options = {
        "compile": (compile, False),
        "cuda_graph": (cuda_graph, False),
        "accumulate": (accumulate, 1),
        "precision": (precision, "fp32"),
    }
    for name, (value, plain_value) in options.items():
        if value != plain_value:
            raise ValueError(
                f"{name}={value!r}: a model under {hooks} runs eagerly through its own autograd, "
                f"in the precision it computes in; leave {name} at {plain_value!r}"
            )
    return ShardedGradients(criterion, loss)


class ShardedGradients(ModuleGradients):
    """[`ModuleGradients`][gamfunc.torch_optim.module_grads.ModuleGradients] on a hooked module,
    with the pass's loss and the floating-point buffers it wrote (BatchNorm's running statistics)
    averaged over the ranks of ``group``, in one all-reduce, so that every rank reports the loss of
    the whole batch and keeps the same buffers.

    Args:
        criterion: ``criterion(outputs, targets)`` of ``step((inputs, targets))``.
        loss: ``loss(model, batch)`` of ``step(batch)``, or None for the pair form.
        group: the process group of the data-parallel ranks; the default group if None.
    """

    def __init__(self, criterion: Callable, loss: Callable | None = None, group=None):
        super().__init__()
        self.criterion, self.loss, self.group = criterion, loss, group

    def closure(self, model: nn.Module, batch) -> Callable:
        """``step(batch)`` as a closure: ``criterion(model(inputs), targets)``, or
        ``loss(model, batch)``, differentiated through the module's autograd (`differentiate`).

        Args:
            model: the module.
            batch: ``(inputs, targets)``, or a batch of any form for ``loss``.

        Returns:
            ``closure() -> loss``.
        """
        if self.loss is not None:
            loss = self.loss
            return lambda: loss(model, batch)
        inputs, targets = batch
        return lambda: self.criterion(model(inputs), targets)

    def gradient_pass(self, params, closure) -> Pass:
        p = super().gradient_pass(params, closure)
        loss, aux = all_reduce_mean([p.loss, p.aux], group=self.group)
        return Pass(p.grad, loss, aux)

    def differentiate(self, loss: Tensor, held: list[Tensor]) -> list[Tensor | None]:
        """``loss.backward()``, then ``.grad``: the hooks reduce the gradients only in a backward
        that accumulates into ``.grad``: ``torch.autograd.grad`` gives gradients they have not
        reduced, without an error."""
        loss.backward()
        return [p.grad for p in held]


def placed(transform: Transform, model: nn.Module) -> Transform:
    """``transform`` given the direction in the layout of the parameters where ``model`` is
    `hooked`, ``transform`` itself otherwise. A DTensor of the
    direction whose placements differ from its parameter's (DTensor's rules may shard a result
    along another dimension where a rank's shard is empty) is redistributed to them first, since
    an optimiser writes in place (``param.add_(grad)``) only between tensors of one layout.

    Args:
        transform: the base optimiser.
        model: the facade's model.

    Returns:
        The same init; the same update, of the re-placed direction.
    """
    cls = dtensor_type()
    if not hooked(model):
        return transform

    def like(d, p):
        if cls is None or not isinstance(d, cls) or d.placements == p.placements:
            return d
        return d.redistribute(p.device_mesh, p.placements)

    def update(direction, state, params, *, step=None):
        direction = {k: like(d, params[k]) for k, d in direction.items()}
        return call_update(transform, direction, state, params, step)

    return Transform(transform.init, update)


def plain(metrics: dict[str, Tensor]) -> dict[str, Tensor]:
    """``metrics`` with each DTensor (a norm, the skip flag: replicated, or partial sums) as the
    plain tensor of its global value, the same on every rank."""
    cls = dtensor_type()
    if cls is None:
        return metrics
    return {k: v.full_tensor() if isinstance(v, cls) else v for k, v in metrics.items()}  # type: ignore[attr-defined]


def _local_bytes(tensors) -> int:
    cls = dtensor_type()
    total = 0
    for t in tensors:
        if isinstance(t, Tensor):
            t = t.to_local() if cls is not None and isinstance(t, cls) else t  # type: ignore[attr-defined]
            total += t.numel() * t.element_size()
    return total


def per_rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What this rank holds, in bytes: its shards of the parameters, of their gradients, and of the
    base optimiser's state (momentum buffers, Adam's moments; not its step counts' scalars alone).

    Args:
        model: the module (sharded or not).
        optimizer: a ``torch.optim`` optimiser over its parameters (the facade's base optimiser,
            ``opt._torch``), or the facade itself.

    Returns:
        ``{"params": ..., "grads": ..., "state": ...}``.
    """
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values()]
    return {
        "params": _local_bytes(params),
        "grads": _local_bytes([p.grad for p in params if p.grad is not None]),
        "state": _local_bytes(state),
    }
