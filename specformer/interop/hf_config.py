"""Hugging Face ``config.json`` <-> :class:`~specformer.specs.schema.ModelSpec`, both ways.

Import reads a plain dict (a ``config.json``, or ``PretrainedConfig.to_dict()``), so it
needs no ``transformers``; every option of a supported family is either mapped to a spec
field or refused with :class:`HFConversionError` naming the option, so an import never
yields a silently different model. Defaults of absent keys are those of the Hugging Face
config classes. The config's ``architectures`` (the model class) picks the head: the
family's own, BERT's and RoBERTa's sequence classification, or a refusal naming the class.

Export picks the family from the spec's structure, writes its config dict and re-imports
it: any field whose value does not come back equal has no equivalent in that family and
is reported by name (dropout rates and initialisation, which do not change what a trained
model computes, are reported as warnings instead).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specformer.analysis.params import as_spec
from specformer.specs.loader import problems_from_validation
from specformer.specs.schema import ModelSpec

__all__ = [
    "HFConversionError",
    "SUPPORTED_MODEL_TYPES",
    "EXPORTED_AS",
    "MULTIMODAL",
    "read_hf_config",
    "spec_from_hf_config",
    "misspelt_config_keys",
    "hf_config_from_spec",
    "hf_family",
    "export_family",
]


class HFConversionError(ValueError):
    """A Hugging Face config, checkpoint or spec that cannot be converted exactly."""


# HF activation names -> specformer activations. gelu_new, gelu_fast and
# gelu_pytorch_tanh are the same tanh approximation written three ways.
_ACT_IN = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}

# the rope_types that import, as positional.scaling types
_ROPE_SCALING = ("linear", "llama3", "yarn", "dynamic", "longrope")


class _ReadKeys(dict):
    """A config dict that records every key looked up in it (``get``, ``[]``, ``in``)."""

    def __init__(self, data: Mapping[str, Any]):
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)


class _Config:
    """Read access to a config dict that records which keys were read."""

    def __init__(self, data: Mapping[str, Any], family: str):
        self.data = _ReadKeys(data)
        self.family = family

    def misspelt(self) -> list[tuple[str, str]]:
        """(key, the key it looks like) for each key of the config that no reading asked for
        and that is one slip from a key the import asked for and the config lacks (whose
        default it took): ``hiden_size`` for ``hidden_size``."""
        import difflib

        wanted = sorted(k for k in self.data.read if isinstance(k, str) and self.data.get(k) is None)
        out = []
        for key in sorted(k for k in dict.keys(self.data) if k not in self.data.read):
            close = difflib.get_close_matches(key, wanted, n=1, cutoff=0.85)
            if close:
                out.append((key, close[0]))
        return out

    def __call__(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key, default)
        return default if value is None else value

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def refuse(self, feature: str, why: str = "") -> HFConversionError:
        extra = f" ({why})" if why else ""
        return HFConversionError(
            f"{self.family} config: {feature} has no specformer equivalent{extra}; "
            "importing it would give a different model"
        )

    def refuse_if(self, key: str, bad: Callable[[Any], bool], why: str, default: Any = None) -> None:
        value = self(key, default)
        if bad(value):
            raise self.refuse(f"{key}={value!r}", why)

    def activation(self, key: str, default: str) -> str:
        name = self(key, default)
        if name not in _ACT_IN:
            raise HFConversionError(
                f"{self.family} config: activation {key}={name!r} is not supported "
                f"(supported: {', '.join(sorted(_ACT_IN))})"
            )
        return _ACT_IN[name]

    def rope(self, default_theta: float = 10000.0, default_fraction: float = 1.0) -> dict[str, Any]:
        """Rotary settings from ``rope_parameters`` (transformers 5) or the older
        ``rope_theta`` / ``rope_scaling`` / ``rotary_pct`` / ``rotary_emb_base`` keys."""
        params = dict(self("rope_parameters", {}) or {})
        scaling = self("rope_scaling")
        if isinstance(scaling, Mapping):
            params = {**scaling, **params}
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in (None, "default", *_ROPE_SCALING):
            raise self.refuse(
                f"rope scaling {rope_type!r}",
                f"rope_type {', '.join(repr(t) for t in ('default', *_ROPE_SCALING))} import",
            )
        theta = params.get("rope_theta", self("rope_theta", self("rotary_emb_base", default_theta)))
        fraction = params.get(
            "partial_rotary_factor", self("partial_rotary_factor", self("rotary_pct", default_fraction))
        )
        rope = {"type": "rope", "base": float(theta), "fraction": float(fraction)}
        if rope_type in _ROPE_SCALING:
            rope["scaling"] = self._rope_scaling(rope_type, params)
        return rope

    def full_rope(self, family: str) -> dict[str, Any]:
        """:meth:`rope` of a family that rotates every feature of a head: a rotary share is refused."""
        rope = self.rope()
        if rope.pop("fraction") != 1.0:
            raise self.refuse("partial_rotary_factor", f"{family} rotates every feature of a head")
        return rope

    def _rope_scaling(self, rope_type: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The spec's ``positional.scaling`` for a scaled rope_type, with the defaults
        transformers fills in (an original context of max_position_embeddings, YaRN's and
        LongRoPE's factor from the two lengths, YaRN's betas 32 and 1)."""
        def get(key: str, default: Any = None) -> Any:
            value = params.get(key)
            return default if value is None else value

        out: dict[str, Any] = {"type": rope_type}
        if rope_type == "dynamic":
            # transformers grows the base past max_position_embeddings, whatever else the config says
            out["original_max_position_embeddings"] = self("max_position_embeddings")
        elif rope_type != "linear":
            # Phi-3 writes the pretraining length beside rope_scaling; transformers prefers it
            original = self("original_max_position_embeddings", get("original_max_position_embeddings"))
            out["original_max_position_embeddings"] = original or self("max_position_embeddings")
        factor = get("factor")
        if factor is None and rope_type in ("yarn", "longrope") and out["original_max_position_embeddings"]:
            factor = self("max_position_embeddings", 0) / out["original_max_position_embeddings"]
        if factor is None:
            raise HFConversionError(f"{self.family} config: rope scaling {rope_type!r} has no factor")
        out["factor"] = float(factor)
        if rope_type == "llama3":
            for key in ("low_freq_factor", "high_freq_factor"):
                if get(key) is None:
                    raise HFConversionError(f"{self.family} config: rope scaling 'llama3' has no {key}")
                out[key] = float(get(key))
        elif rope_type == "yarn":
            # transformers reads a beta of 0 as its default, and a mscale of 0 as unset
            out["beta_fast"] = float(get("beta_fast") or 32.0)
            out["beta_slow"] = float(get("beta_slow") or 1.0)
            for key in ("mscale", "mscale_all_dim"):
                if get(key):
                    out[key] = float(get(key))
            if get("attention_factor") is not None:
                out["attention_factor"] = float(get("attention_factor"))
            out["truncate"] = bool(get("truncate", True))
        elif rope_type == "longrope":
            for key in ("short_factor", "long_factor"):
                if get(key) is None:
                    raise HFConversionError(f"{self.family} config: rope scaling 'longrope' has no {key}")
                out[key] = [float(x) for x in get(key)]
            if get("attention_factor") is not None:
                out["attention_factor"] = float(get("attention_factor"))
        return out


def _dropout(value: Any) -> float:
    return float(value or 0.0)


# --------------------------------------------------------------------------- families: HF -> spec


# OPT's position table starts 2 rows in (its rows 0 and 1 are read only for padding)
_OPT_OFFSET = 2


def _opt(c: _Config) -> dict[str, Any]:
    """OPT: GPT-2's decoder with separate q/k/v, ReLU, positions offset by 2 and no dropout
    on the embeddings; post-norm where ``do_layer_norm_before`` is false (no final norm)."""
    d = c("hidden_size", 768)
    c.refuse_if("word_embed_proj_dim", lambda v: v != d, "a projection between the embeddings and the "
                "model width (OPT-350m); specformer's embeddings have the model's width", d)
    c.refuse_if("layer_norm_elementwise_affine", lambda v: not v, "LayerNorms without a gain and bias", True)
    c.refuse_if("layerdrop", bool, "skipping whole layers at random in training", 0.0)
    pre = bool(c("do_layer_norm_before", True))
    bias = bool(c("enable_bias", True))
    n_pos = c("max_position_embeddings", 2048)
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 50272),
        "d_model": d,
        "max_seq_len": n_pos,
        "positional": {"type": "learned", "max_positions": n_pos + _OPT_OFFSET, "offset": _OPT_OFFSET},
        "decoder": {
            "n_layers": c("num_hidden_layers", 12),
            "attention": {"n_heads": c("num_attention_heads", 12), "bias": bias,
                          "dropout": _dropout(c("attention_dropout", 0.0))},
            "ffn": {"type": "mlp", "d_ff": c("ffn_dim", 3072),
                    "activation": c.activation("activation_function", "relu"), "bias": bias},
            "norm": {"type": "layernorm", "placement": "pre" if pre else "post", "eps": 1e-5,
                     "final": pre and not c("_remove_final_layer_norm", False)},
            "residual": {"type": "sequential", "dropout": _dropout(c("dropout", 0.1))},
        },
        "embedding": {"tie_output": c("tie_word_embeddings", True), "dropout": 0.0},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("init_std", 0.02), "scaled_residual": False},
    }



def _bloom(c: _Config) -> dict[str, Any]:
    """BLOOM: ALiBi, a LayerNorm on the embeddings, pre-LayerNorm blocks with biases, a GELU
    (tanh) MLP four times as wide, tied embeddings; no position table, so its length is the
    ``seq_length`` it was trained at (2048 where the config does not say)."""
    c.refuse_if("apply_residual_connection_post_layernorm", bool,
                "the residual stream taken after each block's input norm", False)
    if c("slow_but_exact", False) and c("pretraining_tp", 1) > 1:
        # transformers then computes the attention output and the MLP's down projection in
        # pretraining_tp slices with F.linear, leaving both layers' biases out
        raise c.refuse(f"slow_but_exact=True with pretraining_tp={c('pretraining_tp')}",
                       "transformers then leaves out the biases of self_attention.dense and mlp.dense_4h_to_h, "
                       "which the checkpoint holds; set slow_but_exact to false for the model with them")
    d = c("hidden_size", c("n_embed", 64))
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 250880),
        "d_model": d,
        "max_seq_len": c("seq_length", 2048),
        "positional": {"type": "alibi"},
        "decoder": {
            "n_layers": c("n_layer", c("num_hidden_layers", 2)),
            "attention": {"n_heads": c("n_head", c("num_attention_heads", 8)), "bias": True,
                          "dropout": _dropout(c("attention_dropout", 0.0))},
            "ffn": {"type": "mlp", "d_ff": 4 * d, "activation": "gelu_tanh", "bias": True},
            "norm": {"type": "layernorm", "placement": "pre", "eps": c("layer_norm_epsilon", 1e-5)},
            "residual": {"type": "sequential", "dropout": _dropout(c("hidden_dropout", 0.0))},
        },
        "embedding": {"tie_output": c("tie_word_embeddings", True), "dropout": 0.0,
                      "norm": {"type": "layernorm", "eps": c("layer_norm_epsilon", 1e-5)}},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


def _gpt2(c: _Config) -> dict[str, Any]:
    c.refuse_if("scale_attn_by_inverse_layer_idx", bool, "attention scores divided by the layer index", False)
    c.refuse_if("add_cross_attention", bool, "cross-attention in a decoder-only model", False)
    d = c("n_embd", 768)
    att: dict[str, Any] = {"n_heads": c("n_head", 12), "bias": True, "dropout": _dropout(c("attn_pdrop", 0.1))}
    if not c("scale_attn_weights", True):
        att["scale"] = 1.0
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 50257),
        "d_model": d,
        "max_seq_len": c("n_positions", 1024),
        "positional": {"type": "learned"},
        "decoder": {
            "n_layers": c("n_layer", 12),
            "attention": att,
            "ffn": {
                "type": "mlp",
                "d_ff": c("n_inner", 4 * d),
                "activation": c.activation("activation_function", "gelu_new"),
                "bias": True,
            },
            "norm": {"type": "layernorm", "placement": "pre", "eps": c("layer_norm_epsilon", 1e-5)},
            "residual": {"type": "sequential", "dropout": _dropout(c("resid_pdrop", 0.1))},
        },
        "embedding": {"tie_output": c("tie_word_embeddings", True), "dropout": _dropout(c("embd_pdrop", 0.1))},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": True},
    }


def _gpt_bigcode(c: _Config) -> dict[str, Any]:
    """GPT-BigCode (StarCoder 1, SantaCoder): GPT-2's decoder with one key/value head
    (``multi_query``, the default) or one per query head, and linear layers where GPT-2 has
    Conv1D."""
    raw = _gpt2(c)
    att = raw["decoder"]["attention"]
    att["n_kv_heads"] = 1 if c("multi_query", True) else att["n_heads"]
    raw["decoder"]["ffn"]["activation"] = c.activation("activation_function", "gelu_pytorch_tanh")
    return raw


