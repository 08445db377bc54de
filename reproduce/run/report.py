"""What a run tells its reader: progress bars, epoch lines, TensorBoard scalars, the images/s meter,
summaries on disk and the comparison table. Only rank 0 of a job writes any of it."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.methods import SAM_LIKE
from reproduce.run.launch import wait_for

__all__ = [
    "CHANCE_MARGIN",
    "Meter",
    "NullWriter",
    "at_chance",
    "epoch_line",
    "flags",
    "log_step",
    "open_writer",
    "progress",
    "save_figure",
    "table",
    "tag",
    "train_accuracy",
    "write_json",
]


class NullWriter:
    """A TensorBoard writer that writes nothing: what ranks other than 0 log to."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def progress(iterable=None, **kw):
    """A tqdm bar on a terminal (and when ``enabled``), a silent pass-through otherwise."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not (kw.pop("enabled", True) and sys.stderr.isatty()), **kw)


def strict(obj: Any) -> Any:
    """``obj`` as strict JSON can hold it: NaN and ±inf become None (null), 0-d tensors and numpy
    scalars their Python value, tuples lists; anything else unknown its ``str``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(v) for v in obj]
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return strict(obj.item())
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return strict(obj.item())
    return str(obj)


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (`strict`): it parses under any JSON parser, ``jq`` too."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)


