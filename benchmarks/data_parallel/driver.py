"""Data-parallel scaling of gamfunc's steps against DistributedDataParallel, on one machine, in one run.

    python -m benchmarks.data_parallel                                 # every row on all GPUs
    python -m benchmarks.data_parallel --quick                         # r50: DDP, SGD, fd GAM
    python -m benchmarks.data_parallel --gpus 2 --runs r50:ddp,r50:gam_fd
    python -m benchmarks.data_parallel --gpus 2,4 --runs r50:sgd:graph   # 1, 2 and 4 GPUs
    python -m benchmarks.data_parallel --gpus 2 --runs r50:train_sgd:graph,r50:train_gam_fd:graph \
        --data synthetic                                                # the data path's cost

Rows (``--runs``, ``model:kind``): ``r50`` is ``hp2.imagenet.resnet50`` (bf16, channels-last, SGD),
``vit`` is ``hp2.imagenet.vit_s32`` (bf16, AdamW); ``ddp`` is the anchor: the ``nn.Module`` compiled
with ``torch.compile``, eager ``torch.optim`` (SGD momentum or AdamW), bf16 autocast, and on N GPUs
wrapped in ``DistributedDataParallel``; ``sgd`` (the preset's base optimiser alone), ``gam_fd`` and
``gam`` (exact) are the steps ``reproduce/train.py --compile`` builds (:func:`reproduce.build.setup`),
on N GPUs made data parallel in ``--perturbation=global`` and ``local``; ``train_<estimator>`` runs
``reproduce/train.py`` itself on in-memory synthetic data (60 steps), the loop and its data path
included, its rate from the run's summary (``r50:train_gam_fd:graph``: with ``--cuda_graph``); with
``--data`` (a JPEG folder; ``synthetic``: one of ``--synthetic_images`` JPEG files of ImageNet's sizes,
written first by :mod:`benchmarks.input_pipeline.jpeg_folder`) each train run, on 1 GPU and on N, is
repeated on the folder through each ``--loader`` setting (default: train.py's ``auto``, then each loader
by name), and ``data_path_cost`` = 1 − its images/s ÷ the in-memory images/s at the same count. A third
field ``sync`` (``r50:gam_fd:sync``) runs the step with the non-finite guard of before, which read the step's finiteness on the host at every step;
``twin`` (``r50:sgd:twin``) first runs the 1-GPU step alone, then one independent copy of it on
every GPU at once (no process group): a slowdown there comes from what the processes share on the
host, not from the collectives; the run alone is also the 1-GPU side of the row's efficiency; ``graph`` (``r50:gam_fd:graph``) runs the same step replayed as a
CUDA graph (:func:`gamfunc.cuda_graph`, all-reduces included), on 1 GPU and on N.

Every step runs on a batch already on the device (``--batch`` images per GPU), so the rates count the
step alone: compute, collectives and whatever the step synchronises. Each row is timed on 1 GPU
(the plain step: no process group, no wrapper, no launcher) and on N (each N of ``--gpus 2,4``, a
``torchrun``), each a run of :mod:`benchmarks.data_parallel.worker`, its output in ``--logs``; efficiency is N-GPU
images/s ÷ (N × 1-GPU images/s). Before the timing, every row's step is compiled once on all N GPUs
(a few at once; GAM in the modes of ``--perturbations``), filling one inductor cache that the
timed runs load. The NCCL
all-reduce bus bandwidth at 25 MB and 100 MB comes first. Each timed run also gives the host's time
to issue one step (``host_ms_per_step``: near ``ms_per_step``, the step is bound by the host) and
the median and range of ``--windows`` timed windows of ``--steps`` steps each, and one step of each
N-GPU row is profiled (``torch.profiler``, rank 0): its GPU time by kind (NCCL, compute, copies),
its host waits, and its operators by GPU and by host time (the tables in ``--logs``).
:mod:`benchmarks.data_parallel.projection` projects the reports to more GPUs. Without CUDA the
runs use gloo on the CPU and the small ``digits`` preset stands in for the networks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import _common
from benchmarks.data_parallel import trace_gaps
from benchmarks.data_parallel.worker import NCCL_ENV, PRESETS
from benchmarks.input_pipeline import jpeg_folder
from benchmarks.report import columns

__all__ = ["efficiency", "loader_args", "main"]

KINDS = ("ddp", "sgd", "gam_fd", "gam")
DEFAULT_RUNS = (
    "r50:ddp,r50:sgd:graph,r50:gam_fd:graph,r50:sgd,r50:gam_fd,"
    "vit:ddp,vit:sgd:graph,vit:gam:graph,r50:gam:graph"
)
WARM_AT_ONCE = 3  # rows compiled at once (GPU memory: ResNet-50 exact GAM alone takes 37 GiB)
QUICK_RUNS = "r50:ddp,r50:sgd,r50:gam_fd"
# The loader settings of a train row with --data: train.py's own choice (DALI on nvJPEG's CUDA
# decoder, where DALI is installed), DALI's other arrangements (the GPU's hardware JPEG decoder,
# decoding on the CPU), then each other loader by name.
TRAIN_LOADERS = "auto,dali+dali_hw_load=1,dali+dali_cpu,gpu,folder"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the workers import `benchmarks`


def efficiency(rate_n: float, rate_1: float, n: int) -> float:
    """N-GPU images/s ÷ (N × 1-GPU images/s)."""
    return rate_n / (n * rate_1)


# ---------------------------------------------------------------- the driver


def _torchrun(gpus: int) -> list[str]:
    """The command that starts ``gpus`` processes on this machine: ``torchrun`` for several; for one,
    the interpreter itself, as a user runs one GPU (no launcher, no rendezvous, no process group)."""
    if gpus == 1:
        return [sys.executable]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
    ]


def loader_args(setting: str) -> list[str]:
    """train.py's arguments for one ``--loader`` setting: a loader, then options joined by ``+``
    (``dali+dali_roi+dali_hw_load=1.0`` is ``--loader=dali --dali_roi --dali_hw_load=1.0``)."""
    loader, *options = setting.split("+")
    return [f"--loader={loader}"] + [f"--{o}" for o in options]


def _train_py(a, model, estimator, gpus, timeout, graph=False, folder="") -> dict:
    """``reproduce/train.py`` itself, as a user runs it: images/s from its summary (the rate after the
    first logging interval). In-memory synthetic data, or with ``folder`` (a ``--loader`` setting)
    the JPEG folder ``--data`` through that loader; ``graph``: ``--cuda_graph``."""
    logdir = Path(tempfile.mkdtemp(prefix="dp_train_"))
    cmd = _torchrun(gpus)
    cmd += [str(ROOT / "reproduce" / "train.py")]
    cmd += [f"--preset={PRESETS[model]}", f"--estimator={estimator}"]
    cmd += ["--bf16", "--compile"] if torch.cuda.is_available() else []  # the CPU: the test alone
    if folder:
        cmd += [f"--data={a.data}", *loader_args(folder), f"--workers={a.workers}"]
    else:
        cmd += ["--synthetic", "--synthetic_size=4096"]
    cmd += [f"--batch_size={a.batch * gpus}", f"--max_steps={a.train_steps}"]
    cmd += ["--log_every=10", "--eig_iters=0", "--trace_samples=0", "--r1_steps=0"]
    cmd += ["--progress=false", "--landscape=false"] + (["--cuda_graph"] if graph else [])
    cmd += [f"--logdir={logdir}"] + (["--channels_last"] if model == "r50" else [])
    cmd += [f"--profile_steps={a.train_profile}"] if a.train_profile else []
    where = f"_{folder.replace('+', '_').replace('=', '')}" if folder else ""
    log = _log_path(a, f"train_{model}_{estimator}_{gpus}gpu{where}")
    try:
        with log.open("w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "log": log.name}
    found = list(logdir.rglob("summary.json"))
    if done.returncode or not found:
        return {"error": f"exit {done.returncode}: " + _tail(log), "log": log.name}
    s = json.loads(found[0].read_text())
    keys = ("images_per_s", "compile_seconds", "peak_memory_gib", "loader", "steps", "profile")
    table, trace = found[0].with_name("profile.txt"), found[0].with_name("profile_trace.json.gz")
    timeline = {}
    if table.exists():  # in --logs, beside the worker's profiles
        tag = log.stem.split("_", 1)[1]
        shutil.copy(table, Path(a.logs) / f"profile_{tag}.txt")
        shutil.copy(trace, Path(a.logs) / f"trace_{tag}.json.gz")
        timeline = _timeline(trace)
    return {"world": gpus, **{k: s.get(k) for k in keys}, **timeline}


def _timeline(trace: Path) -> dict:
    """The profiled steps' timeline in a few numbers (:mod:`benchmarks.data_parallel.trace_gaps`): how long the
    training stream stood idle, and how much of the other streams' work (a loader's) ran beside it;
    nothing for a timeline without GPU work."""
    try:
        g = trace_gaps.gaps(trace_gaps.load(trace))
    except ValueError:
        return {}
    keep = (
        "span_ms",
        "busy_ms",
        "gaps_over_min_ms",
        "other_streams_ms",
        "other_streams_overlapping_ms",
    )
    return {"timeline": {k: g[k] for k in keep}}


def _train_rows(a, name, model, est, graph) -> list[dict]:
    """A ``train_<estimator>`` row: train.py on 1 GPU and on each N in memory, and with ``--data``
    on the folder through each ``--loader`` setting too, on 1 GPU (with ``--train_one``) and on
    each N, a row each: ``data_path_cost`` is 1 − its rate ÷ the in-memory rate at the same count."""
    one = _train_py(a, model, est, 1, a.run_timeout, graph) if a.train_one else {"skipped": True}
    rows = []

    def through(row, setting, n, memory):  # the folder through one loader, against memory
        row["loader"] = setting
        row["folder"] = _train_py(a, model, est, n, a.run_timeout, graph, folder=setting)
        if row["folder"].get("images_per_s") and memory.get("images_per_s"):
            cost = 1 - row["folder"]["images_per_s"] / memory["images_per_s"]
            row["data_path_cost"] = round(cost, 3)

    for setting in a.loader.split(",") if a.data and a.train_one else []:
        row = {"run": name, "gpus": 1, "perturbation": "global", "one": one, "many": one}
        through(row, setting, 1, one)
        rows.append(row)
        print(_line(row), flush=True)
    for n in a.gpus:
        many = _train_py(a, model, est, n, a.run_timeout, graph)
        for setting in a.loader.split(",") if a.data else [""]:
            row = {"run": name, "gpus": n, "perturbation": "global", "one": one, "many": many}
            if one.get("images_per_s") and many.get("images_per_s"):
                row["efficiency"] = round(
                    efficiency(many["images_per_s"], one["images_per_s"], n), 3
                )
            if setting:
                through(row, setting, n, many)
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _launch(
    a, model, kind, gpus, pert="global", steps=None, warmup=None, profile="", env=None, guard=""
):
    cmd = _torchrun(gpus)
    cmd += ["-m", "benchmarks.data_parallel.worker", "--model", model, "--kind", kind]
    cmd += ["--pert", pert]
    cmd += [
        "--guard",
        guard,
        "--batch",
        str(a.batch),
        "--steps",
        str(a.steps if steps is None else steps),
    ]
    cmd += ["--warmup", str(a.warmup if warmup is None else warmup), "--profile", profile]
    cmd += ["--windows", str(a.windows), "--stacks_after", str(a.stacks_after)]
    log = _log_path(a, f"{model}_{kind}" + (f"_{guard}" if guard else "") + f"_{gpus}gpu_{pert}")
    with log.open("w") as f:  # the child writes on; a run stopped from outside leaves its log
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    proc.log = log
    return proc


_LOGS = itertools.count()


def _log_path(a, label: str) -> Path:
    """Where one run's output goes: ``<logs>/<number>_<label>.log``, numbered in launch order."""
    folder = Path(a.logs)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{next(_LOGS):02d}_{label}.log"


