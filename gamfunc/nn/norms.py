"""Norm layers that behave under the transforms: BatchNorm that agrees in dtype with its tangent
under autocast, BatchNorm in float32, and norms and softmax in elementary operations. Each rewrites
a module's norm layers in place, names, parameters and what they compute kept.
"""

from __future__ import annotations

import torch
from torch import nn

from gamfunc._compat import in_forward_ad

__all__ = ["autocast_batchnorm", "elementary_norms", "elementary_softmax", "float32_batchnorm"]


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
