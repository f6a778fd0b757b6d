"""Positional schemes, each exposing the same three hooks.

Shape legend: B batch, T query length, Tk key length, D d_model, H heads,
Dh head size, R rotated size (Dh * fraction), P table rows.

A positional module can act in three places, and every scheme implements all
three (the defaults do nothing), so model code calls the hooks unconditionally and
never asks which scheme it holds:

* ``embed(x, position_ids, n_positions)``: add to the token embeddings (sinusoidal, learned);
* ``rotation(position_ids, n_positions, dtype=...)``: a (cos, sin) pair, each (B|1, T, 1, R),
  that attention applies to queries and keys laid out (B, T, heads, Dh) (rotary), or None;
* ``bias(q_index, k_index, dtype=...)``: an additive attention bias (1, H, T, Tk)
  shared by every layer of a stack (ALiBi, T5), or None.

``n_positions`` is an exclusive upper bound of ``position_ids`` known to the caller
(past + new length), so tables are sized without a device synchronisation.

``scope`` says where the builder places a module: ``"embedding"`` schemes live in
the embedding as ``embed.positions``; ``"stack"`` schemes live in each stack under
``module_name`` (T5's table is ``encoder.rel_bias`` / ``decoder.rel_bias``).
Fixed tables (sinusoids, rotary cos/sin, ALiBi slopes) are computed on first use
and cached per (device, dtype); they are not buffers, so they never enter a
checkpoint and are never stale after ``.to()``. ``torch.compile`` reads the caches but
never fills them: :func:`warm_tables` fills them before a compiled model's first call.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # annotations only: a plugin imports this module before the spec schema exists
    from specformer.specs.schema import (
        AlibiSpec,
        DynamicRopeScaling,
        LearnedSpec,
        LinearRopeScaling,
        Llama3RopeScaling,
        LongRopeScaling,
        NoPositionalSpec,
        RopeScaling,
        RopeSpec,
        SinusoidalSpec,
        T5BiasSpec,
        YarnRopeScaling,
    )

__all__ = [
    "Positional",
    "SinusoidalPositional",
    "LearnedPositional",
    "Rotary",
    "ALiBi",
    "T5RelativeBias",
    "NoPositional",
    "sinusoidal_table",
    "rope_frequencies",
    "alibi_slopes",
    "t5_relative_buckets",
    "apply_rotary",
    "warm_tables",
]

_Key = tuple[torch.device, torch.dtype]


def warm_tables(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Fill the fixed tables of every positional module in ``model`` (rotary cos/sin,
    sinusoids, ALiBi slopes, T5 buckets) for forwards on ``device`` with hidden states in
    ``dtype``, before ``torch.compile`` traces it: the compiled graph then reads them as
    constants. Without them it computes each in the graph at every call, and inductor
    computes a rotary table's cos and sin again inside every layer's rotation (a compiled
    llama-larger bf16 step: 247 against 237 ms on a 2-core CPU)."""
    for module in model.modules():
        if isinstance(module, Positional):
            module.warm(device, dtype)


class Positional(nn.Module):
    """Base class: every hook is the identity. Subclasses override what they use.

    Constructors take their spec and, keyword-only, the model-level numbers of the
    family: ``d_model``, ``max_seq_len``, ``n_heads``, ``head_dim``, ``causal``.
    """

    scope: ClassVar[Literal["embedding", "stack"]] = "stack"
    module_name: ClassVar[str] = "positional"

    def embed(self, x: Tensor, position_ids: Tensor, n_positions: int) -> Tensor:
        """Return the embeddings (B, T, D) with positions added."""
        return x

    def rotation(
        self, position_ids: Tensor, n_positions: int, *, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor] | None:
        """(cos, sin), each (B|1, T, 1, R), to rotate queries and keys (B, T, heads, Dh) with
        :func:`apply_rotary`; None for no rotation."""
        return None

    def bias(self, q_index: Tensor, k_index: Tensor, *, dtype: torch.dtype) -> Tensor | None:
        """An additive attention bias (1, H, T, Tk) for absolute indices; None for no bias.

        ``q_index`` and ``k_index`` are consecutive positions (``arange``s), as the
        stacks pass them."""
        return None

    def warm(self, device: torch.device, dtype: torch.dtype) -> None:
        """Fill the fixed tables a forward on ``device`` with hidden states in ``dtype``
        reads (nothing, for schemes without any). ``torch.compile`` reads a cached table as
        a constant of its graph but never fills the cache (see :meth:`Rotary.tables`), so a
        compiled model is warmed first: :func:`warm_tables`."""


