"""The step's direction, left in each parameter's ``.grad`` after the facade's ``step()``.

A ``torch.optim`` loop finds in ``.grad``, after ``step()``, the gradient the step read: it logs it,
draws its histogram, and clips or scales it before the next step out of habit. The facade's step
forms its gradients inside the pure step and reads no ``.grad``; left at None, ``.grad`` would make
``clip_grad_norm_`` before the next step a silent no-op (nothing to clip, a norm of 0). So the
facade leaves there what its base optimiser moved by: the estimator's direction (GAM's, SAM's...),
clipped by ``max_grad_norm=`` where given. A clip or a scale of it before the next step is then a
write the facade sees ([`HandSetGrad`][gamfunc.torch_optim.habits.HandSetGrad] warns once).
"""

from __future__ import annotations

from typing import cast

from torch import Tensor

from gamfunc.optim import Transform, call_update
from gamfunc.torch_optim.copies import copy_into
from gamfunc.tree import copies

__all__ = ["LastDirection"]


class LastDirection:
    """Records the direction a base optimiser receives, and leaves it in ``.grad``.

    `recording` wraps the base optimiser: its update stores the direction it is given and calls the
    base optimiser's. After the step, `leave` copies that direction into each parameter's ``.grad``:
    copies, so that a write into ``.grad`` (``clip_grad_norm_``'s) cannot reach a tensor the step
    keeps; into the tensors it left there at the last step, where they are still there, so that a
    step allocates no new gradients (after ``zero_grad()`` it makes new ones).
    """

    def __init__(self) -> None:
        self.direction: dict[str, Tensor] | None = None
        # the ids of the tensors left in .grad, not the tensors: zero_grad() frees them
        self._left: list[int] = []

    def recording(self, transform: Transform) -> Transform:
        """``transform``, its update storing the direction it receives.

        Args:
            transform: the base optimiser, a [`Transform`][gamfunc.optim.base.Transform].

        Returns:
            The same init, and the same update after storing its ``direction``.
        """

        def update(direction, state, params, *, step=None):
            self.direction = direction
            return call_update(transform, direction, state, params, step)

        return Transform(transform.init, update)

    def forget(self) -> None:
        """Drop the recorded direction (before a step whose direction is not to be left)."""
        self.direction = None

    def leave(self, trainable: dict[str, Tensor]) -> None:
        """Copy the recorded direction into each parameter's ``.grad``, in the parameter's dtype,
        and drop it; nothing where none was recorded.

        Args:
            trainable: the parameters the step moved, by the direction's names.
        """
        direction, self.direction = self.direction, None
        if direction is None:
            return
        params = list(trainable.values())
        new = [
            d if d.dtype == p.dtype else d.to(p.dtype)
            for p, d in zip(params, (direction[k] for k in trainable), strict=True)
        ]
        held = [p.grad for p in params]
        if len(held) == len(self._left) and all(
            g is not None
            and id(g) == i
            and g.shape == d.shape
            and g.stride() == d.stride()
            and g.dtype == d.dtype
            and g.device == d.device
            for g, i, d in zip(held, self._left, new, strict=True)
        ):
            copy_into(cast(list[Tensor], held), new)
            return
        grads = copies(new)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        self._left = [id(g) for g in grads]
