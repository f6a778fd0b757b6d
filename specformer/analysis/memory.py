"""KV-cache size and training memory (weights, gradients, optimizer states, activations).

The optimizer's states are the spec's ``training.optimizer``'s: AdamW keeps two moments
the size of the parameters, SGD one (its momentum; none without), Adafactor a row and a
column mean of each matrix's squared gradients (its last two dimensions) and a full
second moment of each vector. Precisions follow Lightning's names. ``fp64``, ``fp32``, ``bf16`` and
``fp16`` ("true" precisions) keep weights, gradients, optimizer states (allocated like
the parameter) and activations in that dtype. ``bf16-mixed`` and
``16-mixed`` keep fp32 weights, gradients and moments, compute in half precision, and
autocast caches a half-precision copy of each weight of a matrix product during the
step (linear layers, and the token table a tied head projects with); norms, position
and segment tables, T5's position bias and a token table that is only looked up stay
in fp32.

With ``training.activation_checkpointing``, each layer keeps only its input and one layer's
activations are alive at a time, in the backward pass that computes them again.

Activations are what autograd saves for the backward pass, counted tensor by tensor, each
in its dtype (under autocast the residual stream, which norms in front of a sublayer or after
the residual sum read, stays float32; a projection keeps the low-precision copy of its input),
for the spec's layers, after the accounting of Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1), generalised to
GQA, gated FFNs, qk-norm, cross-attention and the two attention backends: ``sdpa``
(fused kernels keep Q, K, V, the output and a log-sum-exp, never the T × T scores;
specformer's own training attention on a CPU also keeps up to
``attention.MATMUL_KEPT_BYTES`` of probabilities a layer, which is not counted)
and ``eager`` (keeps the softmax probabilities, computed and kept in float32, and the copy
in the compute dtype that multiplies the values, or the dropout mask and dropped
probabilities when attention dropout is on). Dropout masks are 1 byte per element.
The output head trains through the fused loss (``model(..., labels=)``, as ``specformer
train`` does): its forward computes and keeps the gradients of the head's input
(N × D) and weight (V × D), never the N × V logits; a masked-LM head runs on the
labelled rows only (``mask_prob`` of them). T5's trained position bias has no fused
attention kernel, so its self-attention keeps the probabilities as ``eager`` does.
ALiBi's bias is an (H, T, T) tensor per sequence, made once per stack and shared by
its layers, which ``sdpa`` keeps as its mask: H·T² elements, past the rest at long T;
a sliding window's mask is (T, T), one per distinct window.
The sum of all parts is an upper bound on the peak: activations and gradients never
reach their maxima together.

Parameters that ``training.optimizer.freeze`` matches have weights but no gradients and
no optimizer states. Autograd keeps a tensor only for a gradient it will compute
(:mod:`specformer.analysis.gradflow`), so activations follow the frozen parameters too:
layers below the lowest trained parameter keep nothing, a linear layer keeps its input
only if its weight trains, an attention its Q, K, V and output only if one of them needs
a gradient, and the fused loss keeps the head's input and weight gradients only where
those are needed.

A part built from a type registered by a plugin (an attention, FFN, norm, positional
scheme or head) has its weights, gradients and optimizer states counted exactly, from the
model built on the meta device; what it keeps for the backward pass and which of its
weights autocast copies only its module knows, so they are left out of ``activations``
and ``weight_casts`` and the part is named in ``MemoryEstimate.not_counted``. A plugin's
self-attention stores keys and values as it chooses, so the public KV-cache functions
refuse it (:class:`AnalysisError`) and :func:`specformer.analysis.analyze` reports the
other layers' cache with the plugin's layers named as not counted. The output head's
part of the activations is counted as specformer's objectives run it (the fused loss);
an objective built by a plugin's target (``register("objective", ..., replace=True)``)
keeps what its loss chooses, so that part is left out and ``training.objective`` named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specformer.analysis.params import (
    AnalysisError,
    _type_words,
    analysed,
    as_spec,
    count_parameters,
    plugin_components,
    plugin_objective,
    tied_names,
    whole_number,
)

__all__ = [
    "Precision",
    "precision",
    "PRECISIONS",
    "dtype_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes",
    "cross_kv_cache_bytes_per_source_token",
    "MemoryEstimate",
    "memory_estimate",
    "activation_bytes",
    "autocast_copied_parameters",
    "optimizer_state_elements",
    "trainable_parameters",
    "trainable_shapes",
]


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind of training state under one precision setting."""

    name: str
    weight: int
    grad: int
    optimizer: int  # per element of an optimizer state
    activation: int
    loss: int  # the cross-entropy's log-probabilities
    weight_cast: int  # autocast's cached low-precision weight copy (0 without autocast)


