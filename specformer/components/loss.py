"""Cross-entropy of a linear output layer, computed in chunks without the full logits.

Shape legend: N rows (tokens), D features, V vocabulary.

``linear_cross_entropy(x, weight, bias, labels)`` equals
``F.cross_entropy((x @ weight.T + bias).float(), labels, ignore_index=-100)`` and its
gradients, but never holds the (N, V) logits: rows are taken ``chunk`` at a time, and
each chunk's gradients with respect to ``x``, ``weight`` and ``bias`` are computed right
after its loss, from its softmax made in place in the chunk's float32 logits (the
approach of Liger Kernel's fused linear cross-entropy, Hsu et al. 2024). The matrix products are the three
a plain forward and backward run (logits, and the two gradient products), so the work is
unchanged; what goes is the (N, V) logits, their float32 copy, the log-softmax kept for
backward and its gradient: four (N, V) tensors, the largest activations of a small
model with a big vocabulary.

Under autocast the products run in the autocast dtype and the softmax in float32, as
the plain path does (``logits.float()`` before the loss); float64 models stay float64.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.nn import functional as F

from specformer.components.products import (
    add_mm_nt_,
    bf16_in_float32,
    in_functorch_transform,
    mm_nt,
    rounded_to_bf16,
)

__all__ = ["linear_cross_entropy", "check_label_smoothing", "IGNORE_INDEX"]

IGNORE_INDEX = -100

# elements of one chunk's float32 logits (16 MiB)
_CHUNK_ELEMENTS = 1 << 22


def check_label_smoothing(value: float) -> float:
    """``value`` as a float when it is a label smoothing in [0, 1], else a ValueError (torch
    checks only the upper bound, and only on its no-gradient path)."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1] (0: none, 0.1: the usual), got {value:g}")
    return value


