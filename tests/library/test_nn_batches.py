"""Batches of any form: ``loss(model, batch)`` in ``gamfunc.nn.functionalize`` and the torch.optim
facade, against hand-written references, the pair form, and compiled."""

import copy

import pytest
import torch
import torch.nn.functional as F
from models import tiny_bn_mlp
from torch import nn
from torch.func import functional_call

import gamfunc
from gamfunc.torch_optim import GAM, SAM

TIGHT = {"rtol": 1e-12, "atol": 1e-14}


class Tagger(nn.Module):
    """A model whose forward takes token ids and a mask, as a HuggingFace one does."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask):
        h = torch.tanh(self.emb(input_ids)) * attention_mask[..., None]
        return self.head(h.sum(1) / attention_mask.sum(1, keepdim=True))


def tagger():
    torch.manual_seed(0)
    return Tagger().double()


def dict_loss(model, batch):
    out = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(out, batch["labels"])


def dict_batches(n=2, size=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        mask = torch.ones(size, 5, dtype=torch.float64)
        mask[:, 3:] = (torch.rand(size, 2, generator=g) < 0.5).double()
        out.append(
            {
                "input_ids": torch.randint(0, 11, (size, 5), generator=g),
                "attention_mask": mask,
                "labels": torch.randint(0, 3, (size,), generator=g),
            }
        )
    return out


def named(model):
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def naive_sam(model, data, lr, momentum, rho):
    """SAM with torch.autograd and torch.optim.SGD, the loss written by hand on the dict."""
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    for b in data:
        g = torch.autograd.grad(dict_loss(model, b), params)
        norm = torch.sqrt(sum((x * x).sum() for x in g))
        e = [rho * x / (norm + 1e-12) for x in g]
        with torch.no_grad():
            for p, d in zip(params, e, strict=True):
                p.add_(d)
        g_adv = torch.autograd.grad(dict_loss(model, b), params)
        with torch.no_grad():
            for p, d in zip(params, e, strict=True):
                p.sub_(d)
        for p, d in zip(params, g_adv, strict=True):
            p.grad = d
        opt.step()
    return named(model)


def test_a_dict_batch_trains_sam_as_a_hand_written_loop():
    """The facade's step(dict) and make_step on functionalize(model, loss=...) give the parameters of
    SAM written with torch.autograd over the same loss."""
    data = dict_batches()
    want = naive_sam(tagger(), data, lr=0.1, momentum=0.9, rho=0.05)
    model = tagger()
    opt = SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, loss=dict_loss)
    for b in data:
        opt.step(b)
    torch.testing.assert_close(named(model), want, **TIGHT)
    loss_fn, params, buffers = gamfunc.nn.functionalize(tagger(), loss=dict_loss)
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
    state = step.init(params, buffers)
    for b in data:
        params, state, _ = step(params, state, b)
    torch.testing.assert_close(params, want, **TIGHT)


def hand_written(model):
    """``loss_fn(params, batch)`` through torch.func.functional_call, written by hand."""

    def loss_fn(params, batch):
        out = functional_call(model, params, (batch["input_ids"], batch["attention_mask"]))
        return F.cross_entropy(out, batch["labels"])

    return loss_fn


def gam_reference(data, hvp="exact"):
    """make_step over a hand-written functional loss of the dict."""
    model = tagger()
    params = named(model)
    step = gamfunc.make_step(
        gamfunc.gam(0.05, 0.3, hvp=hvp), gamfunc.sgd(lr=0.1, momentum=0.9), hand_written(model)
    )
    state = step.init(params)
    for b in data:
        params, state, _ = step(params, state, b)
    return params


def test_a_dict_batch_trains_exact_gam_as_a_hand_written_functional_loss():
    data = dict_batches()
    want = gam_reference(data)
    model = tagger()
    opt = GAM(model, gamfunc.sgd(lr=0.1, momentum=0.9), rho=0.05, alpha=0.3, loss=dict_loss)
    for b in data:
        opt.step(b)
    torch.testing.assert_close(named(model), want, **TIGHT)


@pytest.mark.slow
def test_a_dict_batch_trains_compiled_as_eager_and_as_the_hand_written_loop():
    """The facade's compile=True (its compiled passes; torch.compile's default backend and mode)
    and a compiled make_step on functionalize(model, loss=...) (fullgraph; aot_eager, Dynamo's and
    AOTAutograd's tracing without a second C++ build) give the parameters of the eager facade and
    of the hand-written SAM loop. The batch tensors are inputs of the graphs, not constants: the
    second batch, of other values, recompiles nothing."""
    data = dict_batches()
    eager_model, model = tagger(), tagger()
    eager = SAM(eager_model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, loss=dict_loss)
    opt = SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, loss=dict_loss, compile=True)
    loss_fn, params, buffers = gamfunc.nn.functionalize(tagger(), loss=dict_loss)
    step = gamfunc.make_step(gamfunc.sam(0.05), gamfunc.sgd(lr=0.1, momentum=0.9), loss_fn)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    state = step.init(params, buffers)
    torch._dynamo.reset()
    for i, b in enumerate(data):
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            eager.step(b)
            opt.step(b)
            params, state, _ = compiled(params, state, b)
    want = naive_sam(tagger(), data, lr=0.1, momentum=0.9, rho=0.05)
    torch.testing.assert_close(named(eager_model), want, **TIGHT)
    close = {"rtol": 1e-10, "atol": 1e-12}  # float64; inductor sums in its own order
    torch.testing.assert_close(named(model), want, **close)
    torch.testing.assert_close(params, want, **close)


def test_the_loss_form_equals_the_pair_form_with_batchnorm_and_accumulation():
    """loss(model, (x, y, w)) with a unit scale w is criterion(model(x), y): the same losses,
    parameters and running statistics, bit for bit, also with micro-batches (the batch is split as
    any pytree)."""
    data = [(x, y, torch.ones(len(y))) for x, y in [_vector_batch(s) for s in range(2)]]

    def weighted(model, batch):
        x, y, w = batch
        return F.cross_entropy(model(x), y) * w.mean()

    for accumulate in (1, 2):
        pair_model, any_model = tiny_bn_mlp(), tiny_bn_mlp()
        pair = SAM(pair_model, gamfunc.sgd(lr=0.1), rho=0.05, accumulate=accumulate)
        anyb = SAM(any_model, gamfunc.sgd(lr=0.1), rho=0.05, loss=weighted, accumulate=accumulate)
        for x, y, w in data:
            assert torch.equal(pair.step((x, y)), anyb.step((x, y, w)))
        for (k, a), b in zip(
            pair_model.state_dict().items(), any_model.state_dict().values(), strict=True
        ):
            assert torch.equal(a, b), k


def _vector_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def test_the_loss_form_sees_the_module_in_its_mode_and_eval_keeps_the_buffers():
    model = tiny_bn_mlp()
    seen = []

    def loss(m, batch):
        seen.append(m.training)
        return m(batch["x"]).pow(2).mean()

    loss_fn, params, buffers = gamfunc.nn.functionalize(model, loss=loss, train=False)
    value, new = loss_fn(params, {"x": torch.randn(8, 4)}, buffers)
    assert seen == [False] and value.ndim == 0
    assert all(torch.equal(new[k], buffers[k]) for k in buffers)
    assert model.training  # the module's own mode is back


def test_a_wrong_form_fails_in_one_line_naming_the_argument():
    model = tagger()
    batch = dict_batches(1)[0]

    def one_line(info):
        return "\n" not in str(info.value)

    with pytest.raises(TypeError, match=r"loss must take two arguments.*loss\(model, batch\)") as e:
        gamfunc.nn.functionalize(model, loss=lambda outputs: outputs.sum())
    assert one_line(e)
    with pytest.raises(TypeError, match="loss must be a function") as e:
        SAM(model, gamfunc.sgd(lr=0.1), rho=0.05, loss=3.0)
    assert one_line(e)
    with pytest.raises(TypeError, match=r"criterion= .* or loss= .*not both") as e:
        GAM(model, gamfunc.sgd(lr=0.1), rho=0.05, alpha=0.1, criterion=F.mse_loss, loss=dict_loss)
    assert one_line(e)
    with pytest.raises(ValueError, match=r"pair \(inputs, targets\).*loss=") as e:
        SAM(model, gamfunc.sgd(lr=0.1), rho=0.05).step(batch)
    assert one_line(e)
    loss_fn, params, buffers = gamfunc.nn.functionalize(model)
    with pytest.raises(ValueError, match=r"got a dict: for other batches give loss=") as e:
        loss_fn(params, batch, buffers)
    assert one_line(e)
    loss_fn, params, buffers = gamfunc.nn.functionalize(
        model, loss=lambda m, b: m(b["input_ids"], b["attention_mask"])
    )
    with pytest.raises(
        TypeError, match=r"loss\(model, batch\) must return .* 0-d tensor; got \(6, 3\)"
    ) as e:
        loss_fn(params, batch, buffers)
    assert one_line(e)
    opt = SAM(copy.deepcopy(model), gamfunc.sgd(lr=0.1), rho=0.05, loss=lambda m, b: 1.0)
    with pytest.raises(TypeError, match=r"0-d tensor; got float"):
        opt.step(batch)
