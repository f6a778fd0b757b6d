"""How the weights of a model's products lie in memory, for decoding on a CPU.

A decoding step multiplies one token's vector (1, D_in) by each weight (D_out, D_in). PyTorch
keeps a ``nn.Linear`` weight row by row, and on a CPU, where the step is bound by reading the
weights from memory, the BLAS reads a weight wider than it is long (D_out ≥ D_in: a query/key/
value projection, an FFN's up and gate projections, the vocabulary head) markedly faster when
it lies the other way, column by column (its transpose contiguous): 1.35–1.9× for the FFN and
vocabulary shapes on an AMD EPYC, one token, weights read from DRAM (``benchmarks/RESULTS.md``).
A weight longer than it is wide (the FFN's down projection) reads faster as it is, so it stays.

:func:`lay_out_for_decoding` re-lays those weights once, in place: each keeps its shape, its
values, its ``Parameter`` object and its place in ``state_dict()``; only its strides change, so
every forward gives the same numbers. :func:`restore_layout` puts them back; do that before
training again (a gradient takes its weight's layout). ``specformer generate`` does the first
after loading a checkpoint on a CPU, when it decodes :data:`FEW_ROWS` rows or fewer at a time
(sampling, or a beam search of 2 beams).

A one-row product also runs on one thread: the BLAS does not share a matrix-vector product
between threads at these sizes, though reading from memory is what bounds it and two cores
read faster than one. So a model laid out for decoding also splits each one-row product
(:func:`decode_linear`) into as many blocks of output features as torch has threads, run as one
batched product (``torch.bmm``) over views of the weight, which does use them all (2 threads,
from DRAM: 2048 × 768 row by row 406 → 230 µs, 768 × 1280 305 → 165 µs; 768 × 8192 laid out
1.17 → 0.78 ms). In a model, the layout alone made a batch-1 step 1.25–1.42× faster, with the
split 1.48–1.63×.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["FEW_ROWS", "DecodingLinear", "decode_linear", "decoding_weights", "lay_out_for_decoding", "restore_layout"]

#: Decoding this many rows at a time or fewer gains from the layout (one token's vector, or two,
#: a step). With 4 or 8 rows a step's products are small matrix products, which read either
#: layout about as fast (0.87–1.15× in the measurements above), so the layout is left as it is.
FEW_ROWS = 2

#: The fewest output features a block of a split one-row product has: a smaller product is
#: bound by its own call, not by reading its weight, and is left whole.
MIN_BLOCK = 64


def decoding_weights(model: nn.Module) -> list[Tensor]:
    """The weights a decoding step multiplies by that read faster column by column: each
    ``nn.Linear`` weight and each tied vocabulary projection (a language-model head that
    reuses the token embeddings) that is at least as wide as it is long, float32, on the CPU,
    and the whole of its own storage (not a view into a larger one). Each once."""
    found: dict[int, Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            found.setdefault(id(module.weight), module.weight)
        tied = getattr(module, "tied_weight", None)
        if isinstance(tied, Tensor):
            found.setdefault(id(tied), tied)
    return [w for w in found.values() if _eligible(w)]


def _eligible(weight: Tensor) -> bool:
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    if weight.shape[0] < weight.shape[1]:  # longer than wide: faster row by row
        return False
    return weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()


def decode_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; for a single row ``x`` (its features only: shape (..., D_in)
    with one row in all) of float32 on the CPU, outside autograd, with torch on P ≥ 2 threads,
    computed as P blocks of the output features in one ``torch.bmm`` over views of ``weight``
    (row by row or column by column), which spreads the reading of the weight over the threads.
    The same sums, in another order of blocks: equal to ``F.linear`` to float32 rounding."""
    p = torch.get_num_threads()
    out_features, in_features = weight.shape
    if (p < 2 or x.numel() != in_features or out_features % p or out_features // p < MIN_BLOCK
            or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
            or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)
    if weight.is_contiguous():  # (p, D_in, block) views of the rows of each block
        blocks = weight.view(p, out_features // p, in_features).transpose(1, 2)
    elif weight.t().is_contiguous():  # laid out for decoding: the columns of each block
        blocks = weight.t().view(in_features, p, out_features // p).permute(1, 0, 2)
    else:
        return F.linear(x, weight, bias)
    rows = x.reshape(1, 1, in_features).expand(p, 1, in_features)
    if bias is None:
        y = torch.bmm(rows, blocks)
    else:
        y = torch.baddbmm(bias.reshape(p, 1, out_features // p), rows, blocks)
    return y.view(*x.shape[:-1], out_features)


class DecodingLinear(nn.Linear):
    """An ``nn.Linear`` whose product is :func:`decode_linear`: what :func:`lay_out_for_decoding`
    makes each plain ``nn.Linear`` of a model (by its class, so the model still pickles and
    copies), and :func:`restore_layout` makes a plain one again."""

    def forward(self, x: Tensor) -> Tensor:
        return decode_linear(x, self.weight, self.bias)


def lay_out_for_decoding(model: nn.Module) -> int:
    """Make ``model`` decode faster on a CPU, in place: lay the weights of
    :func:`decoding_weights` column by column (their transposes contiguous), and have every
    ``nn.Linear`` and language-model head split its one-row products over the threads
    (:func:`decode_linear`). Returns how many bytes were laid out anew (0 when they already
    were). Outputs are unchanged to float32 rounding; costs one copy of the wide weights, once."""
    moved = 0
    with torch.no_grad():
        for weight in decoding_weights(model):
            if weight.t().is_contiguous():
                continue
            weight.data = weight.data.t().contiguous().t()
            moved += weight.numel() * weight.element_size()
    from specformer.components.heads import LMHead

    for module in model.modules():
        if type(module) is nn.Linear:  # not a subclass, which may compute its own product
            module.__class__ = DecodingLinear
        elif isinstance(module, LMHead):
            module.decoding = True
    return moved


def restore_layout(model: nn.Module) -> int:
    """Undo :func:`lay_out_for_decoding`: every parameter of ``model`` that is not contiguous
    becomes so again (row by row, as PyTorch makes them), and every product is computed as
    before. Returns the bytes laid out anew."""
    moved = 0
    with torch.no_grad():
        for param in {id(p): p for p in model.parameters()}.values():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
                moved += param.numel() * param.element_size()
    from specformer.components.heads import LMHead

    for module in model.modules():
        if type(module) is DecodingLinear:
            module.__class__ = nn.Linear
        elif isinstance(module, LMHead):
            module.decoding = False
    return moved