# Named as Lightning names them (and as ``training.precision`` takes them): ``bf16`` and
# ``16`` are the mixed settings, the pure ones are ``bf16-true`` and ``16-true``.
PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", 4, 4, 4, 4, 4, 0),
    "fp64": Precision("fp64", 8, 8, 8, 8, 8, 0),
    "bf16-true": Precision("bf16-true", 2, 2, 2, 2, 2, 0),
    "16-true": Precision("16-true", 2, 2, 2, 2, 2, 0),
    "bf16-mixed": Precision("bf16-mixed", 4, 4, 4, 2, 4, 2),
    "16-mixed": Precision("16-mixed", 4, 4, 4, 2, 4, 2),
}
_ALIASES = {
    "float32": "fp32", "32": "fp32", "32-true": "fp32", "float": "fp32",
    "float64": "fp64", "64": "fp64", "64-true": "fp64", "double": "fp64",
    "bf16": "bf16-mixed", "bfloat16": "bf16-true",
    "16": "16-mixed", "fp16-mixed": "16-mixed",
    "fp16": "16-true", "float16": "16-true", "half": "16-true", "fp16-true": "16-true",
}
# storage-only formats, valid for a KV cache but not as a training precision
_CACHE_ONLY = {"fp8": 1, "float8": 1, "int8": 1}


def _name(value: Any, what: str) -> str:
    """A precision or dtype name; a ``torch.dtype`` by its own (``torch.bfloat16``: ``bfloat16``,
    the pure setting that ``build_model(dtype=torch.bfloat16)`` builds)."""
    if isinstance(value, str):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        name = str(value).removeprefix("torch.")
        return "fp8" if name.startswith("float8") else name
    raise TypeError(f"{what} must be a name such as 'fp32', 'bf16-mixed' or 'bf16-true', or a torch.dtype, "
                    f"not {type(value).__name__}")


def precision(name: str | Any) -> Precision:
    """The :class:`Precision` called ``name`` (``fp32``, ``fp64``, ``bf16-mixed``, ``16-mixed``,
    ``bf16-true``, ``16-true``, or an alias: ``bf16`` and ``16`` are the mixed ones, as in
    Lightning and ``training.precision``; ``fp16``, ``bfloat16`` the pure ones), or of a
    ``torch.dtype`` (``torch.bfloat16``: ``bf16-true``, weights and all in that dtype)."""
    name = _name(name, "a precision")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PRECISIONS:
        allowed = ", ".join(PRECISIONS)
        raise ValueError(f"unknown precision {name!r}; allowed: {allowed} (aliases: {', '.join(_ALIASES)})")
    return PRECISIONS[key]


def dtype_bytes(dtype: str | Any) -> int:
    """Bytes of one activation element in ``dtype``, a name or a ``torch.dtype`` (also
    accepts fp8 / int8 for caches)."""
    dtype = _name(dtype, "a dtype")
    key = dtype.strip().lower()
    if key in _CACHE_ONLY:
        return _CACHE_ONLY[key]
    try:
        return precision(key).activation
    except ValueError:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: fp32, bf16, fp16, {', '.join(_CACHE_ONLY)}, "
                         f"or a training precision ({', '.join(PRECISIONS)})") from None


def _cached_attention(spec: Any, *, cross: bool = False, skip_plugins: bool = False) -> list[Any]:
    """The decoder's self- (or cross-) attention specs whose keys and values the cache holds,
    one per layer. A plugin's attention type stores what it chooses: refused, or left out
    with ``skip_plugins`` (whoever asks names it as not counted)."""
    if spec.decoder is None or (cross and spec.kind != "encoder-decoder"):
        return []
    out = []
    for layer in spec.decoder.layers():
        att = layer.cross_attention if cross else layer.attention
        if att is None:
            continue
        if not analysed("attention", att.type):
            if skip_plugins:
                continue
            which = "decoder.cross_attention" if cross else "decoder.attention"
            raise AnalysisError(f"{which}: no KV-cache count for attention type {att.type!r}, which stores "
                                "its keys and values as its own module chooses")
        out.append(att)
    return out


