"""The loss a run trains and evaluates: cross-entropy of the model through
``torch.func.functional_call``, with the counts of correct predictions in its aux (`CORRECT`,
`TOP5`), in the run's precision."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import gamfunc
from reproduce.config import Config

__all__ = ["CORRECT", "TOP5", "classification_loss", "training_loss"]

# The extra entry of the loss aux that counts correct predictions at θ (the running train accuracy).
CORRECT = "__correct__"
# The extra entry of the aux in eval mode that counts labels among the five largest logits.
TOP5 = "__correct5__"


def classification_loss(model: nn.Module, label_smoothing: float = 0.0):
    """``loss_fn(params, batch, buffers, *, train=True) -> (loss, new_buffers)``: cross-entropy of
    ``model`` through ``torch.func.functional_call`` (the buffered form of [`gamfunc.nn.functionalize`][gamfunc.nn.functionalize]).

    The buffers are cloned inside (BatchNorm's running statistics update the clones), and the loss is
    computed on float32 logits. ``new_buffers`` carries one extra entry, ``CORRECT``: the number of
    correct predictions at θ, so that the running training accuracy costs nothing (``make_step``
    keeps the aux of the pass at θ only); in eval mode also ``TOP5``, the number of labels among the
    five largest logits. ``label_smoothing`` is ``F.cross_entropy``'s, in training only (evaluation
    reports the plain cross-entropy). Mixed precision wraps it as any loss (`training_loss`).
    """

    def loss_fn(params, batch, buffers, *, train: bool = True):
        inputs, targets = batch
        state = {k: v.clone() for k, v in buffers.items() if k not in (CORRECT, TOP5)}
        with gamfunc.nn.mode(model, train):
            logits = functional_call(model, (params, state), (inputs,))
        logits = logits.float()
        aux = {**state, CORRECT: (logits.argmax(-1) == targets).sum()}
        if not train:
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            aux[TOP5] = (top == targets[:, None]).any(-1).sum()
        smoothing = label_smoothing if train else 0.0
        return F.cross_entropy(logits, targets, label_smoothing=smoothing), aux

    return loss_fn


def training_loss(loss_fn, cfg: Config):
    """``loss_fn`` in the run's precision: [`gamfunc.precision.bf16`][gamfunc.wrappers.precision.bf16] with ``--bf16`` (autocast in
    every pass, exact H·v's backward pass included), else as it is."""
    return gamfunc.precision.mixed(loss_fn, "bf16" if cfg.bf16 else "fp32")
