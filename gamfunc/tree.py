"""Math on flat parameter dicts, ``dict[str, Tensor]``, so that algorithms read like their formulas.

Every function is pure: it returns new tensors and never writes into its arguments. The work is done
by ``torch._foreach_*`` kernels (one launch for many tensors on CUDA) behind readable names. Every
function also runs under ``torch.func.vmap``: those kernels have no batching rule, so where a leaf is
batched the same arithmetic runs tensor by tensor (outside every torch.func transform one call to
the functorch level says so, and the fast path stays). The tensor lists under the math (grouping
by device and dtype, copies, bitwise selects, when to go tensor by tensor) are
``gamfunc.foreach``'s, re-exported here.

Example:
    >>> import torch
    >>> from gamfunc import tree
    >>> a = {"w": torch.ones(2), "b": torch.zeros(1)}
    >>> tree.norm(tree.scale(a, 2.0))
    tensor(2.8284)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gamfunc._compat import in_transform

# the tensor lists under the math, re-exported: gamfunc.tree.copies, gamfunc.tree.selects, ...
from gamfunc.foreach import (
    copies,
    grouped,
    per_tensor,
    scalar_like,
    selects,
    tensors,
    vmapped,
)

Tree = dict[str, Tensor]
Scalar = float | Tensor

__all__ = [
    "Tree",
    "add",
    "axpy",
    "check_keys",
    "clip_norm",
    "clone",
    "copies",
    "grouped",
    "lincomb",
    "map",
    "norm",
    "normalize",
    "per_tensor",
    "scalar_like",
    "scale",
    "selects",
    "sub",
    "tensors",
    "vdot",
    "where",
    "wide_dtype",
    "zeros_like",
]


def _pack(keys, values) -> Tree:
    return dict(zip(keys, values, strict=True))


def check_keys(a: Tree, b: Tree) -> None:
    """A ValueError naming the keys that are in one of ``a`` and ``b`` but not the other.

    Args:
        a: a flat dict.
        b: a flat dict.

    Raises:
        ValueError: ``a`` and ``b`` have different keys; the message names those in one only.
    """
    if a.keys() != b.keys():
        raise ValueError(
            f"parameter dicts have different keys: {sorted(a.keys() ^ b.keys())} "
            "are in one but not the other"
        )


def map(fn, *trees: Tree) -> Tree:
    """Apply ``fn`` leaf-wise: ``{k: fn(a[k], b[k], ...)}``.

    Args:
        fn: a function of as many tensors as there are trees.
        *trees: one or more flat dicts with the same keys.

    Returns:
        A flat dict with the keys of the first tree, in its order, and the values of ``fn``.

    Raises:
        ValueError: the trees have different keys.
    """
    first = trees[0]
    for other in trees[1:]:
        check_keys(first, other)
    return {k: fn(*(t[k] for t in trees)) for k in first}


def clone(a: Tree) -> Tree:
    """A copy of ``a`` that shares no storage with it, strides kept.

    Eager, the copies of `copies`: one kernel per dtype and device, where a clone per tensor costs a
    kernel launch each (a ResNet-50's 159 BatchNorm buffers are copied for every pass). Traced
    (``torch.compile`` fuses the copies), inside a ``torch.func`` transform (``vmap`` has no rule for
    foreach kernels) or where autograd records, a clone per tensor.

    Args:
        a: a flat dict of tensors.

    Returns:
        A flat dict with the keys of ``a`` and a copy of each tensor.
    """
    if per_tensor(a.values()):
        return {k: v.clone() for k, v in a.items()}
    return dict(zip(a, copies(list(a.values())), strict=True))


def zeros_like(a: Tree) -> Tree:
    """0 with the shapes, dtypes and devices of ``a``.

    Args:
        a: a flat dict of tensors.

    Returns:
        A flat dict with the keys of ``a`` and a tensor of zeros for each.
    """
    return {k: torch.zeros_like(v) for k, v in a.items()}


def add(a: Tree, b: Tree) -> Tree:
    """a + b.

    Args:
        a: a flat dict of tensors.
        b: a flat dict with the keys and shapes of ``a``.

    Returns:
        The leaf-wise sum, a flat dict with the keys of ``a``.

    Raises:
        ValueError: ``a`` and ``b`` have different keys.
    """
    check_keys(a, b)
    if _vmapped(a) or _vmapped(b):
        return {k: v + b[k] for k, v in a.items()}
    return _pack(a.keys(), torch._foreach_add(list(a.values()), [b[k] for k in a]))


def sub(a: Tree, b: Tree) -> Tree:
    """a − b.

    Args:
        a: a flat dict of tensors.
        b: a flat dict with the keys and shapes of ``a``.

    Returns:
        The leaf-wise difference, a flat dict with the keys of ``a``.

    Raises:
        ValueError: ``a`` and ``b`` have different keys.
    """
    check_keys(a, b)
    if _vmapped(a) or _vmapped(b):
        return {k: v - b[k] for k, v in a.items()}
    return _pack(a.keys(), torch._foreach_sub(list(a.values()), [b[k] for k in a]))


def scale(a: Tree, s: Scalar) -> Tree:
    """s · a, with ``s`` a Python number or a 0-d tensor.

    A half-precision leaf is multiplied by a tensor ``s`` in float32 and rounded once: on CUDA, a
    float16 product would first round ``s`` itself to float16, and 1/(‖g‖ + ξ) = 1e12 at g = 0 is
    inf there (0 · inf = nan).

    Args:
        a: a flat dict of tensors.
        s: the factor, a Python number or a 0-d tensor.

    Returns:
        s · a, a flat dict with the keys of ``a``, each tensor in its leaf's dtype.
    """
    if isinstance(s, Tensor) and _half(a):
        return {k: _times(v, s) for k, v in a.items()}
    if _vmapped(a, s):
        return {k: v * s for k, v in a.items()}
    values = list(a.values())
    return _pack(a.keys(), torch._foreach_mul(values, scalar_like(s, values)))


def axpy(s: Scalar, x: Tree, y: Tree) -> Tree:
    """s · x + y (BLAS's axpy); a tensor ``s`` meets half-precision leaves in float32 ([`scale`][gamfunc.tree.scale]).

    Args:
        s: the factor, a Python number or a 0-d tensor.
        x: a flat dict of tensors.
        y: a flat dict with the keys of ``x``.

    Returns:
        s · x + y, a flat dict with the keys of ``x``.

    Raises:
        ValueError: ``x`` and ``y`` have different keys.
    """
    check_keys(x, y)
    ys = [y[k] for k in x]
    if isinstance(s, Tensor) and _half(x):
        return {k: _times(v, s) + y[k] for k, v in x.items()}
    if _vmapped(x, s) or _vmapped(y):
        return {k: s * v + y[k] for k, v in x.items()}
    xs = list(x.values())
    if isinstance(s, Tensor) or not _fits(s, xs):
        # a number beyond the leaves' range (ρ = 1e308 in float32) becomes ±inf there, as in any
        # product, instead of failing to convert: the step's non-finite guard then skips it
        out = torch._foreach_mul(xs, scalar_like(s, xs))
        if torch.compiler.is_compiling() or in_transform() or not _alike(out, ys):
            return _pack(x.keys(), torch._foreach_add(ys, out))
        torch._foreach_add_(out, ys)  # eager: the sum into the product's new tensors, one per leaf
        return _pack(x.keys(), out)
    return _pack(x.keys(), torch._foreach_add(ys, xs, alpha=s))


def _alike(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    """Whether ``a[i]`` and ``b[i]`` have one shape and one dtype for every i (a sum in place into
    ``a`` then holds what ``a[i] + b[i]`` would, broadcasting and type promotion included)."""
    return all(u.shape == v.shape and u.dtype == v.dtype for u, v in zip(a, b, strict=True))


def _fits(s, values: list[Tensor]) -> bool:
    """Whether the number ``s`` converts to the dtype of ``values`` without overflow."""
    return not values or abs(s) <= torch.finfo(values[0].dtype).max


def lincomb(*terms: tuple[Scalar, Tree]) -> Tree:
    """Σ_i c_i · t_i for pairs ``(c_i, t_i)``.

    Args:
        *terms: one or more pairs ``(c_i, t_i)`` of a factor (a Python number or a 0-d tensor) and a
            flat dict of tensors, all with the same keys.

    Returns:
        The linear combination, a flat dict with the keys of the trees.

    Raises:
        ValueError: the trees have different keys.
    """
    (c0, t0), *rest = terms
    out = scale(t0, c0)
    for c, t in rest:
        out = axpy(c, t, out)
    return out


def vdot(a: Tree, b: Tree) -> Tensor:
    """⟨a, b⟩ = Σ_k Σ_i a[k]_i · b[k]_i, a 0-d tensor.

    Args:
        a: a non-empty flat dict of tensors.
        b: a flat dict with the keys and shapes of ``a``.

    Returns:
        ⟨a, b⟩, a 0-d tensor in float32 or wider (half-precision leaves are multiplied in float32).

    Raises:
        ValueError: ``a`` and ``b`` have different keys.
    """
    check_keys(a, b)
    parts = [torch.sum(_wide(x) * _wide(b[k])) for k, x in a.items()]
    return torch.stack(_common_dtype(parts)).sum()


def norm(a: Tree) -> Tensor:
    """‖a‖₂ over all entries of all tensors, a 0-d tensor in float32 or wider.

    Half-precision leaves (float16, bfloat16) are summed in float32, so that a norm, and the ξ added
    to it by [`normalize`][gamfunc.tree.normalize], do not round away: 1e-12 is 0 in float16.

    Args:
        a: a non-empty flat dict of tensors.

    Returns:
        ‖a‖₂, a 0-d tensor in float32 or wider.
    """
    values = list(a.values())
    norms: list[Tensor] | tuple[Tensor, ...]
    if _vmapped(a):
        norms = [torch.linalg.vector_norm(v, dtype=wide_dtype(v.dtype)) for v in values]
    elif all(v.dtype in _WIDE for v in values):
        norms = torch._foreach_norm(values)
    else:  # one foreach kernel per dtype: its dtype= argument takes one accumulation type
        groups: dict[torch.dtype, list[Tensor]] = {}
        for v in values:
            groups.setdefault(v.dtype, []).append(v)
        norms = [
            n for d, g in groups.items() for n in torch._foreach_norm(g, 2, dtype=wide_dtype(d))
        ]
    return torch.linalg.vector_norm(torch.stack(_common_dtype(norms)))


_WIDE = (torch.float32, torch.float64)


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` promoted to at least float32: where norms, inner products and ξ are computed.

    Args:
        dtype: a torch dtype.

    Returns:
        ``torch.promote_types(dtype, torch.float32)``: float32 for float16, bfloat16 and float32,
            float64 for float64.
    """
    return torch.promote_types(dtype, torch.float32)


def _wide(x: Tensor) -> Tensor:
    return x if x.dtype in _WIDE else x.to(wide_dtype(x.dtype))


def _half(a: Tree) -> bool:
    return any(v.dtype not in _WIDE for v in a.values())


def _times(v: Tensor, s: Tensor) -> Tensor:
    """v · s, computed in float32 or wider where v is half precision, in v's dtype."""
    return v * s if v.dtype in _WIDE else (_wide(v) * s).to(v.dtype)


def clip_norm(a: Tree, max_norm: Scalar, eps: float = 1e-6) -> tuple[Tree, Tensor]:
    """``a`` scaled down to a global L2 norm of at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does: a·min(1, c/(‖a‖ + ξ)).

    Args:
        a: a flat dict of tensors.
        max_norm: c > 0.
        eps: ξ >= 0, added to the norm before dividing (``clip_grad_norm_``'s 1e-6).

    Returns:
        ``(clipped, ‖a‖)``, the norm a 0-d tensor in float32 or wider.

    Example:
        >>> from gamfunc import tree
        >>> clipped, n = tree.clip_norm({"w": torch.tensor([3.0, 4.0])}, 1.0)
        >>> clipped["w"], n
        (tensor([0.6000, 0.8000]), tensor(5.))
    """
    n = norm(a)  # in float32 or wider
    coef = torch.clamp(max_norm / (n + eps), max=1.0)  # clip_grad_norm_'s expression
    return scale(a, coef), n


def normalize(a: Tree, eps: Scalar = 1e-12) -> tuple[Tree, Tensor]:
    """(a / (‖a‖ + ξ), ‖a‖), with ξ = ``eps``: the paper's safe normalisation, finite at a = 0.

    ‖a‖ + ξ and its reciprocal are formed in float32 or wider ([`norm`][gamfunc.tree.norm]); the product keeps the
    leaves' dtype.

    Args:
        a: a non-empty flat dict of tensors.
        eps: ξ, a Python number or a 0-d tensor.

    Returns:
        ``(a / (‖a‖ + ξ), ‖a‖)``: a flat dict with the keys and dtypes of ``a``, and a 0-d tensor in
            float32 or wider.
    """
    n = norm(a)
    return scale(a, (n + eps).reciprocal()), n  # what 1.0 / (n + eps) computes, less its "* 1.0"


def where(cond: Tensor, a: Tree, b: Tree) -> Tree:
    """Leaf-wise ``torch.where(cond, a, b)`` for a 0-d boolean ``cond``, without a Python branch.

    Args:
        cond: a 0-d boolean tensor.
        a: the flat dict taken where ``cond`` is True.
        b: the flat dict taken where ``cond`` is False, with the keys of ``a``.

    Returns:
        A flat dict with the keys of ``a``: ``a`` where ``cond`` is True, else ``b``.

    Raises:
        ValueError: ``a`` and ``b`` have different keys.
    """
    check_keys(a, b)
    return {k: torch.where(cond, x, b[k]) for k, x in a.items()}


def _vmapped(a: Tree, s=None) -> bool:
    """Whether any leaf (or the scalar ``s``) is batched by ``torch.func.vmap``: the foreach kernels
    have no batching rule, so the per-tensor forms are used there."""
    return vmapped([*a.values(), s] if isinstance(s, Tensor) else list(a.values()))


def _common_dtype(parts: Sequence[Tensor]) -> list[Tensor]:
    """``parts`` in the dtype they promote to (``to`` keeps a tensor already in it)."""
    if len({p.dtype for p in parts}) == 1:
        return list(parts)
    dtype = parts[0].dtype
    for p in parts[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    return [p.to(dtype) for p in parts]
