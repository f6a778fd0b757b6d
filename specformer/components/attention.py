"""Multi-head, grouped-query and multi-query attention; self- and cross-attention.

Shape legend: B batch, T query length, S key length (past + new for cached
self-attention, the encoder length for cross-attention), D d_model, H query heads,
Hkv key/value heads (H for MHA, 1 for MQA, a divisor of H for GQA), G = H / Hkv,
Dh head size, R rotated size.

State-dict names. Self-attention: ``qkv_proj`` (one fused projection D -> (H + 2 Hkv) Dh,
rows ordered q, k, v), ``o_proj`` (H Dh -> D). Cross-attention: ``q_proj`` (D -> H Dh),
``kv_proj`` (fused D -> 2 Hkv Dh, k rows then v rows), ``o_proj``. With qk-norm:
``q_norm``, ``k_norm`` (over Dh, shared by the heads; with ``qk_norm_scope: all``, over the
whole projection, H·Dh and Hkv·Dh).

Two backends with one signature: ``sdpa`` calls
:func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels where the
hardware has them, GQA without copying keys); ``eager`` computes
softmax(Q K^T * scale + mask) V explicitly and can return the weights. Asking for
weights (``need_weights=True``) runs the eager math for that call.

Masks arrive ready-made from the stack (built once per forward, shared by layers):
``mask`` is None, a boolean (B|1, 1, T, S) tensor (True = attend) or an additive
float (B|1, H|1, T, S) tensor; ``is_causal`` asks for the causal mask without
materialising it (only when T == S and nothing else is masked).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.components.cache import KVCache
from specformer.components.dropout import dropout as apply_dropout
from specformer.components.positional import apply_rotary
from specformer.components.products import (
    Linear,
    bf16_in_float32,
    float32_matmul,
    in_functorch_transform,
    measured_faster,
    measurement,
    mm_nt,
    onednn_is_faster,
    rounded_to_bf16,
)
from specformer.registry import REGISTRY

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import AttentionSpec

__all__ = [
    "Attention", "sdpa_attention", "eager_attention", "cpu_matmul_attention", "matmul_attention_is_faster",
    "float32_attention_is_faster", "repeat_kv", "symbolic_lengths", "BACKENDS",
]


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, Hkv * G, S, Dh): query head h reads key/value head h // G."""
    if groups == 1:
        return x
    b, hkv, s, dh = x.shape
    return x[:, :, None].expand(b, hkv, groups, s, dh).reshape(b, hkv * groups, s, dh)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout: float,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention through torch's fused ``scaled_dot_product_attention``; returns (out, None)."""
    if q.is_floating_point() and bf16_in_float32(q, k, v):
        q, k, v, mask = _rounded(q, k, v, mask)
        with torch.autocast("cpu", enabled=False):
            if torch.compiler.is_compiling():
                out = _compiled_sdpa_in_float32(q, k, v, mask, is_causal=is_causal, scale=scale, dropout=dropout)
            else:
                out, _ = sdpa_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale, dropout=dropout)
        return out.to(torch.bfloat16), None
    if mask is not None and mask.requires_grad:
        return _learned_bias_attention(q, k, v, mask, scale=scale, dropout=dropout), None
    if dropout == 0.0 and (mask is None or _pads_keys_only(mask, is_causal)):
        block = _matmul_block_rows(q, k, v, is_causal=is_causal)
        if block:
            return cpu_matmul_attention(q, k, v, is_causal=is_causal, scale=scale, block=block, key_padding=mask), None
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and mask is not None and q.device.type != "cpu":
        # the fused accelerator kernels that take a mask do not take GQA (torch would fall
        # back to the math kernel), so repeat keys and values instead
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        groups = 1
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=groups > 1,
    )  # (B, H, T, Dh)
    return out, None


# Training on the CPU, bfloat16: torch's fused CPU kernel (the flash-attention one SDPA
# picks there) takes 2.3-2.6x as long, forward and backward, as the same attention done in
# bfloat16 matrix products (a llama-style layer at T = 512: 14.8 ms against 5.7 ms; at
# T = 256: 6.0 against 2.6 ms), a quarter of a bf16 step. Queries go MATMUL_BLOCK rows at a
# time, each block against the keys up to its own last position, so causal attention
# computes 1/2 + MATMUL_BLOCK / (2 T) of the scores. A call keeps its first blocks'
# probabilities for the backward pass, up to MATMUL_KEPT_BYTES (a llama-style layer's at
# T = 256: 2.7 ms off a 101 ms bf16 step), and the backward pass computes the others' again,
# so what is kept beyond Q, K, V (which the fused kernel keeps too) is bounded. A block's
# scores live only while it runs: past MATMUL_BLOCK_SCORES entries for MATMUL_MIN_ROWS rows
# (a very long or very wide batch), SDPA is used; and wherever a measurement taken once per
# process finds the fused kernel as fast (matmul_attention_is_faster).
#
# Float32: the same blocks, one key/value head at a time, through the float32 products of
# specformer.components.products (oneDNN where it is faster than MKL, as on AMD processors):
# the fused kernel runs at ~130 GFLOP/s there, oneDNN's products at 320-440. Worth it where a
# product has FLOAT32_PRODUCT_ROWS query rows or more (G heads x the block's rows; the block
# grows for small G): a (1, 12 / 4, 512, 64) layer 16 ms -> 11 ms; at 128-256 rows (MHA at
# T = 256) the fused kernel is faster. Taken where float32_attention_is_faster.
MATMUL_BLOCK = 128
#: bfloat16, not causal (encoders, cross-attention): a call of at most this many query rows is
#: one block (its scores within MATMUL_BLOCK_SCORES), so each gradient is one product and none
#: is summed over blocks: a (4, 4, 256, 64) call forward and backward 2.29 -> 1.73 ms, a
#: bert-style bf16 step 56.8 -> 54.6. A causal call keeps its blocks of MATMUL_BLOCK rows,
#: which skip the masked scores: one block measured no faster there (llama-style 101.5
#: against 101.8 ms a step) and keeps more probabilities
MATMUL_ONE_BLOCK = 256
MATMUL_MIN_ROWS = 16
MATMUL_BLOCK_SCORES = 1 << 22
#: bytes of probabilities (bfloat16, or float32 on the float32 path) one attention call keeps
#: for its backward pass (its first blocks'), which the backward pass then does not compute again
MATMUL_KEPT_BYTES = 4 << 20
#: a causal call's block masks (about G T^2 / 2 bfloat16 entries) are cached up to this size,
#: for the few shapes a process trains (every layer, every step, asks for the same ones)
MATMUL_MASK_CACHE_BYTES = 4 << 20
FLOAT32_PRODUCT_ROWS = 512
#: None: measured once per process (:func:`matmul_attention_is_faster`); True or False: decided
MATMUL_ATTENTION: bool | None = None
#: None: measured once per process (:func:`float32_attention_is_faster`); True or False: decided
FLOAT32_ATTENTION: bool | None = None
#: the matmul path is taken where its time is at most this fraction of the fused kernel's
MATMUL_MARGIN = 0.85
FLOAT32_MARGIN = 0.9


