"""The command line: flags, then one group per model and precision, the JSON and the table."""

from __future__ import annotations

import argparse
import ast
import tempfile
import typing
import warnings
from pathlib import Path

import torch

import gamfunc
from benchmarks import _common
from benchmarks.report import FACADE_COLUMNS, FACADE_ONLY
from benchmarks.step_cost import facade
from benchmarks.step_cost.group import compile_jobs, run_group
from benchmarks.step_cost.methods import BASELINE, METHODS, every_ok
from benchmarks.step_cost.models import MODELS, split_precision
from benchmarks.step_cost.pool import Precompiler, run_cache_dir
from benchmarks.step_cost.report import metadata, table, vs_fp32
from benchmarks.step_cost.timing import release

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")  # first jvp, from torch._decomp
warnings.filterwarnings("ignore", message=".*Profiler clears events.*")  # --profile, torch 2.11

DESCRIPTION = (
    "Step cost of every gamfunc estimator against an eager torch.optim SGD step, the compiled "
    "gradient step and the authors' GAM optimiser, in the same process (benchmarks/README.md)."
)


def inductor_options(items) -> dict:
    """``--inductor KEY=VALUE`` items as an options dict: VALUE by ``ast.literal_eval`` (``True``,
    ``8``, ``"x"``, ``(1, 2)``), else the string itself, also where the option is a string. A later
    item overrides an earlier one with the same KEY. Raises ``ValueError`` naming ``--inductor`` on
    an item without ``=``, an option inductor does not know, or a value of the wrong type."""
    from torch._inductor import config

    known = config.get_config_copy()
    options = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--inductor: expected KEY=VALUE, got {item!r}")
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"--inductor: unknown inductor option {key!r}")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            value = raw
        kind = config.get_type(name)
        if kind is str and not isinstance(value, str):
            value = raw  # a string option whose text also reads as a literal (e.g. "1")
        if kind is float and type(value) is int:
            value = float(value)
        plain = typing.get_origin(kind) is None and isinstance(
            kind, type
        )  # as torch.compile checks
        if plain and not isinstance(value, kind):
            raise ValueError(
                f"--inductor: {key} must be {kind.__name__}; got {value!r} ({type(value).__name__})"
            )
        options[key] = value
    return options


