"""Where torch's DTensors are too old to run the estimators' tree maths on ``fully_shard``'s shards,
the facade refuses a sharded model in one line before any pass, naming the torch it needs."""

from __future__ import annotations

import pytest
from torch import nn

import gamfunc
from gamfunc.torch_optim import sharded


def test_a_fully_shard_model_on_an_older_torch_is_refused_naming_the_version(monkeypatch):
    monkeypatch.setattr(sharded, "TORCH", (2, 13))
    monkeypatch.setattr(sharded, "distributed_hooks", lambda model: "fully_shard (FSDP2)")
    model = nn.Linear(3, 2)
    args = (gamfunc.sam(0.05), None, nn.functional.mse_loss, None, False, "fp32", 1, False)
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.14.*DistributedDataParallel"):
        sharded.passes(model, *args)
    monkeypatch.setattr(sharded, "TORCH", sharded.FULLY_SHARD_TORCH)
    assert sharded.passes(model, *args) is not None  # the same model on a torch that serves
    monkeypatch.setattr(sharded, "distributed_hooks", lambda model: "DistributedDataParallel")
    monkeypatch.setattr(sharded, "TORCH", (2, 4))
    assert sharded.passes(model, *args) is not None  # DDP has no DTensors: any torch
