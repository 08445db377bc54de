"""GAM's info carries Theorem 4.3's quantities: ‖∇L_overall(θ_t)‖², the squared norm of the direction,
and ‖α·ρ_t·∇‖∇L(θ_adv)‖‖², the squared norm of the GAM term; reproduce/train.py logs both."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gamfunc
from gamfunc import tree

F64 = torch.float64


def problem():
    g = torch.Generator().manual_seed(1)
    params = {
        "w": torch.randn(4, 3, generator=g, dtype=F64),
        "b": torch.randn(4, generator=g, dtype=F64),
    }
    batch = torch.randn(16, 3, generator=g, dtype=F64), torch.randint(0, 4, (16,), generator=g)

    def loss_fn(p, b):
        return F.cross_entropy(torch.tanh(b[0] @ p["w"].T + p["b"]), b[1])

    return params, batch, loss_fn


@pytest.mark.parametrize("oracle", [None, "sam"])
def test_the_theorem_scalars_are_the_norms_of_the_direction_and_of_the_gam_term(oracle):
    params, batch, loss_fn = problem()
    sam = gamfunc.sam(0.05) if oracle else None
    make = lambda a: gamfunc.gam(0.1, a, oracle=sam, theorem_norms=True)  # noqa: E731
    direction, info = make(0.7)(params, batch, loss_fn)
    base, _ = make(0.0)(params, batch, loss_fn)  # α = 0: the oracle's direction alone
    term = tree.sub(direction, base)
    torch.testing.assert_close(
        info["overall_grad_sq"], tree.norm(direction) ** 2, rtol=1e-12, atol=0
    )
    torch.testing.assert_close(info["penalty_grad_sq"], tree.norm(term) ** 2, rtol=1e-9, atol=1e-15)
    assert info["penalty_grad_sq"] > 0
    _, info0 = make(0.0)(params, batch, loss_fn)
    assert float(info0["penalty_grad_sq"]) == 0.0
    _, plain = gamfunc.gam(0.1, 0.7, oracle=sam)(params, batch, loss_fn)  # off by default
    assert "overall_grad_sq" not in plain and "penalty_grad_sq" not in plain


def test_train_logs_them_as_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("sklearn")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from reproduce import train

    args = ["--preset=digits", "--estimator=gam", "--max-steps=4", "--log_every=2"]
    args += [
        "--eig_iters=0",
        "--trace_samples=0",
        "--r1_steps=0",
        "--progress=false",
        "--landscape=false",
    ]
    assert train.main([f"--logdir={tmp_path}", *args]) == 0
    acc = EventAccumulator(str(tmp_path / "digits" / "gam"))
    acc.Reload()
    for tag in ("theory/overall_grad_sq", "theory/penalty_grad_sq"):
        assert [e.step for e in acc.Scalars(tag)] == [2, 4]
        assert all(e.value > 0 for e in acc.Scalars(tag))
