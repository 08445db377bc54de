"""The command line: the cells, their first steps in fresh processes (cold, then warm), the steady
state of each model in one process, the ratios, the JSON and the table."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from pathlib import Path

import torch

import gamfunc
from benchmarks import _common
from benchmarks.first_step.cells import (
    ESTIMATORS,
    GRAD_REFERENCE,
    MODES,
    Cell,
    cost_order,
    plan,
    skip_reason,
)
from benchmarks.report import columns, first_step_rows
from benchmarks.step_cost.models import MODELS, split_precision
from benchmarks.step_cost.pool import ROOT, compile_threads, merge_cache
from benchmarks.step_cost.timing import log
from reproduce.run.report import write_json

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")  # first jvp, from torch._decomp

BENCHMARK = "first_step"
PHASES = ("cold", "warm")
# flags every worker receives as the driver has them
FORWARDED = (
    "device",
    "threads",
    "batch_size",
    "lr",
    "rho",
    "alpha",
    "on_nonfinite",
    "repeats",
    "warmup",
    "block",
    "recompile_steps",
)
DESCRIPTION = (
    "The time from model set-up to the first training step, cold (an empty inductor cache) and "
    "warm (the same cache again), each in a fresh process, and the steady-state ms per step, for "
    "each estimator in each mode (benchmarks/README.md)."
)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION)

    def csv(s):
        return [v for v in s.split(",") if v]

    p.add_argument("--model", type=csv, default=None, help=f"comma list of {sorted(MODELS)}")
    p.add_argument(
        "--dtype",
        type=csv,
        default=None,
        help="comma list of fp32, bf16, fp32-cl, bf16-cl (-cl: channels-last, convolutional models "
        "only; default bf16-cl, --quick fp32)",
    )
    p.add_argument(
        "--estimators",
        type=csv,
        default=None,
        help=f"comma list of {ESTIMATORS} (default: all; --quick: gradient)",
    )
    p.add_argument(
        "--modes",
        type=csv,
        default=list(MODES),
        help=f"comma list of {MODES}: graph = the eager step as one CUDA graph; pass = compiled by "
        "pass; pass-graph = both; step = the whole step compiled",
    )
    p.add_argument(
        "--skip",
        type=csv,
        default=[],
        help="ESTIMATOR:MODE cells left out, comma list (e.g. gam_exact:step)",
    )
    p.add_argument(
        "--phases",
        type=csv,
        default=["cold", "warm", "steady"],
        help="comma list of cold, warm (first steps, fresh processes) and steady (ms per step)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="first-step processes at a time (they share the GPU and the CPU cores; the steady "
        "state is timed alone)",
    )
    p.add_argument(
        "--cell-timeout", type=float, default=600.0, help="seconds per first-step process"
    )
    p.add_argument(
        "--steady-timeout", type=float, default=900.0, help="seconds per steady-state process"
    )
    p.add_argument("--repeats", type=int, default=None, help="timing rounds (median over them)")
    p.add_argument("--warmup", type=int, default=None, help="steps before the timing")
    p.add_argument("--block", type=int, default=None, help="steps per timed sample")
    p.add_argument("--recompile-steps", type=int, default=3, help="steps with a new lr each")
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's")
    p.add_argument("--device", default=None, help="default: cuda if available (cpu with --quick)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (--quick: 1)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--rho", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--on-nonfinite", default="skip", help="make_step's on_nonfinite")
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the rows of other models and precisions already in --out (a run in parts); "
        "their run's metadata goes to meta['earlier']",
    )
    p.add_argument("--first-steps", default=None, help=argparse.SUPPRESS)  # a worker: one cell
    p.add_argument("--steady", default=None, help=argparse.SUPPRESS)  # a worker: its cells
    _common.add_flags(p)
    a = p.parse_args(argv)
    quick = a.quick  # the tiny model on the CPU, small counts: a minute or two
    a.model = a.model or (["tiny"] if quick else ["resnet50", "vit_s32"])
    a.dtype = a.dtype or (["fp32"] if quick else ["bf16-cl"])
    a.estimators = a.estimators or (["gradient"] if quick else list(ESTIMATORS))
    a.repeats = a.repeats or (2 if quick else 5)
    a.warmup = a.warmup if a.warmup is not None else (1 if quick else 3)
    a.block = a.block or (1 if quick else 5)
    a.device = a.device or ("cpu" if quick or not torch.cuda.is_available() else "cuda")
    a.threads = a.threads or (1 if quick else None)
    a.composite_hvp = "fd"  # step_cost's methods read it; no row here is a composite
    a.channels_last = False  # step_cost's prepare reads it; here -cl in --dtype says it
    for name, values, allowed in (
        ("model", a.model, MODELS),
        ("estimators", a.estimators, ESTIMATORS),
        ("modes", a.modes, MODES),
        ("phases", a.phases, (*PHASES, "steady")),
        ("on-nonfinite", [a.on_nonfinite], ("skip", "ignore")),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {sorted(allowed)}")
    for token in a.dtype:
        try:
            split_precision(token)
        except ValueError:
            p.error(f"--dtype: unknown {token!r}; choose from fp32, bf16, fp32-cl, bf16-cl")
    pairs = {f"{e}:{m}" for e in ESTIMATORS for m in MODES}
    if bad := [s for s in a.skip if s not in pairs]:
        p.error(f"--skip: {bad} are not ESTIMATOR:MODE pairs of {list(ESTIMATORS)} × {list(MODES)}")
    if a.append and not a.out:
        p.error("--append needs --out, the file to add to")
    if "warm" in a.phases and "cold" not in a.phases:
        p.error("--phases: warm reuses the cache a cold start fills; add cold")
    for name in ("repeats", "block", "jobs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("cell_timeout", "steady_timeout"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    return a


def worker_flags(a: argparse.Namespace) -> list[str]:
    """The flags a worker is started with: those of :data:`FORWARDED` the driver has."""
    out = []
    for k in FORWARDED:
        if getattr(a, k, None) is not None:
            out += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    return out


class Workers:
    """Worker processes, at most ``jobs`` at a time, each in a session of its own (ended with its
    compile subprocesses when it runs past ``timeout`` or the run is stopped), each with the inductor
    cache directory it is given."""

    def __init__(self, a: argparse.Namespace, root: Path, jobs: int):
        self.a, self.root, self.jobs = a, root, jobs
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "PYTHONPATH": path}
        self.env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads(jobs)))
        self.env.pop("TRITON_CACHE_DIR", None)  # Triton's cache then lives inside inductor's
        self.running: dict = {}

    def start(self, name: str, args: list[str], cache: Path, timeout: float):
        """Start ``python -m benchmarks.first_step ARGS --out <name>.json`` with ``cache``."""
        out = self.root / f"{name}.json"
        log_file = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed when it ends
        cmd = [sys.executable, "-m", "benchmarks.first_step", *args, "--out", str(out)]
        proc = subprocess.Popen(
            cmd + worker_flags(self.a),
            env={**self.env, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        self.running[name] = (proc, time.perf_counter(), timeout, out, log_file)

    def finished(self):
        """Yield ``(name, result, error)`` of each worker that has ended (or was ended)."""
        for name, (proc, t0, timeout, out, log_file) in list(self.running.items()):
            if proc.poll() is None and time.perf_counter() - t0 < timeout:
                continue
            error = None
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                error = f"did not finish in {timeout:.0f} s"
            log_file.close()
            del self.running[name]
            result = json.loads(out.read_text()) if out.exists() else None
            if result is None and error is None:
                tail = (self.root / f"{name}.log").read_text()[-300:]
                error = f"worker exited with {proc.returncode}: {tail}"
            yield name, result, error

    def close(self):
        for proc, *_, log_file in self.running.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log_file.close()
        self.running.clear()


def file_key(cell: Cell) -> str:
    return cell.key.replace(":", "_")


def first_step_phase(a, cells, rows, root: Path, save) -> None:
    """Run every cell's cold start, then its warm start, ``a.jobs`` processes at a time, the costliest
    cells first; fill ``rows[cell][phase]``, saving after each."""
    workers = Workers(a, root, a.jobs)
    queue = deque((c, "cold") for c in sorted(cells, key=cost_order))
    try:
        while queue or workers.running:
            while queue and len(workers.running) < a.jobs:
                cell, phase = queue.popleft()
                cache = root / file_key(cell) / "inductor"
                cache.mkdir(parents=True, exist_ok=True)
                name = f"{file_key(cell)}_{phase}"
                workers.start(name, ["--first-steps", cell.key], cache, a.cell_timeout)
                log(f"{cell.key}: {phase} start")
            for name, result, error in workers.finished():
                key, phase = name.rsplit("_", 1)
                cell = next(c for c in cells if file_key(c) == key)
                got = result["first_steps"] if result else {"error": error}
                if error and result:
                    got["error"] = error
                rows[cell][phase] = got
                status = got.get("error") or f"first step {got['first_s']:.1f} s"
                log(f"{cell.key}: {phase} {status[:200]}")
                if phase == "cold" and "warm" in a.phases:
                    if got.get("error"):
                        rows[cell]["warm"] = {"error": "not run: the cold start failed"}
                    else:
                        queue.appendleft((cell, "warm"))  # before other cells: its cache is full
                save()
            time.sleep(0.2)
    finally:
        workers.close()


def steady_phase(a, cells, rows, root: Path, save) -> None:
    """Time each model and precision's cells in one process, alone, from the merged caches of their
    first-step workers; fill ``rows[cell]``, saving after each."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if rows[cell].get("cold", {}).get("error") or rows[cell].get("warm", {}).get("error"):
            rows[cell]["note"] = rows[cell].get("note") or "not timed: its first steps failed"
            continue
        groups.setdefault((cell.model, cell.precision), []).append(cell)
    for (model, precision), group in groups.items():
        name = f"steady_{model}_{precision}"
        cache = root / name / "inductor"
        cache.mkdir(parents=True, exist_ok=True)
        for cell in group:  # the caches the first-step workers filled
            src = root / file_key(cell) / "inductor"
            if src.is_dir():
                merge_cache(src, cache)
        workers = Workers(a, root, 1)
        try:
            workers.start(
                name, ["--steady", ",".join(c.key for c in group)], cache, a.steady_timeout
            )
            log(f"{model} {precision}: steady state of {len(group)} cells")
            done = []
            while not done:
                time.sleep(0.5)
                done = list(workers.finished())
        finally:
            workers.close()
        _, result, error = done[0]
        timed = {r["key"]: r for r in (result or {}).get("steady", [])}
        for cell in group:
            got = timed.get(cell.key, {"error": error or "not timed"})
            for k in ("ms", "ms_samples", "img_s", "peak_mem_gib", "recompiles"):
                if got.get(k) is not None:
                    rows[cell][k] = got[k]
            for k in ("compile_s", "first_call_s"):  # in this process, from the merged caches
                if got.get(k) is not None:
                    rows[cell][f"steady_{k}"] = got[k]
            if got.get("error"):
                rows[cell]["note"] = f"steady: {got['error']}"
        save()