def parse(argv=None):
    p = argparse.ArgumentParser(description=DESCRIPTION)

    def csv(s):
        return [v for v in s.split(",") if v]

    p.add_argument("--model", type=csv, default=None, help=f"comma list of {sorted(MODELS)}")
    p.add_argument(
        "--modes",
        type=csv,
        default=None,
        help='eager,compile,reduce-overhead,...; pass, pass-reduce-overhead: step.compile(scope="pass")',
    )
    p.add_argument(
        "--dtype",
        type=csv,
        default=["fp32"],
        help="fp32,bf16; with -cl (bf16-cl): channels-last, for the convolutional models",
    )
    p.add_argument(
        "--only",
        type=csv,
        default=list(METHODS),
        help=f"comma list of {METHODS}, or gam_every<k> / sam_gam_every<k> (k >= 2); grad_eval: "
        "one plain gradient (torch.autograd.grad eager, compiled torch.func.grad compiled), the unit of "
        "× grad evals; grad_eval_func: torch.func.grad in every mode",
    )
    p.add_argument("--repeats", type=int, default=None, help="timing rounds (median over them)")
    p.add_argument("--warmup", type=int, default=None, help="steps after the first call")
    p.add_argument("--block", type=int, default=None, help="steps per timed sample")
    p.add_argument("--recompile-steps", type=int, default=3, help="steps with a new lr each")
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's")
    p.add_argument("--device", default=None, help="default: cuda if available (cpu with --quick)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (--quick: 1)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rho", type=float, default=0.05, help="peak of ρ's cosine schedule")
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument(
        "--composite-hvp",
        default="fd",
        help="hvp of sam_gam and the *_every<k> methods (fd/exact/reverse)",
    )
    p.add_argument("--on-nonfinite", default="skip", help="make_step's on_nonfinite")
    p.add_argument(
        "--channels-last",
        action="store_true",
        help="every --dtype channels-last (as fp32-cl, bf16-cl)",
    )
    p.add_argument(
        "--no-loop-reorder",
        action="store_true",
        help="torch._inductor.config.loop_ordering_after_fusion = False",
    )
    p.add_argument("--compile-jobs", type=int, default=0, help="parallel pre-compile workers")
    p.add_argument("--compile-timeout", type=float, default=360.0, help="seconds per worker")
    p.add_argument(
        "--compile-threads",
        type=int,
        default=None,
        help="inductor compile threads per worker (default: 4 x cores / --compile-jobs, at most "
        "the cores)",
    )
    p.add_argument(
        "--recompile-limit", type=int, default=64, help="torch._dynamo.config.recompile_limit"
    )
    p.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="inductor option for every compile (repeatable), e.g. combo_kernels=True; VALUE is a "
        "Python literal, else a string",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timing, N more steps of each method under torch.profiler (JSON: profile)",
    )
    p.add_argument(
        "--elementary-norms",
        action="store_true",
        help="gamfunc steps with BatchNorm/LayerNorm in elementary ops (gamfunc.nn.elementary_norms)",
    )
    p.add_argument(
        "--facade",
        nargs="?",
        const="with",
        choices=("with", "only"),
        default=None,
        help="also time the torch.optim facade against make_step and davda54's SAM (JSON: facade); "
        "--facade=only: that table alone",
    )
    p.add_argument(
        "--facade-mode",
        default=None,
        choices=facade.MODES,
        help="the facade and make_step rows: compile (default; the facade compile=True, make_step "
        "compiled whole), pass (make_step compiled pass by pass), reduce-overhead, "
        "pass-reduce-overhead (CUDA graphs, both), pass-graph (by pass, each step one CUDA graph: "
        "the facade's cuda_graph=True, gamfunc.cuda_graph) or eager (--quick's default)",
    )
    p.add_argument(
        "--facade-estimators",
        type=csv,
        default=list(facade.ESTIMATORS),
        help=f"comma list of {list(facade.ESTIMATORS)} for the facade table (default: all); the "
        "eager davda54 and facade SAM rows come with sam",
    )
    p.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)  # workers
    _common.add_flags(p)
    a = p.parse_args(argv)
    tiny = a.quick  # the tiny model, batch 4, eager, on the CPU: seconds
    a.model = a.model or (["tiny"] if tiny else ["resnet18"])
    a.modes = a.modes or (["eager"] if tiny else ["eager", "compile"])
    a.repeats = a.repeats or (2 if tiny else 5)
    a.warmup = a.warmup if a.warmup is not None else (1 if tiny else 3)
    a.block = a.block or (1 if tiny else 5)
    a.device = a.device or ("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    # One thread for the smoke run: on a busy machine, OpenMP threads that wait on each other
    # stall tiny steps by two orders of magnitude.
    a.threads = a.threads or (1 if tiny else None)
    a.facade_mode = a.facade_mode or ("eager" if tiny else "compile")
    for name, values, allowed in (
        ("model", a.model, MODELS),
        (
            "dtype",
            [d for d in a.dtype if not _precision_ok(d)],
            ("fp32", "bf16", "fp32-cl", "bf16-cl"),
        ),
        ("only", [m for m in a.only if not every_ok(m)], (*METHODS, BASELINE)),
        ("composite-hvp", [a.composite_hvp], gamfunc.hvps.BACKENDS),
        ("facade-estimators", a.facade_estimators, facade.ESTIMATORS),
        ("on-nonfinite", [a.on_nonfinite], ("skip", "raise", "ignore")),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {sorted(allowed)}")
    for name in ("repeats", "block"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.profile < 0:
        p.error("--profile must be >= 0")
    try:
        a.inductor_options = inductor_options(a.inductor)
    except ValueError as e:
        p.error(str(e))
    return a


def _precision_ok(token: str) -> bool:
    try:
        split_precision(token)
    except ValueError:
        return False
    return True


def facade_part(a) -> str:
    """The part of a ``--facade=only`` run in its file's name,
    ``step_cost_facade[_<model>][_b<batch>][_<estimators>]_<device>.json``: the model of a run of
    one, the batch where ``--batch-size`` set one, the estimators where they are a subset (a run
    beside the full one); "" for none of these."""
    parts = list(a.model[:1]) if len(a.model) == 1 else []
    if a.batch_size:
        parts.append(f"b{a.batch_size}")
    if set(a.facade_estimators) != set(facade.ESTIMATORS):
        parts += a.facade_estimators
    return "_".join(parts)


def main(argv=None) -> dict:
    """Run the groups (every model × precision), write the JSON after each, print the table."""
    a = parse(argv)
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.no_loop_reorder:
        # Works around an inductor assertion in loop reordering (torch 2.11, CUDA).
        torch._inductor.config.loop_ordering_after_fusion = False
    # Every gamfunc step compiles the same function, so each method adds a dynamo cache entry to it.
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, a.recompile_limit
    )
    meta = metadata(a, device)
    pool = None
    if (
        a.compile_jobs > 0 and not a.compile_only and a.facade != "only"
    ):  # workers' logs and caches; a fresh cache here
        root = Path(tempfile.mkdtemp(prefix="step_cost_"))
        meta["inductor_cache_dir"] = str(run_cache_dir(root))
        jobs = [
            job
            for model_name in a.model
            for token in a.dtype
            for job in compile_jobs(model_name, token, a)
        ]
        pool = Precompiler(a, jobs, root, Path(meta["inductor_cache_dir"]))
    rows, facade_rows = [], []
    result = {"benchmark": "step_cost", "meta": meta, "rows": rows}
    if a.facade:
        meta["davda54"] = facade.DAVDA54
        result["facade"] = facade_rows
    if a.facade == "only":  # a result of its own, beside the step_cost one of the same device
        meta["benchmark"] = result["benchmark"] = FACADE_ONLY
        if part := facade_part(a):
            meta["part"] = part
        result["rows"] = facade_rows
        del result["facade"]

    def save(partial=()):  # after every phase, so that a run cut short keeps what it measured
        _common.save({**result, "rows": result["rows"] + list(partial)}, a.out)

    try:
        for model_name in a.model:
            for token in a.dtype:
                if a.facade != "only":
                    rows += run_group(model_name, token, a, device, meta, save, pool)
                    release(device)
                    vs_fp32(rows)
                    save()
                if a.facade and not a.compile_only:
                    facade_rows += facade.run_facade(model_name, token, a, device, meta)
                    release(device)
                    save()
    finally:
        if pool is not None:
            pool.close()
    if not a.compile_only:
        header = f"{meta['device_name']}, torch {meta['torch']}, {meta['date']}"
        header += f"; JSON: {_common.out_path(a.out, meta)}"
        if a.inductor_options:
            header += "; inductor " + ", ".join(f"{k}={v!r}" for k, v in a.inductor_options.items())
        print(f"\n{header}\n")
        if a.facade != "only":
            print(table(rows))
        if a.facade:
            print(("\n" if a.facade != "only" else "") + _common.table(FACADE_COLUMNS, facade_rows))
    return result
