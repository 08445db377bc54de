"""From an ``nn.Module`` to the functional contract: ``(loss_fn, params, buffers)``, and back
(`load`)."""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gamfunc import tree
from gamfunc._compat import check_uncompiled, check_unhooked
from gamfunc.nn.norms import autocast_batchnorm

__all__ = [
    "Caller",
    "check_loss_form",
    "check_uncompiled",
    "functionalize",
    "load",
    "mode",
    "module_loss",
    "places",
    "tied",
]


@contextlib.contextmanager
def mode(model: nn.Module, train: bool):
    """Evaluate ``model`` in train (batch statistics) or eval mode inside the block, then restore
    every submodule's own mode. Nothing changes when the model is already in that mode.

    Args:
        model: the module whose mode is set.
        train: True for train mode, False for eval mode.

    Returns:
        A context manager; on exit every submodule is back in the mode it had on entry.
    """
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


def functionalize(model: nn.Module, criterion=F.cross_entropy, *, loss=None, train: bool = True):
    """Split a module into ``(loss_fn, params, buffers)`` for gamfunc's pure functions.

    ``loss_fn(params, batch, buffers) -> (loss, new_buffers)``, evaluated with the given tensors in the
    module's place, as ``torch.func.functional_call`` does ([`Caller`][gamfunc.nn.Caller]). The loss
    has one of two forms:

    * ``criterion(model(inputs), targets)`` for ``batch = (inputs, targets)`` (the default form);
    * ``loss(model, batch)`` for any other batch: a dict of tensors (``input_ids``, ``labels``...),
      a tuple of three, any pytree. ``loss`` receives the module itself, with the given tensors in
      its place, and the batch as it came, and returns the scalar loss, e.g.
      ``loss=lambda model, b: F.cross_entropy(model(b["input_ids"]), b["labels"])``.

    Either way the batch is an argument of ``loss_fn``: compiled (``step.compile()``,
    ``torch.compile``), its tensors are inputs of the graph, not constants.

    The buffers are cloned inside, so BatchNorm's in-place update of its running statistics touches
    only the clones (this is what lets ``torch.func.grad``, ``jvp`` and ``vmap`` run through BatchNorm
    in train mode) and ``new_buffers`` returns them; the caller's tensors are never modified.

    Its BatchNorm layers are made safe for forward-mode AD under autocast, in place
    ([`autocast_batchnorm`][gamfunc.nn.autocast_batchnorm]): what they compute does not change.

    Args:
        model: the module; only its structure is used, its tensors are copied out (detached).
        criterion: ``criterion(outputs, targets) -> scalar`` for ``(inputs, targets)`` batches;
            cross-entropy by default.
        loss: ``loss(model, batch) -> scalar`` for batches of any form, in place of ``criterion``.
        train: evaluate in train mode (batch statistics; running statistics updated in the returned
            buffers) or eval mode (running statistics; buffers returned unchanged). ``loss_fn`` takes
            the same keyword to override it per call (the metrics' ``mode=`` uses it).

    Returns:
        ``(loss_fn, params, buffers)``, the last two flat dicts of detached tensors.

    Raises:
        TypeError: ``model`` is no ``torch.nn.Module``, or is ``torch.compile(module)``
            ([`check_uncompiled`][gamfunc._compat.compiler.check_uncompiled]: give the module and compile the
            step); ``loss`` is not a function of ``(model, batch)``, or is given with a
            ``criterion``. When called, ``loss_fn`` raises ValueError for a batch that is not a pair
            in the ``criterion`` form, and TypeError for a ``loss`` that returns no 0-d tensor.

    Example:
        >>> import torch, gamfunc
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        >>> loss_fn, params, buffers = gamfunc.nn.functionalize(model)
        >>> step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.sgd(lr=0.1), loss_fn)
        >>> state = step.init(params, buffers)
        >>> batch = (torch.randn(16, 4), torch.randint(0, 3, (16,)))
        >>> params, state, metrics = step(params, state, batch)

        A batch that is a dict, and the loss of the model on it:

        >>> import torch.nn.functional as F
        >>> loss = lambda model, b: F.cross_entropy(model(b["x"]), b["labels"])
        >>> loss_fn, params, buffers = gamfunc.nn.functionalize(model, loss=loss)
        >>> step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1), loss_fn)
        >>> batch = {"x": torch.randn(16, 4), "labels": torch.randint(0, 3, (16,))}
        >>> params, state, metrics = step(params, step.init(params, buffers), batch)
    """
    check_uncompiled(
        model, "functionalize(model)", "functionalize(model._orig_mod), then step.compile()"
    )
    loss_fn = module_loss(model, criterion, loss=loss, train=train)  # checks the model's type
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return loss_fn, params, buffers


