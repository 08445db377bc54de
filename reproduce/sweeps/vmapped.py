"""Runs of one configuration that differ only in seed and a few hyperparameters, trained as one.

N runs of ``reproduce/train.py``'s configuration (N `Config` s) that differ in
``seed`` and in the fields of `PER_MEMBER` only become N members of one
[`gamfunc.ensemble.vmap_step`][gamfunc.training.ensemble.vmap_step]: their parameters are stacked along a leading axis and every step
moves all of them at once, each with its own lr, ρ, α, ... (a grid flattened). The pieces are
train.py's own (`reproduce.build`: model, loss, estimator, optimiser and learning-rate schedule;
`reproduce.data.sets`: split, batch order), so each member's parameters equal those of a run of its
configuration alone on the same batches, to float rounding (tests/checkout/test_reproduce_vmap_sweep.py).

What is shared and what differs:

* **Data order.** Every member sees the same batches: what train.py draws from ``--seed`` for the
  data (the validation split, label noise, the order of every epoch and the augmentation of image
  data sets) comes from one seed, ``data_seed``. A member whose seed is ``data_seed`` is therefore the
  train.py run of its configuration; a member of another seed is that run with ``data_seed``'s data.
* **Seeds** differ in the initialisation of the model (``build_model(seed=...)``) only: nothing else
  here draws from them (train.py's flatness metrics at the end, whose probes it seeds with
  ``--seed``, are not measured here, and ``vmap`` refuses random operations such as dropout).
* **Hyperparameters.** A field of `PER_MEMBER` reaches the estimator or the optimiser as a
  constant schedule per member; schedules built from it (cosine, warm-up) apply per member. These
  are the fields whose consumer takes a schedule: the learning rate, ρ, α, SAM's ρ and ρ' of the
  estimators, β and γ of [`gamfunc.gam_accelerated`][gamfunc.estimators.gam_accelerated.gam_accelerated] and the weight decay of
  [`gamfunc.sgd`][gamfunc.optim.sgd.sgd] and [`gamfunc.adamw`][gamfunc.optim.adamw.adamw]. The others (model, estimator, batch size, epochs,
  momentum, ...) are one value for all: `check` names the first that differs. Momentum is a
  number to [`gamfunc.sgd`][gamfunc.optim.sgd.sgd], not a schedule, so it cannot differ per member.

Models without buffers only (the MLPs and the 1-d CNN of MNIST-1D and digits, for which this pays):
members with BatchNorm would need their running statistics stacked into the step's state and read
back from it for evaluation, which is not done here (the state stays opaque to this module). A member whose loss or update is not finite is skipped
alone; after ``max_skipped`` skipped steps in a row it is marked diverged (the others go on). At the
end each member is judged as train.py judges a run (`reproduce.run.summary.diverged`: more than
``max_skipped_fraction`` of its steps skipped, non-finite parameters or a root mean square above
``max_param_rms``, a non-finite loss at its last step): such a member's status is ``diverged``, with
the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

import gamfunc
from gamfunc.training.ensemble import stack, unstack, vmap_step
from reproduce.build import (
    CORRECT,
    build_estimator,
    build_optimizer,
    classification_loss,
    exact_hvp_backend,
    lr_schedule,
    training_loss,
)
from reproduce.config import Config, as_dict, differences
from reproduce.data import sets as data_mod
from reproduce.models import build_model
from reproduce.run.epoch import epoch_batches, train_epochs
from reproduce.run.summary import diverged

__all__ = ["PER_MEMBER", "Members", "VmapError", "check", "evaluate", "fresh_position", "train"]

STOPPED = "stopped"  # the word of the training loop when ``stop()`` turned true

# the fields that may differ between members: each reaches the step as a schedule
PER_MEMBER = ("lr", "rho", "alpha", "sam_rho", "rho_prime", "beta", "gamma", "weight_decay")
# fields that name or place a run and never change its trajectory
_FREE = ("seed", "name", "resume", "overwrite")
_WHY = {"momentum": "gamfunc.sgd takes it as a number, not a schedule"}
# settings a vmapped training does not implement: (field, is it set?, what to do instead)
_UNSUPPORTED: tuple[tuple[str, Callable[[Config], bool], str], ...] = (
    ("compile", lambda c: c.compile, "leave it out"),
    ("weights", lambda c: bool(c.weights) or c.pretrained, "members start from their seeds"),
    ("total_steps", lambda c: c.total_steps > 0, "give --epochs"),
    ("max_steps", lambda c: c.max_steps > 0, "give --epochs"),
    (
        "every",
        lambda c: c.every != 1,
        "the step picks its estimator by a Python branch on the step count, which vmap cannot take",
    ),
    (
        "when",
        lambda c: bool(c.when),
        "the step picks its estimator by a Python branch (on the step count, or on a device value "
        "read on the host), which vmap cannot take; leave it out",
    ),
)


class VmapError(ValueError):
    """These runs cannot be trained as one vmapped step; the message names the field."""


def check(cfgs: list[Config], name: str) -> list[str]:
    """The fields of `PER_MEMBER` that differ between ``cfgs`` (the runs of estimator ``name``).

    Raises:
        VmapError: a field outside `PER_MEMBER` (and ``seed``) differs, or a setting that a
            vmapped training does not implement is on; the message names the field.
    """
    first = as_dict(cfgs[0])
    varied: list[str] = []
    for cfg in cfgs[1:]:
        for key in differences(first, cfg, ignore=_FREE):
            if key not in PER_MEMBER:
                why = _WHY.get(key, "the members of one vmapped step share it")
                raise VmapError(f"--vmap cannot vary {key} per member: {why}")
            if key not in varied:
                varied.append(key)
    varied.sort(key=PER_MEMBER.index)
    cfg = cfgs[0]
    if cfg.rho_schedule == "proportional" and {"lr", "rho"} & set(varied):
        raise VmapError(
            "--vmap cannot vary lr or rho per member with rho_schedule=proportional "
            "(ρ_t = ρ·lr_t/lr_0 is formed from numbers)"
        )
    if "sam_rho" in varied and any(c.sam_rho == 0 for c in cfgs):
        raise VmapError("--vmap: sam_rho=0 means 'the same as rho'; vary rho or give sam_rho > 0")
    for key, on, instead in _UNSUPPORTED:
        if on(cfg):
            raise VmapError(f"--vmap does not implement {key}: {instead}")
    return varied


class Members:
    """The vmapped step of N members, their stacked parameters, state and evaluation loss."""

    def __init__(self, cfgs: list[Config], name: str, data: data_mod.Data, device):
        varied = check(cfgs, name)
        cfg = cfgs[0]
        models = [
            build_model(c.model, data.num_classes, data.image_size, seed=c.seed) for c in cfgs
        ]
        if any(True for _ in models[0].buffers()):
            raise VmapError(
                f"--vmap trains models without buffers; {cfg.model} has BatchNorm running statistics"
            )
        plain = classification_loss(models[0], cfg.label_smoothing)
        self.loss_fn = training_loss(plain, cfg)
        one = [{k: v.detach().to(device) for k, v in m.named_parameters()} for m in models]
        self.params = stack(one)
        self.steps_per_epoch = len(data.train) // cfg.batch_size
        if self.steps_per_epoch < 1:
            raise VmapError(f"batch_size {cfg.batch_size} exceeds the {len(data.train)} examples")
        hvp = exact_hvp_backend(cfg, models[0])
        spe = self.steps_per_epoch

        def scalar_loss(p, batch):  # no buffers: the scalar form of the loss
            return plain(p, batch, {})[0]

        step_loss = training_loss(scalar_loss, cfg)

        def build(**h):
            """One member's step: its values of ``varied`` are constant schedules ``h[k]``."""
            zero = torch.zeros((), dtype=torch.int64)
            c = dataclasses.replace(
                cfg, **h
            )  # the member's schedules, read by estimator and optimiser
            lr = lr_schedule(
                dataclasses.replace(cfg, **{k: h[k](zero) for k in h if k == "lr"}), spe
            )
            if not callable(lr):  # constant: the member's own value
                lr = h.get("lr", lr)
            estimator, _ = build_estimator(c, name, lr, hvp)  # no policy here: no base
            optimizer = build_optimizer(c, lr, one[0])  # the member's weight decay
            return gamfunc.make_step(estimator, optimizer, step_loss)

        values = varied or ["lr"]  # vmap_step needs one; lr is then the same for every member
        hparams = {
            k: torch.tensor(
                [float(getattr(c, k)) for c in cfgs], dtype=torch.float64, device=device
            )
            for k in values
        }
        self.step = vmap_step(build, hparams)
        self.state = self.step.init(self.params)
        self.varied = varied