def ratios(rows: list[dict]) -> None:
    """``x_grad`` of every timed row: ms ÷ ms of the compiled gradient step of the same model and
    precision in this run (the first of :data:`.cells.GRAD_REFERENCE` timed), named in
    ``grad_reference``."""
    by = {(r["model"], r["precision"], r["estimator"], r["mode"]): r for r in rows if r.get("ms")}
    for r in rows:
        ref = next(
            (
                by[k]
                for m in GRAD_REFERENCE
                if (k := (r["model"], r["precision"], "gradient", m)) in by
            ),
            None,
        )
        if ref is not None and r.get("ms"):
            r["x_grad"] = r["ms"] / ref["ms"]
            r["grad_reference"] = f"gradient/{ref['mode']}"


def notes(row: dict) -> str | None:
    """What a reader of a row should know: why it did not run or failed, a warm start that found
    nothing in the cache, or one whose graphs AOTAutograd's cache refused (traced again)."""
    for phase in PHASES:
        if (got := row.get(phase)) and got.get("error"):
            return f"{phase}: {got['error']}"
    warm = row.get("warm") or {}
    cache = warm.get("cache") or {}
    compiled = row["mode"] in ("pass", "pass-graph", "step")
    if compiled and cache.get("fxgraph_cache_miss") and not cache.get("fxgraph_cache_hit"):
        return "warm: no inductor cache hit"
    if compiled and cache.get("autograd_cache_bypass"):
        return "warm: AOTAutograd's cache bypassed"
    return row.get("note")


