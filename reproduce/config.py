"""The configuration of a training run: one frozen dataclass, presets named after the paper's tables,
and ``--key=value`` overrides.

``resolve(argv)`` starts from :class:`Config`'s defaults (the built-in MNIST-1D comparison), applies
``--preset=NAME`` if given, then every other ``--key=value`` in order. Keys may use ``-`` or ``_``
(``--val-fraction=0.1`` is ``--val_fraction=0.1``); a bare ``--flag`` sets a boolean to true.

Presets (``PRESETS``, built by ``_presets`` below, whose comments say where each value comes from) are
named after the paper's tables (Zhang et al., CVPR 2023, arXiv:2303.03108). The list of them, one row
per family with its settings, is :func:`reproduce.preset_table.markdown`
(``python -m reproduce.preset_table``; docs/guides/reproduce.md's preset table is its output).

Example:
    >>> from reproduce.config import resolve
    >>> cfg = resolve(["--preset=hp1.cifar100.resnet18", "--estimator=sam+gam", "--seed=1"])
    >>> cfg.model, cfg.rho, cfg.alpha, cfg.estimator
    ('resnet18', 0.1, 0.3, 'sam+gam')
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

__all__ = [
    "BASES",
    "DATASETS",
    "ESTIMATORS",
    "PRESETS",
    "RESUME_FREE",
    "Config",
    "apply",
    "as_dict",
    "differences",
    "estimators_of",
    "field_help",
    "parse_overrides",
    "resolve",
    "run_name",
    "validate",
]

ESTIMATORS = (
    "sgd",
    "sam",
    "gnp",
    "gam",
    "gam_fd",
    "gam_reverse",
    "gam_accelerated",
    "gam_accelerated_official",
    "sam+gam",
)
BASES = ("sgd", "adamw")
DATASETS = ("mnist1d", "digits", "cifar10", "cifar100", "imagenet", "cars", "pets", "food101")
AUGMENTS = ("none", "basic", "cutout", "randaugment", "autoaugment")
SCHEDULES = ("cosine", "constant")
RHO_SCHEDULES = ("constant", "proportional")
LR_SCHEDULE_UNITS = ("step", "epoch")
HVPS = ("exact", "reverse", "fd")
COMPILE_SCOPES = ("auto", "step", "pass")
BF16_HVPS = ("exact", "reverse")
LOADERS = ("auto", "dali", "dali_exact", "gpu", "folder")
PERTURBATIONS = ("global", "local")


@dataclass(frozen=True)
class Config:
    # --- what to train
    preset: str = "mnist1d"  # the preset these values started from (see PRESETS)
    dataset: str = "mnist1d"  # mnist1d | digits | cifar10 | cifar100 | imagenet
    data: str = ""  # root folder of cifar10/cifar100/imagenet (layouts: reproduce/data/sets.py)
    download: bool = False  # let torchvision download CIFAR into --data (else nothing downloads)
    synthetic: bool = False  # random inputs of the data's shape (smoke tests only)
    synthetic_size: int = 256  # training examples of --synthetic data (test set: a quarter of it)
    model: str = "mlp"  # a name of reproduce.models.MODELS
    num_classes: int = 0  # classifier outputs; 0: the data set's number of classes
    image_size: int = 0  # input side (vector length for mnist1d/digits); 0: the data set's own
    weights: str = ""  # local state dict (or checkpoint) to start from instead of a fresh init
    pretrained: bool = False  # fine-tune: --weights required, then a new classifier layer
    augment: str = "basic"  # none | basic | cutout | randaugment | autoaugment (image data sets)
    cutout_size: int = 16  # side of the Cutout square in pixels (DeVries and Taylor 2017)
    label_noise: float = 0.0  # fraction of training labels replaced by another class (App. C.2)
    val_fraction: float = 0.0  # share of the training set held out for validation (model selection)
    workers: int = 0  # DataLoader worker processes for image data sets
    # --- the gradient estimator
    estimator: str = "sgd,gam"  # one of ESTIMATORS, or a comma list trained one after the other
    rho: float = 0.05  # ρ: radius of the ascent (SAM, GAM)
    alpha: float = 0.1  # α: weight of the first-order flatness term (GAM, GNP)
    sam_rho: float = 0.0  # SAM's ρ (sam, and the oracle of sam+gam); 0: the same as rho
    rho_schedule: str = "constant"  # constant | proportional (ρ_t = ρ_min + (ρ − ρ_min)·lr_t/lr_0)
    rho_min: float = 0.0  # ρ_min: the floor of --rho_schedule=proportional (in [0, rho])
    gnp_hvp: str = "fd"  # H·v of gnp: fd (Zhao et al.) | exact | reverse
    fd_radius: float = 1e-3  # r of the finite-difference H·v of gam_fd
    gnp_radius: float = 1e-2  # r of gnp's finite difference (Zhao et al.'s form)
    rho_prime: float = 0.05  # ρ' of gam_accelerated (the SAM-like finite differences)
    beta: float = 0.5  # β of gam_accelerated
    gamma: float = 0.1  # γ of gam_accelerated
    every: int = 1  # estimator on every k-th step, the base one otherwise (App. C.3)
    # --- the base optimiser and schedule
    base: str = "sgd"  # sgd | adamw
    lr: float = 0.05  # peak learning rate
    momentum: float = 0.9  # SGD momentum
    nesterov: bool = False  # SGD Nesterov momentum
    weight_decay: float = 5e-4  # L2 weight decay (SGD) or decoupled weight decay (AdamW)
    beta1: float = 0.9  # AdamW β₁
    beta2: float = 0.999  # AdamW β₂
    schedule: str = "cosine"  # cosine | constant learning rate
    lr_schedule_unit: str = "step"  # step | epoch: the lr changes every step or once per epoch
    warmup_epochs: float = 0.0  # linear warm-up before the cosine decay
    epochs: int = 100  # training epochs
    total_steps: int = 0  # train this many steps (the schedule's length; overrides epochs; 0: off)
    batch_size: int = 100  # global batch: the sum over all processes of a torchrun job
    clip_norm: float = 0.0  # clip the direction to this global L2 norm before the update (0: never)
    label_smoothing: float = 0.0  # F.cross_entropy's, in training (0: none; the paper says none)
    no_decay_1d: bool = False  # no weight decay on 1-d tensors (biases, normalisation weights)
    eval_batch_size: int = 500  # evaluation batch size
    max_steps: int = 0  # stop after this many steps in all (smoke runs; 0: no limit); resumable
    max_skipped: int = 50  # stop (exit 3) after this many skipped steps in a row (0: never)
    max_skipped_fraction: float = 0.5  # diverged (exit 3) if more of the run's steps were skipped
    max_param_rms: float = 1e3  # diverged (exit 3) if the parameters' root mean square ends above
    # --- how it runs
    seed: int = 0  # seeds the initialisation, data order, augmentation and metric probes
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch CPU threads; 0: torch's default
    bf16: bool = False  # bfloat16 autocast inside the loss
    bf16_hvp: str = "exact"  # exact GAM's H·v in bf16 on conv/BatchNorm nets: exact | reverse
    compile: bool = False  # torch.compile the training step
    channels_last: bool = False  # NHWC layout for 4-d parameters and 4-d input batches (GPU speed)
    compile_scope: str = "auto"  # step | pass | auto (pass for ImageNet and torchrun)
    loader: str = "auto"  # image folders: dali | dali_exact | gpu (nvJPEG) | folder | auto (folder)
    perturbation: str = "global"  # torchrun: global (one-process step) | local (per rank)
    dist_timeout: int = 1800  # seconds a collective waits for the other processes before failing
    # --- logging and evaluation
    logdir: str = "runs"  # TensorBoard logs, checkpoints and summaries go to logdir/name/estimator
    name: str = ""  # run name; empty: the preset's name
    log_every: int = 10  # steps between TensorBoard scalar writes
    eval_every: int = 1  # epochs between test (and validation) evaluations
    eval_train: bool = False  # also evaluate on the whole training set at every evaluation
    flatness_every: int = 0  # epochs between λ_max/trace/R1/landscape logs (0: only at the end)
    flatness_samples: int = 4000  # training examples (fixed, un-augmented) the flatness metrics use
    full_metrics: bool = False  # a smoke run's end-of-run metrics at their configured size too
    flatness_batch: int = 0  # batches of this size, H·v averaged over them (0: one batch)
    flatness_rho: float = 0.0  # radius of R1 and of the landscape plots; 0: rho
    eig_iters: int = 100  # Lanczos iterations for λ_max (0: skip λ_max)
    trace_samples: int = 100  # Hutchinson probes for the Hessian trace (0: skip the trace)
    r1_steps: int = 10  # projected ascent steps for R1, started at GAM's θ_adv (0: skip R1)
    landscape: bool = True  # log a loss-landscape figure with the flatness metrics (if available)
    histogram_every: int = 0  # epochs between parameter histograms (0: never)
    progress: bool = True  # tqdm progress bars (shown only on a terminal)
    # --- checkpoints
    checkpoint_every: int = 0  # steps between checkpoints within an epoch (0: at epoch ends only)
    resume: bool = False  # continue from the run's checkpoint
    overwrite: bool = False  # start afresh even if an unfinished run's checkpoint exists


# Fields that may differ between a checkpoint and the run resuming it: they change where output goes,
# how much is logged or how fast it runs, never the trajectory (device, compile and
# channels_last change rounding only; so does the loader, except that --loader=dali computes crops
# of its own).
RESUME_FREE = frozenset(
    {
        "data",
        "download",
        "workers",
        "threads",
        "max_steps",
        "max_skipped",
        "max_skipped_fraction",
        "max_param_rms",
        "full_metrics",
        "device",
        "compile",
        "channels_last",
        "logdir",
        "name",
        "log_every",
        "eval_every",
        "eval_train",
        "flatness_every",
        "flatness_samples",
        "flatness_batch",
        "flatness_rho",
        "eig_iters",
        "trace_samples",
        "r1_steps",
        "landscape",
        "histogram_every",
        "progress",
        "checkpoint_every",
        "compile_scope",
        "loader",
        "dist_timeout",
        "resume",
        "overwrite",
        "eval_batch_size",
        "preset",
    }
)


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
    # with fd_radius r; the rest is the CIFAR recipe of the SGD rows it is compared with.
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


def field_help() -> dict[str, str]:
    """Each field's comment in the source of :class:`Config`: the ``--help`` text."""
    pattern = re.compile(r"^\s+(\w+): [^=]+ = .*?  # (.*)$")
    out = {}
    for line in inspect.getsource(Config).splitlines():
        m = pattern.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in fields(Config)}