@torch.no_grad()
def evaluate(loss_fn, params, examples, batch_size: int, device) -> dict[str, Tensor]:
    """Each member's mean loss and top-1 accuracy (%) over ``examples`` in eval mode, as tensors of
    N values (``reproduce.run.evaluation.evaluate`` of every member, in one vmapped pass per batch)."""

    def one(p, x, y):
        loss, aux = loss_fn(p, (x, y), {}, train=False)
        return loss, aux[CORRECT]

    each = torch.func.vmap(one, in_dims=(0, None, None))
    loss_sum = correct = None
    seen = 0
    for x, y in data_mod.eval_batches(examples, batch_size):
        loss, right = each(params, x.to(device), y.to(device))
        loss_sum = loss.double() * len(y) + (0 if loss_sum is None else loss_sum)
        correct = right + (0 if correct is None else correct)
        seen += len(y)
    return {"loss": loss_sum / seen, "acc": 100.0 * correct.double() / seen}


def _leaves(state) -> list:
    """The step state as a list of its leaves on the CPU: a checkpoint that ``torch.load`` reads with
    ``weights_only=True`` whatever the state's type (it stays opaque here)."""
    return [t.cpu() if isinstance(t, Tensor) else t for t in pytree.tree_leaves(state)]


def _restore(leaves: list, template, device):
    """``template`` (a fresh state) with the saved ``leaves`` put back, on ``device``."""
    now, spec = pytree.tree_flatten(template)
    same = len(now) == len(leaves) and all(
        not isinstance(a, Tensor) or (isinstance(b, Tensor) and a.shape == b.shape)
        for a, b in zip(now, leaves, strict=False)
    )
    if not same:
        raise VmapError("the checkpoint's step state does not match these members")
    return pytree.tree_unflatten(
        [t.to(device) if isinstance(t, Tensor) else t for t in leaves], spec
    )


