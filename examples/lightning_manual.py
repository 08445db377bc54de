"""Lightning manual optimisation with GAM over ``torch.optim.SGD``.

Run (needs ``pip install lightning``; without it the script says so and exits with status 0):

    python examples/lightning_manual.py

``configure_optimizers`` returns the facade built on a ``torch.optim`` optimiser, and ``training_step``
calls ``self.optimizers().step(batch=batch)``. Lightning wraps the optimiser and calls
``optimizer.step(closure=<its hook closure>, batch=batch)``; gamfunc calls that closure once (it runs
Lightning's ``on_before_optimizer_step`` hooks, as with any ``torch.optim`` optimiser) and computes the
step from ``batch``. No ``manual_backward`` is needed: every gradient comes from ``torch.func`` inside
the step, and BatchNorm statistics are updated once per step. In manual optimisation Lightning leaves
the scheduler to the module: here it is stepped at the end of each epoch. ``optimizer.state_dict()``
goes into Lightning's checkpoints as usual. The last line printed is
``final: first_loss=... train_loss=... lr=...``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("lightning") is None:
        print("lightning is not installed (pip install lightning); nothing to run")
        return
    import lightning as L

    class GAMClassifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False  # gamfunc forms every gradient itself
            self.net = nn.Sequential(
                nn.Linear(10, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3)
            )

        def training_step(self, batch, batch_idx):
            # Lightning's optimiser wrapper takes keywords only: batch=, not step(batch)
            loss = self.optimizers().step(batch=batch)  # returns the loss at θ
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def on_train_epoch_end(self):
            self.lr_schedulers().step()

        def configure_optimizers(self):
            optimizer = GAM(
                self.net,
                torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4),
                rho=0.05,
                alpha=0.1,
                criterion=F.cross_entropy,
            )
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return [optimizer], [scheduler]

    torch.manual_seed(args.seed)
    x, y = make_data(512, seed=args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    model = GAMClassifier()

    def train_loss() -> float:
        model.eval()
        with torch.no_grad():
            loss = float(F.cross_entropy(model.net(x), y))
        model.train()
        return loss

    first = train_loss()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    print(f"final: first_loss={first:.4f} train_loss={train_loss():.4f} lr={lr:.6f}")


if __name__ == "__main__":
    main(sys.argv[1:])
