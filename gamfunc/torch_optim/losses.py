"""The losses of the facade's step, as pure functions of the module's tensors: the module's own
loss on a batch, and a closure's, with the buffers each pass writes kept from step to step."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gamfunc import tree
from gamfunc.nn import Caller
from gamfunc.torch_optim.copies import recopy

__all__ = ["ClosureHolder", "PassBuffers", "as_is", "closure_loss"]


def as_is(module_loss, model: nn.Module, params, batch, buffers):
    """The module's loss in the mode the module is in (no train/eval switch).

    Args:
        module_loss: [`gamfunc.nn.module_loss`][gamfunc.nn.module_loss]'s ``loss_fn``.
        model: the module.
        params: its parameters by name.
        batch: ``(inputs, targets)``.
        buffers: its buffers by name.

    Returns:
        ``(loss, new_buffers)``.
    """
    return module_loss(params, batch, buffers, train=model.training)


class ClosureHolder(nn.Module):
    """Holds the model as a submodule, so that its tensors are swapped around ``closure()``.

    Args:
        model: the module the closure calls.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.call = Caller(self)

    def forward(self, closure):
        return closure()


def closure_loss(holder: ClosureHolder, copy_buffers, params, closure, buffers):
    """``closure()`` evaluated at (params, buffers): the loss and the new buffers, for make_step.

    Args:
        holder: the holder of the model the closure calls.
        copy_buffers: ``buffers -> new buffers`` that the pass writes.
        params: the model's parameters by name.
        closure: ``closure() -> loss``, which calls the model.
        buffers: the model's buffers by name.

    Returns:
        ``(loss, new_buffers)``.

    Raises:
        TypeError: the closure returned no tensor.
    """
    new_buffers = copy_buffers(buffers)
    tensors = (
        {f"model.{k}": v for k, v in params.items()},
        {f"model.{k}": v for k, v in new_buffers.items()},
    )
    loss = holder.call(tensors, (closure,))
    if not isinstance(loss, Tensor):
        raise TypeError(f"the closure must return the loss tensor; it returned {type(loss)}")
    return loss, new_buffers


class PassBuffers:
    """The buffers that each pass of the facade's step writes (BatchNorm's running statistics):
    copies of the module's, written in place from step to step
    ([`recopy`][gamfunc.torch_optim.copies.recopy]), where a new copy per pass allocates every
    buffer anew (ResNet-50: 159 tensors a pass, a host cost that davda54/sam's in-place BatchNorm
    does not have). The k-th pass of a step writes into the k-th set; `new_step` counts from the
    first again, once the last step's buffers were copied into the module and nothing reads them.
    Traced, inside a ``torch.func`` transform, for buffers that autograd records, or while a CUDA
    graph is captured, each pass gets new copies (`gamfunc.tree.clone`)."""

    def __init__(self):
        self._sets: list[list[Tensor]] = []
        self._sources: list[list[Tensor]] = []
        self._next = 0

    def new_step(self) -> None:
        """Count the passes from the first again: the last step's buffers are in the module."""
        self._next = 0

    def __call__(self, buffers: dict[str, Tensor]) -> dict[str, Tensor]:
        """The buffers this pass writes: copies of ``buffers``.

        Args:
            buffers: the module's buffers by name.

        Returns:
            Their copies by name.
        """
        values = list(buffers.values())
        if not values or not _reusable(values):
            return tree.clone(buffers)
        i = self._next
        self._next += 1
        if i == len(self._sets):
            self._sets.append([])
            self._sources.append([])
        self._sets[i] = recopy(self._sets[i], values, self._sources[i])
        self._sources[i] = values
        return dict(zip(buffers, self._sets[i], strict=True))


def _reusable(buffers: list[Tensor]) -> bool:
    """Whether a pass may write into buffers kept from an earlier step: where `gamfunc.tree.clone`
    takes its foreach kernels (eager, outside torch.func transforms, autograd not recording the
    buffers), and no CUDA graph is being captured."""
    if tree.per_tensor(buffers):
        return False
    return not (buffers[0].is_cuda and torch.cuda.is_current_stream_capturing())