def kv_cache_bytes_per_token(spec: Any, dtype: str = "bf16", *, skip_plugins: bool = False) -> int:
    """Bytes of decoder self-attention K and V cached per generated token, all layers.

    ``2 · n_kv_heads · head_dim`` elements per layer; 0 for an encoder-only model. A
    layer with a sliding window W stops growing at W - 1 + min(W, 128) positions
    (:func:`kv_cache_bytes`). A plugin's attention
    type is an :class:`AnalysisError`, or left out with ``skip_plugins``.
    """
    spec = as_spec(spec)
    b = dtype_bytes(dtype)
    return sum(2 * att.n_kv_heads * att.head_dim * b for att in _cached_attention(spec, skip_plugins=skip_plugins))


def kv_cache_bytes(spec: Any, *, seq_len: int, batch: int = 1, dtype: str = "bf16",
                   skip_plugins: bool = False) -> int:
    """Bytes of decoder self-attention K and V the cache allocates for ``batch`` sequences of
    ``seq_len`` tokens (as generation sizes it): ``seq_len`` positions per layer, or with a
    sliding window W at most ``min(seq_len, W - 1 + min(W, 128))``, its rolling buffer (the
    W - 1 positions a later query sees and room to append before they move:
    :func:`specformer.specs.window.window_positions`).
    A plugin's attention type is an :class:`AnalysisError`, or left out with ``skip_plugins``.
    """
    from specformer.specs.window import window_positions

    spec = as_spec(spec)
    seq_len, batch = whole_number("seq_len", seq_len, 0), whole_number("batch", batch, 0)
    b = dtype_bytes(dtype)
    total = 0
    for att in _cached_attention(spec, skip_plugins=skip_plugins):
        held = seq_len if att.sliding_window is None else min(seq_len, window_positions(att.sliding_window))
        total += 2 * att.n_kv_heads * att.head_dim * b * held
    return total * batch


def cross_kv_cache_bytes_per_source_token(spec: Any, dtype: str = "bf16", *, skip_plugins: bool = False) -> int:
    """Bytes of cross-attention K and V cached per source token (encoder-decoder only).
    A plugin's attention type is an :class:`AnalysisError`, or left out with ``skip_plugins``."""
    spec = as_spec(spec)
    b = dtype_bytes(dtype)
    return sum(2 * att.n_kv_heads * att.head_dim * b
               for att in _cached_attention(spec, cross=True, skip_plugins=skip_plugins))


# --------------------------------------------------------------------------- activations


def _math_kernel(att: Any, *, learned_bias: bool, cpu: bool) -> bool:
    """Whether an ``sdpa`` attention trains through torch's math kernel: with attention
    dropout on the CPU, where neither torch's fused kernel nor specformer's own takes it (a
    GPU's fused kernels do)."""
    return (cpu and att.backend == "sdpa" and att.dropout > 0 and not learned_bias
            and getattr(att, "softcap", None) is None)