def write_json(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as strict JSON (`dumps`; null for a missing or non-finite value)
    atomically: a temporary file renamed over ``path``. Every JSON file the project writes goes
    through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(dumps(obj) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a full disk: the error names the file (a failed write names none)
        tmp.unlink(missing_ok=True)
        if e.errno is not None and not e.filename:
            e.filename = str(path)
        raise


def save_figure(figure, path: Path | str, **kwargs) -> None:
    """``figure.savefig(path, **kwargs)``, whose failure on a full disk names ``path`` (matplotlib's
    write names no file), as `write_json`'s does."""
    try:
        figure.savefig(path, **kwargs)
    except OSError as e:
        if e.errno is not None and not e.filename:
            e.filename = str(path)
        raise


def open_writer(run_dir: Path, purge_step: int | None = None):
    """TensorBoard's ``SummaryWriter`` into ``run_dir``, whose background thread fails quietly.

    TensorBoard writes events on a thread of its own; a write that fails there (a full disk) is
    printed by the thread as a traceback, then raised again in the thread that writes next. Here
    the thread prints nothing, and the error it raises names the events file, so that the run's
    one line on the failure is all that is printed.

    Args:
        run_dir: the run's folder.
        purge_step: as ``SummaryWriter``'s (the steps of a resumed run to write again).

    Returns:
        The writer.

    Raises:
        OSError: the events file cannot be created or written (its ``filename`` names it).
    """
    from torch.utils.tensorboard import SummaryWriter

    _quiet_writer_threads()
    try:
        return SummaryWriter(str(run_dir), purge_step=purge_step)
    except OSError as e:
        if e.errno is not None and not e.filename:
            e.filename = _events_file(run_dir)
        raise


def _events_file(run_dir: Path) -> str:
    """The newest events file in ``run_dir`` (the one being written), or the folder."""
    files = sorted(Path(run_dir).glob("events.out.tfevents.*"), key=lambda f: f.stat().st_mtime)
    return str(files[-1] if files else run_dir)


def _quiet_writer_threads() -> None:
    """Install (once) a ``threading.excepthook`` that leaves an ``OSError`` of TensorBoard's
    writer thread unprinted, naming its events file: the writer raises it again in the thread that
    writes next. Other threads' errors go to the hook before it."""
    import threading

    if getattr(threading.excepthook, "quiet_writer", False):
        return
    before = threading.excepthook

    def hook(args) -> None:
        thread = args.thread
        if isinstance(args.exc_value, OSError) and type(thread).__name__ == "_AsyncWriterThread":
            writer = getattr(getattr(thread, "_record_writer", None), "_writer", None)
            name = getattr(writer, "filename", None) or getattr(writer, "name", None)
            name = os.fsdecode(name) if isinstance(name, bytes) else name
            if args.exc_value.errno is not None and not args.exc_value.filename:
                args.exc_value.filename = name
            return
        before(args)

    hook.quiet_writer = True
    threading.excepthook = hook


class Meter:
    """Images per second between synchronisation points (logging steps), for TensorBoard and the summary.

    The first interval after construction (compilation, warm-up) is not added to the totals
    ``pos["timed_images"]`` and ``pos["timed_seconds"]``; ``mark`` restarts an interval after work that
    is not training (evaluation, checkpoints).
    """

    def __init__(self, device: torch.device, pos: dict):
        self.device, self.pos, self.warm = device, pos, False
        self.mark()

    def _now(self) -> float:
        wait_for(self.device)
        return time.perf_counter()

    def mark(self) -> None:
        self.start, self.images = self._now(), 0

    def count(self, images: int) -> None:
        self.images += images

    def lap(self) -> float:
        now = self._now()
        rate = self.images / max(now - self.start, 1e-9)
        if self.warm:
            self.pos["timed_images"] += self.images
            self.pos["timed_seconds"] += now - self.start
        self.warm = True
        self.start, self.images = now, 0
        return rate

    def rate(self) -> float | None:
        return (
            self.pos["timed_images"] / self.pos["timed_seconds"]
            if self.pos["timed_seconds"]
            else None
        )


def log_step(tblog, writer, metrics, state, step: int, images_per_s: float) -> None:
    """The step's scalars: loss, lr and ρ, the estimator's norms, speed and skipped steps."""
    groups = {
        "step/": ("loss",),
        "opt/": ("lr", "rho"),
        "grad/": ("grad_norm", "f_norm", "adv_grad_norm", "adv_loss", "perturbed_loss"),
        "theory/": ("overall_grad_sq", "penalty_grad_sq"),  # Theorem 4.3's two squared norms
    }
    for prefix, keys in groups.items():
        tblog.scalars(writer, {k: metrics[k] for k in keys if k in metrics}, step, prefix)
    tblog.scalars(writer, {"images_per_s": images_per_s}, step, "perf/")
    tblog.scalars(writer, {"skipped_total": state.skipped}, step, "train/")


def tag(key: str) -> str:
    """``test_acc`` → ``test/acc``; ``lambda_max`` → ``flatness/lambda_max``."""
    if key in ("lambda_max", "trace", "r1"):
        return f"flatness/{key}"
    split, _, what = key.rpartition("_")
    return f"{split}/{what}" if split else key


def epoch_line(name: str, cfg: Config, record: dict) -> str | None:
    """The line printed after an epoch (about five per run, and the last), or None."""
    every = max(cfg.epochs // 5, 1)
    if record["epoch"] % every and record["epoch"] != cfg.epochs:
        return None
    loss = record["train_loss"]
    parts = [
        f"[{name}] epoch {record['epoch']}/{cfg.epochs}",
        f"train loss {loss:.4f}" if loss is not None else "train loss n/a (every step skipped)",
    ]
    if record.get("skipped_steps"):
        parts.append(f"{record['skipped_steps']} step(s) skipped (non-finite)")
    for split in ("val", "test"):
        if f"{split}_acc" in record:
            top5 = record.get(f"{split}_top5")
            extra = (
                f" (top-5 {top5:.2f}%)" if top5 is not None and cfg.dataset == "imagenet" else ""
            )
            parts.append(f"{split} acc {record[f'{split}_acc']:.2f}%{extra}")
    return ", ".join(parts)


# A training accuracy is at chance when it is at most (1 + CHANCE_MARGIN) × 100/K % for K classes:
# 15% for 10 classes, 1.5% for 100. Untrained MLPs on MNIST-1D and digits start at 7.7-12.9% (seeds
# 0-3), and finite-difference GAM runs that collapsed to one class ended at 10-16% (reproduce/RESULTS.md).
CHANCE_MARGIN = 0.5


def at_chance(accuracy: float | None, num_classes: int) -> bool:
    """Whether a training accuracy in % is at chance (or below): accuracy ≤ (1 + CHANCE_MARGIN)·100/K."""
    if accuracy is None or num_classes < 1:
        return False
    return accuracy <= (1 + CHANCE_MARGIN) * 100.0 / num_classes


def train_accuracy(final: dict) -> float | None:
    """The final training accuracy of a run, as its table shows it: over the training set in eval
    mode (``train_eval_acc``) where measured, else the running accuracy of the last epoch."""
    return final.get("train_eval_acc", final.get("train_acc"))


def flags(final: dict | None, num_classes: int, skipped: int = 0) -> list[str]:
    """What the summary flags about a finished run.

    Args:
        final: its final record (None: it did not finish).
        num_classes: the classes of its data.
        skipped: its skipped (non-finite) steps.

    Returns:
        ``"chance_level"`` when its final training accuracy is at chance (`at_chance`): it
            did not learn; ``"skipped_steps"`` when some of its steps were skipped, fewer than make it
            diverged: it trained on the others.
    """
    if not final:
        return []
    out = ["chance_level"] if at_chance(train_accuracy(final), num_classes) else []
    return out + (["skipped_steps"] if skipped else [])


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return format("-", f">{spec.split('.')[0]}")
    return format(v, spec)


def table(summaries: list[dict]) -> str:
    """The comparison table printed at the end of a run."""
    has_val = any(s["best_val"] is not None for s in summaries)
    labels = [s["estimator"] + _label_hparams(s) for s in summaries]
    w = max([26, *(len(label) + 1 for label in labels)])  # a long label widens the column
    head = f"{'estimator':<{w}}{'train acc':>10}{'test acc':>10}{'gap':>8}"
    head += f"{'val acc':>9}" if has_val else ""
    head += f"{'λ_max':>10}{'trace':>10}{'R1':>10}{'img/s':>9}{'time':>8}"
    rows = [head, "-" * len(head)]
    for s, label in zip(summaries, labels, strict=True):
        f = s["final"] or {}
        train = train_accuracy(f)
        test = f.get("test_acc")
        gap = None if train is None or test is None else train - test
        row = f"{label:<{w}}{_fmt(train, '10.2f')}{_fmt(test, '10.2f')}{_fmt(gap, '8.2f')}"
        if has_val:
            row += _fmt(f.get("val_acc"), "9.2f")
        row += f"{_fmt(f.get('lambda_max'), '10.2f')}{_fmt(f.get('trace'), '10.1f')}{_fmt(f.get('r1'), '10.4f')}"
        row += f"{s['images_per_s']:>9.0f}{s['train_seconds']:>7.0f}s"
        if "chance_level" in s.get("flags", ()):
            row += "  (chance)"
        if "skipped_steps" in s.get("flags", ()):
            row += f"  ({s['skipped_steps']} of {s['steps']} steps skipped)"
        rows.append(row)
    if any("chance_level" in s.get("flags", ()) for s in summaries):
        rows.append(
            f"(chance): training accuracy at most {1 + CHANCE_MARGIN:g} × chance (100/classes %); "
            "the run did not learn"
        )
    return "\n".join(rows)


def _label_hparams(s: dict) -> str:
    c, e = s["config"], s["estimator"]
    if e in ("sgd",):
        return ""
    if e in SAM_LIKE:  # SAM's radius, and no α of GAM
        return f" ρ={c.get('sam_rho') or c['rho']:g}"
    if e == "gnp":
        return f" α={c['alpha']:g}"
    extra = f", 1/{c['every']}" if c["every"] > 1 else ""
    return f" ρ={c['rho']:g},α={c['alpha']:g}{extra}"
