"""Small modules with BatchNorm for step and contract tests."""

import torch
from torch import nn


class TinyResNet(nn.Module):
    """conv-BN-ReLU stem, one residual block with BatchNorm, pooled linear head (CIFAR-like, tiny)."""

    def __init__(self, width=4, classes=3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(h + self.block(h))
        return self.head(h.mean(dim=(2, 3)))


def tiny_bn_mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def image_batch(n=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 6, 6, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def vector_batch(n=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)


def tiny_conv_bn() -> nn.Module:
    """Parameters of four shapes (4-d conv, 1-d BatchNorm, 2-d and 1-d linear)."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 5),
    )