def _attention_saved(att: Any, d: int, seq_len: int, act: int, *, kv_len: int | None = None,
                     learned_bias: bool = False, flow: Any = None, cpu: bool = False) -> float:
    """Bytes autograd keeps per query token for one attention sublayer (projections included).

    ``kv_len`` set means cross-attention: K and V belong to the source and are counted
    by the caller; only the query side is counted here. ``learned_bias``: a trained
    additive bias (T5's) has no fused kernel, so the probabilities are kept as in eager.
    ``flow``: the sublayer's :class:`~specformer.analysis.gradflow.AttentionFlow` when
    parameters are frozen: a projection keeps its input only if its weight trains, and
    the attention keeps its tensors only if one of Q, K, V needs a gradient. ``cpu``: the
    attention runs where dropout takes it to torch's math kernel (:func:`_math_kernel`).
    """
    h, hkv, dh = att.n_heads, att.n_kv_heads, att.head_dim
    keys = seq_len if kv_len is None else kv_len
    kernel = flow is None or flow.kernel
    elems = d if flow is None or flow.q_w else 0  # input of the q/k/v projection
    if kernel:
        elems += h * dh if kv_len is not None else (h + 2 * hkv) * dh  # Q (K, V) for the kernel
    if att.qk_norm != "none":
        elems += h * dh if flow is None or flow.q else 0  # input of the q norm
        elems += hkv * dh if kv_len is None and (flow is None or flow.k) else 0  # of the k norm
    elems += h * dh if kernel else 0  # attention output
    elems += h * dh if flow is None or flow.o_w else 0  # its reshaped copy, input of o_proj
    extra = 0.0
    if not kernel:
        return elems * act
    if _math_kernel(att, learned_bias=learned_bias, cpu=cpu):
        # torch's math kernel computes in float32 at least (bfloat16 inputs are copied up) and
        # keeps the scaled queries, keys and values (copies, repeated to every query head,
        # unless they are the float32 ones given), its softmax output, the dropout mask (in
        # that dtype) and the dropped probabilities; neither an output nor a log-sum-exp
        wide = max(4, act)
        elems -= h * dh  # the output, which this kernel does not keep
        if kv_len is None:
            elems -= 2 * hkv * dh  # the K and V given, counted again below as kept
        copies = hkv != h or act < 4
        extra += h * dh * wide  # the scaled queries
        if kv_len is None:
            extra += 2 * (h * dh * wide if copies else hkv * dh * act)
        elems -= h * dh  # Q, which it keeps scaled (above)
        return elems * act + extra + 3 * wide * h * keys
    softcap = getattr(att, "softcap", None) is not None
    if softcap:
        extra += 4 * h * keys  # the capped scores' tanh, float32
    if att.backend == "eager" or learned_bias or softcap:
        # the softmax runs in float32 (at least) and keeps its output; A V keeps its input:
        # those probabilities in the compute dtype (a copy below float32), or dropped ones
        extra += max(4, act) * h * keys
        if act < 4 or att.dropout > 0:
            elems += h * keys
        if att.dropout > 0:
            extra += h * keys  # dropout mask (1 byte)
    else:
        extra += 4 * h  # log-sum-exp, fp32
    return elems * act + extra


def _ffn_saved(ffn: Any, d: int, act: int, flow: Any = None) -> float:
    """Bytes an FFN keeps per token; ``flow`` (its :class:`~specformer.analysis.gradflow.FFNFlow`
    when parameters are frozen) leaves out what no gradient needs. ReLU's backward reads
    its output, not its input, and that output is also what the next product (GLU: the
    gate's product with up) keeps: one tensor where the other activations keep two."""
    relu = ffn.activation == "relu"
    drop = ffn.dropout > 0
    if flow is None:
        elems = d  # input of up (and gate)
        if ffn.type == "glu":
            # gate out (act input; not for relu), act out, up out, product (down input)
            elems += (3 if relu else 4) * ffn.d_ff
        else:
            # act input (not for relu), act output (down input; with dropout, its dropped copy)
            elems += (2 if drop or not relu else 1) * ffn.d_ff
        extra = ffn.d_ff if drop else 0
        return elems * act + extra
    elems = d if flow.up_w or flow.gate_w else 0
    if ffn.type == "glu":
        if relu:  # act out (relu's and the product's), up out
            elems += ffn.d_ff * (int(flow.gate or flow.up) + int(flow.gate))
        else:  # act input, act out, up out
            elems += ffn.d_ff * (int(flow.gate) + int(flow.up) + int(flow.gate))
        elems += ffn.d_ff if flow.down_w else 0  # down input
    elif relu and not drop:  # relu's output is down's input
        elems += ffn.d_ff if flow.up or flow.down_w else 0
    else:
        elems += ffn.d_ff if flow.up else 0  # act input (relu: its output)
        elems += ffn.d_ff if flow.down_w else 0  # down input
    extra = ffn.d_ff if drop and flow.down_in else 0
    return elems * act + extra


def activation_bytes(spec: Any, *, batch: int, seq_len: int, dtype: str = "bf16-mixed", cpu: bool = False) -> int:
    """Bytes autograd keeps for the backward pass of one training step (see module docstring).
    A part built from a plugin's type is an :class:`AnalysisError` (:func:`memory_estimate`
    counts the other parts and names it). ``cpu``: as a CPU trains it, where attention
    dropout runs torch's math kernel, which keeps the ``T × T`` probabilities."""
    total, not_counted = _activations(spec, batch=batch, seq_len=seq_len, dtype=dtype, cpu=cpu)
    if not_counted:
        key, what = next(iter(not_counted.items()))
        raise AnalysisError(f"{key}: no activation count for {what}, which keeps what its own module chooses")
    return total


