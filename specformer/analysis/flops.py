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
* With ``training.optimizer.freeze``, the step is the forward plus the backward products
  autograd runs (:mod:`specformer.analysis.gradflow`): a linear layer's input gradient
  where something below it trains, its weight gradient where its weight trains;
  attention's ``dQ``, ``dK``, ``dV`` where Q, K, V need a gradient and ``dA`` where Q or K
  does. Below the lowest trained parameter nothing is differentiated: freezing the
  embeddings and the lower half of the layers removes all their backward work.
  Embedding lookups have no products. ``trained_parameters`` and ``parameters`` say how
  many of the parameters train.
* A part built from a type registered by a plugin (an attention, an FFN, a head) has no
  formula here: it is left out of the counts and named in ``not_counted``, so that
  ``forward`` and ``training`` are then the FLOPs of the other parts only. Norms and
  positional schemes are outside the count whatever their type.
* The output head's part of a training step is the objective's: specformer's objectives
  run it through the fused loss on the labelled rows. An objective built by a plugin's
  target (``register("objective", ..., replace=True)``) runs its loss as its module
  chooses, so ``training`` leaves the head out and ``not_counted`` names
  ``training.objective``; ``forward`` and its components, the model's own, still count it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from specformer.analysis.params import (
    analysed,
    as_spec,
    plugin_components,
    plugin_objective,
    whole_number,
)

__all__ = ["FlopCounts", "flops_per_token", "mean_attended_keys", "TRAINING_MULTIPLIER"]

TRAINING_MULTIPLIER = 3
Count = Literal["needed", "executed"]


@dataclass(frozen=True)
class FlopCounts:
    """FLOPs per token at ``seq_len``: ``forward``, ``training`` (3 × forward; a masked-LM
    head's part only for its ``mask_prob`` of labelled tokens; with frozen parameters, the
    forward and the backward products the trained ones need), and the
    forward split into components (``decoder.attention.proj``, ``decoder.attention.scores``,
    ``decoder.cross_attention.proj``, ``decoder.cross_attention.scores``, ``decoder.ffn``,
    ``head``). ``not_counted`` names the parts built from a plugin's type, which have no
    formula and are left out of every figure (``{"decoder.ffn": "ffn type 'relu2'"}``), and
    ``training.objective`` when a plugin builds the objective: the head is then left out of
    ``training`` alone (:attr:`forward_not_counted` is what ``forward`` leaves out)."""

    seq_len: int
    count: str
    forward: int
    training: int
    components: dict[str, int]
    not_counted: dict[str, str] = field(default_factory=dict)
    # with training.optimizer.freeze: the parameters that train (tied weights once) and all
    # of them; ``training`` then counts the backward products those need. None: all train
    trained_parameters: int | None = None
    parameters: int | None = None

    @property
    def forward_not_counted(self) -> dict[str, str]:
        """The parts ``forward`` and ``components`` leave out: ``not_counted`` but the
        objective, which trains the model and is no part of its forward."""
        return {k: v for k, v in self.not_counted.items() if k != "training.objective"}

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
        } | ({} if self.trained_parameters is None else {"trained_parameters": self.trained_parameters,
                                                         "parameters": self.parameters})


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


