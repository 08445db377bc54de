"""Step cost of every gamfunc estimator: ms per training step and images/s, against an eager
``torch.optim.SGD`` step, gamfunc's compiled gradient step and the authors' GAM optimiser.

Times whole training steps (forward, backward, the estimator's extra passes, the SGD-momentum update)
of ``gamfunc.make_step(estimator, gamfunc.sgd(lr, momentum=0.9), loss_fn)`` for each estimator, eager
or compiled (``step.compile``: the whole step or ``scope="pass"``), beside two eager ``nn.Module`` +
``torch.optim`` rows of the same model: ``torch.optim.SGD(momentum=0.9)`` and the authors' GAM
optimiser (``benchmarks/stepcost/authors_gam.py``). The code is in ``benchmarks/stepcost/``, one
module per job; benchmarks/README.md says what every row and column means.

Commands, with their wall times on one H100: benchmarks/README.md ("Running it"), e.g. ResNet-50 in
fp32 and bf16 channels-last with CUDA graphs per pass, about 7–9 minutes::

    python benchmarks/step_cost.py --model resnet50 --dtype fp32,bf16-cl \
        --modes pass-reduce-overhead --compile-jobs 14 --compile-timeout 360 --out $OUT/r50.json \
        --only torch_sgd,grad_eval,gradient,gam_exact,gam_fd,gam_accelerated,authors_gam,gam_every10,gam_every20

CPU smoke run (seconds, no timing claims): ``python benchmarks/step_cost.py --tiny``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for `benchmarks` and `reproduce`, run as a script
    sys.path.insert(0, str(ROOT))

from benchmarks.stepcost.cli import main  # noqa: E402

if __name__ == "__main__":
    # Stopped from outside (`timeout`): unwind, so that the pre-compile workers, which run in
    # sessions of their own, are ended too; the JSON keeps what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
