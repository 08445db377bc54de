r"""Metrics of a model over data: ``(model, data, criterion)`` turned into the
``(params, batch, loss_fn)`` that every metric takes.

Every metric of [`gamfunc.metrics`][gamfunc.metrics] takes either form:

* ``metric(params, batch, loss_fn, ...)``: the functional form, unchanged;
* ``metric(model, data, criterion, ...)``: an ``nn.Module``, one batch ``(inputs, targets)`` or an
  iterable of such batches (a ``DataLoader``, a list), and ``criterion(outputs, targets)``, a mean
  over the examples of a batch (``nn.CrossEntropyLoss()``, ``F.cross_entropy``).

The second form is [`from_model`][gamfunc.metrics.model.from_model] followed by the first. Over
batches B_1..B_k of sizes n_b (N = Σ n_b) the loss is the mean over the whole data,

$$
L(\theta ) = \sum _b (n_b/N)\cdot L_{B_b}(\theta ), \qquad H(\theta )\cdot v = \sum _b (n_b/N)\cdot H_{B_b}(\theta )\cdot v ,
$$

so each gradient and Hessian-vector product is exact, not a sample: it equals the one on a single
batch holding all the data, as PyHessian's ``full_dataset`` mode (its ``dataloader_hv_product``
weights each batch by its size). One product costs one pass over the data, one batch in memory at a
time.

Conventions:

* **Mode.** The model is evaluated in eval mode by default (``mode="eval"``): BatchNorm normalises
  with its running statistics, dropout is off, as PyHessian recommends and the paper measures
  (Section 5.4). ``mode="train"`` uses each batch's own statistics (then the metric over k
  batches is that of k "ghost batches", not of one batch of N). The model's mode, parameters and
  buffers are never modified.
* **Parameters.** The metric is over the parameters that require grad (frozen ones are held
  fixed, as PyHessian's ``get_params_grad``), detached copies on the model's device.
* **Data.** An iterable is read once, when the metric starts, and its batches kept as it gives them
  (on the host for a usual ``DataLoader``); each product moves one batch at a time to the parameters'
  device. A shuffling loader therefore gives the same data on every product; random augmentation is
  drawn once. A batch is a tuple or list whose first element is a tensor; anything else is
  iterated as batches.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from gamfunc import tree
from gamfunc._compat import check_unhooked
from gamfunc.hvps import of_gradient, resolve
from gamfunc.loss import Objective, Pass, check_params, gradient_pass, loss_and_aux
from gamfunc.metrics._common import MODES
from gamfunc.nn import check_uncompiled, functionalize
from gamfunc.tree import Tree

__all__ = ["Batches", "DataMean", "Problem", "from_model", "takes_model"]


class Problem(NamedTuple):
    """What a metric measures: ``metric(*problem, ...)`` is ``metric(params, batch, loss_fn, ...)``.

    Attributes:
        params: θ, the trainable parameters (detached copies).
        batch: the one batch, or a [`Batches`][gamfunc.metrics.model.Batches] of several.
        loss_fn: ``loss_fn(params, batch)``: the criterion on that batch, or a
            [`DataMean`][gamfunc.metrics.model.DataMean] over the batches.
    """

    params: Tree
    batch: Any
    loss_fn: Callable


class Batches:
    """A fixed list of batches with their sizes, each moved to ``device`` when it is read.

    Args:
        batches: the batches, pytrees whose tensors have the examples along dimension 0.
        device: where each batch is moved when read (the parameters' device).
    """

    def __init__(self, batches: list, device: torch.device):
        self.batches = batches
        self.device = device
        self.sizes = [_size(b) for b in batches]
        self.total = sum(self.sizes)

    def __len__(self) -> int:
        return len(self.batches)

    def weighted(self) -> Iterator[tuple[float, Any]]:
        """``(n_b/N, B_b)`` for each batch, B_b on the device."""
        for n, b in zip(self.sizes, self.batches, strict=True):
            yield n / self.total, _to(b, self.device)

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches, {self.total} examples)"


@dataclasses.dataclass(frozen=True, eq=False)
class DataMean(Objective):
    """``loss_fn`` as the size-weighted mean over a [`Batches`][gamfunc.metrics.model.Batches]: the
    loss, every gradient and every H·v are Σ_b (n_b/N)·(that quantity on batch b), one batch at a
    time.

    Attributes:
        loss_fn: the loss of one batch, ``loss_fn(params, batch)``, a mean over its examples.
    """

    loss_fn: Callable

    def __call__(self, params: Tree, batch: Batches, *args, **kwargs):
        total = None
        for w, b in batch.weighted():
            part, _ = loss_and_aux(self.loss_fn, params, b)
            total = part * w if total is None else total + part * w
        return total

    def gradient_pass(self, params: Tree, batch: Batches) -> Pass:
        grad = loss = None
        for w, b in batch.weighted():
            p = gradient_pass(self.loss_fn, params, b)
            grad = tree.scale(p.grad, w) if grad is None else tree.axpy(w, p.grad, grad)
            loss = p.loss * w if loss is None else loss + p.loss * w
        assert grad is not None and loss is not None  # a Batches holds one batch at least
        return Pass(grad, loss, ())

    def hvp(self, backend, params: Tree, batch: Batches, v, clean: Pass | None):
        """Σ_b (n_b/N)·H_b·v with ``backend`` per batch; a v(g) is taken at the mean g first."""
        if of_gradient(v):
            v, clean = resolve(v, clean if clean is not None else self.gradient_pass(params, batch))
        hv = None
        grad = loss = None
        for w, b in batch.weighted():
            part, p = backend(self.loss_fn, params, b, v)
            hv = tree.scale(part, w) if hv is None else tree.axpy(w, part, hv)
            if clean is None:  # a fixed v: the backend's pass at θ comes for free
                grad = tree.scale(p.grad, w) if grad is None else tree.axpy(w, p.grad, grad)
                loss = p.loss * w if loss is None else loss + p.loss * w
        if clean is not None:
            return hv, clean
        assert grad is not None and loss is not None  # a Batches holds one batch at least
        return hv, Pass(grad, loss, ())


def from_model(model: nn.Module, data, criterion, *, mode: str = "eval") -> Problem:
    """The ``(params, batch, loss_fn)`` of the mean of ``criterion`` over ``data`` for ``model``.

    Over batches of sizes n_b, N = Σ n_b, the loss is L(θ) = Σ_b (n_b/N)·criterion(model_θ(x_b), y_b),
    the mean over all N examples (module doc), so every metric of it equals the metric on one batch
    holding all the data.

    Args:
        model: the ``nn.Module``; its mode, parameters and buffers are left as they are (its
            BatchNorm layers are made safe for forward-mode AD under autocast, in place, as
            [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize] does: what they compute does
            not change).
        data: one batch ``(inputs, targets)``, or an iterable of them (a ``DataLoader``, a list),
            read once.
        criterion: ``criterion(outputs, targets) -> scalar``, a mean over the batch's examples.
        mode: "eval" (default: running BatchNorm statistics, no dropout) or "train" (batch
            statistics).

    Returns:
        A [`Problem`][gamfunc.metrics.model.Problem] ``(params, batch, loss_fn)``: the trainable
            parameters, the batch (one batch, on the parameters' device) or a
            [`Batches`][gamfunc.metrics.model.Batches], and the loss (a
            [`DataMean`][gamfunc.metrics.model.DataMean] over several batches).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or is ``torch.compile(module)`` (give
            ``model._orig_mod``: the metrics run eagerly), ``criterion`` is not callable, or
            ``data`` is neither a batch nor an iterable of batches.
        ValueError: ``mode`` is unknown, ``data`` holds no batch, ``model`` has no trainable
            parameter, or ``criterion`` sums over examples (``reduction="sum"``) with several
            batches.

    Example:
        >>> import torch
        >>> from gamfunc import metrics
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3))
        >>> batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
        >>> params, data, loss_fn = metrics.from_model(model, batches, torch.nn.CrossEntropyLoss())
        >>> data
        Batches(3 batches, 24 examples)
        >>> metrics.top_eigenvalues(model, batches, torch.nn.CrossEntropyLoss()).shape
        torch.Size([1])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    check_uncompiled(model, "from_model(model, ...)", "from_model(model._orig_mod, ...)")
    check_unhooked(model, "from_model(model, ...)")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    if criterion is None:
        raise TypeError(
            "criterion is missing: with a model, pass the data and a criterion(outputs, targets), "
            "e.g. metric(model, loader, torch.nn.CrossEntropyLoss())"
        )
    if not callable(criterion):
        raise TypeError(f"criterion must be callable; got {type(criterion).__name__}")
    batches = _batches(data)
    reduction = getattr(criterion, "reduction", "mean")
    if len(batches) > 1 and reduction != "mean":
        raise ValueError(
            f"criterion must average over a batch's examples (reduction='mean') to be averaged over "
            f"batches by size; got reduction={reduction!r}"
        )
    buffered, every, buffers = functionalize(model, criterion, train=mode == "train")
    trainable = {k for k, v in model.named_parameters() if v.requires_grad}
    if not trainable:
        raise ValueError("model has no parameter that requires grad: there is nothing to measure")
    params = {k: v for k, v in every.items() if k in trainable}
    fixed = {**{k: v for k, v in every.items() if k not in trainable}, **buffers}
    loss = functools.partial(_criterion_loss, buffered, fixed)
    device = next(iter(params.values())).device
    if len(batches) == 1:
        return Problem(params, _to(batches[0], device), loss)
    return Problem(params, Batches(batches, device), DataMean(loss))


