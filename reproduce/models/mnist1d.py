"""The small networks of MNIST-1D (and digits): its MLP, with ReLU, GELU or tanh, and its ConvBase."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "MLP", "ConvBase"]


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
}


class MLP(nn.Module):
    """MNIST-1D's MLP: inputs → 100 → 100 → classes with ReLU (or ``activation``: gelu, tanh)."""

    def __init__(self, inputs: int, num_classes: int, hidden: int = 100, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {activation!r}")
        act = ACTIVATIONS[activation]
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            act(),
            nn.Linear(hidden, hidden),
            act(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.flatten(1))


class ConvBase(nn.Module):
    """MNIST-1D's ConvBase: conv(1→25, k5, s2) → conv(25→25, k3, s2) → conv(25→25, k3, s2) → linear, ReLU."""

    def __init__(self, length: int, num_classes: int, channels: int = 25):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        out = length
        for k in (5, 3, 3):
            out = (out + 2 - k) // 2 + 1
        self.linear = nn.Linear(channels * out, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(x.shape[0], 1, -1)
        h = F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(h))))))
        return self.linear(h.flatten(1))
