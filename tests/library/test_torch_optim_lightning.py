"""Lightning's automatic optimisation drives the facade unchanged: its closure runs training_step,
zero_grad and backward(), and the facade evaluates it at every point of SAM and of fd GAM. Three
steps on the CPU equal the manual-optimisation run and the plain step((x, y)) loop (float64)."""

import copy

import pytest
import torch
from test_torch_optim_bases import TIGHT, batches, mlp, params_of
from torch import nn

from gamfunc.torch_optim import GAM, SAM

L = pytest.importorskip("lightning")

# Lightning's own use of torch APIs that torch deprecates, and its advice on data loader workers
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
]

STEPS = 3


def make_facade(kind, model):
    if kind == "sam":
        return SAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05)
    return GAM(model, torch.optim.SGD, lr=0.1, momentum=0.9, rho=0.05, alpha=0.2, hvp="fd")


class Classifier(L.LightningModule):
    def __init__(self, kind, automatic):
        super().__init__()
        self.kind, self.automatic_optimization = kind, automatic
        self.net = mlp()

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)
        return self.optimizers().step(batch=batch)  # manual: the facade forms the gradients

    def configure_optimizers(self):
        return make_facade(self.kind, self.net)


def trainer(steps=STEPS, **kwargs):
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def fit(kind, automatic, data):
    module = Classifier(kind, automatic)
    loader = torch.utils.data.DataLoader(data, batch_size=None)  # the batches as they are
    trainer().fit(module, loader)
    return params_of(module.net)


@pytest.mark.parametrize("kind", ["sam", "fd_gam"])
def test_automatic_optimisation_equals_manual_and_the_plain_loop(kind):
    data = batches(STEPS)
    model = mlp()
    opt = make_facade(kind, model)
    for b in data:
        opt.step(b)
    want = params_of(model)
    automatic = fit(kind, True, data)
    manual = fit(kind, False, data)
    torch.testing.assert_close(manual, want, **TIGHT)
    torch.testing.assert_close(automatic, want, **TIGHT)
    assert not all(torch.equal(automatic[k], v) for k, v in params_of(mlp()).items())


def test_exact_gam_in_automatic_optimisation_is_refused_naming_fd():
    class Exact(Classifier):
        def configure_optimizers(self):
            return GAM(self.net, torch.optim.SGD, lr=0.1, rho=0.05, alpha=0.2, hvp="exact")

    loader = torch.utils.data.DataLoader(batches(1), batch_size=None)
    with pytest.raises(ValueError, match=r"hvp=gamfunc\.hvps\.fd\(\)"):
        trainer(1).fit(Exact("gam", True), loader)


class Float32(Classifier):
    def __init__(self):
        super().__init__("sam", True)
        self.net = self.net.float()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x.float()), y)


def test_bf16_mixed_autocasts_inside_the_closure_and_trains():
    module = Float32()
    start = copy.deepcopy(params_of(module.net))
    trainer(2, precision="bf16-mixed").fit(
        module, torch.utils.data.DataLoader(batches(2), batch_size=None)
    )
    assert all(not torch.equal(p, start[k]) for k, p in params_of(module.net).items())


def test_16_mixed_with_a_grad_scaler_is_refused_on_the_first_step():
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaled = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(TypeError, match=r"GradScaler.*precision='fp16'"):
        trainer(1, plugins=[scaled]).fit(
            Float32(), torch.utils.data.DataLoader(batches(1), batch_size=None)
        )


def test_accumulate_grad_batches_is_refused_saying_what_accumulate_is():
    """Lightning sums two loader batches in .grad, then steps: refused in one line that says the
    facade's accumulate= splits one batch, where davda54/sam's backward outside gets its own."""
    loader = torch.utils.data.DataLoader(batches(2), batch_size=None)
    with pytest.raises(ValueError, match=r"accumulate_grad_batches.*splits one batch") as e:
        trainer(2, accumulate_grad_batches=2).fit(Classifier("sam", True), loader)
    assert "\n" not in str(e.value) and "davda54" not in str(e.value)


def test_gradient_clip_val_makes_grad_norm_the_clipped_norm():
    """Lightning clips each point's gradient inside the closure (docs/guides/torch-optim.md)."""
    trainer_ = trainer(1, gradient_clip_val=1e-3)
    module = Classifier("sam", True)
    trainer_.fit(module, torch.utils.data.DataLoader(batches(1), batch_size=None))
    grad_norm = float(trainer_.optimizers[0].metrics["grad_norm"])
    assert grad_norm <= 1e-3 and grad_norm == pytest.approx(1e-3, rel=1e-4)  # its eps: 1e-6
