"""Training speed of reproduce/ presets: the step train.py builds, timed on synthetic batches.

For each ``preset[:estimator]`` the model, loss, estimator, optimiser and step come from
``reproduce.build.setup`` exactly as ``reproduce/train.py`` builds them (``--compile``, ``--bf16``,
``--channels_last`` and ``--scope`` passed through as train.py's flags); one synthetic batch of the
preset's per-step shape (batch size, image size, classes) is made once, already on the device. The
first step is timed alone (compilation included), ``--warmup`` − 1 more steps run untimed, then
``--steps`` steps are timed one by one (CUDA events; ``time.perf_counter`` on the CPU; one sample per
cycle of ``every`` steps for the time presets, whose counts are rounded up to whole cycles); ms/step
is the median sample (every sample and their mean are in the JSON). No data loading, evaluation or
flatness metrics: the hours are those of the training steps (ImageNet's loader may be slower: see
benchmarks/RESULTS.md).

Every distinct model (model, image size, classes, batch, base optimiser) also gets its preset's
plain gradient step (``--estimator=sgd``: SGD or AdamW as the preset says) in the same process, so
every row carries × grad step = its ms/step ÷ that step's. Hours of the whole run on one GPU = images of the run ÷
images/s, where the images are the steps train.py takes times the preset's batch: ``total_steps``, or
``epochs`` × ⌊training-set size ÷ batch⌋ (train.py drops the last partial batch of an epoch); the
training-set sizes are in :data:`TRAIN_EXAMPLES` with their sources. Fine-tuning presets
(``pretrained``) run from random weights: a step's cost does not depend on the values.

    python benchmarks/preset_speed.py --presets 'noise.cifar10.resnet32.p*:gam,hp1.cifar10.resnet18:sam+gam' \\
        --steps 10 --warmup 3 --out speed.json
    python benchmarks/preset_markdown.py speed.json     # README rows: hours on 1 GPU and on 8

``--presets`` takes comma-separated ``preset[:estimator]`` items; a preset may be a glob
(``'transfer.*'``); without ``:estimator`` the preset's own estimator(s). The JSON (``--out``) is
rewritten after every row, so a run stopped early keeps what it measured; ``--time_limit`` leaves
rows not yet started once that many seconds have passed (their ``error`` says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `reproduce` and `gamfunc` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from reproduce.build import compile_scope, setup
from reproduce.config import PRESETS, Config, estimators_of, resolve
from reproduce.data import sets as data_mod
from reproduce.run import launch
from reproduce.run.evaluation import inputs
from reproduce.run.report import write_json

__all__ = ["TRAIN_EXAMPLES", "main", "measure", "parse_presets", "run_images"]

# Training examples of each data set: the split train.py trains on (before --val_fraction).
TRAIN_EXAMPLES: dict[str, tuple[int, str]] = {
    "mnist1d": (4_000, "Greydanus 2020, the mnist1d package's standard 4,000/1,000 split"),
    "digits": (
        1_437,
        "scikit-learn's 1,797 8x8 digits, reproduce/data/sets.py's stratified 80% split",
    ),
    "cifar10": (50_000, "Krizhevsky 2009, CIFAR-10 training set"),
    "cifar100": (50_000, "Krizhevsky 2009, CIFAR-100 training set"),
    "imagenet": (1_281_167, "ILSVRC-2012 training set, Russakovsky et al. 2015"),
    "cars": (8_144, "Stanford Cars train split, Krause et al. 2013 (torchvision StanfordCars)"),
    "pets": (3_680, "Oxford-IIIT Pets trainval split, Parkhi et al. 2012 (torchvision)"),
    "food101": (75_750, "Food-101 train split, 750 per class, Bossard et al. 2014 (torchvision)"),
}


def parse_presets(text: str) -> list[tuple[str, str]]:
    """``"hp1.cifar10.resnet18:gam,noise.*"`` → ``[(preset, estimator), ...]``: globs expanded over
    ``PRESETS`` (in their order), no estimator meaning the preset's own (each of a comma list).

    Raises:
        ValueError: an item names no preset, or an estimator the preset cannot take.
    """
    out: list[tuple[str, str]] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        pattern, _, estimator = item.partition(":")
        names = [p for p in PRESETS if fnmatch.fnmatchcase(p, pattern)]
        if not names:
            raise ValueError(f"--presets: no preset matches {pattern!r}")
        for name in names:
            cfg = resolve(
                [f"--preset={name}"] + ([f"--estimator={estimator}"] if estimator else [])
            )
            out += [(name, e) for e in estimators_of(cfg) if (name, e) not in out]
    if not out:
        raise ValueError("--presets: give at least one preset[:estimator]")
    return out


def run_images(cfg: Config) -> dict[str, Any]:
    """The steps and images of the whole run of ``cfg`` (one process, its global batch)."""
    n, source = TRAIN_EXAMPLES[cfg.dataset]
    n -= round(cfg.val_fraction * n)
    steps = cfg.total_steps or cfg.epochs * (n // cfg.batch_size)
    return {
        "train_examples": n,
        "train_examples_source": source,
        "run_steps": steps,
        "run_batch_size": cfg.batch_size,
        "run_images": steps * cfg.batch_size,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    cfg: Config,
    procs: launch.Processes,
    steps: int,
    warmup: int,
    channels_last_inputs: bool | None = None,
) -> dict[str, Any]:
    """Build ``cfg``'s step as train.py does and time it on one synthetic batch on ``procs.device``.

    Returns the row's measured fields: ms/step, images/s, the first step's seconds (with, when
    compiled, the compiler's own phases: :func:`compile_phases`), peak memory.
    ``channels_last_inputs`` (default ``cfg.channels_last``) gives the batch the channels-last layout
    whatever the layout of the weights."""
    if channels_last_inputs is None:
        channels_last_inputs = cfg.channels_last
    device = procs.device
    (name,) = estimators_of(cfg)
    if cfg.every > 1:  # whole cycles of every-k (GAM on one step in k), both branches warmed up
        steps = -(-steps // cfg.every) * cfg.every
        warmup = max(warmup, cfg.every + 1)
    shapes = data_mod.load(
        dataclasses.replace(
            cfg, synthetic=True, synthetic_size=4, label_noise=0.0, val_fraction=0.0
        )
    )
    # setup reads the classes and size from the data, and the epoch length from len(data.train)
    data = dataclasses.replace(shapes, train=range(run_images(cfg)["train_examples"]))
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    t = setup(cfg, name, data, procs)
    setup_s = time.perf_counter() - began
    gen = torch.Generator().manual_seed(cfg.seed)
    x_shape = tuple(shapes.train.tensors()[0].shape[1:])
    x = torch.randn(cfg.batch_size, *x_shape, generator=gen)
    y = torch.randint(data.num_classes, (cfg.batch_size,), generator=gen)
    batch = (inputs(x, device, channels_last_inputs), y.to(device))
    params, state = t.params, t.state
    _sync(device)
    timed = _compile_timings()
    timed.clear()
    began = time.perf_counter()
    params, state, _ = t.step(params, state, batch)
    _sync(device)
    first_s = time.perf_counter() - began
    phases = compile_phases(timed) if cfg.compile else None
    for _ in range(warmup - 1):
        params, state, _ = t.step(params, state, batch)
    _sync(device)
    # one sample per cycle of `every` steps (per step without every-k); the median is the rate
    cycle = max(cfg.every, 1)
    samples = []
    for _ in range(steps // cycle):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            began = time.perf_counter()
        for _ in range(cycle):
            params, state, _ = t.step(params, state, batch)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / cycle)
        else:
            samples.append((time.perf_counter() - began) * 1e3 / cycle)
    ms = statistics.median(samples)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "image_size": data.image_size,
        "num_classes": data.num_classes,
        "input_shape": [cfg.batch_size, *x_shape],
        "batch_size": cfg.batch_size,
        "base": cfg.base,
        "every": cfg.every,
        "notes": t.notes,
        "bf16": cfg.bf16,
        "channels_last": cfg.channels_last,
        "steps_timed": steps,
        "warmup": warmup,
        "setup_s": round(setup_s, 2),
        "first_step_s": round(first_s, 2),
        "compile_phases_s": phases,
        "ms_per_step": ms,
        "ms_mean": statistics.fmean(samples),
        "ms_samples": samples,
        "images_per_s": cfg.batch_size / ms * 1e3,
        "peak_memory_gib": None if peak is None else round(peak, 3),
    }


def _compile_timings() -> dict[str, list[float]]:
    """The compiler's per-phase timings of this process (``torch._dynamo.utils``; empty if absent)."""
    from torch._dynamo import utils

    return getattr(utils, "compilation_time_metrics", {})


def compile_phases(timed: dict[str, list[float]], top: int = 20) -> dict[str, Any]:
    """Where a first step's compile spent its time: the ``top`` phases by total seconds, each with
    its seconds and how many times it ran (phases nest: a phase's seconds include those inside it)."""
    rows = sorted(timed.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {k: {"s": round(sum(v), 2), "calls": len(v)} for k, v in rows}


def _commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it (None outside git)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _baseline_key(cfg: Config) -> tuple:
    """Rows that share this key (the same network, batch and base optimiser) share one
    gradient-step baseline."""
    size, classes = data_mod.NATIVE[cfg.dataset]
    return (
        cfg.model,
        cfg.image_size or size,
        cfg.num_classes or classes,
        cfg.batch_size,
        cfg.base,
        cfg.clip_norm > 0,
        cfg.no_decay_1d,
    )


def _config(preset: str, estimator: str, args) -> Config:
    argv = [f"--preset={preset}", f"--estimator={estimator}", f"--device={args.device}"]
    argv += [f"--{flag}" for flag in ("bf16", "channels_last", "compile") if getattr(args, flag)]
    argv += [f"--compile_scope={args.scope}"]
    cfg = resolve(argv)
    # a fine-tuning preset needs --weights; the cost of a step does not depend on their values
    return dataclasses.replace(cfg, pretrained=False, weights="")


def _row(preset: str, estimator: str, args, procs) -> dict[str, Any]:
    cfg = _config(preset, estimator, args)
    scope = compile_scope(cfg, procs.world) if cfg.compile else "eager"
    row: dict[str, Any] = {"preset": preset, "estimator": estimator, "compile": scope}
    row |= run_images(cfg)
    if args.batch_size:
        cfg = dataclasses.replace(cfg, batch_size=args.batch_size)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        if cfg.compile:
            torch._dynamo.reset()  # each row compiles afresh, far from dynamo's recompile limit
        if args.contiguous_weights:  # the batch channels-last, the weights as the model made them
            cfg = dataclasses.replace(cfg, channels_last=False)
            row |= measure(cfg, procs, args.steps, args.warmup, channels_last_inputs=True)
            row["contiguous_weights"] = True
        else:
            row |= measure(cfg, procs, args.steps, args.warmup)
        row["hours_1gpu"] = row["run_images"] / (row["images_per_s"] * 3600)
        row["error"] = None
    except Exception as e:  # one failing preset (out of memory, a compile error) leaves the others
        first = (str(e).strip().splitlines() or [""])[0][:300]
        row["error"] = f"{type(e).__name__}: {first}"
        traceback.print_exc()
    finally:
        torch.set_num_threads(threads)
        if procs.device.type == "cuda":
            torch.cuda.empty_cache()
    row["baseline_key"] = list(_baseline_key(cfg))
    return row


def _line(r: dict) -> str:
    head = f"{r['preset'] + ':' + r['estimator']:<46}"
    if r["error"]:
        return f"{head} {r['error']}"
    x = r.get("x_grad_step")
    mem = r["peak_memory_gib"]
    return (
        f"{head}{r['ms_per_step']:>10.2f}{r['images_per_s']:>10.0f}"
        f"{'' if x is None else f'{x:.2f}':>8}{r['first_step_s']:>9.1f}"
        f"{'' if mem is None else f'{mem:.2f}':>8}{r['hours_1gpu']:>10.3g}"
    )


HEADER = (
    f"{'preset:estimator':<46}{'ms/step':>10}{'img/s':>10}{'× grad':>8}{'1st s':>9}{'GiB':>8}"
    f"{'hours':>10}"
)


def _run_rows(plan, args, procs, result: dict, out: Path | None, began: float) -> None:
    baselines: dict[tuple, dict] = {}  # the first gradient-step row of each model
    for preset, est in plan:
        if args.time_limit and time.perf_counter() - began > args.time_limit:
            row = {"preset": preset, "estimator": est, "error": "not run: --time_limit reached"}
        else:
            row = _row(preset, est, args, procs)
        key = tuple(row.get("baseline_key", ()))
        if est == "sgd" and key not in baselines and not row["error"]:
            baselines[key] = row
        base = baselines.get(key)
        if not row["error"]:
            row["baseline"] = f"{base['preset']}:sgd" if base else None
            row["x_grad_step"] = row["ms_per_step"] / base["ms_per_step"] if base else None
        result["rows"].append(row)
        print(_line(row), flush=True)
        if out:
            write_json(out, result)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", required=True, help="comma list of preset[:estimator] (globs ok)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per row")
    ap.add_argument(
        "--warmup", type=int, default=3, help="untimed steps first (the first compiles)"
    )
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--bf16", action="store_true", help="train.py's --bf16")
    ap.add_argument("--channels_last", action="store_true", help="train.py's --channels_last")
    ap.add_argument("--compile", action="store_true", help="train.py's --compile")
    ap.add_argument(
        "--contiguous_weights",
        action="store_true",
        help="with --channels_last: only the batch takes the channels-last layout",
    )
    ap.add_argument("--scope", default="auto", choices=("auto", "step", "pass"))
    ap.add_argument(
        "--batch_size", type=int, default=0, help="per-step batch instead of the preset's (0)"
    )
    ap.add_argument("--time_limit", type=float, default=0, help="seconds; 0: none")
    ap.add_argument("--out", default="", help="JSON file")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be >= 1 (the first warm-up step compiles)")
    try:
        items = parse_presets(args.presets)
        procs = launch.start(args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = procs.device
    result: dict[str, Any] = {
        "device": (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
        ),
        "device_type": device.type,
        "torch": torch.__version__,
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flags": {
            k: getattr(args, k)
            for k in (
                "bf16",
                "channels_last",
                "contiguous_weights",
                "compile",
                "scope",
                "steps",
                "warmup",
                "batch_size",
                "device",
            )
        },
        "cpu_threads": torch.get_num_threads(),
        "rows": [],
    }
    out = Path(args.out) if args.out else None
    began = time.perf_counter()
    # the gradient step of each model first, then what was asked (a row asked for as :sgd is its own)
    plan: list[tuple[str, str]] = []
    models: set[tuple] = set()
    for preset, est in items:
        key = _baseline_key(_config(preset, "sgd", args))
        if key not in models:
            models.add(key)
            plan.append((preset, "sgd"))
        if (preset, est) not in plan:
            plan.append((preset, est))
    print(f"{len(plan)} rows on {result['device']} ({device}), torch {torch.__version__}")
    print(HEADER, flush=True)
    with warnings.catch_warnings():
        # torch.func's forward-mode decompositions warn that torch.jit.script is deprecated (as in train.py)
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
        _run_rows(plan, args, procs, result, out, began)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    if out:
        write_json(out, result)
        print(f"JSON: {out}")
    launch.finish(procs)
    return 1 if any(r["error"] for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
