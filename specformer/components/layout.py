"""How a model's products read their weights, for decoding on a CPU.

A decoding step multiplies a few rows (one token's vector per sequence) by each weight
(D_out, D_in), and on a CPU it is bound by reading the weights from memory. Two things make
the BLAS (MKL) read them faster, measured on an AMD EPYC with the weights in DRAM
(``benchmarks/RESULTS.md``):

- **Layout**, for one or two rows. A weight at least as wide as it is long (D_out ≥ D_in: a
  query/key/value projection, an FFN's up and gate projections, the vocabulary head) reads
  1.35–1.9× faster lying column by column (its transpose contiguous) than row by row, as
  PyTorch keeps it; one longer than wide (the FFN's down projection) reads faster as it is.
  At 4 or 8 rows either layout reads about as fast.
- **Threads**, for up to :data:`SPLIT_ROWS` rows. Such a product runs as on one thread (1 and
  2 threads take the same time), though two cores read memory faster than one. Cut into one
  block of output features per thread, as one ``torch.bmm`` over views of the weight, it uses
  them all (2 threads: 2048 × 768 at one row 406 → 230 µs; 1.5–1.9× at 4 rows, 1.06–1.37× at 8).

:func:`lay_out_for_decoding` does both, once, in place: each weight keeps its shape, values,
``Parameter`` object and ``state_dict()`` entry (only the strides of the wide ones change), each
plain ``nn.Linear`` becomes a :class:`DecodingLinear` and the language-model head computes with
:func:`decode_linear`. Every output equals the plain model's to float32 rounding. In a model,
a batch-1 step became 1.25–1.42× faster with the layout alone, 1.48–1.63× with both.
:func:`restore_layout` undoes it; do that before training again (a gradient takes its weight's
layout). ``specformer generate`` lays out a checkpoint after loading it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["FEW_ROWS", "SPLIT_ROWS", "DecodingLinear", "decode_linear", "decoding_weights", "lay_out_for_decoding", "restore_layout"]

#: Decoding this many rows at a time or fewer gains from the layout (one token's vector, or two,
#: a step). With 4 or 8 rows a step's products read either layout about as fast (0.87–1.15× in
#: a model), so the weights stay as they are.
FEW_ROWS = 2

#: The most rows a product is split over the threads for (:func:`decode_linear`): from DRAM on
#: 2 threads, 1.5–1.9× at 4 rows and 1.06–1.37× at 8, where the BLAS threads a matrix product
#: but reads the weight no faster. A prompt's hundreds of rows are left to the BLAS.
SPLIT_ROWS = 8

#: The fewest output features a block of a split product has: a smaller product is bound by
#: its own call, not by reading its weight, and is left whole.
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
    """``F.linear(x, weight, bias)``; for ``x`` of 1 to :data:`SPLIT_ROWS` rows (shape (..., D_in))
    of float32 on the CPU, outside autograd and autocast, with torch on P ≥ 2 threads, computed
    as P blocks of the output features in one ``torch.bmm`` over views of ``weight`` (row by row
    or column by column), which spreads the reading of the weight over the threads. The same
    sums, in other blocks: equal to ``F.linear`` to float32 rounding."""
    p = torch.get_num_threads()
    out_features, in_features = weight.shape
    m = x.numel() // in_features if in_features else 0
    if (p < 2 or not 1 <= m <= SPLIT_ROWS or out_features % p or out_features // p < MIN_BLOCK
            or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
            or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)
    block = out_features // p
    if weight.is_contiguous():  # (p, D_in, block) views of the rows of each block
        blocks = weight.view(p, block, in_features).transpose(1, 2)
    elif weight.t().is_contiguous():  # laid out for decoding: the columns of each block
        blocks = weight.t().view(in_features, p, block).permute(1, 0, 2)
    else:
        return F.linear(x, weight, bias)
    rows = x.reshape(1, m, in_features).expand(p, m, in_features)
    if bias is None:
        y = torch.bmm(rows, blocks)  # (p, m, block)
    else:
        y = torch.baddbmm(bias.reshape(p, 1, block), rows, blocks)
    if m > 1:  # each row's blocks side by side
        y = y.transpose(0, 1).reshape(m, out_features)
    return y.view(*x.shape[:-1], out_features)


class DecodingLinear(nn.Linear):
    """An ``nn.Linear`` whose product is :func:`decode_linear`: what :func:`lay_out_for_decoding`
    makes each plain ``nn.Linear`` of a model (by its class, so the model still pickles and
    copies), and :func:`restore_layout` makes a plain one again."""

    def forward(self, x: Tensor) -> Tensor:
        return decode_linear(x, self.weight, self.bias)


def lay_out_for_decoding(model: nn.Module, rows: int = 1) -> int:
    """Make ``model`` decode ``rows`` rows at a time faster on a CPU, in place: have every plain
    ``nn.Linear`` and language-model head split its products of a few rows over the threads
    (:func:`decode_linear`), and, for at most :data:`FEW_ROWS` rows, lay the weights of
    :func:`decoding_weights` column by column (their transposes contiguous); for more rows,
    those weights lie row by row (as PyTorch makes them), so a model laid out for one row and
    then for eight reads its weights as a model laid out for eight. Returns how many bytes were
    laid out anew (0 when none were). Outputs are unchanged to float32 rounding; the layout
    costs one copy of the wide weights, once."""
    moved = 0
    few = rows <= FEW_ROWS
    with torch.no_grad():
        for weight in decoding_weights(model):
            if (weight.t() if few else weight).is_contiguous():
                continue
            weight.data = weight.data.t().contiguous().t() if few else weight.data.contiguous()
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
