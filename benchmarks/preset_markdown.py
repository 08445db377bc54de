"""Markdown rows of reproduce/README.md's hours from benchmarks/preset_speed.py's JSON.

Prints, for every measured row, a table (images/s, ms/step, × grad step, first step, peak memory,
hours on 1 GPU and on ``--gpus``), then one line per preset in the README's words ("SGD 0.16 h, GAM
1.1 h") for its "1 GPU" and "8 GPUs" cells. A run that fits one GPU (everything but ImageNet) does
not split usefully over GPUs: on 8 GPUs it is 8 runs at once, each in its 1-GPU time. An ImageNet
preset trains over all GPUs (torchrun): its hours there are the run's images ÷ (GPUs × a per-GPU
rate), the rate given by ``--per_gpu_rate preset:estimator=IMAGES_PER_S`` (measured under torchrun,
e.g. benchmarks/imagenet_scaling.py) or ``--scaling`` × the 1-GPU rate; without either, "–".

    python benchmarks/preset_markdown.py speed.json compiled.json \\
        --per_gpu_rate hp2.imagenet.vit_b32:gam=400 --per_gpu_rate hp2.imagenet.vit_b32:sgd=1700
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["fmt_hours", "gpu_hours", "main", "rows_markdown"]

LABELS = {
    "sgd": "SGD",
    "sam": "SAM",
    "gnp": "GNP",
    "gam": "GAM",
    "gam_fd": "GAM (finite-difference H·v)",
    "gam_reverse": "GAM (reverse H·v)",
    "gam_accelerated": "accelerated GAM",
    "gam_accelerated_official": "accelerated GAM (authors')",
    "sam+gam": "SAM+GAM",
}


def fmt_hours(h: float | None) -> str:
    """Two significant digits, as the README writes hours: 0.16 h, 1.1 h, 11 h, 330 h."""
    if h is None:
        return "–"
    v = float(f"{h:.2g}")
    return f"{v:g} h" if v < 100 else f"{v:.0f} h"


def _label(row: dict) -> str:
    name = LABELS.get(row["estimator"], row["estimator"])
    if row["estimator"] == "sgd" and row.get("base") == "adamw":
        name = "AdamW"
    return name


def _how(row: dict) -> str:
    """How the step ran: eager or compiled (scope), bf16, channels-last."""
    how = ["eager" if row["compile"] == "eager" else f"compiled ({row['compile']})"]
    how += [k.replace("_", "-") for k in ("bf16", "channels_last") if row.get(k)]
    return ", ".join(how)


def gpu_hours(row: dict, gpus: int, rates: dict[str, float], scaling: float) -> str:
    """The "N GPUs" cell of one row."""
    if row.get("dataset") != "imagenet":
        return f"{gpus} runs at once, {fmt_hours(row['hours_1gpu'])} each"
    rate = rates.get(f"{row['preset']}:{row['estimator']}")
    if rate is None and scaling:
        rate = scaling * row["images_per_s"]
    if rate is None:
        return "– (give --per_gpu_rate or --scaling)"
    return fmt_hours(row["run_images"] / (gpus * rate * 3600))


def rows_markdown(results: list[dict], gpus: int = 8, rates=None, scaling: float = 0.0) -> str:
    """The table and the README cells of ``results`` (preset_speed.py's JSON objects)."""
    rates = rates or {}
    out = []
    for res in results:
        f = res["flags"]
        how = ", ".join(k for k in ("bf16", "channels_last", "compile") if f.get(k)) or "eager"
        if f.get("compile"):
            how += f", scope {f.get('scope')}"
        out.append(
            f"<!-- {res['device']}, torch {res['torch']}, {res['date']}: {how}; "
            f"{f['steps']} steps timed after {f['warmup']} -->"
        )
    out += [
        "",
        f"| preset | estimator | step | img/s | ms/step | × grad step | first step | peak GiB "
        f"| 1 GPU | {gpus} GPUs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    good = [r for res in results for r in res["rows"] if not r.get("error")]
    for res in results:
        for r in res["rows"]:
            if r.get("error"):
                out.append(
                    f"| `{r['preset']}` | {r['estimator']} | | failed: {r['error']} | | | | | | |"
                )
                continue
            x = r.get("x_grad_step")
            mem = r.get("peak_memory_gib")
            out.append(
                f"| `{r['preset']}` | {_label(r)} | {_how(r)} | {r['images_per_s']:,.0f} "
                f"| {r['ms_per_step']:.2f} | {'–' if x is None else f'{x:.2f}'} "
                f"| {r['first_step_s']:.1f} s | {'–' if mem is None else f'{mem:.2f}'} "
                f"| {fmt_hours(r['hours_1gpu'])} | {gpu_hours(r, gpus, rates, scaling)} |"
            )
    out += ["", f"README cells (1 GPU | {gpus} GPUs):", ""]
    presets = list(dict.fromkeys(r["preset"] for r in good))
    for p in presets:
        mine = [r for r in good if r["preset"] == p]
        one = ", ".join(f"{_label(r)} {fmt_hours(r['hours_1gpu'])}" for r in mine)
        if mine[0].get("dataset") == "imagenet":
            many = ", ".join(f"{_label(r)} {gpu_hours(r, gpus, rates, scaling)}" for r in mine)
        else:
            many = f"{gpus} runs at once"
        out.append(f"- `{p}`: {one} | {many}")
    return "\n".join(out)


def _rates(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        for part in filter(None, (s.strip() for s in item.split(","))):
            key, eq, value = part.rpartition("=")
            if not eq or ":" not in key:
                raise ValueError(
                    f"--per_gpu_rate takes preset:estimator=IMAGES_PER_S; got {part!r}"
                )
            out[key] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="preset_speed.py outputs")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--per_gpu_rate", action="append", default=[], help="preset:estimator=IMG_S")
    ap.add_argument("--scaling", type=float, default=0.0, help="per-GPU rate ÷ 1-GPU rate")
    args = ap.parse_args(argv)
    try:
        rates = _rates(args.per_gpu_rate)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = [json.loads(Path(p).read_text()) for p in args.json]
    print(rows_markdown(results, args.gpus, rates, args.scaling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