def takes_model(metric):
    """Let ``metric(params, batch, loss_fn, ...)`` also take ``metric(model, data, criterion, ...)``.

    With a model, ``mode=`` goes to [`from_model`][gamfunc.metrics.model.from_model] and ``buffers=``
    is refused (the model brings its own). Without one, ``params`` must be a dict of tensors and
    ``loss_fn`` given; a buffered ``loss_fn`` (three positional arguments, as
    [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize] returns) needs ``buffers=``. Each wrong
    argument is refused in one line naming it, before any work.

    Args:
        metric: a metric ``f(params, batch, loss_fn, *args, buffers=None, mode="eval", **kwargs)``.

    Returns:
        The metric taking either form, with ``metric``'s name and docstring.
    """
    name = metric.__name__

    @functools.wraps(metric)
    def either(params, batch=None, loss_fn=None, *args, **kwargs):
        if isinstance(params, nn.Module):
            # the metrics run eagerly: the module itself measures what the compiled one computes
            check_uncompiled(params, f"{name}(model, ...)", f"{name}(model._orig_mod, ...)")
            check_unhooked(params, f"{name}(model, ...)")
            if kwargs.get("buffers") is not None:
                raise ValueError(
                    f"{name}: buffers is for the functional form; a model brings its own buffers"
                )
            kwargs.pop("buffers", None)
            problem = from_model(params, batch, loss_fn, mode=kwargs.pop("mode", "eval"))
            return metric(*problem, *args, **kwargs)
        if not isinstance(params, dict):
            raise TypeError(
                f"{name}: params must be a dict[str, Tensor] or a torch.nn.Module; "
                f"got {type(params).__name__}"
            )
        check_params(params)
        if loss_fn is None:
            raise TypeError(
                f"{name}: loss_fn is missing: pass loss_fn(params, batch), "
                f"or call {name}(model, data, criterion)"
            )
        if not callable(loss_fn):
            raise TypeError(f"{name}: loss_fn must be callable; got {type(loss_fn).__name__}")
        if kwargs.get("buffers") is None and _positional(loss_fn) >= 3:
            raise TypeError(
                f"{name}: loss_fn takes buffers (the buffered form of gamfunc.nn.functionalize): "
                f"pass buffers= (and mode=), or call {name}(model, data, criterion)"
            )
        return metric(params, batch, loss_fn, *args, **kwargs)

    return either


