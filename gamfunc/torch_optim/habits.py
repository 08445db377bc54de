"""The habits of a ``torch.optim`` loop that a flatness step cannot follow, each caught where it
happens with one line that says what to write instead: gradients set by hand before ``step()``,
``torch.amp.GradScaler``, davda54/sam's names, and a learning rate a scheduler made negative."""

from __future__ import annotations

import functools
import math
import warnings

from torch import Tensor

__all__ = [
    "DAVDA54",
    "FILLED_BEFORE",
    "FILLED_BEFORE_LIGHTNING",
    "GRAD_SCALER",
    "GUIDE",
    "HAND_SET_GRAD",
    "CaughtHabits",
    "GradWatch",
    "HandSetGrad",
    "check_lrs",
    "davda54_error",
    "filled_before",
    "from_lightning",
]

GUIDE = "docs/guides/torch-optim.md, 'Coming from davda54/sam'"
"""Where davda54/sam's names point: the migration section of the torch.optim guide."""

DAVDA54 = {
    "first_step": "first_step() and second_step() are davda54/sam's two half-steps: here one "
    "step((inputs, targets)), or step(closure), runs the whole step",
    "second_step": "first_step() and second_step() are davda54/sam's two half-steps: here one "
    "step((inputs, targets)), or step(closure), runs the whole step",
    "base_optimizer": "base_optimizer: the facade holds the base optimiser's param groups and "
    "state itself (optimizer.param_groups, optimizer.state): attach schedulers to the facade",
}
"""davda54/sam's attribute names, each with what the facade does instead."""

GRAD_SCALER = (
    "torch.amp.GradScaler cannot drive a flatness step (it scales .grad, which the step does not "
    "read, and skips step() on overflow): drop the scaler and build the optimiser with "
    "precision='fp16' (its loss scale is in the step's state)"
)
"""The one line that refuses ``torch.amp.GradScaler`` on its first use."""

HAND_SET_GRAD = (
    "step(): the .grad of a parameter was set or changed since the last step (clip_grad_norm_, a "
    "manual scale, a backward() outside the step): a flatness step computes its own gradients and "
    "does not read .grad; clip with max_grad_norm=, scale with precision=, accumulate with "
    "accumulate="
)
"""The one warning, once per optimiser, for gradients set by hand before ``step()``."""


FILLED_BEFORE = (
    "step(closure): a parameter's .grad was filled before the step by a backward() outside the "
    "closure (davda54/sam's first forward-backward before step(closure)), which a flatness step "
    "drops: it evaluates the closure at every point itself; drop that backward(), or call "
    "zero_grad() before step(closure)"
)
"""The one line refusing gradients filled before a closure step, which its passes would drop."""

FILLED_BEFORE_LIGHTNING = (
    "step(closure): a parameter's .grad was filled before the step by Lightning's "
    "accumulate_grad_batches > 1 (several loader batches summed in .grad), which a flatness step "
    "drops: it evaluates the closure at every point; drop accumulate_grad_batches. The facade's "
    "accumulate=n is not that: it splits one batch into n micro-batches, given as "
    "self.optimizers().step(batch=batch) in manual optimisation (see docs/guides/torch-optim.md, "
    "'Closures and Lightning')"
)
"""The same refusal where the closure is Lightning's (automatic optimisation)."""


def filled_before(closure) -> str:
    """The refusal of gradients filled before ``step(closure)``, for the closure given: Lightning's
    (its gradient accumulation), or any other (davda54/sam's first forward-backward).

    Args:
        closure: the closure given to ``step``.

    Returns:
        `FILLED_BEFORE_LIGHTNING` or `FILLED_BEFORE`.
    """
    return FILLED_BEFORE_LIGHTNING if from_lightning(closure) else FILLED_BEFORE


def from_lightning(closure) -> bool:
    """Whether ``closure`` is Lightning's: its precision plugin's ``functools.partial`` of a method,
    or a callable object of a ``lightning`` or ``pytorch_lightning`` module.

    Args:
        closure: any callable.

    Returns:
        True for Lightning's closure.
    """
    while isinstance(closure, functools.partial):
        closure = closure.func
    module = getattr(closure, "__module__", None) or type(closure).__module__
    return module.split(".")[0] in ("lightning", "pytorch_lightning")


