"""The fields of a run's configuration: `Config` (one frozen dataclass, one commented field per
``--key=value``), the values each choice takes, the fields a resumed run may change
(`RESUME_FREE`) and the bounds of its counts (`BOUNDS`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from reproduce.methods import METHODS, Flags

__all__ = [
    "ASAM_MASKS",
    "AUGMENTS",
    "BASES",
    "BF16_HVPS",
    "BOUNDS",
    "COMPILE_SCOPES",
    "CYCLES",
    "DATASETS",
    "ESTIMATORS",
    "FSAM_CONVENTIONS",
    "HVPS",
    "LOADERS",
    "LR_SCHEDULE_UNITS",
    "MODES",
    "PERTURBATIONS",
    "RESUME_FREE",
    "RHO_SCHEDULES",
    "SCHEDULES",
    "Config",
    "estimators_of",
    "worker_limit",
]

# --estimator takes the names of reproduce.methods.METHODS, the one table of the estimators
ESTIMATORS = tuple(METHODS)
BASES = ("sgd", "adamw")
DATASETS = (
    "mnist1d",
    "digits",
    "fmnist",
    "cifar10",
    "cifar100",
    "imagenet",
    "cars",
    "pets",
    "food101",
)
AUGMENTS = ("none", "basic", "cutout", "randaugment", "autoaugment")
SCHEDULES = ("cosine", "constant")
RHO_SCHEDULES = ("constant", "proportional")
LR_SCHEDULE_UNITS = ("step", "epoch")
HVPS = ("exact", "reverse", "fd")
COMPILE_SCOPES = ("auto", "step", "pass")
# how the step runs: eager, the eager step replayed as one CUDA graph, compiled, or both
MODES = ("auto", "eager", "graph", "compile", "compile-graph")
BF16_HVPS = ("exact", "reverse")
LOADERS = ("auto", "dali", "dali_exact", "gpu", "folder")
PERTURBATIONS = ("global", "local")
ASAM_MASKS = ("all", "weights")
FSAM_CONVENTIONS = ("paper", "authors")


@dataclass(frozen=True)
class Config(Flags):
    """A run's configuration: the methods' hyperparameters (the fields of
    `reproduce.methods.Flags`, one table with `reproduce.methods.Hyper`) and the fields below, one
    ``--key=value`` each."""

    # --- what to train
    preset: str = "mnist1d"  # the preset these values started from (see PRESETS)
    dataset: str = "mnist1d"  # mnist1d | digits | fmnist | cifar10 | cifar100 | imagenet
    data: str = ""  # folder of fmnist, cifar10/100, imagenet (layouts: reproduce/data/sets.py)
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
    workers: int = 0  # DataLoader workers of image folders, DALI's CPU threads (0: 8); ≤ 4 × cores
    # --- the gradient estimator (its hyperparameters: the fields of reproduce.methods.Flags, first)
    estimator: str = "sgd,gam"  # one of ESTIMATORS, or a comma list trained one after the other
    rho_schedule: str = "constant"  # constant | proportional (ρ_t = ρ_min + (ρ − ρ_min)·lr_t/lr_0)
    rho_min: float = 0.0  # ρ_min: the floor of --rho_schedule=proportional (in [0, rho])
    every: int = 1  # estimator on every k-th step, the base one otherwise (App. C.3); the shorthand of --when=every:k
    when: str = ""  # when a step is flat: "" (every step) | every:k | late:F (from F of the run's steps on, F in [0, 1)) | late:N (from step N) | adaptive (AE-SAM's trigger, the paper's defaults)
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
    cuda_graph: bool = False  # replay each step, update and all-reduces included, as one CUDA graph
    mode: str = "auto"  # how the step runs: eager | graph (the eager step as one CUDA graph: a first step within seconds) | compile | compile-graph | auto (graph on a GPU, eager on the CPU; --compile and --cuda_graph choose for it)
    compile_cache: str = "auto"  # where --compile keeps its compiled artifacts for later runs and --resume: a folder | off | auto (logdir/.compile_cache)
    loader: str = "auto"  # image folders: dali | dali_exact | gpu | folder | auto (dali with a GPU and DALI, else gpu where torchvision decodes JPEG on it, else folder; one line says which and why)
    dali_hw_load: float = 0.0  # --loader=dali*: the share of each batch on the hardware JPEG decoder (0: nvJPEG's CUDA decoder, which costs the step least)
    dali_roi: bool = True  # --loader=dali: decode each crop's window alone (false: whole images)
    dali_cpu: bool = False  # --loader=dali*: decode and resize on --workers CPU threads (0: 8), normalise on the GPU
    read_ahead: int = 3  # --loader=dali*|gpu: batches prepared ahead of the one the step takes (DALI's prefetch_queue_depth)
    fsdp: bool = False  # torchrun: shard the model per block with FSDP2 (fully_shard), trained through gamfunc.torch_optim; estimators built on gradients, eager (reproduce/run/fsdp.py)
    perturbation: str = "global"  # torchrun: global (one-process step) | local (per rank)
    dist_timeout: int = 1800  # seconds a collective waits for the other processes before failing
    # --- logging and evaluation
    logdir: str = "runs"  # TensorBoard logs, checkpoints and summaries go to logdir/name/estimator
    name: str = ""  # run name; empty: the preset's name
    log_every: int = 10  # steps between TensorBoard scalar writes
    profile_steps: int = 0  # steps profiled after the first log_every (into profile.txt)
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
# channels_last change rounding only; so do the loader and its decoders, except that --loader=dali
# computes crops of its own and --dali_roi decodes their windows alone).
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
        "profile_steps",
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
        "cuda_graph",
        "mode",
        "compile_cache",
        "loader",
        "dali_hw_load",
        "dali_roi",
        "dali_cpu",
        "read_ahead",
        "dist_timeout",
        "resume",
        "overwrite",
        "eval_batch_size",
        "preset",
    }
)

# The upper bounds of counts that size the work of one step, evaluation or process, so that a typo
# is refused rather than run for days (the rest: at most 2**63 - 1); --workers: `worker_limit`.
BOUNDS = {
    "ascent_steps": (100, " ascent steps in a step"),
    "num_classes": (1_000_000, " classes"),
    "eig_iters": (10_000, " Lanczos iterations"),
    "trace_samples": (1_000_000, " probes"),
    "r1_steps": (10_000, " ascent steps"),
    "read_ahead": (64, " batches"),
    "dist_timeout": (7 * 86_400, " seconds (a week)"),
}
# Methods that take their full step every --look_k steps by themselves (no --every beside it).
CYCLES = ("looksam", "look_gam")


def worker_limit() -> int:
    """The most ``--workers`` a run may ask for: 4 × this machine's cores (a loader's workers
    wait on reads and decode in turn; more processes than that only take memory)."""
    return 4 * (os.cpu_count() or 1)


def estimators_of(cfg: Config) -> list[str]:
    """The estimators a run trains: ``cfg.estimator`` split at commas."""
    return [e.strip() for e in cfg.estimator.split(",") if e.strip()]
