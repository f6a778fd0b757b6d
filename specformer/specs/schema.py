"""The spec schema: pydantic models describing a Transformer, with no torch import.

A :class:`ModelSpec` is the contract between a YAML file and everything else: it is
frozen, refuses unknown keys, and after validation every derived size (``head_dim``,
``n_kv_heads``, ``d_ff``, cross-attention settings, final norm) is filled in, so
components read numbers and never re-derive them.

Families with a ``type:`` field (positional, attention, ffn, norm, head) are
discriminated unions generated from :mod:`specformer.registry`; a plugin that
registers a new spec class makes it valid YAML.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specformer.registry import REGISTRY, load_plugins, register_builtin
from specformer.specs.base import Spec, family_union, rebuild_models
from specformer.specs.merge import deep_merge

__all__ = [
    "Spec",
    "Kind",
    "Activation",
    "SinusoidalSpec",
    "LearnedSpec",
    "RopeSpec",
    "LinearRopeScaling",
    "Llama3RopeScaling",
    "LongRopeScaling",
    "YarnRopeScaling",
    "DynamicRopeScaling",
    "RopeScaling",
    "ROPE_SCALINGS",
    "AlibiSpec",
    "T5BiasSpec",
    "NoPositionalSpec",
    "AttentionSpec",
    "MLPSpec",
    "GLUSpec",
    "LayerNormSpec",
    "RMSNormSpec",
    "ResidualSpec",
    "LayerOverride",
    "LayerSpec",
    "StackSpec",
    "EmbeddingSpec",
    "LMHeadSpec",
    "MLMHeadSpec",
    "ClassificationHeadSpec",
    "InitSpec",
    "ModelSpec",
    "PositionalSpec",
    "FFNSpec",
    "NormSpec",
    "HeadSpec",
    "default_glu_d_ff",
]

Kind = Literal["encoder", "decoder", "encoder-decoder"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]
Dropout = Annotated[float, Field(ge=0.0, lt=1.0)]


def _issue(field: str, message: str) -> PydanticCustomError:
    """A cross-field error that names the offending field (read by the error formatter)."""
    return PydanticCustomError("cross_field", message, {"field": field})


# --------------------------------------------------------------------------- positional


# upper bounds far past any real model, so that a typo (an extra digit group) is an error
# here rather than an overflow in torch: widths (d_model, heads, head_dim, T5 buckets)
# up to 2^20, an FFN's hidden size up to 2^24, counts of ids (vocab_size, positions,
# max_seq_len) up to 2^31 - 1
MAX_WIDTH = 2**20
MAX_HIDDEN = 2**24
MAX_INDEX = 2**31 - 1


class SinusoidalSpec(Spec):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017, section 3.5):
    PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""

    type: Literal["sinusoidal"] = "sinusoidal"
    base: PositiveFloat = Field(10000.0, description="Wavelength base (10000 in the paper).")
    layout: Literal["interleaved", "halves"] = Field(
        "interleaved",
        description="interleaved: sines on the even features, cosines on the odd ones (the paper's formula); "
        "halves: the sines in the first half, the cosines in the second, same frequencies (tensor2tensor, "
        "Marian).",
    )


class LearnedSpec(Spec):
    """A learned absolute position table added to the embeddings (BERT, GPT-2)."""

    type: Literal["learned"] = "learned"
    max_positions: PositiveInt | None = Field(
        None, le=MAX_INDEX, description="Rows of the table; default max_seq_len + offset, and at least that."
    )
    offset: NonNegativeInt = Field(
        0, le=MAX_INDEX, description="Rows skipped before position 0 (RoBERTa reserves 2)."
    )

    def rows(self, max_seq_len: int) -> int:
        """Rows of the table: ``max_positions``, or by default ``max_seq_len + offset``."""
        return self.max_positions if self.max_positions is not None else max_seq_len + self.offset


_FACTOR = "Context extension factor: the new context length over the one the model was trained at, 1 or more."
_ORIGINAL = "Context length the model was pretrained at, before the extension."


class _RopeScaling(Spec):
    """What every positional.scaling type answers."""

    @property
    def follows_length_past(self) -> int | None:
        """The length past which a forward's frequencies depend on how far its positions
        reach; None when they are fixed by the fields alone."""
        return None


class LinearRopeScaling(_RopeScaling):
    """Linear position interpolation (Chen et al. 2023): every rotary frequency divided by
    ``factor``, so position p rotates as p / factor did (Hugging Face rope_type ``linear``)."""

    type: Literal["linear"] = "linear"
    factor: float = Field(..., ge=1.0, description=_FACTOR)


class Llama3RopeScaling(_RopeScaling):
    """Llama 3.1's frequency-dependent interpolation (Hugging Face rope_type ``llama3``):
    wavelengths longer than original_max_position_embeddings / low_freq_factor are
    divided by ``factor``, those shorter than original_max_position_embeddings /
    high_freq_factor kept, and those between blended smoothly."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(8.0, ge=1.0, description=_FACTOR + " Llama 3.1: 8, Llama 3.2: 32.")
    low_freq_factor: PositiveFloat = Field(
        1.0, description="Wavelengths above original_max_position_embeddings / low_freq_factor are interpolated in full."
    )
    high_freq_factor: PositiveFloat = Field(
        4.0,
        description="Wavelengths below original_max_position_embeddings / high_freq_factor are kept; "
        "more than low_freq_factor.",
    )
    original_max_position_embeddings: PositiveInt = Field(
        8192, le=MAX_INDEX, description=_ORIGINAL + " Llama 3.1: 8192."
    )

    @model_validator(mode="after")
    def _band(self) -> Llama3RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise _issue(
                "high_freq_factor",
                f"high_freq_factor={self.high_freq_factor:g} must exceed low_freq_factor={self.low_freq_factor:g}: "
                "the wavelengths between original_max_position_embeddings / high_freq_factor and "
                "original_max_position_embeddings / low_freq_factor are blended (Llama 3.1: 4 and 1)",
            )
        return self


class YarnRopeScaling(_RopeScaling):
    """YaRN (Peng et al. 2023, Hugging Face rope_type ``yarn``): frequencies that turn fewer
    than beta_slow times over the original context are interpolated by ``factor``, those that
    turn more than beta_fast times are kept, a linear ramp blends the dimensions between, and
    cos/sin are multiplied by an attention factor (default 0.1 ln(factor) + 1). The context it
    extends to, factor × original_max_position_embeddings, must reach max_seq_len."""

    type: Literal["yarn"] = "yarn"
    factor: float = Field(..., ge=1.0, description=_FACTOR)
    original_max_position_embeddings: PositiveInt = Field(..., le=MAX_INDEX, description=_ORIGINAL)
    beta_fast: PositiveFloat = Field(
        32.0, description="Rotations over the original context above which a frequency is kept as is."
    )
    beta_slow: PositiveFloat = Field(
        1.0, description="Rotations over the original context below which a frequency is interpolated in full."
    )
    attention_factor: PositiveFloat | None = Field(
        None,
        description="Multiplier of cos and sin (so of the attention logits, squared); default from mscale "
        "and mscale_all_dim when both are set, else 0.1 ln(factor) + 1.",
    )
    mscale: PositiveFloat | None = Field(
        None,
        description="With mscale_all_dim: attention factor (0.1 mscale ln(factor) + 1) / "
        "(0.1 mscale_all_dim ln(factor) + 1) (DeepSeek).",
    )
    mscale_all_dim: PositiveFloat | None = Field(None, description="See mscale.")
    truncate: bool = Field(
        True, description="Round the ramp's ends outward to whole dimensions (false: gpt-oss)."
    )

    @model_validator(mode="after")
    def _betas(self) -> YarnRopeScaling:
        if self.beta_fast <= self.beta_slow:
            raise _issue(
                "beta_fast",
                f"beta_fast={self.beta_fast:g} must exceed beta_slow={self.beta_slow:g}: frequencies turning "
                "more than beta_fast times over the original context are kept, fewer than beta_slow "
                "times interpolated (YaRN: 32 and 1)",
            )
        return self

    @property
    def attention_scale(self) -> float:
        """The multiplier of cos and sin: ``attention_factor``, or the one YaRN derives from ``factor``."""
        if self.attention_factor is not None:
            return self.attention_factor

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(mscale(self.factor, self.mscale) / mscale(self.factor, self.mscale_all_dim))
        return mscale(self.factor)


