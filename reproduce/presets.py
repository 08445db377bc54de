"""The presets of `reproduce.config`, named after the paper's tables (Zhang et al., CVPR 2023,
arXiv:2303.03108): each is a dict of `reproduce.config.Config` fields, and the comments say
where each value comes from.

``PRESETS`` maps every name to its values; ``closest_presets`` is what a mistyped name most likely
meant. A new preset is one more entry of ``_presets`` (its family's helper, ``_cifar`` or
``_imagenet``, gives the shared recipe); `reproduce.preset_table.markdown` then lists it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUTHORS_ACCELERATED",
    "GSAM_IMAGENET",
    "PRESETS",
    "authors_smoothing",
    "closest_presets",
]


# main_cifar.py of github.com/xxgege/GAM (commit 694133d) sets (grad_norm_rho, grad_rho, grad_beta_0,
# grad_beta_1, grad_gamma) = (ρ, ρ', β, α, γ) per data set and network family:
AUTHORS_ACCELERATED = {
    ("cifar100", "resnet18"): dict(
        rho=0.2, rho_prime=0.02, beta=0.5, alpha=0.6, gamma=0.03
    ),  # l.126
    ("cifar100", "pyramidnet110"): dict(
        rho=0.2, rho_prime=0.04, beta=0.3, alpha=0.5, gamma=0.05
    ),  # l.128
    ("cifar10", "resnet18"): dict(
        rho=0.2, rho_prime=0.03, beta=0.1, alpha=0.1, gamma=0.05
    ),  # l.131
    ("cifar10", "pyramidnet110"): dict(
        rho=0.2, rho_prime=0.03, beta=0.1, alpha=0.1, gamma=0.03
    ),  # l.133
}


# GSAM (Zhuang et al., "Surrogate Gap Minimization Improves Sharpness-Aware Training", ICLR 2022,
# arXiv:2203.08065), Table 4 of its appendix, "Hyper-parameters to reproduce experimental results"
# (also img/gsam_hyperparam2.png of github.com/juntang-zhuang/GSAM): (ρ_max, ρ_min, α) per network,
# ρ_t following the lr from ρ_max down to ρ_min. ViT-B/32's row is also the authors' big_vision
# config (big_vision/configs/proj/gsam/vit_i1k_gsam_no_aug.py: rho_max 0.6, rho_min 0.1, alpha 0.6).
GSAM_IMAGENET = {
    "resnet50": (0.04, 0.02, 0.01),
    "resnet101": (0.04, 0.02, 0.01),
    "vit_s32": (0.6, 0.0, 0.4),
    "vit_b32": (0.6, 0.1, 0.6),
}


def authors_smoothing(smoothing: float, classes: int) -> float:
    """torch's ``label_smoothing`` equal to the authors' ``smooth_crossentropy(smoothing)``.

    Theirs puts 1 − s on the label and s/(K − 1) on each other class; torch's ``label_smoothing=t``
    puts 1 − t + t/K and t/K, the same target for t = s·K/(K − 1). (Their loss is a KL divergence, the
    cross-entropy less the target's entropy: the same gradient.)
    """
    return smoothing * classes / (classes - 1)


def _cifar(dataset: str, model: str) -> dict[str, Any]:
    lr = 0.05 if model == "pyramidnet110" else 0.1
    wd = 1e-3 if model == "densenet121" else 5e-4
    return dict(
        dataset=dataset,
        model=model if model != "resnet101" else "resnet101_cifar",
        estimator="gam",
        base="sgd",
        lr=lr,
        momentum=0.9,
        weight_decay=wd,
        schedule="cosine",
        epochs=200,
        batch_size=128,
        eval_batch_size=500,
        augment="basic",
        rho=0.04 if dataset == "cifar10" else 0.1,
        alpha=0.3 if model == "resnet18" else 0.1,
        flatness_every=0,
        flatness_samples=1000,
        log_every=50,
    )


def _fmnist(label_noise: float) -> dict[str, Any]:
    """Fashion-MNIST on one GPU, ours: the fast ResNet-9 at half width (`reproduce.models.ResNet9`,
    1.6M parameters), SGD with Nesterov momentum 0.9, lr 0.1 and weight decay 5e-4 (the CIFAR
    recipe), cosine decay over 15 epochs of batch 256, crop and flip on the GPU; the five estimators
    of the evidence table side by side. Width and epochs: the recipe stage's choice; ρ, α and SAM's
    ρ: the validation sweep's (both on validation, reproduce/RESULTS.md, "Fashion-MNIST"). fd GAM's radius is 1e-2, the smallest measured to train a
    ReLU network (`reproduce.build.FD_RELU_RADIUS`). The end-of-run metrics are λ_max (20 Lanczos
    products) and R1 on 1,000 training examples: seconds on a GPU.
    """
    return dict(
        dataset="fmnist",
        model="resnet9_w32",
        estimator="sgd,sam,gam,gam_fd,sam+gam",
        base="sgd",
        lr=0.1,
        momentum=0.9,
        nesterov=True,
        weight_decay=5e-4,
        schedule="cosine",
        epochs=15,
        batch_size=256,
        eval_batch_size=1000,
        augment="basic",
        label_noise=label_noise,
        # the validation sweep's choice (seed 0, 10% held out; the grid: reproduce/RESULTS.md)
        rho=0.05,
        alpha=0.3,
        sam_rho=0.05,
        fd_radius=1e-2,
        flatness_samples=1000,
        eig_iters=20,
        trace_samples=0,
        r1_steps=10,
        landscape=False,
        log_every=50,
    )


def _imagenet(model: str) -> dict[str, Any]:
    """Table app:tab:hp2 of the paper (ρ, α, lr, weight decay, base optimiser, epochs, cosine schedule).

    Batch 256 (global, over all processes): Section 5.2.2 of the paper, "We set the batch size to 256,
    learning rate to 0.1, and weight decay to 0.0001", which is also the lr-to-batch ratio of the
    standard ResNet recipe (0.1 per 256 images; Goyal et al. 2017, arXiv:1706.02677). Appendix C.5's
    "batch size is set to 128 for all models" belongs to its hyperparameter search paragraph; the
    ImageNet table's lr 0.1 goes with 256.

    ViTs follow Chen et al. 2021 ("When Vision Transformers Outperform ResNets without Pretraining or
    Strong Data Augmentations", arXiv:2106.01548, Appendix), which the paper cites for them: linear
    warm-up over 10k steps of batch 4096 (about 32 epochs of ImageNet's 1.28M images; we keep the
    number of images, not of steps), gradient clipping at global norm 1.0, and weight decay on the
    weight matrices only (none on biases, LayerNorm and the position embedding, the ViT convention of
    Dosovitskiy et al. 2021, arXiv:2010.11929). AdamW β = (0.9, 0.999) and weight decay 0.3 are the
    table's, with its lr 3e-4.
    """
    vit = model.startswith("vit")
    common = dict(
        dataset="imagenet",
        model=model,
        image_size=224,
        estimator="gam",
        schedule="cosine",
        batch_size=256,
        eval_batch_size=250,
        augment="basic",
        workers=8,
        flatness_samples=128,
        eig_iters=20,
        trace_samples=10,
        log_every=100,
        checkpoint_every=1000,
    )
    if vit:
        return common | dict(
            base="adamw",
            lr=3e-4,
            weight_decay=0.3,
            beta1=0.9,
            beta2=0.999,
            epochs=300,
            rho=0.3,
            alpha=0.5,
            warmup_epochs=32.0,
            clip_norm=1.0,
            no_decay_1d=True,
        )
    return common | dict(
        base="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, epochs=90, rho=0.2, alpha=0.1
    )


def _presets() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        # MNIST-1D (Greydanus 2020): the standard 4,000/1,000 split, MLP 40-100-100-10, SGD and SGD+GAM
        # side by side (SGD: lr 0.05, momentum 0.9, wd 5e-4, cosine, batch 100, 100 epochs). GAM's
        # (ρ, α) = (0.5, 1.0) is the best final validation accuracy of a sweep over ρ in {0.05, ..., 1}
        # and α in {0.1, ..., 3} on 800 held-out training examples, 3 seeds; the test set played no part.
        # SAM keeps a radius of its own, 0.2, the best of our SAM runs on this set (ρ 0.05: 65.9%,
        # 0.2: 69.1% test, 3-5 seeds); GAM's 0.5 as SAM's radius leaves the network at chance.
        "mnist1d": dict(threads=1, rho=0.5, alpha=1.0, sam_rho=0.2),
        # scikit-learn's 8×8 digits, a stratified 80/20 split, the same MLP on 64 inputs.
        "digits": dict(dataset="digits", epochs=60, threads=1),
    }
    models = (
        "resnet18",
        "resnet101",
        "wrn28_2",
        "wrn28_10",
        "pyramidnet110",
        "densenet121",
        "resnext29",
    )
    for dataset in ("cifar10", "cifar100"):
        for model in models:
            out[f"hp1.{dataset}.{model}"] = _cifar(dataset, model)
    for model in ("resnet50", "resnet101", "vit_s32", "vit_b32"):
        out[f"hp2.imagenet.{model}"] = _imagenet(model)
    # GSAM on the paper's ImageNet recipe (hp2: its lr, weight decay, batch 256, cosine decay to 0),
    # with GSAM's ρ_max (--rho), ρ_min and α (GSAM_IMAGENET) and ρ ∝ lr (rho_schedule=proportional:
    # ρ_t = ρ_min + (ρ_max − ρ_min)·lr_t/lr_0). GSAM's own base recipe (batch 4096, lr 1.6 for
    # ResNets and 3e-3 for ViTs, linear decay to lr_max/100, where ρ reaches ρ_min) is not taken:
    # here ρ reaches ρ_min where the cosine reaches 0. Its SAM radius is --rho (sam_rho stays 0).
    # GSAM gives no CIFAR setting: its Table 4 is ImageNet only, and the CIFAR-10 defaults of the
    # authors' PyTorch example (example/train.py: adaptive ρ = 2, α = 0.4) use ASAM's adaptive
    # geometry, which gamfunc.gsam does not take.
    for model, (rho_max, rho_min, gsam_alpha) in GSAM_IMAGENET.items():
        out[f"gsam.imagenet.{model}"] = _imagenet(model) | dict(
            estimator="gsam",
            rho=rho_max,
            rho_min=rho_min,
            rho_schedule="proportional",
            gsam_alpha=gsam_alpha,
        )
    # Fashion-MNIST (Xiao et al. 2017), real images on one GPU: clean and symmetric label noise
    # (Appendix C.2's protocol, as the noise.cifar10 presets).
    out["fmnist.clean"] = _fmnist(0.0)
    for pct in (20, 40, 60):
        out[f"fmnist.noise{pct}"] = _fmnist(pct / 100)
    for pct in (0, 20, 40, 60, 80):
        out[f"noise.cifar10.resnet32.p{pct}"] = _cifar("cifar10", "resnet32") | dict(
            label_noise=pct / 100, alpha=0.1
        )
    for dataset in ("cifar10", "cifar100"):
        for pct, every in ((5, 20), (10, 10), (50, 2), (100, 1)):
            # Appendix C.3: GAM on few iterations "with higher α" than on all of them, no value given.
            # We keep the time-averaged weight of the GAM term, α·every, capped at α = 1 (larger α·ρ
            # diverged in our MNIST-1D sweep): 0.3 on every step, 0.6 on every 2nd, 1.0 below that.
            out[f"time.{dataset}.resnet18.gam{pct}pct"] = _cifar(dataset, "resnet18") | dict(
                every=every, alpha=min(0.3 * every, 1.0)
            )
        # ViT-S/16 from scratch (appendix table, 200 epochs, CIFAR augmentations). The paper gives no
        # CIFAR row for ViTs: its ImageNet ViT values (Table app:tab:hp2: AdamW, lr 3e-4, wd 0.3) and
        # Chen et al.'s warm-up, clipping and decay mask, on images resized to 224 (16-pixel patches
        # of a 32-pixel image would be 4 tokens). Tune with reproduce/sweep.py.
        out[f"hp1.{dataset}.vit_s16"] = _cifar(dataset, "resnet18") | dict(
            model="vit_s16",
            image_size=224,
            base="adamw",
            lr=3e-4,
            weight_decay=0.3,
            warmup_epochs=10.0,
            clip_norm=1.0,
            no_decay_1d=True,
            alpha=0.1,
        )
        # The authors' accelerated GAM (Algorithm 2) as their released code runs it
        # (github.com/xxgege/GAM, commit 694133d): its convention (h− = g0 + |1−β|·g2), the
        # defaults that main_cifar.py sets per data set and network, and its loss, label smoothing
        # 0.1 (main_cifar.py line 108, gam/smooth_cross_entropy.py).
        # Their lr is 0.1 for every network (main_cifar.py line 46). "pyramidnet110" is their
        # bottleneck PyramidNet-110 (models/pyramidnet_cifar.py l.241-242), as in every preset.
        for model in ("resnet18", "pyramidnet110"):
            out[f"accelerated.{dataset}.{model}.authors"] = _cifar(dataset, model) | dict(
                estimator="gam_accelerated_official",
                lr=0.1,
                # CosineAnnealingLR(T_max=epochs) (gam/optimizer_helper.py l.18), stepped once per
                # epoch (main_cifar.py l.291). Their ρ and ρ' go through ProportionScheduler with
                # min_value = max_value (optimizer_helper.py l.21-25): constant, our default
                # rho_schedule="constant".
                lr_schedule_unit="epoch",
                label_smoothing=authors_smoothing(0.1, 10 if dataset == "cifar10" else 100),
                **AUTHORS_ACCELERATED[dataset, model],
            )
    # GNP (Zhao et al. 2022) for the paper's GNP table on CIFAR-100, with Zhao et al.'s released
    # CIFAR recipe (recipes/resnet-cifar.sh of github.com/zhaoyang-0204/gnp): r = 0.1 and their
    # α_Z = 0.8 in (1 − α_Z)·∇L(θ) + α_Z·∇L(θ + r·g/‖g‖), which is gamfunc.gnp's α = α_Z·r = 0.08
    # with hvp=gamfunc.hvps.fd(radius=r) (--gnp_radius); the rest is the CIFAR recipe of the SGD rows it is compared with.
    for model in ("resnet18", "resnet101", "wrn28_10", "pyramidnet110"):
        out[f"gnp.cifar100.{model}"] = _cifar("cifar100", model) | dict(
            estimator="gnp", alpha=0.08, gnp_hvp="fd", gnp_radius=0.1
        )
    # Transfer (the paper's transfer table, Section 5.3 and Appendix C.5): ImageNet-pretrained
    # EfficientNet-B0 (SGD, momentum 0.9) and Swin-T (AdamW (0.9, 0.999)) with a new classifier,
    # 40k steps of batch 128, lr 2e-3 with cosine decay, weight decay 1e-5; no augmentation on Cars,
    # Pets and Food-101, the CIFAR augmentations on CIFAR (images resized to 224).
    for dataset in ("cifar10", "cifar100", "cars", "pets", "food101"):
        for model, base in (("efficientnet_b0", "sgd"), ("swin_t", "adamw")):
            out[f"transfer.{dataset}.{model}"] = _cifar(
                dataset if dataset.startswith("cifar") else "cifar10", "resnet18"
            ) | dict(
                dataset=dataset,
                model=model,
                pretrained=True,
                image_size=224,
                base=base,
                lr=2e-3,
                weight_decay=1e-5,
                total_steps=40_000,
                augment="basic" if dataset.startswith("cifar") else "none",
                # the paper gives no ρ, α for transfer: its CIFAR values
                rho=0.04 if dataset == "cifar10" else 0.1,
                alpha=0.1,
            )
    return out


PRESETS: dict[str, dict[str, Any]] = _presets()


def _edits(a: str, b: str) -> int:
    """The edits (insertions, deletions, substitutions, swaps of neighbours) that turn ``a`` into
    ``b``: the optimal string alignment distance, so that ``resnet81`` is one edit from ``resnet18``."""
    d = [[i + j if not i * j else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def closest_presets(name: str, n: int = 5) -> list[str]:
    """The presets a mistyped ``name`` most likely meant: those that end with it, begin with it or
    contain it as whole dotted parts (``cifar10.resnet18``), else those within a few edits of it
    (``hp1.cifar10.resnet81``), those of its family (the same first part) first."""
    low = name.lower().strip(".")
    parts = [p for p in PRESETS if p.endswith("." + low)]
    parts = parts or [p for p in PRESETS if p.startswith(low) or f".{low}." in f".{p}."]
    if parts:
        return parts[:n]
    family = low.split(".")[0]
    scored = sorted((_edits(low, p), p.split(".")[0] != family, p) for p in PRESETS)
    bound = min(max(2, len(low) // 4), scored[0][0] + 1)  # the nearest, and those one edit further
    return [p for d, _, p in scored if d <= bound][:n]