def new_row(cell: Cell, a) -> dict:
    spec = MODELS[cell.model]
    dtype, cl = split_precision(cell.precision)
    return {
        "model": cell.model,
        "precision": cell.precision,
        "dtype": dtype,
        "channels_last": cl and spec.convolutional,
        "estimator": cell.estimator,
        "mode": cell.mode,
        "batch": a.batch_size or spec.batch,
        "jobs": a.jobs,  # first-step processes at a time in the run that measured it
        "note": None,
    }


def earlier(out: str, measured: set, meta: dict) -> list[dict]:
    """``--append``: the rows of ``out`` (if it exists) whose model and precision this run does not
    measure; the metadata of the run(s) that wrote them is added to ``meta["earlier"]``."""
    path = Path(out)
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    if old.get("benchmark") != BENCHMARK:
        raise SystemExit(f"--append: {out} is no {BENCHMARK} result")
    before = old["meta"].pop("earlier", [])
    meta["earlier"] = [*before, old["meta"]]
    return [r for r in old["rows"] if (r["model"], r["precision"]) not in measured]


def metadata(a, device) -> dict:
    return _common.metadata(
        BENCHMARK,
        device,
        quick=a.quick,
        jobs=a.jobs,
        compile_threads=int(
            os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") or compile_threads(a.jobs)
        ),
        cpu_count=os.cpu_count(),
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        gamfunc=gamfunc.__version__,
        args={k: v for k, v in vars(a).items() if k not in ("first_steps", "steady")},
    )