class DynamicRopeScaling(_RopeScaling):
    """Dynamic NTK scaling (Hugging Face rope_type ``dynamic``): the frequencies are the plain
    ones while a forward's positions stay within original_max_position_embeddings L; past it,
    for a forward reaching position n - 1, the base grows to
    base * (factor n / L - (factor - 1)) ^ (R / (R - 2)) (R: rotated features), so the slowest
    frequency stretches with the sequence. Decoding with a cache, each step's new keys and query
    use the frequencies of their step; the keys already cached keep the rotation of theirs."""

    type: Literal["dynamic"] = "dynamic"
    factor: float = Field(
        ...,
        ge=1.0,
        description="Slope of the growth, 1 or more: a forward of n tokens past the original context L "
        "scales the base as NTK-aware scaling by s = factor (n / L - 1) + 1 does.",
    )
    original_max_position_embeddings: PositiveInt = Field(
        ...,
        le=MAX_INDEX,
        description=_ORIGINAL + " Past it the base grows; transformers takes it to be max_position_embeddings.",
    )

    @property
    def follows_length_past(self) -> int | None:
        return self.original_max_position_embeddings


class LongRopeScaling(_RopeScaling):
    """LongRoPE (Ding et al. 2024; Phi-3, Hugging Face rope_type ``longrope``): each rotary
    frequency i divided by its own factor, short_factor[i] while a forward's positions stay
    within original_max_position_embeddings and long_factor[i] for a forward reaching past it,
    and cos/sin multiplied by an attention factor (default sqrt(1 + ln(factor) / ln(original))).
    Decoding with a cache, the keys cached before the switch keep their short-factor rotation."""

    type: Literal["longrope"] = "longrope"
    short_factor: list[PositiveFloat] = Field(
        ..., min_length=1, description="One divisor per rotary frequency (R/2 of them) within the original context."
    )
    long_factor: list[PositiveFloat] = Field(
        ..., min_length=1, description="One divisor per rotary frequency (R/2 of them) past the original context."
    )
    original_max_position_embeddings: PositiveInt = Field(..., le=MAX_INDEX, description=_ORIGINAL)
    factor: float = Field(
        ...,
        ge=1.0,
        description=_FACTOR + " Sets the default attention factor only (Phi-3: max_position_embeddings / "
        "original_max_position_embeddings).",
    )
    attention_factor: PositiveFloat | None = Field(
        None,
        description="Multiplier of cos and sin; default sqrt(1 + ln(factor) / ln(original_max_position_embeddings)), "
        "1 for a factor of 1.",
    )

    @property
    def follows_length_past(self) -> int | None:
        return self.original_max_position_embeddings

    @property
    def attention_scale(self) -> float:
        """The multiplier of cos and sin: ``attention_factor``, or the one LongRoPE derives from ``factor``."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))


ROPE_SCALINGS: tuple[type[Spec], ...] = (
    LinearRopeScaling, Llama3RopeScaling, YarnRopeScaling, DynamicRopeScaling, LongRopeScaling,
)


def _scaling_type(value: Any) -> Any:
    # a mapping's type (None when it has none), or a built scaling's; None for anything else, so
    # that `scaling: linear` is told to write a mapping rather than shown pydantic's model error
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


RopeScaling = Annotated[
    Annotated[LinearRopeScaling, Tag("linear")]
    | Annotated[Llama3RopeScaling, Tag("llama3")]
    | Annotated[YarnRopeScaling, Tag("yarn")]
    | Annotated[DynamicRopeScaling, Tag("dynamic")]
    | Annotated[LongRopeScaling, Tag("longrope")],
    Discriminator(_scaling_type),
]


class RopeSpec(Spec):
    """Rotary position embedding applied to queries and keys (Su et al. 2021, RoFormer)."""

    type: Literal["rope"] = "rope"
    base: PositiveFloat = Field(10000.0, description="Frequency base theta.")
    fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="Fraction of head_dim that is rotated (GPT-NeoX: 0.25): the first int(head_dim * fraction) "
        "features, rounded down as transformers rounds them, an even number."
    )
    local_base: PositiveFloat | None = Field(
        None,
        description="Layers with a sliding window rotate with this base instead, without scaling "
        "(Gemma 3's rope_local_base_freq, 10000); null: every layer rotates alike.",
    )
    scaling: RopeScaling | None = Field(
        None,
        description="Frequency scaling for a longer context: linear (position interpolation), "
        "llama3 (Llama 3.1) and yarn, computed once from their fields; dynamic (dynamic NTK) and "
        "longrope (Phi-3), from the length of each forward past the original context; null: none.",
    )


class AlibiSpec(Spec):
    """Attention with linear biases (Press et al. 2022): per-head geometric slopes."""

    type: Literal["alibi"] = "alibi"


class T5BiasSpec(Spec):
    """T5's bucketed relative position bias (Raffel et al. 2020), one table per stack
    shared by its layers; bidirectional buckets in encoders, causal in decoders."""

    type: Literal["t5"] = "t5"
    num_buckets: int = Field(32, ge=4, le=MAX_WIDTH, description="Relative-distance buckets, at least 4 (an encoder splits them between the two directions).")
    max_distance: PositiveInt = Field(128, le=MAX_WIDTH, description="Distance beyond which buckets saturate; above num_buckets // 2.")

    @model_validator(mode="after")
    def _log_range(self) -> T5BiasSpec:
        # half the buckets (a quarter per direction in an encoder) hold the exact distances
        # below num_buckets // 2; the rest spread logarithmically from there to max_distance,
        # which must therefore lie beyond it
        if self.max_distance <= self.num_buckets // 2:
            raise _issue(
                "max_distance",
                f"max_distance={self.max_distance} must exceed num_buckets // 2 = {self.num_buckets // 2}: "
                f"the distances below that have a bucket each, the logarithmic buckets cover the rest "
                f"up to max_distance (allowed: {self.num_buckets // 2 + 1} or more; T5 uses 128 with 32 buckets)",
            )
        return self


class NoPositionalSpec(Spec):
    """No positional information (NoPE); causal masking alone breaks symmetry."""

    type: Literal["none"] = "none"


# --------------------------------------------------------------------------- attention


# the default eps of attention's query and key norms (qk_norm)
QK_NORM_EPS = 1e-6


class AttentionSpec(Spec):
    """Scaled dot-product attention, multi-head / grouped-query / multi-query
    (Vaswani et al. 2017; Ainslie et al. 2023 for GQA; Shazeer 2019 for MQA)."""

    type: Literal["mha"] = "mha"
    n_heads: PositiveInt = Field(8, le=MAX_WIDTH, description="Query heads.")
    n_kv_heads: PositiveInt | None = Field(
        None, le=MAX_WIDTH, description="Key/value heads: n_heads (MHA, default), 1 (MQA), or a divisor (GQA)."
    )
    head_dim: PositiveInt | None = Field(None, le=MAX_WIDTH, description="Per-head size; default d_model / n_heads.")
    bias: bool = Field(True, description="Bias on the q, k, v and output projections.")
    out_bias: bool | None = Field(
        None, description="Bias on the output projection alone; default: bias (Qwen2: bias true, out_bias false)."
    )
    dropout: Dropout = Field(0.0, description="Dropout on the attention probabilities.")
    scale: PositiveFloat | None = Field(
        None, description="Softmax scale; default 1/sqrt(head_dim) (T5 uses 1.0)."
    )
    softcap: PositiveFloat | None = Field(
        None,
        description="Soft-cap the scaled scores to cap * tanh(score / cap) before the mask and softmax "
        "(Gemma 2: 50); computed with explicit scores, as the eager backend does.",
    )
    qk_norm: Literal["none", "layernorm", "rmsnorm"] = Field(
        "none", description="Normalise queries and keys before the dot product and the rotation."
    )
    qk_norm_eps: PositiveFloat = Field(
        QK_NORM_EPS, description="eps of the query and key norms (Qwen3, Gemma 3, OLMo 2: their rms_norm_eps; "
        "Phi: its layer_norm_eps)."
    )
    qk_norm_scope: Literal["head", "all"] = Field(
        "head",
        description="head: one norm over each head's features, shared by the heads (Qwen3, Gemma 3); all: one "
        "over the whole projection, every head's features together (OLMo 2).",
    )
    qk_norm_offset: float = Field(
        0.0, description="rmsnorm qk_norm only: its gain is offset + weight, as a stack norm's offset (Gemma 3: 1)."
    )
    sliding_window: PositiveInt | None = Field(
        None,
        description="Attend only to the last N positions, the query's own included: keys i - N < j <= i "
        "(Mistral's window); in an encoder, keys within N - 1 either side (Longformer). Its KV cache keeps "
        "at most N - 1 + min(N, 128) positions however long the generation; a decoder with a window in every "
        "layer generates past max_seq_len with it.",
    )
    backend: Literal["sdpa", "eager"] = Field(
        "sdpa",
        description="sdpa: torch scaled_dot_product_attention (fused kernels); "
        "eager: explicit softmax(QK^T/sqrt(d))V, can return attention weights.",
    )

    @property
    def output_bias(self) -> bool:
        """Whether the output projection has a bias: ``out_bias``, else ``bias``."""
        return self.bias if self.out_bias is None else self.out_bias

    @model_validator(mode="after")
    def _heads(self) -> AttentionSpec:
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise _issue(
                "n_kv_heads",
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                f"(allowed: {', '.join(str(d) for d in _divisors(self.n_heads))})",
            )
        if self.qk_norm_eps != QK_NORM_EPS and self.qk_norm == "none":
            raise _issue("qk_norm_eps", "qk_norm_eps needs a qk_norm (layernorm or rmsnorm); set qk_norm, "
                                        "or remove qk_norm_eps")
        if self.qk_norm_scope != "head" and self.qk_norm == "none":
            raise _issue("qk_norm_scope", "qk_norm_scope needs a qk_norm (layernorm or rmsnorm); set qk_norm, "
                                          "or remove qk_norm_scope")
        if self.qk_norm_offset and self.qk_norm != "rmsnorm":
            raise _issue("qk_norm_offset", f"an offset applies to an rmsnorm qk_norm, not {self.qk_norm!r}; "
                         "set qk_norm: rmsnorm, or remove qk_norm_offset")
        return self


def _divisors(n: int) -> list[int]:
    # trial division up to sqrt(n), and no further than 10^6: a mistyped d_model of 10^20
    # must not hang validation (past 10^12 the list, a hint, may then miss some divisors)
    small = [d for d in range(1, min(math.isqrt(n), 10**6) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# --------------------------------------------------------------------------- ffn


class MLPSpec(Spec):
    """Position-wise feed-forward network: down(act(up(x))) (Vaswani et al. 2017)."""

    type: Literal["mlp"] = "mlp"
    d_ff: PositiveInt | None = Field(None, le=MAX_HIDDEN, description="Hidden size; default 4 * d_model.")
    activation: Activation = Field("relu", description="relu | gelu | gelu_tanh | silu.")
    bias: bool = Field(True, description="Bias on both projections.")
    dropout: Dropout = Field(0.0, description="Dropout after the activation.")


class GLUSpec(Spec):
    """Gated linear unit FFN: down(act(gate(x)) * up(x)) (Shazeer 2020).
    SwiGLU = activation silu, GeGLU = gelu, ReGLU = relu."""

    type: Literal["glu"] = "glu"
    d_ff: PositiveInt | None = Field(
        None, le=MAX_HIDDEN, description="Hidden size; default 8/3 * d_model rounded up to a multiple of 64."
    )
    activation: Activation = Field("silu", description="silu (SwiGLU) | gelu (GeGLU) | relu (ReGLU) | gelu_tanh.")
    bias: bool = Field(False, description="Bias on the three projections.")
    dropout: Dropout = Field(0.0, description="Dropout after the gating product.")


def default_glu_d_ff(d_model: int) -> int:
    return int(math.ceil(8 * d_model / 3 / 64) * 64)


# --------------------------------------------------------------------------- norm


class _NormBase(Spec):
    type: str
    eps: PositiveFloat = Field(1e-5, description="Added to the variance for stability.")
    placement: Literal["pre", "post", "sandwich", "output"] = Field(
        "pre",
        description="pre: x + F(norm(x)); post (the original paper): norm(x + F(x)); sandwich (Gemma 2): "
        "x + norm'(F(norm(x))), a second norm on each sublayer's output; output (OLMo 2, Swin v2's "
        "res-post-norm): x + norm(F(x)), the norm on the output alone. Only meaningful for a stack's norm.",
    )
    final: bool | None = Field(
        None,
        description="A norm after the last layer; default on for pre-norm, sandwich and output, off for "
        "post-norm. Only meaningful for a stack's norm.",
    )


class LayerNormSpec(_NormBase):
    """Layer normalisation (Ba et al. 2016)."""

    type: Literal["layernorm"] = "layernorm"
    bias: bool = Field(True, description="Learned additive bias (beta).")
    weight: bool = Field(
        True,
        description="Learned gain (gamma). false, with bias: false, is a LayerNorm without parameters "
        "(OLMo 1's; torch's elementwise_affine=False).",
    )

    @model_validator(mode="after")
    def _gain_before_bias(self) -> LayerNormSpec:
        if not self.weight and self.bias:
            raise _issue("bias", "a LayerNorm without a gain (weight: false) has no bias either, as torch's "
                         "elementwise_affine=False: set bias: false")
        return self


class RMSNormSpec(_NormBase):
    """Root-mean-square normalisation, no mean subtraction and no bias (Zhang & Sennrich 2019)."""

    type: Literal["rmsnorm"] = "rmsnorm"
    offset: float = Field(
        0.0,
        description="Added to the weight: the gain is offset + weight, and the weight starts at "
        "1 - offset (Gemma: 1, a weight that starts at 0).",
    )


# --------------------------------------------------------------------------- heads


class LMHeadSpec(Spec):
    """Language-model head: a projection from d_model to the vocabulary."""

    type: Literal["lm"] = "lm"
    bias: bool = Field(False, description="Bias on the output projection.")
    scale_input: bool = Field(
        False, description="Multiply hidden states by d_model^-0.5 first (T5 with tied embeddings)."
    )
    softcap: PositiveFloat | None = Field(
        None, description="Soft-cap the logits to cap * tanh(logit / cap), in the loss too (Gemma 2: 30)."
    )


class MLMHeadSpec(Spec):
    """BERT's masked-LM head: dense + activation + LayerNorm, then the vocabulary decoder."""

    type: Literal["mlm"] = "mlm"
    activation: Activation = Field("gelu", description="Activation of the transform.")
    eps: PositiveFloat = Field(1e-12, description="LayerNorm epsilon of the transform.")
    bias: bool = Field(True, description="Bias on the vocabulary decoder.")


