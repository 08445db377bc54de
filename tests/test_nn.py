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
