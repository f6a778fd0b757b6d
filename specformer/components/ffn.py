"""Position-wise feed-forward networks.

Shape legend: B batch, T length, D d_model, F d_ff (hidden size).

State-dict names: ``up_proj`` (D -> F), ``gate_proj`` (D -> F, gated variants only),
``down_proj`` (F -> D, marked as a projection into the residual stream for init).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.components.dropout import Dropout
from specformer.components.products import Linear

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import GLUSpec, MLPSpec

__all__ = ["MLP", "GLU", "ACTIVATIONS"]


class _CompiledReLU(torch.autograd.Function):
    """ReLU for a graph torch.compile traces, with no boolean tensor in it: its gradient is
    ``grad * sign(relu(x))`` rather than ``threshold_backward``'s comparison. Inductor's CPU
    code stores a boolean result element by element (a (512, 1024) ``x <= 0``: 1.5 ms, against
    33 µs for the ReLU itself, on a 2-core AMD EPYC), and its partitioner kept exactly that
    mask of every ReLU for the backward pass: a compiled t5-style bf16 step spent 18 of its
    ~90 ms there and was slower than the eager one. The gradient is the same, a NaN input's
    aside (NaN here, passed through by torch's)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        out = F.relu(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return grad * out.sign()


def relu(x: Tensor) -> Tensor:
    """``F.relu``; while torch.compile traces, :class:`_CompiledReLU`."""
    if torch.compiler.is_compiling() and x.requires_grad:
        return _CompiledReLU.apply(x)
    return F.relu(x)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def _drop(dropout: nn.Dropout, x: Tensor, training: bool) -> Tensor:
    """``dropout(x)``, skipping the call where it would do nothing (eval, or p = 0)."""
    return dropout(x) if training and dropout.p > 0 else x


def _require_d_ff(d_ff: int | None) -> None:
    if d_ff is None:
        raise ValueError(
            "the FFN spec needs d_ff; a ModelSpec fills it in when it validates, or give it "
            "explicitly when building the FFN alone"
        )


class MLP(nn.Module):
    """down(dropout(act(up(x)))): the Transformer's FFN (Vaswani et al. 2017, eq. 2)."""

    def __init__(self, spec: MLPSpec, *, d_model: int) -> None:
        super().__init__()
        _require_d_ff(spec.d_ff)
        self.up_proj = Linear(d_model, spec.d_ff, bias=spec.bias)
        self.down_proj = Linear(spec.d_ff, d_model, bias=spec.bias)
        self.down_proj.residual_projection = True
        self.act = ACTIVATIONS[spec.activation]
        self.activation = spec.activation
        self.dropout = Dropout(spec.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(_drop(self.dropout, self.act(self.up_proj(x)), self.training))  # (B, T, D)

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class GLU(nn.Module):
    """down(dropout(act(gate(x)) * up(x))): gated linear units (Shazeer 2020, "GLU
    Variants Improve Transformer"); SwiGLU with silu, GeGLU with gelu, ReGLU with relu."""

    def __init__(self, spec: GLUSpec, *, d_model: int) -> None:
        super().__init__()
        _require_d_ff(spec.d_ff)
        self.gate_proj = Linear(d_model, spec.d_ff, bias=spec.bias)
        self.up_proj = Linear(d_model, spec.d_ff, bias=spec.bias)
        self.down_proj = Linear(spec.d_ff, d_model, bias=spec.bias)
        self.down_proj.residual_projection = True
        self.act = ACTIVATIONS[spec.activation]
        self.activation = spec.activation
        self.dropout = Dropout(spec.dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.gate_proj(x)) * self.up_proj(x)  # (B, T, F)
        return self.down_proj(_drop(self.dropout, h, self.training))  # (B, T, D)

    def extra_repr(self) -> str:
        return f"activation={self.activation}"