class ClassificationHeadSpec(Spec):
    """Sequence classification: pool the sequence, optional dense + tanh (or relu), then project."""

    type: Literal["classification"] = "classification"
    n_classes: int = Field(
        2, ge=2, description="Number of classes, at least 2 (softmax cross-entropy: one class always has loss 0)."
    )
    pooling: Literal["first", "mean", "last"] = Field(
        "first", description="first ([CLS], BERT), mean over real tokens, or last real token (GPT)."
    )
    pooler: bool = Field(True, description="A dense layer and its activation before the classifier (BERT's pooler).")
    pooler_activation: Literal["tanh", "relu"] = Field(
        "tanh", description="The pooler's activation: tanh (BERT, RoBERTa) or relu (DistilBERT's pre_classifier)."
    )
    dropout: Dropout = Field(0.0, description="Dropout before the classifier.")
    labels: Annotated[tuple[str, ...], Field(strict=False)] | None = Field(
        None, description="Class names in class order (a Hugging Face id2label); default LABEL_0, LABEL_1, ..."
    )

    @model_validator(mode="after")
    def _labels(self) -> ClassificationHeadSpec:
        if not self.pooler and self.pooler_activation != "tanh":
            raise _issue("pooler_activation", "pooler_activation needs pooler: true (without a pooler there is "
                                              "no activation before the classifier); remove it")
        if self.labels is not None:
            if len(self.labels) != self.n_classes:
                raise _issue("labels", f"{len(self.labels)} labels for n_classes={self.n_classes}: give one name per class")
            repeated = sorted({x for x in self.labels if self.labels.count(x) > 1})
            if repeated:
                raise _issue("labels", f"repeated label names: {', '.join(map(repr, repeated))}; each class needs its own")
        return self


# --------------------------------------------------------------------------- registry

_FAMILY_ENTRIES: dict[str, list[tuple[type, str]]] = {
    "positional": [
        (SinusoidalSpec, "specformer.components.positional:SinusoidalPositional"),
        (LearnedSpec, "specformer.components.positional:LearnedPositional"),
        (RopeSpec, "specformer.components.positional:Rotary"),
        (AlibiSpec, "specformer.components.positional:ALiBi"),
        (T5BiasSpec, "specformer.components.positional:T5RelativeBias"),
        (NoPositionalSpec, "specformer.components.positional:NoPositional"),
    ],
    "attention": [(AttentionSpec, "specformer.components.attention:Attention")],
    "ffn": [
        (MLPSpec, "specformer.components.ffn:MLP"),
        (GLUSpec, "specformer.components.ffn:GLU"),
    ],
    "norm": [
        (LayerNormSpec, "specformer.components.norms:build_layernorm"),
        (RMSNormSpec, "specformer.components.norms:build_rmsnorm"),
    ],
    "head": [
        (LMHeadSpec, "specformer.components.heads:LMHead"),
        (MLMHeadSpec, "specformer.components.heads:MLMHead"),
        (ClassificationHeadSpec, "specformer.components.heads:ClassificationHead"),
    ],
}

for _family, _entries in _FAMILY_ENTRIES.items():
    for _spec, _target in _entries:
        register_builtin(_family, _spec, _target)

# Every built-in type is registered before any plugin loads, the training families' too (by
# importing specformer.specs.training), so a plugin may look one up at import; the unions are
# made after the plugins, so that they hold the plugins' types.
from specformer.specs.training import (  # noqa: E402
    TrainingSpec,
    build_unions,
    fill_training,
    reference_models,
    training_issues,
    warmup_peak,
)
from specformer.specs.training import rebuild_union as training_union  # noqa: E402

load_plugins()
build_unions()

PositionalSpec = family_union("positional")
AttentionFamily = family_union("attention")
FFNSpec = family_union("ffn")
NormSpec = family_union("norm")
HeadSpec = family_union("head")
_UNION_NAMES = {"positional": "PositionalSpec", "attention": "AttentionFamily", "ffn": "FFNSpec",
                "norm": "NormSpec", "head": "HeadSpec"}


def _rebuild_union(family: str) -> None:
    """Make ``family``'s union again with a type registered after this module built it (a
    script's subclass of a spec class it imported from here), and complete every model its
    fields are typed with, each before the models that hold it: the registry calls it."""
    if family in _UNION_NAMES:
        globals()[_UNION_NAMES[family]] = family_union(family)
    else:
        training_union(family)  # and TrainingSpec
    rebuild_models((LayerSpec, LayerOverride, StackSpec, EmbeddingSpec, ModelSpec), tuple(_UNION_NAMES.values()))


# --------------------------------------------------------------------------- blocks


class ResidualSpec(Spec):
    """How sublayers join the residual stream."""

    type: Literal["sequential", "parallel"] = Field(
        "sequential",
        description="sequential: x + attn, then + ffn; parallel (GPT-NeoX, GPT-J, Phi): x + attn(n(x)) + ffn(n(x)).",
    )
    shared_norm: bool = Field(
        False,
        description="Parallel only: one norm feeds every sublayer of a layer (GPT-J, Phi-1/1.5/2); "
        "false: each sublayer has its own (GPT-NeoX).",
    )
    dropout: Dropout = Field(0.0, description="Dropout on each sublayer output before it is added.")


class LayerSpec(Spec):
    """Everything one layer of a stack is built from."""

    attention: AttentionFamily
    cross_attention: AttentionFamily | None = None
    ffn: FFNSpec
    norm: NormSpec
    residual: ResidualSpec