def _tail(log: Path, lines: int = 4) -> str:
    text = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(text[-lines:])[-600:]


def _result(proc, timeout) -> dict:
    """The ``RESULT`` line of a run's log; a result printed before a hang still counts."""
    try:
        proc.wait(timeout=timeout)
        stopped = False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        stopped = True
    found = [
        ln for ln in proc.log.read_text(errors="replace").splitlines() if ln.startswith("RESULT ")
    ]
    if found:
        return {**json.loads(found[0][7:]), **({"exit": "timed out"} if stopped else {})}
    return {"error": "timed out" if stopped else _tail(proc.log), "log": proc.log.name}


def synthetic_folder(out: Path, images: int) -> str:
    """``--data synthetic``: a JPEG ImageFolder of ``images`` training images of ImageNet's sizes
    (:func:`benchmarks.input_pipeline.jpeg_folder.build`), min(1000, ``images``) classes and as
    many validation images (one per class: an ImageFolder refuses a class without a file).

    Args:
        out: the folder to write.
        images: training images, at least 1.

    Returns:
        The folder's path, for train.py's ``--data``.

    Raises:
        ValueError: ``images`` below 1.
    """
    if images < 1:
        raise ValueError(f"--synthetic_images must be >= 1; got {images}")
    classes = min(1000, images)
    print(f"writing {images} synthetic JPEG images in {classes} classes to {out}", flush=True)
    written = jpeg_folder.build(out, train=images, val=classes, classes=classes)
    print(f"  {written / 2**20:.0f} MiB", flush=True)
    return str(out)


