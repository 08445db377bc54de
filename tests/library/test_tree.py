"""gamfunc.tree against per-tensor torch arithmetic: the foreach forms give the same numbers."""

from __future__ import annotations

import pytest
import torch

from gamfunc import tree


def leaves(dtype=torch.float32, mixed=False):
    gen = torch.Generator().manual_seed(0)
    out = {
        "w": torch.randn(3, 4, generator=gen, dtype=dtype),
        "b": torch.randn(4, generator=gen, dtype=dtype),
    }
    if mixed:
        out["h"] = torch.randn(5, generator=gen, dtype=torch.float64)
    return out


SCALARS = [
    0.3,
    torch.tensor(0.3, dtype=torch.float64),
    torch.tensor(0.3, dtype=torch.float32),
    torch.tensor(1 / 3, dtype=torch.float64),
]


@pytest.mark.parametrize("s", SCALARS)
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scale_and_axpy_equal_per_tensor_arithmetic_bit_for_bit(s, mixed, dtype):
    # Half-precision kernels compute in float32 with an unrounded factor: casting the factor to
    # bfloat16 first would round it (0.3 → 0.30078125) and change the products.
    x = leaves(dtype, mixed=mixed)
    y = {k: v.flip(0) for k, v in leaves(dtype, mixed=mixed).items()}
    scaled, axpy = tree.scale(x, s), tree.axpy(s, x, y)
    for k in x:
        expect = x[k] * s
        assert scaled[k].dtype == expect.dtype and torch.equal(scaled[k], expect)
        expect = y[k] + x[k] * s if isinstance(s, torch.Tensor) else torch.add(y[k], x[k], alpha=s)
        assert axpy[k].dtype == expect.dtype and torch.equal(axpy[k], expect)


def test_scale_by_a_float64_factor_keeps_float64_leaves_exact():
    x = leaves(torch.float64)
    s = torch.tensor(1 / 3, dtype=torch.float64)
    for k, v in tree.scale(x, s).items():
        assert v.dtype == torch.float64 and torch.equal(v, x[k] * s)


def test_every_tree_op_runs_under_vmap_and_equals_the_loop():
    """Under torch.func.vmap the per-tensor forms run (the _foreach kernels have no batching rule)."""
    x = {k: torch.stack([v, 2 * v]) for k, v in leaves(torch.float64).items()}
    y = {k: v.flip(-1) for k, v in x.items()}
    s = torch.tensor([0.5, -1.5], dtype=torch.float64)
    cond = torch.tensor([True, False])

    def ops(x, y, s, cond):
        return (
            tree.add(x, y),
            tree.sub(x, y),
            tree.scale(x, s),
            tree.axpy(s, x, y),
            tree.lincomb((s, x), (0.25, y)),
            tree.where(cond, x, y),
            tree.map(torch.mul, x, y),
            tree.normalize(x)[0],
            tree.norm(x),
            tree.vdot(x, y),
        )

    batched = torch.func.vmap(ops)(x, y, s, cond)
    for i in range(2):
        one = ops(*({k: v[i] for k, v in t.items()} for t in (x, y)), s[i], cond[i])
        for got, want in zip(batched, one, strict=True):
            if isinstance(want, dict):
                assert all(torch.allclose(got[k][i], want[k], rtol=1e-15) for k in want)
            else:
                assert torch.allclose(got[i], want, rtol=1e-15)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_leaves_times_a_factor_beyond_their_range_on_cuda(dtype):
    """1/(‖g‖ + ξ) = 1e12 at g = 0 is inf in float16: the product is formed in float32 (on CUDA a
    float16 kernel rounds a 0-d factor to float16 first, and 0 · inf = nan)."""
    a = {"w": torch.tensor([0.0, 1e-4, -2e-4], dtype=dtype, device="cuda")}
    for s in (torch.tensor(1e12, device="cuda"), torch.tensor(1e6, device="cuda")):
        want = (a["w"].float() * s).to(dtype)
        assert torch.equal(tree.scale(a, s)["w"], want)
        assert torch.equal(tree.axpy(s, a, a)["w"], want + a["w"])
    assert torch.isfinite(
        tree.normalize({"w": torch.zeros(3, dtype=dtype, device="cuda")})[0]["w"]
    ).all()


def test_copies_are_exact_new_tensors_of_every_dtype_with_their_strides():
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    nan_zero_inf = torch.tensor([float("nan"), -0.0, float("inf")])
    given = [x, nan_zero_inf, torch.arange(3), torch.tensor([True])]
    got = tree.copies(given)
    for g, t in zip(got, given, strict=True):
        assert g.dtype == t.dtype and g.stride() == t.stride()
        assert g.data_ptr() != t.data_ptr()
        bits = lambda v: v.contiguous().view(torch.uint8)  # noqa: E731  (nan, -0.0 bit for bit)
        assert torch.equal(bits(g), bits(t))