class LayerOverride(Spec):
    """Settings for a subset of layers of a heterogeneous stack.

    Given sub-specs are deep-merged onto the stack's own, so ``{layers: "0-5",
    attention: {sliding_window: 256}}`` keeps every other attention setting.
    """

    layers: tuple[NonNegativeInt, ...] = Field(
        strict=False,  # a YAML list is a tuple here (its items stay strict)
        description='Layer indices: a list [0, 2], a single index, or a range "0-5" (inclusive).'
    )
    attention: AttentionFamily | None = None
    cross_attention: AttentionFamily | None = None
    ffn: FFNSpec | None = None
    norm: NormSpec | None = None
    residual: ResidualSpec | None = None

    @field_validator("layers", mode="before")
    @classmethod
    def _parse_layers(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return (value,)
        if isinstance(value, list | tuple) and not value:
            raise PydanticCustomError(
                "layers_empty", "give at least one layer index: an override of no layer would change nothing"
            )
        if isinstance(value, str):
            lo, sep, hi = value.partition("-")
            try:
                a, b = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                a, b = 0, -1
            if b < a:
                raise PydanticCustomError(
                    "layer_range",
                    'expected a layer index, a list of indices or a range like "0-5" (low to high)',
                    {"value": value},
                )
            if b - a >= MAX_LAYERS:  # refused before the range is made: "0-99999999999"
                raise PydanticCustomError(
                    "layer_range_size",
                    "the range covers {count} layers; a stack has at most {most} (layer indices run "
                    "from 0 to n_layers - 1)",
                    {"value": value, "count": f"{b - a + 1:,}", "most": f"{MAX_LAYERS:,}"},
                )
            return tuple(range(a, b + 1))
        return value


# The deepest published Transformers have about 1,000 layers (DeepNet, Wang et al. 2022).
# Analysis and building are linear in the layers, so a typo such as 1e11 is refused
# here instead of running for hours.
MAX_LAYERS = 10_000


class StackSpec(Spec):
    """A stack of identical (or overridden) layers: an encoder or a decoder."""

    n_layers: PositiveInt = Field(le=MAX_LAYERS, description=f"Number of layers (at most {MAX_LAYERS:,}).")
    attention: AttentionFamily = Field(default_factory=AttentionSpec, description="Self-attention.")
    cross_attention: AttentionFamily | None = Field(
        None,
        description="Decoder of an encoder-decoder only: attention over the encoder output; "
        "the self-attention settings without a sliding window, changed by the fields written here.",
    )
    ffn: FFNSpec = Field(default_factory=MLPSpec, description="Position-wise feed-forward network.")
    norm: NormSpec = Field(default_factory=LayerNormSpec, description="Norm of every sublayer, with its placement.")
    residual: ResidualSpec = Field(default_factory=ResidualSpec, description="Sequential or parallel sublayers.")
    final_dropout: Dropout = Field(
        0.0, description="Dropout on the stack's output, after the final norm (T5 applies its dropout rate there)."
    )
    overrides: tuple[LayerOverride, ...] = Field(
        (), strict=False, description="Per-layer settings for heterogeneous stacks; later entries win."
    )

    def override_issues(self) -> Iterator[tuple[str, str]]:
        """Each override whose layers run past ``n_layers`` (checked with the model's other
        cross-field rules, so that every problem is said at once)."""
        for i, ov in enumerate(self.overrides):
            bad = [j for j in ov.layers if j >= self.n_layers]
            if bad:
                # a range is named as its indices past the stack, not its first one alone ("0-5" on two
                # layers said index 2, which the spec never wrote)
                which = (f"layer index {bad[0]} is" if len(bad) == 1
                         else f"layer indices {bad[0]}-{bad[-1]} are" if bad == list(range(bad[0], bad[-1] + 1))
                         else f"layer indices {', '.join(map(str, bad))} are")
                yield (
                    f"overrides.{i}.layers",
                    f"{which} out of range: the stack has n_layers={self.n_layers} (allowed: 0-{self.n_layers - 1})",
                )

    @property
    def final_norm(self) -> bool:
        """Whether a norm follows the last layer (resolved: never None after validation)."""
        return bool(self.norm.final)

    def layer(self, index: int) -> LayerSpec:
        """The resolved spec of layer ``index`` with every override applied."""
        if not 0 <= index < self.n_layers:
            raise IndexError(f"layer {index} out of range for a {self.n_layers}-layer stack")
        parts: dict[str, Any] = {
            "attention": self.attention,
            "cross_attention": self.cross_attention,
            "ffn": self.ffn,
            "norm": self.norm,
            "residual": self.residual,
        }
        for ov in self.overrides:
            if index in ov.layers:
                for key in parts:
                    value = getattr(ov, key)
                    if value is not None:
                        parts[key] = value
        return LayerSpec(**parts)

    def layers(self) -> Iterator[LayerSpec]:
        for i in range(self.n_layers):
            yield self.layer(i)

    @property
    def is_homogeneous(self) -> bool:
        return not self.overrides


# --------------------------------------------------------------------------- model


class EmbeddingSpec(Spec):
    """Token embeddings and what surrounds them."""

    scale: bool = Field(False, description="Multiply embeddings by sqrt(d_model) (the original paper does).")
    dropout: Dropout = Field(0.0, description="Dropout after embeddings (+ positions).")
    tie_output: bool = Field(True, description="The output projection reuses the token embedding matrix.")
    share_encoder_decoder: bool = Field(
        True, description="Encoder and decoder share one token embedding (encoder-decoder only)."
    )
    share_positions: bool = Field(
        True,
        description="With a shared token embedding, the decoder also shares the position table, "
        "segments and embedding norm; false gives it its own (BART). Encoder-decoder only.",
    )
    segment_vocab_size: NonNegativeInt = Field(
        0, le=MAX_INDEX, description="Segment (token-type) embeddings, as BERT's 2; 0 for none."
    )
    padding_idx: NonNegativeInt | None = Field(
        None,
        description="A token whose row of the table starts at zero and takes no gradient from the lookup "
        "(nn.Embedding's padding_idx; Marian's, whose decoder starts from that token). A tied output layer "
        "still trains it.",
    )
    norm: NormSpec | None = Field(None, description="A norm after the embeddings (BERT has one).")

    @model_validator(mode="after")
    def _norm_fields(self) -> EmbeddingSpec:
        if self.norm is not None and (self.norm.placement != "pre" or self.norm.final is not None):
            raise _issue("norm", "placement and final have no meaning for the embedding norm; remove them")
        if not self.share_positions and not self.share_encoder_decoder:
            raise _issue(
                "share_positions",
                "share_positions: false needs share_encoder_decoder: true (with separate embeddings "
                "the decoder already has its own positions)",
            )
        return self


class InitSpec(Spec):
    """Weight initialisation, applied in one place by the builder."""

    scheme: Literal["normal", "t5"] = Field(
        "normal",
        description=(
            "normal: linear and embedding weights ~ N(0, std) (GPT-2, BERT). t5: T5's init (Raffel et al. "
            "2020; Hugging Face's T5PreTrainedModel): token embeddings and an untied lm output ~ N(0, 1), "
            "T5 bias tables ~ N(0, d_model^-0.5), attention queries ~ N(0, (d_model * head_dim)^-0.5 / "
            "scale), every other linear weight ~ N(0, fan_in^-0.5); it keeps a tied head's logits and the "
            "residual stream on T5's scale."
        ),
    )
    std: PositiveFloat = Field(
        0.02,
        description="Std of the normal init of linear and embedding weights (scheme t5: of learned position "
        "and segment tables only, which T5 has not).",
    )
    scaled_residual: bool = Field(
        True,
        description="Scale the std of projections into the residual stream by 1/sqrt(2 * n_layers) (GPT-2); "
        "default false with scheme t5, which has no such rule.",
    )

    @model_validator(mode="before")
    @classmethod
    def _t5_default(cls, data: Any) -> Any:
        # filled in the raw data, so that a validated spec is complete and round-trips
        if isinstance(data, dict) and data.get("scheme") == "t5" and "scaled_residual" not in data:
            data = {**data, "scaled_residual": False}
        return data

    @model_validator(mode="after")
    def _t5_residual(self) -> InitSpec:
        if self.scheme == "t5" and self.scaled_residual:
            raise _issue(
                "scaled_residual",
                "scaled_residual: true is GPT-2's rule for scheme normal; scheme t5 sets the residual "
                "projections' std from their fan-in (remove scaled_residual or set it false)",
            )
        return self


class ModelSpec(Spec):
    """A whole Transformer: what ``specformer validate`` resolves and ``build_model`` builds."""

    name: str = Field("unnamed", description="A name for tables, run folders and checkpoints. A YAML file "
                      "that writes none is named after the file (rope.yaml: rope), even where it extends a named spec.")
    kind: Kind = Field(description="encoder (BERT-like) | decoder (GPT-like) | encoder-decoder (T5-like).")
    vocab_size: PositiveInt = Field(le=MAX_INDEX, description="Token vocabulary size.")
    d_model: PositiveInt = Field(le=MAX_WIDTH, description="Width of the residual stream.")
    max_seq_len: PositiveInt = Field(1024, le=MAX_INDEX, description="Longest sequence the model is built for.")
    positional: PositionalSpec = Field(
        default_factory=SinusoidalSpec, description="How positions enter the model (shared by all stacks)."
    )
    encoder: StackSpec | None = Field(None, description="The encoder stack (encoder, encoder-decoder).")
    decoder: StackSpec | None = Field(None, description="The decoder stack (decoder, encoder-decoder).")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec, description="Token embeddings and their tying.")
    head: HeadSpec | None = Field(
        None, description="Output head; default mlm for encoders, lm otherwise."
    )
    init: InitSpec = Field(default_factory=InitSpec, description="Weight initialisation.")
    training: TrainingSpec = Field(
        default_factory=TrainingSpec, description="How `specformer train` trains it (see docs/training.md)."
    )

    # ---- derived values are filled in the raw data, before validation, so that a
    # validated spec is complete and ``to_yaml`` round-trips to an equal spec.
    @model_validator(mode="before")
    @classmethod
    def _fill_derived(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _plain(data)
        d_model = data.get("d_model")
        kind = data.get("kind")
        if "head" not in data or data.get("head") is None:
            if kind in ("encoder", "decoder", "encoder-decoder"):
                data["head"] = {"type": "mlm" if kind == "encoder" else "lm"}
        for role in ("encoder", "decoder"):
            stack = data.get(role)
            if not isinstance(stack, dict):
                continue
            _fill_stack(stack, d_model, cross=(role == "decoder" and kind == "encoder-decoder"))
        fill_training(data)
        return data

    # ---- what was written, as against derived: each node's ``model_fields_set`` holds the
    # fields its input gave, so that ``model_copy(update=...)`` (which re-validates what was
    # written, plus the update) derives the sizes again from the new values. Defined after
    # ``_fill_derived``, this validator runs first and sees the data before it is filled.
    @model_validator(mode="wrap")
    @classmethod
    def _record_written(cls, data: Any, handler: ModelWrapValidatorHandler[ModelSpec]) -> ModelSpec:
        spec = handler(data)
        if isinstance(data, dict):
            _mark_written(spec, _plain(data))  # spec objects in it: what they were given
        return spec

    @model_validator(mode="after")
    def _cross_field(self) -> ModelSpec:
        issues = list(self._issues()) or list(self._pattern_issues())
        if issues:
            raise PydanticCustomError(
                "cross_field",
                "; ".join(f"{field}: {msg}" for field, msg in issues),
                {"issues": issues},
            )
        return self

    def _pattern_issues(self) -> Iterator[tuple[str, str]]:
        """training.optimizer's freeze and lr_scale patterns against the model's parameter names,
        when the spec alone gives them (a plugin's type: when the model is built)."""
        optimizer = self.training.optimizer if self.training is not None else None
        if not (getattr(optimizer, "freeze", ()) or getattr(optimizer, "lr_scale", ())):
            return
        from specformer.analysis.params import AnalysisError, parameter_shapes, tied_names
        from specformer.specs.errors import SpecError
        from specformer.specs.training import parameter_plan

        try:
            shapes = parameter_shapes(self)
        except AnalysisError:
            return
        try:
            parameter_plan(optimizer, list(shapes), tied=tied_names(self, shapes))
        except SpecError as exc:
            for problem in exc.problems:
                yield problem.path, f"{problem.message} ({problem.hint})"

    def _issues(self) -> Iterator[tuple[str, str]]:
        pad = self.embedding.padding_idx
        if pad is not None and pad >= self.vocab_size:
            yield "embedding.padding_idx", f"padding_idx={pad} is not a token: vocab_size is {self.vocab_size} (allowed: 0-{self.vocab_size - 1})"
        has = {"encoder": self.encoder is not None, "decoder": self.decoder is not None}
        need = {
            "encoder": {"encoder": True, "decoder": False},
            "decoder": {"encoder": False, "decoder": True},
            "encoder-decoder": {"encoder": True, "decoder": True},
        }[self.kind]
        for role in ("encoder", "decoder"):
            if need[role] and not has[role]:
                article = "an" if role == "encoder" else "a"
                if role in self.model_fields_set:  # written as null: placed where it is
                    yield role, f"kind {self.kind!r} needs {article} {role} stack ({role}: {{n_layers: ...}}), got null"
                else:
                    yield "kind", f"kind {self.kind!r} needs {article} {role} stack ({role}: {{n_layers: ...}})"
            if has[role] and not need[role]:
                yield role, f"kind {self.kind!r} has no {role} stack; remove it or change kind"
        for role, stack in self.stacks():
            for field, message in stack.override_issues():
                yield f"{role}.{field}", message
        for field in ("share_positions", "share_encoder_decoder"):
            if not getattr(self.embedding, field) and self.kind != "encoder-decoder":
                yield (
                    f"embedding.{field}",
                    f"{'an' if self.kind == 'encoder' else 'a'} {self.kind} model has one embedding; "
                    f"{field} applies to encoder-decoders only",
                )
        pos = self.positional
        if isinstance(pos, LearnedSpec) and pos.max_positions is not None:
            if pos.max_positions - pos.offset < self.max_seq_len:
                yield (
                    "positional.max_positions",
                    f"the learned table has {pos.max_positions - pos.offset} usable positions but "
                    f"max_seq_len is {self.max_seq_len}; use max_positions >= {self.max_seq_len + pos.offset}",
                )
        scaling = pos.scaling if isinstance(pos, RopeSpec) else None
        if isinstance(scaling, YarnRopeScaling):
            # transformers warns when max_position_embeddings / original_max_position_embeddings is
            # not the factor (unless it is 1: an original length filled in from the model's own);
            # a shorter max_seq_len uses part of the extended context, a longer one runs past it
            original = scaling.original_max_position_embeddings
            if self.max_seq_len / original > scaling.factor:
                reach = scaling.factor * original
                yield (
                    "positional.scaling.factor",
                    f"YaRN's factor={scaling.factor:g} extends original_max_position_embeddings={original} "
                    f"to {reach:g} positions, but max_seq_len={self.max_seq_len} is longer: its last "
                    "positions would turn the slowest frequencies further than pretraining did; use "
                    f"factor: {self.max_seq_len / original:g} (max_seq_len / original_max_position_embeddings) "
                    f"or a max_seq_len of at most {math.floor(reach)}",
                )
        for role, stack in self.stacks():
            for where, att in _attentions(stack):
                path = f"{role}.{where}"
                if att.head_dim is None:
                    if where != "attention" and not {"n_heads", "head_dim"} & att.model_fields_set:
                        continue  # the heads it inherits: said once, where they are written
                    yield (
                        f"{path}.n_heads",
                        f"d_model={self.d_model} is not divisible by n_heads={att.n_heads}; "
                        "give head_dim explicitly or choose n_heads from "
                        f"{', '.join(str(d) for d in _divisors(self.d_model))}",
                    )
                    continue
                cross = where.startswith("cross") or ".cross" in where
                if cross and att.sliding_window is not None:
                    yield (
                        f"{path}.sliding_window",
                        "cross-attention attends to the whole encoder output; a sliding window applies "
                        "to self-attention only (set it under attention:)",
                    )
                if isinstance(pos, RopeSpec) and not cross:
                    rot = int(att.head_dim * pos.fraction)
                    if rot % 2 or rot == 0:
                        # a head_dim the widths give is named with them: the user wrote those
                        derived = att.head_dim * att.n_heads == self.d_model and "head_dim" not in att.model_fields_set
                        of = f" (d_model={self.d_model} / n_heads={att.n_heads})" if derived else ""
                        message = (f"rotary needs an even, non-zero rotated dimension; head_dim={att.head_dim}{of} "
                                   f"× fraction={pos.fraction} gives {att.head_dim * pos.fraction:g}")
                        if derived and "fraction" not in pos.model_fields_set:
                            # the heads the user wrote are what to change: named with those that work
                            even = [str(n) for n in _divisors(self.d_model)
                                    if (r := int(self.d_model // n * pos.fraction)) and r % 2 == 0]
                            choose = f"choose n_heads from {', '.join(even)}, or " if even else ""
                            yield f"{path}.n_heads", f"{message}: {choose}give head_dim (even) explicitly"
                            continue
                        yield "positional.fraction", message
                    elif isinstance(pos.scaling, LongRopeScaling):
                        for field in ("short_factor", "long_factor"):
                            given = len(getattr(pos.scaling, field))
                            if given != rot // 2:
                                yield (
                                    f"positional.scaling.{field}",
                                    f"{given} factors, but the rotary has {rot // 2} frequencies (head_dim="
                                    f"{att.head_dim} × fraction={pos.fraction} = {rot} rotated features, "
                                    "one frequency per two): give one factor per frequency",
                                )
                    elif rot == 2 and isinstance(pos.scaling, DynamicRopeScaling):
                        yield (
                            "positional.scaling.type",
                            "dynamic scaling raises the base to the power R / (R - 2) of the rotated "
                            f"dimension R, which is 2 here (head_dim={att.head_dim} × fraction={pos.fraction}); "
                            "rotate 4 features or more, or use another scaling",
                        )
            # positions built once per stack, for the stack's own attention sizes
            shared = {RopeSpec: "head_dim", AlibiSpec: "n_heads", T5BiasSpec: "n_heads"}.get(type(pos))
            base = getattr(stack.attention, shared) if shared else None
            for i, ov in enumerate(stack.overrides):
                value = getattr(ov.attention, shared) if shared and ov.attention is not None else base
                if base is not None and value is not None and value != base:
                    yield (
                        f"{role}.overrides.{i}.attention.{shared}",
                        f"{pos.type} positions are built once for the whole stack, for its attention's "
                        f"{shared}={base}, but this override gives {shared}={value}; every layer must share it",
                    )
            if self.kind != "encoder-decoder" or role == "encoder":
                # at the field that sets it: the stack's own, or a per-layer override's
                wheres = ["cross_attention"] if stack.cross_attention is not None else []
                wheres += [f"overrides.{i}.cross_attention" for i, ov in enumerate(stack.overrides)
                           if ov.cross_attention is not None]
                for where in wheres:
                    yield (
                        f"{role}.{where}",
                        "cross-attention exists only in the decoder of an encoder-decoder",
                    )
            residuals = [("residual", stack.residual)] + [
                (f"overrides.{i}.residual", ov.residual) for i, ov in enumerate(stack.overrides) if ov.residual
            ]
            for where, residual in residuals:
                if residual.type == "parallel" and stack.norm.placement != "pre":
                    yield (
                        f"{role}.{where}.type",
                        "a parallel residual is x + attn(norm(x)) + ffn(norm(x)) and needs "
                        f"norm placement pre; {stack.norm.placement}-norm has no parallel form "
                        f"(allowed with {stack.norm.placement}: sequential)",
                    )
                if residual.shared_norm and residual.type != "parallel":
                    yield (
                        f"{role}.{where}.shared_norm",
                        "one norm shared by the sublayers exists only in a parallel residual, where they "
                        "read the same input; set type: parallel, or shared_norm: false",
                    )
            for i, ov in enumerate(stack.overrides):
                if ov.norm is not None and (
                    ov.norm.placement != stack.norm.placement or ov.norm.final != stack.norm.final
                ):
                    yield (
                        f"{role}.overrides.{i}.norm",
                        "placement and final apply to the whole stack; set them in the stack's norm",
                    )
        yield from training_issues(
            self.training, kind=self.kind, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len,
            head=self.head.type if self.head is not None else None,
        )

    # ---- convenience

    def stacks(self) -> Iterator[tuple[str, StackSpec]]:
        """(role, stack) for each stack present, encoder first."""
        if self.encoder is not None:
            yield "encoder", self.encoder
        if self.decoder is not None:
            yield "decoder", self.decoder

    @property
    def n_layers(self) -> int:
        return sum(s.n_layers for _, s in self.stacks())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible data of the fully resolved spec."""
        return self.model_dump(mode="json")

    @classmethod
    def _validated(cls, data: dict[str, Any]) -> ModelSpec:
        # a whole spec's problems read as load_spec's do: field paths, allowed values
        from specformer.specs.loader import load_spec

        return load_spec(data)

    def to_yaml(self, *, modeline: bool = False) -> str:
        """YAML text of the resolved spec; ``load_spec`` of it gives an equal spec."""
        from specformer.specs.loader import dump_yaml

        return dump_yaml(self.to_dict(), modeline=modeline)

    def __str__(self) -> str:
        # print(spec) shows the resolved YAML, as `specformer validate` prints it; repr() stays
        # pydantic's ModelSpec(name=..., ...), unambiguous for debugging; print() ends the line
        return self.to_yaml().rstrip("\n")

    def settings_without_effect(self) -> list[Any]:
        """Settings the spec writes that change nothing in the model it builds, as
        :class:`~specformer.specs.errors.SpecProblem` (valid, and built: ``validate`` says them
        as notes). A rope's ``local_base`` rotates the layers with a sliding window; with none,
        every layer rotates with ``base``, and when every layer has one, ``scaling`` (of ``base``'s
        rotations) scales none. A window past ``max_seq_len`` masks nothing in training; a warmup
        longer than the run never reaches the learning rate. Settings of parts the model lacks:
        the decoder's own positions (``share_positions: false``) with no position table, segments
        or embedding norm to own; segments past row 0 where the forward takes no token types;
        ``init.std`` under T5's scheme with no table it draws; a ``val_fraction`` beside
        ``val_paths``."""
        from specformer.specs.errors import SpecProblem

        problems = []
        pos = self.positional
        if getattr(pos, "local_base", None) is not None and not any(
            layer.attention.sliding_window is not None for _, stack in self.stacks() for layer in stack.layers()
        ):
            problems.append(SpecProblem(
                f"no layer has a sliding window, so local_base={pos.local_base:g} rotates none: every layer rotates "
                f"with base {pos.base:g}",
                path="positional.local_base",
                hint="give the local layers a window (overrides: [{layers: [...], attention: {sliding_window: N}}]) "
                     "or remove local_base",
            ))
        windowed = [layer.attention.sliding_window is not None
                    for _, stack in self.stacks() for layer in stack.layers()]
        if getattr(pos, "local_base", None) is not None and getattr(pos, "scaling", None) is not None and all(windowed):
            problems.append(SpecProblem(
                f"every layer has a sliding window and rotates with local_base={pos.local_base:g}, unscaled, so "
                f"scaling ({pos.scaling.type}, of base {pos.base:g}'s rotations) scales none",
                path="positional.scaling",
                hint="leave some layers without a window (they rotate with base, scaled) or remove scaling",
            ))
        problems.extend(self._parts_not_built())
        for role, stack in self.stacks():
            for where, attention in _attentions(stack):
                window = attention.sliding_window
                if window is not None and window > self.max_seq_len:
                    problems.append(SpecProblem(
                        f"a window of {window} reaches every key of max_seq_len {self.max_seq_len}, so it masks "
                        f"nothing in training; generation past max_seq_len reads up to {window - 1} tokens back, "
                        f"further than any trained distance ({self.max_seq_len - 1})",
                        path=f"{role}.{where}.sliding_window",
                        hint=f"a window below {self.max_seq_len} masks in training, or none for full attention",
                    ))
        t = self.training
        warmup = getattr(getattr(t, "schedule", None), "warmup_steps", 0) or 0
        max_steps = getattr(t, "max_steps", None)
        if max_steps and warmup > max_steps and not getattr(t, "max_epochs", None):
            problems.append(SpecProblem(
                f"warmup_steps={warmup} is above max_steps={max_steps}: the learning rate never reaches "
                f"{warmup_peak(t.schedule, self.d_model)} (it ends at {max_steps / warmup:.2g} of it)",
                path="training.schedule.warmup_steps",
                hint=f"a warmup of at most {max_steps} steps, or more training.max_steps",
            ))
        return problems

    def _parts_not_built(self) -> list[Any]:
        """:meth:`settings_without_effect` of the parts a setting names that the model lacks."""
        from specformer.specs.errors import SpecProblem

        problems = []
        emb, pos = self.embedding, self.positional
        if self.kind == "encoder-decoder" and not emb.share_positions and pos.type != "learned" \
                and not emb.segment_vocab_size and emb.norm is None:
            problems.append(SpecProblem(
                f"share_positions: false gives the decoder its own position table, segments and embedding norm, "
                f"and this spec has none of them (positional {pos.type}, no segments, no embedding norm): "
                "the decoder embeds with the shared token table either way",
                path="embedding.share_positions",
                hint="remove share_positions (BART's own positions need positional.type: learned)",
            ))
        if self.kind != "encoder" and emb.segment_vocab_size > 1:
            problems.append(SpecProblem(
                f"a {self.kind} model's forward takes no token_type_ids, so every token adds row 0 of the "
                f"{emb.segment_vocab_size} segment rows and the other {emb.segment_vocab_size - 1} never train",
                path="embedding.segment_vocab_size",
                hint="segment_vocab_size: 1 (one learned vector added to every token) or 0; token types are "
                     "an encoder's (BERT's)",
            ))
        init = self.init
        if init.scheme == "t5" and "std" in init.model_fields_set and pos.type != "learned" \
                and not emb.segment_vocab_size and not self._plugin_parts():
            problems.append(SpecProblem(
                f"scheme t5 sets every weight's std from its shape; std={init.std:g} draws only learned position "
                f"and segment tables, and this spec has neither (positional {pos.type}, no segments)",
                path="init.std",
                hint="remove std, or scheme: normal to draw every weight with it",
            ))
        data = getattr(self.training, "data", None)
        if getattr(data, "val_paths", None) and "val_fraction" in data.model_fields_set:
            problems.append(SpecProblem(
                f"val_paths holds the validation data, so val_fraction={data.val_fraction:g} holds out nothing: "
                "every example in paths trains",
                path="training.data.val_fraction",
                hint="remove val_fraction, or val_paths to hold out part of paths",
            ))
        return problems

    def _plugin_parts(self) -> bool:
        """Whether a part is built from a plugin's type (which may draw its weights with std)."""
        from specformer.analysis.params import plugin_components

        try:
            return bool(plugin_components(self))
        except Exception:  # noqa: BLE001 - a note is not worth an error
            return True


def _attentions(stack: StackSpec) -> Iterator[tuple[str, AttentionSpec]]:
    yield "attention", stack.attention
    if stack.cross_attention is not None:
        yield "cross_attention", stack.cross_attention
    for i, ov in enumerate(stack.overrides):
        if ov.attention is not None:
            yield f"overrides.{i}.attention", ov.attention
        if ov.cross_attention is not None:
            yield f"overrides.{i}.cross_attention", ov.cross_attention


# --------------------------------------------------------------------------- derivation on raw data


def _plain(value: Any) -> Any:
    """Deep copy to plain containers, dumping any spec objects a Python caller passed (what
    they were given: a stack taken from another spec brings its layers, not its sizes
    derived from that spec's width)."""
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(exclude_unset=True))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return copy.copy(value)


def _mark_written(node: Any, raw: Any) -> None:
    """Set the ``model_fields_set`` of ``node`` and of the spec objects inside it to the
    fields ``raw`` (the input it was validated from) gives: a section the input leaves out
    (a stack's attention filled in with its derived sizes, a decoder's cross-attention
    copied from its self-attention) has none written."""
    if isinstance(node, BaseModel):
        if not isinstance(raw, dict):
            return
        written = {name for name in raw if name in type(node).model_fields}
        object.__setattr__(node, "__pydantic_fields_set__", written)
        for name in type(node).model_fields:
            value = getattr(node, name, None)
            if name in written:
                _mark_written(value, raw[name])
            elif isinstance(value, BaseModel):
                _mark_written(value, {})
            elif isinstance(value, list | tuple):
                for item in value:
                    _mark_written(item, {})
    elif isinstance(node, list | tuple) and isinstance(raw, list) and len(raw) == len(node):
        for item, given in zip(node, raw, strict=True):
            _mark_written(item, given)


def _size(value: Any) -> bool:
    """Whether ``value`` is a width a spec may hold: derived sizes are made from valid ones
    only, so that an error is reported once, at the field that was written."""
    return _is_int(value) and 0 < value <= MAX_WIDTH


def _fill_attention(att: Any, d_model: Any) -> None:
    if not isinstance(att, dict):
        return
    names = REGISTRY.names("attention")
    kind = att.get("type", "mha")
    if kind not in names:
        return  # an unknown type: reported as such, with nothing derived for it
    n_heads = att.get("n_heads", REGISTRY.get("attention", kind).spec.model_fields["n_heads"].default)
    if att.get("n_kv_heads") is None and _size(n_heads):
        att["n_kv_heads"] = n_heads
    if att.get("head_dim") is None and _size(n_heads) and _size(d_model):
        if d_model % n_heads == 0:
            att["head_dim"] = d_model // n_heads
    fields = REGISTRY.get("attention", kind).spec.model_fields
    if "out_bias" in fields and att.get("out_bias") is None and isinstance(att.get("bias", True), bool):
        att["out_bias"] = att.get("bias", fields["bias"].default)


def _fill_ffn(ffn: Any, d_model: Any) -> None:
    if not isinstance(ffn, dict) or ffn.get("d_ff") is not None or not _size(d_model):
        return
    # by the spec class, so that a subclass of MLPSpec or GLUSpec of one's own is sized as its parent
    entry = REGISTRY.entries("ffn").get(ffn.get("type", "mlp"))
    if entry is not None and issubclass(entry.spec, GLUSpec):
        ffn["d_ff"] = default_glu_d_ff(d_model)
    elif entry is not None and issubclass(entry.spec, MLPSpec):
        ffn["d_ff"] = 4 * d_model


# the settings of the query and key norms, which mean nothing without them
_QK_SETTINGS = ("qk_norm_scope", "qk_norm_offset", "qk_norm_eps")


def _without_unused_qk_settings(merged: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``merged`` (inherited settings, then ``given``'s) without the inherited settings of
    query and key norms where ``given`` turns those norms off: a cross-attention or a layer
    override that writes ``qk_norm: none`` does not inherit an error about them."""
    if given.get("qk_norm") == "none":
        for key in _QK_SETTINGS:
            if key not in given:
                merged.pop(key, None)
    return merged


def _fill_stack(stack: dict[str, Any], d_model: Any, *, cross: bool) -> None:
    stack.setdefault("attention", {})
    stack.setdefault("ffn", {})
    stack.setdefault("norm", {})
    if cross and isinstance(stack["attention"], dict):
        # cross-attention follows the self-attention's settings (without its sliding
        # window); what the spec writes for it changes those field by field
        ca = copy.deepcopy(stack["attention"])
        ca.pop("sliding_window", None)
        given = stack.get("cross_attention")
        if given is None:
            stack["cross_attention"] = ca
        elif isinstance(given, dict):
            stack["cross_attention"] = _without_unused_qk_settings(deep_merge(ca, given, "cross_attention"), given)
    # overrides merge onto the stack's settings as written, then everything is derived
    original = copy.deepcopy(stack)
    parts = ("attention", "cross_attention", "ffn", "norm", "residual")
    targets = [stack]
    overrides = stack.get("overrides")
    if isinstance(overrides, list):
        for ov in overrides:
            if not isinstance(ov, dict):
                continue
            for key in parts:
                if isinstance(ov.get(key), dict) and isinstance(original.get(key), dict):
                    merged = deep_merge(original[key], ov[key], key)
                    ov[key] = _without_unused_qk_settings(merged, ov[key]) if "attention" in key else merged
            norm, stack_norm = ov.get("norm"), original.get("norm")
            if isinstance(norm, dict) and isinstance(stack_norm, dict):
                # placement and final are the stack's: a norm of another type keeps them
                for field in ("placement", "final"):
                    if field in stack_norm:
                        norm.setdefault(field, stack_norm[field])
            targets.append(ov)
    placement = stack["norm"].get("placement", "pre") if isinstance(stack["norm"], dict) else "pre"
    for target in targets:
        _fill_attention(target.get("attention"), d_model)
        _fill_attention(target.get("cross_attention"), d_model)
        _fill_ffn(target.get("ffn"), d_model)
        norm = target.get("norm")
        if isinstance(norm, dict) and norm.get("final") is None:
            norm["final"] = placement != "post"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# the training section's models, for the field reference of docs/spec.md
REFERENCE_EXTRA = reference_models()

# every model is defined: a type registered from now on makes its family's union again
REGISTRY.rebuild_union = _rebuild_union