class NoPositional(Positional):
    """No positional information (NoPE, Kazemnejad et al. 2023)."""

    def __init__(
        self,
        spec: NoPositionalSpec | None = None,
        *,
        d_model: int = 0,
        max_seq_len: int = 0,
        n_heads: int = 0,
        head_dim: int = 0,
        causal: bool = False,
    ) -> None:
        super().__init__()


# --------------------------------------------------------------------------- additive


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)): (P, D) float32.

    Vaswani et al. 2017, section 3.5 (sines on even, cosines on odd features). ``layout``
    ``halves``: the same sines in the first ceil(D/2) features and the cosines after them
    (tensor2tensor's layout, and Marian's).
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = pos / base ** (two_i / d_model)  # (P, ceil(D/2))
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    sines, cosines = (slice(0, None, 2), slice(1, None, 2)) if layout == "interleaved" else (
        slice(0, angle.shape[1]), slice(angle.shape[1], None))
    table[:, sines] = torch.sin(angle)
    table[:, cosines] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositional(Positional):
    """Fixed sinusoidal positions added to the embeddings (Vaswani et al. 2017)."""

    scope = "embedding"
    module_name = "positions"

    def __init__(
        self,
        spec: SinusoidalSpec,
        *,
        d_model: int,
        max_seq_len: int,
        n_heads: int = 0,
        head_dim: int = 0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.base = spec.base
        self.layout = getattr(spec, "layout", "interleaved")
        self.d_model = d_model
        self.max_seq_len = max_seq_len
        self._tables: dict[_Key, Tensor] = {}

    def table(self, n_positions: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The (P >= n_positions, D) table on ``device`` in ``dtype``, cached; it covers
        ``max_seq_len`` positions and at least doubles when a sequence runs past them."""
        key = (device, dtype)
        table = self._tables.get(key)
        if torch.compiler.is_compiling():  # read, never filled: see Rotary.tables
            if table is not None and table.shape[0] >= n_positions:
                return table
            return sinusoidal_table(n_positions, self.d_model, self.base, self.layout).to(device=device, dtype=dtype)
        if table is None or table.shape[0] < n_positions:
            rows = max(n_positions, self.max_seq_len, 2 * table.shape[0] if table is not None else 0)
            table = sinusoidal_table(rows, self.d_model, self.base, self.layout).to(device=device, dtype=dtype)
            self._tables[key] = table
        return table

    def warm(self, device: torch.device, dtype: torch.dtype) -> None:
        self.table(self.max_seq_len, device, dtype)

    def embed(self, x: Tensor, position_ids: Tensor, n_positions: int) -> Tensor:
        table = self.table(n_positions, x.device, x.dtype)
        return x + table[position_ids]  # (B|1, T, D)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}"


class LearnedPositional(Positional):
    """A learned absolute position table added to the embeddings (BERT, GPT-2).

    Position p reads row ``p + offset`` (RoBERTa keeps its first two rows for padding).
    """

    scope = "embedding"
    module_name = "positions"

    def __init__(
        self,
        spec: LearnedSpec,
        *,
        d_model: int,
        max_seq_len: int,
        n_heads: int = 0,
        head_dim: int = 0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.offset = spec.offset
        self.weight = nn.Parameter(torch.empty(spec.rows(max_seq_len), d_model))  # (P, D)

    def embed(self, x: Tensor, position_ids: Tensor, n_positions: int) -> Tensor:
        usable = self.weight.shape[0] - self.offset
        if n_positions > usable:
            raise ValueError(
                f"position {n_positions - 1} is past the learned position table, which has {usable} "
                f"positions (0-{usable - 1}); use sequences of at most {usable} tokens, or a spec "
                "with a larger max_seq_len / positional.max_positions"
            )
        idx = position_ids + self.offset if self.offset else position_ids
        return x + nn.functional.embedding(idx, self.weight)  # (B|1, T, D)

    def init_parameters(self, std: float) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=std)

    def extra_repr(self) -> str:
        return f"rows={self.weight.shape[0]}, d_model={self.weight.shape[1]}, offset={self.offset}"


# --------------------------------------------------------------------------- rotary


def rope_frequencies(
    rot_dim: int,
    base: float,
    scaling: RopeScaling | None = None,
    *,
    seq_len: int | Tensor | None = None,
    device: torch.device | None = None,
) -> tuple[Tensor, float]:
    """The rotary inverse frequencies θ_i (R/2,) float32 and the factor cos and sin are
    multiplied by, for ``rot_dim`` rotated features, in a forward whose positions reach
    ``seq_len - 1`` (None: no further than the original context; a 0-d tensor: a length
    taken past it, which a compiled forward computes without reading it back).

    Unscaled, θ_i = base^(-2i/R). ``scaling`` rescales them as Hugging Face's rope types of
    the same names do (the same float32 operations, so the same bits); all but ``dynamic``
    and ``longrope`` once, with no dependence on the sequence length:

    * ``linear``: θ_i / factor (position interpolation, Chen et al. 2023);
    * ``llama3``: wavelengths 2π/θ_i longer than L / low_freq_factor are divided by
      factor, shorter than L / high_freq_factor kept, and between them blended with
      s = (L / wavelength - low) / (high - low): (1 - s) θ_i / factor + s θ_i, for
      L = original_max_position_embeddings;
    * ``yarn``: dimension d turns L θ_d / 2π times over the original context; a linear
      ramp over d, from the dimension turning beta_fast times to the one turning beta_slow
      times, blends θ_d (kept) into θ_d / factor (interpolated); the factor returned is
      the YaRN attention factor (Peng et al. 2023);
    * ``dynamic`` (dynamic NTK): for ``seq_len`` = n past the original context L, the
      base grows to base (factor n / L - (factor - 1))^(R / (R - 2)), computed as
      transformers computes it from a tensor n (in float32); up to L, the base as is;
    * ``longrope``: θ_i / short_factor[i] up to the original context, θ_i / long_factor[i]
      past it; the factor returned is LongRoPE's attention factor.
    """
    powers = base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim)  # (R/2,)
    if scaling is None:
        return 1.0 / powers, 1.0
    return _SCALED_FREQUENCIES[scaling.type](scaling, powers, rot_dim, base, seq_len)


def _linear(
    scaling: LinearRopeScaling, powers: Tensor, rot_dim: int, base: float, seq_len: int | None
) -> tuple[Tensor, float]:
    return 1.0 / powers / scaling.factor, 1.0


def _llama3(
    scaling: Llama3RopeScaling, powers: Tensor, rot_dim: int, base: float, seq_len: int | None
) -> tuple[Tensor, float]:
    inv_freq, factor = 1.0 / powers, scaling.factor
    context = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, blended, scaled), 1.0


def _yarn(
    scaling: YarnRopeScaling, powers: Tensor, rot_dim: int, base: float, seq_len: int | None
) -> tuple[Tensor, float]:
    def dimension(rotations: float) -> float:
        # the dimension whose frequency turns `rotations` times over the original context
        context = scaling.original_max_position_embeddings
        return rot_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rot_dim - 1)
    if lo == hi:
        hi += 0.001  # a ramp of one step
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1).to(powers.device)
    keep = 1 - ramp  # 1: the frequency as is, 0: interpolated by factor
    inv_freq = (1.0 / (scaling.factor * powers)) * (1 - keep) + (1.0 / powers) * keep
    return inv_freq, scaling.attention_scale


def _dynamic(
    scaling: DynamicRopeScaling, powers: Tensor, rot_dim: int, base: float, seq_len: int | Tensor | None
) -> tuple[Tensor, float]:
    factor, context = scaling.factor, scaling.original_max_position_embeddings
    exponent = rot_dim / (rot_dim - 2)
    if isinstance(seq_len, Tensor):
        grown: float | Tensor = base * ((factor * seq_len / context) - (factor - 1)) ** exponent
    elif seq_len is None or seq_len <= context:
        # transformers' frequencies at initialisation: its formula at n = L, in Python floats
        grown = base * ((factor * context / context) - (factor - 1)) ** exponent
    else:
        # past L, from n as transformers has it while decoding (max(position_ids) + 1, an int64
        # tensor), so in float32 tensor arithmetic: the same bits
        n = torch.tensor(seq_len, dtype=torch.int64, device=powers.device)
        grown = base * ((factor * n / context) - (factor - 1)) ** exponent
    shape = torch.arange(0, rot_dim, 2, dtype=torch.int64, device=powers.device).float() / rot_dim  # (R/2,)
    return 1.0 / (grown**shape), 1.0


def _longrope(
    scaling: LongRopeScaling, powers: Tensor, rot_dim: int, base: float, seq_len: int | Tensor | None
) -> tuple[Tensor, float]:
    long = isinstance(seq_len, Tensor) or (seq_len is not None and seq_len > scaling.original_max_position_embeddings)
    factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32,
                           device=powers.device)  # (R/2,)
    return 1.0 / (factors * powers), scaling.attention_scale


# positional.scaling's type -> its frequencies from base^(2i/R), as rope_frequencies documents them
_SCALED_FREQUENCIES = {"linear": _linear, "llama3": _llama3, "yarn": _yarn, "dynamic": _dynamic, "longrope": _longrope}


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first R features of x (..., Dh) by ``(cos, sin)`` (..., R), as
    :meth:`Rotary.rotation` returns them (broadcasting over heads: x (B, T, heads, Dh),
    tables (B|1, T, 1, R)).

    Rotate-half convention (GPT-NeoX, Hugging Face Llama): feature i pairs with i + R/2,
    x_i cos - x_{i+R/2} sin and x_{i+R/2} cos + x_i sin. ``sin`` carries the sign of
    each half (its first half negated), so the pairing is one ``roll`` of x by R/2 and
    the rotation is x cos + roll(x) sin: three operations instead of the six of
    slicing, negating and concatenating halves.
    """
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return torch.addcmul(x * cos, x.roll(rot // 2, -1), sin)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((torch.addcmul(x_rot * cos, x_rot.roll(rot // 2, -1), sin), x_pass), dim=-1)


class Rotary(Positional):
    """Rotary position embedding (Su et al. 2021, RoFormer) on the first
    ``fraction * head_dim`` features of queries and keys (GPT-NeoX rotates 25%)."""

    module_name = "rotary"

    def __init__(
        self,
        spec: RopeSpec,
        *,
        d_model: int = 0,
        max_seq_len: int,
        n_heads: int = 0,
        head_dim: int,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.base = spec.base
        self.scaling = spec.scaling
        self.head_dim = head_dim
        self.rot_dim = int(head_dim * spec.fraction)
        self.max_seq_len = max_seq_len
        # past this length a forward's frequencies follow its last position (dynamic NTK, LongRoPE)
        self.follows_length_past = self.scaling.follows_length_past if self.scaling is not None else None
        self._tables: dict[_Key, tuple[Tensor, Tensor]] = {}
        local = getattr(spec, "local_base", None)
        # the layers with a sliding window rotate with their own base, unscaled (Gemma 3)
        self.local = None if local is None else Rotary(
            spec.model_copy(update={"base": local, "scaling": None, "local_base": None}),
            max_seq_len=max_seq_len, head_dim=head_dim,
        )

    def tables(self, n_positions: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(cos, signed sin), each (P >= n_positions, R), cached per device and dtype.

        Row p holds cos(p θ_i) and sin(p θ_i) for the frequencies θ_i of
        :func:`rope_frequencies` (base^(-2i/R), scaled when the spec says so), each
        repeated over the two halves and multiplied by its attention factor (YaRN's,
        LongRoPE's; 1 otherwise); the sine's first half is negated (see :func:`apply_rotary`). The
        table covers ``max_seq_len`` positions and at least doubles when a sequence runs
        past it, so decoding long sequences recomputes it O(log n) times, not at every step.
        With dynamic and LongRoPE scaling these are the frequencies of a forward within the
        original context; :meth:`rotation` computes those of a longer one.
        """
        key = (device, dtype)
        cached = self._tables.get(key)
        if torch.compiler.is_compiling():
            # read, never filled, while traced: a compiled forward that filled the cache would
            # fail its own guard on it at the next call and compile again. A table cached
            # before (an eager call, or warm_tables) is a constant of the graph; without one
            # it is computed in the graph, where inductor computes cos and sin again in every
            # layer's rotation
            if cached is not None and cached[0].shape[0] >= n_positions:
                return cached
            return self._computed_tables(n_positions, device, dtype)
        if cached is None or cached[0].shape[0] < n_positions:
            rows = max(n_positions, self.max_seq_len, 2 * cached[0].shape[0] if cached is not None else 0)
            cached = self._tables[key] = self._computed_tables(rows, device, dtype)
        return cached

    def warm(self, device: torch.device, dtype: torch.dtype) -> None:
        self.tables(self.max_seq_len, device, dtype)

    def _computed_tables(self, rows: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        inv_freq, scale = rope_frequencies(self.rot_dim, self.base, self.scaling, device=device)  # (R/2,)
        t = torch.arange(rows, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)  # (P, R/2)
        cos, sin = freqs.cos(), freqs.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)

    def rotation(
        self, position_ids: Tensor, n_positions: int, *, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin) of the tables at ``position_ids``; with dynamic or LongRoPE scaling, past
        the original context, of the frequencies of this forward's last position (its largest
        id + 1, as transformers takes it), computed for these positions only: decoding with a
        cache, each step rotates its query and new keys with its own frequencies, and the
        cached keys keep those of their step, as in transformers."""
        past = self.follows_length_past
        if past is not None and n_positions > past:
            if torch.compiler.is_compiling():
                # both rotations, chosen in the graph: reading the length back (.item()) would
                # break the graph in two at every forward
                n = position_ids.max() + 1
                cos_long, sin_long = self._rotation_at(position_ids, n, dtype)
                cos, sin = self.tables(n_positions, position_ids.device, dtype)
                long = n > past
                return (torch.where(long, cos_long, cos[position_ids].unsqueeze(2)),
                        torch.where(long, sin_long, sin[position_ids].unsqueeze(2)))
            seq_len = int(position_ids.max()) + 1  # n_positions bounds it; padding may leave it lower
            if seq_len > past:
                return self._rotation_at(position_ids, seq_len, dtype)
        cos, sin = self.tables(n_positions, position_ids.device, dtype)
        return cos[position_ids].unsqueeze(2), sin[position_ids].unsqueeze(2)  # (B|1, T, 1, R)

    def _rotation_at(
        self, position_ids: Tensor, seq_len: int | Tensor, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        device = position_ids.device
        inv_freq, scale = rope_frequencies(self.rot_dim, self.base, self.scaling, seq_len=seq_len, device=device)
        freqs = position_ids[..., None].float() * inv_freq  # (B|1, T, R/2)
        cos, sin = freqs.cos(), freqs.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        cos, sin = torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos.unsqueeze(2), sin.unsqueeze(2)  # (B|1, T, 1, R)

    def extra_repr(self) -> str:
        scaling = ""
        if self.scaling is not None:
            scaling = f", scaling={self.scaling.type} x{self.scaling.factor:g}"
        return f"rot_dim={self.rot_dim}/{self.head_dim}, base={self.base:g}{scaling}"


# --------------------------------------------------------------------------- attention biases


def alibi_slopes(n_heads: int) -> list[float]:
    """Per-head slopes of ALiBi (Press et al. 2022): the geometric sequence starting at
    2^(-8/n) with that ratio; for a head count that is not a power of two, the slopes
    of the closest smaller power of two followed by every other slope of twice that."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]


class ALiBi(Positional):
    """Attention with linear biases (Press et al. 2022): score(q_i, k_j) - m_h * |i - j|."""

    module_name = "alibi"

    def __init__(
        self,
        spec: AlibiSpec,
        *,
        d_model: int = 0,
        max_seq_len: int = 0,
        n_heads: int,
        head_dim: int = 0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self._slopes: dict[_Key, Tensor] = {}

    def warm(self, device: torch.device, dtype: torch.dtype) -> None:
        self.slopes(device, dtype)

    def slopes(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        key = (device, dtype)
        if torch.compiler.is_compiling() and key not in self._slopes:  # read, never filled: see Rotary.tables
            return torch.tensor(alibi_slopes(self.n_heads), device=device, dtype=dtype)
        if key not in self._slopes:
            self._slopes[key] = torch.tensor(alibi_slopes(self.n_heads), device=device, dtype=dtype)
        return self._slopes[key]  # (H,)

    def bias(self, q_index: Tensor, k_index: Tensor, *, dtype: torch.dtype) -> Tensor:
        distance = (k_index[None, :] - q_index[:, None]).abs().to(dtype)  # (T, Tk)
        return -self.slopes(distance.device, dtype)[None, :, None, None] * distance  # (1, H, T, Tk)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}"


def t5_relative_buckets(
    relative_position: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's bucket of each relative position (key index - query index).

    Half the buckets (per direction when bidirectional) hold exact small distances;
    the rest cover distances up to ``max_distance`` logarithmically (Raffel et al. 2020).
    A causal decoder only sees keys at or before the query, so only distances <= 0 count.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


class T5RelativeBias(Positional):
    """T5's bucketed relative position bias (Raffel et al. 2020): a learned scalar per
    (bucket, head), one table per stack shared by all its layers; bidirectional buckets
    in the encoder, causal buckets in the decoder."""

    module_name = "rel_bias"

    def __init__(
        self,
        spec: T5BiasSpec,
        *,
        d_model: int = 0,
        max_seq_len: int = 0,
        n_heads: int,
        head_dim: int = 0,
        causal: bool,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.num_buckets = spec.num_buckets
        self.max_distance = spec.max_distance
        self.bidirectional = not causal
        self.weight = nn.Parameter(torch.empty(spec.num_buckets, n_heads))  # (buckets, H)
        self._buckets: dict[torch.device, Tensor] = {}
        self._reach: tuple[int, Tensor] | None = None  # (R, the bucket of each distance in [-R, R])

    def bucket_table(self, device: torch.device) -> Tensor:
        """The bucket of every distance in [-max_distance, max_distance] (index d + max_distance).
        Past max_distance the bucket no longer changes, so a clamped distance finds any other's.
        Under ``torch.compile`` the cache is read, never filled (see :meth:`Rotary.tables`)."""
        table = self._buckets.get(device)
        if torch.compiler.is_compiling() and table is None:
            return self._computed_buckets(device)
        if table is None:
            table = self._buckets[device] = self._computed_buckets(device)
        return table

    def warm(self, device: torch.device, dtype: torch.dtype) -> None:
        self.bucket_table(device)

    def _computed_buckets(self, device: torch.device) -> Tensor:
        m = self.max_distance
        return t5_relative_buckets(
            torch.arange(-m, m + 1, device=device), bidirectional=self.bidirectional,
            num_buckets=self.num_buckets, max_distance=m,
        )

    def bias(self, q_index: Tensor, k_index: Tensor, *, dtype: torch.dtype) -> Tensor:
        # The bias depends on k - q only, and consecutive indices give T + Tk - 1 distinct
        # distances: look those up (L,) and lay them out as a Toeplitz matrix. Row i of
        # table.unfold is distances (j - (T - 1 - i)), so rows come in reverse: flip them.
        # Looking up all T x Tk pairs instead made backward scatter T*Tk rows into a few
        # buckets, ~7x slower at T = 256; unfold's backward sums the diagonals directly.
        # The buckets come from a table made once (a decoding step would otherwise spend
        # a dozen small operations on them).
        t, tk = q_index.shape[0], k_index.shape[0]
        m = self.max_distance
        if q_index.device.type == "cpu" and not torch.compiler.is_compiling():
            # on a CPU, where reading the offset is no device sync: the L buckets are a slice
            # of a row made once, not half a dozen operations on each decoded token (the bias
            # of one query over 100 keys: 81 -> 30 µs on a 2-core AMD EPYC)
            offset = int(k_index[0]) - int(q_index[0])
            reach, row = self._distance_buckets(max(t - 1 - offset, tk - 1 + offset, 0))
            buckets = row[reach + offset - (t - 1): reach + offset + tk]  # (L,)
        else:
            distances = torch.arange(-(t - 1), tk, device=q_index.device) + (k_index[0] - q_index[0])  # (L,)
            buckets = self.bucket_table(q_index.device)[distances.clamp(-m, m) + m]
        table = nn.functional.embedding(buckets, self.weight).to(dtype).t()  # (H, L)
        if torch.compiler.is_compiling():
            # unfold makes T and Tk constants of the graph (a new graph whenever a batch's length
            # differs); indexing keeps them symbolic, and inductor fuses its backward's sums
            j = torch.arange(tk, device=q_index.device)
            i = torch.arange(t - 1, -1, -1, device=q_index.device)
            return table[:, i.unsqueeze(1) + j].unsqueeze(0)  # (1, H, T, Tk)
        if t == 1:
            return table[None, :, None, :]  # (1, H, 1, Tk): one query's row, as unfold's
        return table.unfold(1, tk, 1).flip(1).unsqueeze(0)  # (1, H, T, Tk)

    def _distance_buckets(self, reach: int) -> tuple[int, Tensor]:
        """(R, row): the bucket of each distance d in [-R, R] at ``row[R + d]``, on the CPU,
        R ≥ ``reach``; made again, twice as long, when a longer reach is asked (a decoding's
        growing one remakes it log(length) times). Made outside inference mode: a row made
        in it (a validation loop's) would make every later bias's buckets inference tensors,
        which a training step's embedding cannot save for its backward pass."""
        if self._reach is None or self._reach[0] < reach:
            r = max(reach, 2 * self._reach[0] if self._reach is not None else 0, self.max_distance)
            m = self.max_distance
            with torch.inference_mode(False):
                distances = torch.arange(-r, r + 1).clamp_(-m, m).add_(m)
                self._reach = (r, self.bucket_table(torch.device("cpu"))[distances])
        return self._reach

    def init_parameters(self, std: float) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=std)

    def extra_repr(self) -> str:
        return (
            f"buckets={self.num_buckets}, heads={self.n_heads}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )
