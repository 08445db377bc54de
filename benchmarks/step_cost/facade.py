"""``--facade``: the ``torch.optim`` facade (:mod:`gamfunc.torch_optim`) against the functional step
and against davda54/sam's two-pass SAM, on one model and precision, in the same process.

Per estimator (``gam_fd``, ``gam_exact``, ``sam``, or those of ``--facade-estimators``) two rows in
the mode ``--facade-mode`` (``compile`` by default, ``eager`` with ``--quick``; ``pass-graph``: both
compiled pass by pass and each step replayed as one CUDA graph):

- ``facade``: ``GAM(model, base, rho=..., alpha=..., hvp=..., compile=..., precision=...)`` (``SAM``
  for ``sam``), ``base`` a ``torch.optim`` optimiser over the model's parameters: ``SGD(lr,
  momentum=0.9)`` for the convolutional networks, ``AdamW(lr)`` for ViT-S/32, fused where the device
  has fused kernels;
- ``make_step``: ``gamfunc.make_step`` with the equivalent gamfunc optimiser (``gamfunc.sgd(lr,
  momentum=0.9)`` or ``gamfunc.adamw(lr)``), compiled as the functional rows of that mode are
  (``step.compile(fullgraph=True)`` for ``compile``, ``scope="pass"`` for ``pass``).

And, where ``sam`` is timed, three eager SAM rows: ``davda54`` (davda54/sam's algorithm, written out
in :class:`Davda54SAM`), the eager ``facade`` SAM over the same base optimiser, and the same with
``on_nonfinite="ignore"`` (``facade_unguarded``): without the non-finite guard, which davda54/sam does
not have. ``x_make_step`` is a facade row's images/s ÷ the ``make_step`` row's of the same estimator
and mode; ``x_davda54`` an eager facade SAM's ÷ davda54's.
"""

from __future__ import annotations

import copy
import statistics

import torch
import torch.nn.functional as F
from torch import nn

import gamfunc
from benchmarks.step_cost.methods import rho_at, rho_schedule
from benchmarks.step_cost.models import prepare
from benchmarks.step_cost.runners import Functional, autocast, compile_options, split_mode
from benchmarks.step_cost.timing import log, setup, time_rows
from gamfunc import torch_optim

ESTIMATORS = ("gam_fd", "gam_exact", "sam")
HVP = {"gam_fd": "fd", "gam_exact": "exact"}  # GAM's H·v backend per row
# The facade's and make_step's rows: both compiled (make_step whole, "compile", or pass by pass,
# "pass", as the facade over a torch.optim optimiser compiles; with CUDA graphs, "-reduce-overhead"),
# or both eager.
# "pass-graph": both compiled pass by pass and replayed as one CUDA graph a step (the facade's
# cuda_graph=True, gamfunc.cuda_graph for make_step).
MODES = ("compile", "pass", "reduce-overhead", "pass-reduce-overhead", "pass-graph", "eager")
GRAPH = "pass-graph"
ADAMW_LR = 1e-3  # ViT-S/32's base optimiser; SGD takes --lr
# The davda54/sam file followed by Davda54SAM.
DAVDA54 = "https://github.com/davda54/sam, sam.py (SAM.first_step, SAM.second_step), adaptive=False"
# The eager facade SAM with on_nonfinite="ignore": davda54/sam has no non-finite guard.
UNGUARDED = "facade_unguarded"


def base_kind(model_name: str) -> str:
    """The base optimiser of a model's rows.

    Args:
        model_name: a key of :data:`.models.MODELS`.

    Returns:
        ``"AdamW"`` for ViT-S/32, ``"SGD"`` for the others.
    """
    return "AdamW" if model_name == "vit_s32" else "SGD"


def fused_ok(device: torch.device) -> bool:
    """Whether ``torch.optim`` has fused kernels for ``device``.

    Args:
        device: the device of the run.

    Returns:
        True where ``fused=True`` is accepted.
    """
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return device.type in _get_fused_kernels_supported_devices()


