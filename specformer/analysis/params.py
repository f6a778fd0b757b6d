"""Exact parameter counts from a spec alone (no torch, no weights).

The counter enumerates the state-dict parameters that :func:`specformer.builder.build_model`
creates — every name and shape — so the total equals
``sum(p.numel() for p in model.parameters())`` of the built model, tied weights counted once.
Names follow the state-dict contract documented in ``docs/analysis.md``. A spec that uses a
type registered by a plugin, whose parameters only its module knows, is counted from the
model built on the meta device (nothing allocated), as exactly; so is a built-in type name
that a plugin gave a build target of its own (``register(..., replace=True)``).

"Embedding" parameters (excluded from ``non_embedding``, as in Kaplan et al. 2020,
"Scaling Laws for Neural Language Models") are every vocabulary- or position-sized
table: token, position and segment embeddings and an untied output projection with
its bias.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ParamCounts",
    "count_parameters",
    "parameter_shapes",
    "tied_names",
    "is_embedding_parameter",
    "component_of",
    "AnalysisError",
    "plugin_components",
    "own_built_components",
    "BUILT_BY",
    "plugin_objective",
    "BUILT_IN_TYPES",
    "analysed",
]

Shape = tuple[int, ...]


class AnalysisError(ValueError):
    """A spec uses a type the analytic model does not know (e.g. a plugin entry), or its
    model, needed to count such a type, cannot be built."""


# the types whose parameters, FLOPs and memory the analysis works out from the spec
BUILT_IN_TYPES: dict[str, tuple[str, ...]] = {
    "attention": ("mha",),
    "ffn": ("mlp", "glu"),
    "norm": ("layernorm", "rmsnorm"),
    "positional": ("sinusoidal", "learned", "rope", "alibi", "t5", "none"),
    "head": ("lm", "mlm", "classification"),
}


def analysed(family: str, name: str) -> bool:
    """Whether the analysis has formulas for ``family`` type ``name``: one of
    :data:`BUILT_IN_TYPES` that still builds specformer's own module. A plugin may give a
    built-in name a build target of its own (``register(family, spec, target,
    replace=True)``); what that builds is the plugin's, counted like a new plugin type."""
    from specformer.registry import REGISTRY

    return name in BUILT_IN_TYPES[family] and REGISTRY.is_builtin(family, name)


def _type_words(family: str, name: str) -> str:
    """``ffn type 'relu2'``; a built-in name built by a plugin's target says whose:
    ``attention type 'mha', built by my_pkg.attn:Attn``."""
    from specformer.registry import REGISTRY

    text = f"{family} type {name!r}"
    if name in BUILT_IN_TYPES.get(family, ()) or (family, name) in REGISTRY.builtin_targets:
        target = REGISTRY.get(family, name).target
        if isinstance(target, str):
            shown = target
        else:
            shown = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}"
        text += f"{BUILT_BY}{shown}"
    return text


#: what :func:`plugin_components` says of a built-in type that a module of one's own builds
BUILT_BY = ", built by "


def own_built_components(spec: Any) -> dict[str, str]:
    """The parts of :func:`plugin_components` whose built-in type a module of one's own builds
    (``register(..., replace=True)``): ``{"decoder.ffn": "ffn type 'mlp', built by
    my_pkg:Relu2MLP"}``. The spec alone reads as the built-in types: a checkpoint records these,
    and an export refuses them."""
    return {key: what for key, what in plugin_components(spec).items() if BUILT_BY in what}


