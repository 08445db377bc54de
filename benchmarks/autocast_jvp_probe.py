"""Where forward-over-reverse H·v meets mixed dtypes under autocast: one line per case.

Each case is a small network and a loss form, and each runs ``jvp(grad(L))`` (exact H·v) under bf16
autocast in three placements of the autocast context:

* ``inside``: autocast around the loss alone, inside the transforms (``gamfunc.precision.bf16``);
* ``head_fp32``: autocast around the model alone, the cross-entropy on float32 logits;
* ``outside``: autocast around the whole ``jvp(grad(L))``, so the backward pass that ``jvp``
  differentiates runs under autocast too.

On a failure it prints torch's message and the last floating-point operations dispatched before it,
with their input dtypes (a ``TorchDispatchMode`` sees the primal and tangent computations apart).
Every H·v that runs is compared with the float64 H·v of the same network, so that a placement which
runs but computes something else is seen too.

    python benchmarks/autocast_jvp_probe.py --device cuda --out probe.json
"""

from __future__ import annotations

import argparse
import traceback

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import gamfunc


class Attention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
        return self.out(a @ v)


class Tokens(nn.Module):
    def __init__(self, body: nn.Module, d: int = 16):
        super().__init__()
        self.embed, self.body, self.head = nn.Linear(8, d), body, nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.body(self.embed(x)).mean(1))


def _conv(bn: bool) -> nn.Module:
    layers = [nn.Conv2d(3, 8, 3, padding=1)]
    layers += [nn.BatchNorm2d(8, track_running_stats=False)] if bn else []
    layers += [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)]
    return nn.Sequential(*layers)


MODELS = {
    "mlp": lambda: Tokens(nn.GELU()),
    "layernorm": lambda: Tokens(nn.LayerNorm(16)),
    "attention": lambda: Tokens(Attention(16)),
    "conv": lambda: _conv(False),
    "conv_bn": lambda: _conv(True),
    "conv_bn_float32": lambda: gamfunc.nn.float32_batchnorm(_conv(True)),
    "conv_bn_elementary": lambda: gamfunc.nn.elementary_norms(_conv(True)),
    "layernorm_elementary": lambda: gamfunc.nn.elementary_norms(Tokens(nn.LayerNorm(16))),
}


class Recorder(TorchDispatchMode):
    """The last floating-point operations dispatched, with their tensor arguments' dtypes."""

    def __init__(self, keep: int = 8):
        super().__init__()
        self.ops: list[str] = []
        self.keep = keep

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dts = [str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)]
        self.ops = [*self.ops[-self.keep + 1 :], f"{func}({', '.join(dts)})"]
        return func(*args, **(kwargs or {}))


def losses(model, device):
    def inside(params, batch):
        x, y = batch
        with torch.autocast(device, torch.bfloat16):
            return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    def head_fp32(params, batch):
        x, y = batch
        with torch.autocast(device, torch.bfloat16):
            logits = torch.func.functional_call(model, params, (x,))
        return F.cross_entropy(logits.float(), y)

    def plain(params, batch):
        x, y = batch
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    return {"inside": inside, "head_fp32": head_fp32, "outside": plain}, plain


def hvp(loss_fn, params, batch, v):
    _, hv = torch.func.jvp(lambda p: torch.func.grad(loss_fn)(p, batch), (params,), (v,))
    return hv


def rel(a, b):
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num / max(den, 1e-300)) ** 0.5


def probe(device: str) -> list[dict]:
    rows = []
    for name, make in MODELS.items():
        torch.manual_seed(0)
        model = make().to(device)
        if "conv" in name:
            x = torch.randn(4, 3, 8, 8, device=device)
        else:
            x = torch.randn(4, 5, 8, device=device)
        y = torch.randint(0, 10, (4,), device=device)
        params = {k: p.detach() for k, p in model.named_parameters()}
        v = {k: torch.randn_like(p) for k, p in params.items()}
        forms, _ = losses(model, device)
        # float32_batchnorm computes in float32 by design: its float64 reference is torch's BatchNorm
        model64 = MODELS[name.removesuffix("_float32")]().to(device).double()
        model64.load_state_dict({k: t.double() for k, t in model.state_dict().items()})
        _, plain64 = losses(model64, device)
        ref = hvp(
            plain64,
            {k: t.double() for k, t in params.items()},
            (x.double(), y),
            {k: t.double() for k, t in v.items()},
        )
        for form, loss_fn in forms.items():
            rec = Recorder()
            row = {"model": name, "form": form, "torch": torch.__version__}
            try:
                with rec:
                    if form == "outside":
                        with torch.autocast(device, torch.bfloat16):
                            hv = hvp(loss_fn, params, (x, y), v)
                    else:
                        hv = hvp(loss_fn, params, (x, y), v)
                row.update(ok=True, rel_err_vs_fp64=rel(hv, ref))
                row["dtypes"] = sorted({str(t.dtype) for t in hv.values()})
            except Exception as e:  # the probe reports every failure
                row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                row["last_ops"] = rec.ops
                row["trace"] = traceback.format_exc().splitlines()[-12:]
            rows.append(row)
            status = f"ok  rel {row['rel_err_vs_fp64']:.2e}" if row["ok"] else row["error"]
            print(f"{name:22s} {form:10s} {status}", flush=True)
            if not row["ok"]:
                for op in row["last_ops"][-4:]:
                    print(f"{'':34s}{op}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = probe(a.device)
    if a.out:
        from reproduce.run.report import write_json  # after the path is set

        write_json(a.out, rows)


if __name__ == "__main__":
    main()
