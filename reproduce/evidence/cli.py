"""The command line of `reproduce.evidence`: one subcommand per claim module, the options they
share with their full and ``--quick`` values, and `main`."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from reproduce.config import Config, validate
from reproduce.data import sets as data_mod
from reproduce.evidence.ablation import ablation_table, cmd_ablation
from reproduce.evidence.accuracy import cmd_accuracy, reused_runs
from reproduce.evidence.cheap_report import cheap_table
from reproduce.evidence.common import METHODS, NotMeasured, NotTrained, base_config
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


# subcommand -> its markdown table from its JSON record (tests/checkout/test_docs.py recomputes the tables
# of reproduce/RESULTS.md from the JSON committed under reproduce/results/ with these)
def _fmnist_table(record: dict) -> str:
    # imported here: ``python -m reproduce.evidence.fmnist`` runs that module as __main__, which an
    # import by this package beforehand would shadow
    from reproduce.evidence.fmnist import fmnist_table

    return fmnist_table(record)


TABLES = {
    "fmnist": lambda record: _fmnist_table(record),
    "cheap": cheap_table,
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


# The options every subcommand takes, and those each subcommand reads besides: an option of another
# subcommand is refused there in one line (exit 2), never taken and ignored.
COMMON = ("quick", "out", "threads")
OPTIONS: dict[str, tuple[str, ...]] = {
    "spectra": ("model", "epochs", "seeds", "methods", "gam", "sam_gam", "gnp_alpha",
                "k", "iters", "trace_samples", "probe"),
    "accuracy": ("model", "epochs", "seeds", "methods", "gam", "sam_gam", "gnp_alpha",
                 "reuse", "vmap"),
    "noise": ("model", "epochs", "seeds", "gam", "sam_gam", "levels", "vmap"),
    "minima": ("model", "epochs", "seeds", "gam", "probe", "directions", "radius"),
    "landscape": ("model", "epochs", "gam", "sam_gam", "probe", "points"),
    "ablation": ("model", "epochs", "seeds", "rhos", "alphas", "sam_rho", "vmap"),
    "variants": ("model", "epochs", "seeds", "iters", "probe"),
    "fd": ("epochs", "seeds", "iters", "probe", "radii"),
    "family": ("model", "epochs", "seeds", "k", "iters", "trace_samples", "probe"),
    "reuse": ("model", "epochs", "seeds", "iters", "probe"),
}  # fmt: skip
# the subcommands whose runs --vmap can train together (the others measure each run on its own)
VMAP = tuple(c for c, keys in OPTIONS.items() if "vmap" in keys)
# the method whose hyperparameters an option sets: refused where --methods leaves that method out
FOR_METHOD = {"gam": "SGD+GAM", "sam_gam": "SAM+GAM", "gnp_alpha": "GNP"}
# what accuracy trains: refused when it reads the runs of a spectra JSON (--reuse) instead
TRAINING = ("quick", "model", "epochs", "seeds", "methods", "gam", "sam_gam", "gnp_alpha", "vmap")
# the defaults of the options without a --quick value
FIXED = dict(gnp_alpha=0.1, radius=0.1, methods=",".join(METHODS), sam_rho=0.0, threads=0)
# the largest value of each count (the smallest is 1, 2 for --points): each keeps a command's work
# finite (--points=P evaluates P² losses per method, --directions=N 11·N); --probe is at most the
# probe set's size and --k at most --iters, checked apart
BOUNDS = dict(seeds=100, epochs=10_000, k=1_000, iters=10_000, trace_samples=10_000,
              directions=10_000, points=201)  # fmt: skip
HELP = dict(
    quick="2 epochs, 1 seed, small metrics: under a minute (for tests)",
    out="output folder (runs/evidence/<subcommand>)",
    threads="torch threads (0: leave as is)",
    gnp_alpha="α of GNP (0.1: best on validation)",
    radius="ρ of minima density (0.1)",
    methods="the methods to train (a comma list; default all five)",
    gam="ρ,α of GAM in SGD+GAM (default: 0.5,1)",
    sam_gam="ρ,α of GAM in SAM+GAM (default: GAM's 0.5,1)",
    sam_rho="SAM+GAM around a SAM oracle of this ρ (0: plain GAM)",
    reuse=f"take the runs of this spectra JSON if it exists (default {REUSE}; none with --quick or --vmap)",
    vmap="train each estimator's runs as one vmapped step (seed 0's data)",
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``error: ...``) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def _add(s: argparse.ArgumentParser, key: str) -> None:
    """Option ``key`` on subparser ``s``, default None (False for a switch): what was given shows."""
    if key in ("quick", "vmap"):
        s.add_argument(_flag(key), action="store_true", help=HELP[key])
    elif key in DEFAULTS:
        s.add_argument(_flag(key), type=type(DEFAULTS[key][0]), default=None)
    else:
        kind = {"threads": int, "gnp_alpha": float, "radius": float, "sam_rho": float}.get(key, str)
        s.add_argument(_flag(key), type=kind, default=None, help=HELP[key].replace("%", "%%"))


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    every = [*COMMON, *dict.fromkeys(k for keys in OPTIONS.values() for k in keys)]
    for name, func in SUBCOMMANDS.items():
        summary = (func.__doc__ or name).split("\n")[0]
        # argparse %-formats help strings: a bare % (as in "20/40/60/80%") must be doubled
        s = sub.add_parser(name, help=summary.replace("%", "%%"), description=summary)
        mine = (*COMMON, *OPTIONS[name])
        for key in mine:
            _add(s, key)
        # the others exist on the namespace, unset, so that the shared code reads one shape
        s.set_defaults(
            func=func, **{k: False if k == "vmap" else None for k in every if k not in mine}
        )
    return p


def _not_used(command: str, extra: list[str]) -> str:
    """The one line refusing ``extra``, the arguments ``command`` does not take."""
    word = next((a for a in extra if a.startswith("-")), extra[0])
    key = word.split("=", 1)[0].lstrip("-").replace("-", "_")
    users = [c for c, keys in OPTIONS.items() if key in keys]
    if not users:
        return f"unrecognized arguments: {' '.join(extra)}"
    return f"{command} does not use {_flag(key)} (an option of {', '.join(users)}); leave it out"


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand of ``argv`` (default: the command line's).

    Args:
        argv: the arguments after the program's name.

    Returns:
        The exit status: 0 when it has written its files; 2 for a bad value, an option the
            subcommand does not use or an output folder that cannot be written (one line on
            stderr, before any training; argparse's own errors exit 2 by ``SystemExit``), or a
            file it cannot write once trained (a disk that filled: one line naming the file); 3
            when one of its runs did not train (train.py's rules on skipped steps) or a
            measurement of one is not finite, naming the run, with no table written.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    opt, extra = p.parse_known_args(argv)
    if extra:
        p.error(_not_used(opt.command, extra))
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
    except (NotTrained, NotMeasured) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 3
    except OSError as e:  # a disk that filled after the start-up check, as train.py says it
        if not _write_error(e, Path(opt.out)):
            raise
        where = repr(str(e.filename)) if e.filename else f"into {str(opt.out)!r}"
        print(
            f"error: cannot write {where}: {e.strerror or e}; free space (or fix permissions) "
            "and run the command again",
            file=sys.stderr,
            flush=True,
        )
        return 2
    return 0


def _write_error(e: OSError, out: Path) -> bool:
    """Whether ``e`` is the command failing to write its outputs (a full, read-only or forbidden
    disk, or a file under ``out``), not a file it reads."""
    if e.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES):
        return True
    try:
        return bool(e.filename) and Path(str(e.filename)).resolve().is_relative_to(out.resolve())
    except (OSError, RuntimeError):
        return False


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
    opt.options = (*COMMON, *OPTIONS[opt.command])  # what the JSON records of its settings
    given = [k for k in opt.options if getattr(opt, k) not in (None, False)]
    for key, (full, quick) in DEFAULTS.items():
        full = FULL.get(opt.command, {}).get(key, full)
        if getattr(opt, key) is None:
            setattr(opt, key, quick if opt.quick else full)
    for key, value in FIXED.items():
        if getattr(opt, key) is None:
            setattr(opt, key, value)
    opt.methods = [m.strip() for m in opt.methods.split(",") if m.strip()]
    unknown = [m for m in opt.methods if m not in METHODS]
    if unknown or not opt.methods:
        raise ValueError(
            f"--methods must name some of {list(METHODS)}; got {unknown or opt.methods}"
        )
    for key in _COUNTS:
        if getattr(opt, key) < 1:
            raise ValueError(f"{_flag(key)} must be an integer >= 1; got {getattr(opt, key)}")
    if opt.points < 2:
        raise ValueError(f"--points must be an integer >= 2; got {opt.points}")
    for key, most in BOUNDS.items():
        if key in opt.options and getattr(opt, key) > most:
            raise ValueError(f"{_flag(key)} must be at most {most:_}; got {getattr(opt, key)}")
    if "k" in opt.options and opt.k > opt.iters:
        raise ValueError(
            f"--k={opt.k} eigenvalues take at least k Lanczos products: give --iters >= {opt.k} "
            f"or a smaller --k; got --iters={opt.iters}"
        )
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
            flag = _flag(key)
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
    if opt.reuse is None:  # --quick never reads a full run's results, --vmap trains its own
        opt.reuse = "" if opt.quick or opt.vmap else REUSE
    _check_use(opt, given)
    if opt.threads:
        torch.set_num_threads(opt.threads)
    if "probe" in opt.options:
        size = len(data_mod.load(base_config(opt)).probe)
        if opt.probe > size:
            raise ValueError(f"--probe must be at most the {size} probe examples; got {opt.probe}")
    opt.out = Path(opt.out or f"runs/evidence/{opt.command}")
    opt.out.mkdir(parents=True, exist_ok=True)
    if not os.access(opt.out, os.W_OK):
        raise OSError(13, "permission denied")


def _check_use(opt, given: list[str]) -> None:
    """Refuse a given option that this invocation would not read: a method's hyperparameters where
    --methods leaves the method out, or accuracy's training options where it reads the runs of a
    spectra JSON (``--reuse``), whose file it checks (ValueError)."""
    if "methods" in opt.options:
        for key, method in FOR_METHOD.items():
            if key in given and method not in opt.methods:
                raise ValueError(
                    f"{_flag(key)} sets {method}, which --methods={','.join(opt.methods)} leaves "
                    f"out; leave it out or add {method}"
                )
    if opt.command == "accuracy" and opt.reuse and Path(opt.reuse).is_file():
        unused = [k for k in TRAINING if k in given]
        if unused:
            raise ValueError(
                f"{_flag(unused[0])} is not used: accuracy reads the runs of --reuse={opt.reuse}; "
                "pass --reuse= to train"
            )
        reused_runs(Path(opt.reuse))