def index_ranges(indices: list[int], sep: str = ", ") -> str:
    """Sorted indices as runs: ``[0, 1, 3]`` -> ``'0-1, 3'``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return sep.join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _layer_span(indices: list[int]) -> str:
    return f"layer{'s' * (len(indices) > 1)} {index_ranges(indices)}"


def plugin_components(spec: Any) -> dict[str, str]:
    """The parts of ``spec`` built from a type the analysis has no formula for (a plugin's),
    each with what it is: ``{"decoder.ffn": "ffn type 'relu2'", ...}``. The keys are the
    groups of :func:`component_of` (``{stack}.attention``, ``{stack}.cross_attention``,
    ``{stack}.ffn``, ``{stack}.norms``, ``head``), ``embedding.norm`` and ``positional``.
    A part that only some layers take from a plugin names them (``"ffn type 'relu2' in layers 0-1"``)."""
    spec = as_spec(spec)
    out: dict[str, str] = {}
    for role, stack in spec.stacks():
        found: dict[tuple[str, str, str], list[int]] = {}
        for i in range(stack.n_layers):
            layer = stack.layer(i)
            parts = [("attention", "attention", layer.attention), ("ffn", "ffn", layer.ffn),
                     ("norms", "norm", layer.norm)]
            if layer.cross_attention is not None and role == "decoder" and spec.kind == "encoder-decoder":
                parts.insert(1, ("cross_attention", "attention", layer.cross_attention))
            for group, family, part in parts:
                if not analysed(family, part.type):
                    found.setdefault((group, family, part.type), []).append(i)
        if stack.final_norm and not analysed("norm", stack.norm.type):
            found.setdefault(("norms", "norm", stack.norm.type), [])
        for (group, family, kind), layers in found.items():
            key = f"{role}.{group}"
            every = len(layers) == stack.n_layers or not layers
            text = _type_words(family, kind) + ("" if every else f" in {_layer_span(layers)}")
            out[key] = f"{out[key]}; {text}" if key in out else text
    if spec.embedding.norm is not None and not analysed("norm", spec.embedding.norm.type):
        out["embedding.norm"] = _type_words("norm", spec.embedding.norm.type)
    if not analysed("positional", spec.positional.type):
        out["positional"] = _type_words("positional", spec.positional.type)
    if not analysed("head", spec.head.type):
        out["head"] = _type_words("head", spec.head.type)
    return out


def plugin_objective(spec: Any) -> dict[str, str]:
    """``{"training.objective": "objective type 'causal_lm', built by my_pkg.clm:CLM"}`` when
    ``spec``'s objective is built by a plugin's target (``register("objective", ...,
    replace=True)``), else ``{}``. The analysis counts the output head of a training step
    as specformer's objectives run it: through the fused loss (``model(..., labels=)``), on
    the labelled rows; a plugin's objective runs the loss as its module chooses."""
    from specformer.registry import REGISTRY

    spec = as_spec(spec)
    objective = spec.training.objective
    if objective is None or REGISTRY.is_builtin("objective", objective.type):
        return {}
    return {"training.objective": _type_words("objective", objective.type)}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one spec.

    ``shapes`` maps every state-dict parameter name to its shape; ``components``
    groups them (``embedding``, ``decoder.attention``, ``decoder.ffn``,
    ``decoder.norms``, ``head``, ...) in model order; ``per_layer`` gives, for each
    stack, one ``{attention, cross_attention, ffn, norms}`` dict per layer.
    """

    total: int
    non_embedding: int
    embedding: int
    components: dict[str, int]
    per_layer: dict[str, list[dict[str, int]]] = field(repr=False)  # a dict per layer: too long to print
    shapes: dict[str, Shape] = field(repr=False)
    # "analytic" (from the spec) or "meta build" (a plugin type: the model built on meta)
    method: str = "analytic"

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "non_embedding": self.non_embedding,
            "embedding": self.embedding,
            "components": dict(self.components),
            "counted_from": self.method,
        }


def _numel(shape: Shape) -> int:
    return math.prod(shape)


# --------------------------------------------------------------------------- enumeration


def _norm(prefix: str, norm: Any, dim: int) -> Iterator[tuple[str, Shape]]:
    kind = getattr(norm, "type", None)
    if kind == "layernorm":
        if norm.weight:
            yield f"{prefix}.weight", (dim,)
        if norm.bias:
            yield f"{prefix}.bias", (dim,)
    elif kind == "rmsnorm":
        yield f"{prefix}.weight", (dim,)
    else:
        raise AnalysisError(f"{prefix}: no analytic parameter count for norm type {kind!r}")


def _linear(prefix: str, d_in: int, d_out: int, bias: bool) -> Iterator[tuple[str, Shape]]:
    yield f"{prefix}.weight", (d_out, d_in)
    if bias:
        yield f"{prefix}.bias", (d_out,)


def _qk_norms(prefix: str, att: Any) -> Iterator[tuple[str, Shape]]:
    """The query and key norms: over a head's features, or (scope all) the whole projection."""
    if att.qk_norm == "none":
        return
    whole = getattr(att, "qk_norm_scope", "head") == "all"
    for name, heads in (("q_norm", att.n_heads), ("k_norm", att.n_kv_heads)):
        dim = heads * att.head_dim if whole else att.head_dim
        yield f"{prefix}.{name}.weight", (dim,)
        if att.qk_norm == "layernorm":
            yield f"{prefix}.{name}.bias", (dim,)


def _self_attention(prefix: str, att: Any, d_model: int) -> Iterator[tuple[str, Shape]]:
    if getattr(att, "type", None) != "mha":
        raise AnalysisError(f"{prefix}: no analytic parameter count for attention type {att.type!r}")
    h, hkv, dh = att.n_heads, att.n_kv_heads, att.head_dim
    yield from _linear(f"{prefix}.qkv_proj", d_model, (h + 2 * hkv) * dh, att.bias)
    yield from _linear(f"{prefix}.o_proj", h * dh, d_model, att.output_bias)
    yield from _qk_norms(prefix, att)


def _cross_attention(prefix: str, att: Any, d_model: int) -> Iterator[tuple[str, Shape]]:
    if getattr(att, "type", None) != "mha":
        raise AnalysisError(f"{prefix}: no analytic parameter count for attention type {att.type!r}")
    h, hkv, dh = att.n_heads, att.n_kv_heads, att.head_dim
    yield from _linear(f"{prefix}.q_proj", d_model, h * dh, att.bias)
    yield from _linear(f"{prefix}.kv_proj", d_model, 2 * hkv * dh, att.bias)
    yield from _linear(f"{prefix}.o_proj", h * dh, d_model, att.output_bias)
    yield from _qk_norms(prefix, att)


def _ffn(prefix: str, ffn: Any, d_model: int) -> Iterator[tuple[str, Shape]]:
    kind = getattr(ffn, "type", None)
    if kind == "mlp":
        yield from _linear(f"{prefix}.up_proj", d_model, ffn.d_ff, ffn.bias)
        yield from _linear(f"{prefix}.down_proj", ffn.d_ff, d_model, ffn.bias)
    elif kind == "glu":
        yield from _linear(f"{prefix}.up_proj", d_model, ffn.d_ff, ffn.bias)
        yield from _linear(f"{prefix}.gate_proj", d_model, ffn.d_ff, ffn.bias)
        yield from _linear(f"{prefix}.down_proj", ffn.d_ff, d_model, ffn.bias)
    else:
        raise AnalysisError(f"{prefix}: no analytic parameter count for ffn type {kind!r}")


def _embedding(prefix: str, spec: Any, *, tokens: bool = True) -> Iterator[tuple[str, Shape]]:
    d = spec.d_model
    if tokens:
        yield f"{prefix}.tokens.weight", (spec.vocab_size, d)
    pos = spec.positional
    if pos.type == "learned":
        yield f"{prefix}.positions.weight", (pos.rows(spec.max_seq_len), d)
    elif pos.type not in ("sinusoidal", "rope", "alibi", "t5", "none"):
        raise AnalysisError(f"positional: no analytic parameter count for positional type {pos.type!r}")
    if spec.embedding.segment_vocab_size:
        yield f"{prefix}.segments.weight", (spec.embedding.segment_vocab_size, d)
    if spec.embedding.norm is not None:
        yield from _norm(f"{prefix}.norm", spec.embedding.norm, d)


def _stack(role: str, stack: Any, spec: Any) -> Iterator[tuple[str, Shape]]:
    d = spec.d_model
    for i in range(stack.n_layers):
        layer = stack.layer(i)
        p = f"{role}.layers.{i}"
        sandwich = layer.norm.placement == "sandwich"  # a second norm on each sublayer's output
        yield from _norm(f"{p}.attn_norm", layer.norm, d)
        yield from _self_attention(f"{p}.self_attn", layer.attention, d)
        if sandwich:
            yield from _norm(f"{p}.attn_post_norm", layer.norm, d)
        shared = layer.residual.shared_norm  # attn_norm feeds every sublayer
        if layer.cross_attention is not None and role == "decoder" and spec.kind == "encoder-decoder":
            if not shared:
                yield from _norm(f"{p}.cross_norm", layer.norm, d)
            yield from _cross_attention(f"{p}.cross_attn", layer.cross_attention, d)
            if sandwich:
                yield from _norm(f"{p}.cross_post_norm", layer.norm, d)
        if not shared:
            yield from _norm(f"{p}.ffn_norm", layer.norm, d)
        yield from _ffn(f"{p}.ffn", layer.ffn, d)
        if sandwich:
            yield from _norm(f"{p}.ffn_post_norm", layer.norm, d)
    if stack.final_norm:
        yield from _norm(f"{role}.final_norm", stack.norm, d)
    if spec.positional.type == "t5":
        yield f"{role}.rel_bias.weight", (spec.positional.num_buckets, stack.attention.n_heads)


def _head(spec: Any) -> Iterator[tuple[str, Shape]]:
    head, d, v = spec.head, spec.d_model, spec.vocab_size
    tied = spec.embedding.tie_output
    if head.type == "lm":
        if not tied:
            yield from _linear("head.proj", d, v, head.bias)
        elif head.bias:
            yield "head.bias", (v,)
    elif head.type == "mlm":
        yield from _linear("head.transform.dense", d, d, True)
        yield "head.transform.norm.weight", (d,)
        yield "head.transform.norm.bias", (d,)
        if not tied:
            yield "head.proj.weight", (v, d)
        if head.bias:
            yield "head.bias", (v,)
    elif head.type == "classification":
        if head.pooler:
            yield from _linear("head.pooler", d, d, True)
        yield from _linear("head.classifier", d, head.n_classes, True)
    else:
        raise AnalysisError(f"head: no analytic parameter count for head type {head.type!r}")


def as_spec(spec: Any) -> Any:
    """``spec`` as a validated :class:`ModelSpec`: one already, or a preset name, a YAML
    path or a dict, loaded as ``load_spec`` loads them (as ``build_model`` accepts)."""
    from pydantic import BaseModel

    if isinstance(spec, BaseModel) and hasattr(spec, "stacks"):
        return spec
    if isinstance(spec, str | dict) or hasattr(spec, "__fspath__"):
        from specformer.specs.loader import load_spec

        return load_spec(spec)
    raise TypeError(f"expected a spec (a ModelSpec, preset name, YAML path or dict), got {type(spec).__name__}")


def whole_number(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an ``int`` at least ``minimum``: a count of tokens or sequences. A float
    (``2.5``, or ``1024.0``) or a ``bool`` is a ``TypeError``, which would otherwise give
    fractional FLOPs and bytes."""
    import operator

    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be {'positive' if minimum == 1 else f'>= {minimum}'}, got {number}")
    return number


def parameter_shapes(spec: Any) -> dict[str, Shape]:
    """Every trainable parameter of the built model, by state-dict name, in model order.

    Tied weights appear once (under the token embedding), as in
    ``dict(model.named_parameters())``. Worked out from the spec: a plugin's type is an
    :class:`AnalysisError` (``count_parameters(spec).shapes`` builds such a model on the meta
    device instead).
    """
    spec = as_spec(spec)
    # a plugin's type, a built-in name that a plugin's target builds included: the formulas
    # below are of specformer's own modules
    if parts := plugin_components(spec):
        key, what = next(iter(parts.items()))
        raise AnalysisError(f"{key}: no analytic parameter count for {what}")
    out: dict[str, Shape] = {}
    out.update(_embedding("embed", spec))
    if spec.kind == "encoder-decoder" and not spec.embedding.share_encoder_decoder:
        out.update(_embedding("decoder_embed", spec))
    elif spec.kind == "encoder-decoder" and not spec.embedding.share_positions:
        # BART: the decoder reads the encoder's token table through its own positions and norm
        out.update(_embedding("decoder_embed", spec, tokens=False))
    for role, stack in spec.stacks():
        out.update(_stack(role, stack, spec))
    out.update(_head(spec))
    return out


# --------------------------------------------------------------------------- grouping

_EMBED_PREFIXES = ("embed.tokens.", "embed.positions.", "embed.segments.",
                   "decoder_embed.tokens.", "decoder_embed.positions.", "decoder_embed.segments.",
                   "head.proj.")


def tied_names(spec: Any, shapes: dict[str, Shape] | None = None) -> dict[str, str]:
    """The names a tied weight goes by besides its own: ``{"head.weight": "embed.tokens.weight"}``
    for an LM or MLM head that projects with the token table (an encoder-decoder's decoder
    table where it has its own), else ``{}``."""
    spec = as_spec(spec)
    if not (spec.embedding.tie_output and spec.head.type in ("lm", "mlm")):
        return {}
    shapes = shapes if shapes is not None else count_parameters(spec).shapes
    table = next((t for t in ("decoder_embed.tokens.weight", "embed.tokens.weight") if t in shapes), None)
    return {"head.weight": table} if table is not None else {}


def is_embedding_parameter(name: str) -> bool:
    """Whether ``name`` is a vocabulary- or position-sized table (see the module docstring)."""
    return name.startswith(_EMBED_PREFIXES) or name == "head.bias"


_LAYER_PART = {
    "attn_norm": "norms",
    "cross_norm": "norms",
    "ffn_norm": "norms",
    "attn_post_norm": "norms",
    "cross_post_norm": "norms",
    "ffn_post_norm": "norms",
    "self_attn": "attention",
    "cross_attn": "cross_attention",
    "ffn": "ffn",
}


def component_of(name: str) -> str:
    """The breakdown group of a parameter name: ``embedding``, ``decoder_embedding``,
    ``{stack}.attention|cross_attention|ffn|norms|rel_bias`` or ``head``."""
    parts = name.split(".")
    if parts[0] == "embed":
        return "embedding"
    if parts[0] == "decoder_embed":
        return "decoder_embedding"
    if parts[0] == "head":
        return "head"
    if parts[0] in ("encoder", "decoder"):
        if parts[1] == "layers":
            return f"{parts[0]}.{_LAYER_PART.get(parts[3], parts[3])}"
        if parts[1] == "final_norm":
            return f"{parts[0]}.norms"
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


_STACK_ORDER = ("attention", "cross_attention", "ffn", "norms", "rel_bias")


def _component_rank(key: str) -> tuple[int, int, str]:
    head, _, part = key.partition(".")
    top = {"embedding": 0, "decoder_embedding": 1, "encoder": 2, "decoder": 3, "head": 4}.get(head, 5)
    sub = _STACK_ORDER.index(part) if part in _STACK_ORDER else len(_STACK_ORDER)
    return top, sub, key


# the last specs counted from a meta build, by id (the spec is kept, so its id stays its own)
_BUILT: dict[int, tuple[Any, dict[str, Shape]]] = {}


def meta_build(spec: Any, purpose: str) -> Any:
    """``spec``'s model built on the meta device (nothing allocated), for ``purpose`` (``"to
    count the parameters of ..."``). A module that fails to build is an :class:`AnalysisError`
    naming its exception (a :class:`~specformer.registry.PluginError`, which names the plugin
    and its target already, as it is)."""
    from specformer.builder import build_model
    from specformer.registry import PluginError

    try:
        return build_model(spec, device="meta")
    except PluginError:
        raise
    except Exception as exc:
        raise AnalysisError(f"{spec.name}: the model cannot be built on the meta device {purpose}: "
                            f"{type(exc).__name__}: {exc}") from exc


def built_parameter_shapes(spec: Any) -> dict[str, Shape]:
    """Every parameter of ``spec``'s model built on the meta device (nothing allocated), by
    name, as ``dict(model.named_parameters())``: tied weights once. For a type only its own
    module knows the parameters of (a plugin's); a model that cannot be built is an
    :class:`AnalysisError` saying why."""
    spec = as_spec(spec)
    hit = _BUILT.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    parts = ", ".join(f"{key} ({what})" for key, what in plugin_components(spec).items())
    model = meta_build(spec, f"to count the parameters of {parts or 'its types'}")
    from torch.nn.parameter import UninitializedParameter

    lazy = [name for name, p in model.named_parameters() if isinstance(p, UninitializedParameter)]
    if lazy:  # nn.LazyLinear and friends: a shape only the first forward sets
        named = ", ".join(lazy[:3]) + (f" and {len(lazy) - 3} more" if len(lazy) > 3 else "")
        raise AnalysisError(f"{spec.name}: {named} of {parts or 'its types'} are lazy parameters (nn.Lazy*), "
                            "whose shapes only a first forward sets: their count is not known from the spec; give "
                            "the module its sizes (nn.Linear(d_model, d_ff)) to have it counted")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if len(_BUILT) >= 8:
        _BUILT.pop(next(iter(_BUILT)))
    _BUILT[id(spec)] = (spec, shapes)
    return shapes


def count_parameters(spec: Any) -> ParamCounts:
    """Exact parameter counts of ``spec`` (a :class:`ModelSpec`, a preset name, a YAML path
    or a dict, as :func:`~specformer.load_spec` takes them); no torch needed,
    except for a type registered by a plugin: the model is then built on the meta device
    (nothing allocated) and its parameters counted (``method="meta build"``).

    >>> from specformer import load_spec
    >>> count_parameters(load_spec("gpt2-small")).total
    124439808
    """
    spec = as_spec(spec)
    method = "analytic"
    try:
        shapes = parameter_shapes(spec)
    except AnalysisError:
        shapes, method = built_parameter_shapes(spec), "meta build"
    components: dict[str, int] = {}
    per_layer: dict[str, list[dict[str, int]]] = {
        role: [
            {"attention": 0, "cross_attention": 0, "ffn": 0, "norms": 0}
            for _ in range(stack.n_layers)
        ]
        for role, stack in spec.stacks()
    }
    embedding = 0
    for name, shape in shapes.items():
        n = _numel(shape)
        group = component_of(name)
        components[group] = components.get(group, 0) + n
        if is_embedding_parameter(name):
            embedding += n
        parts = name.split(".")
        if parts[0] in per_layer and parts[1] == "layers" and parts[3] in _LAYER_PART:
            per_layer[parts[0]][int(parts[2])][_LAYER_PART[parts[3]]] += n
    components = dict(sorted(components.items(), key=lambda kv: _component_rank(kv[0])))
    total = sum(components.values())
    return ParamCounts(
        total=total,
        non_embedding=total - embedding,
        embedding=embedding,
        components=components,
        per_layer=per_layer,
        shapes=shapes,
        method=method,
    )
