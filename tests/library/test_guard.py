"""The non-finite guard (gamfunc.guard): the finiteness check, and the choice between a read on
the host and a select on the device."""

import pytest
import torch
from helpers import HostReads

import gamfunc
from gamfunc.training import guard


def _recording(monkeypatch, name):
    calls = []
    real = getattr(torch, name)

    def recording(tensors, *args, **kwargs):
        calls.append({(t.device, t.dtype) for t in tensors})
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, name, recording)
    return calls


@pytest.mark.parametrize("eager_check", [True, False], ids=["amp-check", "foreach-norm"])
def test_the_finiteness_check_takes_one_kernel_per_dtype_and_device(monkeypatch, eager_check):
    # A list that mixes dtypes (float32 and float64 parameters, and the optimiser's lr, float64 with
    # them) would send every tensor down the kernels' per-tensor path on a GPU: one kernel per
    # tensor, on the host's time.
    # The step runs its check without grad: GradScaler's check then; where autograd records (or
    # traced, or under vmap) the _foreach_norm of each group.
    from gamfunc._compat import nonfinite_check_runs

    name = "_amp_foreach_non_finite_check_and_unscale_" if eager_check else "_foreach_norm"
    assert nonfinite_check_runs("cpu")  # its probe, once per device type, before recording
    calls = _recording(monkeypatch, name)
    params = {f"w{i}": torch.randn(3, dtype=torch.float32) for i in range(5)}
    params["wide"] = torch.randn(3, dtype=torch.float64)
    opt = gamfunc.sgd(lr=0.1, momentum=0.9).init(params)
    with torch.set_grad_enabled(not eager_check):
        assert bool(guard.all_finite(params, opt))
        assert len(calls) == 2 and all(len(kinds) == 1 for kinds in calls)  # float32, float64
        params["w3"] = params["w3"].clone().index_fill_(0, torch.tensor([1]), float("nan"))
        assert not bool(guard.all_finite(params, opt))
        opt_inf = opt._replace(hyperparams={"lr": torch.tensor(float("inf"), dtype=torch.float64)})
        params["w3"] = torch.zeros(3)
        assert not bool(guard.all_finite(params, opt_inf))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_eager_finiteness_check_leaves_every_bit_as_it_was(dtype, device):
    # GradScaler's check writes each element times 1 back in place: the same bits, -0, the
    # smallest subnormal and the largest value included; a nan or an inf is found and stays one.

    info = torch.finfo(dtype)
    edge = [-0.0, 0.0, info.tiny / 4, -info.max, info.max, 1.0 / 3]
    values = torch.tensor(edge, dtype=torch.float64).to(device=device, dtype=dtype)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    for bad in (None, float("nan"), float("inf"), -float("inf")):
        t = values.clone()
        if bad is not None:
            t = torch.cat([t, torch.tensor([bad], dtype=dtype, device=device)])
        before = t.clone()
        with torch.no_grad():
            finite = guard.all_finite({"w": t, "v": t[::2]})
        assert bool(finite) == (bad is None)
        same = t.view(width) == before.view(width)
        assert bool(same.all() if bad is None or bad != bad else same[:-1].all())
        assert torch.equal(t.isnan(), before.isnan()) and torch.equal(t.isinf(), before.isinf())


def test_the_finiteness_check_takes_expanded_and_inference_tensors():
    # An expanded tensor (one address for many elements) cannot be written in place: the check
    # reads it instead. An inference tensor, written outside inference mode, keeps its values.

    with torch.inference_mode():
        frozen = torch.tensor([1.0, float("inf")])
    expanded = torch.tensor([2.0, float("nan")])[:, None].expand(2, 3)
    for t in (expanded, frozen):
        with torch.no_grad():
            assert not bool(guard.all_finite({"w": torch.ones(3), "b": t}))
            assert bool(guard.all_finite({"w": torch.ones(3), "b": t[:1]}))


# ---- any transform is an optimiser ------------------------------------------------------------------


def test_the_guard_reads_on_the_host_only_where_a_step_may_wait():
    """An eager step reads its one finiteness flag on the host; a GPU step captured in a CUDA graph,
    run by one rank of several, or whose GPU is still running its passes once the host has queued
    the update selects on the device instead (reads nothing)."""
    from gamfunc.training.guard import _host_may_wait

    reads = guard.Guard().reads
    assert reads(torch.tensor(True))  # eager, on the CPU
    assert _host_may_wait(capturing=False, distributed=False)  # eager, on one GPU
    assert not _host_may_wait(capturing=True, distributed=False)
    assert not _host_may_wait(capturing=False, distributed=True)
    assert not _host_may_wait(capturing=False, distributed=False, gpu_behind=True)
    assert not torch.compile(lambda f: reads(f) * f, fullgraph=True)(torch.tensor(True))