def _chunk_rows(n: int, vocab: int, d: int) -> int:
    """Rows per chunk: logits of about 16 MiB, and never fewer rows than d, as each chunk
    after the first adds its weight gradient (V, D) into the running sum: with fewer
    rows than D that pass would cost more than the (rows, V) logits it saves."""
    return max(1, min(n, max(_CHUNK_ELEMENTS // max(vocab, 1), d)))


def _chunks(step: int, *tensors: Tensor) -> Iterator[tuple[slice, tuple[Tensor, ...]]]:
    """(rows, each tensor's rows) for consecutive chunks of ``step`` rows, the last shorter.

    As splits rather than a loop over ``range(0, n, step)``: while ``torch.compile`` traces a
    dynamic row count, ``range`` makes it a constant (a new graph for every batch whose count of
    tokens differs), a split guards only on how many chunks there are."""
    start = 0
    for parts in zip(*(t.split(step) for t in tensors), strict=True):
        rows = parts[0].shape[0]
        yield slice(start, start + rows), parts
        start = start + rows


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 models."""
    return torch.promote_types(dtype, torch.float32)


def _compute_dtype(x: Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _factors(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[torch.dtype, Tensor, Tensor, Tensor | None]:
    """The dtype the loss's products run in and its factors in it: the compute dtype's, or,
    for bfloat16 on a CPU without bfloat16 products, float32 holding the bfloat16-rounded
    factors (:func:`specformer.components.products.bf16_in_float32`). (Casts, which autocast
    leaves as they are.)"""
    dtype = _compute_dtype(x)
    if dtype == torch.bfloat16 and bf16_in_float32(x, weight):
        return (torch.float32, rounded_to_bf16(x), rounded_to_bf16(weight),
                rounded_to_bf16(bias) if bias is not None else None)
    return dtype, x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None


# a target's probability below this gives its row's loss from the logits themselves: -log p
# loses digits as p nears float32's smallest normal (1.2e-38), and is inf once p underflows
_SMALLEST_TARGET_PROBABILITY = 1e-30


def _softmax_in_place(z: Tensor, target: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Turns the (n, V) logits ``z`` into ``softmax(z) - onehot(target)`` in place, and gives
    it with each row's loss ``-log softmax(z)[target]`` (n, 1); a labelled row whose target's
    probability is below ``_SMALLEST_TARGET_PROBABILITY`` has the loss inf, for the caller
    to recompute; an unlabelled row has 0."""
    torch.softmax(z, dim=-1, out=z)
    p_target = z.gather(1, target)
    rows_loss = p_target.log().neg_()
    rows_loss.masked_fill_(p_target < _SMALLEST_TARGET_PROBABILITY, float("inf"))
    rows_loss.masked_fill_(~valid.unsqueeze(1), 0.0)
    z.scatter_(1, target, p_target - 1.0)
    return z, rows_loss


def _exact_losses(
    rows_loss: Tensor, xs: Tensor, wc: Tensor, bc: Tensor | None, target: Tensor, acc: torch.dtype,
    softcap: float | None = None,
) -> None:
    """Fills the inf entries of ``rows_loss`` with ``logsumexp(logits) - logits[target]``,
    their rows' logits computed again (the chunk's were overwritten by the softmax)."""
    rows = torch.isinf(rows_loss).squeeze(1).nonzero().squeeze(1)
    logits = mm_nt(xs[rows], wc, bc).to(acc)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    rows_loss[rows] = torch.logsumexp(logits, dim=-1, keepdim=True) - logits.gather(1, target[rows])


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        labels: Tensor,
        smoothing: float,
        softcap: float | None,
    ) -> Tensor:
        n = x.shape[0]
        need_x, need_w = x.requires_grad, weight.requires_grad
        need_b = bias is not None and bias.requires_grad
        dtype, xc, wc, bc = _factors(x.detach(), weight.detach(), bias.detach() if bias is not None else None)
        with torch.autocast(x.device.type, enabled=False):
            acc = _loss_dtype(dtype)
            count = (labels != IGNORE_INDEX).sum().to(acc)
            scale = 1.0 / count.clamp(min=1.0)
            total = torch.zeros((), dtype=acc, device=x.device)
            grad_x = torch.empty_like(x) if need_x else None
            grad_w: Tensor | None = None
            grad_b: Tensor | None = None
            step = _chunk_rows(n, weight.shape[0], weight.shape[1])
            # in a low-precision dtype with few chunks, the chunks' logit gradients are kept
            # ((N, V) in that dtype, at most four chunks' worth) for one weight-gradient
            # product accumulated in float32 inside the kernel; with more, each chunk's
            # product is added into a float32 sum, so memory stays O(chunk x V)
            # (not while torch.compile traces: there each product written into a slice of the
            # buffer becomes a copy of the whole buffer, and the chunks' softmax passes fuse
            # with it; the products summed chunk by chunk trace as they are)
            low = (
                torch.empty(n, weight.shape[0], dtype=dtype, device=x.device)
                if not torch.compiler.is_compiling() and need_w and dtype != acc and n <= 4 * step
                else None
            )
            # on the CPU, torch's fused softmax is one pass where max, subtract, exp and sum
            # are four (its exp is also the faster of the two); the loss then comes from the
            # target's probability. Not for label smoothing (it needs the log-sum-exp), nor on
            # accelerators (the underflow check reads a value on the host), nor while
            # torch.compile traces (inductor fuses the passes itself)
            by_softmax = not smoothing and x.device.type == "cpu" and not torch.compiler.is_compiling()
            for rows, (xs, ys) in _chunks(step, xc, labels):
                valid = ys != IGNORE_INDEX
                target = ys.clamp(min=0).unsqueeze(1)  # ignored rows: any index, zeroed below
                weight_rows = (valid.to(acc) * scale).unsqueeze(1)  # (n, 1): 1/count, or 0
                if low is not None:  # the product writes straight into the kept buffer
                    logits = low[rows]
                    if bc is None:
                        torch.mm(xs, wc.t(), out=logits)
                    else:
                        torch.addmm(bc, xs, wc.t(), out=logits)
                else:
                    logits = mm_nt(xs, wc, bc)
                # the float32 logits become the softmax in place (no second (n, V) buffer):
                # loss = log(sum exp z) - z[target] = -log softmax(z)[target],
                # d loss / d logits = (softmax - (1 - s) onehot - s / V) / count, labelled rows
                z = logits.to(acc)
                capped = None  # d cap(l) / d l = 1 - tanh^2(l / cap), of a soft cap (Gemma 2)
                if softcap is not None:
                    z = z.div_(softcap).tanh_()  # in place, as the softmax below is
                    capped = 1.0 - z * z
                    z.mul_(softcap)
                if by_softmax:
                    grad, rows_loss = _softmax_in_place(z, target, valid)
                    if bool(torch.isinf(rows_loss).any()):  # a target's probability underflowed
                        _exact_losses(rows_loss, xs, wc, bc, target, acc, softcap)
                    grad.mul_(weight_rows)
                else:
                    z.sub_(z.amax(dim=-1, keepdim=True))
                    z_target = z.gather(1, target)
                    z_mean = z.mean(dim=-1, keepdim=True) if smoothing else None
                    z.exp_()
                    sum_exp = z.sum(dim=-1, keepdim=True)
                    log_sum = sum_exp.log()
                    rows_loss = log_sum - z_target  # (n, 1)
                    if smoothing:
                        rows_loss = (1.0 - smoothing) * rows_loss - smoothing * (z_mean - log_sum)
                    grad = z.mul_(weight_rows / sum_exp)
                    grad.scatter_add_(1, target, weight_rows * (smoothing - 1.0))
                    if smoothing:
                        grad.sub_(weight_rows * (smoothing / weight.shape[0]))
                if capped is not None:
                    grad.mul_(capped)
                    del capped
                total += rows_loss.masked_fill(~valid.unsqueeze(1), 0.0).sum()
                if low is not None:
                    g = logits.copy_(grad)  # the weight gradient is one product after the loop
                else:
                    g = grad.to(dtype)
                if need_x:
                    grad_x[rows] = mm_nt(g, wc.t())
                if need_w and low is None:
                    if grad_w is None:
                        grad_w = mm_nt(g.t(), xs.t()).to(acc)
                    elif g.dtype == acc:
                        add_mm_nt_(grad_w, g.t(), xs.t())  # accumulated inside the product
                    else:
                        grad_w += mm_nt(g.t(), xs.t())
                if need_b:
                    grad_b = grad.sum(0) if grad_b is None else grad_b.add_(grad.sum(0))
                del logits, z, grad, g
            if low is not None:
                grad_w = low.t() @ xc
                del low
        ctx.save_for_backward(
            grad_x,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
        )
        return total / count  # the mean; NaN when no row has a label, as torch's

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor):  # type: ignore[override]
        grads = list(ctx.saved_tensors)
        # the loss is usually the final output (gradient 1): skip three full passes then;
        # only on the CPU, where reading the value costs no device sync, and not while
        # torch.compile traces (a graph break)
        known_one = (
            not torch.compiler.is_compiling() and grad_out.device.type == "cpu" and grad_out.item() == 1.0
        )
        if not known_one:
            grads = [g * grad_out if g is not None else None for g in grads]
        return grads[0], grads[1], grads[2], None, None, None


def linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    *,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
) -> Tensor:
    """Mean cross-entropy of ``x @ weight.T + bias`` against ``labels`` over the rows whose
    label is not -100; x (N, D), weight (V, D), bias (V,) or None, labels (N,).

    Equal to ``F.cross_entropy`` of the logits in float32 (NaN when no row has a label,
    as there), with the same gradients, in O(chunk x V) memory instead of O(N x V).
    ``softcap``: of the logits cap * tanh(logit / cap) (Gemma 2); each chunk's logit gradient
    is multiplied by the cap's derivative, 1 - tanh^2, in the same pass.
    """
    if x.dim() != 2 or labels.shape != (x.shape[0],):
        raise ValueError(
            f"linear_cross_entropy: expected x (N, D) and labels (N,), got x {tuple(x.shape)} "
            f"and labels {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be integer class indices (or {IGNORE_INDEX}: no label), got {labels.dtype}")
    labels = labels.long()
    label_smoothing = check_label_smoothing(label_smoothing)
    vocab = weight.shape[0]
    # reading the check's result on the host is a graph break under torch.compile (and a
    # device sync): skipped while tracing, as the models' id and class-label checks are
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab))
    if not torch.compiler.is_compiling() and bool(bad.any()):
        raise ValueError(
            f"labels must be class indices in [0, {vocab}) or {IGNORE_INDEX} (no label); "
            f"found {int(labels[bad][0])}"
        )
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ) and not in_functorch_transform():  # torch.func transforms differentiate the chunks below
        return _LinearCrossEntropy.apply(x, weight, bias, labels, label_smoothing, softcap)
    dtype, xc, wc, bc = _factors(x, weight, bias)
    acc = _loss_dtype(dtype)
    n = x.shape[0]
    count = (labels != IGNORE_INDEX).sum()
    total = torch.zeros((), dtype=acc, device=x.device)
    with torch.autocast(x.device.type, enabled=False):
        step = _chunk_rows(n, vocab, weight.shape[1])
        for _, (xs, ys) in _chunks(step, xc, labels):
            logits = mm_nt(xs, wc, bc).to(acc)
            if softcap is not None:
                logits = torch.tanh(logits / softcap) * softcap
            total = total + F.cross_entropy(
                logits, ys, ignore_index=IGNORE_INDEX, reduction="sum", label_smoothing=label_smoothing
            )
    return total / count.to(acc)
