"""gamfunc.nn's names: ``functionalize``, the one name of the module-to-function conversion."""

import torch

import gamfunc


def test_functionalize_is_the_only_name():
    assert "functionalize" in gamfunc.nn.__all__
    assert not hasattr(gamfunc.nn, "functional")


def test_functionalize_runs_a_step():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    loss_fn, params, buffers = gamfunc.nn.functionalize(model, lambda out, y: out.pow(2).mean())
    batch = (torch.randn(16, 4), None)
    loss, new_buffers = loss_fn(params, batch, buffers)
    assert loss.ndim == 0 and new_buffers.keys() == buffers.keys()


def test_functionalize_moves_every_name_of_a_tied_weight():
    """A weight under two names (tied) takes the given tensor under both; an untied model has no
    ties to look for at each call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    )
    assert not gamfunc.nn.tied(model)
    model[1].weight = model[0].weight
    assert gamfunc.nn.tied(model)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model, lambda out, y: out.sum())
    assert list(params) == ["0.weight"]
    x = torch.randn(3, 4)
    w = torch.randn(4, 4)
    loss, _ = loss_fn({"0.weight": w}, (x, None), buffers)
    torch.testing.assert_close(loss, (x @ w.T @ w.T).sum())
