"""The transfer presets (the paper's transfer table) and the presets of its other tables that had none:
ViT-S/16 on CIFAR, the authors' accelerated GAM, GNP with Zhao et al.'s values, GAM on few steps."""

from __future__ import annotations

import pytest
import torch

from reproduce import train
from reproduce.config import PRESETS, resolve
from reproduce.run import checkpoint as ckpt

pytest.importorskip("torchvision")

TRANSFER = [k for k in PRESETS if k.startswith("transfer.")]
QUIET = ["--progress=false", "--landscape=false", "--eig_iters=0", "--trace_samples=0"]
QUIET += ["--r1_steps=0", "--eval_batch_size=4"]


def test_transfer_presets_carry_the_papers_values():
    assert len(TRANSFER) == 10  # 5 data sets × 2 models
    for name in TRANSFER:
        cfg = resolve([f"--preset={name}"])
        assert (cfg.total_steps, cfg.batch_size, cfg.lr, cfg.weight_decay) == (
            40000,
            128,
            2e-3,
            1e-5,
        )
        assert cfg.schedule == "cosine" and cfg.pretrained and cfg.image_size == 224
        assert cfg.base == ("sgd" if cfg.model == "efficientnet_b0" else "adamw")
        assert cfg.momentum == 0.9 and (cfg.beta1, cfg.beta2) == (0.9, 0.999)
        assert cfg.augment == ("basic" if cfg.dataset.startswith("cifar") else "none")


def test_the_other_missing_presets():
    # The authors' main_cifar.py (xxgege/GAM @ 694133d), lines 126-133: (ρ, ρ', β, α, γ) per data
    # set and network family; lr 0.1 (line 46) and label smoothing 0.1 of theirs (line 108).
    theirs = {
        ("cifar100", "resnet18"): (0.2, 0.02, 0.5, 0.6, 0.03),
        ("cifar100", "pyramidnet110"): (0.2, 0.04, 0.3, 0.5, 0.05),
        ("cifar10", "resnet18"): (0.2, 0.03, 0.1, 0.1, 0.05),
        ("cifar10", "pyramidnet110"): (0.2, 0.03, 0.1, 0.1, 0.03),
    }
    for (dataset, model), values in theirs.items():
        acc = resolve([f"--preset=accelerated.{dataset}.{model}.authors"])
        assert acc.estimator == "gam_accelerated_official" and acc.model == model
        assert (acc.rho, acc.rho_prime, acc.beta, acc.alpha, acc.gamma) == values
        assert (acc.lr, acc.weight_decay, acc.batch_size, acc.epochs) == (0.1, 5e-4, 128, 200)
        classes = 10 if dataset == "cifar10" else 100
        assert acc.label_smoothing == pytest.approx(0.1 * classes / (classes - 1))
    gnp = resolve(["--preset=gnp.cifar100.resnet18"])
    # Zhao et al.'s α_Z = 0.8 at r = 0.1 is gamfunc.gnp's α = α_Z·r
    assert (gnp.estimator, gnp.gnp_hvp, gnp.gnp_radius) == ("gnp", "fd", 0.1)
    assert gnp.alpha == pytest.approx(0.8 * 0.1)
    alphas = {
        p: resolve([f"--preset=time.cifar10.resnet18.gam{p}pct"]).alpha for p in (5, 10, 50, 100)
    }
    assert alphas == {5: 1.0, 10: 1.0, 50: 0.6, 100: 0.3}
    vit = resolve(["--preset=hp1.cifar100.vit_s16"])
    assert (vit.model, vit.image_size, vit.base, vit.clip_norm, vit.no_decay_1d) == (
        "vit_s16",
        224,
        "adamw",
        1.0,
        True,
    )


def test_a_transfer_preset_without_weights_stops_and_says_why(tmp_path, capsys):
    args = ["--preset=transfer.pets.efficientnet_b0", "--synthetic", "--synthetic_size=8"]
    assert train.main([f"--logdir={tmp_path}", *QUIET, *args, "--batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "--weights" in err and "never" in err and "Traceback" not in err
    assert not any(tmp_path.rglob("checkpoint.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["efficientnet_b0", "swin_t"])
def test_a_transfer_preset_fine_tunes_local_weights_with_a_new_classifier(tmp_path, model):
    """2 steps at lr 0 on synthetic 32-pixel images: every pretrained tensor but the classifier is
    kept bit for bit, and the classifier has the data set's 37 classes."""
    import torchvision

    net = getattr(torchvision.models, model)(weights=None)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    args = [f"--preset=transfer.pets.{model}", "--synthetic", "--synthetic_size=8", "--lr=0"]
    args += ["--batch_size=2", "--max_steps=2", "--image_size=32", f"--weights={tmp_path / 'w.pt'}"]
    args += ["--estimator=sam"]  # the loading is under test, not the estimator
    assert train.main([f"--logdir={tmp_path / 'runs'}", *QUIET, *args]) == 0
    (path,) = (tmp_path / "runs").rglob("checkpoint.pt")
    body = ckpt.load(path)
    params, pretrained = body["params"], net.state_dict()
    head = sorted(k for k in params if params[k].shape != pretrained[k].shape)
    assert len(head) == 2 and head[1].endswith(".weight")  # the new classifier's bias and weight
    assert params[head[1]].shape[0] == 37 and params[head[0]].shape == (37,)
    kept = [k for k in params if k not in head]
    assert len(kept) > 100 and all(torch.equal(params[k], pretrained[k]) for k in kept)
    assert body["position"]["global_step"] == 2
