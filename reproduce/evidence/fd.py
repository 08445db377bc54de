"""Why finite-difference GAM collapses on a ReLU MLP: dead units along training, and the error of the
finite-difference H·v against the exact one, on ReLU and GELU MLPs."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from gamfunc import hvps, metrics, tree
from gamfunc.loss import gradient_pass
from reproduce.data import sets as data_mod
from reproduce.evidence.common import (
    GAM,
    base_config,
    eval_loss,
    pm,
    probe_batch,
    table,
    train,
    write,
)

ACTIVATION_OF = {"mlp": torch.relu, "mlp_gelu": torch.nn.functional.gelu}


def hidden_preactivations(model: str, params, x: torch.Tensor) -> list[torch.Tensor]:
    """The pre-activations ``[z1, z2]`` (examples × 100) of the two hidden layers of an MLP."""
    act = ACTIVATION_OF[model]
    z1 = x @ params["net.0.weight"].T + params["net.0.bias"]
    z2 = act(z1) @ params["net.2.weight"].T + params["net.2.bias"]
    return [z1, z2]


def dead_units(model: str, params, x: torch.Tensor) -> list[float]:
    """Per hidden layer, the % of units whose pre-activation is <= 0 on every example of ``x``
    (for ReLU: units with zero output and zero gradient on the whole batch)."""
    return [
        100 * float((z <= 0).all(0).float().mean()) for z in hidden_preactivations(model, params, x)
    ]


def hvp_error(model: str, params, batch, loss, rho: float, radii) -> dict[float, dict[str, float]]:
    """At GAM's θ_adv = θ + ρ·f/‖f‖ (f = H·g/‖g‖ exact) and v = ∇L(θ_adv)/‖∇L(θ_adv)‖, the fd
    H·v ≈ (∇L(θ_adv + r·v) − ∇L(θ_adv))/r (paper Appendix D) against the exact (jvp) H·v, per r:
    cosine, norm ratio ‖fd‖/‖exact‖, the number of (example, unit) pre-activations whose sign flips
    between θ_adv and θ_adv + r·v, and ``push``: the mean over the second layer's biases of fd − exact,
    in units of the rms of exact's (> 0: a descent step lowers those biases, i.e. turns units off)."""
    f, _ = hvps.grad_norm_grad(loss, params, batch, hvps.exact())
    adv = tree.axpy(rho, tree.normalize(f)[0], params)
    v = tree.normalize(gradient_pass(loss, adv, batch).grad)[0]
    exact, _ = hvps.exact()(loss, adv, batch, v)
    signs = [z > 0 for z in hidden_preactivations(model, adv, batch[0])]
    out = {}
    for r in radii:
        fd, _ = hvps.fd(r)(loss, adv, batch, v)
        moved = hidden_preactivations(model, tree.axpy(r, v, adv), batch[0])
        bias = fd["net.2.bias"] - exact["net.2.bias"]
        rms = float(exact["net.2.bias"].pow(2).mean().sqrt())
        out[r] = dict(
            cos=float(tree.vdot(fd, exact) / (tree.norm(fd) * tree.norm(exact))),
            ratio=float(tree.norm(fd) / tree.norm(exact)),
            flips=sum(int(((z > 0) != s).sum()) for z, s in zip(moved, signs, strict=True)),
            push=float(bias.mean()) / rms if rms > 0 else 0.0,
        )
    return out