def fresh_position(n: int) -> dict[str, Any]:
    """Where a vmapped training of ``n`` members starts: epoch 0, nothing summed or recorded."""
    return {
        "epoch": 0,
        "batch": 0,
        "step": 0,
        "train_seconds": 0.0,
        "sums": {"loss": [0.0] * n, "seen": [0] * n, "skipped": [0] * n},
        "run_of_skips": [0] * n,
        "diverged": [False] * n,
        "history": [[] for _ in range(n)],
        "best": [None] * n,
    }


def train(
    cfgs: list[Config],
    name: str,
    data: data_mod.Data,
    device,
    *,
    data_seed: int,
    saved: dict | None = None,
    save: Callable[[dict], None] | None = None,
    stop: Callable[[], bool] | None = None,
    say: Callable[[str], None] = print,
) -> dict:
    """Train the runs ``cfgs`` of estimator ``name`` as one vmapped step on ``data`` (loaded with
    ``data_seed``); returns the last body (below), whose ``summaries`` hold one summary per member.

    A member's summary is ``{"status": "finished" | "diverged", "reason": why it diverged (None
    when it finished; `_judge`), "final": the last epoch's record,
    "best_val": the best validation epoch's {val_acc, epoch, test_acc}, "history", "config"}``, the
    keys of train.py's ``summary.json`` that a sweep reads (a record holds ``train_loss``, the test
    and validation loss and accuracy, and with ``eval_train`` those of the training set in eval
    mode, ``train_eval_*``). A body is ``{"params", "state", "pos",
    "finished", "summaries"}``: ``save(body)`` is called after every epoch and after the step at
    which ``stop()`` turned true (training then returns that body, unfinished); given as ``saved``,
    training continues from it.

    Raises:
        VmapError: the runs cannot be one vmapped step (`check`).
    """
    cfg = cfgs[0]
    m = Members(cfgs, name, data, device)
    params, state = m.params, m.state
    pos = fresh_position(len(cfgs))
    if saved is not None:
        params = {k: v.to(device) for k, v in saved["params"].items()}
        state, pos = _restore(saved["state"], state, device), saved["pos"]
    say(
        f"[vmap] {len(cfgs)} members of {name} in one step ({', '.join(m.varied) or 'seeds'} "
        f"per member), {m.steps_per_epoch} steps per epoch on {device}"
    )

    def body(summaries=None) -> dict:
        return {
            "params": {k: v.cpu() for k, v in params.items()},
            "state": _leaves(state),
            "pos": pos,
            "finished": summaries is not None,
            "summaries": summaries,
        }

    t: dict[str, Tensor] = {}  # the epoch's sums, on the device
    last: dict[str, Tensor] = {}  # each member's loss at the last step taken in this process

    def batches(epoch: int, first: int):
        t.clear()
        t.update(
            {
                k: torch.tensor(
                    v, dtype=torch.float64 if k == "loss" else torch.int64, device=device
                )
                for k, v in pos["sums"].items()
            }
        )
        t.update({k: torch.tensor(pos[k], device=device) for k in ("run_of_skips", "diverged")})
        return epoch_batches(data.train, data_seed, cfg.batch_size)(epoch, first)

    def step(batch) -> dict:
        nonlocal params, state
        x, y = batch
        params, state, metrics = m.step(params, state, (x.to(device), y.to(device)))
        return metrics

    def after_step(metrics: dict, batch) -> str | None:
        n = len(batch[1])
        ok = metrics["skipped"] == 0
        last["loss"] = metrics["loss"]
        t["loss"] = t["loss"] + torch.where(ok, metrics["loss"].double() * n, 0.0)
        t["seen"] = t["seen"] + ok.long() * n
        t["skipped"] = t["skipped"] + (~ok).long()
        t["run_of_skips"] = torch.where(ok, 0, t["run_of_skips"] + 1)
        if cfg.max_skipped:
            t["diverged"] = t["diverged"] | (t["run_of_skips"] >= cfg.max_skipped)
        pos["step"] += 1
        return STOPPED if stop is not None and stop() else None

    def end(stopped: str | None) -> str | None:
        pos["sums"] = {k: t[k].tolist() for k in pos["sums"]}
        pos.update({k: t[k].tolist() for k in ("run_of_skips", "diverged")})
        if pos["batch"] < m.steps_per_epoch:  # stopped mid-epoch
            if save is not None:
                save(body())
            return stopped
        _end_of_epoch(cfg, m, params, data, pos, device)
        say(_epoch_line(cfg, pos))
        if pos["epoch"] < cfg.epochs:
            if save is not None:
                save(body())
            if stop is not None and stop():
                return STOPPED
        return None

    if train_epochs(step, batches, pos, cfg.epochs, after_step, end) is not None:
        return body()
    why = _judge(cfgs, params, state, pos, last.get("loss"))
    summaries = [
        {
            "status": "finished" if why[i] is None else "diverged",
            "reason": why[i],
            "final": pos["history"][i][-1],
            "best_val": pos["best"][i],
            "history": pos["history"][i],
            "train_seconds_all_members": round(pos["train_seconds"], 2),
            "data_seed": data_seed,
            "config": as_dict(c),
        }
        for i, c in enumerate(cfgs)
    ]
    if save is not None:
        save(body(summaries))
    return body(summaries)


