"""An inductor graph pass that computes once what a compiled region computes twice.

Exact GAM forms, at a point θ, the gradient g = ∇L(θ) and then H·g/‖g‖ by forward-over-reverse,
``jvp(grad L, (θ,), (g/‖g‖,))``. The jvp carries the primal computation with it: it evaluates ∇L(θ)
again, so a point costs 1 + 3 gradient passes where 1 + 2 would do (the tangent of a forward and
backward pass costs two of them: every bilinear op gets two products). In one compiled region the
second ∇L is the same computation as the first, but inductor does not find it: ``jvp`` enters θ
through an alias and a copy of each parameter (its dual tensors), and inductor runs no
common-subexpression elimination after autograd.

`share_equal_work` removes those identity copies and then merges every pair of nodes that
apply the same operation to the same inputs, so the jvp's primal reuses the gradient's forward and
backward. It merges only equal work (the merged results are bit for bit the ones they replace) of
aten and prims operations, never a random operation, a mutation, a collective or a graph output.

What is shared depends on the primal being built from the same operations in both passes.
BatchNorm, LayerNorm and softmax have fused backward ops that ``jvp`` differentiates through
decompositions of its own (BatchNorm's recomputes the batch statistics), so the networks write them
with elementary operations ([`gamfunc.nn.elementary_norms`][gamfunc.nn.elementary_norms],
[`gamfunc.nn.elementary_softmax`][gamfunc.nn.elementary_softmax]); then a point costs 3 gradient passes
(``python -m benchmarks.flops`` counts them). Channels-last activations share as well; channels-last
convolution kernels do not: ``jvp`` copies its primal θ contiguous, so its convolutions take other
weights than the gradient pass's (a point then costs 4 gradient passes).

`gamfunc.compile.compile_with` installs the pass in every inductor compile as
``post_grad_custom_pre_pass`` unless the caller sets that option, on every torch that has inductor's
``CustomGraphPass`` (with one logged line where it has not, and no pass).
"""

from __future__ import annotations

import functools
import operator
from typing import cast

import torch
from torch import fx

from gamfunc._compat import custom_graph_pass, mutates

__all__ = ["share_equal_work", "share_equal_work_pass"]

aten = torch.ops.aten

_IDENTITIES = (aten.alias.default, aten.clone.default)
_RESHAPES = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.alias.default,
}
_COMMUTATIVE = (aten.add.Tensor, aten.mul.Tensor)
_OP_OVERLOAD = type(aten.add.Tensor)  # the class of every aten and prims operation


def _val(node):
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _same_layout(a: fx.Node, b: fx.Node) -> bool:
    x, y = _val(a), _val(b)
    if x is None or y is None:
        return False
    return _layout(x, offset=False) == _layout(y, offset=False)


def _mutates(node: fx.Node) -> bool:
    return mutates(node.target)


def _random(node: fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def _mergeable(node: fx.Node) -> bool:
    """An aten or prims op (or a getitem of one) without effects: collectives, custom ops and
    higher-order ops are left alone."""
    if node.op != "call_function" or node.is_impure() or _mutates(node) or _random(node):
        return False
    if node.target is operator.getitem:
        return True
    return isinstance(node.target, _OP_OVERLOAD) and node.target.namespace in (
        "aten",
        "prims",
    )


def _feeds_output(node: fx.Node) -> bool:
    return any(u.op == "output" for u in node.users)


def _drop_identity_copies(graph: fx.Graph) -> None:
    """Replace ``alias(x)`` and ``clone(x)`` of unchanged layout by ``x`` where nothing mutates
    either and the copy is not a graph output (an output must not become an alias of an input)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _IDENTITIES:
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node) or not _same_layout(node, src) or _feeds_output(node):
            continue
        if any(_mutates(u) for u in (*node.users, *src.users)):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)


def _layout(val, offset: bool = True) -> tuple:
    """The layout of a value: what two results must share besides their work to be one tensor
    (shape, strides, storage offset unless ``offset`` is False, dtype, device)."""
    if val is None:
        return ()
    where = (_size(val.storage_offset()),) if offset else ()
    return (_sizes(val.shape), _sizes(val.stride()), *where, val.dtype, val.device)


def _size(d):
    """A size as a key: an int as it is, a symbolic size (a compile with dynamic shapes), which no
    dict can hash, as its expression (``s0``, ``2*s0``): one symbol of one graph names one size."""
    return d if isinstance(d, int) else str(d)


def _sizes(dims) -> tuple:
    return tuple(map(_size, dims))


def _key(node: fx.Node):
    """What makes two nodes the same work: the op, its (already merged) inputs and the layout of its
    result (shape, strides, storage offset, dtype). A chain of reshapes is keyed by where it starts
    and the layout it ends in; add and mul ignore order."""
    target, val = node.target, _val(node)
    layout = _layout(val)
    if target in _RESHAPES and val is not None and isinstance(node.args[0], fx.Node):
        root = node.args[0]
        while root.op == "call_function" and root.target in _RESHAPES:
            root = cast(fx.Node, root.args[0])  # a reshape's input is a node
        return ("reshape", root, layout)
    if target in _COMMUTATIVE and not node.kwargs and len(node.args) == 2:
        return (target, tuple(sorted(map(repr, node.args))), layout)
    return (target, repr(node.args), repr(node.kwargs), layout)


def share_equal_work(graph: fx.Graph) -> None:
    """Merge, in place, the nodes of a functional post-autograd graph that compute the same thing."""
    _drop_identity_copies(graph)
    seen: dict = {}
    for node in list(graph.nodes):
        if not _mergeable(node):
            continue
        key = _key(node)
        first = seen.get(key)
        if first is None:
            seen[key] = node
        elif not _feeds_output(node):
            node.replace_all_uses_with(first)
            graph.erase_node(node)
    graph.eliminate_dead_code()


@functools.cache
def share_equal_work_pass():
    """`share_equal_work` in the form inductor's ``post_grad_custom_pre_pass`` option takes; None
    where torch has no such form (`gamfunc._compat.custom_graph_pass`), and then no pass runs.

    Built on the first call, when a step is compiled: the form imports inductor, which would add
    about 1.5 s to ``import gamfunc``."""
    return custom_graph_pass(share_equal_work, __file__)
