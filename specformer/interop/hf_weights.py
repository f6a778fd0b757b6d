"""Hugging Face state dicts <-> specformer state dicts, both ways, per family.

Each family is a list of :class:`Rule` s, one per specformer tensor, naming the Hugging
Face tensors it is made of and how: copied, transposed (GPT-2's ``Conv1D`` stores
(in, out)), concatenated along rows (separate q, k, v -> the fused ``qkv_proj``; k, v ->
``kv_proj``) or regrouped from GPT-NeoX's per-head interleaved ``query_key_value``
((H, 3, Dh) rows -> (3, H, Dh)). The inverse of every rule is exact, so a round trip
returns the same tensors.

Conversions need no ``transformers``: they work on plain ``{name: Tensor}`` dicts.
Names follow the ``*For{CausalLM,MaskedLM,ConditionalGeneration}`` classes of
transformers (and ``{Bert,Roberta,DistilBert}ForSequenceClassification`` for a
classification head); checkpoints saved from the bare model (``GPT2Model``, ``BertModel``, ...) are
recognised by their missing prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from specformer.interop.hf_config import (
    HFConversionError,
    export_family,
    falcon_new_architecture,
    hf_family,
)
from specformer.specs.schema import ModelSpec

__all__ = ["Rule", "rules_for", "hf_to_specformer", "specformer_to_hf", "WeightReport"]

Fuse = Literal["copy", "transpose", "rows", "neox_qkv", "part", "rows_rotary", "grouped_qkv", "row"]


def _pair_order(head_dim: int, rot: int) -> Tensor:
    """The rows of one head in rotate-half order, taken from interleaved order: of its first
    ``rot`` rows the even ones, then the odd ones (GPT-J rotates pairs 2i, 2i + 1; rotate-half
    pairs i, i + rot/2), then the rest as they are."""
    return torch.cat((torch.arange(0, rot, 2), torch.arange(1, rot, 2), torch.arange(rot, head_dim)))


def _reorder_heads(t: Tensor, order: Tensor) -> Tensor:
    """Reorder the rows of each head of ``t`` (heads x head_dim rows) by ``order``."""
    dh = order.numel()
    return t.reshape(-1, dh, *t.shape[1:])[:, order].reshape(t.shape).contiguous()


@dataclass(frozen=True)
class Rule:
    """One specformer tensor ``ours`` made of the Hugging Face tensors ``theirs``.

    ``fuse``: ``copy`` (one tensor as is), ``transpose`` (one 2-D tensor, GPT-2 Conv1D),
    ``rows`` (concatenated along dim 0, split back by ``sizes``), ``neox_qkv`` (one
    tensor whose rows are grouped per head as (H, 3, Dh); ``sizes`` = (H, Dh)), ``part``
    (block ``sizes[0]`` of the ``sizes[1]`` equal blocks of rows of one tensor, which the
    rules of its other blocks share: Phi-3's ``gate_up_proj``), ``rows_rotary`` (q, k, v
    concatenated as ``rows``, with the rotated rows of each query and key head taken from
    interleaved pairs into rotate-half order: GPT-J; ``sizes`` = (q, kv, kv, Dh, rotated)),
    ``grouped_qkv`` (one tensor whose rows are grouped per key/value head as (Hkv, G + 2, Dh):
    the G query heads of the group, its key, its value; Falcon's new decoder architecture;
    ``sizes`` = (Hkv, G, Dh)), ``row`` (the one row of a (1, N) tensor: Marian's
    ``final_logits_bias``).
    """

    ours: str
    theirs: tuple[str, ...]
    fuse: Fuse = "copy"
    sizes: tuple[int, ...] = ()

    def to_ours(self, tensors: list[Tensor]) -> Tensor:
        if self.fuse == "copy":
            return tensors[0]
        if self.fuse == "row":  # the one row of a (1, N) tensor (Marian's final_logits_bias)
            return tensors[0].reshape(-1)
        if self.fuse == "transpose":
            return tensors[0].t().contiguous()
        if self.fuse == "rows":
            return torch.cat(tensors, dim=0)
        if self.fuse == "part":
            index, parts = self.sizes
            return tensors[0].chunk(parts, dim=0)[index].contiguous()
        if self.fuse == "rows_rotary":
            order = _pair_order(*self.sizes[3:])
            q, k, v = tensors
            return torch.cat((_reorder_heads(q, order), _reorder_heads(k, order), v), dim=0)
        if self.fuse == "grouped_qkv":
            hkv, g, dh = self.sizes
            t = tensors[0]
            grouped = t.reshape(hkv, g + 2, dh, *t.shape[1:])
            return torch.cat([part.reshape(-1, *t.shape[1:]) for part in grouped.split((g, 1, 1), dim=1)]).contiguous()
        h, dh = self.sizes
        t = tensors[0]
        return t.reshape(h, 3, dh, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()

    def to_theirs(self, tensor: Tensor) -> list[Tensor]:
        if self.fuse == "copy":
            return [tensor]
        if self.fuse == "row":
            return [tensor.reshape(1, -1)]
        if self.fuse == "transpose":
            return [tensor.t().contiguous()]
        if self.fuse == "rows":
            return [t.contiguous() for t in tensor.split(list(self.sizes), dim=0)]
        if self.fuse == "part":
            return [tensor]  # one block: specformer_to_hf stacks the blocks of each tensor
        if self.fuse == "rows_rotary":
            back = torch.argsort(_pair_order(*self.sizes[3:]))
            q, k, v = tensor.split(list(self.sizes[:3]), dim=0)
            return [_reorder_heads(q, back), _reorder_heads(k, back), v.contiguous()]
        if self.fuse == "grouped_qkv":
            hkv, g, dh = self.sizes
            rest = tensor.shape[1:]
            q, k, v = tensor.split((hkv * g * dh, hkv * dh, hkv * dh), dim=0)
            parts = (q.reshape(hkv, g, dh, *rest), k.reshape(hkv, 1, dh, *rest), v.reshape(hkv, 1, dh, *rest))
            return [torch.cat(parts, dim=1).reshape(tensor.shape).contiguous()]
        h, dh = self.sizes
        return [tensor.reshape(3, h, dh, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape).contiguous()]


@dataclass(frozen=True)
class _Family:
    """What a family's checkpoints look like besides the per-tensor rules."""

    prefix: str  # the base model's attribute in the *For... class ("transformer.", "model.")
    heads: tuple[str, ...]  # top-level names outside the base model (task heads)
    ignore: tuple[str, ...]  # regexes of tensors with no specformer counterpart (buffers, unused heads)
    tied_copies: tuple[str, ...] = ()  # names that hold a copy of the token embedding when tied
    aliases: tuple[tuple[str, str], ...] = ()  # (old-checkpoint regex, current name template)