def _activations(spec: Any, *, batch: int, seq_len: int, dtype: str,
                 cpu: bool = False) -> tuple[int, dict[str, str]]:
    """:func:`activation_bytes` of the parts with a formula, and the parts without (a
    plugin's types: ``{"decoder.ffn": "ffn type 'relu2'"}``)."""
    spec = as_spec(spec)
    batch, seq_len = whole_number("batch", batch), whole_number("seq_len", seq_len)
    p = precision(dtype)
    act = p.activation
    res = p.weight  # the residual stream's dtype: the embeddings' and the residual sums'
    d, v = spec.d_model, spec.vocab_size
    # a plugin's objective runs the head's loss as it chooses: what that keeps is its own
    objective = plugin_objective(spec)
    not_counted = plugin_components(spec) | objective
    per_seq = 0.0
    t = seq_len
    emb = spec.embedding
    # with training.optimizer.freeze: which tensors need a gradient (autograd keeps nothing
    # for a part of the graph where none does); None: every one does
    flow = _flow(spec)
    roles = [role for role, _ in spec.stacks()]
    embedded = [flow is None or flow.stacks[role].embedding for role in roles] if spec.kind == "encoder-decoder" \
        else [flow is None or flow.stacks[roles[0]].embedding]
    if emb.norm is not None and "embedding.norm" not in not_counted:
        per_seq += sum(embedded) * t * d * res  # the summed embeddings, in the weights' dtype
    if emb.dropout > 0:
        per_seq += sum(embedded) * t * d
    checkpointing = bool(getattr(spec.training, "activation_checkpointing", False))
    layer_costs: list[float] = []  # what each layer keeps, per sequence
    for role, stack in spec.stacks():
        flows = flow.stacks[role].layers if flow else [None] * stack.n_layers
        for layer, lf in zip(stack.layers(), flows, strict=True):
            if lf is not None and not lf.recorded:
                continue  # below the lowest trained parameter: nothing is kept
            res_drop = layer.residual.dropout > 0
            # sandwich: a second norm on each sublayer's output keeps that output too
            sandwich = layer.norm.placement == "sandwich"
            n_norms = 4 if sandwich else 2
            tok = 0.0
            if analysed("attention", layer.attention.type):
                tok += _attention_saved(layer.attention, d, t, act, learned_bias=spec.positional.type == "t5",
                                        flow=lf and lf.attention, cpu=cpu)
            cross_here = layer.cross_attention is not None and role == "decoder" and spec.kind == "encoder-decoder"
            if cross_here:
                n_norms += 2 if sandwich else 1
                ca = layer.cross_attention
                cf = lf and lf.cross_attention
                if analysed("attention", ca.type):
                    tok += _attention_saved(ca, d, t, act, kv_len=t, flow=cf, cpu=cpu)
                    if (cf is None or cf.kernel) and _math_kernel(ca, learned_bias=False, cpu=cpu):
                        # K, V of the source tokens, as the math kernel keeps them (see above)
                        copies = ca.n_kv_heads != ca.n_heads or act < 4
                        tok += 2 * (ca.n_heads * ca.head_dim * max(4, act) if copies else ca.n_kv_heads * ca.head_dim * act)
                    elif cf is None or cf.kernel:
                        tok += 2 * ca.n_kv_heads * ca.head_dim * act  # K, V of the source tokens
                tok += d if res_drop and (cf is None or cf.out) else 0
            if analysed("ffn", layer.ffn.type):
                tok += _ffn_saved(layer.ffn, d, act, lf and lf.ffn)
            if layer.residual.shared_norm:
                # one norm output feeds every sublayer: the projections that read it keep one tensor
                readers = [
                    analysed("attention", layer.attention.type) and (lf is None or lf.attention.q_w),
                    cross_here and analysed("attention", layer.cross_attention.type)
                    and (lf is None or lf.cross_attention.q_w),
                    analysed("ffn", layer.ffn.type) and (lf is None or lf.ffn.up_w or lf.ffn.gate_w),
                ]
                tok -= max(0, sum(map(bool, readers)) - 1) * d * act
            if analysed("norm", layer.norm.type):
                # norm inputs: a norm keeps its input where it is differentiated. A norm in
                # front of a sublayer or after the residual sum reads the residual stream, in
                # the weights' dtype (under autocast: float32, as the embeddings and the
                # residual sums are); one on a sublayer's output (sandwich's second, output
                # norms) reads that output, in the compute dtype
                kept = [True] * n_norms if lf is None else list(lf.norms)
                on_output = [layer.norm.placement == "output" or (sandwich and i % 2 == 1) for i in range(len(kept))]
                if layer.residual.type == "parallel":  # its norms all read its input: kept once
                    tok += min(sum(kept), 1) * d * res
                else:
                    tok += sum((act if out else res) for k, out in zip(kept, on_output, strict=True) if k) * d
            if res_drop:
                tok += d * (2 if lf is None else int(lf.attention.out) + int(lf.ffn.out))
            layer_costs.append(t * tok)
        if stack.final_norm and analysed("norm", stack.norm.type) and (flow is None or flow.stacks[role].final_norm):
            per_seq += t * d * (act if stack.norm.placement == "output" else res)
        # a plugin attention need not have a backend; what its mask costs is its own
        fused = [layer.attention for layer, lf in zip(stack.layers(), flows, strict=True)
                 if analysed("attention", layer.attention.type) and layer.attention.backend == "sdpa"
                 and (lf is None or lf.attention.kernel)]
        if spec.positional.type == "alibi" and fused:
            # the (H, T, T) bias is built once per stack forward and shared by its layers; the
            # fused kernel keeps it, as its mask, for the backward pass
            per_seq += getattr(stack.attention, "n_heads", fused[0].n_heads) * t * t * act
        elif spec.positional.type != "t5":
            # a (T, T) mask per distinct sliding window, in the compute dtype, shared likewise
            windows = {att.sliding_window for att in fused if att.sliding_window is not None}
            per_seq += len(windows) * t * t * act
    if checkpointing and layer_costs:
        # each layer keeps its input (the residual stream, in the weights' dtype) and runs
        # again in the backward pass, where one layer's activations are alive at a time
        per_seq += len(layer_costs) * t * d * p.weight + max(layer_costs)
    else:
        per_seq += sum(layer_costs)
    if spec.kind == "encoder-decoder" and (flow is None or any(
            lf.cross_attention is not None and lf.cross_attention.kv_w for lf in flow.stacks["decoder"].layers)):
        per_seq += t * d * act  # the encoder output, input of every kv_proj (kept once)
    head = spec.head
    per_step = 0.0
    hf = flow.head.products if flow else {}
    if objective:
        pass  # named in not_counted
    elif head.type in ("lm", "mlm") and analysed("head", head.type):
        # training runs the head through the fused loss (model(..., labels=)): its forward
        # computes the gradients of the head's input (N x D) and weight (V x D) and keeps
        # those, never the (N x V) logits; a masked-LM head runs on the labelled rows only
        need_x, need_w = hf.get("proj", (True, True))
        rows = t
        if head.type == "mlm":
            rows = t * getattr(spec.training.objective, "mask_prob", 1.0)
            if flow is None:
                per_seq += rows * 3 * d * act  # dense input, activation input, norm input
            else:  # the dense layer's input, the activation's, the norm's
                per_seq += rows * (int(hf["dense"][1]) + int(flow.head.dense) + int(flow.head.norm)) * d * act
        per_seq += rows * d * p.weight if need_x else 0  # gradient of the head's input, residual-stream dtype
        per_step += v * d * p.weight if need_w else 0  # weight gradient
        per_step += v * p.weight if head.bias and (flow is None or flow.head.bias) else 0  # bias gradient
    elif head.type == "classification" and analysed("head", head.type):
        # (does the product's input need a gradient, does its weight train) per product
        x_grad, pool_w = hf["pooler"] if flow else (True, True)
        in_grad, cls_w = hf["classifier"] if flow else (True, True)
        # the first token's vector is a view of the final hidden states: a product that keeps
        # it for its weight gradient keeps all T of them, unless autocast copies it first
        view = head.pooling == "first" and p.activation == p.weight
        pooled = t * d * p.weight if view else d * act
        cls_input, kept = pooled, False
        if head.pooler:
            per_seq += pooled if pool_w else 0
            kept = in_grad  # tanh (or relu) keeps its output for its backward
            per_seq += d * act if kept else 0
            cls_input = d * act
        if head.dropout > 0:
            per_seq += (d if in_grad else 0) + (d * act if cls_w else 0)  # its mask; its output, the classifier's input
        elif cls_w and not kept:
            per_seq += cls_input
    return int(round(batch * per_seq + per_step)), not_counted


