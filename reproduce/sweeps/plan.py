"""A sweep's plan: every cell of the grid × every seed, resolved into ``train.py`` runs before any trains.

Shared by ``reproduce/sweep.py`` (a run per process) and ``reproduce/sweeps/vmap_grid.py`` (every run in
one vmapped step).
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from pathlib import Path

from reproduce.config import Config, estimators_of, resolve, run_name

__all__ = ["Cell", "Run", "SweepError", "check_writable", "other_settings", "plan"]


class SweepError(ValueError):
    """The sweep cannot run as asked; the message says why."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One combination of the grid's values: ``((key, text), ...)`` in grid order."""

    values: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        """``rho=0.05,alpha=0.1``: the cell's folder under the sweep's and its name in the tables."""
        return ",".join(f"{k}={v}" for k, v in self.values) or "base"


@dataclasses.dataclass(frozen=True)
class Run:
    """One ``train.py`` run of a sweep: a cell and a seed."""

    cell: Cell
    seed: int
    argv: tuple[str, ...]  # train.py's command line (without a device)
    config: Config  # its resolved configuration
    run_dir: Path  # <logdir>/<name>/<estimator>: where summary.json is written


def other_settings(where: Path, what: str, diff: dict) -> SweepError:
    """The refusal of a folder that holds ``what`` (a finished run, a vmapped sweep) made with other
    settings: ``diff`` maps each differing field to (its value there, its value here)."""
    shown = ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items())
    return SweepError(
        f"{str(where)!r} holds {what} of other settings ({shown}); give the sweep another --name "
        "or remove that folder"
    )


def plan(
    rest: list[str], grid: list[tuple[str, list[str]]], seeds: list[int], name: str = ""
) -> tuple[str, Path, list[Run]]:
    """``(sweep name, sweep folder, runs)``: every cell × seed resolved and checked before any trains.

    Runs are ordered seed by seed (every cell of the first seed, then the next), so a partial sweep
    already compares every cell.

    Raises:
        SweepError: a value is invalid for its field, a cell trains other than one estimator, or there
            is no validation split to select on.
    """
    try:
        base_cfg = resolve(rest)
    except ValueError as e:
        raise SweepError(f"train.py arguments: {e}") from None
    name = name or f"sweep.{run_name(base_cfg)}"
    root = Path(base_cfg.logdir).expanduser() / name
    cells = [
        Cell(tuple(zip([k for k, _ in grid], combo, strict=True)))
        for combo in itertools.product(*(vs for _, vs in grid))
    ]
    runs = []
    for seed, cell in itertools.product(seeds, cells):
        argv = (
            *rest,
            *(f"--{k}={v}" for k, v in cell.values),
            f"--seed={seed}",
            f"--name={name}/{cell.label}/seed={seed}",
            "--resume",
        )
        try:
            cfg = resolve(list(argv))
        except ValueError as e:
            raise SweepError(f"cell {cell.label}: {e}") from None
        estimators = estimators_of(cfg)
        if len(estimators) != 1:
            raise SweepError(
                f"a sweep trains one estimator per cell; got --estimator={cfg.estimator}: pass "
                f"one after -- or compare them with --grid=estimator={','.join(estimators)}"
            )
        if cfg.val_fraction <= 0:
            raise SweepError(
                "the sweep selects on a validation split and this configuration has none: add "
                "--val_fraction=0.1 after -- (the paper holds out 10% of the training set); the "
                "test split is never used for selection"
            )
        run_dir = Path(cfg.logdir).expanduser() / run_name(cfg) / estimators[0]
        runs.append(Run(cell, seed, argv, cfg, run_dir))
    return name, root, runs


def check_writable(opts, root: Path) -> None:
    """Check at start-up that the sweep can write what it writes: its runs under ``root``
    (``<logdir>/<name>``) and its tables in ``--out`` (``root`` without it), each made if need be
    and a file written and removed there; otherwise every cell would train and the sweep fail at
    its end.

    Args:
        opts: the sweep's options (``out``).
        root: the sweep's folder.

    Raises:
        SweepError: a folder cannot be made or written (naming ``--logdir`` or ``--out``).
    """
    out = Path(opts.out).expanduser() if opts.out else None
    for flag, folder in (("--logdir (after --)", root), ("--out", out)):
        if folder is None:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            raise SweepError(
                f"{flag}: cannot write {str(folder)!r} ({e.strerror or type(e).__name__}); "
                "name a folder this process can write"
            ) from None
