"""The command line of `reproduce.evidence`: one subcommand per claim module, the options they
share with their full and ``--quick`` values, and `main`."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from reproduce.config import Config, validate
from reproduce.evidence.ablation import ablation_table, cmd_ablation
from reproduce.evidence.accuracy import cmd_accuracy
from reproduce.evidence.common import METHODS, NotTrained
from reproduce.evidence.family import cmd_family, family_table
from reproduce.evidence.fd import cmd_fd, fd_table
from reproduce.evidence.grid import accuracy_table
from reproduce.evidence.landscape import cmd_landscape, landscape_table
from reproduce.evidence.minima import cmd_minima, minima_table
from reproduce.evidence.noise import cmd_noise, noise_table
from reproduce.evidence.reuse import cmd_reuse, reuse_table
from reproduce.evidence.spectra import cmd_spectra, spectra_table
from reproduce.evidence.variants import cmd_variants, variants_table

PROG = "python -m reproduce.evidence"
DESCRIPTION = (
    "The paper's claims measured in miniature on MNIST-1D: one subcommand per table or figure."
)

SUBCOMMANDS = {
    "spectra": cmd_spectra,
    "accuracy": cmd_accuracy,
    "noise": cmd_noise,
    "minima": cmd_minima,
    "landscape": cmd_landscape,
    "ablation": cmd_ablation,
    "variants": cmd_variants,
    "fd": cmd_fd,
    "family": cmd_family,
    "reuse": cmd_reuse,
}

# subcommand -> its markdown table from its JSON record (tests/test_docs.py recomputes the tables
# of reproduce/RESULTS.md from the JSON committed under docs/evidence/ with these)
TABLES = {
    "spectra": spectra_table,
    "accuracy": accuracy_table,
    "noise": noise_table,
    "fd": fd_table,
    "minima": minima_table,
    "landscape": landscape_table,
    "ablation": ablation_table,
    "variants": variants_table,
    "family": family_table,
    "reuse": reuse_table,
}

REUSE = "runs/evidence/spectra/spectra.json"
# the subcommands whose runs --vmap can train together (the others measure each run on its own)
VMAP = ("ablation", "accuracy", "noise")

# (full, --quick) values of the shared options.
DEFAULTS = dict(
    model=("mlp", "mlp"),
    epochs=(100, 2),
    seeds=(5, 1),
    k=(50, 5),
    iters=(150, 20),
    trace_samples=(100, 5),
    probe=(1000, 200),
    directions=(100, 10),
    points=(21, 5),
    rhos=("0,0.1,0.5,1", "0,0.5"),
    alphas=("0.3,1,3", "1"),
    levels=("0.2,0.4,0.6,0.8", "0.4"),
    radii=("0.1,0.01,0.001,0.0001", "0.01,0.001"),
)
# Full values that differ per subcommand: each full run stays under 30 minutes on one thread.
FULL = {
    "ablation": dict(seeds=3),
    "noise": dict(seeds=3),
    "fd": dict(seeds=3),
    "family": dict(seeds=2),
    "reuse": dict(seeds=3),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``error: ...``) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    for name, func in SUBCOMMANDS.items():
        summary = (func.__doc__ or name).split("\n")[0]
        # argparse %-formats help strings: a bare % (as in "20/40/60/80%") must be doubled
        s = sub.add_parser(name, help=summary.replace("%", "%%"), description=summary)
        s.set_defaults(func=func)
        s.add_argument(
            "--quick",
            action="store_true",
            help="2 epochs, 1 seed, small metrics: under a minute (for tests)",
        )
        s.add_argument("--out", default=None, help="output folder (runs/evidence/<subcommand>)")
        s.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
        s.add_argument(
            "--gnp-alpha", type=float, default=0.1, help="α of GNP (0.1: best on validation)"
        )
        s.add_argument("--radius", type=float, default=0.1, help="ρ of minima density")
        s.add_argument("--methods", default=",".join(METHODS),
                       help="spectra, accuracy: the methods to train (a comma list)")  # fmt: skip
        s.add_argument("--gam", default=None,
                       help="ρ,α of GAM in SGD+GAM (default: 0.5,1)")  # fmt: skip
        s.add_argument("--sam-gam", default=None,
                       help="ρ,α of GAM in SAM+GAM (default: GAM's 0.5,1)")  # fmt: skip
        s.add_argument("--sam-rho", type=float, default=0.0,
                       help="ablation: SAM+GAM around a SAM oracle of this ρ (0: plain GAM)")  # fmt: skip
        s.add_argument("--reuse", default=REUSE,
                       help="accuracy: take the runs of this spectra JSON if it exists")  # fmt: skip
        for key, (full, _) in DEFAULTS.items():
            s.add_argument(f"--{key.replace('_', '-')}", type=type(full), default=None)
        if name in VMAP:
            s.add_argument("--vmap", action="store_true",
                           help="train each estimator's runs as one vmapped step (seed 0's data)")  # fmt: skip
        else:
            s.set_defaults(vmap=False)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand of ``argv`` (default: the command line's).

    Args:
        argv: the arguments after the program's name.

    Returns:
        The exit status: 0 when it has written its files; 2 for a bad value or an output folder
            that cannot be written (one line on stderr, before any training); 3 when one of its runs
            did not train (train.py's rules on skipped steps), naming the run, with no table written.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    opt = parser().parse_args(argv)
    try:
        _prepare(opt, argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except OSError as e:
        print(f"error: --out={opt.out}: cannot write there ({e.strerror or e})", file=sys.stderr)
        return 2
    try:
        opt.func(opt)
    except NotTrained as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 3
    return 0


# Options that set a field of train.py's configuration, checked by its validator (option: field).
_FIELDS = {"epochs": "epochs", "model": "model", "gnp_alpha": "alpha", "sam_rho": "sam_rho"}
_LISTS = {"rhos": "rho", "alphas": "alpha", "levels": "label_noise"}
_COUNTS = ("seeds", "k", "iters", "trace_samples", "probe", "directions")


def _field(option: str, field: str, value) -> None:
    """Check ``value`` for train.py's ``field`` with its validator; a ValueError naming ``option``."""
    try:
        validate(dataclasses.replace(Config(), **{field: value}))
    except ValueError as e:
        raise ValueError(f"--{option.replace('_', '-')}={value!r}: {e}") from None
    except TypeError:
        raise ValueError(f"--{option.replace('_', '-')} takes a number; got {value!r}") from None