@dataclass(frozen=True)
class MemoryEstimate:
    """Training memory in bytes: ``weights``, ``gradients``, ``optimizer`` (the states of the
    spec's optimizer: AdamW's two moments by default), ``weight_casts`` (autocast copies),
    ``activations`` and their ``total``. ``not_counted`` names the parts built from a
    plugin's type, whose activations and autocast copies are left out (their weights,
    gradients and optimizer states are counted), ``training.objective`` when a plugin builds
    the objective: what its loss keeps of the output head is left out of ``activations``,
    and ``training.optimizer`` when the optimizer is a plugin's: ``optimizer`` is then 0,
    its states not counted."""

    batch: int
    seq_len: int
    dtype: str
    weights: int
    gradients: int
    optimizer: int
    weight_casts: int
    activations: int
    not_counted: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.weight_casts + self.activations

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "weight_casts": self.weight_casts,
            "activations": self.activations,
            "total": self.total,
            "not_counted": dict(self.not_counted),
        }


def autocast_copied_parameters(spec: Any, *, skip_plugins: bool = False) -> int:
    """Parameters that autocast copies to half precision in a mixed-precision step: the
    weights and biases of matrix products, and the token table a tied LM or MLM head
    projects with. Norms (layer, RMS, qk), position and segment tables, T5's position
    bias and a token table that is only looked up (untied, or a classification head's)
    run in fp32 and are never copied. Which weights of a plugin's module go through a
    matrix product only it knows: an :class:`AnalysisError`, or left out with ``skip_plugins``."""
    spec = as_spec(spec)
    shapes = count_parameters(spec).shapes
    head_table = None
    if spec.embedding.tie_output and spec.head.type in ("lm", "mlm"):
        # an encoder-decoder with its own decoder table projects with that one
        head_table = next(t for t in ("decoder_embed.tokens.weight", "embed.tokens.weight") if t in shapes)
    total = 0
    for name, shape in shapes.items():
        looked_up = name.startswith(("embed.", "decoder_embed.")) and name != head_table
        if looked_up or "norm." in name or name.endswith("rel_bias.weight"):
            continue
        plugin = _plugin_part(spec, name)
        if plugin is not None:
            if skip_plugins:
                continue
            raise AnalysisError(f"{name}: no autocast count for {plugin}, whose module alone knows which "
                                "weights go through a matrix product")
        total += math.prod(shape)
    return total


