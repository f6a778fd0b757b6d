"""Dropout whose mask, while ``torch.compile`` traces, is never a boolean tensor.

Eager, :class:`Dropout` is ``nn.Dropout`` and :func:`dropout` is ``F.dropout``. Traced,
torch's dropout draws a boolean keep-mask, and inductor's CPU code stores a boolean result
element by element: a (1024, 1024) dropout's forward and backward took 8.4 ms compiled
against 5.0 eager on a 2-core AMD EPYC, 3.3 ms of it storing the mask. Here the mask is
``floor(u + 1 - p)`` for ``u`` uniform in [0, 1) in float32: 1 with probability 1 - p, else
0, a float, with no comparison (4.6 ms). Kept values are scaled by 1 / (1 - p), as torch's.
The random numbers differ from eager dropout's, as a compiled model's always do.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["Dropout", "dropout"]


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``; while torch.compile traces, with a float mask (above)."""
    if not training or p == 0.0:
        return x
    if torch.compiler.is_compiling() and 0.0 < p < 1.0:
        u = torch.rand(x.shape, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        keep = torch.floor(u + (1.0 - p))  # 1 where u >= p: probability 1 - p
        return (x * keep * (1.0 / (1.0 - p))).to(x.dtype)
    return F.dropout(x, p, training=True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (no parameters, the same repr), with :func:`dropout`'s traced form."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