def torch_base(
    kind: str, params, lr: float, device: torch.device, capturable: bool = False
) -> torch.optim.Optimizer:
    """The ``torch.optim`` base optimiser of the facade and davda54 rows.

    Args:
        kind: ``"SGD"`` or ``"AdamW"`` (:func:`base_kind`).
        params: the parameters it moves.
        lr: SGD's learning rate (AdamW takes :data:`ADAMW_LR`).
        device: the device, for ``fused``.
        capturable: AdamW built with ``capturable=True`` (for a CUDA graph; SGD has no such option).

    Returns:
        ``torch.optim.SGD(lr, momentum=0.9)`` or ``torch.optim.AdamW(ADAMW_LR)``, fused where the
            device allows.
    """
    fused = fused_ok(device)
    if kind == "AdamW":
        return torch.optim.AdamW(params, lr=ADAMW_LR, fused=fused, capturable=capturable)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, fused=fused)


def gamfunc_base(kind: str, lr: float) -> gamfunc.Transform:
    """The gamfunc optimiser that computes what :func:`torch_base` computes.

    Args:
        kind: ``"SGD"`` or ``"AdamW"``.
        lr: SGD's learning rate.

    Returns:
        ``gamfunc.sgd(lr, momentum=0.9)`` or ``gamfunc.adamw(ADAMW_LR)``.
    """
    if kind == "AdamW":
        return gamfunc.adamw(lr=ADAMW_LR)
    return gamfunc.sgd(lr=lr, momentum=0.9)


def plan(mode: str, estimators=ESTIMATORS) -> list[tuple[str, str, str]]:
    """The rows of one model and precision.

    Args:
        mode: ``--facade-mode``.
        estimators: ``--facade-estimators``, names in :data:`ESTIMATORS`.

    Returns:
        ``(method, estimator, mode)`` of every row: facade and make_step per estimator in ``mode``,
            then, where ``sam`` is among them, davda54's SAM, the facade's SAM and the facade's SAM
            without its guard (:data:`UNGUARDED`), eager (the facade's once, where ``mode`` is
            "eager").
    """
    rows = [(m, e, mode) for e in ESTIMATORS if e in estimators for m in ("facade", "make_step")]
    extras = (("davda54", "sam", "eager"), ("facade", "sam", "eager"), (UNGUARDED, "sam", "eager"))
    for extra in extras if "sam" in estimators else ():
        if extra not in rows:
            rows.append(extra)
    return rows


class FacadeStep:
    """One ``optimizer.step((x, y))`` of a :mod:`gamfunc.torch_optim` facade on its own copy of the
    model, over a ``torch.optim`` base optimiser: ``compile=True`` unless ``mode`` is "eager", with
    ``compile_options={"mode": ...}`` for a mode such as "reduce-overhead" (CUDA graphs) and
    ``--inductor``'s options; ``cuda_graph=True`` (a capturable base optimiser) in
    :data:`GRAPH` mode."""

    def __init__(self, model, batch, estimator, hvp, kind, a, device, dtype, mode):
        self.model, self.batch = copy.deepcopy(model).train(), batch
        graph = mode == GRAPH
        base = torch_base(kind, self.model.parameters(), a.lr, device, capturable=graph)
        rho = rho_schedule(a.rho)
        compiled = mode != "eager"
        common = {"compile": compiled, "precision": dtype, "on_nonfinite": a.on_nonfinite}
        if graph:
            common["cuda_graph"] = True
        options = {}
        if compiled and split_mode(mode)[1] not in ("compile", "graph"):  # reduce-overhead
            options["mode"] = split_mode(mode)[1]
        if compiled and a.inductor_options:  # --inductor, as for make_step's compile
            options["options"] = dict(a.inductor_options)
        if options:
            common["compile_options"] = options
        self.cuda_graphs = compiled and bool(
            compile_options("pass" if graph else mode, a.inductor_options).get("triton.cudagraphs")
        )
        if estimator == "sam":
            self.opt = torch_optim.SAM(self.model, base, rho=rho, **common)
        else:
            self.opt = torch_optim.GAM(self.model, base, rho=rho, alpha=a.alpha, hvp=hvp, **common)
        self.every, self.compiled = 1, compiled

    def __call__(self):
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        self.opt.step(self.batch)