def _judge(cfgs: list[Config], params, state, pos: dict, last_loss: Tensor | None) -> list:
    """Why each member did not train, or None where it did: ``max_skipped`` skipped steps in a row
    during the training, else train.py's judgement of a run at its end
    (`reproduce.run.summary.diverged`) on the member's own parameters, step state and last loss."""
    n = len(cfgs)
    losses = [None] * n if last_loss is None else list(last_loss.cpu())
    out: list[str | None] = []
    for i, (c, p, s) in enumerate(zip(cfgs, unstack(params), unstack(state), strict=True)):
        if pos["diverged"][i]:
            out.append(
                f"--max_skipped={c.max_skipped} steps in a row were skipped as non-finite; "
                "lower --lr or check the data"
            )
        else:
            out.append(diverged(c, p, s, pos["step"], losses[i]))
    return out


def _end_of_epoch(cfg: Config, m: Members, params, data, pos: dict, device) -> None:
    """Each member's epoch record (mean training loss of its finite steps; test and validation
    loss and accuracy at evaluation epochs), its best validation epoch; the next epoch's sums."""
    epoch = pos["epoch"]
    last = epoch + 1 == cfg.epochs
    scores: dict[str, list[float]] = {}
    if (epoch + 1) % cfg.eval_every == 0 or last:
        probe = data.probe if cfg.eval_train else None
        for split, ds in (("test", data.test), ("val", data.val), ("train_eval", probe)):
            if ds is not None:
                s = evaluate(m.loss_fn, params, ds, cfg.eval_batch_size, device)
                scores |= {f"{split}_{k}": v.tolist() for k, v in s.items()}
    for i in range(len(pos["history"])):
        n = pos["sums"]["seen"][i]
        record = {
            "epoch": epoch + 1,
            "step": pos["step"],
            "train_loss": pos["sums"]["loss"][i] / n if n else None,
            "skipped_steps": pos["sums"]["skipped"][i],
        } | {k: v[i] for k, v in scores.items()}
        pos["history"][i].append(record)
        best = pos["best"][i]
        if "val_acc" in record and (best is None or record["val_acc"] > best["val_acc"]):
            pos["best"][i] = {
                "val_acc": record["val_acc"],
                "epoch": epoch + 1,
                "test_acc": record.get("test_acc"),
            }
    pos.update(epoch=epoch + 1, batch=0, sums=fresh_position(len(pos["history"]))["sums"])


def _epoch_line(cfg: Config, pos: dict) -> str:
    records = [h[-1] for h in pos["history"]]
    losses = [r["train_loss"] for r in records if r["train_loss"] is not None]
    line = f"[vmap] epoch {pos['epoch']}/{cfg.epochs}: {pos['train_seconds']:.1f} s"
    if losses:
        line += f", train loss {min(losses):.4f}..{max(losses):.4f}"
    vals = [r["val_acc"] for r in records if r.get("val_acc") is not None]
    if vals:
        line += f", val acc {min(vals):.2f}..{max(vals):.2f}%"
    skipped = sum(r["skipped_steps"] for r in records)
    # the end judges each member (`_judge`); here: the steps skipped, and --max_skipped in a row
    return line + f", {skipped} member steps skipped, {sum(pos['diverged'])} past --max_skipped"
