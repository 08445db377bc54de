"""ImageNet presets on 1 and N GPUs through the README's own ``torchrun reproduce/train.py`` commands.

For each preset and estimator, runs ``reproduce/train.py`` compiled, bf16 (channels-last for ResNets),
with the GPU data pipeline, ``--steps`` steps on a JPEG ImageFolder (``benchmarks/jpeg_folder.py``):
once on one GPU with the per-GPU batch of the N-GPU run, once on N GPUs with the preset's global
batch (256), and reads each run's ``summary.json``: images/s (steady state, compilation excluded),
images/s per GPU, the first step's seconds (cold compile on the 1-GPU run: a fresh inductor cache;
the N-GPU run reuses it), peak memory, and the scaling efficiency (N-GPU images/s over N times the
1-GPU figure at the same per-GPU batch). It prints a table and writes JSON.

    python benchmarks/imagenet_scaling.py --data /tmp/imagenet-synth --gpus 4 \\
        --runs resnet50:sgd resnet50:gam --out benchmarks/results/imagenet_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = [
    "--progress=false",
    "--landscape=false",
    "--eig_iters=0",
    "--trace_samples=0",
    "--r1_steps=0",
]


def one(preset: str, estimator: str, gpus: int, batch: int, args, cache: str) -> dict:
    logdir = Path(args.logdir) / f"{preset}.{estimator}.{gpus}gpu"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
    ]
    cmd += [
        str(ROOT / "reproduce/train.py"),
        f"--preset=hp2.imagenet.{preset}",
        f"--data={args.data}",
    ]
    cmd += ["--compile", "--bf16", f"--estimator={estimator}", f"--batch_size={batch}"]
    cmd += ["--channels_last"] if preset.startswith("resnet") else []
    cmd += [f"--max_steps={args.steps}", "--log_every=5", f"--logdir={logdir}", "--overwrite"]
    cmd += [f"--workers={args.workers}", f"--loader={args.loader}", *QUIET, *args.extra]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    log = logdir.with_suffix(".log")  # streamed, so that a run stopped by the timeout leaves it
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        try:
            code = subprocess.run(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {args.timeout} s"
    wall = time.perf_counter() - start
    tail = log.read_text()[-3000:]
    print(f"$ {' '.join(cmd[3:])}\n{tail}", flush=True)
    if code != 0:
        error = f"exit {code}" if isinstance(code, int) else code
        return {
            "preset": preset,
            "estimator": estimator,
            "gpus": gpus,
            "error": error,
            "log": tail[-800:],
        }
    (s,) = [json.loads(p.read_text()) for p in logdir.rglob("summary.json")]
    return {
        "preset": preset,
        "estimator": estimator,
        "gpus": gpus,
        "global_batch": batch,
        "images_per_s": s["images_per_s"],
        "images_per_s_per_gpu": s["images_per_s_per_process"],
        "first_step_s": s["compile_seconds"],
        "peak_memory_gib": s["peak_memory_gib"],
        "loader": s["loader"],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--runs", nargs="+", default=["resnet50:sgd", "resnet50:gam"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256, help="global batch of the N-GPU run")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--loader", default="auto")
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument(
        "--extra", nargs="*", default=[], help="more train.py flags, e.g. --bf16_hvp=exact"
    )
    ap.add_argument("--logdir", default=tempfile.mkdtemp(prefix="imagenet-runs-"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    rows = []
    for run in args.runs:
        preset, estimator = run.split(":")
        cache = tempfile.mkdtemp(
            prefix="inductor-"
        )  # cold for the 1-GPU run, reused by the N-GPU one
        single = one(preset, estimator, 1, args.batch // args.gpus, args, cache)
        multi = one(preset, estimator, args.gpus, args.batch, args, cache)
        if "error" not in single and "error" not in multi:
            multi["scaling_efficiency"] = round(
                multi["images_per_s"] / (args.gpus * single["images_per_s"]), 3
            )
        rows += [single, multi]
        out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
        if args.out:
            from reproduce.run.report import write_json  # after the path is set

            write_json(args.out, out)
    print(
        f"{'preset':<10}{'estimator':<10}{'gpus':>5}{'batch':>6}{'img/s':>9}{'/gpu':>8}{'eff':>6}{'1st step s':>11}{'GiB':>7}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:<10}{r['estimator']:<10}{r['gpus']:>5}  failed")
            continue
        eff = r.get("scaling_efficiency", "")
        print(
            f"{r['preset']:<10}{r['estimator']:<10}{r['gpus']:>5}{r['global_batch']:>6}"
            f"{r['images_per_s']:>9.0f}{r['images_per_s_per_gpu']:>8.0f}{eff!s:>6}"
            f"{r['first_step_s']!s:>11}{r['peak_memory_gib']!s:>7}"
        )


if __name__ == "__main__":
    main()
