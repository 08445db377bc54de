"""Every estimator and optimiser, built with valid hyperparameters, for the contract tests.

The estimators are built here with gamfunc's factories, under the names the tests report. Each row
also names the method of reproduce/methods.py (``--estimator``'s names, the one set of them) that
builds the same estimator, and its hyperparameters there: ``tests/checkout/test_reproduce_methods.py``
checks each one in a checkout, and that every method has a row."""

import gamfunc
from gamfunc import hvps

# The contract tests' hyperparameters: valid for every method, small enough for the quadratic.
RHO, ALPHA = 0.05, 0.1
# accelerated GAM: ρ, ρ', α, β, γ
ACCELERATED = (RHO, 0.01, 0.5, 0.5, 0.1)
# the same values as hyperparameters of reproduce/methods.py's Hyper
H = dict(rho=RHO, alpha=ALPHA, rho_prime=0.01, beta=0.5, gamma=0.1)
H_ACCELERATED = dict(zip(("rho", "rho_prime", "alpha", "beta", "gamma"), ACCELERATED, strict=True))

# name -> (a fresh estimator, the method of reproduce/methods.py that builds it, its hyperparameters)
ROWS = {
    "gradient": (lambda: gamfunc.gradient(), "sgd", H),
    "sam": (lambda: gamfunc.sam(RHO), "sam", H),
    "asam": (lambda: gamfunc.asam(0.5, eta=0.01), "asam", dict(H, rho=0.5, eta=0.01)),
    "gnp_fd": (lambda: gamfunc.gnp(ALPHA, hvp=hvps.fd(radius=1e-2)), "gnp", H),
    "gnp_exact": (lambda: gamfunc.gnp(ALPHA, hvp="exact"), "gnp", dict(H, gnp_hvp="exact")),
    "gam_exact": (lambda: gamfunc.gam(RHO, ALPHA), "gam", H),
    "gam_reverse": (lambda: gamfunc.gam(RHO, ALPHA, hvp="reverse"), "gam_reverse", H),
    "gam_fd": (lambda: gamfunc.gam(RHO, ALPHA, hvp=hvps.fd(radius=1e-3)), "gam_fd", H),
    "sam+gam": (lambda: gamfunc.gam(RHO, ALPHA, oracle=gamfunc.sam(RHO)), "sam+gam", H),
    "gsam": (lambda: gamfunc.gsam(RHO, 0.3), "gsam", dict(H, gsam_alpha=0.3)),
    "gsam+gam": (
        lambda: gamfunc.gam(RHO, ALPHA, oracle=gamfunc.gsam(RHO, 0.3)),
        "gsam+gam",
        dict(H, gsam_alpha=0.3),
    ),
    "wsam": (lambda: gamfunc.wsam(RHO, 0.9), "wsam", dict(H, wsam_gamma=0.9)),
    "looksam": (
        lambda: gamfunc.looksam(RHO, 3, 0.7),
        "looksam",
        dict(H, look_k=3, looksam_alpha=0.7),
    ),
    "look_gam": (lambda: gamfunc.look_gam(RHO, ALPHA, 3), "look_gam", dict(H, look_k=3)),
    "friendly_sam": (
        lambda: gamfunc.friendly_sam(RHO, 1.0, 0.9),
        "friendly_sam",
        dict(H, fsam_sigma=1.0, fsam_lmbda=0.9),
    ),
    "msam": (lambda: gamfunc.msam(RHO), "msam", H),
    "rwp": (lambda: gamfunc.rwp(0.01), "rwp", dict(H, rwp_sigma=0.01)),
    "sam_3_steps": (lambda: gamfunc.sam(RHO, ascent_steps=3), "sam", dict(H, ascent_steps=3)),
    "sam_3_steps+gam": (
        lambda: gamfunc.gam(RHO, ALPHA, oracle=gamfunc.sam(RHO, ascent_steps=3)),
        "sam+gam",
        dict(H, ascent_steps=3),
    ),
    "gam_accelerated_paper": (
        lambda: gamfunc.gam_accelerated(*ACCELERATED),
        "gam_accelerated",
        H_ACCELERATED,
    ),
    "gam_accelerated_official": (
        lambda: gamfunc.gam_accelerated(*ACCELERATED, convention="official"),
        "gam_accelerated_official",
        H_ACCELERATED,
    ),
    "gam_adaptive": (lambda: gamfunc.gam(RHO, ALPHA, adaptive=True), "gam", dict(H, adaptive=True)),
    "gam_accelerated_adaptive": (
        lambda: gamfunc.gam_accelerated(*ACCELERATED, convention="official", adaptive=True),
        "gam_accelerated_official",
        dict(H_ACCELERATED, adaptive=True),
    ),
    # ---- the authors' released forms, built with gamfunc's factories directly ----------------
    # WSAM's decoupled form (atorch's WeightedSAM default) with both gradients clipped
    "wsam_decoupled": (
        lambda: gamfunc.wsam(0.05, 0.9, decouple=True, max_norm=1.0),
        "wsam",
        dict(H, wsam_gamma=0.9, wsam_decouple=True, wsam_max_norm=1.0),
    ),
    # GSAM's ascent in ASAM's geometry (juntang-zhuang/GSAM's adaptive=True)
    "gsam_adaptive": (
        lambda: gamfunc.gsam(0.5, 0.3, adaptive=True),
        "gsam",
        dict(H, rho=0.5, gsam_alpha=0.3, gsam_adaptive=True),
    ),
    # ASAM scaling some parameters only (SamsungLabs/ASAM scales those named weight; the names of
    # these tests' parameters carry no such word, so the matrices stand for them; reproduce's
    # mask, on a module's names, is tested in tests/checkout/test_reproduce_methods.py)
    "asam_masked": (lambda: gamfunc.asam(0.5, 0.01, mask=lambda name, p: p.ndim > 1), None, {}),
    # Friendly-SAM in nblt/F-SAM's order
    "friendly_sam_authors": (
        lambda: gamfunc.friendly_sam(0.05, 1.0, 0.9, convention="authors"),
        "friendly_sam",
        dict(H, fsam_sigma=1.0, fsam_lmbda=0.9, fsam_convention="authors"),
    ),
}