class Davda54SAM:
    """davda54/sam's SAM around a ``torch.optim`` base optimiser, eager, as its README's loop calls
    it: forward and backward (BatchNorm statistics updated), ``first_step`` (e_w = ρ·g/‖g‖ added to
    the weights in place, the weights kept), forward and backward at θ + e_w (BatchNorm momentum 0,
    its ``disable_running_stats``), ``second_step`` (the weights restored, ``base.step()``), the
    gradients zeroed. bf16: the forwards under autocast. ρ follows the cosine of the functional
    rows, read as a Python float once per step."""

    def __init__(self, model, batch, kind, a, device, dtype):
        self.model, self.batch = copy.deepcopy(model).train(), batch
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.base = torch_base(kind, self.params, a.lr, device)
        self.norms = [
            m for m in self.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        self.rho, self.device, self.dtype, self.t = a.rho, device, dtype, 0
        self.every, self.compiled = 1, False

    def loss_backward(self):
        x, y = self.batch
        with autocast(self.device, self.dtype):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss

    @torch.no_grad()
    def first_step(self):
        grads = [p.grad for p in self.params if p.grad is not None]
        grad_norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2)
        scale = rho_at(self.rho, self.t) / (grad_norm + 1e-12)
        self.old = [p.data.clone() for p in self.params]
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad * scale.to(p))
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def second_step(self):
        for p, old in zip(self.params, self.old, strict=True):
            p.data = old
        self.base.step()
        for p in self.params:
            p.grad = None

    def __call__(self):
        self.loss_backward()
        self.first_step()
        momenta = [m.momentum for m in self.norms]
        for m in self.norms:
            m.momentum = 0
        self.loss_backward()
        for m, momentum in zip(self.norms, momenta, strict=True):
            m.momentum = momentum
        self.second_step()
        self.t += 1


def factory(method, estimator, mode, g, model_name, a, device):
    """How to build the runner of one row.

    Args:
        method: "facade", :data:`UNGUARDED`, "make_step" or "davda54".
        estimator: a name in :data:`ESTIMATORS`.
        mode: the row's mode (:data:`MODES`).
        g: the prepared group (:func:`.models.prepare`).
        model_name: the model's name, for the base optimiser.
        a: the parsed flags.
        device: the device.

    Returns:
        A function of no argument that returns the runner.
    """
    kind = base_kind(model_name)
    hvp = HVP.get(estimator)
    if method == "davda54":
        return lambda: Davda54SAM(g.model, g.batch, kind, a, device, g.dtype)
    if method == "facade":
        return lambda: FacadeStep(g.model, g.batch, estimator, hvp, kind, a, device, g.dtype, mode)
    if method == UNGUARDED:
        unguarded = copy.copy(a)
        unguarded.on_nonfinite = "ignore"
        return lambda: FacadeStep(
            g.model, g.batch, estimator, hvp, kind, unguarded, device, g.dtype, mode
        )
    rho = rho_schedule(a.rho)
    est = gamfunc.sam(rho) if estimator == "sam" else gamfunc.gam(rho, a.alpha, hvp=hvp)
    step = gamfunc.make_step(est, gamfunc_base(kind, a.lr), g.loss_fn, on_nonfinite=a.on_nonfinite)
    if mode == GRAPH:
        return lambda: graphed(step, g, a)
    return lambda: Functional(step, g.params, g.buffers, g.batch, mode, 1, a.inductor_options)


def graphed(step, g, a) -> Functional:
    """make_step's runner in :data:`GRAPH` mode: compiled pass by pass, then ``gamfunc.cuda_graph``.

    Args:
        step: the make_step step.
        g: the prepared group.
        a: the parsed flags.

    Returns:
        The runner.
    """
    runner = Functional(step, g.params, g.buffers, g.batch, "pass", 1, a.inductor_options)
    runner.fn = gamfunc.cuda_graph(runner.fn)
    return runner


