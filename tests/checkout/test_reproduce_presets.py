"""Every network of the paper's presets is built by its preset and takes a training step (CPU, tiny
synthetic input: 32×32 images, batch 2). Heavy networks take a plain-gradient step of the preset's base
optimiser; exact GAM itself runs here on the ViT (attention under jvp) and, in test_reproduce_train.py,
on a BatchNorm network."""

import pytest
import torch

import gamfunc
from reproduce import train
from reproduce.config import PRESETS, resolve
from reproduce.data import sets as D
from reproduce.models import count_parameters

FIRST_PRESET_OF_MODEL = {}
for _name in PRESETS:
    FIRST_PRESET_OF_MODEL.setdefault(resolve([f"--preset={_name}"]).model, _name)
WITH_PRESET_ESTIMATOR = {"vit_s32", "mlp"}  # exact GAM (or the default comparison) on these


@pytest.mark.parametrize(("model", "preset"), sorted(FIRST_PRESET_OF_MODEL.items()))
def test_preset_model_takes_a_step(model, preset):
    args = [f"--preset={preset}", "--synthetic", "--synthetic_size=4", "--batch_size=2"]
    if model not in ("mlp", "cnn1d"):
        args.append("--image_size=32")
    if model not in WITH_PRESET_ESTIMATOR:
        args.append("--estimator=sgd")
    if resolve(
        args
    ).pretrained:  # the fine-tuning presets: from scratch here (weights: test_reproduce_transfer)
        args.append("--pretrained=false")
    cfg = resolve(args)
    data = D.load(cfg)
    for name in cfg.estimator.split(","):
        t = train.setup(cfg, name, data, torch.device("cpu"))
        assert cfg.model == model and count_parameters(t.model) > 0
        batch = next(D.train_batches(data.train, torch.arange(4), 0, 2, seed=0, epoch=0))
        params, state, metrics = t.step(t.params, t.state, batch)
        assert torch.isfinite(metrics["loss"]) and int(metrics["skipped"]) == 0
        assert int(state.step) == 1
        assert any(not torch.equal(params[k], t.params[k]) for k in params)
        moved = {"adamw": "exp_avg", "sgd": "momentum_buffer"}[cfg.base]
        inner = [s.inner.states for s in gamfunc.optim.injected(state.opt)]
        assert moved in {f for states in inner for s in states for f in getattr(s, "_fields", ())}
        if "gam" in name:
            assert "f_norm" in metrics and torch.isfinite(metrics["adv_grad_norm"])
