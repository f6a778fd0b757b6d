"""The optimizers: AdamW (the default), SGD with momentum, and Adafactor, each with weight
decay on matrices only, frozen parameters left out and a learning rate per ``lr_scale``
group (the spec's ``training.optimizer.freeze`` and ``lr_scale``).

Biases, norm gains and other 1-D parameters are not decayed (decaying a norm's
gain towards 0 fights the norm; decaying a bias has no regularising purpose).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specformer.specs.training import (
    AdafactorSpec,
    AdamWSpec,
    SGDSpec,
    optimizer_groups,
    parameter_plan,
)

__all__ = ["param_groups", "apply_freeze", "plan_of", "adamw", "sgd", "adafactor", "HYPERPARAMETERS"]

# the settings of each optimizer's param groups that come from the spec (a resumed run
# takes the new spec's); the rest (fused, foreach, ...) are how it runs
HYPERPARAMETERS = (
    "lr", "betas", "eps", "weight_decay", "momentum", "nesterov", "dampening", "beta2_decay", "d", "lr_scale"
)


def _named(model: nn.Module) -> tuple[dict[str, nn.Parameter], dict[str, str]]:
    """The model's parameters by name (each tensor once), and the other names of tied ones."""
    params = dict(model.named_parameters())
    first: dict[int, str] = {id(p): n for n, p in params.items()}
    tied = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if n not in params}
    for prefix, module in model.named_modules():
        weight = getattr(module, "tied_weight", None)  # a tied head reads the embedding at call time
        if isinstance(weight, torch.Tensor) and id(weight) in first:
            tied[f"{prefix}.weight" if prefix else "weight"] = first[id(weight)]
    return params, tied


def plan_of(model: nn.Module, spec: Any) -> dict[str, float | None]:
    """Each of ``model``'s parameters (by name, tied weights once) with its lr factor under the
    optimizer spec's ``freeze`` and ``lr_scale`` (None: frozen); a pattern that matches
    nothing is a :class:`~specformer.specs.errors.SpecError`."""
    params, tied = _named(model)
    return parameter_plan(spec, list(params), tied=tied)


def apply_freeze(model: nn.Module, spec: Any) -> dict[str, float | None]:
    """Set ``requires_grad`` False on the parameters the optimizer spec freezes; returns
    :func:`plan_of`'s plan."""
    plan = plan_of(model, spec)
    for name, p in model.named_parameters():
        if plan[name] is None:
            p.requires_grad_(False)
    return plan


def param_groups(model: nn.Module, weight_decay: float, spec: Any = None) -> list[dict]:
    """Matrices (decayed) and everything 1-D (not decayed), for each lr factor of the spec's
    ``lr_scale`` (factor 1 first, then in the order of lr_scale), tied weights once, as
    :func:`~specformer.specs.training.optimizer_groups` orders them. Frozen parameters (the
    spec's ``freeze``, or ``requires_grad`` False) are in no group. Each group carries its
    parameters' names (``param_names``, saved with the optimizer's state) and its
    ``lr_scale``; the optimizer's builder sets each group's ``lr`` to the spec's lr × lr_scale."""
    params, tied = _named(model)
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    groups = []
    for factor, decayed, names in optimizer_groups(spec, shapes, tied=tied):
        names = [n for n in names if params[n].requires_grad]
        if names:
            groups.append({"params": [params[n] for n in names], "param_names": names,
                           "weight_decay": weight_decay if decayed else 0.0, "lr_scale": factor})
    return groups


def _scaled(groups: list[dict], lr: float) -> list[dict]:
    for g in groups:
        g["lr"] = lr * g["lr_scale"]
    return groups


_FUSED_DEVICES = ("cpu", "cuda", "xpu", "mps")


def adamw(spec: AdamWSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters) where torch has a fused kernel for
    the parameters' device and dtype and the run is not float16 mixed precision (whose
    gradient scaler Lightning unscales itself before clipping, which a fused optimizer
    would do again); the plain implementation elsewhere.

    bf16-mixed has no gradient scaler, so its optimizer is fused too (on the CPU ~4x as
    fast as the plain one: 8.7 against 38.7 ms a step for 20 M parameters); it only stops
    telling a scaler it unscales gradients itself (``_step_supports_amp_scaling``), for which
    Lightning's mixed-precision plugin refuses to clip them."""
    groups = _scaled(param_groups(model, spec.weight_decay, spec), spec.lr)
    params = [p for g in groups for p in g["params"]]
    fused = (
        precision != "16-mixed"
        and bool(params)
        and all(p.device.type in _FUSED_DEVICES and p.is_floating_point() for p in params)
    )
    kwargs = {"lr": spec.lr, "betas": tuple(spec.betas), "eps": spec.eps}
    if fused:
        try:
            optimizer = torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError):
            pass  # this build has no fused kernel for these tensors
        else:
            if precision == "bf16-mixed":  # no scaler: nothing is unscaled, by anyone
                optimizer._step_supports_amp_scaling = False
            return optimizer
    return torch.optim.AdamW(groups, **kwargs)


def sgd(spec: SGDSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.SGD:
    """SGD with momentum (``torch.optim.SGD``), weight decay on matrices only."""
    return torch.optim.SGD(_scaled(param_groups(model, spec.weight_decay, spec), spec.lr), lr=spec.lr, momentum=spec.momentum,
                           nesterov=spec.nesterov)


def adafactor(spec: AdafactorSpec, *, model: nn.Module, precision: str = "32-true") -> torch.optim.Optimizer:
    """Adafactor (``torch.optim.Adafactor``), weight decay on matrices only."""
    return torch.optim.Adafactor(_scaled(param_groups(model, spec.weight_decay, spec), spec.lr), lr=spec.lr, beta2_decay=spec.beta2_decay,
                                 eps=(None, spec.eps), d=spec.d)