def ratios(rows):
    """Fill the ratios of the facade rows in place.

    Args:
        rows: the timed rows of one model and precision; each facade row gets ``x_make_step``
            (images/s ÷ the ``make_step`` row's of the same estimator and mode), an eager facade
            SAM (guarded or not) also ``x_davda54`` (images/s ÷ the ``davda54`` row's); and beside
            each, ``_rounds``:
            the middle half of the same ratio taken round by round (`per_round`).
    """
    by = {(r["method"], r["estimator"], r["mode"]): r for r in rows if r.get("img_s")}
    davda54 = by.get(("davda54", "sam", "eager"))
    for r in rows:
        if r["method"] not in ("facade", UNGUARDED) or not r.get("img_s"):
            continue
        ref = by.get(("make_step", r["estimator"], r["mode"]))
        if ref and r["method"] == "facade":
            r["x_make_step"] = r["img_s"] / ref["img_s"]
            r["x_make_step_rounds"] = per_round(ref.get("ms_samples"), r.get("ms_samples"))
        if davda54 and r["estimator"] == "sam" and r["mode"] == "eager":
            r["x_davda54"] = r["img_s"] / davda54["img_s"]
            r["x_davda54_rounds"] = per_round(davda54.get("ms_samples"), r.get("ms_samples"))


def per_round(reference_ms, ms) -> str | None:
    """How a ratio of images/s varies from round to round: the median and the first and third
    quartiles of ``reference_ms[i] ÷ ms[i]`` over the rounds i, which are interleaved, so that each
    pair ran close in time. On a machine whose speed drifts between rounds (a step that the host
    bounds), the ratio of the two medians can sit anywhere in that range; the median of the paired
    ratios is the steadier figure.

    Args:
        reference_ms: the reference row's ms/step, one per round.
        ms: the row's, one per round.

    Returns:
        ``"median (q1–q3)"`` to three decimals; None with fewer than two rounds.
    """
    pairs = [a / b for a, b in zip(reference_ms or (), ms or (), strict=False)]
    if len(pairs) < 2:
        return None
    q1, median, q3 = statistics.quantiles(pairs, n=4, method="inclusive")
    return f"{median:.3f} ({q1:.3f}–{q3:.3f})"


def run_facade(model_name, token, a, device, meta) -> list[dict]:
    """Set up, then time (interleaved), the rows of :func:`plan`.

    Args:
        model_name: a key of :data:`.models.MODELS`.
        token: the precision (``fp32``, ``bf16-cl``, ...).
        a: the parsed flags.
        device: the device.
        meta: the run's metadata; the model's source is added.

    Returns:
        The rows; one that failed says why in ``error`` and the others went on.
    """
    g = prepare(model_name, token, a, device)
    meta["model_source"][model_name] = g.source
    batch_bytes = sum(t.numel() * t.element_size() for t in g.batch)
    kind, fused = base_kind(model_name), fused_ok(device)
    rows, runners = {}, {}
    for method, estimator, mode in plan(a.facade_mode, a.facade_estimators):
        hvp = HVP.get(estimator)
        row = {
            "model": model_name,
            "dtype": g.dtype,
            "channels_last": g.channels_last,
            "mode": mode,
            "method": method,
            "estimator": estimator,
            "hvp": hvp,
            "base": ("gamfunc." + kind.lower()) if method == "make_step" else f"torch.optim.{kind}",
            "fused": fused if method != "make_step" else None,
            "batch": g.batch[0].shape[0],
            "error": None,
        }
        rows[(method, estimator, mode)] = row
        key = f"{model_name} {token} facade {method}/{estimator}/{mode}"
        try:
            make = factory(method, estimator, mode, g, model_name, a, device)
            runners[(method, estimator, mode)] = setup(row, make, a, device, batch_bytes)
            log(
                f"{key}: ready"
                + (f", compile {row['compile_s']:.1f} s" if "compile_s" in row else "")
            )
        except Exception as e:  # one failing row must not end the run
            row["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
            log(f"{key}: FAILED, {row['error'][:200]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    log(f"{model_name} {token} facade: timing {len(runners)} steps, {a.repeats} rounds")
    time_rows(runners, rows, a, device)
    ratios(list(rows.values()))
    return list(rows.values())
