"""Random crop with padding and horizontal flip of a whole batch on its device: ``CropFlip``.

The CIFAR recipe's augmentation (``RandomCrop(size, padding)``, then ``RandomHorizontalFlip()``)
for image sets held in memory as one tensor (Fashion-MNIST), applied to each batch where the batch
is, so that the data stay on the GPU and no worker process decodes anything. Each example is shifted
by (dy, dx) ∈ [−pad, pad]² and mirrored with probability ½, the pixels that come in from outside
filled with ``fill`` (the normalised black of zero padding); the whole batch is one gather.

The random draws come from a CPU generator and are separate from their use (``draw`` then
``__call__``), so that `reproduce.data.batches.train_batches` draws a global batch's
parameters under the batch's seed and each process applies its share: the batches depend on the seed,
the epoch and the position alone, whatever the number of processes and wherever a run resumes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CropFlip"]


class CropFlip:
    """Random crop of a ``pad``-padded image back to its size, then a horizontal flip with
    probability ½, on a batch ``(n, C, H, W)``.

    Args:
        pad: the padding on each side (the largest shift), ≥ 0.
        fill: the value of the padding (the normalised value of a black pixel).

    Example:
        >>> aug = CropFlip(pad=4)
        >>> x = torch.arange(2 * 28 * 28, dtype=torch.float32).reshape(2, 1, 28, 28)
        >>> aug(x, aug.draw(2, torch.Generator().manual_seed(0))).shape
        torch.Size([2, 1, 28, 28])
    """

    batched = True  # reproduce.data.examples.Examples: augments batches, not examples

    def __init__(self, pad: int = 4, fill: float = 0.0):
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            raise ValueError(f"pad must be an integer >= 0; got {pad!r}")
        self.pad, self.fill = pad, float(fill)

    def draw(self, n: int, gen: torch.Generator) -> Tensor:
        """The parameters of ``n`` examples, ``(n, 3)`` integers: row shift, column shift (each in
        0..2·pad, the crop's corner in the padded image) and flip (0 or 1)."""
        shifts = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=gen)
        flips = torch.randint(0, 2, (n, 1), generator=gen)
        return torch.cat([shifts, flips], dim=1)

    def __call__(self, x: Tensor, params: Tensor) -> Tensor:
        """``x`` cropped and flipped as ``params`` (from `draw`, one row per example) say."""
        n, c, h, w = x.shape
        if params.shape != (n, 3):
            raise ValueError(f"params must have shape ({n}, 3); got {tuple(params.shape)}")
        p = self.pad
        params = params.to(x.device, non_blocking=True)
        rows = params[:, :1] + torch.arange(h, device=x.device)  # (n, h) rows of the padded image
        j = torch.arange(w, device=x.device)
        cols = params[:, 1:2] + torch.where(params[:, 2:] == 1, w - 1 - j, j)  # (n, w)
        index = (rows[:, :, None] * (w + 2 * p) + cols[:, None, :]).reshape(n, 1, h * w)
        padded = F.pad(x, (p, p, p, p), value=self.fill).flatten(2)
        return padded.gather(2, index.expand(n, c, h * w)).view(n, c, h, w)

    def __repr__(self) -> str:
        return f"CropFlip(pad={self.pad}, fill={self.fill:g})"
