"""From an ``nn.Module`` to the functional contract: ``(loss_fn, params, buffers)``."""

from __future__ import annotations

import contextlib
import inspect

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gamfunc import tree
from gamfunc._compat import check_uncompiled, check_unhooked, in_forward_ad

__all__ = [
    "Caller",
    "autocast_batchnorm",
    "check_loss_form",
    "check_uncompiled",
    "elementary_norms",
    "elementary_softmax",
    "float32_batchnorm",
    "functionalize",
    "load",
    "mode",
    "module_loss",
    "places",
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
            ([`check_uncompiled`][gamfunc._compat.check_uncompiled]: give the module and compile the
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


class _AutocastBatchNorm:
    """Mixed into a BatchNorm module's class by [`autocast_batchnorm`][gamfunc.nn.autocast_batchnorm]."""

    def forward(self, x):
        if not _forward_mode_under_autocast(x):
            return super().forward(x)
        return super().forward(x.float()).to(x.dtype)


def _forward_mode_under_autocast(x: torch.Tensor) -> bool:
    """Whether ``x`` is a low-precision activation under autocast inside forward-mode AD (or a
    compiled region, where the casts cost nothing and the transforms are not visible)."""
    if x.dtype not in (torch.float16, torch.bfloat16) or not torch.is_autocast_enabled(
        x.device.type
    ):
        return False
    if torch.compiler.is_compiling():
        return True
    return in_forward_ad()


def autocast_batchnorm(model: nn.Module) -> nn.Module:
    """Make every BatchNorm of ``model`` agree in dtype with its forward-mode derivative under
    autocast, in place; names, parameters and what the model computes stay as they were. Returns
    ``model``.

    Under autocast a BatchNorm takes the bfloat16 (float16) output of the layer before it and
    returns bfloat16, but the forward-mode derivative of that output is float32, formed with the
    float32 weight, and the next convolution, whose own derivative autocast no longer covers, raises
    ``Input type (float) and weight type (BFloat16) should be the same``: exact (forward-over-reverse)
    Hessian-vector products fail. Inside ``torch.func.jvp`` (or a compiled region) under autocast, the
    BatchNorm made here normalises its input in float32 and rounds the result to the input's dtype:
    the value torch's module returns (it also normalises in float32), and a derivative in the same
    dtype. Anywhere else it is torch's module unchanged. [`functionalize`][gamfunc.nn.functionalize] applies it.
    ``SyncBatchNorm`` is left alone.

    Args:
        model: the module whose BatchNorm submodules are changed.

    Returns:
        ``model``, changed in place.
    """
    for m in model.modules():
        already = (_AutocastBatchNorm, _Float32BatchNorm, _ElementaryNorm)  # dtype-safe as they are
        if _plain_batchnorm(m) and not isinstance(m, already):
            m.__class__ = _mixed_class(_AutocastBatchNorm, type(m), "Autocast")
    return model


def _plain_batchnorm(m: nn.Module) -> bool:
    """A BatchNorm of one process: torch's ``_BatchNorm`` but not ``SyncBatchNorm``, whose
    cross-rank statistics a rewrite would lose."""
    return isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)


class _Float32BatchNorm:
    """Mixed into a BatchNorm module's class by [`float32_batchnorm`][gamfunc.nn.float32_batchnorm]."""

    def forward(self, x):
        return super().forward(x.float())


def float32_batchnorm(model: nn.Module) -> nn.Module:
    """Make every BatchNorm of ``model`` normalise its input in float32 and return float32, in place;
    parameter and buffer names stay as they were. Returns ``model``.

    Under ``torch.autocast`` a BatchNorm takes the bfloat16 output of the layer before it and returns
    bfloat16; made here, it returns float32, value and forward-mode tangent alike, and autocast casts
    both for the next layer. Without autocast the model computes what it computed before (BatchNorm
    already runs in the parameters' dtype). Exact H·v no longer needs it
    ([`autocast_batchnorm`][gamfunc.nn.autocast_batchnorm], which returns torch's dtype); it keeps BatchNorm's output in float32.

    Args:
        model: the module whose BatchNorm submodules are changed.

    Returns:
        ``model``, changed in place.
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, _Float32BatchNorm):
            m.__class__ = _mixed_class(_Float32BatchNorm, type(m), "Float32")
    return model


_MIXED_CLASSES: dict[tuple[type, type], type] = {}


def _mixed_class(mixin: type, cls: type, prefix: str) -> type:
    """``cls`` with ``mixin``'s forward in front, one class per pair (so modules keep one type)."""
    if (mixin, cls) not in _MIXED_CLASSES:
        _MIXED_CLASSES[mixin, cls] = type(f"{prefix}{cls.__name__}", (mixin, cls), {})
    return _MIXED_CLASSES[mixin, cls]


def elementary_norms(model: nn.Module) -> nn.Module:
    """Make every BatchNorm and LayerNorm of ``model`` compute with elementary operations, in place;
    parameter and buffer names, and what the model computes, stay as they were. Returns ``model``.

    ``torch.func.jvp`` differentiates the fused backward of a normalisation (``native_batch_norm_backward``,
    ``native_layer_norm_backward``) through a decomposition of its own that recomputes the batch mean and
    variance, so the primal inside forward-over-reverse H·v is not the gradient pass computed before it,
    and a compiled exact-GAM point computes ∇L twice. Written with ``var_mean``, ``rsqrt``, products and
    sums, a normalisation's backward is autograd's backward of those operations under ``grad`` and
    under ``jvp`` alike, and `gamfunc.graph_sharing` computes it once: a point costs 3 gradient
    passes instead of 4. Compiled, inductor lowers both forms to the same fused kernels.

    The statistics are taken in float32 and the result has the dtype torch's module returns (the
    input's; float32 for LayerNorm under CUDA autocast, which runs ``layer_norm`` in float32), so value and
    forward-mode tangent agree in dtype and ``hvp="exact"`` runs under autocast as well. Running
    statistics follow ``torch.nn.BatchNorm*d``: momentum or, with ``momentum=None``, the cumulative mean,
    and the unbiased variance; a training batch of one value per channel raises, as torch's does.
    ``SyncBatchNorm`` is left alone: its statistics are reduced across processes, which a rewrite
    would lose.

    Args:
        model: the module whose BatchNorm and LayerNorm submodules are changed.

    Returns:
        ``model``, changed in place.
    """
    for m in model.modules():
        if _plain_batchnorm(m) and not isinstance(m, _ElementaryNorm):
            m.__class__ = _mixed_class(_ElementaryBatchNorm, type(m), "Elementary")
        elif type(m) is nn.LayerNorm:
            m.__class__ = _mixed_class(_ElementaryLayerNorm, type(m), "Elementary")
    return model


def elementary_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``softmax(x, dim)`` as exp(x − max) / Σ exp(x − max), computed in float32, returned in the dtype
    ``torch.softmax`` returns (float32 under CUDA autocast).

    ``torch.softmax``'s fused backward is differentiated under ``jvp`` through a decomposition of its
    own; written out, its backward is the same operations under ``grad`` and ``jvp``, which lets a
    compiled exact-GAM point share its gradient pass (`gamfunc.graph_sharing`).

    Args:
        x: the input, a floating-point tensor of any shape.
        dim: the dimension the softmax normalises over.

    Returns:
        A tensor of ``x``'s shape whose entries along ``dim`` are positive and sum to 1.
    """
    xf = _wide(x)
    e = (xf - xf.amax(dim, keepdim=True).detach()).exp()
    return (e / e.sum(dim, keepdim=True)).to(_autocast_float32(x))


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 where it is float16 or bfloat16."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _autocast_float32(x: torch.Tensor) -> torch.dtype:
    """The dtype torch's softmax and layer_norm return: float32 under CUDA autocast (its float32 list
    holds them), else ``x``'s dtype (CPU autocast keeps the input's)."""
    cuda_autocast = x.device.type == "cuda" and torch.is_autocast_enabled("cuda")
    return torch.float32 if cuda_autocast else x.dtype


class _ElementaryNorm:
    """Marks the classes [`elementary_norms`][gamfunc.nn.elementary_norms] makes."""


class _ElementaryBatchNorm(_ElementaryNorm):
    """The forward pass of ``torch.nn.BatchNorm1d``/``2d``/``3d`` in elementary operations."""

    # attributes of the BatchNorm class this one is mixed into (elementary_norms)
    momentum: float | None
    running_mean: torch.Tensor
    running_var: torch.Tensor
    num_batches_tracked: torch.Tensor

    def forward(self, x):
        self._check_input_dim(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        xf = _wide(x)
        batch_stats = self.training or self.running_mean is None
        if self.training and xf.numel() // xf.shape[1] <= 1:  # as torch's F.batch_norm
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {x.size()}"
            )
        if batch_stats:
            var, mean = torch.var_mean(xf, dim=dims, correction=0)
        else:
            mean, var = self.running_mean.to(xf.dtype), self.running_var.to(xf.dtype)
        if self.training and self.track_running_stats:
            self._update_running_stats(mean, var, xf.numel() // xf.shape[1])
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    def _update_running_stats(self, mean, var, n: int) -> None:
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            m: torch.Tensor | float
            if self.momentum is None:  # the cumulative mean
                m = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
            else:
                m = self.momentum
            unbiased = var.detach() * (n / max(n - 1, 1))
            for run, stat in ((self.running_mean, mean.detach()), (self.running_var, unbiased)):
                run.copy_(m * stat.to(run.dtype) + (1 - m) * run)


class _ElementaryLayerNorm(_ElementaryNorm):
    """``torch.nn.LayerNorm.forward`` in elementary operations."""

    def forward(self, x):
        dims = tuple(range(-len(self.normalized_shape), 0))
        xf = _wide(x)
        var, mean = torch.var_mean(xf, dim=dims, correction=0, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(_autocast_float32(x))