def _faster_than_fused(dtype: torch.dtype, b: int, h: int, hkv: int, t: int, margin: float) -> bool:
    """Forward and backward of a causal GQA attention (head size 64) through
    :func:`cpu_matmul_attention` against torch's fused kernel, timed alternately."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, t, 64, generator=gen).to(dtype).requires_grad_()
    k, v = (torch.randn(b, hkv, t, 64, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    grad = torch.randn(b, h, t, 64, generator=gen).to(dtype)
    block = MATMUL_BLOCK if dtype == torch.bfloat16 else _float32_block_rows(h // hkv, t, t)

    def fused() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True)
        torch.autograd.grad(out, (q, k, v), grad)

    def products() -> None:
        out = cpu_matmul_attention(q, k, v, is_causal=True, scale=0.125, block=block)
        torch.autograd.grad(out, (q, k, v), grad)

    with torch.enable_grad():
        return measured_faster(products, fused, margin=margin, rounds=3)


@measurement
def _measured_matmul_attention() -> bool:
    return _faster_than_fused(torch.bfloat16, 1, 8, 2, 256, MATMUL_MARGIN)


@measurement
def _measured_float32_attention() -> bool:
    if not onednn_is_faster():  # MKL's products: the per-head blocks would be no faster
        return False
    try:
        return _faster_than_fused(torch.float32, 1, 8, 2, 512, FLOAT32_MARGIN)
    except (RuntimeError, AttributeError):  # a torch built without oneDNN's product
        return False


def matmul_attention_is_faster() -> bool:
    """Whether bf16 training attention on the CPU runs as :func:`cpu_matmul_attention`:
    :data:`MATMUL_ATTENTION` if set, else measured once per process against torch's fused
    kernel (forward and backward of a (1, 8, 256, 64) causal GQA attention, ~20 ms)."""
    return MATMUL_ATTENTION if MATMUL_ATTENTION is not None else _measured_matmul_attention()


def float32_attention_is_faster() -> bool:
    """Whether float32 training attention on the CPU runs as :func:`cpu_matmul_attention`
    (where its products are large enough): :data:`FLOAT32_ATTENTION` if set, else measured
    once per process against torch's fused kernel (forward and backward of a
    (1, 8 / 2, 512, 64) causal attention, ~80 ms), and only where float32 products go
    through oneDNN (:func:`specformer.components.products.onednn_is_faster`)."""
    return FLOAT32_ATTENTION if FLOAT32_ATTENTION is not None else _measured_float32_attention()


def _matmul_block_rows(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool) -> int:
    """Rows of queries a block of :func:`cpu_matmul_attention` takes here, or 0 where attention
    stays with SDPA: off the CPU, when no gradient is taken (inference), a causal query block
    with a cache offset, keys too many, outside bfloat16 (the inputs', or autocast's) and
    float32, or in float32 where the products would be too small (:func:`_float32_block_rows`)."""
    if not torch.is_grad_enabled() or q.device.type != "cpu":
        return 0
    if in_functorch_transform():  # torch.func.grad, vmap: the fused kernel has their rules
        return 0
    if not (q.requires_grad or k.requires_grad or v.requires_grad):
        return 0
    b, h, t, _ = q.shape
    hkv, s = k.shape[1], k.shape[-2]
    if is_causal and t != s:
        return 0
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu") if q.is_floating_point() else q.dtype
    else:
        dtype = q.dtype if q.dtype == k.dtype == v.dtype else None
    if dtype == torch.bfloat16:
        rows = _bf16_block_rows(b, h, t, s, is_causal=is_causal)
        if rows < min(MATMUL_MIN_ROWS, t):
            return 0
        return rows if matmul_attention_is_faster() else 0
    if dtype == torch.float32:
        rows = _float32_block_rows(h // hkv, t, s)
        return rows if rows and float32_attention_is_faster() else 0
    return 0


def _bf16_block_rows(b: int, h: int, t: int, s: int, *, is_causal: bool) -> int:
    """Query rows of a bfloat16 block: for a call that is not causal, MATMUL_ONE_BLOCK (the
    whole call) for T up to it; else MATMUL_BLOCK; within MATMUL_BLOCK_SCORES scores."""
    if not is_causal and t <= MATMUL_ONE_BLOCK and b * h * t * s <= MATMUL_BLOCK_SCORES:
        return MATMUL_ONE_BLOCK
    return min(MATMUL_BLOCK, MATMUL_BLOCK_SCORES // max(1, b * h * s))


def _float32_block_rows(groups: int, t: int, s: int) -> int:
    """Query rows of a float32 block: enough that the G query heads of a key/value head give
    products of FLOAT32_PRODUCT_ROWS rows (a multiple of 64, at least MATMUL_BLOCK, at most T),
    within MATMUL_BLOCK_SCORES scores; 0 where the products stay smaller."""
    rows = max(MATMUL_BLOCK, -(-FLOAT32_PRODUCT_ROWS // (64 * groups)) * 64)
    rows = min(rows, t, MATMUL_BLOCK_SCORES // max(1, groups * s))
    return rows if groups * rows >= FLOAT32_PRODUCT_ROWS else 0


def _block_queries(q: Tensor, start: int, end: int) -> Tensor:
    """A block's queries (B, Hkv, G, T, Dh) as one product's rows per key/value head: (B Hkv, G n, Dh)."""
    b, hkv, g, _, dh = q.shape
    return q[:, :, :, start:end].reshape(b * hkv, g * (end - start), dh)


def _block_mask(t: int, block: int, g: int, index: int, like: Tensor) -> Tensor | None:
    """The additive causal mask of block ``index`` (``block`` query rows from index x block),
    for its G n rows (the n rows of each of the G heads in turn) against the keys up to its
    last position: (G n, end); None when none of its rows has a future key. Cached where a
    call's masks take at most MATMUL_MASK_CACHE_BYTES."""
    blocks = -(-t // block)
    size = g * block * block * blocks * (blocks + 1) // 2 * like.element_size()  # an upper bound
    if size <= MATMUL_MASK_CACHE_BYTES and not torch.compiler.is_compiling():
        return _cached_block_masks(t, block, g, like.dtype, like.device)[index]
    return _causal_block_mask(t, block, g, index, like.dtype, like.device)


def _causal_block_mask(t: int, block: int, g: int, index: int, dtype: torch.dtype, device: torch.device
                       ) -> Tensor | None:
    start = index * block
    end = min(t, start + block)
    if start + 1 >= end:
        return None
    # row r (position start + r) masks key c > start + r: the diagonal start + 1 and above
    mask = torch.full((end - start, end), float("-inf"), dtype=dtype, device=device).triu_(start + 1)
    return mask.repeat(g, 1)


@functools.lru_cache(maxsize=4)
def _cached_block_masks(t: int, block: int, g: int, dtype: torch.dtype, device: torch.device
                        ) -> tuple[Tensor | None, ...]:
    return tuple(_causal_block_mask(t, block, g, i, dtype, device) for i in range(-(-t // block)))


def _block_probabilities(rows: Tensor, keys_t: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """softmax(rows keys_t * scale + mask) of a block: ``rows`` (B Hkv, G n, Dh) and
    ``keys_t`` (B Hkv, Dh, keys) in, (B Hkv, G n, keys) out. The scale and the mask are the
    product's own (``baddbmm``'s alpha and input), not passes of their own."""
    if mask is None:
        scores = torch.baddbmm(rows.new_zeros(()), rows, keys_t, beta=0.0, alpha=scale)
    else:
        scores = torch.baddbmm(mask, rows, keys_t, alpha=scale)
    return scores.softmax(dim=-1)


def _by_pair(x: Tensor) -> Tensor:
    """(B, Hkv, S, Dh) -> (B Hkv, S, Dh), a view when the layout allows."""
    b, hkv, s, dh = x.shape
    return x.reshape(b * hkv, s, dh)


def _bf16_forward(q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float,
                  block: int, *, keep: bool) -> tuple[Tensor, list[Tensor]]:
    """The bfloat16 path's output (B, H, T, Dh), and the probabilities it keeps for the
    backward pass (its first blocks', none unless ``keep``). ``padding``: (B, S) additive,
    the padded keys' (not causal)."""
    b, h, t, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    qv = q.view(b, hkv, g, t, dh)
    keys, values = _by_pair(k), _by_pair(v)  # (B Hkv, S, Dh)
    keys_t = keys.transpose(1, 2)
    out = q.new_empty(b, hkv, g, t, dh)
    kept = _Kept(MATMUL_KEPT_BYTES if keep else 0)
    pad = _by_pair_padding(padding, hkv)
    for start in range(0, t, block):
        end = min(t, start + block)
        n = end if is_causal else s
        mask = _block_mask(t, block, g, start // block, q) if is_causal else pad
        weights = _block_probabilities(_block_queries(qv, start, end), keys_t[..., :n], mask, scale)
        out[:, :, :, start:end] = torch.bmm(weights, values[:, :n]).view(b, hkv, g, end - start, dh)
        kept.offer(weights)
    return out.view(b, h, t, dh), kept.tensors


def _bf16_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, kept: Sequence[Tensor],
                   is_causal: bool, scale: float, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the bfloat16 path; ``kept``: the probabilities its forward pass kept."""
    b, h, t, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    with torch.autocast("cpu", enabled=False):
        grad = grad.to(q.dtype).view(b, hkv, g, t, dh)  # splits H: a view in any layout
        qv = q.view(b, hkv, g, t, dh)
        keys, values = _by_pair(k), _by_pair(v)
        keys_t, values_t = keys.transpose(1, 2), values.transpose(1, 2)
        pad = _by_pair_padding(padding, hkv)
        if t <= block:  # one block: its key and value gradients are whole products, nothing to sum
            weights = kept[0] if kept else _block_probabilities(
                _block_queries(qv, 0, t), keys_t, _block_mask(t, block, g, 0, q) if is_causal else pad, scale)
            return _one_block_grads(qv, grad, keys, values_t, weights, scale)
        none = q.new_zeros(())
        dq = q.new_empty(b, hkv, g, t, dh)
        dk = torch.zeros(b * hkv, s, dh, dtype=torch.float32, device=q.device)  # summed over blocks
        dv = torch.zeros(b * hkv, s, dh, dtype=torch.float32, device=q.device)
        for start in range(0, t, block):
            end = min(t, start + block)
            n = end if is_causal else s
            rows = _block_queries(qv, start, end)
            if start // block < len(kept):  # kept by the forward pass
                weights = kept[start // block]
            else:
                mask = _block_mask(t, block, g, start // block, q) if is_causal else pad
                weights = _block_probabilities(rows, keys_t[..., :n], mask, scale)
            grad_rows = _block_queries(grad, start, end)
            grad_scores = torch.ops.aten._softmax_backward_data(
                torch.bmm(grad_rows, values_t[..., :n]), weights, -1, weights.dtype)
            dq[:, :, :, start:end] = torch.baddbmm(
                none, grad_scores, keys[:, :n], beta=0.0, alpha=scale).view(b, hkv, g, end - start, dh)
            dk[:, :n] += torch.bmm(grad_scores.transpose(1, 2), rows)
            dv[:, :n] += torch.bmm(weights.transpose(1, 2), grad_rows)
    return (dq.view(b, h, t, dh), dk.mul_(scale).view(b, hkv, s, dh).to(k.dtype),
            dv.view(b, hkv, s, dh).to(v.dtype))


def _one_block_grads(qv: Tensor, grad: Tensor, keys: Tensor, values_t: Tensor, weights: Tensor, scale: float
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of a call whose queries are one block: qv and grad (B, Hkv, G, T, Dh), keys
    (B Hkv, S, Dh), values_t (B Hkv, Dh, S), weights (B Hkv, G T, S). Each gradient is one
    product, summed in float32 inside it and rounded once, as the blocks' float32 sum is."""
    b, hkv, g, t, dh = qv.shape
    s = keys.shape[1]
    rows, grad_rows = _block_queries(qv, 0, t), _block_queries(grad, 0, t)  # (B Hkv, G T, Dh)
    none = qv.new_zeros(())
    grad_scores = torch.ops.aten._softmax_backward_data(
        torch.bmm(grad_rows, values_t), weights, -1, weights.dtype)
    dq = torch.baddbmm(none, grad_scores, keys, beta=0.0, alpha=scale)
    dk = torch.baddbmm(none, grad_scores.transpose(1, 2), rows, beta=0.0, alpha=scale)
    dv = torch.bmm(weights.transpose(1, 2), grad_rows)
    return dq.view(b, hkv * g, t, dh), dk.view(b, hkv, s, dh), dv.view(b, hkv, s, dh)


class _MatmulAttention(torch.autograd.Function):
    """Forward and backward of :func:`cpu_matmul_attention`; bfloat16 inputs, autocast off."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float,  # type: ignore[override]
                block: int) -> Tensor:
        out, kept = _bf16_forward(q, k, v, padding, is_causal, scale, block, keep=True)
        ctx.save_for_backward(q, k, v, padding, *kept)
        ctx.is_causal, ctx.scale, ctx.block = is_causal, scale, block
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, padding, *kept = ctx.saved_tensors
        return (*_bf16_backward(grad, q, k, v, padding, kept, ctx.is_causal, ctx.scale, ctx.block),
                None, None, None, None)


class _Kept:
    """The probabilities a forward pass keeps for its backward pass: its first blocks', in
    order, up to MATMUL_KEPT_BYTES; block n is kept if ``n < len(tensors)``."""

    def __init__(self, budget: int = MATMUL_KEPT_BYTES) -> None:
        self.tensors: list[Tensor] = []
        self._budget = budget
        self._closed = False

    def offer(self, weights: Tensor) -> None:
        size = weights.numel() * weights.element_size()
        if self._closed or size > self._budget:
            self._closed = True  # later blocks are computed again, so the kept ones stay a prefix
            return
        self.tensors.append(weights)
        self._budget -= size


def _future(t: int, s: int, like: Tensor) -> Tensor:
    """(T, S) additive causal mask: -inf above the diagonal, 0 elsewhere."""
    return torch.full((t, s), float("-inf"), dtype=like.dtype, device=like.device).triu_(1)


def _float32_forward(q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float,
                     block: int, *, keep: bool) -> tuple[Tensor, list[Tensor]]:
    """The float32 path's output (B, H, T, Dh) (laid out (B, T, H, Dh)), and the probabilities
    it keeps for the backward pass (its first blocks', none unless ``keep``)."""
    b, h, t, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    qs = _by_kv_head(q * scale, hkv)  # (B, Hkv, T, G, Dh)
    keys_all, values_t = k.contiguous(), v.transpose(-2, -1).contiguous()  # (B, Hkv, S, Dh), (B, Hkv, Dh, S)
    future = _future(t, s, q) if is_causal else None
    out = q.new_empty(b, t, hkv, g, dh)
    kept = _Kept(MATMUL_KEPT_BYTES if keep else 0)
    for i, j, start, end, keys in _float32_blocks(b, hkv, t, s, block, is_causal):
        rows = qs[i, j, start:end].view(-1, dh)  # (n G, Dh)
        weights = _float32_probabilities(rows, keys_all[i, j, :keys], future, start, end, _row(padding, i))
        values = values_t[i, j] if keys == s else values_t[i, j, :, :keys].contiguous()
        out[i, start:end, j] = mm_nt(weights, values).view(end - start, g, dh)
        kept.offer(weights)
    return out.view(b, t, h, dh).transpose(1, 2), kept.tensors  # (B, H, T, Dh)


def _float32_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, kept: Sequence[Tensor],
                      is_causal: bool, scale: float, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the float32 path; ``kept``: the probabilities its forward pass kept."""
    b, h, t, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    qs, grad = _by_kv_head(q * scale, hkv), _by_kv_head(grad, hkv)  # (B, Hkv, T, G, Dh)
    keys_all, values_all = k.contiguous(), v.contiguous()  # (B, Hkv, S, Dh)
    keys_t = k.transpose(-2, -1).contiguous()  # (B, Hkv, Dh, S)
    future = _future(t, s, q) if is_causal else None
    dq = q.new_empty(b, t, hkv, g, dh)
    dk = torch.zeros_like(keys_all)  # summed over blocks
    dv = torch.zeros_like(values_all)
    for n, (i, j, start, end, keys) in enumerate(_float32_blocks(b, hkv, t, s, block, is_causal)):
        rows = qs[i, j, start:end].view(-1, dh)  # (n G, Dh)
        weights = kept[n] if n < len(kept) else _float32_probabilities(
            rows, keys_all[i, j, :keys], future, start, end, _row(padding, i))
        grad_rows = grad[i, j, start:end].view(-1, dh)
        grad_scores = torch.ops.aten._softmax_backward_data(
            mm_nt(grad_rows, values_all[i, j, :keys]), weights, -1, weights.dtype)  # (n G, keys)
        keys_tk = keys_t[i, j] if keys == s else keys_t[i, j, :, :keys].contiguous()
        dq[i, start:end, j] = mm_nt(grad_scores, keys_tk).view(end - start, g, dh)
        dk[i, j, :keys].addmm_(grad_scores.t(), rows)
        dv[i, j, :keys].addmm_(weights.t(), grad_rows)
    return dq.view(b, t, h, dh).transpose(1, 2).mul_(scale), dk, dv


class _Float32Attention(torch.autograd.Function):
    """Forward and backward of :func:`cpu_matmul_attention` in float32: per batch row and
    key/value head, a block's rows for its G query heads (position-major: row r * G + g is
    position start + r of head g) as one product (``mm_nt``: oneDNN where it is faster). The
    queries, the incoming gradient, the output and the query gradient are laid out
    (B, T, H, Dh), as the projections around attention give and read them, so a block's rows
    are a view."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float,  # type: ignore[override]
                block: int) -> Tensor:
        out, kept = _float32_forward(q, k, v, padding, is_causal, scale, block, keep=True)
        ctx.save_for_backward(q, k, v, padding, *kept)
        ctx.is_causal, ctx.scale, ctx.block = is_causal, scale, block
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, padding, *kept = ctx.saved_tensors
        return (*_float32_backward(grad, q, k, v, padding, kept, ctx.is_causal, ctx.scale, ctx.block),
                None, None, None, None)


# Under torch.compile with lengths traced as symbols (padded batches, :func:`symbolic_lengths`),
# a loop over T's blocks would make the length a constant again (a graph for every length):
# there, the products path is one opaque operation whose loops run on the call's real
# shapes. The probabilities it keeps for the backward pass go back to back into one buffer of
# MATMUL_KEPT_BYTES (a size the trace knows without the shapes), which the backward pass reads
# in the same order. With constant lengths the loops are traced instead (inductor then fuses
# the casts around them): ~4% faster a llama-style bf16 step.
_SYMBOLIC_LENGTHS = False


@contextlib.contextmanager
def symbolic_lengths() -> Iterator[None]:
    """Within this context a ``torch.compile`` trace takes attention's products path as one
    opaque operation (``specformer::products_attention``), so that lengths marked dynamic
    stay symbols (dynamo guards on the flag: graphs traced outside it are kept apart)."""
    global _SYMBOLIC_LENGTHS
    before, _SYMBOLIC_LENGTHS = _SYMBOLIC_LENGTHS, True
    try:
        yield
    finally:
        _SYMBOLIC_LENGTHS = before


def _like_output(q: Tensor) -> Tensor:
    """An empty (B, H, T, Dh) in the layout the path's output (and query gradient) has: contiguous
    in bfloat16, (B, T, H, Dh) transposed in float32."""
    b, h, t, dh = q.shape
    return q.new_empty(b, h, t, dh) if q.dtype == torch.bfloat16 else q.new_empty(b, t, h, dh).transpose(1, 2)


def _kept_buffer(like: Tensor) -> Tensor:
    return like.new_empty(MATMUL_KEPT_BYTES // like.element_size())


def _pack(kept: Sequence[Tensor], like: Tensor) -> Tensor:
    """The kept probabilities back to back in one buffer of MATMUL_KEPT_BYTES (they fit: the
    forward pass kept them within that budget)."""
    buffer, offset = _kept_buffer(like), 0
    for weights in kept:
        buffer[offset:offset + weights.numel()].view(weights.shape).copy_(weights)
        offset += weights.numel()
    buffer[offset:].zero_()  # the rest is never read, but an operation's output is defined
    return buffer


def _unpack(buffer: Tensor, q: Tensor, k: Tensor, is_causal: bool, block: int) -> list[Tensor]:
    """The probabilities :func:`_pack` put in ``buffer``: the blocks' shapes in the forward
    pass's order, as many as fitted (the rule of :class:`_Kept`)."""
    b, h, t, _ = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    if q.dtype == torch.bfloat16:
        blocks = ((start, min(t, start + block)) for start in range(0, t, block))
        shapes = [(b * hkv, g * (end - start), end if is_causal else s) for start, end in blocks]
    else:
        shapes = [((end - start) * g, keys) for _, _, start, end, keys in _float32_blocks(b, hkv, t, s, block, is_causal)]
    kept, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if offset + size > buffer.numel():
            break
        kept.append(buffer[offset:offset + size].view(shape))
        offset += size
    return kept


@torch.library.custom_op("specformer::products_attention", mutates_args=())
def _products_attention(q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float,
                        block: int) -> tuple[Tensor, Tensor]:
    forward = _bf16_forward if q.dtype == torch.bfloat16 else _float32_forward
    out, kept = forward(q, k, v, padding, is_causal, scale, block, keep=True)
    return out, _pack(kept, q)


@_products_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, is_causal: bool, scale: float, block: int
      ) -> tuple[Tensor, Tensor]:
    return _like_output(q), _kept_buffer(q)


@torch.library.custom_op("specformer::products_attention_backward", mutates_args=())
def _products_attention_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, kept: Tensor,
                                 is_causal: bool, scale: float, block: int) -> tuple[Tensor, Tensor, Tensor]:
    backward = _bf16_backward if q.dtype == torch.bfloat16 else _float32_backward
    return backward(grad, q, k, v, padding, _unpack(kept, q, k, is_causal, block), is_causal, scale, block)


@_products_attention_backward.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, padding: Tensor | None, kept: Tensor, is_causal: bool,
      scale: float, block: int) -> tuple[Tensor, Tensor, Tensor]:
    return _like_output(q), k.new_empty(k.shape), v.new_empty(v.shape)


def _products_attention_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, padding, ctx.is_causal, ctx.scale, ctx.block = inputs
    ctx.save_for_backward(q, k, v, padding, output[1])
    ctx.mark_non_differentiable(output[1])


def _products_attention_grad(ctx: Any, grad: Tensor, _: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, padding, kept = ctx.saved_tensors
    dq, dk, dv = _products_attention_backward(grad, q, k, v, padding, kept, ctx.is_causal, ctx.scale, ctx.block)
    return dq, dk, dv, None, None, None, None


_products_attention.register_autograd(_products_attention_grad, setup_context=_products_attention_setup)


def _float32_blocks(b: int, hkv: int, t: int, s: int, block: int, is_causal: bool) -> Iterator[tuple[int, ...]]:
    """(batch row, key/value head, first row, end row, keys) of each block, in order."""
    for i in range(b):
        for j in range(hkv):
            for start in range(0, t, block):
                end = min(t, start + block)
                yield i, j, start, end, (end if is_causal else s)


def _by_kv_head(x: Tensor, hkv: int) -> Tensor:
    """(B, H, T, Dh) -> (B, Hkv, T, G, Dh), contiguous (a copy unless it already is)."""
    b, h, t, dh = x.shape
    return x.view(b, hkv, h // hkv, t, dh).transpose(2, 3).contiguous()


def _float32_probabilities(rows: Tensor, keys: Tensor, future: Tensor | None, start: int, end: int,
                           padding: Tensor | None = None) -> Tensor:
    """softmax of one block's scores (n G, keys) for its scaled, position-major query ``rows``
    (n G, Dh); ``padding``: the batch row's (S,) additive mask of padded keys."""
    n, s = end - start, keys.shape[0]
    scores = mm_nt(rows, keys)  # (n G, keys)
    if future is not None and start + 1 < s:
        scores.view(n, -1, s).add_(future[start:end, None, :s])
    if padding is not None:
        scores.add_(padding[:s])
    return scores.softmax(dim=-1)


def _pads_keys_only(mask: Tensor, is_causal: bool) -> bool:
    """Whether ``mask`` masks keys alone, the same for every query and head ((B, 1, 1, S):
    padded keys, as cross-attention's and a training encoder's masks are), and nothing else
    does: the products path then adds it to its scores."""
    return not is_causal and not mask.requires_grad and mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1


def _additive_padding(mask: Tensor, like: Tensor) -> Tensor:
    """(B, S) additive mask in ``like``'s dtype from a (B|1, 1, 1, S) boolean or additive one:
    the dtype's finite minimum at a padded key (not -inf, so that a row of padding alone, which
    no loss reads, stays finite)."""
    b, s = like.shape[0], mask.shape[-1]
    mask = mask.reshape(mask.shape[0], s).expand(b, s)
    low = torch.finfo(like.dtype).min
    if mask.dtype == torch.bool:
        return torch.zeros((b, s), dtype=like.dtype, device=like.device).masked_fill_(~mask, low)
    return mask.to(like.dtype).clamp_min(low)


def _by_pair_padding(padding: Tensor | None, hkv: int) -> Tensor | None:
    """(B, S) -> (B Hkv, 1, S): a block's mask for its product's rows, broadcast."""
    if padding is None:
        return None
    b, s = padding.shape
    return padding[:, None, None, :].expand(b, hkv, 1, s).reshape(b * hkv, 1, s)


def _row(padding: Tensor | None, i: int) -> Tensor | None:
    return padding[i] if padding is not None else None


def cpu_matmul_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, scale: float,
                         block: int = MATMUL_BLOCK, key_padding: Tensor | None = None) -> Tensor:
    """softmax(Q K^T * scale [+ causal mask]) V in matrix products, ``block`` rows of queries
    at a time (a causal block against the keys up to its last position only); the first
    blocks' probabilities are kept for the backward pass up to :data:`MATMUL_KEPT_BYTES`, the
    others' computed again there. GQA without copying keys or values: the G
    query heads of a key/value head are one product. Causal attention needs T == S.
    (B, H, T, Dh).

    In bfloat16 (inputs in bfloat16, or autocast to it) the products are batched bfloat16
    ones; the scores are bfloat16 as the products give them (the softmax accumulates in
    float32), as in Hugging Face's eager attention; the key and value gradients are summed
    over blocks in float32 (one product each for a call of one block). Float32 inputs outside
    autocast stay float32, one key/value head at a time through
    :func:`specformer.components.products.mm_nt`.

    ``key_padding`` (B|1, 1, 1, S), boolean (True = a real key) or additive, masks padded keys
    alone (not causal): added to every block's scores, the dtype's finite minimum where a key
    is padded."""
    if key_padding is not None and is_causal:
        raise ValueError("cpu_matmul_attention takes key_padding without is_causal only")
    if not torch.is_autocast_enabled("cpu") and q.dtype == k.dtype == v.dtype == torch.float32:
        padding = _additive_padding(key_padding, q) if key_padding is not None else None
        if _SYMBOLIC_LENGTHS and torch.compiler.is_compiling():
            return _products_attention(q, k, v, padding, is_causal, scale, block)[0]
        return _Float32Attention.apply(q, k, v, padding, is_causal, scale, block)
    with torch.autocast("cpu", enabled=False):
        q, k, v = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
        padding = _additive_padding(key_padding, q) if key_padding is not None else None
        if _SYMBOLIC_LENGTHS and torch.compiler.is_compiling():
            return _products_attention(q, k, v, padding, is_causal, scale, block)[0]
        return _MatmulAttention.apply(q, k, v, padding, is_causal, scale, block)


def _learned_bias_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, *, scale: float, dropout: float,
                            matmul: Callable[[Tensor, Tensor], Tensor] = torch.matmul) -> Tensor:
    """softmax(Q K^T * scale + bias) V for an additive bias that is being trained (T5's
    relative-position table). torch's fused kernels give no gradient for ``attn_mask``, so
    SDPA would run its math kernel here anyway; this is the same math without that
    kernel's fully-masked-row guards (a masked entry here is the dtype's finite minimum,
    never -inf, and every query keeps its own position). (B, H, T, Dh)."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, Dh)
    if scale != 1.0:
        q = q * scale
    weights = (matmul(q, k.transpose(-2, -1)) + bias).softmax(dim=-1)  # (B, H, T, S)
    if dropout > 0.0:
        weights = apply_dropout(weights, p=dropout)
    return matmul(weights.to(v.dtype), v)


def _compiled_sdpa_in_float32(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, is_causal: bool,
                              scale: float, dropout: float) -> Tensor:
    """:func:`sdpa_attention` of float32 ``q``, ``k``, ``v`` with autocast switched off inside
    its caller's bfloat16 autocast, while ``torch.compile`` traces: the compiled backward pass
    runs under the outer autocast, so every product here is one that autocast leaves in
    float32 there: SDPA's fused kernel (its backward is an operation of its own), or for a
    trained bias :func:`specformer.components.products.float32_matmul`."""
    if mask is not None and mask.requires_grad:
        return _learned_bias_attention(q, k, v, mask, scale=scale, dropout=dropout, matmul=float32_matmul)
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal,
                                          scale=scale, enable_gqa=groups > 1)


def _rounded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
    """Queries, keys and values rounded to bfloat16 and held in float32, and the mask in
    float32 (a boolean one as it is): attention in float32 where bfloat16 products are slow
    (:func:`specformer.components.products.bf16_in_float32`)."""
    if mask is not None and mask.is_floating_point():
        mask = mask.float()
    return rounded_to_bf16(q), rounded_to_bf16(k), rounded_to_bf16(v), mask


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None,
    is_causal: bool,
    scale: float,
    dropout: float,
    need_weights: bool = True,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T * scale + mask) V written out (Vaswani et al. 2017, eq. 1); returns
    (out, weights (B, H, T, S)). ``softcap``: the scaled scores become cap * tanh(score /
    cap) before the mask (Gemma 2)."""
    if q.is_floating_point() and bf16_in_float32(q, k, v):
        q, k, v, mask = _rounded(q, k, v, mask)
        with torch.autocast("cpu", enabled=False):  # while compiling, products autocast leaves in float32
            out, weights = _eager_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale, dropout=dropout,
                                            softcap=softcap, matmul=float32_matmul)
        return out.to(torch.bfloat16), weights.to(torch.bfloat16)
    return _eager_attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale, dropout=dropout, softcap=softcap)


def _eager_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool, scale: float,
                     dropout: float, softcap: float | None,
                     matmul: Callable[[Tensor, Tensor], Tensor] = torch.matmul) -> tuple[Tensor, Tensor]:
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, Dh)
    scores = matmul(q, k.transpose(-2, -1))  # (B, H, T, S)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # softmax in >= float32
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        t, s = scores.shape[-2:]
        causal = torch.ones(t, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask.to(scores.dtype)
    weights = scores.softmax(dim=-1).to(q.dtype)  # (B, H, T, S)
    weights = apply_dropout(weights, p=dropout) if dropout > 0.0 else weights
    return matmul(weights, v), weights  # (B, H, T, Dh)


BACKENDS = {"sdpa": sdpa_attention, "eager": eager_attention}


class Attention(nn.Module):
    """Scaled dot-product attention (Vaswani et al. 2017) with ``n_kv_heads`` key/value
    heads: MHA, GQA (Ainslie et al. 2023) or MQA (Shazeer 2019); optional qk-norm
    (Dehghani et al. 2023), sliding window (Beltagy et al. 2020), rotary queries/keys.

    ``cross=True`` builds cross-attention: queries from ``x``, keys and values from
    ``context`` (the encoder output), cached once per sequence when a cache is given.
    ``layer_idx`` names this layer's slot in a :class:`KVCache`.
    """

    def __init__(self, spec: AttentionSpec, *, d_model: int, cross: bool = False, layer_idx: int = 0) -> None:
        super().__init__()
        if spec.head_dim is None or spec.n_kv_heads is None:
            raise ValueError(
                "AttentionSpec needs head_dim and n_kv_heads; a ModelSpec fills them in when it "
                "validates, or give them explicitly when building attention alone"
            )
        self.n_heads = spec.n_heads
        self.n_kv_heads = spec.n_kv_heads
        self.head_dim = spec.head_dim
        self.scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(spec.head_dim)
        self.dropout = spec.dropout
        self.sliding_window = None if cross else spec.sliding_window
        self.cross = cross
        self.layer_idx = layer_idx
        self.softcap = getattr(spec, "softcap", None)
        # capped scores have no fused kernel: every call writes them out, as the eager backend does
        self.backend = spec.backend if self.softcap is None else "eager"
        self._eager = functools.partial(eager_attention, softcap=self.softcap)  # also for need_weights
        self._attend = BACKENDS[self.backend] if self.softcap is None else self._eager
        q_size = spec.n_heads * spec.head_dim
        kv_size = spec.n_kv_heads * spec.head_dim
        self._sizes = (q_size, kv_size, kv_size)
        if cross:
            self.q_proj = Linear(d_model, q_size, bias=spec.bias)
            self.kv_proj = Linear(d_model, 2 * kv_size, bias=spec.bias)
        else:
            self.qkv_proj = Linear(d_model, q_size + 2 * kv_size, bias=spec.bias)
        self.o_proj = Linear(q_size, d_model, bias=spec.output_bias)
        self.o_proj.residual_projection = True
        if spec.qk_norm != "none":
            # the schema is loaded by now: the spec is one of its classes
            from specformer.specs.schema import QK_NORM_EPS

            norm_entry = REGISTRY.get("norm", spec.qk_norm)
            offset = getattr(spec, "qk_norm_offset", 0.0)
            eps = getattr(spec, "qk_norm_eps", QK_NORM_EPS)
            norm_spec = norm_entry.spec(eps=eps, **({"offset": offset} if offset else {}))
            # over each head's features, or (scope all, OLMo 2) over the whole projection
            whole = getattr(spec, "qk_norm_scope", "head") == "all"
            self.q_norm = norm_entry.resolve()(norm_spec, dim=q_size if whole else spec.head_dim)
            self.k_norm = norm_entry.resolve()(norm_spec, dim=kv_size if whole else spec.head_dim)
            self.qk_norm_scope = "all" if whole else "head"
        else:
            self.q_norm = self.k_norm = None
            self.qk_norm_scope = None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.head_dim).transpose(1, 2)  # (B, n, T, Dh)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> (out (B, T, D), weights (B, H, T, S) or None)."""
        b, t, _ = x.shape
        whole = self.qk_norm_scope == "all"  # norms over the whole projection, before the head split
        if self.cross:
            q = self.q_proj(x)  # (B, T, H Dh)
            q = self._heads(self.q_norm(q) if whole else q, self.n_heads)  # (B, H, T, Dh)
            kv = cache.cross(self.layer_idx) if cache is not None else None
            if kv is None:
                if context is None:
                    raise ValueError("cross-attention needs the encoder output (context)")
                k, v = self.kv_proj(context).split_with_sizes(self._sizes[1:], -1)
                k = self._heads(self.k_norm(k) if whole else k, self.n_kv_heads)  # (B, Hkv, S, Dh)
                v = self._heads(v, self.n_kv_heads)
                if self.k_norm is not None and not whole:
                    k = self.k_norm(k)
                if cache is not None:
                    cache.set_cross(self.layer_idx, k, v)
            else:
                k, v = kv
            if self.q_norm is not None and not whole:
                q = self.q_norm(q)
        else:
            h, hkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
            if whole:
                q, k, v = self.qkv_proj(x).split_with_sizes(self._sizes, -1)  # (B, T, H Dh), (B, T, Hkv Dh) x 2
                q, k = self.q_norm(q).view(b, t, h, dh), self.k_norm(k).view(b, t, hkv, dh)
                if rope is not None:
                    q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
                q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(b, t, hkv, dh).transpose(1, 2)
            else:
                qkv = self.qkv_proj(x).view(b, t, h + 2 * hkv, dh)  # (B, T, H + 2 Hkv, Dh)
                if self.q_norm is not None:
                    q, k, v = qkv.split_with_sizes((h, hkv, hkv), 2)
                    q, k = self.q_norm(q), self.k_norm(k)
                    if rope is not None:
                        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
                    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                elif rope is not None:
                    # queries and keys rotate together: one rotation over their H + Hkv heads
                    qk, v = qkv.split_with_sizes((h + hkv, hkv), 2)
                    q, k = apply_rotary(qk, *rope).transpose(1, 2).split_with_sizes((h, hkv), 1)
                    v = v.transpose(1, 2)
                else:
                    q, k, v = qkv.transpose(1, 2).split_with_sizes((h, hkv, hkv), 1)
            # q (B, H, T, Dh); k, v (B, Hkv, T, Dh)
            if v.requires_grad and (rope is not None or self.q_norm is not None):
                # q and k are new tensors now; a view of v would keep the whole fused
                # projection (H + 2 Hkv) Dh alive for backward instead of its Hkv Dh rows
                v = v.contiguous()  # (B, Hkv, T, Dh)
            if cache is not None:
                k, v = cache.update(self.layer_idx, k, v, window=self.sliding_window)  # (B, Hkv, S, Dh)
        attend = self._eager if need_weights else self._attend
        out, weights = attend(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            scale=self.scale,
            dropout=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H Dh)
        return self.o_proj(out), weights

    def extra_repr(self) -> str:
        kind = "cross" if self.cross else "self"
        window = f", window={self.sliding_window}" if self.sliding_window else ""
        cap = f", softcap={self.softcap:g}" if self.softcap is not None else ""
        scope = ", qk_norm over all heads" if self.qk_norm_scope == "all" else ""
        return (
            f"{kind}, heads={self.n_heads}, kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
            f"backend={self.backend}{window}{cap}{scope}"
        )
