"""``cuda_graph=True`` in the torch.optim facade: each step replayed as one CUDA graph equals the
facade's uncaptured step, whatever the base optimiser, a scheduler's change of a float lr included;
and the one-line answers where a graph cannot be made."""

import warnings

import pytest
import torch
from helpers import HostReads
from test_torch_optim_bases import TIGHT, batches, mlp, params_of

import gamfunc
from gamfunc.torch_optim import GAM, SAM

STEPS = 10  # three eager steps, a capture, then replays


def test_cuda_graph_refuses_a_base_optimiser_built_without_capturable():
    model = mlp()
    with pytest.raises(ValueError, match=r"capturable=True"):
        SAM(model, torch.optim.AdamW(model.parameters(), lr=1e-3), rho=0.05, cuda_graph=True)


@pytest.mark.parametrize("base", ["torch", "gamfunc"])
def test_cuda_graph_needs_the_model_on_a_cuda_device(base):
    model = mlp()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if base == "torch"
        else gamfunc.sgd(lr=0.1, momentum=0.9)
    )
    with pytest.raises(ValueError, match="CUDA device"):
        SAM(model, opt, rho=0.05, cuda_graph=True)


def test_cuda_graph_is_true_or_false():
    with pytest.raises(TypeError, match="cuda_graph"):
        SAM(mlp(), torch.optim.SGD, lr=0.1, rho=0.05, cuda_graph="yes")


def bases(device):
    lr = torch.tensor(1e-2, dtype=torch.float64, device=device)
    return {
        "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        "adamw-tensor-lr": lambda m: torch.optim.AdamW(
            m.parameters(), lr=lr.clone(), weight_decay=0.1, capturable=True
        ),
        "adamw-float-lr": lambda m: torch.optim.AdamW(
            m.parameters(), lr=1e-2, weight_decay=0.1, capturable=True
        ),
        "gamfunc": lambda m: gamfunc.sgd(lr=0.1, momentum=0.9),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("estimator", ["sam", "gam"])
@pytest.mark.parametrize("base", ["sgd", "adamw-tensor-lr", "adamw-float-lr", "gamfunc"])
def test_cuda_graph_equals_the_uncaptured_facade(base, estimator):
    device = torch.device("cuda")
    data = [(x.to(device), y.to(device)) for x, y in batches(STEPS)]
    results = []
    for graph in (False, True):
        model = mlp().to(device)
        opt = bases(device)[base](model)
        if estimator == "sam":
            facade = SAM(model, opt, rho=0.05, cuda_graph=graph)
        else:
            facade = GAM(model, opt, rho=0.05, alpha=0.2, cuda_graph=graph)
        scheduler = torch.optim.lr_scheduler.StepLR(facade, step_size=4, gamma=0.5)
        losses = []
        for b in data:
            losses.append(facade.step(b).clone())
            scheduler.step()
        results.append((params_of(model), torch.stack(losses), facade.state_dict()))
    (want, want_loss, want_state), (got, got_loss, got_state) = results
    torch.testing.assert_close(got, want, **TIGHT)
    torch.testing.assert_close(got_loss, want_loss, **TIGHT)
    assert int(got_state["state"]["step"]) == STEPS
    if "base" in want_state:
        torch.testing.assert_close(got_state["base"]["state"], want_state["base"]["state"], **TIGHT)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "compiled", "graph"])
@pytest.mark.parametrize("base", ["sgd", "adamw-tensor-lr"])
def test_the_facade_step_reads_one_value_per_step_eagerly_and_nothing_once_captured(base, mode):
    """Eagerly, and in the eager glue between compiled passes (``compile=True``), the guard reads
    one boolean per step on the host (cheaper than a select per tensor, both measured); the base
    optimiser's state stays on the device. Captured in a CUDA graph (``cuda_graph=True``: three
    eager steps, then the capture), a step reads nothing and does not synchronise at all."""
    device = torch.device("cuda")
    data = [(x.to(device), y.to(device)) for x, y in batches(8)]
    model = mlp().to(device)
    facade = SAM(
        model,
        bases(device)[base](model),
        rho=0.05,
        cuda_graph=mode == "graph",
        compile=mode == "compiled",
    )
    first = 4 if mode == "graph" else 1  # the first forms the base optimiser's state
    for b in data[:first]:
        facade.step(b)
    torch.cuda.synchronize()
    with HostReads() as seen:
        if mode == "graph":
            sync_debug_mode("error")
        try:
            for b in data[first:]:
                facade.step(b)
        finally:
            if mode == "graph":
                sync_debug_mode("default")
    assert seen.count == (0 if mode == "graph" else len(data) - first)
    assert int(facade.metrics["skipped"]) == 0


def sync_debug_mode(mode: str) -> None:
    """``torch.cuda.set_sync_debug_mode``, whose UserWarning (a prototype feature) is not an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode(mode)
