"""How the weights of a model's products lie in memory, for decoding on a CPU.

A decoding step multiplies one token's vector (1, D_in) by each weight (D_out, D_in). PyTorch
keeps a ``nn.Linear`` weight row by row, and on a CPU, where the step is bound by reading the
weights from memory, the BLAS reads a weight wider than it is long (D_out ≥ D_in: a query/key/
value projection, an FFN's up and gate projections, the vocabulary head) markedly faster when
it lies the other way, column by column (its transpose contiguous): 1.35–1.9× for the FFN and
vocabulary shapes on an AMD EPYC, one token, weights read from DRAM (``benchmarks/README.md``).
A weight longer than it is wide (the FFN's down projection) reads faster as it is, so it stays.

:func:`lay_out_for_decoding` re-lays those weights once, in place: each keeps its shape, its
values, its ``Parameter`` object and its place in ``state_dict()``; only its strides change, so
every forward gives the same numbers. :func:`restore_layout` puts them back; do that before
training again (a gradient takes its weight's layout). ``specformer generate`` does the first
after loading a checkpoint on a CPU, when it decodes :data:`FEW_ROWS` rows or fewer at a time
(sampling, or a beam search of 2 beams).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["FEW_ROWS", "decoding_weights", "lay_out_for_decoding", "restore_layout"]

#: Decoding this many rows at a time or fewer gains from the layout (one token's vector, or two,
#: a step). With 4 or 8 rows a step's products are small matrix products, which read either
#: layout about as fast (0.87–1.15× in the measurements above), so the layout is left as it is.
FEW_ROWS = 2


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


def lay_out_for_decoding(model: nn.Module) -> int:
    """Lay the weights of :func:`decoding_weights` column by column (their transposes
    contiguous), in place; returns how many bytes were laid out anew (0 when they already were).
    Outputs are unchanged; one-token decoding steps on a CPU run faster. Costs one copy of
    those weights, once."""
    moved = 0
    with torch.no_grad():
        for weight in decoding_weights(model):
            if weight.t().is_contiguous():
                continue
            weight.data = weight.data.t().contiguous().t()
            moved += weight.numel() * weight.element_size()
    return moved


def restore_layout(model: nn.Module) -> int:
    """Undo :func:`lay_out_for_decoding`: every parameter of ``model`` that is not contiguous
    becomes so again (row by row, as PyTorch makes them). Returns the bytes laid out anew."""
    moved = 0
    with torch.no_grad():
        for param in {id(p): p for p in model.parameters()}.values():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
                moved += param.numel() * param.element_size()
    return moved
