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

:func:`lay_out_for_decoding` does either or both, once, in place, where they are faster on the
machine at hand: neither helps everywhere. On an Intel Xeon whose 260 MB cache held a model's
weights, the split made a batch-1 step 0.72–0.85× as fast and the layout 0.96–1.24× (noisy); so
by default it times each product whole and split, row by row and column by column, in sweeps
through all of the decoder's products in order (the weights read as a step reads them), and
keeps what was faster, for the products of each shape together. Each weight keeps its shape,
values, ``Parameter`` object and ``state_dict()`` entry (only the strides of the wide ones may
change), each plain ``nn.Linear`` of the decoder becomes a :class:`DecodingLinear` and the
language-model head computes with :func:`decode_linear`. Every output equals the plain model's
to float32 rounding. :func:`restore_layout` undoes it; do that before training again (a gradient
takes its weight's layout). ``specformer generate`` lays out a checkpoint after loading it.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.components.products import Linear, linear

__all__ = [
    "FEW_ROWS", "MEASURE_BYTES", "MEASURE_ROUNDS", "SPLIT_ROWS", "DecodingLinear", "choose_layout", "decode_linear", "decoding_weights",
    "lay_out_for_decoding", "restore_layout",
]

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
    """The weights a decoding step multiplies by that may read faster column by column: the
    weight of each plain ``nn.Linear`` of the decoder (of the whole model when it has no
    ``decoder``) and of the language-model head, its own or the token embeddings it is tied
    to, that is at least as wide as it is long, float32, on the CPU, and the whole of its own
    storage (not a view into a larger one). Each once."""
    return _wide(_products(model))


def _wide(products: list[tuple[nn.Module, Tensor, Tensor | None]]) -> list[Tensor]:
    """The weights of ``products`` that :func:`decoding_weights` names, each once."""
    found: dict[int, Tensor] = {}
    for _, weight, _ in products:
        found.setdefault(id(weight), weight)
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
        return linear(x, weight, bias)
    block = out_features // p
    if weight.is_contiguous():  # (p, D_in, block) views of the rows of each block
        blocks = weight.view(p, block, in_features).transpose(1, 2)
    elif weight.t().is_contiguous():  # laid out for decoding: the columns of each block
        blocks = weight.t().view(in_features, p, block).permute(1, 0, 2)
    else:
        return linear(x, weight, bias)
    rows = x.reshape(1, m, in_features).expand(p, m, in_features)
    if bias is None:
        y = torch.bmm(rows, blocks)  # (p, m, block)
    else:
        y = torch.baddbmm(bias.reshape(p, 1, block), rows, blocks)
    if m > 1:  # each row's blocks side by side
        y = y.transpose(0, 1).reshape(m, out_features)
    return y.view(*x.shape[:-1], out_features)


class DecodingLinear(Linear):
    """An ``nn.Linear`` whose product is :func:`decode_linear` (when ``split``, as
    :func:`lay_out_for_decoding` chose): what that function makes each plain ``nn.Linear`` of
    a model (by its class, so the model still pickles and copies), and :func:`restore_layout`
    makes a plain one again."""

    def forward(self, x: Tensor) -> Tensor:
        if getattr(self, "split", True):
            return decode_linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias)


#: Sweeps over a model's products per choice when :func:`lay_out_for_decoding` measures (after
#: one to warm up); each product's time is the median over them.
MEASURE_ROUNDS = 3

#: The most bytes of weights the measuring sweeps read (:func:`_sample`): a larger model is
#: timed on its first products up to this and one of each other weight shape, and each choice
#: made for a shape holds for all of its products. Timing every product of a 2 GiB decoder took
#: some 16 of its steps; of a 7B one in float32 it would take minutes.
MEASURE_BYTES = 1 << 30

#: A choice other than the plain one (the weight row by row, the product whole) is taken when
#: it measured at most this fraction of the plain one's time: closer is noise.
MEASURE_MARGIN = 0.97


