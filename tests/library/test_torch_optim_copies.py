"""The facade's copies kept from step to step (gamfunc.torch_optim.copies)."""

import pytest
import torch

from gamfunc import tree
from gamfunc.torch_optim.copies import copy_into, recopy


def test_recopy_writes_into_the_kept_copies_where_they_fit():
    """The same tensors again, or others of their layout: the copies are written into ``kept``,
    exact; another shape, stride or number of tensors: new copies, and ``kept`` is left alone."""
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    sources = [x, torch.tensor([float("nan"), -0.0]), torch.arange(3)]
    kept = tree.copies(sources)
    sources[0].mul_(2)  # a step moves them in place
    sources[2].add_(1)
    got = recopy(kept, sources, sources)
    assert got is kept
    bits = lambda v: v.contiguous().view(torch.uint8)  # noqa: E731
    assert all(torch.equal(bits(g), bits(t)) for g, t in zip(got, sources, strict=True))
    others = [torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)]
    others += [torch.tensor([1.0, 2.0]), torch.arange(3) * 5]
    assert recopy(kept, others, sources) is kept
    assert all(torch.equal(g, t) for g, t in zip(kept, others, strict=True))
    for changed in (
        [torch.randn(2, 3, 4, 4), *others[1:]],  # contiguous: other strides
        [others[0], torch.zeros(3), others[2]],
        others[:2],
    ):
        before = [k.clone() for k in kept]
        new = recopy(kept, changed, others)
        assert new is not kept and all(
            n.data_ptr() not in {k.data_ptr() for k in kept} for n in new
        )
        assert all(
            torch.equal(n, t) and n.stride() == t.stride()
            for n, t in zip(new, changed, strict=True)
        )
        assert all(torch.equal(k, b) for k, b in zip(kept, before, strict=True))


def test_copy_into_writes_each_tensor_and_refuses_lists_of_two_lengths():
    dst = [torch.zeros(2), torch.zeros(3, dtype=torch.float64), torch.zeros(1, dtype=torch.int64)]
    src = [torch.ones(2), torch.full((3,), 2.0, dtype=torch.float64), torch.tensor([7])]
    copy_into(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    with pytest.raises(ValueError, match="3 tensors to write, 2 to read"):
        copy_into(dst, src[:2])
