"""Which tensors of a training step need a gradient when ``training.optimizer.freeze``
leaves parameters out: what the training FLOPs and the activations follow.

Autograd computes the gradient of a tensor only if some parameter it was computed from
trains: below the lowest trained parameter nothing is differentiated and nothing is
saved for the backward pass. A linear layer ``y = x Wᵀ`` has two backward products,
``dx = dy W`` (needed if ``x`` needs a gradient: something below trains) and
``dW = dyᵀ x`` (needed if ``W`` trains); it keeps ``x`` for the backward pass only if
``W`` trains. Attention's ``Q Kᵀ`` and ``A V`` have no weights: ``dQ``, ``dK`` and ``dV``
are needed where ``Q``, ``K``, ``V`` need a gradient, and ``dA = dO Vᵀ`` where ``Q`` or
``K`` (or a trained bias added to the scores, T5's) do.

:func:`grad_flow` walks the model as its forward runs — the embeddings, each layer's
sublayers in their residual wiring (pre-norm, post-norm, sandwich, output norms, parallel), the stacks' final
norms, the encoder's output into the cross-attention's keys and values, the head — and
says, for each tensor that matters, whether it needs a gradient. A part built from a
plugin's type passes a gradient on where its input needs one or one of its parameters
trains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["AttentionFlow", "FFNFlow", "LayerFlow", "StackFlow", "HeadFlow", "GradFlow", "grad_flow"]


@dataclass(frozen=True)
class AttentionFlow:
    """One attention sublayer: whether each tensor needs a gradient (``q``, ``k``, ``v``,
    the projections' inputs ``q_in``, ``kv_in`` and ``o_in``) and whether each weight trains
    (``q_w``: the fused qkv projection of self-attention, or cross-attention's q_proj;
    ``kv_w``: cross-attention's kv_proj, the same as ``q_w`` in self-attention)."""

    q_in: bool
    kv_in: bool
    q_w: bool
    kv_w: bool
    q: bool
    k: bool
    v: bool
    bias: bool  # a trained bias added to the scores (T5's relative positions)
    o_in: bool
    o_w: bool
    out: bool

    @property
    def probs(self) -> bool:
        """Whether the attention probabilities need a gradient (``dA = dO Vᵀ``)."""
        return self.q or self.k or self.bias

    @property
    def score_products(self) -> int:
        """How many of the four backward products of ``Q Kᵀ`` and ``A V`` (``dA``, ``dV``,
        ``dQ``, ``dK``, each as costly as one forward product) are needed."""
        return int(self.probs) + int(self.v) + int(self.q) + int(self.k)

    @property
    def kernel(self) -> bool:
        """Whether autograd records the attention at all (it keeps Q, K, V, the output)."""
        return self.q or self.k or self.v or self.bias


@dataclass(frozen=True)
class FFNFlow:
    """One FFN: its input (``in_``), the up (and gate) outputs, the down projection's input
    needing a gradient, and which of the three weights train."""

    in_: bool
    up_w: bool
    gate_w: bool
    up: bool
    gate: bool
    down_in: bool
    down_w: bool
    out: bool


@dataclass(frozen=True)
class LayerFlow:
    """One layer: its input, each norm (``True``: autograd records it and keeps its input),
    its sublayers (None for a missing cross-attention) and its output."""

    in_: bool
    norms: tuple[bool, ...]
    attention: AttentionFlow
    cross_attention: AttentionFlow | None
    ffn: FFNFlow
    out: bool

    @property
    def recorded(self) -> bool:
        """Whether anything of the layer is differentiated (it keeps something)."""
        return self.out


@dataclass(frozen=True)
class StackFlow:
    embedding: bool  # the embedded input needs a gradient (the embedding norm is recorded)
    layers: tuple[LayerFlow, ...]
    final_norm: bool
    out: bool


@dataclass(frozen=True)
class HeadFlow:
    """The head: its input, and for each of its matrix products (``proj`` the vocabulary
    product, ``dense`` the masked-LM transform, ``pooler`` and ``classifier``) whether its
    input needs a gradient and whether its weight trains."""

    in_: bool
    products: dict[str, tuple[bool, bool]]
    dense: bool = False  # a masked-LM transform's dense output needs a gradient
    norm: bool = False  # a masked-LM transform's norm is recorded
    bias: bool = False  # the vocabulary product's bias trains


@dataclass(frozen=True)
class GradFlow:
    stacks: dict[str, StackFlow]
    head: HeadFlow
    trained: int  # parameters that train (tied weights once)
    total: int

    @property
    def frozen(self) -> bool:
        return self.trained < self.total


class _Trained:
    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        # every dotted prefix of a trained name ("decoder.", "decoder.layers.", ...): a set
        # lookup per question, however many layers
        parts = (n.split(".") for n in self.names)
        self.prefixes = frozenset(".".join(p[:i]) + "." for p in parts for i in range(1, len(p)))

    def any(self, prefix: str) -> bool:
        """Whether a parameter under ``prefix`` (a module path ending in ".") trains."""
        return prefix in self.prefixes

    def weight(self, prefix: str) -> bool:
        return f"{prefix}weight" in self.names


def _attention(t: _Trained, prefix: str, q_in: bool, kv_in: bool, *, cross: bool, bias: bool) -> AttentionFlow:
    if cross:
        q_w, kv_w = t.weight(f"{prefix}q_proj."), t.weight(f"{prefix}kv_proj.")
        q_out, kv_out = q_in or t.any(f"{prefix}q_proj."), kv_in or t.any(f"{prefix}kv_proj.")
    else:
        q_w = kv_w = t.weight(f"{prefix}qkv_proj.")
        q_out = kv_out = q_in or t.any(f"{prefix}qkv_proj.")
    q, k, v = q_out or t.any(f"{prefix}q_norm."), kv_out or t.any(f"{prefix}k_norm."), kv_out
    o_in = q or k or v or bias
    o_w = t.weight(f"{prefix}o_proj.")
    return AttentionFlow(q_in=q_in, kv_in=kv_in, q_w=q_w, kv_w=kv_w, q=q, k=k, v=v, bias=bias, o_in=o_in,
                         o_w=o_w, out=o_in or t.any(f"{prefix}o_proj."))


def _ffn(t: _Trained, prefix: str, in_: bool, glu: bool) -> FFNFlow:
    up = in_ or t.any(f"{prefix}up_proj.")
    gate = glu and (in_ or t.any(f"{prefix}gate_proj."))
    down_in = up or gate
    return FFNFlow(in_=in_, up_w=t.weight(f"{prefix}up_proj."), gate_w=glu and t.weight(f"{prefix}gate_proj."),
                   up=up, gate=gate, down_in=down_in, down_w=t.weight(f"{prefix}down_proj."),
                   out=down_in or t.any(f"{prefix}down_proj."))


def _plugin(t: _Trained, prefix: str, in_: bool) -> bool:
    return in_ or t.any(prefix)


def _layer(spec: Any, t: _Trained, role: str, i: int, x: bool, enc: bool, bias: bool) -> LayerFlow:
    from specformer.analysis.params import analysed

    layer = getattr(spec, role).layer(i)
    p = f"{role}.layers.{i}."
    placement = layer.norm.placement
    parallel = layer.residual.type == "parallel"
    cross_here = layer.cross_attention is not None and role == "decoder" and spec.kind == "encoder-decoder"
    norms: list[bool] = []

    def pre(name: str, x: bool) -> bool:  # a norm in front of a sublayer: its output
        if placement in ("post", "output"):
            return x
        norms.append(x or t.any(f"{p}{name}."))
        return norms[-1]

    def post(name: str, x: bool) -> bool:  # a norm after the residual sum
        if placement != "post":
            return x
        norms.append(x or t.any(f"{p}{name}."))
        return norms[-1]

    def on_output(kind: str, name: str, out: bool) -> bool:  # a norm on a sublayer's output (``kind`` norms)
        if placement != kind:
            return out
        norms.append(out or t.any(f"{p}{name}."))
        return norms[-1]

    def attention(name: str, q_in: bool, kv_in: bool, spec_part: Any, cross: bool) -> AttentionFlow:
        if analysed("attention", spec_part.type):
            return _attention(t, f"{p}{name}.", q_in, kv_in, cross=cross, bias=bias and not cross)
        out = _plugin(t, f"{p}{name}.", q_in or kv_in)
        return AttentionFlow(q_in, kv_in, False, False, out, out, out, False, out, False, out)

    def ffn(in_: bool) -> FFNFlow:
        if analysed("ffn", layer.ffn.type):
            return _ffn(t, f"{p}ffn.", in_, layer.ffn.type == "glu")
        out = _plugin(t, f"{p}ffn.", in_)
        return FFNFlow(in_, False, False, out, False, out, False, out)

    x0, cross = x, None
    if parallel:  # every sublayer reads the layer's input (pre-norm), through attn_norm alone if shared
        shared = layer.residual.shared_norm
        a_in = pre("attn_norm", x)
        a = attention("self_attn", a_in, a_in, layer.attention, False)
        out = x or a.out
        if cross_here:
            cross = attention("cross_attn", a_in if shared else pre("cross_norm", x), enc, layer.cross_attention, True)
            out = out or cross.out
        f = ffn(a_in if shared else pre("ffn_norm", x))
        return LayerFlow(x0, tuple(norms), a, cross, f, out or f.out)
    a_in = pre("attn_norm", x)
    a = attention("self_attn", a_in, a_in, layer.attention, False)
    # sandwich norms have names of their own; output norms those of the pre-norm ones
    x = post("attn_norm", x or on_output("output", "attn_norm", on_output("sandwich", "attn_post_norm", a.out)))
    if cross_here:
        cross = attention("cross_attn", pre("cross_norm", x), enc, layer.cross_attention, True)
        x = post("cross_norm", x or on_output("output", "cross_norm",
                                              on_output("sandwich", "cross_post_norm", cross.out)))
    f = ffn(pre("ffn_norm", x))
    x = post("ffn_norm", x or on_output("output", "ffn_norm", on_output("sandwich", "ffn_post_norm", f.out)))
    return LayerFlow(x0, tuple(norms), a, cross, f, x)


def grad_flow(spec: Any) -> GradFlow:
    """Which tensors of ``spec``'s training step need a gradient under its
    ``training.optimizer.freeze`` (see the module docstring)."""
    from specformer.analysis.memory import trainable_shapes
    from specformer.analysis.params import as_spec, count_parameters, tied_names

    spec = as_spec(spec)
    shapes = count_parameters(spec).shapes
    trained_shapes = trainable_shapes(spec)
    t = _Trained(trained_shapes)
    n_trained = sum(_numel(s) for s in trained_shapes.values())
    n_total = sum(_numel(s) for s in shapes.values())
    stacks: dict[str, StackFlow] = {}
    enc = False
    for role, stack in spec.stacks():
        table = "decoder_embed." if role == "decoder" and any(n.startswith("decoder_embed.") for n in shapes) \
            else "embed."
        x = t.any(table)
        embedded = x
        own = [n for n in t.names if n.startswith(f"{role}.") and not n.startswith((f"{role}.layers.",
                                                                                    f"{role}.final_norm."))]
        bias = bool(own)  # a stack's trained positional module (T5's bias table) feeds every layer's scores
        layers = []
        for i in range(stack.n_layers):
            flow = _layer(spec, t, role, i, x, enc, bias)
            layers.append(flow)
            x = flow.out
        final = bool(stack.final_norm) and (x or t.any(f"{role}.final_norm."))
        out = x or final
        stacks[role] = StackFlow(embedding=embedded, layers=tuple(layers), final_norm=final, out=out)
        if role == "encoder":
            enc = out
    x = next(reversed(stacks.values())).out
    head = spec.head
    table = tied_names(spec, shapes).get("head.weight")
    proj_w = (table in t.names) if table is not None else t.weight("head.proj.")
    bias = "head.bias" in t.names or "head.proj.bias" in t.names
    if head.type == "lm":
        flow = HeadFlow(in_=x, products={"proj": (x, proj_w)}, bias=bias)
    elif head.type == "mlm":
        dense = x or t.any("head.transform.dense.")
        norm = dense or t.any("head.transform.norm.")
        flow = HeadFlow(in_=x, products={"dense": (x, t.weight("head.transform.dense.")), "proj": (norm, proj_w)},
                        dense=dense, norm=norm, bias=bias)
    elif head.type == "classification":
        pooled = x or (head.pooler and t.any("head.pooler."))
        flow = HeadFlow(in_=x, products={"pooler": (x, t.weight("head.pooler.")),
                                         "classifier": (pooled, t.weight("head.classifier."))})
    else:
        flow = HeadFlow(in_=x, products={})
    return GradFlow(stacks=stacks, head=flow, trained=n_trained, total=n_total)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
