"""Every method × seed of one config, the runs that ``spectra``, ``accuracy`` and ``noise`` share,
and their accuracy table."""

from __future__ import annotations

from typing import Any

from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    base_config,
    flatness,
    mean_std,
    method_config,
    pm,
    probe_batch,
    table,
    train,
    train_together,
)


def run_grid(opt, methods, *, spectra: bool, **extra) -> dict[str, list[dict[str, Any]]]:
    """Every method × seed; with ``spectra``, eigenvalues and trace at mid-training and at the end."""
    base = base_config(opt, **extra)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for method in methods:
        named = [
            method_config(base, method, seed, opt.gnp_alpha, opt.sam_gam, opt.gam)
            for seed in range(opt.seeds)
        ]
        together = train_together([c for _, c in named], named[0][0]) if opt.vmap else None
        for seed, (name, cfg) in enumerate(named):
            if together is not None:
                rec = {k: together[seed][k] for k in ("train_acc", "test_acc", "val_acc", "gap")}
                runs[method].append(rec | {"step_ms": together[seed]["step_ms"], "seed": seed})
                print(f"{method} seed {seed}: test {rec['test_acc']:.1f}% (vmapped)", flush=True)
                continue
            mid: dict[str, Any] = {}
            half = max(cfg.epochs // 2, 1) - 1

            def on_epoch(epoch, params, buffers, loss_fn, cfg=cfg, mid=mid, half=half):
                if spectra and epoch == half and epoch != cfg.epochs - 1:
                    batch = probe_batch(data_mod.load(cfg).probe, opt.probe)
                    mid.update(flatness(params, buffers, loss_fn, batch, opt, cfg.seed))

            r = train(cfg, name, on_epoch=on_epoch)
            rec = {k: r[k] for k in ("train_acc", "test_acc", "val_acc", "gap", "step_ms")}
            rec["seed"] = seed
            if spectra:
                batch = probe_batch(r["data"].probe, opt.probe)
                end = flatness(r["params"], r["buffers"], r["loss_fn"], batch, opt, seed)
                rec["end"] = end
                rec["mid"] = mid or end
            runs[method].append(rec)
            print(f"{method} seed {seed}: test {rec['test_acc']:.1f}%", flush=True)
    return runs


def accuracy_rows(runs) -> list[list[str]]:
    return [
        [m, pm([r["train_acc"] for r in rs]), pm([r["test_acc"] for r in rs]),
         pm([r["gap"] for r in rs]), f"{mean_std([r['step_ms'] for r in rs])[0]:.1f}"]
        for m, rs in runs.items()
    ]  # fmt: skip


ACC_HEADER = ["method", "train acc %", "test acc %", "gap (train − test)", "ms/step"]


def accuracy_table(record: dict[str, Any]) -> str:
    """The markdown table of ``accuracy``'s JSON (or of ``spectra``'s runs): train and test
    accuracy, gap and ms/step per method."""
    return table(ACC_HEADER, accuracy_rows(record["runs"]))