def _counts(text: str) -> list[int]:
    """``--gpus``: one process count, or several (``2,4``), each timed against the same 1-GPU run."""
    counts = [int(v) for v in text.split(",") if v]
    if not counts or any(n < 2 for n in counts):
        raise argparse.ArgumentTypeError(f"--gpus needs counts of 2 or more, got {text!r}")
    return sorted(set(counts))


def main(argv=None) -> int:
    """Run the rows, print a line per row, and write the report.

    Args:
        argv: the command line (default: ``sys.argv[1:]``).

    Returns:
        0.
    """
    ap = _common.add_flags(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument(
        "--gpus",
        type=_counts,
        default=[max(torch.cuda.device_count(), 2)],
        help="processes: N, or N1,N2,... (each timed against the same 1-GPU run)",
    )
    ap.add_argument("--runs", default=None, help=f"default: {DEFAULT_RUNS} (--quick: {QUICK_RUNS})")
    ap.add_argument("--batch", type=int, default=None, help="images per GPU (default 128)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed window (20; quick 5)")
    ap.add_argument("--windows", type=int, default=3, help="timed windows; the median is reported")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (5; quick 2)")
    ap.add_argument(
        "--logs", default=None, help="each run's log and profile (default: a new temporary folder)"
    )
    ap.add_argument(
        "--run_timeout", type=float, default=900, help="seconds after which a hung run is ended"
    )
    ap.add_argument(
        "--data",
        default="",
        help="train rows: also a JPEG folder through --loader; 'synthetic' writes one first "
        "(--synthetic_images files of ImageNet's sizes, in --logs)",
    )
    ap.add_argument(
        "--synthetic_images",
        type=int,
        default=16384,
        help="--data synthetic: its training images (its classes and validation images: "
        "min(1000, this) each)",
    )
    ap.add_argument(
        "--loader",
        default=TRAIN_LOADERS,
        help="train rows with --data: train.py's --loader, options joined by + "
        "(dali+dali_roi+dali_hw_load=1.0); several settings, comma-separated, a row each",
    )
    ap.add_argument("--workers", type=int, default=8, help="train rows with --data: --workers")
    ap.add_argument("--train_steps", type=int, default=60, help="train rows: --max_steps")
    ap.add_argument(
        "--train_profile",
        type=int,
        default=0,
        help="train rows: --profile_steps (in --logs: profile_train_*.txt, its tables, "
        "and trace_train_*.json.gz, its timeline)",
    )
    ap.add_argument(
        "--train_one",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train rows: the 1-GPU run too (for the efficiency)",
    )
    ap.add_argument(
        "--warm_at_once",
        type=int,
        default=WARM_AT_ONCE,
        help="rows compiled at once before the timing (0: none, each timed run compiles its own)",
    )
    ap.add_argument(
        "--warm_timeout",
        type=float,
        default=1800,
        help="seconds after which a hung warm-up is ended",
    )
    ap.add_argument(
        "--stacks_after",
        type=float,
        default=240,
        help="seconds into a run's first step after which each rank prints its main thread's stack",
    )
    ap.add_argument(
        "--perturbations",
        type=lambda t: [m for m in t.split(",") if m],
        default=["global", "local"],
        help="GAM rows: the modes timed on N GPUs (global,local)",
    )
    ap.add_argument("--busbw", action=argparse.BooleanOptionalAction, default=True)
    a = ap.parse_args(argv)
    if a.warm_at_once < 0:
        raise ValueError(f"--warm_at_once must be >= 0; got {a.warm_at_once}")
    cuda = torch.cuda.is_available()
    quick_runs = QUICK_RUNS if cuda else QUICK_RUNS.replace("r50", "digits")
    a.runs = a.runs or (quick_runs if a.quick else DEFAULT_RUNS)
    a.batch = a.batch or (128 if cuda else 8)
    a.steps = a.steps if a.steps is not None else (5 if a.quick else 20)
    a.warmup = a.warmup if a.warmup is not None else (2 if a.quick else 5)
    a.logs = a.logs or tempfile.mkdtemp(prefix="data_parallel_")
    if a.data == "synthetic":
        a.data = synthetic_folder(Path(a.logs) / "jpeg_folder", a.synthetic_images)
    os.environ.update(NCCL_ENV)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="dp_inductor_"))
    runs = [tuple((r + "::").split(":")[:3]) for r in a.runs.split(",")]
    most = max(a.gpus)
    meta = _common.metadata(
        "data_parallel", "cuda" if cuda else "cpu", gpus=most, quick=a.quick, counts=a.gpus
    )
    meta.update(per_gpu_batch=a.batch, steps=a.steps, windows=a.windows, logs=a.logs)
    if a.data:  # the data path's rows: a file of their own beside the scaling results
        meta.update(part="data_path", data=a.data, loaders=a.loader.split(","), workers=a.workers)
    report = {"benchmark": "data_parallel", "meta": meta, "rows": []}
    print(f"logs and profiles: {a.logs}", flush=True)

    def save():
        _common.save(report, a.out)

    busbw = torch.cuda.is_available() and a.busbw
    report["busbw"] = {n: _result(_launch(a, "r50", "busbw", n), 300) for n in a.gpus if busbw}
    print(f"NCCL all-reduce bus bandwidth: {report['busbw']}", flush=True)
    # Compile every row's step once on all the GPUs (a graph is cached per device), a few at a time
    # in parallel, into one inductor cache that the timed runs then load. GAM compiles in the modes
    # timed (--perturbations):
    # global mode's passes take the global gradient from outside (a gradient pass, an H·v pass),
    # local mode and the 1-GPU step form g and H·g/‖g‖ in one point pass of their own.
    warmed = sorted(
        {
            (m, k, pert)
            for m, k, _ in runs
            if not k.startswith("train") and a.warm_at_once  # 0: each timed run compiles its own
            for pert in (a.perturbations if k.startswith("gam") else ("global",))
        }
    )
    report["compile"] = {}
    for i in range(0, len(warmed), a.warm_at_once or 1):
        part = warmed[i : i + a.warm_at_once]
        warm = [_launch(a, m, k, most, pert, steps=0, warmup=0) for m, k, pert in part]
        for (m, k, pert), p in zip(part, warm, strict=True):
            report["compile"][f"{m}:{k}" + ("" if pert == "global" else f":{pert}")] = _result(
                p, a.warm_timeout
            )
    save()
    for m, k, guard in runs:
        name = f"{m}:{k}" + (f":{guard}" if guard else "")
        both = k.startswith("gam") and guard in ("", "graph")
        perts = a.perturbations if both else ["global"]
        if k.startswith("train"):  # train.py end to end: train_gam_fd is --estimator=gam_fd
            report["rows"] += _train_rows(a, name, m, k.removeprefix("train_"), guard == "graph")
            save()
            continue
        if guard == "twin":  # the 1-GPU step alone, then one copy on every GPU at once
            one = _result(_launch(a, m, k, 1), a.run_timeout)
            twins = [_launch(a, m, k, 1, env={"CUDA_VISIBLE_DEVICES": str(i)}) for i in range(most)]
            copies = [_result(p, a.run_timeout) for p in twins]
            row = {"run": name, "gpus": most, "perturbation": "none", "one": one, "copies": copies}
            rates = [c.get("images_per_s") for c in copies]
            if one.get("images_per_s") and all(rates):
                row["copies_rate_ratio"] = round(min(rates) / one["images_per_s"], 3)
            report["rows"].append(row)
            print(
                f"{name:16s} alone {one.get('ms_per_step')} ms; {most} copies at once "
                f"{[c.get('ms_per_step') for c in copies]} ms",
                flush=True,
            )
            save()
            perts, guard = ["global"], ""
        else:
            one = _result(_launch(a, m, k, 1, guard=guard), a.run_timeout)
        for n in a.gpus:
            for pert in perts:
                tag = f"{name.replace(':', '_')}_{pert}" + (f"_{n}gpus" if len(a.gpus) > 1 else "")
                prof = str(Path(a.logs) / f"profile_{tag}.txt") if n == most else ""
                many = _result(_launch(a, m, k, n, pert, profile=prof, guard=guard), a.run_timeout)
                row = {"run": name, "gpus": n, "perturbation": pert, "one": one, "many": many}
                if "images_per_s" in one and "images_per_s" in many:
                    row["efficiency"] = round(
                        efficiency(many["images_per_s"], one["images_per_s"], n), 3
                    )
                report["rows"].append(row)
                print(_line(row), flush=True)
                save()
    print(f"\n{_common.table(COLUMNS, report['rows'])}\n\nJSON: {_common.save(report, a.out)}")
    return 0


