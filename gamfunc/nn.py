"""From an ``nn.Module`` to the functional contract: ``(loss_fn, params, buffers)``."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

__all__ = ["float32_batchnorm", "functional", "load", "mode"]


@contextlib.contextmanager
def mode(model: nn.Module, train: bool):
    """Evaluate ``model`` in train (batch statistics) or eval mode inside the block, then restore
    every submodule's own mode. Nothing changes when the model is already in that mode."""
    if model.training == train:
        yield
        return
    modes = {m: m.training for m in model.modules()}
    model.train(train)
    try:
        yield
    finally:
        for m, t in modes.items():
            m.training = t


def functional(model: nn.Module, criterion=F.cross_entropy, *, train: bool = True):
    """Split a module into ``(loss_fn, params, buffers)`` for gamfunc's pure functions.

    ``loss_fn(params, batch, buffers) -> (loss, new_buffers)`` with ``batch = (inputs, targets)`` and
    ``loss = criterion(model(inputs), targets)``, evaluated through ``torch.func.functional_call``.
    The buffers are cloned inside, so BatchNorm's in-place update of its running statistics touches
    only the clones (this is what lets ``torch.func.grad``, ``jvp`` and ``vmap`` run through BatchNorm
    in train mode) and ``new_buffers`` returns them; the caller's tensors are never modified.

    Args:
        model: the module; only its structure is used, its tensors are copied out (detached).
        criterion: ``criterion(outputs, targets) -> scalar``; cross-entropy by default.
        train: evaluate in train mode (batch statistics; running statistics updated in the returned
            buffers) or eval mode (running statistics; buffers returned unchanged). ``loss_fn`` takes
            the same keyword to override it per call (the metrics' ``mode=`` uses it).

    Returns:
        ``(loss_fn, params, buffers)``, the last two flat dicts of detached tensors.

    Example:
        >>> import torch, gamfunc
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        >>> loss_fn, params, buffers = gamfunc.nn.functional(model)
        >>> step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), loss_fn)
        >>> state = step.init(params, buffers)
        >>> batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
        >>> params, state, metrics = step(params, state, batch)
    """
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}

    def loss_fn(params, batch, buffers, *, train: bool = train):
        inputs, targets = batch
        new_buffers = {k: v.clone() for k, v in buffers.items()}
        with mode(model, train):
            out = functional_call(model, (params, new_buffers), (inputs,))
        return criterion(out, targets), new_buffers

    return loss_fn, params, buffers


def load(model: nn.Module, params, buffers=None) -> nn.Module:
    """Copy ``params`` (and ``buffers``) back into ``model`` in place, e.g. to save or evaluate it."""
    with torch.no_grad():
        for k, v in model.named_parameters():
            v.copy_(params[k])
        for k, v in model.named_buffers():
            if buffers is not None and k in buffers:
                v.copy_(buffers[k])
    return model


class _Float32BatchNorm:
    """Mixed into a BatchNorm module's class by :func:`float32_batchnorm`."""

    def forward(self, x):
        return super().forward(x.float())


def float32_batchnorm(model: nn.Module) -> nn.Module:
    """Make every BatchNorm of ``model`` normalise its input in float32 and return float32, in place;
    parameter and buffer names stay as they were. Returns ``model``.

    Under ``torch.autocast`` a BatchNorm takes the bfloat16 output of the layer before it and returns
    bfloat16, while the forward-mode derivative of its float32 weight comes out in float32: the next
    convolution then meets a bfloat16 input with a float32 tangent, and forward-over-reverse
    Hessian-vector products (``hvp="exact"``) fail. With the input upcast, value and tangent are both
    float32 and autocast casts both for the next layer, so ``hvp="exact"`` runs. Without autocast the
    model computes what it computed before (BatchNorm already runs in the parameters' dtype).
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, _Float32BatchNorm):
            m.__class__ = _float32_class(type(m))
    return model


_FLOAT32_CLASSES: dict[type, type] = {}


def _float32_class(cls: type) -> type:
    if cls not in _FLOAT32_CLASSES:
        _FLOAT32_CLASSES[cls] = type(f"Float32{cls.__name__}", (_Float32BatchNorm, cls), {})
    return _FLOAT32_CLASSES[cls]
