"""What every claim shares: the methods and their configs, training one config on MNIST-1D (alone
or vmapped with others), the metrics' fixed batch and loss, and writing a claim's table and JSON.

``METHODS`` holds the five methods of `reproduce.evidence` with the config fields each sets
(the estimator names of `reproduce.build.setup`); every claim module builds its configs with
`method_config` on `base_config` and trains them with `train`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from gamfunc import metrics
from reproduce.build import setup
from reproduce.config import resolve
from reproduce.data import sets as data_mod
from reproduce.run import report
from reproduce.run.epoch import epoch_batches, train_epochs
from reproduce.run.evaluation import evaluate
from reproduce.run.summary import skipped_too_many
from reproduce.sweeps import vmapped

# The method of reproduce.methods and the config fields each sets.
GAM = dict(rho=0.5, alpha=1.0)
SAM_RHO = 0.2
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "SGD": ("sgd", {}),
    "SGD+GAM": ("gam", GAM),
    "SAM": ("sam", dict(rho=SAM_RHO)),
    "SAM+GAM": ("sam+gam", dict(**GAM, sam_rho=SAM_RHO)),
    "GNP": ("gnp", {}),  # alpha from --gnp-alpha
}
FOUR = ("SGD", "SGD+GAM", "SAM", "SAM+GAM")


# ---------------------------------------------------------------- configs


def method_config(base, method: str, seed: int, gnp_alpha: float, sam_gam=None, gam=None, **extra):
    """``(estimator name, Config)`` of ``method`` (a key of METHODS) with ``seed`` and ``extra``;
    ``gam = (ρ, α)`` replaces GAM's ρ, α in SGD+GAM, ``sam_gam = (ρ, α)`` those of SAM+GAM (whose
    SAM oracle keeps ρ = SAM_RHO)."""
    name, fields = METHODS[method]
    fields = dict(fields)
    if method == "GNP":
        fields["alpha"] = gnp_alpha
    if method == "SAM+GAM" and sam_gam is not None:
        fields["rho"], fields["alpha"] = sam_gam
    if method == "SGD+GAM" and gam is not None:
        fields["rho"], fields["alpha"] = gam
    return name, dataclasses.replace(base, seed=seed, **fields, **extra)


def base_config(opt, **extra):
    """The ``mnist1d`` preset with the model, epochs and threads of ``opt`` (no TensorBoard, no flatness)."""
    cfg = resolve([f"--model={opt.model}", f"--epochs={opt.epochs}"])
    return dataclasses.replace(cfg, **extra)


# ---------------------------------------------------------------- training


class NotTrained(Exception):
    """A run of a claim did not train (train.py's rules: `reproduce.run.summary.skipped_too_many`);
    the command exits 3 naming it, and writes no table."""


def check_trained(cfg, name: str, skipped: int, steps: int) -> None:
    """Raise `NotTrained` naming estimator ``name`` and ``cfg``'s seed when its run, with
    ``skipped`` of its ``steps`` skipped, did not train.

    Args:
        cfg: the run's configuration.
        name: its estimator.
        skipped: its skipped (non-finite) steps.
        steps: the steps it took.

    Raises:
        NotTrained: the run did not train (the message says why).
    """
    why = skipped_too_many(cfg, skipped, steps)
    if why is not None:
        raise NotTrained(f"the run of {name} (seed {cfg.seed}, ρ={cfg.rho:g}) did not train: {why}")


class NotMeasured(Exception):
    """A measurement of a trained run is not finite (its probe losses overflowed, say at too
    large a radius): the command exits 3 naming the run and the measurement, and writes no table,
    rather than count or draw what it could not measure."""


def check_finite(values: torch.Tensor, what: str, run: str, hint: str) -> None:
    """Raise `NotMeasured` when some of ``values`` (the probe losses behind measurement ``what`` of
    ``run``) are not finite; ``hint`` ends the line (what to change).

    Args:
        values: the losses the measurement was computed from.
        what: the measurement, as the line names it.
        run: the run, as the line names it.
        hint: what to do about it.

    Raises:
        NotMeasured: ``values`` holds a NaN or an infinity.
    """
    bad = int((~torch.isfinite(values)).sum())
    if bad:
        raise NotMeasured(
            f"{what} of {run}: {bad} of its {values.numel()} probe losses are not finite; {hint}"
        )


def probe_batch(examples, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``size`` examples of ``examples`` as one batch (the fixed batch of every metric)."""
    x, y = examples.tensors()
    return x[:size], y[:size]


def train(cfg, name: str, *, on_epoch=None) -> dict[str, Any]:
    """Train estimator ``name`` under ``cfg`` on MNIST-1D, on train.py's loop
    (`reproduce.run.epoch.train_epochs`) and batch order; ``on_epoch(epoch, params, buffers,
    loss_fn)`` runs after each epoch. Returns params, buffers, loss_fn, accuracies, seconds and
    seconds per step."""
    device = torch.device("cpu")
    data = data_mod.load(cfg)
    t = setup(cfg, name, data, device)
    params, state = t.params, t.state
    pos = {"epoch": 0, "batch": 0, "train_seconds": 0.0}
    steps = 0

    def step(batch) -> dict:
        nonlocal params, state
        params, state, metrics = t.step(params, state, batch)
        return metrics

    def after_step(metrics: dict, batch) -> None:
        nonlocal steps
        steps += 1

    def end(stopped: str | None) -> None:
        if on_epoch is not None:
            on_epoch(pos["epoch"], params, state.buffers, t.loss_fn)
        pos.update(epoch=pos["epoch"] + 1, batch=0)

    batches = epoch_batches(data.train, cfg.seed, cfg.batch_size)
    train_epochs(step, batches, pos, cfg.epochs, after_step, end)
    seconds = pos["train_seconds"]
    buffers = state.buffers
    check_trained(cfg, name, int(state.skipped), steps)

    def acc(examples):
        if examples is None:
            return None
        batches = data_mod.eval_batches(examples, cfg.eval_batch_size)
        return evaluate(t.loss_fn, params, buffers, batches, device)["acc"]

    train_acc, test_acc, val_acc = acc(data.probe), acc(data.test), acc(data.val)
    return dict(
        params=params,
        buffers=buffers,
        loss_fn=t.loss_fn,
        data=data,
        train_acc=train_acc,
        test_acc=test_acc,
        val_acc=val_acc,
        gap=train_acc - test_acc,
        seconds=seconds,
        step_ms=1000 * seconds / max(steps, 1),
        skipped=int(state.skipped),
    )


def train_together(cfgs, name: str) -> list[dict[str, Any]]:
    """The runs ``cfgs`` of estimator ``name`` (differing in seed, lr, ρ, α) as one vmapped step
    (`reproduce.sweeps.vmapped.train`), every run on the split and batches of ``cfgs[0]``'s seed.
    Returns `train`'s records without params: accuracies, gap, seconds, and ``step_ms``, the
    vmapped step's time over the number of runs."""
    cfgs = [dataclasses.replace(c, eval_train=True) for c in cfgs]
    data = data_mod.load(cfgs[0])
    seed = cfgs[0].seed
    body = vmapped.train(cfgs, name, data, "cpu", data_seed=seed, say=lambda line: None)
    seconds, steps = body["pos"]["train_seconds"], max(body["pos"]["step"], 1)
    out = []
    for cfg, summary in zip(cfgs, body["summaries"], strict=True):
        skipped = sum(h["skipped_steps"] for h in summary["history"])
        check_trained(cfg, name, skipped, body["pos"]["step"])
        f = summary["final"]
        out.append(
            dict(
                train_acc=f["train_eval_acc"],
                test_acc=f["test_acc"],
                val_acc=f.get("val_acc"),
                gap=f["train_eval_acc"] - f["test_acc"],
                seconds=seconds,
                step_ms=1000 * seconds / steps / len(cfgs),
                skipped=skipped,
            )
        )
    return out


def eval_loss(loss_fn, buffers):
    """``L(params, batch)`` in eval mode with the running statistics ``buffers`` (for the metrics)."""
    return lambda p, b: loss_fn(p, b, buffers, train=False)[0]


def flatness(params, buffers, loss_fn, batch, opt, seed: int) -> dict[str, Any]:
    """Top-k Hessian eigenvalues (Lanczos) and Hutchinson trace on ``batch``."""
    loss = eval_loss(loss_fn, buffers)
    gen = lambda k: data_mod.generator(seed, 11, k)  # noqa: E731
    eig = metrics.top_eigenvalues(params, batch, loss, k=opt.k, iters=opt.iters, generator=gen(1))
    tr = metrics.hessian_trace(params, batch, loss, samples=opt.trace_samples, generator=gen(2))
    return dict(eigenvalues=[float(v) for v in eig], trace=float(tr))


# ---------------------------------------------------------------- tables and output


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    std = float(t.std()) if len(t) > 1 else 0.0
    return float(t.mean()), std


def pm(values, digits: int = 2) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(out: Path, name: str, md: str, record: dict[str, Any], opt) -> None:
    """``<out>/<name>.md`` (the table, the command, run time, device) and ``<out>/<name>.json``."""
    seconds = time.perf_counter() - opt.started
    record = dict(record, command=opt.command_line, seconds=seconds)
    skip = ("func", "started", "out", "command_line", "options")
    used = ("command", *getattr(opt, "options", vars(opt)))  # the options this command reads
    record["settings"] = {k: v for k, v in vars(opt).items() if k not in skip and k in used}
    record["device"] = f"CPU, torch threads: {torch.get_num_threads()}"
    head = (
        f"# {name}\n\n`{record['command']}` — {record['seconds']:.0f} s on {record['device']}\n\n"
    )
    (out / f"{name}.md").write_text(head + md)
    report.write_json(out / f"{name}.json", record)
    print(head + md, flush=True)


def png(name: str) -> str:
    return name.replace("+", "_").replace(" ", "_").lower()
