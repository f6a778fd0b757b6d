"""The optimizer: AdamW with decoupled weight decay on matrices only.

Biases, norm gains and other 1-D parameters are not decayed (decaying a norm's
gain towards 0 fights the norm; decaying a bias has no regularising purpose).
"""

from __future__ import annotations

import torch
from torch import nn

from specformer.specs.training import AdamWSpec

__all__ = ["param_groups", "adamw"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices (decayed) and everything 1-D (not decayed); tied weights once."""
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


_FUSED_DEVICES = ("cpu", "cuda", "xpu", "mps")


def adamw(spec: AdamWSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters) where torch has a fused kernel for
    the parameters' device and dtype and the run is not mixed precision (Lightning's
    mixed-precision plugin unscales gradients itself before clipping, which a fused
    optimizer would do again); the plain implementation elsewhere."""
    groups = param_groups(model, spec.weight_decay)
    params = [p for g in groups for p in g["params"]]
    fused = (
        "mixed" not in precision
        and bool(params)
        and all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in params)
    )
    kwargs = {"lr": spec.lr, "betas": tuple(spec.betas), "eps": spec.eps}
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError):
            pass  # this build has no fused kernel for these tensors
    return torch.optim.AdamW(groups, **kwargs)