def davda54_error(owner: str, name: str) -> AttributeError:
    """The one-line AttributeError for davda54/sam's ``name`` on the facade ``owner``.

    Args:
        owner: the facade's class name.
        name: one of `DAVDA54`.

    Returns:
        The error, pointing to the migration guide.
    """
    return AttributeError(f"{owner} has no {name}: {DAVDA54[name]} (see {GUIDE})")


class GradWatch:
    """Tells whether a parameter's ``.grad`` was set or changed since the facade last looked.

    It keeps, per parameter, the identity and the version counter of its ``.grad`` (a tensor's
    ``_version`` counts its in-place writes, ``clip_grad_norm_``'s and ``mul_``'s included), and
    compares them on the host: no device synchronisation. A ``.grad`` of None is never "set".
    """

    def __init__(self):
        self._seen: list[tuple[int, int] | None] = []

    def changed(self, params: list[Tensor]) -> bool:
        """Whether some ``.grad`` of ``params`` is not None and is another tensor, or was written,
        since the last `record`.

        Args:
            params: the parameters, in the order of the last `record`.

        Returns:
            True where one was set or changed.
        """
        seen = self._seen
        for i, p in enumerate(params):
            g = p.grad
            if g is None:
                continue
            was = seen[i] if i < len(seen) else None
            if was is None or was[0] != id(g) or was[1] != g._version:
                return True
        return False

    def record(self, params: list[Tensor]) -> None:
        """Take the ``.grad`` of ``params`` as they are now as the facade's own (after a step, a
        ``zero_grad()``), in place, so that a copy of the facade's ``__dict__`` (Lightning's
        optimiser wrapper) shares it.

        Args:
            params: the parameters.
        """
        self._seen[:] = [None if p.grad is None else (id(p.grad), p.grad._version) for p in params]


class HandSetGrad:
    """`GradWatch` that warns once: at ``step()``, a ``.grad`` set by hand since the last step."""

    def __init__(self):
        self.watch = GradWatch()
        self.warned = False

    def check(self, params: list[Tensor]) -> None:
        """Warn (once) where a ``.grad`` of ``params`` was set or changed since the last step.

        Args:
            params: the trainable parameters.
        """
        if not self.warned and self.watch.changed(params):
            self.warned = True
            warnings.warn(HAND_SET_GRAD, UserWarning, stacklevel=4)


class CaughtHabits:
    """The facade's hooks where a ``torch.optim`` habit first touches the optimiser:
    ``_step_supports_amp_scaling`` and davda54/sam's attribute names. Each refuses in one line;
    anything else behaves as on a plain optimiser.

    ``_step_supports_amp_scaling`` is the question torch asks of an optimiser that may handle a
    loss scale itself (torch.optim's fused optimisers answer True): ``torch.amp.GradScaler.step``
    asks it first, on every step, before it looks for an overflow, and so does Lightning's fp16
    precision. Its answer here is the refusal, so any GradScaler loop stops on its first
    ``scaler.step(optimizer)``, before a parameter moves. ``scaler.unscale_(optimizer)`` before it
    divides ``.grad``, which the step does not read.
    """

    @property
    def _step_supports_amp_scaling(self) -> bool:
        """What ``GradScaler.step`` asks first, before it looks for an overflow: a TypeError."""
        raise TypeError(GRAD_SCALER)

    def __getattr__(self, name: str):
        if name in DAVDA54:
            raise davda54_error(type(self).__name__, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def check_lrs(groups: list[dict]) -> None:
    """A one-line ValueError where a param group's lr is a number below 0 or not finite (a
    scheduler's ``LambdaLR(lambda t: -1.0)`` would make the step ascend). A tensor lr is not read
    (that would wait for the device).

    Args:
        groups: the facade's param groups.

    Raises:
        ValueError: naming the group and lr.
    """
    for i, g in enumerate(groups):
        lr = g.get("lr")
        if isinstance(lr, float | int) and not (0 <= lr < math.inf):
            raise ValueError(
                f"param_groups[{i}]['lr'] is {lr!r} (set by a scheduler or by hand): lr must be a "
                f"finite number >= 0"
            )
