"""Lightning manual optimisation with GAM: ``training_step`` calls ``optimizer.step(batch=batch)``.

Run (needs ``pip install lightning``; without it the script says so and exits with status 0):

    python examples/lightning_manual.py

Lightning wraps the optimiser and calls ``optimizer.step(closure=<its hook closure>, batch=batch)``;
gamfunc calls that closure once (it runs Lightning's ``on_before_optimizer_step`` hooks, as with any
``torch.optim`` optimiser) and computes the step from ``batch``. No ``manual_backward`` is needed:
every gradient comes from ``torch.func`` inside the step, and BatchNorm statistics are updated once per
step. ``optimizer.state_dict()`` goes into Lightning's checkpoints as usual. The last line printed is
``final: train_loss=...``.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gamfunc
from gamfunc.torch_optim import GAM

# torch's forward-mode AD (used by hvp="exact") emits this deprecation note on first use.
warnings.filterwarnings("ignore", message=".*torch.jit.script")


def make_data(n: int, seed: int):
    """Three classes labelled by a random two-layer teacher network, 10 input features."""
    g = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(10, 16, generator=g), torch.randn(16, 3, generator=g)
    x = torch.randn(n, 10, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(dim=1)


def main(argv=None) -> None:
    del argv  # no options
    if importlib.util.find_spec("lightning") is None:
        print("lightning is not installed (pip install lightning); nothing to run")
        return
    import lightning as L

    class GAMClassifier(L.LightningModule):
        def __init__(self, steps: int):
            super().__init__()
            self.automatic_optimization = False  # gamfunc forms every gradient itself
            self.net = nn.Sequential(
                nn.Linear(10, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3)
            )
            self.steps = steps

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss = optimizer.step(batch=batch)  # (inputs, targets); returns the loss at θ
            self.lr_schedulers().step()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            optimizer = GAM(
                self.net,
                gamfunc.sgd(lr=0.1, momentum=0.9),
                rho=0.05,
                alpha=0.1,
                criterion=F.cross_entropy,
            )
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.steps)
            return [optimizer], [scheduler]

    torch.manual_seed(0)
    x, y = make_data(512, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    epochs = 2
    model = GAMClassifier(steps=epochs * len(loader))
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    model.eval()
    with torch.no_grad():
        print(f"final: train_loss={float(F.cross_entropy(model.net(x), y)):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
