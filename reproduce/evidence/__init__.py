"""The paper's claims measured in miniature on MNIST-1D: one subcommand per table or figure.

MNIST-1D (Greydanus 2020) is generated offline by the ``mnist1d`` package (4,000 training and 1,000
test vectors), so every number here can be re-made without a download. Each subcommand trains with
`reproduce.train.setup` (the same model, loss, schedule and ``gamfunc.make_step`` as
``reproduce/train.py``), measures with [`gamfunc.metrics`][gamfunc.metrics], and writes a markdown table
(``<name>.md``), the raw numbers (``<name>.json``) and PNG figures into ``--out``
(default ``runs/evidence/<name>``):

```bash
python -m reproduce.evidence spectra     # top-50 Hessian eigenvalues and trace (Section 5.4)
python -m reproduce.evidence accuracy    # test accuracy and generalisation gap (Table cifar2)
python -m reproduce.evidence noise       # label noise 20/40/60/80% (Appendix C.2)
python -m reproduce.evidence minima      # local minima within ρ along 100 directions (Section 5.1)
python -m reproduce.evidence landscape   # 2-D filter-normalised landscapes (Figure vis)
python -m reproduce.evidence ablation    # ρ × α grid, ρ = 0 is GNP (Figure ablation-hyperparameter)
python -m reproduce.evidence variants    # exact vs finite-difference vs accelerated GAM
python -m reproduce.evidence fd          # why finite-difference GAM collapses on a ReLU MLP
python -m reproduce.evidence family      # every estimator: accuracy, λ_max, trace, cost per step
python -m reproduce.evidence reuse       # LookGAM against GAM every k-th step, at equal passes
python -m reproduce.evidence spectra --quick   # any of them in under a minute (what the tests run)
python -m reproduce.evidence ablation --vmap   # the grid × seeds as one vmapped step per estimator
```

Each subcommand takes only the options it reads (``--help`` lists them; `cli`'s ``OPTIONS``) and
refuses any other in one line, exit 2, as it does a bad value or a count past its bound, before
anything trains. A run that did not train, or a measurement whose probe losses are not finite, ends
the command with exit status 3, one line naming the run, and no table.

``--vmap`` (``ablation``, ``accuracy``, ``noise``) trains the runs of one estimator together, as the
members of one vmapped step (`reproduce.sweeps.vmapped`): the seeds differ in initialisation, and every
run sees the validation split and batches of seed 0 (without ``--vmap`` each seed draws its own), so
the numbers differ from the looped table's by that, not by method. ``ms/step`` is then the vmapped
step's time over its members. reproduce/RESULTS.md has the wall time of both.

Methods and hyperparameters: SGD (lr 0.05, momentum 0.9, weight decay 5e-4, cosine, batch 100),
GAM ρ = 0.5, α = 1 (the ``mnist1d`` preset of `reproduce.config`, chosen on a validation
split; ``--gam=ρ,α`` replaces them), SAM ρ = 0.2, SAM+GAM (GAM's ρ, α around a SAM ρ = 0.2 oracle;
``--sam-gam=ρ,α`` replaces GAM's 0.5, 1 there, e.g. with 0.2, 0.1, the best validation accuracy of
``ablation --rhos=0.05,0.1,0.2 --alphas=0.1,0.3,1 --sam-rho=0.2 --epochs=30 --seeds=2``) and GNP
(Zhao et al. 2022: gradient norm penalty with a finite-difference H·v, r = 0.01) with α =
``--gnp-alpha`` = 0.1, the best validation accuracy of ``ablation --rhos=0 --alphas=0.05,0.1,0.2,0.5,1
--epochs=30 --seeds=2``.

One module per claim: `spectra`, `accuracy`,
`noise`, `minima`,
`landscape`, `ablation`,
`variants`, `fd`, `family` (every estimator of `reproduce.methods`) and `reuse` (LookGAM);
what they share (the methods,
their configs, training, the table and JSON) is in `common`, the runs of
every method × seed that spectra, accuracy and noise train in `grid`, and
the command line in `cli`.
"""

from reproduce.evidence.ablation import ablation_table, cmd_ablation
from reproduce.evidence.accuracy import cmd_accuracy
from reproduce.evidence.cli import DEFAULTS, FULL, REUSE, SUBCOMMANDS, TABLES, VMAP, main, parser
from reproduce.evidence.common import (
    FOUR,
    GAM,
    METHODS,
    SAM_RHO,
    base_config,
    eval_loss,
    flatness,
    mean_std,
    method_config,
    pm,
    png,
    probe_batch,
    table,
    train,
    train_together,
    write,
)
from reproduce.evidence.family import FAMILY, cmd_family, family_table, step_costs
from reproduce.evidence.fd import (
    ACTIVATION_OF,
    cmd_fd,
    dead_units,
    fd_table,
    hidden_preactivations,
    hvp_error,
)
from reproduce.evidence.grid import ACC_HEADER, accuracy_rows, accuracy_table, run_grid
from reproduce.evidence.landscape import cmd_landscape, landscape_table
from reproduce.evidence.minima import MINIMA_METHODS, cmd_minima, minima_table
from reproduce.evidence.noise import cmd_noise, noise_table
from reproduce.evidence.reuse import cmd_reuse, reuse_table
from reproduce.evidence.spectra import cmd_spectra, spectra_table
from reproduce.evidence.variants import VARIANTS, cmd_variants, variants_table

__all__ = [
    "ACC_HEADER",
    "ACTIVATION_OF",
    "DEFAULTS",
    "FAMILY",
    "FOUR",
    "FULL",
    "GAM",
    "METHODS",
    "MINIMA_METHODS",
    "REUSE",
    "SAM_RHO",
    "SUBCOMMANDS",
    "TABLES",
    "VARIANTS",
    "VMAP",
    "ablation_table",
    "accuracy_rows",
    "accuracy_table",
    "base_config",
    "cmd_ablation",
    "cmd_accuracy",
    "cmd_family",
    "cmd_fd",
    "cmd_landscape",
    "cmd_minima",
    "cmd_noise",
    "cmd_reuse",
    "cmd_spectra",
    "cmd_variants",
    "dead_units",
    "eval_loss",
    "family_table",
    "fd_table",
    "flatness",
    "hidden_preactivations",
    "hvp_error",
    "landscape_table",
    "main",
    "mean_std",
    "method_config",
    "minima_table",
    "noise_table",
    "parser",
    "pm",
    "png",
    "probe_batch",
    "reuse_table",
    "run_grid",
    "spectra_table",
    "step_costs",
    "table",
    "train",
    "train_together",
    "variants_table",
    "write",
]