def run_worker(a) -> dict:
    """A worker's run: one cell's first steps, or a group's steady state; its JSON."""
    from benchmarks.first_step import worker

    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.first_steps:
        result = {"first_steps": worker.first_steps(Cell.parse(a.first_steps), a, device)}
    else:
        cells = [Cell.parse(k) for k in a.steady.split(",")]
        result = {"steady": worker.steady(cells, a, device)}
    write_json(a.out, result)
    return result


def main(argv=None) -> dict:
    """Run the cells' first steps, cold then warm, then their steady state; write the JSON after
    each step of the way; print the table."""
    a = parse(argv)
    if a.first_steps or a.steady:
        return run_worker(a)
    device = torch.device(a.device)
    meta = metadata(a, device)
    cells = plan(a.model, a.dtype, a.estimators, a.modes, a.skip)
    table_rows = {c: new_row(c, a) for c in cells}
    runnable = []
    for cell in cells:
        reason = skip_reason(cell, device.type)
        if reason:
            table_rows[cell]["note"] = reason
        else:
            runnable.append(cell)
    kept = earlier(a.out, {(c.model, c.precision) for c in cells}, meta) if a.append else []
    result = {"benchmark": BENCHMARK, "meta": meta, "rows": kept + list(table_rows.values())}

    def save():
        for row in table_rows.values():
            row["note"] = notes(row)
        _common.save(result, a.out)

    root = Path(tempfile.mkdtemp(prefix="first_step_"))
    meta["work_dir"] = str(root)
    log(f"{len(runnable)} cells of {len(cells)}; worker logs and caches in {root}")
    save()
    if "cold" in a.phases:
        first_step_phase(a, runnable, table_rows, root, save)
    if "steady" in a.phases:
        steady_phase(a, runnable, table_rows, root, save)
        ratios(result["rows"])
    save()
    header = f"{meta['device_name']}, torch {meta['torch']}, {meta['date']}"
    print(f"\n{header}; JSON: {_common.out_path(a.out, meta)}\n")
    print(_common.table(columns(BENCHMARK), first_step_rows(result["rows"])))
    return result