def cmd_fd(opt) -> None:
    """Finite-difference vs exact GAM on ReLU and GELU MLPs: dead units and the error of fd H·v."""
    radii = [float(x) for x in opt.radii.split(",")]
    if not radii or min(radii) <= 0:
        raise ValueError(f"--radii must be numbers > 0; got {opt.radii!r}")
    runs: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, dict[int, list]] = {}
    last = opt.epochs - 1
    checkpoints = sorted({0, max(opt.epochs // 10, 1) - 1, max(opt.epochs // 2, 1) - 1, last})
    for model in ACTIVATION_OF:
        base = dataclasses.replace(base_config(opt, model=model), **GAM)
        for r in [None, *radii]:
            if model != "mlp" and r not in (None, 1e-3, min(radii)):
                continue  # the smooth net: exact, fd at the variants' r = 1e-3 and the smallest r
            label = f"{model}, " + ("exact" if r is None else f"fd r = {r:g}")
            runs[label] = []
            for seed in range(opt.seeds):
                cfg = dataclasses.replace(base, seed=seed, fd_radius=r or base.fd_radius)
                x, y = probe_batch(data_mod.load(cfg).probe, opt.probe)
                dead: list[list[float]] = []
                probe_err = r is None and seed == 0

                def on_epoch(
                    epoch,
                    params,
                    buffers,
                    loss_fn,
                    x=x,
                    y=y,
                    dead=dead,
                    probe_err=probe_err,
                    model=model,
                ):
                    dead.append(dead_units(model, params, x))
                    if probe_err and epoch in checkpoints:
                        loss = eval_loss(loss_fn, buffers)
                        errors.setdefault(model, {})[epoch + 1] = [
                            hvp_error(model, params, (x[i : i + 100], y[i : i + 100]), loss,
                                      GAM["rho"], radii)
                            for i in range(0, len(x) - 99, 100)
                        ]  # fmt: skip

                res = train(cfg, "gam" if r is None else "gam_fd", on_epoch=on_epoch)
                lam = metrics.top_eigenvalues(
                    res["params"], (x, y), eval_loss(res["loss_fn"], res["buffers"]), k=1,
                    iters=opt.iters, generator=data_mod.generator(seed, 14),
                )  # fmt: skip
                keys = ("train_acc", "test_acc", "step_ms")
                runs[label].append(
                    dict({k: res[k] for k in keys}, seed=seed, dead=dead, lambda_max=float(lam[0]))
                )
                print(f"{label} seed {seed}: test {res['test_acc']:.1f}%", flush=True)
    # epochs and radii as string keys, as the JSON is read back
    read_back = {
        m: {str(k): [{str(r): x for r, x in b.items()} for b in bs] for k, bs in e.items()}
        for m, e in errors.items()
    }
    record = {"runs": runs, "hvp_error": read_back}
    settings = {"radii": opt.radii, "epochs": opt.epochs, "probe": opt.probe}
    md = fd_table({**record, "settings": settings})
    write(opt.out, "fd", md, record, opt)


def fd_table(record: dict[str, Any]) -> str:
    """The markdown of ``fd``'s JSON: the training table (accuracy, dead units, λ_max) and, per
    model, the error of fd H·v along exact GAM (the same text ``fd`` prints)."""
    settings = record["settings"]
    radii = [float(x) for x in settings["radii"].split(",")]
    epochs = settings["epochs"]
    early = min(max(epochs // 10, 1), epochs) - 1
    rows = [
        [label, pm([r["train_acc"] for r in rs], 1), pm([r["test_acc"] for r in rs], 1),
         pm([r["dead"][early][1] for r in rs], 1), pm([r["dead"][-1][0] for r in rs], 1),
         pm([r["dead"][-1][1] for r in rs], 1), pm([r["lambda_max"] for r in rs])]
        for label, rs in record["runs"].items()
    ]  # fmt: skip
    header = [
        "GAM (ρ = 0.5, α = 1)", "train acc %", "test acc %", f"dead layer 2 % (epoch {early + 1})",
        "dead layer 1 % (end)", "dead layer 2 % (end)", "λ_max",
    ]  # fmt: skip
    md = "Training (dead: pre-activation <= 0 on every probe example):\n\n" + table(header, rows)
    for model, by_epoch in record["hvp_error"].items():
        rows = []
        for epoch, batches in by_epoch.items():
            cells = [epoch]
            for r in radii:
                e = [b[str(r)] for b in batches]
                cos = float(torch.tensor([x["cos"] for x in e], dtype=torch.float64).median())
                ratio = float(torch.tensor([x["ratio"] for x in e], dtype=torch.float64).median())
                cells.append(
                    f"{cos:.2f} / {ratio:.2f} / {max(x['ratio'] for x in e):.1f} / "
                    f"{sum(x['flips'] for x in e) / len(e):.1f}"
                )
            rows.append(cells)
        points = sum(map(len, by_epoch.values()))
        push = [
            f"{sum(b[str(r)]['push'] for bs in by_epoch.values() for b in bs) / points:+.2f}"
            for r in radii
        ]
        rows.append(["push (mean)", *push])
        md += (
            f"\n{model}, along exact GAM (seed 0), at θ_adv on {settings['probe'] // 100} batches "
            "of 100: median cos / median ‖fd‖/‖exact‖ / max ‖fd‖/‖exact‖ / sign flips per batch:\n\n"
            + table(["epoch"] + [f"r = {r:g}" for r in radii], rows)
        )
    return md