def module_loss(
    model: nn.Module,
    criterion=F.cross_entropy,
    *,
    loss=None,
    train: bool = True,
    copy_buffers=tree.clone,
):
    """[`functionalize`][gamfunc.nn.functionalize]'s ``loss_fn``, each pass writing into the
    buffers that ``copy_buffers(buffers)`` returns.

    Makes ``model``'s BatchNorm layers safe for forward-mode AD under autocast, in place.

    Args:
        model: the module.
        criterion: ``criterion(outputs, targets) -> scalar`` for ``(inputs, targets)`` batches.
        loss: ``loss(model, batch) -> scalar`` for batches of any form, in place of ``criterion``
            (see [`functionalize`][gamfunc.nn.functionalize]).
        train: the mode of evaluation, which ``loss_fn``'s keyword ``train`` overrides per call.
        copy_buffers: ``buffers -> new buffers`` that a pass may write: `gamfunc.tree.clone` by
            default; the ``torch.optim`` facade gives copies kept from step to step, since it knows
            when a step's are no longer read.

    Returns:
        ``loss_fn(params, batch, buffers, *, train=train) -> (loss, new_buffers)``.

    Raises:
        TypeError: ``model`` is no ``torch.nn.Module``; ``loss`` is not a function of ``(model,
            batch)``, or is given with a ``criterion``.
    """
    if not isinstance(model, nn.Module):  # else it fails later, deep inside
        hint = " (a state dict: load it into its module first)" if isinstance(model, dict) else ""
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}{hint}")
    check_unhooked(model, "functionalize(model)")
    check_loss_form(criterion, loss)
    autocast_batchnorm(model)
    if loss is not None:
        return _any_batch_loss(model, loss, train, copy_buffers)
    call = Caller(model)

    def loss_fn(params, batch, buffers, *, train: bool = train):
        inputs, targets = _pair(batch)
        new_buffers = copy_buffers(buffers)
        with mode(model, train):
            out = call((params, new_buffers), (inputs,))
        return criterion(out, targets), new_buffers

    return loss_fn


def _any_batch_loss(model: nn.Module, loss, train: bool, copy_buffers):
    """``loss(model, batch)`` with the given tensors in the module's place: the module is held as
    the submodule ``model`` of `_Applied`, whose forward calls ``loss``."""
    holder = _Applied(model)
    call = Caller(holder)

    def loss_fn(params, batch, buffers, *, train: bool = train):
        new_buffers = copy_buffers(buffers)
        tensors = (
            {f"model.{k}": v for k, v in params.items()},
            {f"model.{k}": v for k, v in new_buffers.items()},
        )
        with mode(model, train):
            value = call(tensors, (loss, batch))
        if not (isinstance(value, torch.Tensor) and value.dim() == 0):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(f"loss(model, batch) must return the loss as a 0-d tensor; got {got}")
        return value, new_buffers

    return loss_fn


class _Applied(nn.Module):
    """Holds ``model`` as its submodule ``model``; its forward is ``fn(model, *args)``, so that a
    `Caller` of it evaluates any function of the module with the tensors named ``model.<name>``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args):
        return fn(self.model, *args)


def check_loss_form(criterion, loss) -> None:
    """One line naming the argument, unless ``loss`` is None or a function of ``(model, batch)``
    given without a ``criterion`` of its own.

    Args:
        criterion: the ``criterion`` given (``F.cross_entropy`` is the default).
        loss: the ``loss`` given, or None.

    Raises:
        TypeError: as said.
    """
    if loss is None:
        return
    form = "loss(model, batch) -> scalar, e.g. lambda model, b: criterion(model(b['x']), b['y'])"
    if not callable(loss):
        raise TypeError(f"loss must be a function {form}; got {type(loss).__name__}")
    if criterion is not F.cross_entropy:
        raise TypeError(
            "give criterion= (criterion(outputs, targets) for (inputs, targets) batches) or "
            "loss= (loss(model, batch) for any batch), not both"
        )
    try:
        signature = inspect.signature(loss)
    except (TypeError, ValueError):  # a callable whose signature Python cannot read
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(
            f"loss must take two arguments, the model and the batch: {form}; got loss{signature}"
        ) from None


def _pair(batch) -> tuple:
    """``batch`` as ``(inputs, targets)``; a ValueError that names ``loss=`` for other batches."""
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    size = f" of {len(batch)}" if isinstance(batch, tuple | list) else ""
    raise ValueError(
        f"batch must be a pair (inputs, targets) for criterion(model(inputs), targets); got a "
        f"{type(batch).__name__}{size}: for other batches give loss=lambda model, batch: ... "
        "(the loss of the model on the batch) instead of a criterion"
    )


class Caller:
    """``torch.func.functional_call(model, tensors, args)``, with the place of each named tensor
    found once, when the caller is built.

    ``functional_call`` finds the submodule of every name, checks it and swaps the tensor in and
    out at each call: a few µs of Python per tensor (0.3 ms per pass of a ResNet-50's 320
    parameters and buffers on one CPU core), every pass of every eager step. Run eagerly, the
    caller writes each tensor straight into the ``_parameters`` or ``_buffers`` dict that holds it,
    as ``functional_call`` does, calls the module, and puts the module's own tensors back, also
    when the call raises. Traced by ``torch.compile`` it does the same, which Dynamo follows in
    fewer steps than ``functional_call``'s per-name swaps: for a compiled pass of exact GAM on a
    ResNet-50, 45,652 lines traced instead of 85,186, and Dynamo's tracing took 34.8 s instead of
    40.2 s (CPU, torch 2.14). For a module with tied weights, or for a name it did not find, it is
    ``functional_call`` itself. The module's structure is read once: replace a submodule and build
    a new caller.

    Args:
        model: the module.

    Example:
        >>> import torch
        >>> from gamfunc.nn import Caller
        >>> model = torch.nn.Linear(2, 1)
        >>> tensors = {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}
        >>> out = Caller(model)(tensors, (torch.ones(3, 2),))
        >>> out.flatten().tolist()
        [2.0, 2.0, 2.0]
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.ties = tied(model)
        self.places = places(model)

    def __call__(self, tensors: dict | tuple[dict, ...], args: tuple):
        """``model(*args)`` with the module's tensors named in ``tensors`` (one dict or several)
        replaced by those given.

        Args:
            tensors: ``name -> tensor``, or a tuple of such dicts (parameters, buffers).
            args: the positional arguments of the module's forward.

        Returns:
            What the module returns.
        """
        dicts = tensors if isinstance(tensors, tuple) else (tensors,)
        slots = None if self.ties else self._slots(dicts)
        if slots is None:
            return functional_call(self.model, tensors, args, tie_weights=self.ties)
        new = [v for d in dicts for v in d.values()]
        old = [held[k] for held, k in slots]
        for (held, k), v in zip(slots, new, strict=True):
            held[k] = v
        try:
            return self.model(*args)
        finally:
            for (held, k), v in zip(slots, old, strict=True):
                held[k] = v

    def _slots(self, dicts) -> list[tuple[dict, str]] | None:
        """The place of every name in ``dicts``; None where one is not the module's."""
        try:
            return [self.places[k] for d in dicts for k in d]
        except KeyError:
            return None


def places(model: nn.Module) -> dict[str, tuple[dict, str]]:
    """Where each of a module's tensors lives: the dict that holds it and its key there.

    Args:
        model: the module.

    Returns:
        ``name -> (submodule._parameters or ._buffers, key)`` of each parameter and buffer: where
        the tensor of that name is read, and where another is written in its place.
    """
    places = {}
    for prefix, m in model.named_modules():
        head = f"{prefix}." if prefix else ""
        places.update({head + k: (m._parameters, k) for k in m._parameters})
        places.update({head + k: (m._buffers, k) for k in m._buffers})
    return places


def tied(model: nn.Module) -> bool:
    """Whether a tensor of ``model`` sits under two names (tied weights). Where none does,
    ``torch.func.functional_call(..., tie_weights=False)`` swaps the same tensors as with ties, without
    walking every submodule at each call to find them.

    Args:
        model: the module.

    Returns:
        True when two of its parameter or buffer names share one tensor.
    """
    every = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    return len({id(t) for _, t in every}) < len(every)


def load(model: nn.Module, params, buffers=None) -> nn.Module:
    """Copy ``params`` (and ``buffers``) back into ``model`` in place, e.g. to save or evaluate it.

    Args:
        model: the module to write into.
        params: a flat dict with a tensor for every name of ``model.named_parameters()``.
        buffers: a flat dict of buffers; those of ``model.named_buffers()`` it names are copied,
            the others left as they are. None copies none.

    Returns:
        ``model``.

    Raises:
        KeyError: ``params`` lacks one of the model's parameter names.
    """
    with torch.no_grad():
        for k, v in model.named_parameters():
            v.copy_(params[k])
        for k, b in model.named_buffers():
            if buffers is not None and k in buffers:
                b.copy_(buffers[k])
    return model