def _convert(key: str, text: str, kind: type) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--{key} takes true or false; got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--{key} takes a {kind.__name__}; got {text!r}") from None


def parse_overrides(argv: list[str]) -> list[tuple[str, Any]]:
    """``["--lr=0.1", "--bf16", "--val-fraction", "0.1"]`` → ``[("lr", 0.1), ("bf16", True), ...]``.

    Raises ValueError naming an unknown key (with the closest known ones) or a value of the wrong type.
    """
    types = _field_types()
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"arguments are --key=value; got {arg!r}")
        key, eq, text = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in types:
            near = difflib.get_close_matches(key, list(types), n=3)
            hint = f"; did you mean {', '.join('--' + n for n in near)}?" if near else ""
            raise ValueError(f"unknown option --{key}{hint}")
        if not eq:
            if types[key] is bool:
                text = "true"
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                text = argv[i]
            else:
                raise ValueError(f"--{key} needs a value")
        out.append((key, _convert(key, text, types[key])))
        i += 1
    return out


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


def apply(cfg: Config, overrides: list[tuple[str, Any]] | dict[str, Any]) -> Config:
    """``cfg`` with the overrides applied in order; ``preset`` first sets the preset's values."""
    items = list(overrides.items()) if isinstance(overrides, dict) else list(overrides)
    for key, value in items:
        if key == "preset":
            if value not in PRESETS:
                near = closest_presets(value)
                hint = f"did you mean {', '.join(near)}? " if near else ""
                raise ValueError(f"unknown preset {value!r}; {hint}--help lists all {len(PRESETS)}")
            cfg = replace(cfg, **PRESETS[value], preset=value)
        else:
            cfg = replace(cfg, **{key: value})
    return cfg


