"""Normalisation layers: torch's own LayerNorm and RMSNorm, built from their specs.

Shape legend: B batch, T length, D normalised size (d_model, or Dh for qk-norm).

Placement (pre / post) and the final norm are wiring, decided by the blocks and
stacks in :mod:`specformer.components.blocks`; a norm module only normalises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import LayerNormSpec, RMSNormSpec

__all__ = ["build_layernorm", "build_rmsnorm"]


def build_layernorm(spec: LayerNormSpec, *, dim: int) -> nn.LayerNorm:
    """Layer normalisation over the last ``dim`` features (Ba et al. 2016)."""
    return nn.LayerNorm(dim, eps=spec.eps, bias=spec.bias)


def build_rmsnorm(spec: RMSNormSpec, *, dim: int) -> nn.RMSNorm:
    """RMS normalisation over the last ``dim`` features (Zhang & Sennrich 2019)."""
    return nn.RMSNorm(dim, eps=spec.eps)