_FAMILIES: dict[str, _Family] = {
    "gpt2": _Family(
        prefix="transformer.",
        heads=("lm_head.",),
        ignore=(r"\.attn\.(bias|masked_bias)$",),
        tied_copies=("lm_head.weight",),
    ),
    "gpt_bigcode": _Family(
        prefix="transformer.",
        heads=("lm_head.",),
        ignore=(),
        tied_copies=("lm_head.weight",),
    ),
    "opt": _Family(
        prefix="model.",
        heads=("lm_head.",),
        ignore=(),
        tied_copies=("lm_head.weight",),
    ),
    "bloom": _Family(
        prefix="transformer.",
        heads=("lm_head.",),
        ignore=(),
        tied_copies=("lm_head.weight",),
    ),
    "bert": _Family(
        prefix="bert.",
        heads=("cls.",),
        ignore=(r"embeddings\.(position_ids|token_type_ids)$", r"^bert\.pooler\.", r"^cls\.seq_relationship\."),
        tied_copies=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        aliases=((r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias")),
    ),
    "roberta": _Family(
        prefix="roberta.",
        heads=("lm_head.",),
        ignore=(r"embeddings\.(position_ids|token_type_ids)$", r"^roberta\.pooler\."),
        tied_copies=("lm_head.decoder.weight", "lm_head.decoder.bias"),
    ),
    "distilbert": _Family(
        prefix="distilbert.",
        heads=("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.", "classifier."),
        ignore=(r"embeddings\.position_ids$",),
        tied_copies=("vocab_projector.weight",),
    ),
    "marian": _Family(
        prefix="model.",
        heads=("lm_head.", "final_logits_bias"),
        ignore=(r"embed_positions\.weight$",),  # fixed sinusoids, computed (transformers does not save them)
        tied_copies=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"),
    ),
    "t5": _Family(
        prefix="",
        heads=("lm_head.",),
        ignore=(),
        tied_copies=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"),
    ),
    "bart": _Family(
        prefix="model.",
        heads=("lm_head.", "final_logits_bias"),
        ignore=(),
        tied_copies=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"),
    ),
    "llama": _Family(
        prefix="model.",
        heads=("lm_head.",),
        ignore=(r"rotary_emb\.(inv_freq|original_inv_freq)$",),
        tied_copies=("lm_head.weight",),
    ),
    "gpt_neox": _Family(
        prefix="gpt_neox.",
        heads=("lm_head.", "embed_out."),
        ignore=(r"\.attention\.(bias|masked_bias)$", r"rotary_emb\.(inv_freq|original_inv_freq)$"),
        tied_copies=("lm_head.weight",),
        aliases=((r"^embed_out\.weight$", "lm_head.weight"),),
    ),
    "starcoder2": _Family(
        prefix="model.",
        heads=("lm_head.",),
        ignore=(r"rotary_emb\.(inv_freq|original_inv_freq)$",),
        tied_copies=("lm_head.weight",),
    ),
    "phi": _Family(
        prefix="model.",
        heads=("lm_head.",),
        ignore=(r"rotary_emb\.(inv_freq|original_inv_freq)$",),
        tied_copies=("lm_head.weight",),
    ),
    "falcon": _Family(
        prefix="transformer.",
        heads=("lm_head.",),
        ignore=(r"rotary_emb\.(inv_freq|original_inv_freq)$",),
        tied_copies=("lm_head.weight",),
    ),
    "gptj": _Family(
        prefix="transformer.",
        heads=("lm_head.",),
        ignore=(r"\.attn\.(bias|masked_bias)$", r"embed_positions$"),
        tied_copies=("lm_head.weight",),
    ),
}
for _name in ("mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "olmo", "olmo2"):
    _FAMILIES[_name] = _FAMILIES["llama"]
# the tensors of a multimodal model's vision tower and projector
TOWERS = r"^(model\.)?(vision_tower|multi_modal_projector)\."
# Gemma 3's text model, alone or as the language model of the multimodal Gemma 3, whose
# vision tower and projector have no place in the spec (transformers 4.50 saved it as
# language_model.model.*, 5 as model.language_model.*, and its bare model as language_model.*)
_FAMILIES["gemma3_text"] = replace(
    _FAMILIES["llama"],
    ignore=(*_FAMILIES["llama"].ignore, TOWERS),
    aliases=((r"^language_model\.model\.", "model."), (r"^language_model\.lm_head\.", "lm_head."),
             (r"^model\.language_model\.", "model."), (r"^language_model\.", "model.")),
)


# --------------------------------------------------------------------------- rules per family


def _linear(ours: str, theirs: str | tuple[str, ...], bias: bool, fuse: Fuse = "copy",
            sizes: tuple[int, ...] = ()) -> Iterator[Rule]:
    names = (theirs,) if isinstance(theirs, str) else theirs
    yield Rule(f"{ours}.weight", tuple(f"{n}.weight" for n in names), fuse, sizes)
    if bias:
        bias_fuse: Fuse = "copy" if fuse == "transpose" else fuse
        yield Rule(f"{ours}.bias", tuple(f"{n}.bias" for n in names), bias_fuse, sizes)


def _norm(ours: str, theirs: str, norm: Any) -> Iterator[Rule]:
    if not getattr(norm, "weight", True):  # a LayerNorm without parameters (OLMo's)
        return
    yield Rule(f"{ours}.weight", (f"{theirs}.weight",))
    if getattr(norm, "bias", False):
        yield Rule(f"{ours}.bias", (f"{theirs}.bias",))


def _qkv_sizes(att: Any) -> tuple[int, int, int]:
    q, kv = att.n_heads * att.head_dim, att.n_kv_heads * att.head_dim
    return q, kv, kv


def _separate_qkv(ours: str, theirs: str, att: Any) -> Iterator[Rule]:
    """The fused ``qkv_proj`` of layer ``ours`` from the attention ``theirs``' separate
    ``q_proj``, ``k_proj`` and ``v_proj`` (rows concatenated)."""
    yield from _linear(f"{ours}.self_attn.qkv_proj", (f"{theirs}.q_proj", f"{theirs}.k_proj", f"{theirs}.v_proj"),
                       att.bias, "rows", _qkv_sizes(att))


def _lm_head(spec: ModelSpec, name: str = "lm_head") -> Iterator[Rule]:
    """The LM head's own weight when untied (tied, it is the token embeddings'), and its bias
    either way (Phi's and GPT-J's ``lm_head`` have one)."""
    if not spec.embedding.tie_output:
        yield from _linear("head.proj", name, spec.head.bias)
    elif spec.head.bias:
        yield Rule("head.bias", (f"{name}.bias",))


def _gpt2(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("transformer.wte.weight",))
    yield Rule("embed.positions.weight", ("transformer.wpe.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"transformer.h.{i}", s.layer(i)
        yield from _norm(f"{o}.attn_norm", f"{t}.ln_1", layer.norm)
        yield from _linear(f"{o}.self_attn.qkv_proj", f"{t}.attn.c_attn", True, "transpose")
        yield from _linear(f"{o}.self_attn.o_proj", f"{t}.attn.c_proj", True, "transpose")
        yield from _norm(f"{o}.ffn_norm", f"{t}.ln_2", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.mlp.c_fc", True, "transpose")
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.c_proj", True, "transpose")
    yield from _norm("decoder.final_norm", "transformer.ln_f", s.norm)
    yield from _lm_head(spec)


def _fused_qkv_layer(o: str, t: str, layer: Any, names: tuple[str, ...], qkv: Fuse = "neox_qkv") -> Iterator[Rule]:
    """The rules of layer ``o`` of a family whose attention has one fused q/k/v projection
    (``qkv``: how its rows are laid out) and whose layer has two norms; ``names``: its
    attn_norm, qkv_proj, o_proj, ffn_norm, up_proj and down_proj under ``t``."""
    att = layer.attention
    attn_norm, qkv_proj, o_proj, ffn_norm, up, down = (f"{t}.{name}" for name in names)
    yield from _norm(f"{o}.attn_norm", attn_norm, layer.norm)
    yield from _linear(f"{o}.self_attn.qkv_proj", qkv_proj, att.bias, qkv, (att.n_heads, att.head_dim))
    yield from _linear(f"{o}.self_attn.o_proj", o_proj, att.output_bias)
    yield from _norm(f"{o}.ffn_norm", ffn_norm, layer.norm)
    yield from _linear(f"{o}.ffn.up_proj", up, layer.ffn.bias)
    yield from _linear(f"{o}.ffn.down_proj", down, layer.ffn.bias)


def _gpt_bigcode(spec: ModelSpec) -> Iterator[Rule]:
    """GPT-2's names with linear layers; ``c_attn``'s rows are q, k, v with one key/value
    head (multi-query), and grouped per head as GPT-NeoX's with one per query head."""
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("transformer.wte.weight",))
    yield Rule("embed.positions.weight", ("transformer.wpe.weight",))
    names = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    for i in range(s.n_layers):
        layer = s.layer(i)
        qkv: Fuse = "copy" if layer.attention.n_kv_heads == 1 else "neox_qkv"
        yield from _fused_qkv_layer(f"decoder.layers.{i}", f"transformer.h.{i}", layer, names, qkv)
    yield from _norm("decoder.final_norm", "transformer.ln_f", s.norm)
    yield from _lm_head(spec)


def _opt(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.decoder.embed_tokens.weight",))
    yield Rule("embed.positions.weight", ("model.decoder.embed_positions.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.decoder.layers.{i}", s.layer(i)
        yield from _separate_qkv(o, f"{t}.self_attn", layer.attention)
        yield from _linear(f"{o}.self_attn.o_proj", f"{t}.self_attn.out_proj", layer.attention.output_bias)
        yield from _norm(f"{o}.attn_norm", f"{t}.self_attn_layer_norm", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.fc1", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.fc2", layer.ffn.bias)
        yield from _norm(f"{o}.ffn_norm", f"{t}.final_layer_norm", layer.norm)
    if s.final_norm:
        yield from _norm("decoder.final_norm", "model.decoder.final_layer_norm", s.norm)
    yield from _lm_head(spec)


def _check_pooler(head: Any, family: str, activation: str) -> None:
    """Refuse a classification head that is not ``family``'s: the first token through a dense
    layer and ``activation``."""
    if head.pooling != "first" or not head.pooler or head.pooler_activation != activation:
        described = f"pooling {head.pooling!r}, pooler {head.pooler}" + (
            f", pooler_activation {head.pooler_activation!r}" if head.pooler else "")
        cls = {"bert": "Bert", "roberta": "Roberta", "distilbert": "DistilBert"}[family]
        raise HFConversionError(
            f"a classification head with {described} has no {family} counterpart "
            f"({cls}ForSequenceClassification pools the first token through a dense + {activation} pooler)"
        )


def _bert_like(spec: ModelSpec, base: str) -> Iterator[Rule]:
    s = spec.encoder
    e = f"{base}.embeddings"
    yield Rule("embed.tokens.weight", (f"{e}.word_embeddings.weight",))
    yield Rule("embed.positions.weight", (f"{e}.position_embeddings.weight",))
    if spec.embedding.segment_vocab_size:
        yield Rule("embed.segments.weight", (f"{e}.token_type_embeddings.weight",))
    yield from _norm("embed.norm", f"{e}.LayerNorm", spec.embedding.norm)
    for i in range(s.n_layers):
        o, t, layer = f"encoder.layers.{i}", f"{base}.encoder.layer.{i}", s.layer(i)
        a = f"{t}.attention"
        yield from _linear(
            f"{o}.self_attn.qkv_proj",
            (f"{a}.self.query", f"{a}.self.key", f"{a}.self.value"),
            layer.attention.bias,
            "rows",
            _qkv_sizes(layer.attention),
        )
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.output.dense", layer.attention.bias)
        yield from _norm(f"{o}.attn_norm", f"{a}.output.LayerNorm", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.intermediate.dense", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.output.dense", layer.ffn.bias)
        yield from _norm(f"{o}.ffn_norm", f"{t}.output.LayerNorm", layer.norm)
    if spec.head.type == "mlm":
        h = "cls.predictions" if base == "bert" else "lm_head"
        dense, norm = ("transform.dense", "transform.LayerNorm") if base == "bert" else ("dense", "layer_norm")
        yield from _linear("head.transform.dense", f"{h}.{dense}", True)
        yield Rule("head.transform.norm.weight", (f"{h}.{norm}.weight",))
        yield Rule("head.transform.norm.bias", (f"{h}.{norm}.bias",))
        if spec.head.bias:
            yield Rule("head.bias", (f"{h}.bias",))
        if not spec.embedding.tie_output:
            yield Rule("head.proj.weight", (f"{h}.decoder.weight",))
    elif spec.head.type == "classification":
        _check_pooler(spec.head, base, "tanh")
        # BERT's pooler belongs to the base model; RoBERTa's classifier holds its own
        pooler, classifier = ("bert.pooler.dense", "classifier") if base == "bert" else (
            "classifier.dense", "classifier.out_proj")
        yield from _linear("head.pooler", pooler, True)
        yield from _linear("head.classifier", classifier, True)


def _distilbert(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.encoder
    e = "distilbert.embeddings"
    yield Rule("embed.tokens.weight", (f"{e}.word_embeddings.weight",))
    yield Rule("embed.positions.weight", (f"{e}.position_embeddings.weight",))
    yield from _norm("embed.norm", f"{e}.LayerNorm", spec.embedding.norm)
    for i in range(s.n_layers):
        o, t, layer = f"encoder.layers.{i}", f"distilbert.transformer.layer.{i}", s.layer(i)
        a = f"{t}.attention"
        yield from _linear(f"{o}.self_attn.qkv_proj", (f"{a}.q_lin", f"{a}.k_lin", f"{a}.v_lin"),
                           layer.attention.bias, "rows", _qkv_sizes(layer.attention))
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.out_lin", layer.attention.output_bias)
        yield from _norm(f"{o}.attn_norm", f"{t}.sa_layer_norm", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.ffn.lin1", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.ffn.lin2", layer.ffn.bias)
        yield from _norm(f"{o}.ffn_norm", f"{t}.output_layer_norm", layer.norm)
    if spec.head.type == "mlm":
        yield from _linear("head.transform.dense", "vocab_transform", True)
        yield Rule("head.transform.norm.weight", ("vocab_layer_norm.weight",))
        yield Rule("head.transform.norm.bias", ("vocab_layer_norm.bias",))
        if spec.head.bias:
            yield Rule("head.bias", ("vocab_projector.bias",))
        if not spec.embedding.tie_output:
            yield Rule("head.proj.weight", ("vocab_projector.weight",))
    elif spec.head.type == "classification":
        _check_pooler(spec.head, "distilbert", "relu")
        yield from _linear("head.pooler", "pre_classifier", True)
        yield from _linear("head.classifier", "classifier", True)


def _t5(spec: ModelSpec) -> Iterator[Rule]:
    yield Rule("embed.tokens.weight", ("shared.weight",))
    for role in ("encoder", "decoder"):
        s = getattr(spec, role)
        for i in range(s.n_layers):
            o, t, layer = f"{role}.layers.{i}", f"{role}.block.{i}.layer", s.layer(i)
            yield from _norm(f"{o}.attn_norm", f"{t}.0.layer_norm", layer.norm)
            sa = f"{t}.0.SelfAttention"
            yield from _linear(f"{o}.self_attn.qkv_proj", (f"{sa}.q", f"{sa}.k", f"{sa}.v"), False,
                               "rows", _qkv_sizes(layer.attention))
            yield from _linear(f"{o}.self_attn.o_proj", f"{sa}.o", False)
            ffn_index = 1
            if role == "decoder":
                ca = f"{t}.1.EncDecAttention"
                kv = _qkv_sizes(layer.cross_attention)[1:]
                yield from _norm(f"{o}.cross_norm", f"{t}.1.layer_norm", layer.norm)
                yield from _linear(f"{o}.cross_attn.q_proj", f"{ca}.q", False)
                yield from _linear(f"{o}.cross_attn.kv_proj", (f"{ca}.k", f"{ca}.v"), False, "rows", kv)
                yield from _linear(f"{o}.cross_attn.o_proj", f"{ca}.o", False)
                ffn_index = 2
            f = f"{t}.{ffn_index}"
            yield from _norm(f"{o}.ffn_norm", f"{f}.layer_norm", layer.norm)
            if layer.ffn.type == "glu":
                yield from _linear(f"{o}.ffn.gate_proj", f"{f}.DenseReluDense.wi_0", False)
                yield from _linear(f"{o}.ffn.up_proj", f"{f}.DenseReluDense.wi_1", False)
            else:
                yield from _linear(f"{o}.ffn.up_proj", f"{f}.DenseReluDense.wi", False)
            yield from _linear(f"{o}.ffn.down_proj", f"{f}.DenseReluDense.wo", False)
        # HF keeps the stack's one relative-bias table in its first layer
        yield Rule(f"{role}.rel_bias.weight", (f"{role}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",))
        yield from _norm(f"{role}.final_norm", f"{role}.final_layer_norm", s.norm)
    yield from _lm_head(spec)


def _bart(spec: ModelSpec) -> Iterator[Rule]:
    if spec.embedding.share_encoder_decoder:
        yield Rule("embed.tokens.weight", ("model.shared.weight",))
    else:  # untied: transformers 5 gives each stack its own table (and leaves `shared` unused)
        yield Rule("embed.tokens.weight", ("model.encoder.embed_tokens.weight",))
        yield Rule("decoder_embed.tokens.weight", ("model.decoder.embed_tokens.weight",))
    for role, embed in (("encoder", "embed"), ("decoder", "decoder_embed")):
        s, m = getattr(spec, role), f"model.{role}"
        yield Rule(f"{embed}.positions.weight", (f"{m}.embed_positions.weight",))
        yield from _norm(f"{embed}.norm", f"{m}.layernorm_embedding", spec.embedding.norm)
        for i in range(s.n_layers):
            o, t, layer = f"{role}.layers.{i}", f"{m}.layers.{i}", s.layer(i)
            sa, bias = f"{t}.self_attn", layer.attention.bias
            yield from _linear(f"{o}.self_attn.qkv_proj", (f"{sa}.q_proj", f"{sa}.k_proj", f"{sa}.v_proj"),
                               bias, "rows", _qkv_sizes(layer.attention))
            yield from _linear(f"{o}.self_attn.o_proj", f"{sa}.out_proj", bias)
            yield from _norm(f"{o}.attn_norm", f"{t}.self_attn_layer_norm", layer.norm)
            if role == "decoder":
                ca, kv = f"{t}.encoder_attn", _qkv_sizes(layer.cross_attention)[1:]
                yield from _linear(f"{o}.cross_attn.q_proj", f"{ca}.q_proj", bias)
                yield from _linear(f"{o}.cross_attn.kv_proj", (f"{ca}.k_proj", f"{ca}.v_proj"), bias, "rows", kv)
                yield from _linear(f"{o}.cross_attn.o_proj", f"{ca}.out_proj", bias)
                yield from _norm(f"{o}.cross_norm", f"{t}.encoder_attn_layer_norm", layer.norm)
            yield from _linear(f"{o}.ffn.up_proj", f"{t}.fc1", layer.ffn.bias)
            yield from _linear(f"{o}.ffn.down_proj", f"{t}.fc2", layer.ffn.bias)
            yield from _norm(f"{o}.ffn_norm", f"{t}.final_layer_norm", layer.norm)
    yield from _lm_head(spec)


def _marian(spec: ModelSpec) -> Iterator[Rule]:
    """BART's layer names, one token table (``model.shared``), no position tables (fixed
    sinusoids) and no embedding LayerNorm, and the output bias ``final_logits_bias``."""
    if spec.embedding.share_encoder_decoder:
        yield Rule("embed.tokens.weight", ("model.shared.weight",))
    else:  # untied: transformers 5 gives each stack its own table (and leaves `shared` unused)
        yield Rule("embed.tokens.weight", ("model.encoder.embed_tokens.weight",))
        yield Rule("decoder_embed.tokens.weight", ("model.decoder.embed_tokens.weight",))
    yield from (rule for rule in _bart(spec) if not rule.ours.startswith(("embed.", "decoder_embed.", "head.")))
    # a head without a bias exports as a final_logits_bias of zeros (specformer_to_hf)
    if spec.embedding.tie_output:
        if spec.head.bias:
            yield Rule("head.bias", ("final_logits_bias",), "row")
    else:
        yield Rule("head.proj.weight", ("lm_head.weight",))
        if spec.head.bias:
            yield Rule("head.proj.bias", ("final_logits_bias",), "row")


def _llama(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        a = f"{t}.self_attn"
        yield from _norm(f"{o}.attn_norm", f"{t}.input_layernorm", layer.norm)
        yield from _separate_qkv(o, a, layer.attention)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.o_proj", layer.attention.output_bias)
        if layer.attention.qk_norm != "none":  # Qwen3
            yield from _norm(f"{o}.self_attn.q_norm", f"{a}.q_norm", None)
            yield from _norm(f"{o}.self_attn.k_norm", f"{a}.k_norm", None)
        yield from _norm(f"{o}.ffn_norm", f"{t}.post_attention_layernorm", layer.norm)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield from _linear(f"{o}.ffn.{proj}", f"{t}.mlp.{proj}", layer.ffn.bias)
    yield from _norm("decoder.final_norm", "model.norm", s.norm)
    yield from _lm_head(spec)


def _gemma2(spec: ModelSpec) -> Iterator[Rule]:
    """Gemma 2 and 3: Llama's names, with a norm before and after each sublayer (and Gemma 3's
    query and key norms)."""
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        a = f"{t}.self_attn"
        yield from _norm(f"{o}.attn_norm", f"{t}.input_layernorm", layer.norm)
        yield from _separate_qkv(o, a, layer.attention)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.o_proj", layer.attention.output_bias)
        if layer.attention.qk_norm != "none":  # Gemma 3
            yield from _norm(f"{o}.self_attn.q_norm", f"{a}.q_norm", None)
            yield from _norm(f"{o}.self_attn.k_norm", f"{a}.k_norm", None)
        yield from _norm(f"{o}.attn_post_norm", f"{t}.post_attention_layernorm", layer.norm)
        yield from _norm(f"{o}.ffn_norm", f"{t}.pre_feedforward_layernorm", layer.norm)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield from _linear(f"{o}.ffn.{proj}", f"{t}.mlp.{proj}", layer.ffn.bias)
        yield from _norm(f"{o}.ffn_post_norm", f"{t}.post_feedforward_layernorm", layer.norm)
    yield from _norm("decoder.final_norm", "model.norm", s.norm)
    yield from _lm_head(spec)


def _olmo2(spec: ModelSpec) -> Iterator[Rule]:
    """OLMo 2: Llama's names, its norms on each sublayer's output (``post_attention_layernorm``,
    ``post_feedforward_layernorm``), query and key norms over the whole projection."""
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        a = f"{t}.self_attn"
        yield from _separate_qkv(o, a, layer.attention)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.o_proj", layer.attention.output_bias)
        yield from _norm(f"{o}.self_attn.q_norm", f"{a}.q_norm", None)
        yield from _norm(f"{o}.self_attn.k_norm", f"{a}.k_norm", None)
        yield from _norm(f"{o}.attn_norm", f"{t}.post_attention_layernorm", layer.norm)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            yield from _linear(f"{o}.ffn.{proj}", f"{t}.mlp.{proj}", layer.ffn.bias)
        yield from _norm(f"{o}.ffn_norm", f"{t}.post_feedforward_layernorm", layer.norm)
    yield from _norm("decoder.final_norm", "model.norm", s.norm)
    yield from _lm_head(spec)


def _phi3(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        yield from _norm(f"{o}.attn_norm", f"{t}.input_layernorm", layer.norm)
        yield from _linear(f"{o}.self_attn.qkv_proj", f"{t}.self_attn.qkv_proj", False)
        yield from _linear(f"{o}.self_attn.o_proj", f"{t}.self_attn.o_proj", False)
        yield from _norm(f"{o}.ffn_norm", f"{t}.post_attention_layernorm", layer.norm)
        for index, proj in enumerate(("gate_proj", "up_proj")):  # gate_up_proj's rows: gate, then up
            yield Rule(f"{o}.ffn.{proj}.weight", (f"{t}.mlp.gate_up_proj.weight",), "part", (index, 2))
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.down_proj", False)
    yield from _norm("decoder.final_norm", "model.norm", s.norm)
    yield from _lm_head(spec)


def _gpt_neox(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("gpt_neox.embed_in.weight",))
    names = ("input_layernorm", "attention.query_key_value", "attention.dense", "post_attention_layernorm",
             "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    for i in range(s.n_layers):
        yield from _fused_qkv_layer(f"decoder.layers.{i}", f"gpt_neox.layers.{i}", s.layer(i), names)
    yield from _norm("decoder.final_norm", "gpt_neox.final_layer_norm", s.norm)
    yield from _lm_head(spec)


def _bloom(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("transformer.word_embeddings.weight",))
    yield from _norm("embed.norm", "transformer.word_embeddings_layernorm", spec.embedding.norm)
    # q/k/v rows per head, (H, 3, Dh), as GPT-NeoX's
    names = ("input_layernorm", "self_attention.query_key_value", "self_attention.dense",
             "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    for i in range(s.n_layers):
        yield from _fused_qkv_layer(f"decoder.layers.{i}", f"transformer.h.{i}", s.layer(i), names)
    yield from _norm("decoder.final_norm", "transformer.ln_f", s.norm)
    yield from _lm_head(spec)


def _phi(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        a, att = f"{t}.self_attn", layer.attention
        yield from _norm(f"{o}.attn_norm", f"{t}.input_layernorm", layer.norm)
        yield from _separate_qkv(o, a, att)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.dense", att.output_bias)
        if att.qk_norm != "none":  # qk_layernorm: a LayerNorm over each query and key head
            for ours, theirs in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
                yield Rule(f"{o}.self_attn.{ours}.weight", (f"{a}.{theirs}.weight",))
                yield Rule(f"{o}.self_attn.{ours}.bias", (f"{a}.{theirs}.bias",))
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.mlp.fc1", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.fc2", layer.ffn.bias)
    yield from _norm("decoder.final_norm", "model.final_layernorm", s.norm)
    yield from _lm_head(spec)


def _gptj(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("transformer.wte.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"transformer.h.{i}", s.layer(i)
        a, att = f"{t}.attn", layer.attention
        rot = int(att.head_dim * spec.positional.fraction)
        yield from _norm(f"{o}.attn_norm", f"{t}.ln_1", layer.norm)
        yield from _linear(f"{o}.self_attn.qkv_proj", (f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"),
                           att.bias, "rows_rotary", (*_qkv_sizes(att), att.head_dim, rot))
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.out_proj", att.output_bias)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.mlp.fc_in", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.fc_out", layer.ffn.bias)
    yield from _norm("decoder.final_norm", "transformer.ln_f", s.norm)
    yield from _lm_head(spec)


def _falcon(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("transformer.word_embeddings.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"transformer.h.{i}", s.layer(i)
        att, a = layer.attention, f"{t}.self_attention"
        shared = layer.residual.shared_norm
        two = layer.residual.type == "parallel" and not shared  # a norm for each parallel branch
        if falcon_new_architecture(att, layer.residual):  # as the export writes it
            layout: tuple[Fuse, tuple[int, ...]] = ("grouped_qkv", (att.n_kv_heads, att.n_heads // att.n_kv_heads,
                                                                    att.head_dim))
        elif att.n_kv_heads == 1:
            layout = ("copy", ())  # Falcon-7B: rows q, k, v, as specformer's
        else:
            layout = ("neox_qkv", (att.n_heads, att.head_dim))  # (H, 3, Dh), GPT-NeoX's
        yield from _norm(f"{o}.attn_norm", f"{t}.ln_attn" if two else f"{t}.input_layernorm", layer.norm)
        yield from _linear(f"{o}.self_attn.qkv_proj", f"{a}.query_key_value", att.bias, *layout)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.dense", att.output_bias)
        if not shared:
            yield from _norm(f"{o}.ffn_norm", f"{t}.ln_mlp" if two else f"{t}.post_attention_layernorm", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.mlp.dense_h_to_4h", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.dense_4h_to_h", layer.ffn.bias)
    yield from _norm("decoder.final_norm", "transformer.ln_f", s.norm)
    yield from _lm_head(spec)


def _starcoder2(spec: ModelSpec) -> Iterator[Rule]:
    s = spec.decoder
    yield Rule("embed.tokens.weight", ("model.embed_tokens.weight",))
    for i in range(s.n_layers):
        o, t, layer = f"decoder.layers.{i}", f"model.layers.{i}", s.layer(i)
        a, att = f"{t}.self_attn", layer.attention
        yield from _norm(f"{o}.attn_norm", f"{t}.input_layernorm", layer.norm)
        yield from _separate_qkv(o, a, att)
        yield from _linear(f"{o}.self_attn.o_proj", f"{a}.o_proj", att.output_bias)
        yield from _norm(f"{o}.ffn_norm", f"{t}.post_attention_layernorm", layer.norm)
        yield from _linear(f"{o}.ffn.up_proj", f"{t}.mlp.c_fc", layer.ffn.bias)
        yield from _linear(f"{o}.ffn.down_proj", f"{t}.mlp.c_proj", layer.ffn.bias)
    yield from _norm("decoder.final_norm", "model.norm", s.norm)
    yield from _lm_head(spec)


_RULES: dict[str, Callable[[ModelSpec], Iterator[Rule]]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "opt": _opt,
    "bert": lambda spec: _bert_like(spec, "bert"),
    "roberta": lambda spec: _bert_like(spec, "roberta"),
    "distilbert": _distilbert,
    "t5": _t5,
    "bart": _bart,
    "marian": _marian,
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "phi3": _phi3,
    "gemma": _llama,
    "gemma2": _gemma2,
    "gemma3_text": _gemma2,
    "olmo": _llama,
    "olmo2": _olmo2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "phi": _phi,
    "gptj": _gptj,
    "falcon": _falcon,
    "starcoder2": _starcoder2,
}


def rules_for(spec: ModelSpec, model_type: str | None = None) -> list[Rule]:
    """Every conversion rule of ``spec``'s Hugging Face family (default: :func:`hf_family`)."""
    model_type = model_type or export_family(spec)
    return list(_RULES[model_type](spec))


# --------------------------------------------------------------------------- conversion


@dataclass
class WeightReport:
    """What a conversion left aside: HF tensors with no counterpart that were dropped
    as known buffers/unused heads (``ignored``), and tied copies checked and dropped."""

    ignored: list[str]
    tied: list[str]


def _normalise(state_dict: Mapping[str, Tensor], family: _Family) -> dict[str, Tensor]:
    out = {}
    for name, tensor in state_dict.items():
        for pattern, template in family.aliases:
            name = re.sub(pattern, template, name)
        out[name] = tensor
    if family.prefix and not any(n.startswith(family.prefix) for n in out):
        # saved from the bare base model (GPT2Model, BertModel, LlamaModel, ...)
        out = {n if n.startswith(family.heads) else family.prefix + n: t for n, t in out.items()}
    return out


def _spec_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter of ``spec``'s model, by state-dict name (none for a plugin's)."""
    from specformer.analysis.params import AnalysisError, parameter_shapes

    try:
        return {name: tuple(shape) for name, shape in parameter_shapes(spec).items()}
    except AnalysisError:
        return {}


def _shapes_of(names: Sequence[str], tensors: Sequence[Tensor]) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(names, tensors, strict=True))


def _verb(tensors: Sequence[Tensor]) -> str:
    return "does" if len(tensors) == 1 else "do"


def _wanted(want: Mapping[str, tuple[int, ...]], name: str) -> str:
    return f" {want[name]}" if name in want else ""


def _short_list(names: list[str], n: int = 8) -> str:
    more = f" (and {len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def hf_to_specformer(
    state_dict: Mapping[str, Tensor], spec: ModelSpec, *, model_type: str | None = None
) -> tuple[dict[str, Tensor], WeightReport]:
    """Convert a Hugging Face state dict to specformer names for ``spec``.

    Raises :class:`HFConversionError` listing missing tensors, tensors with no
    counterpart, shape mismatches, or a tied output matrix that differs from the token
    embeddings (a checkpoint that is not tied; import it with ``tie_output: false``).
    """
    model_type = model_type or _checkpoint_family(state_dict, hf_family(spec))
    family = _FAMILIES[model_type]
    theirs, unused = _live_tensors(_normalise(state_dict, family), model_type, spec)
    rules = rules_for(spec, model_type)
    out: dict[str, Tensor] = {}
    missing: list[str] = []
    used: set[str] = set()
    want = _spec_shapes(spec)
    for rule in rules:
        absent = [n for n in rule.theirs if n not in theirs]
        if absent:
            missing.extend(absent)
            continue
        used.update(rule.theirs)
        tensors = [theirs[n] for n in rule.theirs]
        try:
            converted = rule.to_ours(tensors)
        except (RuntimeError, ValueError):  # a fused tensor's reshape that its size does not allow
            converted = None
        if converted is None or (rule.ours in want and tuple(converted.shape) != want[rule.ours]):
            raise HFConversionError(
                f"the {model_type} checkpoint's {_shapes_of(rule.theirs, tensors)} {_verb(tensors)} not fit the spec's "
                f"{rule.ours}{_wanted(want, rule.ours)}: the config (or spec) does not describe these weights"
            )
        out[rule.ours] = converted
    if missing:
        head = {n for r in rules if r.ours.startswith("head.") for n in r.theirs}
        why = ""
        if set(missing) <= head:
            why = (f"; it has no weights for the spec's {spec.head.type} head: it was saved from a model "
                   "without that head (the bare base model, or one with another task's head)")
            output = {n for r in rules if r.ours == "head.proj.weight" for n in r.theirs}
            if not spec.embedding.tie_output and set(missing) <= output:
                why += (", or with its output layer tied to the token embeddings while config.json says "
                        "tie_word_embeddings: false (transformers would start that layer from random values; "
                        "if the model was trained tied, set it true)")
        raise HFConversionError(
            f"the {model_type} checkpoint lacks {len(missing)} tensor(s) the spec needs: "
            f"{_short_list(missing)}{why}"
        )
    report = WeightReport(ignored=unused, tied=[])
    unexpected = []
    for name in theirs:
        if name in used:
            continue
        tensor = theirs[name]
        copy_of = _copy_of(name, family, spec, out) if name in family.tied_copies else None
        if copy_of is not None:
            if tensor.shape != copy_of.shape or not torch.equal(tensor.to(copy_of.dtype), copy_of):
                if name.endswith("embed_tokens.weight"):
                    raise HFConversionError(
                        f"{name} differs from the shared token table; specformer's encoder and "
                        "decoder read one table"
                    )
                raise HFConversionError(
                    f"{name} differs from the token embeddings, so this checkpoint's output layer is "
                    "not tied; use a spec with embedding.tie_output: false"
                )
            report.tied.append(name)
        elif name == "final_logits_bias":
            if torch.count_nonzero(tensor):
                raise HFConversionError(
                    "final_logits_bias is non-zero; specformer's BART head has no logits bias"
                )
            report.ignored.append(name)
        elif any(re.search(p, name) for p in family.ignore):
            report.ignored.append(name)
        else:
            unexpected.append(name)
    if unexpected:
        why = ""
        if family.prefix and not any(n.startswith(family.prefix) for n in unexpected):
            why = (f"; they are a task head's, not the spec's {spec.head.type} head: the config should "
                   "name the checkpoint's model class in \"architectures\"")
        raise HFConversionError(
            f"the {model_type} checkpoint has {len(unexpected)} tensor(s) the spec has no place for: "
            f"{_short_list(unexpected)}{why}"
        )
    return out, report


def _checkpoint_family(state_dict: Mapping[str, Tensor], family: str) -> str:
    """The family whose names a checkpoint of a spec of ``family`` has: a Phi-3 that rotates
    every feature has a Llama's (or, windowed, a Mistral's) spec and its own fused names."""
    if family in ("llama", "mistral") and any(n.endswith("self_attn.qkv_proj.weight") for n in state_dict):
        return "phi3"
    if family in ("gpt_neox", "gptj", "phi") and any(n.endswith("self_attention.query_key_value.weight")
                                                     for n in state_dict):
        return "falcon"  # a Falcon with one key/value head per query head (or biases): another's structure
    if family in ("gpt_neox", "falcon") and any(n.endswith("mlp.c_fc.weight") for n in state_dict):
        return "starcoder2"  # a StarCoder2 without a window whose keys are GPT-NeoX's or Falcon's
    if family == "gpt2" and any(n.endswith("attn.c_attn.weight") and t.dim() == 2 and t.shape[0] > t.shape[1]
                                for n, t in state_dict.items()):
        return "gpt_bigcode"  # a GPT-BigCode with a key/value head per query head: linear (out, in) layers
    return family


def _live_tensors(
    theirs: dict[str, Tensor], model_type: str, spec: ModelSpec
) -> tuple[dict[str, Tensor], list[str]]:
    """``theirs`` with the tensors that transformers computes with under the names the rules
    read, and the names of the tensors it then leaves unused.

    With an untied output layer, transformers 5 gives a BERT/RoBERTa head's decoder its own
    bias (the head's ``bias`` is then unused) and each BART stack its own token table
    (``shared`` is then unused); 4.x held one tensor for each pair, so either name served.
    """
    unused: list[str] = []
    if spec.embedding.tie_output:
        return theirs, unused
    theirs = dict(theirs)

    def take(live_name: str, read_name: str) -> None:
        live = theirs.pop(live_name)
        old = theirs.get(read_name)
        if old is not None and not torch.equal(old, live):
            unused.append(read_name)
        theirs[read_name] = live

    if model_type in ("bert", "roberta") and spec.head.type == "mlm" and spec.head.bias:
        h = "cls.predictions" if model_type == "bert" else "lm_head"
        if f"{h}.decoder.bias" in theirs:
            take(f"{h}.decoder.bias", f"{h}.bias")
    if model_type in ("bart", "marian") and not spec.embedding.share_encoder_decoder:
        # each stack reads its own table (a 4.x checkpoint holds the one they shared)
        shared = theirs.pop("model.shared.weight", None)
        tables = [f"model.{role}.embed_tokens.weight" for role in ("encoder", "decoder")]
        if shared is not None:
            if all(name in theirs for name in tables):
                unused.append("model.shared.weight")
            for name in tables:
                theirs.setdefault(name, shared)
    elif model_type in ("bart", "marian"):
        enc, dec = theirs.get("model.encoder.embed_tokens.weight"), theirs.get("model.decoder.embed_tokens.weight")
        if enc is not None and dec is not None:
            if enc.shape != dec.shape or not torch.equal(enc, dec):
                raise HFConversionError(
                    "model.encoder.embed_tokens.weight and model.decoder.embed_tokens.weight differ: "
                    "each BART stack has its own token table, and the spec's encoder and decoder read one; "
                    "import it with embedding.share_encoder_decoder: false"
                )
            theirs["model.encoder.embed_tokens.weight"] = enc
            take("model.decoder.embed_tokens.weight", "model.shared.weight")
            theirs["model.decoder.embed_tokens.weight"] = dec
    return theirs, unused


def _copy_of(name: str, family: _Family, spec: ModelSpec, ours: Mapping[str, Tensor]) -> Tensor | None:
    """The specformer tensor that the HF tied copy ``name`` must equal, or None when
    ``name`` is not a copy for this spec."""
    if name not in family.tied_copies or spec.head.type == "classification":
        return None
    if name.endswith("decoder.bias"):  # BERT/RoBERTa: the decoder's bias is the head bias
        return ours.get("head.bias")
    if name.endswith("embed_tokens.weight"):  # T5/BART stacks point at the shared table
        return ours["embed.tokens.weight"] if spec.embedding.share_encoder_decoder else None
    return ours["embed.tokens.weight"] if spec.embedding.tie_output else None


def specformer_to_hf(
    state_dict: Mapping[str, Tensor], spec: ModelSpec, *, model_type: str | None = None
) -> dict[str, Tensor]:
    """Convert a specformer state dict for ``spec`` to Hugging Face names (tied copies
    included, as in ``PreTrainedModel.state_dict()``)."""
    model_type = model_type or export_family(spec)
    family = _FAMILIES[model_type]
    rules = rules_for(spec, model_type)
    expected = {r.ours for r in rules}
    missing = sorted(expected - set(state_dict))
    extra = sorted(set(state_dict) - expected)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_short_list(missing)}")
        if extra:
            parts.append(f"with no {model_type} counterpart {_short_list(extra)}")
        raise HFConversionError(f"the state dict does not match the spec: {'; '.join(parts)}")
    want = _spec_shapes(spec)
    wrong = [f"{name} {tuple(state_dict[name].shape)} (the spec's {want[name]})" for name in dict.fromkeys(r.ours for r in rules)
             if name in want and tuple(state_dict[name].shape) != want[name]]
    if wrong:
        raise HFConversionError(f"the weights do not fit the spec: {len(wrong)} tensor(s) of other shapes, "
                                f"{_short_list(wrong)}")
    out: dict[str, Tensor] = {}
    blocks: dict[str, dict[int, Tensor]] = {}  # the blocks of rows of a tensor that several rules share
    for rule in rules:
        if rule.fuse == "part":
            blocks.setdefault(rule.theirs[0], {})[rule.sizes[0]] = state_dict[rule.ours]
            continue
        for name, tensor in zip(rule.theirs, rule.to_theirs(state_dict[rule.ours]), strict=True):
            out[name] = tensor
    for name, parts in blocks.items():
        out[name] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
    for name in family.tied_copies:
        value = _copy_of(name, family, spec, state_dict)
        if value is not None:
            out[name] = value
    if model_type == "marian":  # the fixed sinusoids transformers holds as a table, in halves
        from specformer.components.positional import sinusoidal_table

        table = sinusoidal_table(spec.max_seq_len, spec.d_model, spec.positional.base, "halves")
        for role in ("encoder", "decoder"):
            out[f"model.{role}.embed_positions.weight"] = table.to(state_dict["embed.tokens.weight"].dtype)
    if model_type == "bart" or (model_type == "marian" and not spec.head.bias):  # no bias: zeros
        out["final_logits_bias"] = torch.zeros(1, spec.vocab_size, dtype=state_dict["embed.tokens.weight"].dtype)
    if model_type in ("bart", "marian"):
        # untied, `shared` is a parameter transformers computes nothing with: the encoder's table
        out.setdefault("model.shared.weight", state_dict["embed.tokens.weight"])
    return out