def lay_out_for_decoding(model: nn.Module, rows: int = 1, *, measure: bool = True) -> int:
    """Make ``model`` decode ``rows`` rows at a time faster on a CPU, in place, with what this
    machine reads faster: each product of the part that decodes (every plain ``nn.Linear`` of
    the decoder, and the language-model head) whole or split over the threads
    (:func:`decode_linear`), and, for at most :data:`FEW_ROWS` rows, each weight of
    :func:`decoding_weights` row by row or column by column.

    ``measure=True`` times both for every product, at ``rows`` rows, over sweeps through all of
    the decoder's products in order (through its first :data:`MEASURE_BYTES` of them, and one of
    each later shape, for a larger model) (as a decoding step reads them: from DRAM or from a cache,
    whichever this model's size and this machine give), and keeps what was faster for the
    products of each weight shape together (:func:`choose_layout`). Whether either helps depends
    on the machine: on an AMD EPYC both gave 1.5–2.1× a batch-1 step; on an Intel Xeon whose
    large cache held the model's weights, splitting made a step up to 0.72× as fast and the
    layout moved it by noise (``benchmarks/RESULTS.md``). Measuring takes 16 sweeps and two
    copies of the wide weights, some 20 steps' time once (0.25–0.4 s for a 50M-parameter
    decoder). ``measure=False`` takes every split and, for at most :data:`FEW_ROWS` rows, every
    layout, unmeasured (what the EPYC runs faster).

    Weights are laid out for more than :data:`FEW_ROWS` rows, or where not faster, row by row
    (as PyTorch makes them), so a model laid out for one row and then for eight reads its
    weights as one laid out for eight. Returns the bytes of the weights whose layout changed
    (0 when none did). Outputs are unchanged to float32 rounding."""
    from specformer.components.heads import LMHead

    products = _products(model)
    for owner, _, _ in products:
        if isinstance(owner, LMHead):
            owner.decoding = True
        else:
            if type(owner) is not DecodingLinear:
                owner.plain_class = type(owner)  # nn.Linear, or specformer's Linear
            owner.__class__ = DecodingLinear
            owner.split = True
    wide = _wide(products)
    before = {id(w): _column_major(w) for w in wide}
    few = rows <= FEW_ROWS
    if not measure:
        for weight in wide:
            _lay_out(weight, column=few)
    else:
        _lay_out_measured(products, wide, rows, few)
    return sum(w.numel() * w.element_size() for w in wide if _column_major(w) != before[id(w)])


def _products(model: nn.Module) -> list[tuple[nn.Module, Tensor, Tensor | None]]:
    """(owner, weight, bias) of each product a decoding step computes, in the model's order:
    every plain ``nn.Linear`` (or one already a :class:`DecodingLinear`) of the decoder (of the
    whole model when it has none), the language-model head's own projection left to the head."""
    from specformer.components.heads import LMHead

    decoder = getattr(model, "decoder", None)
    part = decoder if isinstance(decoder, nn.Module) else model
    heads = [m for m in model.modules() if isinstance(m, LMHead)]
    in_head = {id(h.proj) for h in heads if h.proj is not None}
    out: list[tuple[nn.Module, Tensor, Tensor | None]] = [
        (m, m.weight, m.bias) for m in part.modules()
        if type(m) in (nn.Linear, Linear, DecodingLinear) and id(m) not in in_head]
    return out + [(h, *h._projection()) for h in heads]


def _column_major(weight: Tensor) -> bool:
    return not weight.is_contiguous() and weight.t().is_contiguous()


def _lay_out(weight: Tensor, *, column: bool) -> None:
    with torch.no_grad():
        if column and not weight.t().is_contiguous():
            weight.data = weight.data.t().contiguous().t()
        elif not column and not weight.is_contiguous():
            weight.data = weight.data.contiguous()


def _sweep(products: list[tuple[nn.Module, Tensor, Tensor | None]], inputs: dict[int, Tensor],
           split: bool) -> list[float]:
    """Each product's time, in seconds, computed once in the model's order: whole or split."""
    clock = time.perf_counter
    times = []
    for _, weight, bias in products:
        x = inputs[weight.shape[1]]
        start = clock()
        if split:
            decode_linear(x, weight, bias)
        else:
            F.linear(x, weight, bias)
        times.append(clock() - start)
    return times


