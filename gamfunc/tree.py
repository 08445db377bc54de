"""Math on flat parameter dicts, ``dict[str, Tensor]``, so that algorithms read like their formulas.

Every function is pure: it returns new tensors and never writes into its arguments. The work is done
by ``torch._foreach_*`` kernels (one launch for many tensors on CUDA) behind readable names. Every
function also runs under ``torch.func.vmap``: those kernels have no batching rule, so where a leaf is
batched the same arithmetic runs tensor by tensor (outside every torch.func transform one call to
the functorch level says so, and the fast path stays).

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
from torch.utils import _pytree as pytree

from gamfunc._compat import (
    batched,
    batched_at_any_level,
    group_by_device_and_dtype,
    in_transform,
    traced_outside_transforms,
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
    "lincomb",
    "map",
    "norm",
    "normalize",
    "per_tensor",
    "scalar_like",
    "scale",
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


def per_tensor(tensors) -> bool:
    """Whether `clone` and `selects` take their per-tensor form: traced (``torch.compile`` fuses
    it), inside a ``torch.func`` transform (foreach kernels have no batching rule), or where
    autograd records (the bit views of `selects` are not differentiable).

    Args:
        tensors: the tensors about to be copied or selected.

    Returns:
        True for a tensor at a time, False for the foreach kernels.
    """
    return (
        torch.compiler.is_compiling()
        or in_transform()
        or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def copies(tensors: list[Tensor]) -> list[Tensor]:
    """New tensors equal to ``tensors``, strides kept: ``torch._foreach_mul(group, 1)`` per dtype
    and device (exact; a list that mixes them would take ``_foreach``'s slow path, a kernel per
    tensor), a clone for a boolean tensor (no foreach kernel takes it).

    Args:
        tensors: the tensors to copy.

    Returns:
        Their copies, in order.
    """
    out = list(tensors)
    for (_, dtype), ((group,), at) in grouped(out).items():
        new = [t.clone() for t in group] if dtype == torch.bool else torch._foreach_mul(group, 1)
        for i, t in zip(at, new, strict=True):
            out[i] = t
    return out


def grouped(first: list[Tensor], *others: list[Tensor]) -> dict[tuple, tuple[list, list[int]]]:
    """The tensors of ``first`` and ``others`` (lists of one length) grouped by the device and
    dtype of ``first``'s, as foreach kernels take them: ``(device, dtype) -> (lists, indices)``,
    ``lists`` holding each list's tensors of the group, ``indices`` their places.

    Eager, ``torch.optim``'s own grouping in C++ (`gamfunc._compat.group_by_device_and_dtype`), a
    fraction of a Python loop's cost per tensor; traced, that loop.

    Args:
        first: the tensors whose device and dtype group them.
        *others: tensors at the same places, which go with them.

    Returns:
        The groups.
    """
    lists = [list(first), *(list(o) for o in others)]
    if not lists[0]:
        return {}
    if not torch.compiler.is_compiling() and (found := group_by_device_and_dtype(lists)):
        return found
    groups: dict[tuple, tuple[list, list[int]]] = {}
    for i, t in enumerate(lists[0]):
        members, at = groups.setdefault((t.device, t.dtype), ([[] for _ in lists], []))
        for m, ts in zip(members, lists, strict=True):
            m.append(ts[i])
        at.append(i)
    return groups


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


# The integer dtype of each element width: a tensor seen as integers of its width (``view``).
_WIDTHS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def selects(cond: Tensor, new: list[Tensor], old: list[Tensor]) -> list[Tensor]:
    """``[torch.where(cond, n, o) for n, o in zip(new, old)]``, bit for bit, for a 0-d boolean
    ``cond``.

    Eager, with three foreach kernels per element width and device where ``torch.where`` takes a
    kernel per tensor (a ResNet-50 step selects 480 parameter, state and buffer tensors): each
    tensor is seen as integers of its width (``Tensor.view(dtype)``, no copy) and the result is
    ``n·c + o·(1 − c)`` with c = 1 where ``cond`` holds, else 0. A product of integers by 0 is 0
    whatever the bits, a NaN's too, which a float product would keep; the other term is the chosen
    tensor's bits. Traced, inside a ``torch.func`` transform, or where autograd records, a
    ``torch.where`` per tensor (a pair of other dtypes or shapes, too).

    Args:
        cond: a 0-d boolean tensor.
        new: the tensors taken where ``cond`` is True.
        old: the tensors taken where it is False, one per ``new``.

    Returns:
        New tensors, one per pair.
    """
    if len(new) != len(old):
        raise ValueError(f"selects needs one old tensor per new one; got {len(new)} and {len(old)}")
    if per_tensor((*new, *old)):
        return [torch.where(cond.to(n.device), n, o) for n, o in zip(new, old, strict=True)]
    out: list = [None] * len(new)
    groups: dict[tuple, list[int]] = {}
    for i, (n, o) in enumerate(zip(new, old, strict=True)):
        width = _WIDTHS.get(n.element_size())
        if width is None or n.dtype != o.dtype or n.shape != o.shape or n.device != o.device:
            out[i] = torch.where(cond.to(n.device), n, o)
        else:
            groups.setdefault((n.device, width), []).append(i)
    for (device, width), group in groups.items():
        take = cond.to(device=device, dtype=width)
        chosen = torch._foreach_mul([new[i].view(width) for i in group], take)
        torch._foreach_add_(
            chosen, torch._foreach_mul([old[i].view(width) for i in group], 1 - take)
        )
        for i, bits in zip(group, chosen, strict=True):
            out[i] = bits.view(new[i].dtype)
    return out


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


def tensors(nest) -> list[Tensor]:
    """Every tensor in ``nest``: its dicts, lists and tuples (NamedTuple states included) walked
    here, any other node registered with ``torch.utils._pytree`` through it; values that are not
    tensors are left out. The order is not pytree's.

    A step's guard looks at every tensor of the new parameters and optimiser state. The pytree walk
    costs a few microseconds of Python per tensor; this one a fraction of it.

    Args:
        nest: a tensor, or a nest of containers holding tensors.

    Returns:
        The tensors, each once per place it holds.
    """
    out, todo = [], [nest]
    eager = not torch.compiler.is_compiling()
    while todo:
        x = todo.pop()
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (dict, list, tuple)):
            items = x.values() if isinstance(x, dict) else x
            # eager, a container of plain tensors (a step's parameters, a state's list) at once
            plain = eager and {type(v) for v in items} <= _PLAIN
            (out if plain else todo).extend(items)
        elif type(x) in pytree.SUPPORTED_NODES:
            out.extend(t for t in pytree.tree_leaves(x) if isinstance(t, Tensor))
    return out


_PLAIN = {Tensor}


def vmapped(tensors: list) -> bool:
    """Whether any of ``tensors`` is batched by ``torch.func.vmap`` (at any level of the transforms
    around it). Eager and outside every torch.func transform nothing is, and one call says so
    without a look at each tensor."""
    if torch.compiler.is_compiling():  # traced: wrappers are not unwrapped, the outer one says
        if traced_outside_transforms():  # the tree math between a step's passes
            return False
        return batched(tensors)
    if not in_transform():
        return False
    return any(isinstance(t, Tensor) and batched_at_any_level(t) for t in tensors)


def scalar_like(s: Scalar, leaves: list[Tensor]) -> Scalar:
    """The factor ``s`` for a ``torch._foreach_*`` product with ``leaves``, cast once to their dtype
    where they all share float32 or float64.

    The product is the same: those kernels compute in the leaves' dtype, so type promotion casts a 0-d
    factor to it anyway, once per leaf. A Python number becomes such a 0-d tensor only on the CPU when
    eager, where the foreach kernels run leaf by leaf and would wrap the number once per leaf.
    Half-precision kernels compute in float32 with the factor unrounded, so there ``s`` is left as it is.

    Args:
        s: the factor, a Python number or a 0-d tensor.
        leaves: the tensors that ``s`` multiplies.

    Returns:
        Where the leaves all share float32 or float64, a floating-point tensor ``s`` (or a Python
            number, on the CPU when eager) as a 0-d tensor of their dtype; else ``s`` itself.
    """
    if not leaves:
        return s
    dtype = leaves[0].dtype
    if isinstance(s, Tensor) and (s.dtype == dtype or not s.is_floating_point()):
        return s
    if dtype not in (torch.float32, torch.float64) or any(v.dtype != dtype for v in leaves):
        return s
    if isinstance(s, Tensor):
        return s.to(dtype)
    if isinstance(s, int | float) and leaves[0].is_cpu and not torch.compiler.is_compiling():
        return torch.tensor(s, dtype=dtype)
    return s


def _common_dtype(parts: Sequence[Tensor]) -> list[Tensor]:
    """``parts`` in the dtype they promote to (``to`` keeps a tensor already in it)."""
    if len({p.dtype for p in parts}) == 1:
        return list(parts)
    dtype = parts[0].dtype
    for p in parts[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    return [p.to(dtype) for p in parts]
