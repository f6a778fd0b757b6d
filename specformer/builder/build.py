"""ModelSpec -> torch.nn.Module, through the registry, and the one weight initialiser.

Only this module walks the spec tree: it asks the registry for every component
(``REGISTRY.build(family, sub_spec, **model_level_numbers)``) and hands the built
children to the containers. Models are constructed on the meta device first (no
memory, no init work), then materialised on the target device and initialised
once by :func:`init_weights`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from specformer.components.attention import Attention
from specformer.components.blocks import (
    Block,
    OutputNormBlock,
    ParallelBlock,
    PostNormBlock,
    PreNormBlock,
    SandwichBlock,
    Stack,
    _check_forward,
    check_norm,
)
from specformer.components.embedding import Embedding
from specformer.components.heads import LMHead, check_head
from specformer.components.models import DecoderModel, EncoderDecoderModel, EncoderModel
from specformer.components.positional import Positional, T5RelativeBias
from specformer.registry import REGISTRY
from specformer.specs.schema import InitSpec, ModelSpec, StackSpec

__all__ = ["build_model", "init_weights", "BuildError"]

_MODELS: dict[str, type[nn.Module]] = {
    "decoder": DecoderModel,
    "encoder": EncoderModel,
    "encoder-decoder": EncoderDecoderModel,
}

# (residual type, norm placement) -> the block that wires it
_BLOCKS: dict[tuple[str, str], type[Block]] = {
    ("sequential", "pre"): PreNormBlock,
    ("sequential", "post"): PostNormBlock,
    ("sequential", "sandwich"): SandwichBlock,
    ("sequential", "output"): OutputNormBlock,
    ("parallel", "pre"): ParallelBlock,
}


class BuildError(ValueError):
    """A spec that validates but cannot be built as asked; the message says why and what works."""


def build_model(
    spec: ModelSpec | str | os.PathLike[str] | Mapping[str, Any],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> nn.Module:
    """Build the model ``spec`` describes (a ModelSpec, a preset name, a YAML path or text, or a dict).

    ``device="meta"`` allocates nothing and skips initialisation (for counting and
    planning); any other device gets weights initialised by :func:`init_weights`
    directly on it, in ``dtype`` (default float32). A component whose parameters or
    buffers :func:`init_weights` does not set keeps its constructor's values (the model
    is then constructed on ``device`` rather than materialised from meta). A device this
    machine lacks (``cuda`` on a CPU-only torch, ``cuda:5`` of two GPUs) is a
    :class:`BuildError`. The resolved spec is kept as ``model.spec``.
    """
    if not isinstance(spec, ModelSpec):
        from specformer.specs.loader import load_spec

        spec = load_spec(spec)
    if dtype is not None:
        dtype = _dtype(dtype)
    with torch.device("meta"):
        model = _build(spec)
    target = _device(device) if device is not None else torch.get_default_device()
    if target.type != "meta" and _set_by_constructor(model):
        # to_empty would leave such a component's parameters as uninitialised memory:
        # construct the model for real on the target device instead
        with torch.device(target):
            model = _build(spec)
    if dtype is not None:
        model = model.to(dtype)
    if target.type != "meta":
        if any(p.is_meta for p in model.parameters()):
            model = model.to_empty(device=target)
        init_weights(model, spec.init)
    model.spec = spec
    return model


def _device(name: torch.device | str) -> torch.device:
    """``torch.device(name)``, checked to be one this machine has: torch itself says only
    "Torch not compiled with CUDA enabled" (an ``AssertionError``) once a weight is made."""
    try:
        found = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise BuildError(f"device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps, meta)") from None
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = (f"this torch ({torch.__version__}) is built for the CPU only" if torch.version.cuda is None
                   else "torch sees no CUDA GPU here (a driver problem, or CUDA_VISIBLE_DEVICES)")
            raise BuildError(f"device {str(found)!r}: {why}; build on 'cpu', or leave device out")
        if found.index is not None and found.index >= count:
            raise BuildError(f"device {str(found)!r}: this machine has {count} CUDA GPU{'s' if count > 1 else ''} "
                             f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    elif found.type in ("mps", "xpu"):
        backend = getattr(torch.backends, "mps", None) if found.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise BuildError(f"device {str(found)!r}: this machine (or this torch build) has no "
                             f"{found.type.upper()} device; build on 'cpu', or leave device out")
    return found


def _set_by_constructor(model: nn.Module) -> bool:
    """Whether a module of ``model`` holds parameters or buffers that :func:`init_weights`
    does not set (a component's ``nn.Parameter(torch.ones(d))`` with no init hook): only
    its constructor gives them their values."""
    for module in model.modules():
        params = any(True for _ in module.parameters(recurse=False))
        if not params and not any(True for _ in module.buffers(recurse=False)):
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)) or hasattr(module, "init_parameters"):
            continue
        if params and hasattr(module, "reset_parameters"):
            continue
        return True
    return False


# the short names the command line's --dtype and training.precision use
_SHORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}


def _dtype(name: str | torch.dtype) -> torch.dtype:
    dtype = name if isinstance(name, torch.dtype) else getattr(
        torch, _SHORT_DTYPES.get(str(name).lower(), str(name).removeprefix("torch.")), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise BuildError(f"dtype {name!r} is not a floating-point dtype (e.g. float32, bfloat16, bf16, "
                         "torch.float16)")
    return dtype


# --------------------------------------------------------------------------- building


def _build(spec: ModelSpec) -> nn.Module:
    d_model = spec.d_model
    pos_cls = REGISTRY.get("positional", spec.positional.type).resolve()
    in_embedding = getattr(pos_cls, "scope", "stack") == "embedding"
    own_positional = not REGISTRY.is_builtin("positional", spec.positional.type)
    first_stack = spec.encoder if spec.encoder is not None else spec.decoder
    assert first_stack is not None

    def embedding(tokens: nn.Embedding | None = None) -> Embedding:
        positions = _positional(spec, first_stack, causal=spec.kind == "decoder") if in_embedding else None
        norm = (
            _norm(spec.embedding.norm, dim=d_model)
            if spec.embedding.norm is not None
            else None
        )
        built = Embedding(
            spec.embedding,
            vocab_size=spec.vocab_size,
            d_model=d_model,
            positions=positions,
            norm=norm,
            shared_tokens=tokens,
        )
        built.positions_checked = positions is not None and own_positional
        return built

    embed = embedding()
    decoder_embed = None
    if spec.kind == "encoder-decoder" and not spec.embedding.share_encoder_decoder:
        decoder_embed = embedding()
    elif spec.kind == "encoder-decoder" and not spec.embedding.share_positions:
        # BART: one token table, but the decoder's own positions and embedding norm
        decoder_embed = embedding(tokens=embed.tokens)
    stacks = {}
    for role, stack_spec in spec.stacks():
        causal = role == "decoder"
        positional = Positional() if in_embedding else _positional(spec, stack_spec, causal=causal)
        stacks[role] = _stack(stack_spec, d_model=d_model, positional=positional, causal=causal, role=role,
                              checked_positional=not in_embedding and own_positional)
    output_embed = decoder_embed if decoder_embed is not None else embed
    assert spec.head is not None, "the head is filled in during validation"
    head = REGISTRY.build(
        "head",
        spec.head,
        d_model=d_model,
        vocab_size=spec.vocab_size,
        embedding=output_embed if spec.embedding.tie_output else None,
    )
    if not REGISTRY.is_builtin("head", spec.head.type):  # the models call it as head(h, mask)
        _check_forward(head, "head", args=("hidden", "attention_mask"), caller="model")
        # its logits' width, checked at each call: another fails in the loss or in generate, naming no head
        n_classes = getattr(spec.head, "n_classes", None)
        classes = isinstance(n_classes, int) and not isinstance(n_classes, bool)
        check_head(head, type_name=spec.head.type, width=n_classes if classes else spec.vocab_size,
                   field="n_classes" if classes else "vocab_size")
    extra = {"decoder_embed": decoder_embed} if decoder_embed is not None else {}
    return _MODELS[spec.kind](embed=embed, head=head, **stacks, **extra)


def _norm(spec: Any, *, dim: int) -> nn.Module:
    """A norm of the spec's type; one of one's own is checked (its forward at build, its
    output's shape at each call: :func:`~specformer.components.blocks.check_norm`)."""
    module = REGISTRY.build("norm", spec, dim=dim)
    if not REGISTRY.is_builtin("norm", spec.type):
        check_norm(module)
    return module


def _positional(spec: ModelSpec, stack: StackSpec, *, causal: bool) -> Positional:
    att = stack.attention
    module = REGISTRY.build(
        "positional",
        spec.positional,
        d_model=spec.d_model,
        max_seq_len=spec.max_seq_len,
        n_heads=att.n_heads,
        head_dim=att.head_dim,
        causal=causal,
    )
    if not isinstance(module, Positional):
        # the models call its three hooks and the builder reads its scope and module name
        raise BuildError(
            f"positional type {spec.positional.type!r} built a {type(module).__name__}, which is not a "
            "specformer.components.positional.Positional: subclass it, override the hooks you use (embed, "
            "rotation, bias; the others do nothing) and set its scope ('embedding' or 'stack') and module_name"
        )
    return module


def _stack(
    stack: StackSpec, *, d_model: int, positional: Positional, causal: bool, role: str, checked_positional: bool = False
) -> Stack:
    layers: list[Block] = []
    for i in range(stack.n_layers):
        ls = stack.layer(i)
        for size in ("n_heads", "head_dim"):
            want = getattr(positional, size, None)
            if want is not None and getattr(ls.attention, size) != want:
                raise BuildError(
                    f"{role}.overrides: layer {i} has attention {size}={getattr(ls.attention, size)}, "
                    f"but the stack's positional module ({positional.module_name}) is built for "
                    f"{size}={want}; every layer of the stack must share it"
                )
        block_cls = _BLOCKS.get((ls.residual.type, ls.norm.placement))
        if block_cls is None:
            allowed = ", ".join(f"{r} residual with {p}-norm" for r, p in _BLOCKS)
            raise BuildError(
                f"{role}: {ls.residual.type} residual with {ls.norm.placement}-norm is not defined "
                f"(allowed: {allowed})"
            )
        shared = ls.residual.shared_norm  # one norm (attn_norm) feeds every sublayer
        cross_attn = cross_norm = None
        if ls.cross_attention is not None:
            cross_attn = REGISTRY.build("attention", ls.cross_attention, d_model=d_model, cross=True, layer_idx=i)
            cross_norm = None if shared else _norm(ls.norm, dim=d_model)
        post_norms: dict[str, Any] = {}
        if block_cls is SandwichBlock:  # a second norm on each sublayer's output
            post_norms = {"attn_post_norm": _norm(ls.norm, dim=d_model),
                          "ffn_post_norm": _norm(ls.norm, dim=d_model)}
            if cross_attn is not None:
                post_norms["cross_post_norm"] = _norm(ls.norm, dim=d_model)
        layers.append(
            block_cls(
                **post_norms,
                self_attn=REGISTRY.build("attention", ls.attention, d_model=d_model, cross=False, layer_idx=i),
                ffn=REGISTRY.build("ffn", ls.ffn, d_model=d_model),
                attn_norm=_norm(ls.norm, dim=d_model),
                ffn_norm=None if shared else _norm(ls.norm, dim=d_model),
                cross_attn=cross_attn,
                cross_norm=cross_norm,
                dropout=ls.residual.dropout,
            )
        )
    final_norm = _norm(stack.norm, dim=d_model) if stack.final_norm else None
    built = Stack(
        layers, positional=positional, final_norm=final_norm, causal=causal, final_dropout=stack.final_dropout
    )
    if checked_positional:  # one of one's own: its bias and rotation are checked at each call
        built.positional_sizes = (stack.attention.n_heads, stack.attention.head_dim)
    return built


# --------------------------------------------------------------------------- initialisation


@torch.no_grad()
def init_weights(model: nn.Module, init: InitSpec | None = None) -> None:
    """Initialise every parameter of ``model``, in one place, following ``init``
    (default: ``model.spec.init``):

    * linear and embedding weights ~ N(0, std), linear biases 0;
    * projections into the residual stream (attention ``o_proj``, FFN ``down_proj``)
      ~ N(0, std / sqrt(2 * n_layers)) with ``scaled_residual``, n_layers of their
      stack (GPT-2, Radford et al. 2019);
    * norms: weight 1, bias 0; learned position and relative-bias tables ~ N(0, std);
      head biases 0 (modules with ``init_parameters(std)`` initialise themselves);
    * with ``scheme: t5``, T5's stds instead (Raffel et al. 2020, as Hugging Face's
      ``T5PreTrainedModel._init_weights``): token embeddings and an untied LM output
      ~ N(0, 1), T5 bias tables ~ N(0, d_model^-0.5), attention queries
      ~ N(0, (d_model * head_dim)^-0.5 / scale) (T5's own scale is 1), every other
      linear weight ~ N(0, fan_in^-0.5) (T5's k, v, o, wi, wo).

    Does nothing on the meta device, where there is nothing to initialise.
    """
    if init is None:
        init = model.spec.init
    if any(p.is_meta for p in model.parameters()):
        return
    std = init.std
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:  # as nn.Embedding starts it: a row of zeros
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif hasattr(module, "init_parameters"):
            module.init_parameters(std)
        elif any(True for _ in module.parameters(recurse=False)) and hasattr(module, "reset_parameters"):
            module.reset_parameters()
    if init.scheme == "t5":
        _t5_init(model)
    if init.scaled_residual:
        for stack in (m for m in model.modules() if isinstance(m, Stack)):
            scaled = std / math.sqrt(2 * len(stack.layers))
            for module in stack.modules():
                if getattr(module, "residual_projection", False):
                    nn.init.normal_(module.weight, mean=0.0, std=scaled)


def _t5_init(model: nn.Module) -> None:
    """T5's per-matrix stds over what the generic pass set (see :func:`init_weights`)."""
    tokens = {id(m.tokens): m.tokens for m in model.modules() if isinstance(m, Embedding)}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=module.in_features**-0.5)
    for table in tokens.values():
        nn.init.normal_(table.weight, mean=0.0, std=1.0)
        if table.padding_idx is not None:  # the padding row starts at zero under either scheme
            with torch.no_grad():
                table.weight[table.padding_idx].zero_()
    d_model = next(iter(tokens.values())).embedding_dim if tokens else None
    for module in model.modules():
        if isinstance(module, Attention):
            # T5 computes q·k unscaled and puts the 1/sqrt(head_dim) into the queries' init;
            # a model that scales the scores keeps T5's product by dividing by its scale
            q = module.q_proj.weight if module.cross else module.qkv_proj.weight[: module.n_heads * module.head_dim]
            std = (module.q_proj.in_features if module.cross else module.qkv_proj.in_features) ** -0.5
            nn.init.normal_(q, mean=0.0, std=std * module.head_dim**-0.5 / module.scale)
        elif isinstance(module, T5RelativeBias) and d_model is not None:
            nn.init.normal_(module.weight, mean=0.0, std=d_model**-0.5)
        elif isinstance(module, LMHead) and module.proj is not None:
            nn.init.normal_(module.proj.weight, mean=0.0, std=1.0)