def _bert_like(c: _Config, *, roberta: bool, default_vocab: int | None = None) -> dict[str, Any]:
    """BERT and RoBERTa (and XLM-RoBERTa: RoBERTa's model under another name, whose config
    class defaults to BERT's vocabulary size, ``default_vocab``)."""
    c.refuse_if(
        "position_embedding_type",
        lambda v: v != "absolute",
        "only absolute learned positions are supported",
        "absolute",
    )
    c.refuse_if("is_decoder", bool, "a causal BERT decoder", False)
    c.refuse_if("add_cross_attention", bool, "cross-attention in an encoder", False)
    eps = c("layer_norm_eps", 1e-12)
    act = c.activation("hidden_act", "gelu")
    n_pos = c("max_position_embeddings", 512)
    positional: dict[str, Any] = {"type": "learned"}
    max_seq_len = n_pos
    if roberta:
        # RoBERTa counts positions from padding_idx + 1; rows 0..padding_idx are never read
        offset = c("pad_token_id", 1) + 1
        positional = {"type": "learned", "max_positions": n_pos, "offset": offset}
        max_seq_len = n_pos - offset
    hidden_dropout = _dropout(c("hidden_dropout_prob", 0.1))
    return {
        "kind": "encoder",
        "vocab_size": c("vocab_size", default_vocab or (50265 if roberta else 30522)),
        "d_model": c("hidden_size", 768),
        "max_seq_len": max_seq_len,
        "positional": positional,
        "encoder": {
            "n_layers": c("num_hidden_layers", 12),
            "attention": {
                "n_heads": c("num_attention_heads", 12),
                "bias": True,
                "dropout": _dropout(c("attention_probs_dropout_prob", 0.1)),
            },
            "ffn": {"type": "mlp", "d_ff": c("intermediate_size", 3072), "activation": act, "bias": True},
            "norm": {"type": "layernorm", "placement": "post", "eps": eps},
            "residual": {"type": "sequential", "dropout": hidden_dropout},
        },
        "embedding": {
            "tie_output": c("tie_word_embeddings", True),
            "dropout": hidden_dropout,
            "segment_vocab_size": c("type_vocab_size", 2),
            "norm": {"type": "layernorm", "eps": eps},
        },
        # RobertaLMHead applies gelu whatever hidden_act says; BertLMPredictionHead uses hidden_act
        "head": {"type": "mlm", "activation": "gelu" if roberta else act, "eps": eps, "bias": True},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


# every LayerNorm of transformers' DistilBERT
_DISTILBERT_EPS = 1e-12


def _distilbert(c: _Config) -> dict[str, Any]:
    """DistilBERT: BERT's post-norm encoder without token types, every LayerNorm's eps 1e-12
    (fixed in transformers' code), the FFN's activation in the masked-LM head too."""
    c.refuse_if("sinusoidal_pos_embds", bool, "fixed sinusoidal rows in a position table that "
                "transformers does not train; specformer's learned table would train them", False)
    d, act = c("dim", 768), c.activation("activation", "gelu")
    dropout = _dropout(c("dropout", 0.1))
    return {
        "kind": "encoder",
        "vocab_size": c("vocab_size", 30522),
        "d_model": d,
        "max_seq_len": c("max_position_embeddings", 512),
        "positional": {"type": "learned"},
        "encoder": {
            "n_layers": c("n_layers", 6),
            "attention": {"n_heads": c("n_heads", 12), "bias": True,
                          "dropout": _dropout(c("attention_dropout", 0.1))},
            "ffn": {"type": "mlp", "d_ff": c("hidden_dim", 4 * d), "activation": act, "bias": True},
            "norm": {"type": "layernorm", "placement": "post", "eps": _DISTILBERT_EPS},
            # DistilBERT drops the FFN's output only; specformer's residual dropout, both
            # sublayers' (a difference in training alone: docs/interop.md)
            "residual": {"type": "sequential", "dropout": dropout},
        },
        "embedding": {
            "tie_output": c("tie_word_embeddings", True),
            "dropout": dropout,
            "norm": {"type": "layernorm", "eps": _DISTILBERT_EPS},
        },
        "head": {"type": "mlm", "activation": act, "eps": _DISTILBERT_EPS, "bias": True},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


# defaults of transformers' T5Config and MT5Config for the keys a config may omit
_T5_DEFAULTS = {"vocab_size": 32128, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "feed_forward_proj": "relu"}
_MT5_DEFAULTS = {"vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6,
                 "feed_forward_proj": "gated-gelu"}


def _t5(c: _Config, family: str = "t5") -> dict[str, Any]:
    """T5 v1.0 and v1.1, and mT5 (T5 v1.1's model under another name: ``MT5ForConditionalGeneration``
    never scales the decoder output, whatever ``tie_word_embeddings`` says)."""
    mt5 = family == "mt5"
    defaults = _MT5_DEFAULTS if mt5 else _T5_DEFAULTS
    proj = c("feed_forward_proj", defaults["feed_forward_proj"])
    gated, _, act_name = proj.rpartition("-")
    if gated not in ("", "gated"):
        raise HFConversionError(f"{family} config: feed_forward_proj={proj!r} is not 'ACT' or 'gated-ACT'")
    if proj == "gated-gelu":  # T5 v1.1 means the tanh approximation here
        act_name = "gelu_new"
    if act_name not in _ACT_IN:
        raise c.refuse(f"feed_forward_proj={proj!r}", f"supported activations: {', '.join(sorted(_ACT_IN))}")
    act = _ACT_IN[act_name]
    dropout = _dropout(c("dropout_rate", 0.1))
    tied = c("tie_word_embeddings", True) is not False
    # transformers >= 5 keeps "scale the decoder output by d_model^-0.5" apart from tying
    scale = False if mt5 else c("scale_decoder_outputs", tied)
    ffn: dict[str, Any] = {
        "type": "glu" if gated else "mlp",
        "d_ff": c("d_ff", defaults["d_ff"]),
        "activation": act,
        "bias": False,
        "dropout": dropout,
    }

    def stack(n_layers: int) -> dict[str, Any]:
        return {
            "n_layers": n_layers,
            "attention": {
                "n_heads": c("num_heads", defaults["num_heads"]),
                "head_dim": c("d_kv", 64),
                "bias": False,
                "scale": 1.0,
                "dropout": dropout,
            },
            "ffn": dict(ffn),
            "norm": {"type": "rmsnorm", "placement": "pre", "eps": c("layer_norm_epsilon", 1e-6)},
            "residual": {"type": "sequential", "dropout": dropout},
            "final_dropout": dropout,
        }

    n_layers = c("num_layers", defaults["num_layers"])
    return {
        "kind": "encoder-decoder",
        "vocab_size": c("vocab_size", defaults["vocab_size"]),
        "d_model": c("d_model", 512),
        # T5 has no position limit; released configs record the training length as n_positions
        "max_seq_len": c("n_positions", 512),
        "positional": {
            "type": "t5",
            "num_buckets": c("relative_attention_num_buckets", 32),
            "max_distance": c("relative_attention_max_distance", 128),
        },
        "encoder": stack(n_layers),
        "decoder": stack(c("num_decoder_layers", n_layers)),
        "embedding": {"tie_output": tied, "share_encoder_decoder": True, "dropout": dropout},
        "head": {"type": "lm", "bias": False, "scale_input": bool(scale)},
        "init": {"scheme": "t5"},  # T5PreTrainedModel's per-matrix stds
    }


def _bart(c: _Config, marian: bool = False) -> dict[str, Any]:
    """BART, and Marian (MarianMT, the opus-mt models): BART's post-norm layers with fixed
    sinusoidal positions in halves, no embedding LayerNorm, and an output bias
    (``final_logits_bias``)."""
    if marian:
        c.refuse_if("share_encoder_decoder_embeddings", lambda v: not v, "a decoder vocabulary of its own "
                    "(decoder_vocab_size); specformer's encoder and decoder read one token table", True)
    d = c("d_model", 1024)
    act = c.activation("activation_function", "gelu")
    dropout = _dropout(c("dropout", 0.1))

    def stack(role: str) -> dict[str, Any]:
        return {
            "n_layers": c(f"{role}_layers", 12),
            "attention": {
                "n_heads": c(f"{role}_attention_heads", 16),
                "bias": True,
                "dropout": _dropout(c("attention_dropout", 0.0)),
            },
            "ffn": {
                "type": "mlp",
                "d_ff": c(f"{role}_ffn_dim", 4096),
                "activation": act,
                "bias": True,
                "dropout": _dropout(c("activation_dropout", 0.0)),
            },
            "norm": {"type": "layernorm", "placement": "post", "eps": 1e-5},
            "residual": {"type": "sequential", "dropout": dropout},
        }

    n_pos = c("max_position_embeddings", 1024)
    tied = c("tie_word_embeddings", True)
    if marian:
        vocab = c("vocab_size", 58101)
        pad = c("pad_token_id", 58100)
        pad = pad if isinstance(pad, int) and 0 <= pad < vocab else None  # transformers builds no other
        return {
            "kind": "encoder-decoder",
            "vocab_size": vocab,
            "d_model": d,
            "max_seq_len": n_pos,
            "positional": {"type": "sinusoidal", "layout": "halves"},
            "encoder": stack("encoder"),
            "decoder": stack("decoder"),
            # tied, one token table serves both stacks and the output layer; untied,
            # transformers 5 gives each of the three its own (as BART's)
            # the padding token's row takes no gradient from the lookup: the decoder starts from it
            "embedding": {"scale": bool(c("scale_embedding", False)), "tie_output": tied,
                          "share_encoder_decoder": tied, "dropout": dropout, "padding_idx": pad},
            "head": {"type": "lm", "bias": True},  # final_logits_bias: Marian's output bias
            "init": {"std": c("init_std", 0.02), "scaled_residual": False},
        }
    return {
        "kind": "encoder-decoder",
        "vocab_size": c("vocab_size", 50265),
        "d_model": d,
        "max_seq_len": n_pos,
        # BART's tables have 2 extra leading rows (a fairseq leftover)
        "positional": {"type": "learned", "max_positions": n_pos + 2, "offset": 2},
        "encoder": stack("encoder"),
        "decoder": stack("decoder"),
        # tied, one token table serves both stacks and the output layer; untied,
        # transformers 5 gives each of the three its own
        "embedding": {
            "scale": bool(c("scale_embedding", False)),
            "tie_output": tied,
            "share_encoder_decoder": tied,
            **({"share_positions": False} if tied else {}),
            "dropout": dropout,
            "norm": {"type": "layernorm", "eps": 1e-5},
        },
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("init_std", 0.02), "scaled_residual": False},
    }


# defaults of transformers' config classes of the Llama-like families for the keys a
# config may omit (save_pretrained writes only the values that differ from them)
_LLAMA_DEFAULTS = {"intermediate_size": 11008, "max_position_embeddings": 2048, "num_key_value_heads": None,
                   "vocab_size": 32000, "head_dim": None}
_MISTRAL_DEFAULTS = {"intermediate_size": 14336, "max_position_embeddings": 4096 * 32, "num_key_value_heads": 8,
                     "vocab_size": 32000, "head_dim": None}
_QWEN3_DEFAULTS = {"intermediate_size": 22016, "max_position_embeddings": 32768, "num_key_value_heads": 32,
                   "vocab_size": 151936, "head_dim": 128}
_QWEN2_DEFAULTS = {**_QWEN3_DEFAULTS, "head_dim": None}
_PHI3_DEFAULTS = {"intermediate_size": 8192, "max_position_embeddings": 4096, "num_key_value_heads": None,
                  "vocab_size": 32064, "head_dim": None, "hidden_size": 3072, "rms_norm_eps": 1e-5}
_GEMMA_DEFAULTS = {"intermediate_size": 24576, "max_position_embeddings": 8192, "num_key_value_heads": 16,
                   "vocab_size": 256000, "head_dim": 256, "hidden_size": 3072, "num_attention_heads": 16,
                   "num_hidden_layers": 28, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"}
_GEMMA2_DEFAULTS = {"intermediate_size": 9216, "max_position_embeddings": 8192, "num_key_value_heads": 4,
                    "vocab_size": 256000, "head_dim": 256, "hidden_size": 2304, "num_attention_heads": 8,
                    "num_hidden_layers": 26, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh"}
_OLMO2_DEFAULTS = {"intermediate_size": 11008, "max_position_embeddings": 2048, "num_key_value_heads": None,
                   "vocab_size": 50304, "head_dim": None, "rms_norm_eps": 1e-5}
_OLMO_DEFAULTS = {"intermediate_size": 11008, "max_position_embeddings": 2048, "num_key_value_heads": None,
                  "vocab_size": 50304, "head_dim": None}
_LLAMA_LIKE_DEFAULTS = {"llama": _LLAMA_DEFAULTS, "olmo": _OLMO_DEFAULTS, "olmo2": _OLMO2_DEFAULTS,
                        "mistral": _MISTRAL_DEFAULTS,
                        "qwen2": _QWEN2_DEFAULTS, "qwen3": _QWEN3_DEFAULTS, "phi3": _PHI3_DEFAULTS, "gemma": _GEMMA_DEFAULTS,
                        "gemma2": _GEMMA2_DEFAULTS,
                        "gemma3_text": {**_GEMMA2_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072}}


def _qwen_windows(c: _Config, n_layers: int) -> list[int | None]:
    """Each layer's sliding window as transformers' Qwen2 and Qwen3 compute it: ``sliding_window``
    (4096 when absent) only with ``use_sliding_window``, and only in the layers that
    ``layer_types`` says slide (by default those from ``max_window_layers`` on)."""
    window = c.data.get("sliding_window", 4096) if c("use_sliding_window", False) else None
    return _windows_by_type(c, n_layers, window, lambda i: window is not None and i >= c("max_window_layers", 28))


def _windows_by_type(c: _Config, n_layers: int, window: int | None, slides: Callable[[int], bool]
                     ) -> list[int | None]:
    """``window`` in the layers ``layer_types`` marks ``sliding_attention`` (by default those
    for which ``slides(i)``), None in the others."""
    types = c("layer_types") or ["sliding_attention" if slides(i) else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers:
        raise HFConversionError(
            f"{c.family} config: layer_types has {len(types)} entries for num_hidden_layers={n_layers}"
        )
    return [window if kind == "sliding_attention" else None for kind in types]


def _gemma2_windows(c: _Config, n_layers: int, pattern: int = 2) -> list[int | None]:
    """Each layer's sliding window as transformers' Gemma 2 and 3 compute it:
    ``sliding_window`` (4096 when absent) in the layers ``layer_types`` says slide, by
    default all but every ``pattern``-th (Gemma 2: every other one from the first; Gemma 3:
    ``sliding_window_pattern``, 6, five windowed layers to one global)."""
    pattern = c("sliding_window_pattern", c("_sliding_window_pattern", pattern))
    return _windows_by_type(c, n_layers, c.data.get("sliding_window", 4096), lambda i: bool((i + 1) % pattern))


def _gemma3_rope(c: _Config) -> dict[str, Any]:
    """Gemma 3's rotary settings: the global layers' (``rope_parameters["full_attention"]``,
    or the older ``rope_theta``, 1e6, and ``rope_scaling``) with the windowed layers' base as
    ``local_base`` (``rope_parameters["sliding_attention"]``, or ``rope_local_base_freq``, 1e4)."""
    params = c("rope_parameters") or {}
    if isinstance(params, Mapping) and "full_attention" in params:
        rope = _Config({"rope_parameters": params["full_attention"]}, c.family).rope(default_theta=1e6)
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise c.refuse(f"rope scaling {local['rope_type']!r} of the sliding layers",
                           "specformer's windowed layers rotate unscaled (local_base)")
        rope["local_base"] = float(local.get("rope_theta", 10000.0))
        return rope
    rope = c.rope(default_theta=1e6)
    rope["local_base"] = float(c("rope_local_base_freq", 10000.0))
    return rope


def _llama(c: _Config, family: str = "llama") -> dict[str, Any]:
    """Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma and Gemma 2. transformers' Llama has no sliding window (a
    ``sliding_window`` key is ignored); its Mistral windows every layer by ``sliding_window``
    (4096 when the key is absent, none when it is null) and ignores ``use_sliding_window``
    and ``layer_types``, and has no biases. Qwen2 is Llama with biases on the query, key and
    value projections but not the output one, and windows in the layers ``layer_types``
    names; Qwen3 has, instead of those biases, an RMSNorm over each query and key head
    before the rotation (``q_norm``, ``k_norm``) and a head_dim of its own (128 by default).
    Neither has FFN biases. Phi-3 is Llama with its q, k, v projections in one matrix and
    its gate and up projections in another (names only), no biases, ``sliding_window`` (none
    when absent) on every layer, a rotary share it honours (``partial_rotary_factor``:
    Phi-4-mini rotates 75%), and ``resid_pdrop`` on both branches. Gemma (the first) is
    Llama with RMSNorms whose gain is ``1 + weight`` (``norm.offset: 1``), embeddings scaled by
    sqrt(hidden_size), GELU (tanh) gates (its legacy ``hidden_act: gelu`` means that too), a
    head_dim of 256 and tied embeddings by default. Gemma 2 adds a norm on each sublayer's
    output (sandwich), soft-capped scores and logits, scores scaled by
    ``query_pre_attn_scalar``^-1/2, and a window on the layers ``layer_types`` names (every
    other one by default). OLMo 2 is Llama with a norm on each sublayer's output and none
    before it (``norm.placement: output``), and query and key norms over the whole
    projection (``qk_norm_scope: all``). OLMo (the first) is Llama with LayerNorms that have
    neither gain nor bias, at eps 1e-5 (``norm: {type: layernorm, weight: false, bias: false}``);
    its ``clip_qkv`` (OLMo-7B-0424's), which clamps the projections, is refused. The import
    computes what transformers computes."""
    mistral, qwen2, qwen3, phi3, gemma3, olmo2, olmo = (
        family == f for f in ("mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "olmo2", "olmo"))
    gemma2 = family in ("gemma2", "gemma3_text")  # Gemma 3 has Gemma 2's sandwich norms, scalar and caps
    gemma = family in ("gemma", "gemma2", "gemma3_text")
    defaults = _LLAMA_LIKE_DEFAULTS[family]
    d = c("hidden_size", defaults.get("hidden_size", 4096))
    n_heads = c("num_attention_heads", defaults.get("num_attention_heads", 32))
    # a key written as null takes the query heads; an absent one the config class's default
    kv_heads = c.data["num_key_value_heads"] if "num_key_value_heads" in c.data else defaults["num_key_value_heads"]
    if "num_key_value_heads" not in c.data and kv_heads and n_heads % kv_heads:
        raise HFConversionError(
            f"{family} config: it has no num_key_value_heads, for which {family}'s config class takes {kv_heads}, "
            f"and {kv_heads} does not divide num_attention_heads={n_heads}: write the model's num_key_value_heads "
            "in config.json"
        )
    n_layers = c("num_hidden_layers", defaults.get("num_hidden_layers", 32))
    eps = c("rms_norm_eps", defaults.get("rms_norm_eps", 1e-6))
    att: dict[str, Any] = {
        "n_heads": n_heads,
        "n_kv_heads": kv_heads or n_heads,
        "head_dim": c("head_dim", defaults["head_dim"] or d // n_heads),
        "bias": bool(c("attention_bias", False)) and not (mistral or phi3),
        "dropout": _dropout(c("attention_dropout", 0.0)),
    }
    if qwen2:  # biases on q, k and v, whatever the config says, none on the output
        att.update(bias=True, out_bias=False)
    if mistral:
        att["sliding_window"] = c.data.get("sliding_window", 4096)  # null: no window
    if phi3:
        att["sliding_window"] = c("sliding_window")
    overrides: list[dict[str, Any]] = []
    if qwen3 or gemma3 or olmo2:
        att.update(qk_norm="rmsnorm", qk_norm_eps=eps)  # the stack's eps, as transformers gives them
        if gemma3:  # Gemma's (1 + weight) gains there too
            att["qk_norm_offset"] = 1.0
        if olmo2:  # one norm over all the heads' features
            att["qk_norm_scope"] = "all"
    if gemma2:
        # scores scaled by query_pre_attn_scalar^-0.5 and soft-capped; Gemma 2's default scalar
        # is its default head_dim, 256
        scalar = c("query_pre_attn_scalar", 256)
        if scalar != att["head_dim"]:
            att["scale"] = float(scalar) ** -0.5
        # Gemma 3's attention never reads attn_logit_softcapping (its released configs have null)
        if c("attn_logit_softcapping") is not None and not gemma3:
            att["softcap"] = float(c("attn_logit_softcapping"))
    if qwen2 or qwen3 or gemma2:
        windows = _gemma2_windows(c, n_layers, 6 if gemma3 else 2) if gemma2 else _qwen_windows(c, n_layers)
        if len(set(windows)) == 1:
            att["sliding_window"] = windows[0]
        else:
            # one window (Qwen3 has one) over the layers that slide: a range where they follow on
            sliding = [i for i, w in enumerate(windows) if w is not None]
            window = windows[sliding[0]]
            contiguous = sliding == list(range(sliding[0], sliding[-1] + 1))
            layers: Any = f"{sliding[0]}-{sliding[-1]}" if contiguous and len(sliding) > 1 else sliding
            overrides = [{"layers": layers, "attention": {"sliding_window": window}}]
    stack: dict[str, Any] = {
        "n_layers": n_layers,
        "attention": att,
        "ffn": {
            "type": "glu",
            "activation": c.activation("hidden_activation", "gelu_pytorch_tanh") if gemma2
            else "gelu_tanh" if gemma and c("hidden_act") == "gelu" else c.activation(
                "hidden_act", defaults.get("hidden_act", "silu")),
            "d_ff": c("intermediate_size", defaults["intermediate_size"]),
            "bias": bool(c("mlp_bias", False)) and family == "llama",
        },
        # Gemma 2: a second norm on each sublayer's output
        "norm": {"type": "rmsnorm", "placement": "sandwich" if gemma2 else "output" if olmo2 else "pre", "eps": eps,
                 **({"offset": 1.0} if gemma else {})},
    }
    if olmo:  # transformers' OlmoLayerNorm: F.layer_norm(x, eps=1e-5), no parameters
        c.refuse_if("clip_qkv", lambda v: v is not None,
                    "specformer's attention does not clamp its query, key and value projections", default=None)
        stack["norm"] = {"type": "layernorm", "weight": False, "bias": False, "eps": 1e-5}
    if overrides:
        stack["overrides"] = overrides
    if phi3:
        stack["residual"] = {"type": "sequential", "dropout": _dropout(c("resid_pdrop", 0.0))}
    if gemma:
        c.refuse_if("use_bidirectional_attention", bool,
                    "specformer's decoders are causal; a bidirectional Gemma is an encoder", default=False)
    rope = _gemma3_rope(c) if gemma3 else c.rope()
    fraction = rope.pop("fraction")
    if phi3:
        rope["fraction"] = fraction  # honoured by every release of transformers' Phi-3
    elif fraction != 1.0:
        # transformers 5's Llama and Mistral rotate every feature whatever this says, while
        # 4.x rotated only this share: the weights fit one of two models, and the config
        # cannot tell which
        raise c.refuse(
            f"partial_rotary_factor={fraction}",
            "transformers 5 ignores it for this family and 4.x honoured it, so the model it "
            "describes depends on the release that trained it",
        )
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", defaults["vocab_size"]),
        "d_model": d,
        "max_seq_len": c("max_position_embeddings", defaults["max_position_embeddings"]),
        "positional": rope,
        "decoder": stack,
        "embedding": {"tie_output": bool(c("tie_word_embeddings", defaults.get("tie_word_embeddings", False))),
                      **({"scale": True} if gemma else {})},
        "head": {"type": "lm", "bias": False, **({"softcap": float(c("final_logit_softcapping"))}
                                                 if gemma2 and c("final_logit_softcapping") is not None else {})},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


def _gpt_neox(c: _Config) -> dict[str, Any]:
    hidden_dropout = _dropout(c("hidden_dropout", 0.0))
    bias = bool(c("attention_bias", True))
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 50432),
        "d_model": c("hidden_size", 6144),
        "max_seq_len": c("max_position_embeddings", 2048),
        "positional": c.rope(default_fraction=0.25),
        "decoder": {
            "n_layers": c("num_hidden_layers", 44),
            "attention": {
                "n_heads": c("num_attention_heads", 64),
                "bias": bias,
                "dropout": _dropout(c("attention_dropout", 0.0)),
            },
            "ffn": {
                "type": "mlp",
                "d_ff": c("intermediate_size", 24576),
                "activation": c.activation("hidden_act", "gelu"),
                "bias": True,
            },
            "norm": {"type": "layernorm", "placement": "pre", "eps": c("layer_norm_eps", 1e-5)},
            "residual": {
                "type": "parallel" if c("use_parallel_residual", True) else "sequential",
                "dropout": hidden_dropout,
            },
        },
        "embedding": {"tie_output": bool(c("tie_word_embeddings", False)), "dropout": hidden_dropout},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


def _one_norm_parallel(c: _Config, *, d: int, vocab: int, positions: int, positional: dict[str, Any],
                       layers: int, attention: dict[str, Any], d_ff: int, activation: str, eps: float,
                       resid: float, embd: float) -> dict[str, Any]:
    """Phi's and GPT-J's decoder: a parallel block whose one LayerNorm feeds attention and MLP
    (biased), a final LayerNorm, and an LM head with a bias."""
    return {
        "kind": "decoder",
        "vocab_size": vocab,
        "d_model": d,
        "max_seq_len": positions,
        "positional": positional,
        "decoder": {
            "n_layers": layers,
            "attention": attention,
            "ffn": {"type": "mlp", "d_ff": d_ff, "activation": activation, "bias": True},
            "norm": {"type": "layernorm", "placement": "pre", "eps": eps},
            "residual": {"type": "parallel", "shared_norm": True, "dropout": resid},
        },
        "embedding": {"tie_output": bool(c("tie_word_embeddings", False)), "dropout": embd},
        "head": {"type": "lm", "bias": True},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


def _phi(c: _Config) -> dict[str, Any]:
    """Phi-1, Phi-1.5, Phi-2: partial rotary (rotate-half), biases on every projection."""
    heads = c("num_attention_heads", 32)
    attention = {"n_heads": heads, "n_kv_heads": c("num_key_value_heads", heads), "bias": True,
                 "dropout": _dropout(c("attention_dropout", 0.0))}
    if c("qk_layernorm", False):  # a LayerNorm over each query and key head, with the model's eps
        attention.update(qk_norm="layernorm", qk_norm_eps=c("layer_norm_eps", 1e-5))
    return _one_norm_parallel(
        c, d=c("hidden_size", 2048), vocab=c("vocab_size", 51200), positions=c("max_position_embeddings", 2048),
        positional=c.rope(default_fraction=0.5), layers=c("num_hidden_layers", 24), attention=attention,
        d_ff=c("intermediate_size", 8192), activation=c.activation("hidden_act", "gelu_new"),
        eps=c("layer_norm_eps", 1e-5), resid=_dropout(c("resid_pdrop", 0.0)), embd=_dropout(c("embd_pdrop", 0.0)),
    )


def _gptj(c: _Config) -> dict[str, Any]:
    """GPT-J: Phi's block without attention biases, rotating the first ``rotary_dim``
    features of each head in interleaved pairs. The pairs are rotate-half's once the rows of
    each query and key head are reordered (evens, then odds): the weight conversion does so,
    and attention scores, being dot products of a query and a key reordered alike, are the same."""
    d, heads = c("n_embd", 4096), c("n_head", 16)
    head_dim = d // heads if heads and d % heads == 0 else 0
    rotary_dim = c("rotary_dim")
    if rotary_dim is None:
        raise c.refuse("rotary_dim=None", "GPT-J then builds its rotation table over hidden_size features, "
                       "which transformers applies to a head only when there is one")
    if not head_dim or not (0 < rotary_dim <= head_dim and rotary_dim % 2 == 0):
        raise c.refuse(f"rotary_dim={rotary_dim!r}", f"it must be an even number of features of a head "
                       f"(head_dim {head_dim or 'n_embd / n_head, which must divide'})")
    fraction = rotary_dim / head_dim
    if int(head_dim * fraction) != rotary_dim:  # the spec's rotated features: int(head_dim * fraction)
        fraction = math.nextafter(fraction, 1.0)
    attention = {"n_heads": heads, "bias": False, "dropout": _dropout(c("attn_pdrop", 0.0))}
    return _one_norm_parallel(
        c, d=d, vocab=c("vocab_size", 50400), positions=c("n_positions", 2048),
        positional={"type": "rope", "base": 10000.0, "fraction": fraction}, layers=c("n_layer", 28),
        attention=attention, d_ff=c("n_inner", 4 * d), activation=c.activation("activation_function", "gelu_new"),
        eps=c("layer_norm_epsilon", 1e-5), resid=_dropout(c("resid_pdrop", 0.0)), embd=_dropout(c("embd_pdrop", 0.0)),
    )


def _falcon(c: _Config) -> dict[str, Any]:
    """Falcon: rotary (rotate-half), LayerNorm, a GELU MLP, one ``bias`` for every projection,
    a tied LM head without bias. Falcon-7B's layout (``multi_query``, ``parallel_attn``): one
    key/value head and one norm feeding attention and MLP; without ``multi_query`` every head
    has its own keys; Falcon-40B/180B's ``new_decoder_architecture``: ``num_kv_heads`` groups
    and a norm for each branch (``num_ln_in_parallel_attn`` 2, its default there); without
    ``parallel_attn``, a sequential pre-norm block."""
    if c("alibi", False):
        raise c.refuse("alibi=True", "Falcon's ALiBi (Falcon-RW) adds its bias before scaling the scores, "
                       "where specformer's alibi adds it after")
    c.refuse_if("apply_residual_connection_post_layernorm", bool, "the residual taken after the norm", False)
    d, heads = c("hidden_size", 4544), c("num_attention_heads", 71)
    new, parallel = bool(c("new_decoder_architecture", False)), bool(c("parallel_attn", True))
    norms = c("num_ln_in_parallel_attn", 2 if new else 1)
    if new and not parallel:
        raise c.refuse("new_decoder_architecture=True with parallel_attn=False",
                       "transformers then adds attention's output twice")
    if parallel and not new and norms == 2:
        raise c.refuse("num_ln_in_parallel_attn=2 without new_decoder_architecture",
                       "transformers builds ln_attn and ln_mlp there but reads input_layernorm")
    if new:
        kv_heads = c("num_kv_heads", heads)
    else:
        kv_heads = 1 if c("multi_query", True) else heads
    positional = c.full_rope("Falcon")
    bias = bool(c("bias", False))
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 65024),
        "d_model": d,
        "max_seq_len": c("max_position_embeddings", 2048),
        "positional": positional,
        "decoder": {
            "n_layers": c("num_hidden_layers", 32),
            "attention": {"n_heads": heads, "n_kv_heads": kv_heads, "bias": bias,
                          "dropout": _dropout(c("attention_dropout", 0.0))},
            "ffn": {"type": "mlp", "d_ff": c("ffn_hidden_size", 4 * d),
                    "activation": c.activation("activation", "gelu"), "bias": bias},
            "norm": {"type": "layernorm", "placement": "pre", "eps": c("layer_norm_epsilon", 1e-5)},
            "residual": {"type": "parallel" if parallel else "sequential",
                         "shared_norm": parallel and norms == 1, "dropout": _dropout(c("hidden_dropout", 0.0))},
        },
        "embedding": {"tie_output": bool(c("tie_word_embeddings", True)), "dropout": 0.0},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("initializer_range", 0.02), "scaled_residual": False},
    }


def _starcoder2(c: _Config) -> dict[str, Any]:
    """StarCoder2: a pre-norm decoder with LayerNorm, rotary over every feature, grouped
    keys, ``use_bias`` on every projection, a GELU (tanh) MLP, ``sliding_window`` on every
    layer (none when null), tied embeddings by default."""
    heads = c("num_attention_heads", 24)
    # a key written as null takes the query heads; an absent one the config class's default, 2
    kv_heads = c.data["num_key_value_heads"] if "num_key_value_heads" in c.data else 2
    positional = c.full_rope("StarCoder2")
    bias = bool(c("use_bias", True))
    return {
        "kind": "decoder",
        "vocab_size": c("vocab_size", 49152),
        "d_model": c("hidden_size", 3072),
        "max_seq_len": c("max_position_embeddings", 4096),
        "positional": positional,
        "decoder": {
            "n_layers": c("num_hidden_layers", 30),
            "attention": {"n_heads": heads, "n_kv_heads": kv_heads or heads, "bias": bias,
                          "dropout": _dropout(c("attention_dropout", 0.0)), "sliding_window": c("sliding_window")},
            "ffn": {"type": "mlp", "d_ff": c("intermediate_size", 12288),
                    "activation": c.activation("hidden_act", "gelu_pytorch_tanh"), "bias": bias},
            "norm": {"type": "layernorm", "placement": "pre", "eps": c("norm_epsilon", 1e-5)},
            "residual": {"type": "sequential", "dropout": _dropout(c("residual_dropout", 0.0))},
        },
        "embedding": {"tie_output": bool(c("tie_word_embeddings", True)),
                      "dropout": _dropout(c("embedding_dropout", 0.0))},
        "head": {"type": "lm", "bias": False},
        "init": {"std": c("initializer_range", 0.018042), "scaled_residual": False},
    }


_IMPORTERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "opt": _opt,
    "bert": lambda c: _bert_like(c, roberta=False),
    "roberta": lambda c: _bert_like(c, roberta=True),
    "xlm-roberta": lambda c: _bert_like(c, roberta=True, default_vocab=30522),
    "distilbert": _distilbert,
    "t5": _t5,
    "mt5": lambda c: _t5(c, "mt5"),
    "bart": _bart,
    "marian": lambda c: _bart(c, marian=True),
    "llama": _llama,
    "mistral": lambda c: _llama(c, "mistral"),
    "qwen2": lambda c: _llama(c, "qwen2"),
    "qwen3": lambda c: _llama(c, "qwen3"),
    "phi3": lambda c: _llama(c, "phi3"),
    "gemma": lambda c: _llama(c, "gemma"),
    "gemma2": lambda c: _llama(c, "gemma2"),
    "gemma3_text": lambda c: _llama(c, "gemma3_text"),
    "olmo": lambda c: _llama(c, "olmo"),
    "olmo2": lambda c: _llama(c, "olmo2"),
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "phi": _phi,
    "gptj": _gptj,
    "falcon": _falcon,
    "starcoder2": _starcoder2,
}

# Imported families whose model is another family's under another name: the spec is that
# family's, and export writes its model_type and classes, unless it is told the name the
# weights were imported under (import-hf records it in their file): then that one
EXPORTED_AS: dict[str, str] = {"xlm-roberta": "roberta", "mt5": "t5"}
# the class names of each such family: its model's, with the prefix of the family it is
_CLASS_PREFIXES: dict[str, tuple[str, str]] = {"xlm-roberta": ("Roberta", "XLMRoberta"), "mt5": ("T5", "MT5")}

# Multimodal families whose language model is a supported family's: the import reads
# that model alone (its text_config, and its weights under language_model), leaving out
# the vision tower. model_type -> (the text model's model_type, {multimodal class: the
# text family's class})
MULTIMODAL: dict[str, tuple[str, dict[str, str]]] = {
    "gemma3": ("gemma3_text", {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM", "Gemma3Model": "Gemma3TextModel"}),
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (*_IMPORTERS, *MULTIMODAL)


# --------------------------------------------------------------------------- architectures: which head


# The model classes of each family whose outputs specformer's spec reproduces, and the
# head each puts on the base model: the family's own (``lm`` for decoders and
# encoder-decoders, ``mlm`` for encoders), ``classification``, or ``base``: the bare
# model, imported only where the family's head holds no weights of its own (an LM head
# tied to the token embeddings), since its checkpoint has none.
_ARCHITECTURES: dict[str, dict[str, str]] = {
    "gpt2": {"GPT2LMHeadModel": "lm", "GPT2Model": "base"},
    "gpt_bigcode": {"GPTBigCodeForCausalLM": "lm", "GPTBigCodeModel": "base"},
    "opt": {"OPTForCausalLM": "lm", "OPTModel": "base"},
    # BertForPreTraining: the masked-LM head and next-sentence prediction (left out)
    "bert": {"BertForMaskedLM": "mlm", "BertForPreTraining": "mlm",
             "BertForSequenceClassification": "classification", "BertModel": "base"},
    "roberta": {"RobertaForMaskedLM": "mlm", "RobertaForSequenceClassification": "classification",
                "RobertaModel": "base"},
    "xlm-roberta": {"XLMRobertaForMaskedLM": "mlm", "XLMRobertaForSequenceClassification": "classification",
                    "XLMRobertaModel": "base"},
    "distilbert": {"DistilBertForMaskedLM": "mlm", "DistilBertForSequenceClassification": "classification",
                   "DistilBertModel": "base"},
    "t5": {"T5ForConditionalGeneration": "lm", "T5WithLMHeadModel": "lm", "T5Model": "base"},
    "mt5": {"MT5ForConditionalGeneration": "lm", "MT5Model": "base"},
    "bart": {"BartForConditionalGeneration": "lm", "BartModel": "base"},
    "marian": {"MarianMTModel": "lm", "MarianModel": "base"},
    "llama": {"LlamaForCausalLM": "lm", "LlamaModel": "base"},
    "mistral": {"MistralForCausalLM": "lm", "MistralModel": "base"},
    "qwen2": {"Qwen2ForCausalLM": "lm", "Qwen2Model": "base"},
    "qwen3": {"Qwen3ForCausalLM": "lm", "Qwen3Model": "base"},
    "phi3": {"Phi3ForCausalLM": "lm", "Phi3Model": "base"},
    "gemma": {"GemmaForCausalLM": "lm", "GemmaModel": "base"},
    "gemma2": {"Gemma2ForCausalLM": "lm", "Gemma2Model": "base"},
    "gemma3_text": {"Gemma3ForCausalLM": "lm", "Gemma3TextModel": "base"},
    "olmo": {"OlmoForCausalLM": "lm", "OlmoModel": "base"},
    "olmo2": {"Olmo2ForCausalLM": "lm", "Olmo2Model": "base"},
    "gpt_neox": {"GPTNeoXForCausalLM": "lm", "GPTNeoXModel": "base"},
    "bloom": {"BloomForCausalLM": "lm", "BloomModel": "base"},
    "phi": {"PhiForCausalLM": "lm", "PhiModel": "base"},
    "gptj": {"GPTJForCausalLM": "lm", "GPTJModel": "base"},
    "falcon": {"FalconForCausalLM": "lm", "FalconModel": "base"},
    "starcoder2": {"Starcoder2ForCausalLM": "lm", "Starcoder2Model": "base"},
}

# Why transformers' other task classes are refused, by class-name suffix and the family's
# kind (None: any kind); a decoder family's unknown *ForCausalLM is another model's class
_OTHER_HEADS: tuple[tuple[str, str | None, str], ...] = (
    ("ForTokenClassification", None, "specformer has no token-classification head"),
    ("ForQuestionAnswering", None, "specformer has no question-answering head"),
    ("ForMultipleChoice", None, "specformer has no multiple-choice head"),
    ("ForNextSentencePrediction", None, "specformer has no next-sentence-prediction head"),
    ("DoubleHeadsModel", None, "specformer has no multiple-choice head (this class has one beside its LM head)"),
    ("EncoderModel", "encoder-decoder", "it is the encoder alone, and specformer imports {family} as the "
                                        "encoder-decoder with its LM head"),
    ("ForCausalLM", "encoder", "it is a causal language model, and specformer imports {family} as a masked-LM encoder"),
    ("LMHeadModel", "encoder", "it is a causal language model, and specformer imports {family} as a masked-LM encoder"),
    ("ForMaskedLM", "decoder", "specformer imports {family} with a language-model head, not a masked-LM one"),
    ("ForMaskedLM", "encoder-decoder", "specformer imports {family} with a language-model head, not a masked-LM one"),
)

# Why a decoder's or an encoder-decoder's *ForSequenceClassification is not specformer's
# classification head
_CLASSIFIER_MISMATCH = {
    "decoder": "it scores the last token that is not pad_token_id with a linear layer without "
               "bias (score), and specformer's classifier has a bias",
    "encoder-decoder": "it classifies the decoder's state at the last end-of-sequence token, and "
                       "specformer's classification head pools the output of one stack",
}

# The checkpoint tensors of each family's own head, to say what a bare model lacks
_HEAD_TENSORS = {"bert": "cls.predictions.*", "roberta": "lm_head.*", "xlm-roberta": "lm_head.*",
                 "distilbert": "vocab_transform.*, vocab_layer_norm.*, vocab_projector.*"}


def _head_from_architectures(c: _Config, raw: dict[str, Any]) -> dict[str, Any]:
    """The spec's head for the model class the config's ``architectures`` names (the
    family's own head when it names none). A class whose head specformer does not have,
    or whose checkpoint cannot give the head's weights, is refused by name."""
    names = c("architectures", [])
    names = [names] if isinstance(names, str) else [str(n) for n in names]
    if not names:
        return raw["head"]
    own = raw["head"]
    weightless = own["type"] == "lm" and raw["embedding"]["tie_output"] and not own.get("bias")
    known = _ARCHITECTURES[c.family]
    supported = ", ".join(n for n, h in known.items() if h != "base" or weightless)
    listed = f"architectures {names}"
    heads = []
    by_lower = {n.lower(): h for n, h in known.items()}
    for name in names:
        # early Llama conversions name the class LLaMAForCausalLM: the same class to transformers
        head = known.get(name, by_lower.get(name.lower()))
        if head is None:
            raise _unsupported_class(c.family, raw["kind"], name, listed, supported)
        if head == "base" and not weightless:
            what = "masked-LM head" if own["type"] == "mlm" else "LM head (untied: tie_word_embeddings is false)"
            raise HFConversionError(
                f"{listed}: {name} is the bare {c.family} {raw['kind']}, without the {what} that "
                f"specformer's {c.family} spec ends in ({_HEAD_TENSORS.get(c.family, 'lm_head.weight')}); "
                "its checkpoint has no weights for that head, and a spec cannot leave the head out. "
                f"Supported {c.family} architectures: {supported}"
            )
        heads.append(own["type"] if head == "base" else head)
    if len(set(heads)) > 1:
        raise HFConversionError(
            f"{listed}: these classes put different heads on the model; give a config that names "
            "the class of its checkpoint (its \"architectures\" key)"
        )
    return _classification_head(c) if heads[0] == "classification" else own


def _unsupported_class(family: str, kind: str, name: str, listed: str, supported: str) -> HFConversionError:
    tail = f"; supported {family} architectures: {supported}"
    if name.endswith("ForSequenceClassification") and kind in _CLASSIFIER_MISMATCH:
        return HFConversionError(
            f"{listed}: {name} is not specformer's classification head: {_CLASSIFIER_MISMATCH[kind]}{tail}"
        )
    why = next((w for suffix, kinds, w in _OTHER_HEADS if name.endswith(suffix) and kinds in (None, kind)), None)
    if why is None:
        return HFConversionError(
            f"{listed}: {name} is not a {family} class specformer knows the head of{tail} (a config "
            "naming a class of its own can name the one its checkpoint matches instead)"
        )
    return HFConversionError(f"{listed}: {why.format(family=family)}{tail}")


def _classification_head(c: _Config) -> dict[str, Any]:
    """BERT's and RoBERTa's sequence classification: the first token's state through a
    dense + tanh pooler, dropout, then a linear classifier to ``num_labels`` classes,
    trained with softmax cross-entropy. DistilBERT's: the same with relu (its
    ``pre_classifier``) and its own dropout key."""
    labels = c("id2label")
    n_classes = len(labels) if isinstance(labels, Mapping) and labels else c("num_labels", 2)
    problem = c("problem_type")
    if problem is None and n_classes == 1:
        problem = "regression"  # what transformers trains a single label as
    if problem != "single_label_classification" and problem is not None:
        raise c.refuse(
            f"problem_type={problem!r}" + (" (num_labels=1)" if n_classes == 1 else ""),
            "specformer's classification head is trained with softmax cross-entropy over the "
            "classes, transformers' problem_type 'single_label_classification'",
        )
    head: dict[str, Any] = {
        "type": "classification",
        "n_classes": n_classes,
        "pooling": "first",
        "pooler": True,
        "dropout": _dropout(c("classifier_dropout", c("hidden_dropout_prob", 0.1))),
    }
    if c.family == "distilbert":
        head["pooler_activation"] = "relu"
        head["dropout"] = _dropout(c("seq_classif_dropout", 0.2))
    names = _label_names(labels, n_classes)
    if names is not None:
        head["labels"] = names
    return head


def _label_names(id2label: Any, n_classes: int) -> list[str] | None:
    """The class names of a config's ``id2label`` in class order, or None when they are
    transformers' defaults (``LABEL_0`` ...) or do not name each class once."""
    if not isinstance(id2label, Mapping):
        return None
    try:
        by_id = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_id) != list(range(n_classes)):
        return None
    names = [by_id[i] for i in range(n_classes)]
    if names == [f"LABEL_{i}" for i in range(n_classes)] or len(set(names)) != n_classes:
        return None
    return names


def read_hf_config(source: Any) -> dict[str, Any]:
    """A config as a plain dict, from a ``PretrainedConfig``, a mapping, a ``config.json``
    path or a model directory holding one."""
    if hasattr(source, "to_dict") and callable(source.to_dict):
        return dict(source.to_dict())
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise HFConversionError(f"{path}: no such file; give a config.json or a directory holding one")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise HFConversionError(
            f"{path}: not a config.json (not UTF-8 JSON text); give a Hugging Face config.json "
            "or the folder holding one"
        ) from None
    except OSError as exc:
        raise HFConversionError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        if path.suffix.lower() in (".yaml", ".yml"):
            raise HFConversionError(
                f"{path}: a YAML file, not a Hugging Face config.json; import-hf converts a Hugging Face model "
                "(its folder or config.json) into a spec. A specformer spec is used as it is: specformer "
                f"validate {path}, specformer export-hf CKPT for a trained one"
            ) from None
        raise HFConversionError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise HFConversionError(f"{path}: a config.json holds a JSON object, found {type(data).__name__}")
    if "model_type" not in data:
        if path.name != "config.json":  # tokenizer.json, generation_config.json: the folder's other files
            raise HFConversionError(
                f"{path} is not a model config (it has no model_type); give the model's config.json, or the "
                "folder holding it"
            )
        raise _no_model_type(str(path))
    return data


def _no_model_type(where: str) -> HFConversionError:
    return HFConversionError(
        f"{where} has no model_type, so it is not a Hugging Face transformers config (another library's?); "
        f"specformer reads a transformers config.json whose model_type is one of: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


# families refused for a feature specformer has no component for
_MOE = "a mixture-of-experts FFN (a router over several FFNs)"
_RECURRENT = "recurrent or state-space layers in place of attention"
_UNBUILT_FEATURES = {
    **dict.fromkeys(("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "dbrx", "granitemoe", "phimoe", "jetmoe",
                     "minimax", "llama4", "llama4_text"), _MOE),
    **dict.fromkeys(("deepseek_v2", "deepseek_v3"), "multi-head latent attention and " + _MOE),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "jamba", "zamba", "zamba2",
                     "bamba", "falcon_h1"), _RECURRENT),
}


def spec_from_hf_config(config: Any, *, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face model config.

    ``config`` is a ``transformers.PretrainedConfig``, its ``to_dict()``, a path to a
    ``config.json`` or a model directory. Supported ``model_type`` values are listed in
    :data:`SUPPORTED_MODEL_TYPES`; an option with no specformer equivalent raises
    :class:`HFConversionError` naming it.
    """
    data = read_hf_config(config)
    model_type = data.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise _no_model_type("the config")
    if model_type in MULTIMODAL:
        data = _text_model_config(data, model_type)
        model_type = data["model_type"]
    if "vocab_size" in data and data["vocab_size"] is None:  # transformers refuses it; the default would be a guess
        raise HFConversionError(f"{model_type} config: vocab_size is null: write the size of the model's vocabulary")
    importer = _IMPORTERS.get(model_type)
    if importer is None:
        need = _UNBUILT_FEATURES.get(model_type)
        why = f": it needs {need}, which specformer does not build" if need else ""
        raise HFConversionError(f"model_type {model_type!r} is not supported{why}; supported: {supported}")
    c = _Config(data, model_type)
    raw = importer(c)
    raw["head"] = _head_from_architectures(c, raw)
    raw["name"] = name or _default_name(data, config)
    raw = {"name": raw.pop("name"), **raw}
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        # the spec's field and what is wrong with it, without pydantic's input dump
        lines = [f"{p.path}: {p.message}" if p.path else p.message for p in problems_from_validation(exc, {})]
        raise HFConversionError(f"{model_type} config gives an invalid spec: {'; '.join(lines)}") from None


def misspelt_config_keys(config: Any) -> list[str]:
    """The keys of a supported config that look misspelt: each is read by no one (the import,
    as ``transformers``, leaves it unused) and is one slip from a key of the family that the
    config lacks, so that key's default was taken in its place (``hiden_size`` gives a model
    of the default width). One line per key, naming both; ``[]`` when there are none or the
    config does not import."""
    data = read_hf_config(config)
    model_type = data.get("model_type")
    if model_type in MULTIMODAL:
        data = _text_model_config(data, model_type)
        model_type = data["model_type"]
    importer = _IMPORTERS.get(model_type)
    if importer is None:
        return []
    c = _Config(data, model_type)
    try:
        _head_from_architectures(c, importer(c))
    except HFConversionError:
        pass  # the keys read until the refusal still say which others look misspelt
    return [f"config key {key!r} is not a {model_type} setting: did you mean {want!r}? (its default was taken)"
            for key, want in c.misspelt()]


def _text_model_config(data: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The config of a multimodal model's text model (its ``text_config``), as a config of the
    text family, with the class of its causal LM for the multimodal class the config names."""
    text_type, classes = MULTIMODAL[model_type]
    text = data.get("text_config") or {}
    if not isinstance(text, Mapping):
        raise HFConversionError(f"{model_type} config: text_config is a {type(text).__name__}, not an object")
    out = {**text, "model_type": text_type, "architectures": []}
    for cls in data.get("architectures") or []:
        if cls not in classes:
            raise HFConversionError(
                f"architectures [{cls!r}]: specformer imports the text model of {model_type}'s "
                f"{', '.join(classes)} (its language model, without the vision tower), not {cls}"
            )
        out["architectures"].append(classes[cls])
    # transformers ties the output layer as the whole model's config says (its text config's
    # flag is not read there)
    if "tie_word_embeddings" in data:
        out["tie_word_embeddings"] = data["tie_word_embeddings"]
    out["_name_or_path"] = data.get("_name_or_path") or model_type  # the spec's default name: the model's
    return out


def _default_name(data: Mapping[str, Any], config: Any = None) -> str:
    """The config's ``_name_or_path`` (its last part), else the name of the folder a path
    ``config`` is or is in, else the ``model_type``."""
    source = str(data.get("_name_or_path") or "").rstrip("/")
    if source:
        return source.rsplit("/", 1)[-1]
    if isinstance(config, str | Path):
        path = Path(config)
        folder = path if path.is_dir() else path.resolve().parent
        if folder.name:
            return folder.name
    return str(data["model_type"])


# --------------------------------------------------------------------------- spec -> HF


def hf_family(spec: ModelSpec) -> str:
    """The Hugging Face ``model_type`` whose architecture ``spec`` has (before checking details)."""
    pos = spec.positional.type
    stack = spec.decoder if spec.decoder is not None else spec.encoder
    assert stack is not None
    if spec.kind == "encoder" and pos == "learned":
        if spec.positional.offset:
            return "roberta"
        return "bert" if spec.embedding.segment_vocab_size else "distilbert"  # DistilBERT has no token types
    if spec.kind == "decoder":
        if pos == "learned":
            if spec.positional.offset:
                return "opt"  # OPT's table starts 2 rows in
            # GPT-BigCode: GPT-2 with multi-query attention
            return "gpt_bigcode" if stack.attention.n_kv_heads != stack.attention.n_heads else "gpt2"
        if pos == "alibi":
            return "bloom"
        if pos == "rope" and stack.norm.type == "rmsnorm":
            layers = list(stack.layers())
            if stack.norm.placement == "output":  # a norm on each sublayer's output alone
                return "olmo2"
            if stack.norm.offset:  # Gemma 2: sandwich norms, soft-capped scores and logits
                sandwich = stack.norm.placement == "sandwich" or any(
                    getattr(layer.attention, "softcap", None) for layer in layers)
                if any(layer.attention.qk_norm != "none" for layer in layers) or spec.positional.local_base:
                    return "gemma3_text"  # and query/key norms, and a base of the windowed layers' own
                return "gemma2" if sandwich or getattr(spec.head, "softcap", None) else "gemma"
            if any(layer.attention.qk_norm != "none" for layer in layers):
                return "qwen3"
            if spec.positional.fraction != 1.0:  # Phi-3 alone rotates a share of the features
                return "phi3"
            if any(layer.attention.bias and not layer.attention.output_bias for layer in layers):
                return "qwen2"
            return "mistral" if _any_sliding(stack) else "llama"
        if pos == "rope" and stack.norm.type == "layernorm":
            if not stack.norm.weight:  # LayerNorms without parameters
                return "olmo"
            shared = any(layer.residual.shared_norm for layer in stack.layers())
            if shared and stack.attention.bias:  # one norm for both sublayers, attention biases
                return "phi"
            kv, heads = stack.attention.n_kv_heads, stack.attention.n_heads
            if all(layer.residual.type == "sequential" for layer in stack.layers()) and (
                    kv not in (1, heads) or _any_sliding(stack)):
                return "starcoder2"  # sequential blocks with grouped keys or a window
            if stack.attention.n_kv_heads != stack.attention.n_heads:
                return "falcon"  # grouped keys without Phi's biases
            if shared:  # GPT-J's LM head has a bias, Falcon's none
                return "gptj" if spec.head.bias else "falcon"
            return "gpt_neox"
    if spec.kind == "encoder-decoder":
        if pos == "t5":
            return "t5"
        if pos == "learned":
            return "bart"
        if pos == "sinusoidal":
            return "marian"
    raise HFConversionError(
        f"no supported Hugging Face family is {'an' if spec.kind[0] == 'e' else 'a'} {spec.kind} with "
        f"{pos!r} positions and {stack.norm.type} norms; exportable: encoder with learned positions "
        "(BERT, RoBERTa; DistilBERT without segment embeddings), decoder with learned positions (GPT-2; "
        "GPT-BigCode with multi-query attention; OPT with the table offset by 2), ALiBi (BLOOM) or rope "
        "(Llama/Mistral with rmsnorm, OLMo with layernorms without parameters, OLMo 2 with output norms, Qwen2 with rmsnorm and q/k/v biases only, "
        "Qwen3 with rmsnorm and qk_norm, Phi-3 with rmsnorm and a rotary fraction, Gemma with (1 + weight) "
        "rmsnorm, Gemma 2 with those and sandwich norms or soft caps, GPT-NeoX with layernorm, Phi-1/2, "
        "GPT-J and Falcon with layernorm and one norm per parallel block, Falcon with grouped keys, "
        "StarCoder2 with grouped keys or a window in sequential blocks), encoder-decoder with t5 bias (T5), "
        "learned positions (BART) or sinusoids (Marian)"
    )


def export_family(spec: ModelSpec, imported_as: str | None = None) -> str:
    """The ``model_type`` a spec exports as: :func:`hf_family`, except for weights imported
    (``imported_as``) from a family whose model has another family's structure
    (:data:`_STRUCTURE_OF`: a Phi-3 whose every feature rotates is a Llama's), which go back
    under their own family's names and classes."""
    family = hf_family(spec)
    if imported_as is not None:
        return imported_as if family in _STRUCTURE_OF.get(imported_as, ()) else family
    # a structure only another family expresses in full (a Falcon with one bias for every
    # projection, or sequential with a key/value head per query head: GPT-NeoX's layout but
    # not its options) exports as that family
    others = [other for other, structures in _STRUCTURE_OF.items() if family in structures]
    if others and not _expresses(spec, family):
        return next((other for other in others if _expresses(spec, other)), family)
    return family


def _expresses(spec: ModelSpec, model_type: str) -> bool:
    """Whether ``spec`` exports as ``model_type`` with nothing that the family cannot express."""
    try:
        hf_config_from_spec(spec, _model_type=model_type)
    except HFConversionError:
        return False
    return True


# Families some of whose models have another family's structure: imported model_type -> the
# families whose structure it may have; weights imported from it export back under its name
_STRUCTURE_OF: dict[str, tuple[str, ...]] = {
    "phi3": ("llama", "mistral"),  # every feature rotating (windowed: Mistral's)
    "falcon": ("gpt_neox", "gptj", "phi"),  # MHA, biased, or sequential
    "starcoder2": ("gpt_neox", "falcon"),  # without a window, MHA or multi-query
    "gpt_bigcode": ("gpt2",),  # a key/value head per query head
}


def _any_sliding(stack: Any) -> bool:
    return any(layer.attention.sliding_window is not None for layer in stack.layers())


_ACT_OUT = {"relu": "relu", "gelu": "gelu", "silu": "silu"}


def _act_out(act: str, tanh_name: str) -> str:
    return tanh_name if act == "gelu_tanh" else _ACT_OUT[act]


def _export_gpt2(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": spec.vocab_size,
        "n_positions": spec.max_seq_len,
        "n_embd": spec.d_model,
        "n_layer": s.n_layers,
        "n_head": s.attention.n_heads,
        "n_inner": s.ffn.d_ff,
        "activation_function": _act_out(s.ffn.activation, "gelu_new"),
        "resid_pdrop": s.residual.dropout,
        "embd_pdrop": spec.embedding.dropout,
        "attn_pdrop": s.attention.dropout,
        "layer_norm_epsilon": s.norm.eps,
        "initializer_range": spec.init.std,
        "scale_attn_weights": s.attention.scale is None,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def _export_gpt_bigcode(spec: ModelSpec) -> dict[str, Any]:
    out = _export_gpt2(spec)
    out.update(architectures=["GPTBigCodeForCausalLM"], multi_query=spec.decoder.attention.n_kv_heads == 1)
    return out


def _export_opt(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    pre = s.norm.placement == "pre"
    return {
        "architectures": ["OPTForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "word_embed_proj_dim": spec.d_model,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": s.attention.n_heads,
        "ffn_dim": s.ffn.d_ff,
        "max_position_embeddings": spec.positional.rows(spec.max_seq_len) - _OPT_OFFSET,
        "activation_function": _act_out(s.ffn.activation, "gelu_new"),
        "do_layer_norm_before": pre,
        "_remove_final_layer_norm": pre and not s.final_norm,
        "enable_bias": s.attention.bias,
        "dropout": s.residual.dropout,
        "attention_dropout": s.attention.dropout,
        "init_std": spec.init.std,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def _export_bloom(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    return {
        "architectures": ["BloomForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "n_layer": s.n_layers,
        "n_head": s.attention.n_heads,
        "seq_length": spec.max_seq_len,
        "layer_norm_epsilon": s.norm.eps,
        "hidden_dropout": s.residual.dropout,
        "attention_dropout": s.attention.dropout,
        "apply_residual_connection_post_layernorm": False,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def _export_bert(spec: ModelSpec, roberta: bool) -> dict[str, Any]:
    s = spec.encoder
    assert s is not None
    family = "Roberta" if roberta else "Bert"
    out: dict[str, Any] = {
        "architectures": [f"{family}ForMaskedLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": s.attention.n_heads,
        "intermediate_size": s.ffn.d_ff,
        "hidden_act": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "hidden_dropout_prob": s.residual.dropout,
        "attention_probs_dropout_prob": s.attention.dropout,
        "max_position_embeddings": spec.max_seq_len,
        "type_vocab_size": spec.embedding.segment_vocab_size,
        "layer_norm_eps": s.norm.eps,
        "initializer_range": spec.init.std,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": spec.embedding.tie_output,
    }
    if roberta:
        offset = spec.positional.offset
        out["pad_token_id"] = offset - 1
        out["max_position_embeddings"] = spec.positional.rows(spec.max_seq_len)
    if spec.head.type == "classification":
        out.update(_classifier_config(spec.head, f"{family}ForSequenceClassification"))
        out["classifier_dropout"] = spec.head.dropout
    return out


def _classifier_config(head: Any, architecture: str) -> dict[str, Any]:
    """The config keys of a sequence classifier: its class, labels and problem type."""
    # the spec's class names, else transformers' defaults (what a config without them gets)
    names = head.labels or [f"LABEL_{i}" for i in range(head.n_classes)]
    return {
        "architectures": [architecture],
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
        "problem_type": "single_label_classification",  # softmax cross-entropy, as specformer trains
    }


def _export_distilbert(spec: ModelSpec) -> dict[str, Any]:
    s = spec.encoder
    assert s is not None
    out: dict[str, Any] = {
        "architectures": ["DistilBertForMaskedLM"],
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_seq_len,
        "sinusoidal_pos_embds": False,
        "n_layers": s.n_layers,
        "n_heads": s.attention.n_heads,
        "dim": spec.d_model,
        "hidden_dim": s.ffn.d_ff,
        "activation": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "dropout": s.residual.dropout,
        "attention_dropout": s.attention.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": spec.embedding.tie_output,
    }
    if spec.head.type == "classification":
        out.update(_classifier_config(spec.head, "DistilBertForSequenceClassification"))
        out["seq_classif_dropout"] = spec.head.dropout
    return out


def _export_t5(spec: ModelSpec) -> dict[str, Any]:
    enc, dec = spec.encoder, spec.decoder
    assert enc is not None and dec is not None
    ffn = enc.ffn
    proj = {"relu": "relu", "gelu": "gelu", "silu": "silu", "gelu_tanh": "gelu_new"}[ffn.activation]
    if ffn.type == "glu":
        proj = "gated-gelu" if ffn.activation == "gelu_tanh" else f"gated-{proj}"
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": spec.vocab_size,
        "d_model": spec.d_model,
        "d_kv": enc.attention.head_dim,
        "d_ff": ffn.d_ff,
        "num_layers": enc.n_layers,
        "num_decoder_layers": dec.n_layers,
        "num_heads": enc.attention.n_heads,
        "relative_attention_num_buckets": spec.positional.num_buckets,
        "relative_attention_max_distance": spec.positional.max_distance,
        "dropout_rate": enc.residual.dropout,
        "layer_norm_epsilon": enc.norm.eps,
        "feed_forward_proj": proj,
        "tie_word_embeddings": spec.embedding.tie_output,
        "scale_decoder_outputs": spec.head.scale_input,
        "n_positions": spec.max_seq_len,
        "is_encoder_decoder": True,
    }


def _export_bart(spec: ModelSpec) -> dict[str, Any]:
    enc, dec = spec.encoder, spec.decoder
    assert enc is not None and dec is not None
    return {
        "architectures": ["BartForConditionalGeneration"],
        "vocab_size": spec.vocab_size,
        "d_model": spec.d_model,
        "max_position_embeddings": spec.max_seq_len,
        "encoder_layers": enc.n_layers,
        "decoder_layers": dec.n_layers,
        "encoder_attention_heads": enc.attention.n_heads,
        "decoder_attention_heads": dec.attention.n_heads,
        "encoder_ffn_dim": enc.ffn.d_ff,
        "decoder_ffn_dim": dec.ffn.d_ff,
        "activation_function": _act_out(enc.ffn.activation, "gelu_new"),
        "dropout": enc.residual.dropout,
        "attention_dropout": enc.attention.dropout,
        "activation_dropout": enc.ffn.dropout,
        "init_std": spec.init.std,
        "scale_embedding": spec.embedding.scale,
        "tie_word_embeddings": spec.embedding.tie_output,
        "is_encoder_decoder": True,
    }


def _export_marian(spec: ModelSpec) -> dict[str, Any]:
    out = _export_bart(spec)
    out.update(architectures=["MarianMTModel"], share_encoder_decoder_embeddings=True,
               decoder_vocab_size=spec.vocab_size)
    if spec.embedding.padding_idx is not None:  # its decoder starts from the padding token
        out.update(pad_token_id=spec.embedding.padding_idx, decoder_start_token_id=spec.embedding.padding_idx)
    return out


def _rope_parameters(rope: Any) -> dict[str, Any]:
    """Hugging Face's ``rope_parameters`` for a :class:`RopeSpec`: its base and scaling
    (rope_type 'default' without one); a YaRN field left unset stays unset. Dynamic NTK's
    original context is max_position_embeddings there: a spec whose original context is
    another length comes back different from the re-import, which names the field."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": rope.base}
    if rope.scaling is not None:
        fields = rope.scaling.model_dump(exclude_none=True)
        out["rope_type"] = fields.pop("type")
        if out["rope_type"] == "dynamic":
            fields.pop("original_max_position_embeddings")
        out.update(fields)
    return out


def _export_llama(spec: ModelSpec, model_type: str) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    att = s.attention
    out: dict[str, Any] = {
        "architectures": [{"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM",
                           "gemma2": "Gemma2ForCausalLM",
                           "gemma3_text": "Gemma3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                           "olmo": "OlmoForCausalLM"}.get(
                               model_type, "LlamaForCausalLM")],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": s.ffn.d_ff,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.n_kv_heads,
        "head_dim": att.head_dim,
        "hidden_act": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "max_position_embeddings": spec.max_seq_len,
        "initializer_range": spec.init.std,
        "rms_norm_eps": s.norm.eps,
        "tie_word_embeddings": spec.embedding.tie_output,
        "rope_parameters": _rope_parameters(spec.positional),
        "attention_dropout": att.dropout,
    }
    if model_type in ("mistral", "phi3"):
        windows = {layer.attention.sliding_window for layer in s.layers()}
        out["sliding_window"] = next(iter(windows)) if len(windows) == 1 else None
        if model_type == "phi3":
            out["rope_parameters"]["partial_rotary_factor"] = spec.positional.fraction
            out["resid_pdrop"] = s.residual.dropout
            original = out["rope_parameters"].get("original_max_position_embeddings")
            if original is not None:  # Phi-3 reads its pretraining length from beside rope_parameters
                out["original_max_position_embeddings"] = original
    elif model_type in ("qwen2", "qwen3"):
        # one window, in the layers layer_types names (a spec with two windows comes back
        # with one, and the check after export names the layers that differ)
        windows = [layer.attention.sliding_window for layer in s.layers()]
        window = next((w for w in windows if w is not None), None)
        if model_type == "qwen3":
            out["attention_bias"] = att.bias
        out["use_sliding_window"] = window is not None
        out["sliding_window"] = window
        out["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in windows]
        # older transformers read the window's layers from max_window_layers alone
        out["max_window_layers"] = next((i for i, w in enumerate(windows) if w is not None), s.n_layers)
    elif model_type in ("gemma2", "gemma3_text"):
        if model_type == "gemma3_text":
            pos = spec.positional
            local = pos.base if pos.local_base is None else pos.local_base
            out["rope_parameters"] = {"full_attention": _rope_parameters(pos),
                                      "sliding_attention": {"rope_type": "default", "rope_theta": local}}
        out["hidden_activation"] = out.pop("hidden_act")
        out["attention_bias"] = att.bias
        scalar = att.head_dim if att.scale is None else 1.0 / att.scale**2
        out["query_pre_attn_scalar"] = round(scalar) if math.isclose(scalar, round(scalar)) else scalar
        out["attn_logit_softcapping"] = att.softcap
        out["final_logit_softcapping"] = spec.head.softcap
        # one window, in the layers layer_types names (the check after export names any other)
        windows = [layer.attention.sliding_window for layer in s.layers()]
        out["sliding_window"] = next((w for w in windows if w is not None), None)
        out["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in windows]
    else:
        out["attention_bias"] = att.bias
        if model_type == "llama":  # Gemma's FFN has no biases
            out["mlp_bias"] = s.ffn.bias
        if model_type == "olmo":  # LayerNorms at eps 1e-5, written nowhere; nothing clamped
            del out["rms_norm_eps"]
            out["clip_qkv"] = None
    return out


def _export_gpt_neox(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": s.attention.n_heads,
        "intermediate_size": s.ffn.d_ff,
        "hidden_act": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "rope_parameters": {
            **_rope_parameters(spec.positional),
            "partial_rotary_factor": spec.positional.fraction,
        },
        "attention_dropout": s.attention.dropout,
        "hidden_dropout": s.residual.dropout,
        "max_position_embeddings": spec.max_seq_len,
        "initializer_range": spec.init.std,
        "layer_norm_eps": s.norm.eps,
        "use_parallel_residual": s.residual.type == "parallel",
        "attention_bias": s.attention.bias,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def _export_phi(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    att = s.attention
    return {
        "architectures": ["PhiForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": s.ffn.d_ff,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.n_kv_heads,
        "hidden_act": _act_out(s.ffn.activation, "gelu_new"),
        "max_position_embeddings": spec.max_seq_len,
        "initializer_range": spec.init.std,
        "layer_norm_eps": s.norm.eps,
        "rope_parameters": {**_rope_parameters(spec.positional), "partial_rotary_factor": spec.positional.fraction},
        "attention_dropout": att.dropout,
        "resid_pdrop": s.residual.dropout,
        "embd_pdrop": spec.embedding.dropout,
        "qk_layernorm": att.qk_norm != "none",
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def _export_gptj(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    att = s.attention
    return {
        "architectures": ["GPTJForCausalLM"],
        "vocab_size": spec.vocab_size,
        "n_embd": spec.d_model,
        "n_layer": s.n_layers,
        "n_head": att.n_heads,
        "n_inner": s.ffn.d_ff,
        "n_positions": spec.max_seq_len,
        # the rotated features of a head (the import gives back the spec's fraction, or names it)
        "rotary_dim": int(att.head_dim * spec.positional.fraction),
        "activation_function": _act_out(s.ffn.activation, "gelu_new"),
        "resid_pdrop": s.residual.dropout,
        "embd_pdrop": spec.embedding.dropout,
        "attn_pdrop": att.dropout,
        "layer_norm_epsilon": s.norm.eps,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


def falcon_new_architecture(attention: Any, residual: Any) -> bool:
    """Whether Falcon writes a layer as its ``new_decoder_architecture``: grouped keys, or a
    norm for each parallel branch. The older layouts are kept where they fit (Falcon-7B's one
    key/value head and one norm, or a key/value head per query head)."""
    return (residual.type == "parallel" and not residual.shared_norm
            or attention.n_kv_heads not in (1, attention.n_heads))


def _export_falcon(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    att = s.attention
    parallel, shared = s.residual.type == "parallel", s.residual.shared_norm
    new = falcon_new_architecture(att, s.residual)
    out: dict[str, Any] = {
        "architectures": ["FalconForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": att.n_heads,
        "num_kv_heads": att.n_kv_heads,
        "new_decoder_architecture": new,
        "multi_query": att.n_kv_heads == 1,
        "parallel_attn": parallel,
        "num_ln_in_parallel_attn": (1 if shared else 2) if new else None,
        "bias": att.bias,
        "alibi": False,
        "activation": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "ffn_hidden_size": s.ffn.d_ff,
        "layer_norm_epsilon": s.norm.eps,
        "hidden_dropout": s.residual.dropout,
        "attention_dropout": att.dropout,
        "max_position_embeddings": spec.max_seq_len,
        "rope_parameters": _rope_parameters(spec.positional),
        "initializer_range": spec.init.std,
        "tie_word_embeddings": spec.embedding.tie_output,
    }
    return out


def _export_starcoder2(spec: ModelSpec) -> dict[str, Any]:
    s = spec.decoder
    assert s is not None
    att = s.attention
    windows = {layer.attention.sliding_window for layer in s.layers()}
    return {
        "architectures": ["Starcoder2ForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": s.ffn.d_ff,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.n_kv_heads,
        "hidden_act": _act_out(s.ffn.activation, "gelu_pytorch_tanh"),
        "max_position_embeddings": spec.max_seq_len,
        "initializer_range": spec.init.std,
        "norm_epsilon": s.norm.eps,
        "use_bias": att.bias,
        "sliding_window": next(iter(windows)) if len(windows) == 1 else None,
        "rope_parameters": _rope_parameters(spec.positional),
        "attention_dropout": att.dropout,
        "residual_dropout": s.residual.dropout,
        "embedding_dropout": spec.embedding.dropout,
        "tie_word_embeddings": spec.embedding.tie_output,
    }


_EXPORTERS: dict[str, Callable[[ModelSpec], dict[str, Any]]] = {
    "gpt2": _export_gpt2,
    "gpt_bigcode": _export_gpt_bigcode,
    "opt": _export_opt,
    "bloom": _export_bloom,
    "bert": lambda s: _export_bert(s, roberta=False),
    "roberta": lambda s: _export_bert(s, roberta=True),
    "distilbert": _export_distilbert,
    "t5": _export_t5,
    "bart": _export_bart,
    "marian": _export_marian,
    "llama": lambda s: _export_llama(s, "llama"),
    "mistral": lambda s: _export_llama(s, "mistral"),
    "qwen2": lambda s: _export_llama(s, "qwen2"),
    "qwen3": lambda s: _export_llama(s, "qwen3"),
    "phi3": lambda s: _export_llama(s, "phi3"),
    "gemma": lambda s: _export_llama(s, "gemma"),
    "gemma2": lambda s: _export_llama(s, "gemma2"),
    "gemma3_text": lambda s: _export_llama(s, "gemma3_text"),
    "olmo": lambda s: _export_llama(s, "olmo"),
    "olmo2": lambda s: _export_llama(s, "olmo2"),
    "gpt_neox": _export_gpt_neox,
    "phi": _export_phi,
    "gptj": _export_gptj,
    "falcon": _export_falcon,
    "starcoder2": _export_starcoder2,
}

_TRAINING_ONLY = ("dropout", "init.", "padding_idx")


def _training_only_note(line: str, model_type: str) -> str:
    """The warning for a training-only setting ``model_type`` cannot express: left out, and
    why that leaves the exported model's outputs as they were."""
    if line.startswith("init."):
        why = ("an init setting only chose the weights the run started from; the exported weights "
               "compute the same outputs")
    elif "padding_idx" in line:
        why = (f"a padding row only stops the lookup's gradient in training; the exported model's outputs "
               f"are the same, and fine-tuning it in transformers uses {model_type}'s")
    else:
        why = (f"dropout acts in training only; the exported model's outputs (eval mode) are the same, "
               f"and fine-tuning it in transformers uses {model_type}'s value")
    return f"left out of the export: {line}: {why}"


def _check_built_in_modules(spec: ModelSpec) -> None:
    """Refuse a spec whose built-in type is built by a module of one's own (``register(...,
    replace=True)``): its config would be the built-in's, and Hugging Face's model would
    compute the built-in, not what was trained."""
    from specformer.analysis.params import own_built_components

    own = own_built_components(spec)
    if own:
        parts = "; ".join(f"{key} ({what})" for key, what in own.items())
        raise HFConversionError(
            f"{parts}: a module of your own builds this built-in type, and a Hugging Face model would compute "
            "the built-in one instead; export-hf writes models of specformer's own modules only"
        )


def hf_config_from_spec(
    spec: ModelSpec | str | Path | Mapping[str, Any],
    *,
    warnings: list[str] | None = None,
    token_ids: Mapping[str, int | None] | None = None,
    imported_as: str | None = None,
    _model_type: str | None = None,
) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a spec that maps onto a supported family.

    ``imported_as`` is the ``model_type`` the weights were imported under (``import-hf``
    records it): an ``mt5`` or ``xlm-roberta`` model, whose spec is T5's or RoBERTa's, is
    written under its own name and classes (``MT5ForConditionalGeneration``), which
    ``AutoModel*`` loads; a ``phi3`` one whose every feature rotates (a Llama's or
    Mistral's structure) goes back as Phi-3 (:func:`export_family`); any other name leaves
    the family's.

    Raises :class:`HFConversionError` naming every spec field that the family cannot
    express. Dropout and initialisation settings the family cannot express are appended
    to ``warnings`` (they do not change a trained model's outputs).

    ``token_ids`` (``bos_token_id``, ``eos_token_id``, ``pad_token_id``) are those of the
    model's tokenizer; the config says None for any not given, never the family's
    defaults (GPT-2's 50256 lies outside most specformer vocabularies). An
    encoder-decoder's ``decoder_start_token_id`` is the one given, else its bos (the
    token specformer's decoder starts from unless ``training.objective.decoder_start``
    names another); its ``forced_bos_token_id`` and ``forced_eos_token_id`` (the tokens of
    ``training.objective.forced_start`` and ``forced_end``, which ``generate`` forces) are
    written when given, and BART's are None otherwise (``BartConfig``'s defaults would
    force tokens the model was not fine-tuned with).
    """
    spec = as_spec(spec)
    _check_built_in_modules(spec)
    model_type = _model_type or export_family(spec, imported_as)
    _check_head_exports(spec, model_type)
    spec = _without_equivalents(spec)
    e = spec.embedding
    if model_type in ("bart", "marian") and not e.tie_output and e.share_encoder_decoder:
        # untied, transformers 5 gives each stack a token table: one shared table exports as
        # two equal ones, which compute the same outputs
        spec = spec.model_copy(update={"embedding": {**e.model_dump(exclude_unset=True),
                                                     "share_encoder_decoder": False, "share_positions": True}})
    exported = spec
    if spec.head.type == "mlm" and model_type not in _ENCODER_FAMILIES:
        # the family's head is an lm head: the config is written with one, and the comparison
        # below names head.type among the fields that differ, not a field the mlm head lacks
        exported = spec.model_copy(update={"head": {"type": "lm"}})
    try:
        config = {"model_type": model_type, **_EXPORTERS[model_type](exported)}
    except (KeyError, AttributeError) as exc:
        raise HFConversionError(
            f"{model_type}: the spec uses {exc} where Hugging Face {model_type} has no such option"
        ) from None
    try:
        back = spec_from_hf_config(config, name=spec.name)
    except HFConversionError as exc:
        # a head_dim the family has no field for reads back as d_model / n_heads, which may make
        # no valid spec at all (a rotary share of it that is odd): the head_dim is what differs
        sizes = [f"{role}.{part}.head_dim = {att.head_dim} (Hugging Face {model_type} has "
                 f"d_model / n_heads = {spec.d_model // att.n_heads})"
                 for role, stack in spec.stacks() for part, att in _attentions_of(stack)
                 if att.head_dim != spec.d_model // att.n_heads]
        if sizes and not any(key in config for key in ("head_dim", "d_kv", "attention_head_dim")):
            raise HFConversionError(
                f"the spec has no Hugging Face {model_type} equivalent; these fields differ from what "
                f"{model_type} can express:\n  " + "\n  ".join(sizes)) from None
        raise HFConversionError(f"the spec does not map onto Hugging Face {model_type}: {exc}") from None
    problems, notes, fixes = [], [], []
    for path, ours, theirs in _differences(_resolved(spec.to_dict()), _resolved(back.to_dict())):
        if path.startswith("head.") and path != "head.type" and spec.head.type != back.head.type:
            continue  # another kind of head: its type says it, not each field the two do not share
        if model_type == "marian" and path == "head.bias" and ours is False:
            continue  # Marian's output bias (final_logits_bias) of zeros: no bias
        if theirs is _ABSENT:  # a field of our type that the family's type lacks (layernorm's bias)
            line = f"{path} = {_shown(ours)} (Hugging Face {model_type}'s type has no such field)"
        elif ours is _ABSENT:
            line = f"{path}: not a field of this spec's type (Hugging Face {model_type} has {_shown(theirs)})"
        else:
            line = f"{path} = {_shown(ours)} (Hugging Face {model_type} has {_shown(theirs)})"
        if any(t in path for t in _TRAINING_ONLY):
            notes.append(line)
        else:
            problems.append(line)
            if theirs is not _ABSENT:  # setting the type drops it: a --set of it would be refused
                fixes.append((path, theirs))
    if problems:
        message = (f"the spec has no Hugging Face {model_type} equivalent; these fields differ from "
                   f"what {model_type} can express:\n  " + "\n  ".join(problems))
        if all(isinstance(v, bool | int | float | str) or v is None for _, v in fixes):
            sets = " ".join(f"--set {path}={json.dumps(v)}" for path, v in fixes)
            message += f"\na model trained with {model_type}'s values from the start exports: {sets}"
        raise HFConversionError(message)
    if model_type == "roberta" and spec.head.type == "classification" and spec.head.dropout:
        notes.append(f"head.dropout = {spec.head.dropout!r} (Hugging Face roberta's classification head "
                     "applies classifier_dropout before its dense layer too)")
    if warnings is not None:
        warnings.extend(_training_only_note(n, model_type) for n in notes)
    _set_token_ids(config, spec, token_ids or {}, notes=warnings)
    if imported_as is not None and EXPORTED_AS.get(imported_as) == model_type:
        theirs, own = _CLASS_PREFIXES[imported_as]
        config["model_type"] = imported_as
        config["architectures"] = [own + name.removeprefix(theirs) for name in config["architectures"]]
    _check_loadable(config, spec)
    return config


def _attentions_of(stack: Any) -> Iterator[tuple[str, Any]]:
    """(``attention`` or ``cross_attention``, its spec) of each layer of ``stack``, once each."""
    seen = set()
    for layer in stack.layers():
        for part in ("attention", "cross_attention"):
            att = getattr(layer, part, None)
            if att is not None and (part, att.head_dim, att.n_heads) not in seen:
                seen.add((part, att.head_dim, att.n_heads))
                yield part, att


def _check_loadable(config: dict[str, Any], spec: ModelSpec) -> None:
    """Refuse a config that the installed ``transformers``' config class refuses (recent
    Llama and Gemma 2 configs want a hidden size their head count divides, whatever their
    ``head_dim``), where ``from_pretrained`` would fail on the folder written. Without
    ``transformers`` there is nothing to check against."""
    try:
        import transformers
    except ImportError:
        return
    if config["model_type"] not in transformers.CONFIG_MAPPING:  # an older transformers: a newer one may load it
        return
    # a deep copy: a config class may write into the dicts it is given (Phi-3's sets
    # rope_parameters' original context from its own attribute)
    fields = copy.deepcopy({key: value for key, value in config.items() if key != "model_type"})
    try:
        transformers.AutoConfig.for_model(config["model_type"], **fields)
    except Exception as exc:  # noqa: BLE001 - a config class raises what it likes (ValueError, hub's validation errors)
        cause = exc.__cause__ or exc
        why = str(cause).strip().splitlines()[-1].strip().rstrip(".") if str(cause).strip() else type(cause).__name__
        message = (f"Hugging Face {config['model_type']} cannot load this spec's config: transformers "
                   f"{transformers.__version__} refuses it ({why})")
        if "not a multiple of the number of attention heads" in why:
            heads = sorted({stack.attention.n_heads for _, stack in spec.stacks()})
            message += (f"; d_model = {spec.d_model} with n_heads = {', '.join(map(str, heads))}: a d_model that "
                        "n_heads divides exports, whatever head_dim is")
        raise HFConversionError(message) from None


def _without_equivalents(spec: ModelSpec) -> ModelSpec:
    """``spec`` with the settings that compute the same outputs as the defaults written as
    the defaults: every attention ``backend`` (eager equals sdpa), and a ``scale`` equal to
    1/sqrt(head_dim). The export then neither refuses nor writes them."""
    def walk(node: Any) -> bool:
        changed = False
        if isinstance(node, dict):
            if "n_heads" in node and "backend" in node:
                if node["backend"] != "sdpa":
                    node["backend"], changed = "sdpa", True
                scale, head_dim = node.get("scale"), node.get("head_dim")
                if scale is not None and isinstance(head_dim, int) and math.isclose(scale, head_dim ** -0.5, rel_tol=1e-9):
                    node["scale"], changed = None, True
            for value in node.values():
                changed = walk(value) or changed
        elif isinstance(node, list):
            for value in node:
                changed = walk(value) or changed
        return changed

    data = spec.to_dict()
    return ModelSpec.model_validate(data) if walk(data) else spec


# the encoder families: masked-LM and classification heads export
_ENCODER_FAMILIES = ("bert", "roberta", "distilbert")


def _check_head_exports(spec: ModelSpec, model_type: str) -> None:
    """Refuse a classification head on a family whose sequence classifier is another one."""
    if spec.head.type != "classification" or model_type in _ENCODER_FAMILIES:
        return
    why = _CLASSIFIER_MISMATCH.get(spec.kind, "")
    raise HFConversionError(
        f"head: classification has no Hugging Face {model_type} equivalent: its ForSequenceClassification "
        f"model is another head ({why}); a classification head exports on a BERT or RoBERTa encoder "
        "(BertForSequenceClassification, RobertaForSequenceClassification: pooling first, pooler true; "
        "DistilBertForSequenceClassification: the same with pooler_activation relu)"
    )


_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_bos_token_id",
               "forced_eos_token_id")


def _set_token_ids(
    config: dict[str, Any], spec: ModelSpec, token_ids: Mapping[str, int | None], *, notes: list[str] | None
) -> None:
    unknown = sorted(set(token_ids) - set(_TOKEN_KEYS))
    if unknown:
        raise HFConversionError(f"token_ids: unknown keys {', '.join(unknown)}; allowed: {', '.join(_TOKEN_KEYS)}")
    ids: dict[str, int | None] = {key: token_ids.get(key) for key in _TOKEN_KEYS[:3]}
    if spec.kind == "encoder-decoder":
        start = token_ids.get("decoder_start_token_id")
        # Marian's decoder starts from its padding token
        fallback = ids["pad_token_id"] if config["model_type"] == "marian" else ids["bos_token_id"]
        ids["decoder_start_token_id"] = start if start is not None else fallback
        for key in ("forced_bos_token_id", "forced_eos_token_id"):
            # BartConfig's default forced_eos (2) would force a token the spec does not name
            if token_ids.get(key) is not None or config["model_type"] in ("bart", "marian"):
                ids[key] = token_ids.get(key)
    for key, value in ids.items():
        if value is not None and not (isinstance(value, int) and 0 <= value < spec.vocab_size):
            raise HFConversionError(
                f"{key} = {value!r} is not a token of the model (vocab_size {spec.vocab_size})"
            )
        if key in config and config[key] != value:
            # RoBERTa's pad_token_id also places its positions (offset = pad + 1): the spec's wins
            if value is not None and notes is not None:
                notes.append(
                    f"{config['model_type']} {key} is {config[key]} (it sets the position offset); "
                    f"the tokenizer's {value} is not written"
                )
            continue
        config[key] = value
    if config["model_type"] == "marian" and config.get("pad_token_id") is None:
        raise HFConversionError(
            "marian needs a padding token (transformers' Marian builds its token table with one, and its "
            "decoder starts from it): export with the model's tokenizer, or set embedding.padding_idx"
        )


def _resolved(spec: dict[str, Any]) -> dict[str, Any]:
    """A spec dict with the defaults that depend on other fields written out, so that a
    field left to its default compares equal to the same value given."""
    pos = spec.get("positional") or {}
    if pos.get("type") == "learned" and pos.get("max_positions") is None:
        pos["max_positions"] = spec["max_seq_len"] + pos.get("offset", 0)
    return spec


def _shown(value: Any) -> str:
    """A value in a refusal's line: a stack's overrides by the layers they change, a mapping
    without its unset (null) fields, anything else as Python writes it."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "layers" in v for v in value):
        layers = "; ".join(str(v["layers"]) for v in value)
        return f"{len(value)} per-layer override{'s' if len(value) > 1 else ''} (layers {layers})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v!r}" for k, v in value.items() if v is not None) + "}"
    return repr(value)


class _Absent:
    """A field one of two compared specs does not have (its type lacks it)."""

    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, a's value, b's value) for every leaf that differs; ``_ABSENT`` for a key one
    side lacks (a mapping of another type: a layernorm's ``bias`` beside an rmsnorm)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if path == "" and key in ("name", "training"):  # not part of the architecture
                continue
            yield from _differences(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}" if path else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{path}.{i}")
    elif a != b:
        yield path, a, b
