"""Normalisation layers: torch's own LayerNorm and RMSNorm, built from their specs.

Shape legend: B batch, T length, D normalised size (d_model, or Dh for qk-norm); N = B·T rows.

Placement (pre / post) and the final norm are wiring, decided by the blocks and
stacks in :mod:`specformer.components.blocks`; a norm module only normalises.

torch has no fused RMSNorm kernel for the CPU: ``F.rms_norm`` there is six elementwise
operations, whose autograd keeps the normalised rows as well as the input. On the CPU, for
float32, bfloat16, float16 or float64 rows, :class:`RMSNorm` computes the same forward (the
same numbers, in float32, or float64 for float64 rows) in three passes and its backward from the input and the per-row scale
alone: 0.21 against 0.30 ms for a float32 (512, 512) forward and backward on a 2-core AMD
EPYC, and half the memory kept (N × D floats, not 2 N × D). It also takes the bfloat16
queries and keys that qk-norm normalises under bfloat16 autocast with its float32 weight,
where torch's own path warns that it cannot run fused. Elsewhere, under ``torch.compile``
(which fuses torch's own operations) or ``torch.func`` transforms, and where autograd does
not record it (inference, where torch's path is as fast), it is ``nn.RMSNorm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specformer.components.products import in_functorch_transform

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import LayerNormSpec, RMSNormSpec

__all__ = ["RMSNorm", "build_layernorm", "build_rmsnorm"]


def build_layernorm(spec: LayerNormSpec, *, dim: int) -> nn.LayerNorm:
    """Layer normalisation over the last ``dim`` features (Ba et al. 2016)."""
    return nn.LayerNorm(dim, eps=spec.eps, elementwise_affine=spec.weight, bias=spec.bias)


def build_rmsnorm(spec: RMSNormSpec, *, dim: int) -> RMSNorm:
    """RMS normalisation over the last ``dim`` features (Zhang & Sennrich 2019)."""
    return RMSNorm(dim, eps=spec.eps, offset=spec.offset)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (Zhang & Sennrich 2019), same parameters and state-dict names, with
    the CPU kernels of the module docstring: ``x / sqrt(mean(x²) + eps) * weight``, computed
    in float32 and returned in the input's dtype, as torch computes it.

    ``offset`` is added to the weight (Gemma's ``(1 + weight)``, offset 1): the gain is
    ``offset + weight``, and the weight starts at ``1 - offset``, so a new norm's gain is 1."""

    def __init__(self, normalized_shape: int, eps: float | None = None, *, offset: float = 0.0, **kwargs) -> None:
        self.offset = float(offset)  # before nn.RMSNorm's __init__, whose reset_parameters reads it
        super().__init__(normalized_shape, eps=eps, **kwargs)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.offset)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", offset={self.offset:g}" if self.offset else "")

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if w is not None and self.offset:
            w = w + self.offset  # float32 like the weight (Gemma adds it in float32 too)
        if (
            w is not None
            # first, being the cheapest: without autograd torch's own path is as fast, and the checks
            # below cost more than a decoding step's one-row norm; but torch's path warns on a
            # bfloat16 input with a float32 weight
            and ((torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)) or x.dtype != w.dtype)
            and x.device.type == "cpu"
            and x.dtype in _KERNEL_DTYPES
            and w.dtype in _KERNEL_DTYPES
            and len(self.normalized_shape) == 1
            and not torch.compiler.is_compiling()
            and not in_functorch_transform()
        ):
            eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
            return _RMSNormFunction.apply(x, w, eps)
        return nn.functional.rms_norm(x, self.normalized_shape, w, self.eps)  # nn.RMSNorm's, with the offset


_KERNEL_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


class _RMSNormFunction(torch.autograd.Function):
    """Forward and backward of :class:`RMSNorm` on (..., D) rows, in float32 (float64 for a
    float64 input) whatever the input's and weight's dtypes (gradients are returned in
    theirs); keeps the input and the per-row scale ``r = 1 / sqrt(mean(x²) + eps)``. With
    ``u = g · w``:
    ``dx = r·u - x · r³ · mean(u · x)``, ``dw = Σ_rows r · g · x``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        with torch.autocast("cpu", enabled=False):
            # mean(x²) summed as torch sums it: the same scale to the last bit
            scale = x.to(torch.promote_types(x.dtype, torch.float32)).square().mean(-1, keepdim=True).add_(eps).rsqrt_()  # (..., 1)
            y = torch.mul(x, scale).mul_(weight).to(x.dtype)  # as torch: x·r·w in float32, then x's dtype
        ctx.save_for_backward(x, weight, scale)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight, scale = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: this gradient is differentiated in turn
            return (*_differentiable_grads(x, weight, grad, ctx.eps, ctx.needs_input_grad[:2]), None)
        d = x.shape[-1]
        dx = dw = None
        with torch.autocast("cpu", enabled=False):
            acc = scale.dtype
            rows, g = x.reshape(-1, d).to(acc), grad.reshape(-1, d).to(acc)  # (N, D); copies only if not float32
            w, r = weight.to(acc), scale.reshape(-1)  # (D,), (N,)
            gx = g * rows  # (N, D)
            if ctx.needs_input_grad[1]:
                dw = torch.mv(gx.t(), r).to(weight.dtype)  # (D,)
            if ctx.needs_input_grad[0]:
                coef = torch.mv(gx, w).mul_(r.pow(3)).div_(d)  # (N,): r³ · mean(u · x)
                dx = (g * w).mul_(r[:, None]).addcmul_(rows, coef[:, None], value=-1).view(x.shape).to(x.dtype)
        return dx, dw, None


def _differentiable_grads(x: Tensor, weight: Tensor, grad: Tensor, eps: float,
                          needs: tuple[bool, ...]) -> tuple[Tensor | None, Tensor | None]:
    """The input's and weight's gradients as a graph of torch's own operations (for double
    backward: Hessian-vector products, gradient penalties), from torch's RMSNorm."""
    wanted = [t for t, need in zip((x, weight), needs, strict=True) if need]
    with torch.enable_grad():
        y = nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
        grads = iter(torch.autograd.grad(y, wanted, grad, create_graph=True))
    return next(grads) if needs[0] else None, next(grads) if needs[1] else None