def _measure(products: list[tuple[nn.Module, Tensor, Tensor | None]], rows: int) -> tuple[list[float], list[float]]:
    """Each product's median time whole and split, over :data:`MEASURE_ROUNDS` alternating sweeps."""
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device) for _, w, _ in products}
    whole: list[list[float]] = []
    split: list[list[float]] = []
    with torch.no_grad():
        _sweep(products, inputs, False)
        _sweep(products, inputs, True)
        for _ in range(MEASURE_ROUNDS):
            whole.append(_sweep(products, inputs, False))
            split.append(_sweep(products, inputs, True))
    return ([statistics.median(t) for t in zip(*whole, strict=True)],
            [statistics.median(t) for t in zip(*split, strict=True)])


def _sample(products: list[tuple[nn.Module, Tensor, Tensor | None]],
            ) -> list[tuple[nn.Module, Tensor, Tensor | None]]:
    """The products that are timed: all of them when their weights total at most
    :data:`MEASURE_BYTES`; else the first ones, in the model's order, up to that many bytes
    (more than any CPU's cache, so they are read from memory, as the whole model's are), and the
    first product of each weight shape that is not among them (the head's, at the end)."""
    total, taken, shapes = 0, [], set()
    for product in products:
        size = product[1].numel() * product[1].element_size()
        if total + size <= MEASURE_BYTES or not taken:
            taken.append(product)
            shapes.add(tuple(product[1].shape))
            total += size
        elif tuple(product[1].shape) not in shapes:
            taken.append(product)
            shapes.add(tuple(product[1].shape))
    return taken


def _lay_out_measured(products: list[tuple[nn.Module, Tensor, Tensor | None]], wide: list[Tensor],
                      rows: int, few: bool) -> None:
    from specformer.components.heads import LMHead

    candidates = [p for p in products if p[1].dtype == torch.float32 and p[1].device.type == "cpu"]
    if not candidates:
        return
    measured = _sample(candidates)
    ids = {id(w) for _, w, _ in measured}
    timed_wide = [w for w in wide if id(w) in ids]
    for weight in wide:  # first as PyTorch lays them out
        _lay_out(weight, column=False)
    rowwise = _measure(measured, rows)
    colwise = None
    if few and timed_wide:
        for weight in timed_wide:
            _lay_out(weight, column=True)
        colwise = _measure(measured, rows)
    layout, split = choose_layout([w for _, w, _ in measured], rowwise, colwise, {id(w) for w in wide})
    # each choice is made for a weight shape: the products not timed take their shape's
    column = {tuple(w.shape): layout.get(id(w), False) for _, w, _ in measured}
    splits = {tuple(w.shape): s for (_, w, _), s in zip(measured, split, strict=True)}
    for weight in wide:
        _lay_out(weight, column=column.get(tuple(weight.shape), False))
    for owner, weight, _ in candidates:
        s = splits[tuple(weight.shape)]
        if isinstance(owner, LMHead):
            owner.decoding = s
        else:
            owner.split = s


def choose_layout(weights: list[Tensor], rowwise: tuple[list[float], list[float]],
                  colwise: tuple[list[float], list[float]] | None, wide: set[int],
                  ) -> tuple[dict[int, bool], list[bool]]:
    """From each product's measured times (whole, split), row by row and (``colwise``, for the
    weights in ``wide``) column by column: whether each weight lies column by column (by its
    ``id``) and whether each product is split. Products whose weights have the same shape (the
    same projection in every layer) are chosen for together, on the sum of their times, which
    evens out the noise of each one's. A choice other than the plain one (row by row, whole) is
    taken when it is at most :data:`MEASURE_MARGIN` of the plain time."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, w in enumerate(weights):
        groups.setdefault(tuple(w.shape), []).append(i)
    layout: dict[int, bool] = {}
    split = [False] * len(weights)
    for uses in groups.values():
        options = [(sum(rowwise[0][i] for i in uses), False, False), (sum(rowwise[1][i] for i in uses), False, True)]
        if colwise is not None and all(id(weights[i]) in wide for i in uses):
            options += [(sum(colwise[0][i] for i in uses), True, False), (sum(colwise[1][i] for i in uses), True, True)]
        plain = options[0][0]
        time_, column, splits = min(options, key=lambda o: o[0])
        if time_ > MEASURE_MARGIN * plain:
            column, splits = False, False
        for i in uses:
            layout[id(weights[i])] = column
            split[i] = splits
    return layout, split


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
            module.__class__ = module.__dict__.pop("plain_class", Linear)
            module.__dict__.pop("split", None)
        elif isinstance(module, LMHead):
            module.decoding = False
    return moved
