"""The rows of the step-cost table: which step each method name times, each estimator built by
``reproduce.methods``, the one registry of estimators by name.

A functional method is a :class:`Method`: a gamfunc estimator joined to ``gamfunc.sgd(lr,
momentum=0.9)`` by ``gamfunc.make_step`` (see :mod:`.runners`). Two rows are eager ``nn.Module`` +
``torch.optim`` steps that run once per model and precision, whatever ``--modes`` says: the baseline
``torch_sgd`` (the denominator of × eager SGD) and ``authors_gam`` (the authors' GAM optimiser,
:mod:`.authors_gam`, the denominator of × authors' GAM).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import gamfunc
from gamfunc import schedules
from reproduce import methods as registry
from reproduce.methods import estimator

BASELINE = "torch_sgd"
AUTHORS = "authors_gam"
EAGER_ROWS = (BASELINE, AUTHORS)  # nn.Module + torch.optim rows, eager only
# The estimator names are those of reproduce.methods.METHODS. A row named otherwise times the
# method it maps to here (its name is kept: benchmarks/results/ and the guides read it).
RENAMED = {
    "gradient": "sgd",
    "gam_exact": "gam",
    "gam_accelerated": "gam_accelerated_official",
    "sam_gam": "sam+gam",
}
# Methods with no row: ASAM (SAM's cost and one more scaling), GSAM+GAM (sam_gam's with GSAM's
# oracle) and accelerated GAM in the paper's order (the same four gradients as the code's)
UNTIMED = ("asam", "gsam+gam", "gam_accelerated")
CORE = ("gradient", "sam", "gnp", "gam_exact", "gam_reverse", "gam_fd", "gam_accelerated")
METHODS = (
    "grad_eval",
    "grad_eval_func",
    *CORE,
    AUTHORS,
    "sam_gam",
    "gam_every10",
    "gam_every20",
)
# the rows beside GAM: every other method, by its own name, and SAM with two ascent steps
_OTHERS = {*RENAMED.values(), *CORE, *UNTIMED}
FAMILY = (*(m for m in registry.METHODS if m not in _OTHERS), "sam_2_steps")
METHODS += FAMILY


def method_of(row: str) -> str:
    """The name in ``reproduce.methods.METHODS`` of the method that the row ``row`` times."""
    return RENAMED.get(row, row)


EVERY = re.compile(r"(gam|sam_gam)_every(\d+)")  # GAM on one step in k (paper Appendix C.3)
RHO_STEPS = 100_000  # ρ follows a cosine over this many steps, so it changes at every step
# Accelerated GAM with the values of the authors' released code (reproduce's preset
# accelerated.<dataset>.resnet18.authors): α = grad_beta_1, β = 1 − grad_beta_2, γ = grad_gamma.
# The gam_accelerated and authors_gam rows use them with the code's convention, h− = g0 + |1−β|·g2.
ACCELERATED = {"alpha": 0.6, "beta": 0.5, "gamma": 0.03, "convention": "official"}


class Method(NamedTuple):
    """One functional row.

    ``every``: the estimator runs on one step in ``every`` and ``base`` (None: the plain gradient) on
    the others (an estimator that cycles by itself, LookSAM or LookGAM, keeps ``every`` = 1 here and
    brings its own). ``grads``: gradient evaluations per step (the mean over a cycle), None where an
    H·v is not made of gradients. ``floor``: for the ``*_every<k>`` rows and the cycling estimators,
    ``(k, base row, full row)``, whose measured times give the floor ((k − 1)·base + full)/k of
    × floor. ``hvp``: GAM's H·v backend, if the row has one.
    """

    estimator: gamfunc.Estimator | None
    every: int = 1
    base: gamfunc.Estimator | None = None
    grads: float | None = None
    floor: tuple[int, str, str] | None = None
    hvp: str | None = None


def every_ok(name: str) -> bool:
    """Whether ``name`` is ``gam_every<k>`` or ``sam_gam_every<k>`` with k >= 2."""
    match = EVERY.fullmatch(name)
    return match is not None and int(match[2]) >= 2


def method_names(only) -> list[str]:
    """``only`` in a stable order: METHODS first, then the other ``*_every<k>`` names by base and k."""
    matches = (EVERY.fullmatch(m) for m in only if m not in METHODS)
    extra = sorted((m[1], int(m[2]), m[0]) for m in matches if m)
    return [m for m in METHODS if m in only] + [name for *_, name in extra]


def rho_schedule(rho: float):
    """ρ's schedule in every row (and lr's in the functional rows): a cosine from ``rho`` over
    :data:`RHO_STEPS` steps."""
    return schedules.cosine(rho, total_steps=RHO_STEPS)


def rho_at(rho: float, t: int) -> float:
    """:func:`rho_schedule` at step ``t`` as a Python float, the way the authors' schedulers hand
    their optimiser ρ (``authors_gam``)."""
    return rho * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t / RHO_STEPS)))


def family(hyper: dict) -> dict[str, Method]:
    """The rows of the estimators beside GAM, each with ``reproduce.methods``'s default
    hyperparameters but ρ (``hyper``): GSAM, WSAM, Friendly-SAM and SAM with two ascent steps, made
    of gradients; MSAM and RWP, one gradient each; LookSAM (SAM on one step in k, one gradient between: floor ((k − 1)·gradient +
    sam)/k) and LookGAM (exact GAM on one step in k: floor ((k − 1)·gradient + gam_exact)/k)."""
    looksam = estimator("looksam", **hyper)
    look_gam = estimator("look_gam", **hyper)
    k, k_gam = looksam.every, look_gam.every
    return {
        "gsam": Method(estimator("gsam", **hyper), grads=2.0),
        "wsam": Method(estimator("wsam", **hyper), grads=2.0),
        "looksam": Method(looksam, grads=(k + 1) / k, floor=(k, "gradient", "sam")),
        "friendly_sam": Method(estimator("friendly_sam", **hyper), grads=2.0),
        "look_gam": Method(look_gam, floor=(k_gam, "gradient", "gam_exact"), hvp="exact"),
        "sam_2_steps": Method(estimator("sam", **hyper, ascent_steps=2), grads=3.0),
        "msam": Method(estimator("msam", **hyper), grads=1.0),  # one gradient, at θ − ρ·m/‖m‖
        "rwp": Method(estimator("rwp"), grads=1.0),  # one gradient, at θ + ε
    }


def build_methods(a, names=()) -> dict[str, Method]:
    """name -> :class:`Method` for every functional row, plus the ``gam_every<k>`` (GAM on one step in
    k, plain gradient steps between) and ``sam_gam_every<k>`` (SAM+GAM on one step in k, SAM steps
    between) named in ``names``. GAM in the ``*_every<k>`` rows and in ``sam_gam`` uses the H·v
    backend ``a.composite_hvp``."""
    rho = rho_schedule(a.rho)
    fd_grads = a.composite_hvp == "fd"
    hyper = {"rho": rho, "alpha": a.alpha}
    composite = "gam_fd" if fd_grads else "gam" if a.composite_hvp == "exact" else "gam_reverse"
    gam = estimator(composite, **hyper)
    sam = estimator("sam", **hyper)
    sam_gam = estimator(method_of("sam_gam"), **hyper, hvp=a.composite_hvp)
    methods = {
        "grad_eval": Method(None, grads=1.0),
        "grad_eval_func": Method(None, grads=1.0),
        "gradient": Method(estimator(method_of("gradient")), grads=1.0),
        "sam": Method(sam, grads=2.0),
        "gnp": Method(estimator("gnp", alpha=a.alpha), grads=2.0),
        "gam_exact": Method(estimator(method_of("gam_exact"), **hyper), hvp="exact"),
        "gam_reverse": Method(estimator("gam_reverse", **hyper), hvp="reverse"),
        "gam_fd": Method(estimator("gam_fd", **hyper), grads=4.0, hvp="fd"),
        "gam_accelerated": Method(
            estimator(
                method_of("gam_accelerated"),
                rho=rho,
                rho_prime=rho_schedule(a.rho),
                **{k: v for k, v in ACCELERATED.items() if k != "convention"},
            ),
            grads=4.0,
        ),
        AUTHORS: Method(None, grads=4.0),
        "sam_gam": Method(sam_gam, grads=5.0 if fd_grads else None, hvp=a.composite_hvp),
        **family(hyper),
    }
    for name in [m for m in METHODS if EVERY.fullmatch(m)] + list(names):
        match = EVERY.fullmatch(name)
        if match is None:
            continue
        k = int(match[2])
        if match[1] == "gam":  # k - 1 gradient steps and one GAM step (4 gradients with fd)
            gam_row = f"gam_{a.composite_hvp}"
            grads = (k + 3) / k if fd_grads else None
            methods[name] = Method(gam, k, None, grads, (k, "gradient", gam_row), a.composite_hvp)
        else:  # k - 1 SAM steps of 2 gradients and one SAM+GAM step (5 with fd)
            grads = (2 * k + 3) / k if fd_grads else None
            methods[name] = Method(sam_gam, k, sam, grads, (k, "sam", "sam_gam"), a.composite_hvp)
    return methods
