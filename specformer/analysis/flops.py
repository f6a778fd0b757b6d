"""Forward and training FLOPs per token from a spec alone.

Conventions (see ``docs/analysis.md``):

* Only matrix products are counted, 2 FLOPs per multiply-add, as in Kaplan et al. 2020
  ("Scaling Laws for Neural Language Models", table 1) and as
  ``torch.utils.flop_counter.FlopCounterMode`` does. Norms, activations, softmax,
  biases and residual additions are left out (well under 1% for real sizes).
* A linear layer costs ``2 · d_in · d_out`` per token it is applied to.
* Attention scores cost ``2 · H · Dh`` for ``Q Kᵀ`` plus ``2 · H · Dh`` for ``A V`` per
  query per attended key. ``count="needed"`` (the default) counts the keys a query
  really attends: ``(T + 1) / 2`` on average under a causal mask, ``min(t, W)`` with a
  sliding window W, all T keys in a bidirectional encoder. ``count="executed"`` counts
  what a dense attention kernel computes (every query against all T keys, masked or
  not), which is what ``FlopCounterMode`` reports.
* GQA changes only the k/v projections: each query head still scores every key.
* Encoder-decoder: the source and the target both have ``seq_len`` tokens and the
  figure is the whole forward pass divided by ``seq_len`` (per target token), so the
  encoder, the cross-attention k/v projections over the source and the decoder are
  all included.
* A training step (forward + backward) is 3× the forward: the backward computes
  gradients with respect to both activations and weights, two products per forward
  product (Kaplan et al. 2020, section 2.1). A masked-LM head is the exception: training
  runs it on the labelled tokens only (``mask_prob`` of them), so the step counts 3× its
  forward on those.
* A part built from a type registered by a plugin (an attention, an FFN, a head) has no
  formula here: it is left out of the counts and named in ``not_counted``, so that
  ``forward`` and ``training`` are then the FLOPs of the other parts only. Norms and
  positional schemes are outside the count whatever their type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from specformer.analysis.params import BUILT_IN_TYPES, as_spec, plugin_components, whole_number

__all__ = ["FlopCounts", "flops_per_token", "mean_attended_keys", "TRAINING_MULTIPLIER"]

TRAINING_MULTIPLIER = 3
Count = Literal["needed", "executed"]


@dataclass(frozen=True)
class FlopCounts:
    """FLOPs per token at ``seq_len``: ``forward``, ``training`` (3 × forward; a masked-LM
    head's part only for its ``mask_prob`` of labelled tokens), and the
    forward split into components (``decoder.attention.proj``, ``decoder.attention.scores``,
    ``decoder.cross_attention.proj``, ``decoder.cross_attention.scores``, ``decoder.ffn``,
    ``head``). ``not_counted`` names the parts built from a plugin's type, which have no
    formula and are left out of every figure (``{"decoder.ffn": "ffn type 'relu2'"}``)."""

    seq_len: int
    count: str
    forward: int
    training: int
    components: dict[str, int]
    not_counted: dict[str, str] = field(default_factory=dict)

    @property
    def non_embedding_forward(self) -> int:
        """Forward FLOPs without the output head (Kaplan et al.'s C_forward)."""
        return self.forward - self.components.get("head", 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "count": self.count,
            "forward": self.forward,
            "training": self.training,
            "components": dict(self.components),
            "not_counted": dict(self.not_counted),
        }


@lru_cache(maxsize=256)
def _attended_keys_total(seq_len: int, causal: bool, window: int | None) -> int:
    """Sum over the ``seq_len`` queries of the number of keys each one attends."""
    t = seq_len
    if window is None or window >= t:
        return t * (t + 1) // 2 if causal else t * t
    w = window
    if causal:
        # query i attends keys max(0, i - w + 1) .. i
        return w * (w + 1) // 2 + (t - w) * w
    # bidirectional window: keys j with |i - j| < w, 2w - 1 of them less those past either
    # end of the sequence: 1 + 2 + ... + (w - 1) at each end (w < t)
    return t * (2 * w - 1) - w * (w - 1)


def mean_attended_keys(seq_len: int, *, causal: bool, window: int | None = None) -> float:
    """Average number of keys a query attends to in a sequence of ``seq_len`` tokens."""
    return _attended_keys_total(seq_len, causal, window) / seq_len


def _attention_scores(att: Any, seq_len: int, *, causal: bool, count: Count) -> int:
    """FLOPs of Q Kᵀ and A V for one layer over a whole sequence (not per token)."""
    if count == "executed":
        keys_total = seq_len * seq_len
    else:
        keys_total = _attended_keys_total(seq_len, causal, att.sliding_window)
    return 2 * 2 * att.n_heads * att.head_dim * keys_total


def flops_per_token(spec: Any, seq_len: int | None = None, *, count: Count = "needed") -> FlopCounts:
    """Forward and training FLOPs per token of ``spec`` at ``seq_len`` (default: max_seq_len).

    See the module docstring for what is counted.
    """
    spec = as_spec(spec)
    if count not in ("needed", "executed"):
        raise ValueError(f"count must be 'needed' or 'executed', got {count!r}")
    t = whole_number("seq_len", seq_len) if seq_len is not None else spec.max_seq_len
    not_counted = {key: text for key, text in plugin_components(spec).items()
                   if key == "head" or key.endswith(("attention", ".ffn"))}
    d = spec.d_model
    # totals over one sequence of t tokens (per stack); divided by t at the end
    totals: dict[str, int] = {}

    def add(key: str, value: int) -> None:
        totals[key] = totals.get(key, 0) + value

    for role, stack in spec.stacks():
        causal = role == "decoder"
        for i in range(stack.n_layers):
            layer = stack.layer(i)
            att = layer.attention
            if att.type in BUILT_IN_TYPES["attention"]:
                h, hkv, dh = att.n_heads, att.n_kv_heads, att.head_dim
                add(f"{role}.attention.proj", t * 2 * (d * (h + 2 * hkv) * dh + h * dh * d))
                add(f"{role}.attention.scores", _attention_scores(att, t, causal=causal, count=count))
            ca = layer.cross_attention
            if (ca is not None and role == "decoder" and spec.kind == "encoder-decoder"
                    and ca.type in BUILT_IN_TYPES["attention"]):
                ch, ckv, cdh = ca.n_heads, ca.n_kv_heads, ca.head_dim
                # q and o over the t target tokens, k/v over the t source tokens
                add(f"{role}.cross_attention.proj", t * 2 * (2 * d * ch * cdh + d * 2 * ckv * cdh))
                add(f"{role}.cross_attention.scores", 2 * 2 * ch * cdh * t * t)
            ffn = layer.ffn
            if ffn.type in BUILT_IN_TYPES["ffn"]:
                n_mats = 3 if ffn.type == "glu" else 2
                add(f"{role}.ffn", t * 2 * n_mats * d * ffn.d_ff)
    head = spec.head
    if head.type == "lm":
        add("head", t * 2 * d * spec.vocab_size)
    elif head.type == "mlm":
        add("head", t * 2 * (d * d + d * spec.vocab_size))
    elif head.type == "classification":
        # one pooled vector per sequence
        add("head", 2 * (d * d * int(head.pooler) + d * head.n_classes))
    components = {k: round(v / t) for k, v in totals.items()}
    forward = round(sum(totals.values()) / t)
    trained = sum(totals.values())
    if head.type == "mlm":
        # training runs a masked-LM head on its labelled tokens only (MLMHead.loss)
        trained -= totals["head"] * (1 - getattr(spec.training.objective, "mask_prob", 1.0))
    return FlopCounts(
        seq_len=t,
        count=count,
        forward=forward,
        training=round(TRAINING_MULTIPLIER * trained / t),
        components=components,
        not_counted=not_counted,
    )