def _numbers(option: str, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--{option} takes a comma list of numbers; got {text!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"--{option} takes finite numbers; got {text!r}")
    return values


def _prepare(opt, argv: list[str]) -> None:
    """Fill in ``opt``'s defaults and check every value, before anything trains (ValueError)."""
    opt.started = time.perf_counter()
    opt.command_line = f"{PROG} {shlex.join(argv)}"  # what the JSON records as its command
    for key, (full, quick) in DEFAULTS.items():
        full = FULL.get(opt.command, {}).get(key, full)
        if getattr(opt, key) is None:
            setattr(opt, key, quick if opt.quick else full)
    opt.methods = [m.strip() for m in opt.methods.split(",") if m.strip()]
    unknown = [m for m in opt.methods if m not in METHODS]
    if unknown or not opt.methods:
        raise ValueError(
            f"--methods must name some of {list(METHODS)}; got {unknown or opt.methods}"
        )
    for key in _COUNTS:
        if getattr(opt, key) < 1:
            raise ValueError(
                f"--{key.replace('_', '-')} must be an integer >= 1; got {getattr(opt, key)}"
            )
    if opt.points < 2:
        raise ValueError(f"--points must be an integer >= 2; got {opt.points}")
    for option, field in _FIELDS.items():
        _field(option, field, getattr(opt, option))
    for option, field in _LISTS.items():
        for v in _numbers(option, getattr(opt, option)):
            _field(option, field, v)
    if opt.command == "ablation" and opt.sam_rho > 0 and 0 in _numbers("rhos", opt.rhos):
        raise ValueError(
            "--rhos must not contain 0 with --sam-rho (ρ = 0 is GNP, without an oracle)"
        )
    if not all(r > 0 for r in _numbers("radii", opt.radii)):
        raise ValueError(f"--radii must be numbers > 0; got {opt.radii!r}")
    if not 0 < opt.radius < math.inf:
        raise ValueError(f"--radius must be a finite number > 0; got {opt.radius!r}")
    for key in ("gam", "sam_gam"):
        text = getattr(opt, key)
        if text is not None:
            flag = f"--{key.replace('_', '-')}"
            values = _numbers(key.replace("_", "-"), text)
            if len(values) != 2:
                raise ValueError(f"{flag} takes ρ,α; got {text!r}")
            _field(key, "rho", values[0])
            _field(key, "alpha", values[1])
            setattr(opt, key, tuple(values))
    cores = os.cpu_count() or 1
    if not 0 <= opt.threads <= cores:
        raise ValueError(
            f"--threads must be in [0, {cores}] (this machine's cores); got {opt.threads}"
        )
    if opt.threads:
        torch.set_num_threads(opt.threads)
    opt.out = Path(opt.out or f"runs/evidence/{opt.command}")
    opt.out.mkdir(parents=True, exist_ok=True)
    if not os.access(opt.out, os.W_OK):
        raise OSError(13, "permission denied")
    if (opt.quick or opt.vmap) and opt.reuse == REUSE:
        opt.reuse = ""  # --quick never reads a full run's results, --vmap trains its own