# name -> a fresh estimator
ESTIMATORS = {name: row[0] for name, row in ROWS.items()}
# name -> (the method of reproduce/methods.py, its hyperparameters), where one builds it
AS_METHODS = {name: (row[1], row[2]) for name, row in ROWS.items() if row[1] is not None}

OPTIMIZERS = {
    "sgd": lambda: gamfunc.sgd(lr=0.1),
    "sgd_momentum": lambda: gamfunc.sgd(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adamw": lambda: gamfunc.adamw(lr=1e-3),
    "adam": lambda: gamfunc.adam(lr=1e-3, weight_decay=1e-4),
    "lion": lambda: gamfunc.lion(lr=1e-4, weight_decay=0.1),
    "sgd_masked": lambda: gamfunc.sgd(
        lr=0.1, momentum=0.9, weight_decay=1e-2, weight_decay_mask=lambda k, v: v.ndim >= 2
    ),
    "chain_clip_adamw": lambda: gamfunc.chain(
        gamfunc.clip_by_global_norm(1.0),
        gamfunc.adamw(
            lr=1e-3, weight_decay_mask={"w1": True, "b1": False, "w2": True, "b2": False}
        ),
    ),
}

# (factory, kwargs, the argument the error must name)
INVALID = [
    (gamfunc.clip_by_global_norm, {"max_norm": 0.0}, "max_norm"),
    (gamfunc.clip_by_global_norm, {"max_norm": 1.0, "eps": float("nan")}, "eps"),
    (gamfunc.sgd, {"lr": 0.1, "weight_decay_mask": 1}, "weight_decay_mask"),
    (gamfunc.adamw, {"weight_decay_mask": {"w1": "yes"}}, "weight_decay_mask"),
    (gamfunc.sam, {"rho": -0.1}, "rho"),
    (gamfunc.sam, {"rho": float("nan")}, "rho"),
    (gamfunc.sam, {"rho": 0.1, "eps": -1.0}, "eps"),
    (gamfunc.gsam, {"rho": -0.1, "alpha": 0.3}, "rho"),
    (gamfunc.gsam, {"rho": 0.1, "alpha": float("nan")}, "alpha"),
    (gamfunc.gsam, {"rho": 0.1, "alpha": 0.3, "eps": -1.0}, "eps"),
    (gamfunc.wsam, {"rho": -0.1, "gamma": 0.9}, "rho"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": 1.0}, "gamma"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": -0.1}, "gamma"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": 0.9, "eps": -1.0}, "eps"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": 0.9, "decouple": "yes"}, "decouple"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": 0.9, "max_norm": 0.0}, "max_norm"),
    (gamfunc.wsam, {"rho": 0.1, "gamma": 0.9, "max_norm": float("inf")}, "max_norm"),
    (gamfunc.gsam, {"rho": 0.1, "alpha": 0.3, "adaptive": 1}, "adaptive"),
    (gamfunc.gsam, {"rho": 0.1, "alpha": 0.3, "adaptive": True, "eta": -0.01}, "eta"),
    (gamfunc.asam, {"rho": 0.5, "mask": 1}, "mask"),
    (gamfunc.asam, {"rho": 0.5, "mask": {"w1": "yes"}}, "mask"),
    (gamfunc.friendly_sam, {"rho": 0.1, "convention": "pytorch_optimizer"}, "convention"),
    (gamfunc.looksam, {"rho": -0.1, "k": 5, "alpha": 0.7}, "rho"),
    (gamfunc.looksam, {"rho": 0.1, "k": 0, "alpha": 0.7}, "k"),
    (gamfunc.looksam, {"rho": 0.1, "k": 5, "alpha": -0.7}, "alpha"),
    (gamfunc.friendly_sam, {"rho": 0.1, "lmbda": 1.0}, "lmbda"),
    (gamfunc.friendly_sam, {"rho": 0.1, "sigma": float("nan")}, "sigma"),
    (gamfunc.sam, {"rho": 0.1, "ascent_steps": 0}, "ascent_steps"),
    (gamfunc.msam, {"rho": -0.1}, "rho"),
    (gamfunc.msam, {"rho": 0.1, "momentum": 1.0}, "momentum"),
    (gamfunc.rwp, {"sigma": -0.01}, "sigma"),
    (gamfunc.rwp, {"sigma": 0.01, "mix": 2.0}, "mix"),
    (gamfunc.sam, {"rho": 0.1, "ascent_steps": 2.0}, "ascent_steps"),
    (gamfunc.asam, {"rho": -0.5}, "rho"),
    (gamfunc.asam, {"rho": 0.5, "eta": -0.01}, "eta"),
    (gamfunc.asam, {"rho": 0.5, "eps": float("nan")}, "eps"),
    (gamfunc.gnp, {"alpha": -0.1}, "alpha"),
    (gamfunc.gnp, {"alpha": 0.1, "hvp": "dense"}, "hvp"),
    (gamfunc.gnp, {"alpha": 0.1, "hvp": 1e-2}, "hvp"),  # a radius is given as hvps.fd(radius=r)
    (gamfunc.gam, {"rho": -0.05, "alpha": 0.1}, "rho"),
    (gamfunc.gam, {"rho": 0.05, "alpha": -0.1}, "alpha"),
    (gamfunc.gam, {"rho": 0.05, "alpha": 0.1, "hvp": "jvp"}, "hvp"),
    (gamfunc.hvps.fd, {"radius": -1e-3}, "radius"),
    (gamfunc.hvps.fd, {"radius": 0.0}, "radius"),
    (gamfunc.gam, {"rho": 0.05, "alpha": 0.1, "ascent_steps": 0}, "ascent_steps"),
    (
        gamfunc.gam_accelerated,
        {"rho": -1, "rho_prime": 0.01, "alpha": 0.5, "beta": 0.5, "gamma": 0.1},
        "rho",
    ),
    (
        gamfunc.gam_accelerated,
        {"rho": 0.1, "rho_prime": -0.01, "alpha": 0.5, "beta": 0.5, "gamma": 0.1},
        "rho_prime",
    ),
    (
        gamfunc.gam_accelerated,
        {"rho": 0.1, "rho_prime": 0.01, "alpha": 1.5, "beta": 0.5, "gamma": 0.1},
        "alpha",
    ),
    (
        gamfunc.gam_accelerated,
        {"rho": 0.1, "rho_prime": 0.01, "alpha": 0.5, "beta": -0.1, "gamma": 0.1},
        "beta",
    ),
    (
        gamfunc.gam_accelerated,
        {"rho": 0.1, "rho_prime": 0.01, "alpha": 0.5, "beta": 1.1, "gamma": 0.1},
        "beta",
    ),
    (
        gamfunc.gam_accelerated,
        {"rho": 0.1, "rho_prime": 0.01, "alpha": 0.5, "beta": 0.5, "gamma": -0.1},
        "gamma",
    ),
    (
        gamfunc.gam_accelerated,
        {
            "rho": 0.1,
            "rho_prime": 0.01,
            "alpha": 0.5,
            "beta": 0.5,
            "gamma": 0.1,
            "convention": "code",
        },
        "convention",
    ),
]