def _plugin_part(spec: Any, name: str) -> str | None:
    """The plugin type parameter ``name`` belongs to (``"ffn type 'relu2'"``), or ``None``."""
    parts = name.split(".")
    family, part = "", None
    if parts[0] in ("encoder", "decoder") and len(parts) > 3 and parts[1] == "layers":
        layer = getattr(spec, parts[0]).layer(int(parts[2]))
        family, part = {"self_attn": ("attention", layer.attention), "cross_attn": ("attention", layer.cross_attention),
                        "ffn": ("ffn", layer.ffn)}.get(parts[3], ("norm", layer.norm))
    elif parts[0] in ("encoder", "decoder") and parts[1] == "final_norm":
        family, part = "norm", getattr(spec, parts[0]).norm
    elif parts[0] in ("encoder", "decoder") and parts[1] != "rel_bias":
        family, part = "positional", spec.positional  # a stack's positional module, under its module_name
    elif parts[0] in ("embed", "decoder_embed") and parts[1] == "positions":
        family, part = "positional", spec.positional
    elif parts[0] in ("embed", "decoder_embed") and parts[1] == "norm":
        family, part = "norm", spec.embedding.norm
    elif parts[0] == "head":
        family, part = "head", spec.head
    if part is None or analysed(family, part.type):
        return None
    return f"{family} type {part.type!r}"