COLUMNS = columns("data_parallel")


def _profiled(prof: dict | None) -> str:
    """A run's profile in a few words: GPU time by kind, the wall-clock step, the host's waits."""
    if not prof:
        return ""
    wall = f" wall {prof['wall_ms']} ms" if "wall_ms" in prof else ""
    return f"profile {prof.get('device_ms')}{wall} host waits {prof.get('host_wait_ms')} ms  "


def _idle(run: dict) -> str:
    """A profiled train.py run's timeline in a few words."""
    t = run.get("timeline")
    if not t:
        return ""
    return (
        f"training stream idle {t['gaps_over_min_ms']} of {t['span_ms']} ms, other streams "
        f"{t['other_streams_ms']} ms ({t['other_streams_overlapping_ms']} beside it)  "
    )


def _line(row: dict) -> str:
    one, many, n = row["one"], row["many"], row["gpus"]
    if "efficiency" not in row and "data_path_cost" not in row:
        return f"{row['run']:12s} {row['perturbation']:6s} error: {one.get('error') or many.get('error')}"
    folder = row.get("folder")
    return (
        f"{row['run']:12s} {row['perturbation']:6s} 1 GPU {one.get('images_per_s')} img/s  "
        f"{n} GPUs {many['images_per_s']:8.1f} img/s  efficiency {row.get('efficiency')}  "
        + _profiled(many.get("profile"))
        + _idle(many)
        + (
            f"{row['loader']} {folder.get('images_per_s') or folder.get('error')} img/s  "
            + _profiled(folder.get("profile"))
            + _idle(folder)
            if folder
            else ""
        )
        + (f"data path cost {row['data_path_cost']:.3f}" if "data_path_cost" in row else "")
    )


if __name__ == "__main__":
    sys.exit(main())
