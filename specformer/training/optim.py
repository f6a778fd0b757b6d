"""The optimizers: AdamW (the default), SGD with momentum, and Adafactor, each with weight
decay on matrices only.

Biases, norm gains and other 1-D parameters are not decayed (decaying a norm's
gain towards 0 fights the norm; decaying a bias has no regularising purpose).
"""

from __future__ import annotations

import torch
from torch import nn

from specformer.specs.training import AdafactorSpec, AdamWSpec, SGDSpec

__all__ = ["param_groups", "adamw", "sgd", "adafactor", "HYPERPARAMETERS"]

# the settings of each optimizer's param groups that come from the spec (a resumed run
# takes the new spec's); the rest (fused, foreach, ...) are how it runs
HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "dampening", "beta2_decay", "d")


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


def sgd(spec: SGDSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.SGD:
    """SGD with momentum (``torch.optim.SGD``), weight decay on matrices only."""
    return torch.optim.SGD(param_groups(model, spec.weight_decay), lr=spec.lr, momentum=spec.momentum,
                           nesterov=spec.nesterov)


def adafactor(spec: AdafactorSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.Optimizer:
    """Adafactor (``torch.optim.Adafactor``), weight decay on matrices only."""
    return torch.optim.Adafactor(param_groups(model, spec.weight_decay), lr=spec.lr, beta2_decay=spec.beta2_decay,
                                 eps=(None, spec.eps), d=spec.d)