def _flow(spec: Any) -> Any:
    from specformer.analysis.flops import _flow as flow

    return flow(spec)


_OPTIMIZERS = ("adamw", "sgd", "adafactor")  # the optimizers whose states are counted


def _counted_optimizer(name: str) -> bool:
    """One of :data:`_OPTIMIZERS`, built by specformer's own function: a plugin that gave
    the name a target of its own (``replace=True``) keeps the states it chooses."""
    from specformer.registry import REGISTRY

    return name in _OPTIMIZERS and REGISTRY.is_builtin("optimizer", name)


def trainable_shapes(spec: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the parameters a run trains, by name: all of them but those the spec's
    ``training.optimizer.freeze`` matches (a pattern that matches none is a
    :class:`~specformer.specs.errors.SpecError`)."""
    from specformer.specs.training import parameter_plan

    spec = as_spec(spec)
    shapes = count_parameters(spec).shapes
    if not getattr(spec.training.optimizer, "freeze", ()) and not getattr(spec.training.optimizer, "lr_scale", ()):
        return dict(shapes)
    plan = parameter_plan(spec.training.optimizer, list(shapes), tied=tied_names(spec, shapes))
    return {name: shape for name, shape in shapes.items() if plan[name] is not None}


def trainable_parameters(spec: Any) -> int:
    """Parameters a run of ``spec`` trains (tied weights once): those its
    ``training.optimizer.freeze`` leaves."""
    return sum(math.prod(shape) for shape in trainable_shapes(spec).values())


def optimizer_state_elements(spec: Any) -> int:
    """Elements the spec's ``training.optimizer`` keeps beside the trained parameters (their
    step counters aside; frozen parameters have none): ``torch.optim.AdamW`` two per
    parameter, ``SGD`` one with momentum, ``Adafactor`` rows + columns of each matrix (per
    leading index of a larger tensor) and one per element of a vector."""
    spec = as_spec(spec)
    optimizer = spec.training.optimizer
    if not _counted_optimizer(optimizer.type):
        raise AnalysisError(f"training.optimizer: no memory count for optimizer type {optimizer.type!r}")
    shapes = trainable_shapes(spec)
    n = sum(math.prod(shape) for shape in shapes.values())
    if optimizer.type == "adamw":
        return 2 * n
    if optimizer.type == "sgd":
        return n if optimizer.momentum > 0 else 0
    if optimizer.type == "adafactor":
        total = 0
        for shape in shapes.values():
            if len(shape) >= 2:
                total += math.prod(shape[:-2]) * (shape[-2] + shape[-1])
            else:
                total += math.prod(shape)
        return total
    raise AnalysisError(f"training.optimizer: no memory count for optimizer type {optimizer.type!r}")


def memory_estimate(
    spec: Any, *, batch: int = 1, seq_len: int | None = None, dtype: str = "bf16-mixed", cpu: bool = False
) -> MemoryEstimate:
    """Memory of one training step of ``spec`` (with its ``training.optimizer``) at
    ``batch`` × ``seq_len`` in ``dtype``; ``cpu``: as a CPU trains it (see
    :func:`activation_bytes`)."""
    spec = as_spec(spec)
    batch = whole_number("batch", batch)
    t = whole_number("seq_len", seq_len) if seq_len is not None else spec.max_seq_len
    p = precision(dtype)
    n = count_parameters(spec).total
    cast = autocast_copied_parameters(spec, skip_plugins=True) if p.weight_cast else 0
    activations, not_counted = _activations(spec, batch=batch, seq_len=t, dtype=p.name, cpu=cpu)
    optimizer = spec.training.optimizer
    trained = trainable_parameters(spec)  # gradients and optimizer states: frozen parameters have none
    if _counted_optimizer(optimizer.type):
        states = optimizer_state_elements(spec) * p.optimizer
    else:  # a plugin's optimizer keeps what it chooses
        states, not_counted = 0, {**not_counted, "training.optimizer": _type_words("optimizer", optimizer.type)}
    return MemoryEstimate(
        batch=batch,
        seq_len=t,
        dtype=p.name,
        weights=n * p.weight,
        gradients=trained * p.grad,
        optimizer=states,
        weight_casts=cast * p.weight_cast,
        activations=activations,
        not_counted=not_counted,
    )
