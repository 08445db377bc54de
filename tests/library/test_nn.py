"""gamfunc.nn's names: ``functionalize``, the one name of the module-to-function conversion."""

import pytest
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


def test_functionalize_refuses_a_compiled_module_in_one_line():
    """torch.compile(model) would compile, then run eagerly under torch.func: refused, naming the
    module inside and step.compile()."""
    model = torch.nn.Linear(4, 3)
    with pytest.raises(
        TypeError, match=r"functionalize\(model._orig_mod\), then step.compile"
    ) as e:
        gamfunc.nn.functionalize(torch.compile(model))
    assert "\n" not in str(e.value)
    gamfunc.nn.functionalize(model)


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


def _bn_net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 2),
    )


def test_the_caller_computes_what_functional_call_computes_and_leaves_the_module_as_it_was():
    """Values, gradients with respect to the given tensors, the batch statistics written into the
    given buffers: each as ``torch.func.functional_call``; the module's own tensors are the same
    objects, unchanged, after the call."""
    torch.manual_seed(0)
    model = _bn_net().train()
    own = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
    saved = {k: v.detach().clone() for k, v in own.items()}
    params = {k: torch.randn_like(p, requires_grad=True) for k, p in model.named_parameters()}
    x = torch.randn(5, 3, 6, 6)
    outs, grads, stats = [], [], []
    for call in (gamfunc.nn.Caller(model), torch.func.functional_call):
        buffers = {k: b.clone() for k, b in model.named_buffers()}
        args = (params, buffers), (x,)
        out = call(*args) if isinstance(call, gamfunc.nn.Caller) else call(model, *args)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), list(params.values())))
        stats.append(buffers)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert stats[0]["1.num_batches_tracked"] == 1
    for k in stats[1]:
        torch.testing.assert_close(stats[0][k], stats[1][k], rtol=0, atol=0)
    now = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
    assert all(now[k] is own[k] for k in own)
    for k, v in saved.items():
        torch.testing.assert_close(now[k], v, rtol=0, atol=0)


def test_the_caller_puts_the_modules_tensors_back_when_the_call_raises():
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    call = gamfunc.nn.Caller(model)
    try:
        call({"weight": torch.zeros(2, 3)}, (torch.zeros(4, 5),))
    except RuntimeError:
        pass
    else:
        raise AssertionError("a wrong input shape must raise")
    assert model.weight is weight and isinstance(model.weight, torch.nn.Parameter)


def test_the_caller_of_a_partial_dict_keeps_the_other_tensors_and_falls_back_for_unknown_names():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    call = gamfunc.nn.Caller(model)
    w = torch.randn(2, 3)
    torch.testing.assert_close(call({"weight": w}, (x,)), x @ w.T + model.bias)
    # a name the caller did not find goes to functional_call, which reports it
    try:
        call({"weight": w, "nothing.here": w}, (x,))
    except AttributeError as e:
        assert "nothing" in str(e)
    else:
        raise AssertionError("an unknown name must raise")


def test_the_caller_of_tied_weights_is_functional_call():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    )
    model[1].weight = model[0].weight
    call = gamfunc.nn.Caller(model)
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    torch.testing.assert_close(call({"0.weight": w}, (x,)), x @ w.T @ w.T)


def test_the_caller_runs_under_torch_compile():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    call = gamfunc.nn.Caller(model)
    params = {k: torch.randn_like(v) for k, v in model.named_parameters()}
    x = torch.randn(4, 3)
    compiled = torch.compile(lambda p, x: call(p, (x,)), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(params, x), torch.func.functional_call(model, params, (x,)))


def test_the_caller_traced_writes_its_tensors_in_place_and_leaves_the_module_as_it_was(
    monkeypatch,
):
    # Under torch.compile too the caller writes each tensor into the dict that holds it (Dynamo
    # follows functional_call's per-name swaps in more steps), through
    # torch.func.grad, with a BatchNorm's buffers, and the module keeps its own tensors after it.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)
    )
    own = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
    call = gamfunc.nn.Caller(model)
    monkeypatch.setattr(
        gamfunc.nn.convert, "functional_call", None
    )  # the caller's own path, not this

    def loss(p, b, x):  # the buffers cloned inside, as gamfunc.nn.functionalize does
        return call((p, {k: v.clone() for k, v in b.items()}), (x,)).square().mean()

    def grad(p, b, x):
        return torch.func.grad(loss)(p, b, x)

    compiled = torch.compile(grad, backend="aot_eager", fullgraph=True)
    for seed in range(2):  # new tensors each call: nothing of the first stays in the graph
        torch.manual_seed(seed)
        p = {k: torch.randn_like(v) for k, v in model.named_parameters()}
        b = {k: v.clone() for k, v in model.named_buffers()}
        x = torch.randn(8, 3)

        def plain(p, b=b, x=x):
            fresh = {k: v.clone() for k, v in b.items()}
            return torch.func.functional_call(model, (p, fresh), (x,)).square().mean()

        want = torch.func.grad(plain)(p)
        got = compiled(p, b, x)
        for k in p:
            torch.testing.assert_close(got[k], want[k])
        now = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()]}
        assert now.keys() == own.keys() and all(now[k] is own[k] for k in own)


def test_functionalize_of_something_that_is_no_module_is_a_type_error_naming_the_model():
    """Not "AttributeError: 'str' object has no attribute 'named_parameters'"."""
    import pytest

    for model in ("m", lambda x: x, torch.nn.Linear(2, 2).state_dict()):
        with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module; got "):
            gamfunc.nn.functionalize(model)
        with pytest.raises(TypeError, match=r"^model must be a torch.nn.Module; got "):
            gamfunc.nn.module_loss(model)