def _flow(spec: Any) -> Any:
    """The gradient flow of ``spec``'s training step when its ``training.optimizer.freeze``
    leaves parameters out, else None (every product has both backward products)."""
    if not getattr(spec.training.optimizer, "freeze", ()):
        return None
    from specformer.analysis.gradflow import grad_flow

    flow = grad_flow(spec)
    return flow if flow.frozen else None


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
    # a plugin's objective runs the head's loss as it chooses: the training step leaves it out
    objective = plugin_objective(spec)
    not_counted |= objective
    d = spec.d_model
    # totals over one sequence of t tokens (per stack); divided by t at the end
    totals: dict[str, int] = {}

    def add(key: str, value: int) -> None:
        totals[key] = totals.get(key, 0) + value

    flow = _flow(spec)
    backward = 0.0  # the backward products a frozen model runs, over one sequence

    def back(value: float, *needed: bool) -> None:
        # each needed backward product costs what the forward product costs
        nonlocal backward
        backward += value * sum(needed)

    for role, stack in spec.stacks():
        causal = role == "decoder"
        for i in range(stack.n_layers):
            layer = stack.layer(i)
            lf = flow.stacks[role].layers[i] if flow else None
            att = layer.attention
            if analysed("attention", att.type):
                h, hkv, dh = att.n_heads, att.n_kv_heads, att.head_dim
                qkv, o = t * 2 * d * (h + 2 * hkv) * dh, t * 2 * h * dh * d
                scores = _attention_scores(att, t, causal=causal, count=count)
                add(f"{role}.attention.proj", qkv + o)
                add(f"{role}.attention.scores", scores)
                if lf:
                    a = lf.attention
                    back(qkv, a.q_in, a.q_w)
                    back(o, a.o_in, a.o_w)
                    back(scores / 2 * a.score_products, True)
            ca = layer.cross_attention
            if (ca is not None and role == "decoder" and spec.kind == "encoder-decoder"
                    and analysed("attention", ca.type)):
                ch, ckv, cdh = ca.n_heads, ca.n_kv_heads, ca.head_dim
                # q and o over the t target tokens, k/v over the t source tokens
                q, kv, o = t * 2 * d * ch * cdh, t * 2 * d * 2 * ckv * cdh, t * 2 * ch * cdh * d
                scores = 2 * 2 * ch * cdh * t * t
                add(f"{role}.cross_attention.proj", q + kv + o)
                add(f"{role}.cross_attention.scores", scores)
                if lf and lf.cross_attention:
                    c = lf.cross_attention
                    back(q, c.q_in, c.q_w)
                    back(kv, c.kv_in, c.kv_w)
                    back(o, c.o_in, c.o_w)
                    back(scores / 2 * c.score_products, True)
            ffn = layer.ffn
            if analysed("ffn", ffn.type):
                one = t * 2 * d * ffn.d_ff
                add(f"{role}.ffn", one * (3 if ffn.type == "glu" else 2))
                if lf:
                    f = lf.ffn
                    back(one, f.in_, f.up_w)
                    if ffn.type == "glu":
                        back(one, f.in_, f.gate_w)
                    back(one, f.down_in, f.down_w)
    head = spec.head
    hflow = None if objective else flow  # the head's backward products, where counted
    # a masked-LM head trains on its labelled tokens only (MLMHead.loss)
    share = getattr(spec.training.objective, "mask_prob", 1.0) if head.type == "mlm" else 1.0
    if not analysed("head", head.type):
        pass  # a plugin's head: named in not_counted
    elif head.type == "lm":
        add("head", t * 2 * d * spec.vocab_size)
        if hflow:
            back(t * 2 * d * spec.vocab_size, *hflow.head.products["proj"])
    elif head.type == "mlm":
        add("head", t * 2 * (d * d + d * spec.vocab_size))
        if hflow:
            back(share * t * 2 * d * d, *hflow.head.products["dense"])
            back(share * t * 2 * d * spec.vocab_size, *hflow.head.products["proj"])
    elif head.type == "classification":
        # one pooled vector per sequence
        add("head", 2 * (d * d * int(head.pooler) + d * head.n_classes))
        if hflow:
            back(2 * d * d * int(head.pooler), *hflow.head.products["pooler"])
            back(2 * d * head.n_classes, *hflow.head.products["classifier"])
    components = {k: round(v / t) for k, v in totals.items()}
    forward = round(sum(totals.values()) / t)
    trained = sum(totals.values())
    if objective:
        trained -= totals.get("head", 0)
    elif head.type == "mlm" and "head" in totals:
        trained -= totals["head"] * (1 - share)
    training = round(TRAINING_MULTIPLIER * trained / t) if flow is None else round((trained + backward) / t)
    return FlopCounts(
        seq_len=t,
        count=count,
        forward=forward,
        training=training,
        components=components,
        not_counted=not_counted,
        trained_parameters=flow.trained if flow else None,
        parameters=flow.total if flow else None,
    )