def test_the_guard_selecting_on_the_device_keeps_what_the_host_branch_keeps(monkeypatch):
    """Taken and skipped steps of a model with BatchNorm buffers and AdamW's state: the device
    select (foreach, eager) leaves the same parameters, state and buffers as the host's branch,
    bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    loss_fn, params0, buffers0 = gamfunc.nn.functionalize(model)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    batches = [(x, y), (x * float("nan"), y), (x + 1, y), (x, y)]
    results = []
    for on_host in (True, False):
        monkeypatch.setattr(guard.Guard, "reads", lambda self, finite, passes=None, h=on_host: h)
        step = gamfunc.make_step(gamfunc.gam(0.05, 0.1), gamfunc.adamw(lr=0.01), loss_fn)
        params, state = params0, step.init(params0, buffers0)
        skipped = []
        for batch in batches:
            params, state, metrics = step(params, state, batch)
            skipped.append(int(metrics["skipped"]))
        assert skipped == [0, 1, 0, 0]
        results.append(torch.utils._pytree.tree_leaves((params, state)))
    for a, b in zip(*results, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_guard_selects_by_name_when_a_tree_holds_its_keys_in_another_order():
    new = {"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor(2.0)}
    old = {"b": torch.tensor(3.0), "a": torch.tensor([0.0, 0.0])}
    kept = guard.select(torch.tensor(False), new, old)
    assert torch.equal(kept["a"], old["a"]) and torch.equal(kept["b"], old["b"])
    taken = guard.select(torch.tensor(True), new, old)
    assert torch.equal(taken["b"], new["b"]) and taken["a"][0] == 1 and taken["a"][1].isnan()


@pytest.mark.gpu
def test_the_guard_selects_on_the_device_while_the_gpu_is_behind_the_host():
    """Steps queued behind a long kernel (the GPU bounds them) read their flag until the third in a
    row, which selects and reads nothing; a step once the GPU has caught up reads again. Each takes
    the step; non-finite batches are skipped by the reads and by the select alike."""
    device = torch.device("cuda")
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    loss_fn, params, buffers = gamfunc.nn.functionalize(net.to(device))
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(0.1, momentum=0.9), loss_fn)
    state = step.init(params, buffers)
    batch = (torch.randn(16, 4, device=device), torch.randint(0, 3, (16,), device=device))
    # warm: the sleep kernel's first launch and the dispatch mode's first use each take longer
    # than the GPU's lead; the first step forms the momentum, both fill the allocator's cache
    torch.cuda._sleep(1000)
    with HostReads():
        for _ in range(2):
            params, state, _ = step(params, state, batch)
    torch.cuda.synchronize()
    assert guard.SELECT_AFTER == 3
    for behind, reads in ((True, 1), (True, 1), (True, 0), (False, 1)):
        if behind:
            torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time ahead of the step
        with HostReads() as seen:
            new, _, m = step(params, state, batch)
        torch.cuda.synchronize()
        assert seen.count == reads, behind
        assert int(m["skipped"]) == 0 and not torch.equal(new["0.weight"], params["0.weight"])
    bad = (torch.full_like(batch[0], float("nan")), batch[1])
    for reads in (1, 1, 0):
        torch.cuda._sleep(1_000_000_000)
        with HostReads() as seen:
            kept, kept_state, m = step(params, state, bad)
        torch.cuda.synchronize()
        assert seen.count == reads and int(m["skipped"]) == 1
        assert int(kept_state.step) == int(state.step)
        assert all(torch.equal(kept[k], params[k]) for k in params)


def test_the_guard_selects_once_the_gpu_was_behind_at_three_steps_in_a_row(monkeypatch):
    # A select where the host bounds the step costs more than a read where the GPU does, so one
    # step that finds the GPU behind (a burst of large kernels) does not switch the guard.

    class Event:
        def __init__(self, done):
            self.done = done

        def query(self):
            return self.done

    policy = guard.Guard()
    seen = [policy.gpu_bounds(Event(done)) for done in (0, 0, 1, 0, 0, 0, 0, 1, 0)]
    assert seen == [False, False, False, False, False, True, True, False, False]
    assert not policy.gpu_bounds(None)
    # each step function's guard counts for itself: no count is shared between steps
    policy = guard.Guard()
    other = guard.Guard()
    assert [policy.gpu_bounds(Event(0)) for _ in range(3)] == [False, False, True]
    assert not other.gpu_bounds(Event(0)) and other.behind == 1 and policy.behind == 3