def resolve(argv: list[str]) -> Config:
    """The validated configuration of a command line: defaults, then ``--preset`` (``mnist1d`` if
    none is given), then the other overrides in order."""
    overrides = parse_overrides(argv)
    presets = [kv for kv in overrides if kv[0] == "preset"]
    rest = [kv for kv in overrides if kv[0] != "preset"]
    cfg = apply(Config(), (presets[-1:] or [("preset", Config.preset)]) + rest)
    validate(cfg)
    return cfg


def _check(ok: bool, name: str, msg: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name} must be {msg}; got {value!r}")


def estimators_of(cfg: Config) -> list[str]:
    """The estimators a run trains: ``cfg.estimator`` split at commas."""
    return [e.strip() for e in cfg.estimator.split(",") if e.strip()]


def validate(cfg: Config) -> None:
    """Raise ValueError naming the first field whose value is out of range."""
    from reproduce.models import MODELS

    _check(cfg.dataset in DATASETS, "dataset", f"one of {DATASETS}", cfg.dataset)
    _check(cfg.model in MODELS, "model", f"one of {sorted(MODELS)}", cfg.model)
    _check(cfg.augment in AUGMENTS, "augment", f"one of {AUGMENTS}", cfg.augment)
    _check(cfg.base in BASES, "base", f"one of {BASES}", cfg.base)
    _check(cfg.schedule in SCHEDULES, "schedule", f"one of {SCHEDULES}", cfg.schedule)
    _check(
        cfg.rho_schedule in RHO_SCHEDULES,
        "rho_schedule",
        f"one of {RHO_SCHEDULES}",
        cfg.rho_schedule,
    )
    unit = cfg.lr_schedule_unit
    _check(unit in LR_SCHEDULE_UNITS, "lr_schedule_unit", f"one of {LR_SCHEDULE_UNITS}", unit)
    if unit == "epoch":
        _check(
            float(cfg.warmup_epochs).is_integer(),
            "warmup_epochs",
            "a whole number of epochs with --lr_schedule_unit=epoch",
            cfg.warmup_epochs,
        )
    _check(0 <= cfg.rho_min <= cfg.rho, "rho_min", f"in [0, rho={cfg.rho}]", cfg.rho_min)
    _check(cfg.gnp_hvp in HVPS, "gnp_hvp", f"one of {HVPS}", cfg.gnp_hvp)
    _check(cfg.bf16_hvp in BF16_HVPS, "bf16_hvp", f"one of {BF16_HVPS}", cfg.bf16_hvp)
    for name, allowed in (
        ("compile_scope", COMPILE_SCOPES),
        ("loader", LOADERS),
        ("perturbation", PERTURBATIONS),
    ):
        _check(getattr(cfg, name) in allowed, name, f"one of {allowed}", getattr(cfg, name))
    _check(
        cfg.clip_norm >= 0 and cfg.clip_norm != float("inf"),
        "clip_norm",
        "a finite number >= 0",
        cfg.clip_norm,
    )
    _check(cfg.dist_timeout >= 1, "dist_timeout", "an integer >= 1 (seconds)", cfg.dist_timeout)
    names = estimators_of(cfg)
    _check(bool(names), "estimator", f"one or more of {ESTIMATORS}", cfg.estimator)
    for e in names:
        _check(e in ESTIMATORS, "estimator", f"one of {ESTIMATORS} (or a comma list)", e)
    _check(len(set(names)) == len(names), "estimator", "a list without repeats", cfg.estimator)
    for name in ("rho", "alpha", "sam_rho", "rho_prime", "gamma", "lr", "momentum", "weight_decay"):
        v = getattr(cfg, name)
        _check(v >= 0 and v != float("inf"), name, "a finite number >= 0", v)
    if any(e.startswith("gam_accelerated") for e in names):
        _check(0 <= cfg.alpha <= 1, "alpha", "in [0, 1] for gam_accelerated", cfg.alpha)
    _check(0 <= cfg.beta <= 1, "beta", "in [0, 1]", cfg.beta)
    _check(cfg.fd_radius > 0, "fd_radius", "> 0", cfg.fd_radius)
    _check(cfg.gnp_radius > 0, "gnp_radius", "> 0", cfg.gnp_radius)
    for name in ("beta1", "beta2"):
        _check(0 <= getattr(cfg, name) < 1, name, "in [0, 1)", getattr(cfg, name))
    _check(0 <= cfg.label_noise <= 1, "label_noise", "in [0, 1]", cfg.label_noise)
    _check(0 <= cfg.val_fraction < 1, "val_fraction", "in [0, 1)", cfg.val_fraction)
    _check(cfg.warmup_epochs >= 0, "warmup_epochs", ">= 0", cfg.warmup_epochs)
    _check(cfg.epochs >= 1, "epochs", "an integer >= 1", cfg.epochs)
    _check(cfg.warmup_epochs <= cfg.epochs, "warmup_epochs", "<= epochs", cfg.warmup_epochs)
    leaves = Path(cfg.name).is_absolute() or ".." in Path(cfg.name).parts
    _check(not leaves, "name", "a name inside --logdir (no absolute path, no ..)", cfg.name)
    _check(cfg.total_steps >= 0, "total_steps", "an integer >= 0", cfg.total_steps)
    _check(cfg.flatness_batch >= 0, "flatness_batch", "an integer >= 0", cfg.flatness_batch)
    ls = cfg.label_smoothing
    _check(0 <= ls < 1, "label_smoothing", "a number in [0, 1)", ls)
    frac = cfg.max_skipped_fraction
    _check(0 <= frac <= 1, "max_skipped_fraction", "a number in [0, 1]", frac)
    _check(cfg.max_param_rms > 0, "max_param_rms", "a number > 0", cfg.max_param_rms)
    for name in ("every", "epochs", "batch_size", "eval_batch_size", "log_every", "eval_every"):
        _check(getattr(cfg, name) >= 1, name, "an integer >= 1", getattr(cfg, name))
    for name in (
        "num_classes",
        "image_size",
        "max_steps",
        "max_skipped",
        "workers",
        "threads",
        "flatness_every",
        "histogram_every",
        "checkpoint_every",
        "eig_iters",
        "trace_samples",
        "r1_steps",
        "cutout_size",
    ):
        _check(getattr(cfg, name) >= 0, name, "an integer >= 0", getattr(cfg, name))
    _check(cfg.flatness_samples >= 1, "flatness_samples", "an integer >= 1", cfg.flatness_samples)
    _check(cfg.synthetic_size >= 4, "synthetic_size", "an integer >= 4", cfg.synthetic_size)
    _check(cfg.flatness_rho >= 0, "flatness_rho", ">= 0", cfg.flatness_rho)
    _check(cfg.seed >= 0, "seed", "an integer >= 0", cfg.seed)
    dev = cfg.device
    _check(
        dev in ("auto", "cpu", "cuda") or bool(re.fullmatch(r"cuda:\d+", dev)),
        "device",
        "auto, cpu, cuda or cuda:N",
        dev,
    )


def run_name(cfg: Config) -> str:
    """The folder of a run under ``logdir``: ``name``, else the preset (with the data set appended
    when ``--dataset`` overrides the preset's)."""
    if cfg.name:
        return cfg.name
    own = PRESETS.get(cfg.preset, {}).get("dataset", Config.dataset)
    return cfg.preset if cfg.dataset == own else f"{cfg.preset}.{cfg.dataset}"


def as_dict(cfg: Config) -> dict[str, Any]:
    """The configuration as a plain dict (what checkpoints and summaries store)."""
    return dataclasses.asdict(cfg)


def differences(saved: dict[str, Any], cfg: Config, ignore=RESUME_FREE) -> dict[str, tuple]:
    """``{field: (saved value, current value)}`` for fields outside ``ignore`` that differ.

    A field that ``saved`` lacks (a checkpoint written before the field existed) counts as its
    default in :class:`Config`, the behaviour such a run had."""
    now, default = as_dict(cfg), as_dict(Config())
    keys = (set(saved) | set(now)) - set(ignore)
    old = {k: saved.get(k, default.get(k)) for k in keys}
    return {k: (old[k], now.get(k)) for k in sorted(keys) if old[k] != now.get(k)}