def _selects_cases(device):
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1.5])
    pairs = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        a = torch.randn(7, generator=g).to(dtype)
        pairs.append((special.to(dtype), a[:5]))
        pairs.append((a, special.repeat(2)[:7].to(dtype)))
    cl = lambda: torch.randn(2, 3, 4, 4, generator=g).contiguous(memory_format=torch.channels_last)  # noqa: E731
    pairs += [
        (cl(), cl()),
        (torch.tensor(3.0), torch.tensor(float("nan"))),  # 0-d, as the optimiser's step counts
        (torch.arange(5), -torch.arange(5)),
        (torch.tensor([True, False]), torch.tensor([False, True])),
        (
            torch.randint(-128, 127, (4,), dtype=torch.int8, generator=g),
            torch.zeros(4, dtype=torch.int8),
        ),
        (
            torch.randn(3, dtype=torch.complex64, generator=g),
            torch.randn(3, dtype=torch.complex64, generator=g),
        ),
        (
            torch.randn(2, dtype=torch.complex128, generator=g),
            torch.randn(2, dtype=torch.complex128, generator=g),
        ),
        (torch.randn(3, 3, generator=g).t(), torch.randn(3, 3, generator=g)),  # unlike strides
    ]
    return [(n.to(device), o.to(device)) for n, o in pairs]


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"]
)
@pytest.mark.parametrize("take", [True, False])
def test_selects_is_torch_where_bit_for_bit_for_every_dtype(device, take):
    """NaN, -0.0 and inf on either side, every float width, integers, booleans, complex, 0-d,
    channels-last and transposed tensors: the selected bits are torch.where's, in new tensors."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pairs = _selects_cases(device)
    new, old = [n for n, _ in pairs], [o for _, o in pairs]
    cond = torch.tensor(take)  # on the CPU, as a step's flag may be
    got = tree.selects(cond, new, old)
    for g, n, o in zip(got, new, old, strict=True):
        want = torch.where(cond.to(device), n, o)
        assert g.dtype == want.dtype and g.shape == want.shape and g.device == want.device
        bits = lambda v: v.reshape(-1).contiguous().view(torch.uint8)  # noqa: E731
        assert torch.equal(bits(g), bits(want))
        assert g.data_ptr() not in (n.data_ptr(), o.data_ptr())


def test_selects_keeps_a_differentiable_where_and_checks_its_lists():
    a = torch.randn(3, requires_grad=True)
    (out,) = tree.selects(torch.tensor(True), [a * 2], [torch.zeros(3)])
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0))
    with pytest.raises(ValueError, match="one old tensor per new one"):
        tree.selects(torch.tensor(True), [a], [])


class _Point:
    """A node of torch's pytree registry, as a user's own optimiser state may be."""

    def __init__(self, x, y):
        self.x, self.y = x, y


torch.utils._pytree.register_pytree_node(
    _Point, lambda p: ([p.x, p.y], None), lambda xs, _: _Point(*xs)
)


def test_tensors_finds_every_tensor_pytree_finds():
    from typing import NamedTuple

    class State(NamedTuple):
        count: torch.Tensor
        inner: tuple

    t = [torch.full((2,), float(i)) for i in range(8)]
    nest = (
        {"a": t[0], "b": [t[1], {"c": t[2]}], "n": None, "s": "text", "i": 3},
        State(t[3], (t[4], ())),
        _Point(t[5], {"d": t[6]}),
        t[7],
        t[0],  # a tensor in two places counts twice, as in pytree
    )
    want = [x for x in torch.utils._pytree.tree_leaves(nest) if isinstance(x, torch.Tensor)]
    got = tree.tensors(nest)
    assert sorted(map(id, got)) == sorted(map(id, want)) and len(got) == 9
    assert tree.tensors(t[0]) == [t[0]] and tree.tensors(()) == []


def test_axpy_with_a_tensor_factor_leaves_its_inputs_and_broadcasts_as_the_sum_does():
    """Eager, s·x + y with a tensor s is summed into the product's own tensors where the leaves
    match in shape and dtype; where they do not, it broadcasts and promotes as ``s * x + y`` does."""
    s = torch.tensor(2.0)
    x, y = (
        {"a": torch.ones(2, 3), "b": torch.ones(3)},
        {"a": torch.full((2, 3), 0.5), "b": torch.zeros(3)},
    )
    before = {k: (v.clone(), y[k].clone()) for k, v in x.items()}
    out = tree.axpy(s, x, y)
    assert all(torch.equal(out[k], s * x[k] + y[k]) for k in x)
    assert all(torch.equal(x[k], a) and torch.equal(y[k], b) for k, (a, b) in before.items())
    assert all(out[k] is not x[k] and out[k] is not y[k] for k in x)
    wide = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(2, 3)}  # y wider than x
    out = tree.axpy(s, {"a": torch.ones(3), "b": torch.ones(3)}, wide)
    assert out["b"].shape == (2, 3) and torch.equal(out["a"], 2 * torch.ones(3) + wide["a"])
    double = {"a": torch.ones(3, dtype=torch.float64), "b": torch.ones(3, dtype=torch.float64)}
    out = tree.axpy(s, {"a": torch.ones(3), "b": torch.ones(3)}, double)  # y wider in dtype
    assert all(out[k].dtype == (s * torch.ones(3) + double[k]).dtype for k in out)