def _criterion_loss(buffered, fixed: Tree, params: Tree, batch) -> Tensor:
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise TypeError(
            f"data must give batches (inputs, targets); got a {type(batch).__name__}"
            + (f" of {len(batch)}" if isinstance(batch, tuple | list) else "")
        )
    return buffered(params, batch, fixed)[0]


def _batches(data) -> list:
    if _is_batch(data):
        return [data]
    if isinstance(data, Tensor | dict) or data is None:
        raise TypeError(
            f"data must be a batch (inputs, targets) or an iterable of batches (a DataLoader); "
            f"got {type(data).__name__}"
        )
    try:
        batches = list(data)
    except TypeError:
        raise TypeError(
            f"data must be a batch (inputs, targets) or an iterable of batches (a DataLoader); "
            f"got {type(data).__name__}"
        ) from None
    if not batches:
        raise ValueError("data holds no batch")
    for i, b in enumerate(batches):
        if not _is_batch(b):
            raise TypeError(
                f"data must give batches (inputs, targets) of tensors; batch {i} is a "
                f"{type(b).__name__}"
            )
    return batches


def _is_batch(x) -> bool:
    return isinstance(x, tuple | list) and len(x) > 0 and isinstance(x[0], Tensor)


def _size(batch) -> int:
    for x in pytree.tree_leaves(batch):
        if isinstance(x, Tensor) and x.ndim > 0:
            return int(x.shape[0])
    return 1


def _to(batch, device: torch.device):
    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, Tensor) else x, batch)


def _positional(f) -> int:
    """How many positional arguments ``f`` requires (0 where its signature cannot be read)."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return 0
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is p.empty for p in sig.parameters.values())
