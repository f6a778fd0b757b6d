"""Transformer layers (residual wiring only) and the stack that runs them.

Shape legend: B batch, T length, S encoder length, D d_model, H heads,
Tk key length (past + T).

State-dict names inside a layer: ``attn_norm``, ``self_attn``, ``cross_norm``,
``cross_attn`` (decoder of an encoder-decoder), ``ffn_norm``, ``ffn``, and with sandwich
norms ``attn_post_norm``, ``cross_post_norm``, ``ffn_post_norm``. Each layer has the
same names whatever its wiring: with output norms ``attn_norm`` normalises the attention's
output, as with post-norm it normalises the sum. A stack holds
``layers.{i}``, ``final_norm`` (when the spec has one) and its positional module
under the module's own name (``rel_bias`` for T5's table).

Dropout sits where the original paper puts it (Vaswani et al. 2017, section 5.4):
on each sublayer's output before it is added to the residual stream; attention
probabilities and the FFN hidden layer have their own dropout inside those modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from specformer.components.attention import Attention
from specformer.components.cache import CacheNotFilledError, KVCache
from specformer.components.dropout import Dropout
from specformer.components.ffn import GLU, MLP
from specformer.components.positional import Positional

__all__ = ["Block", "PreNormBlock", "SandwichBlock", "OutputNormBlock", "PostNormBlock", "ParallelBlock", "Stack",
           "LayerInputs", "padded_on_the_right", "check_norm"]


def padded_on_the_right(key_padding: Tensor) -> bool:
    """Whether every row of ``key_padding`` (B, Tk; True = real token) is its real tokens, then
    padding: no real token after a padded one."""
    return bool((key_padding[:, 1:] <= key_padding[:, :-1]).all())


@dataclass
class LayerInputs:
    """What every layer of one stack forward shares, computed once by the :class:`Stack`.

    ``q_index``/``k_index`` are absolute query (T,) and key (Tk,) indices, used for
    causal, sliding-window and relative-bias masks; ``key_padding`` (B, Tk) is True
    for real keys. Self-attention masks are built lazily, once per distinct sliding
    window, and reused by every layer with that window. ``k_index`` starts at ``k_start``
    (0 unless every layer has a window, with a cache). With a cache, a sliding-window
    layer attends to the keys from max(0, past - (W - 1)) on only (what its rolling
    cache returns), so its mask starts there too.
    """

    q_index: Tensor
    k_index: Tensor
    causal: bool
    dtype: torch.dtype
    key_padding: Tensor | None = None
    bias: Tensor | None = None  # (1, H, T, Tk)
    rope: tuple[Tensor, Tensor] | None = None
    rope_local: tuple[Tensor, Tensor] | None = None  # the windowed layers' own rotation (Gemma 3)
    context: Tensor | None = None  # encoder output (B, S, D)
    context_mask: Tensor | None = None  # (B, 1, 1, S) bool
    cache: KVCache | None = None
    need_weights: bool = False
    compute_dtype: torch.dtype | None = None  # what attention computes in (autocast's dtype under autocast)
    k_start: int = 0  # the absolute index of k_index[0] (past 0 when every layer's window has left it)
    # training a bidirectional stack: the padding's mask may leave a padded query without its own key
    # (its output reaches no loss, and no real position, which sees it masked as a key)
    keys_only: bool = False
    _masks: dict[int | None, tuple[Tensor | None, bool]] = field(default_factory=dict)
    _kernel_masks: dict[int | None, Tensor] = field(default_factory=dict)

    def self_mask(self, window: int | None) -> tuple[Tensor | None, bool]:
        """(mask, is_causal) for self-attention with ``window`` (None: unlimited)."""
        if window not in self._masks:
            self._masks[window] = self._build(window)
        return self._masks[window]

    def kernel_mask(self, window: int | None) -> tuple[Tensor | None, bool]:
        """:meth:`self_mask` as the fused kernel takes it: an additive float mask in the dtype
        attention computes in (-inf where a key is masked, as SDPA makes of a boolean one),
        made once and shared by the layers. Given a boolean mask, SDPA converts it at every
        call, and autocast casts a float one: each layer kept its own T x Tk copy for the
        backward pass. A trained bias (T5's) is returned as it is."""
        mask, is_causal = self.self_mask(window)
        if mask is None or mask.requires_grad:
            return mask, is_causal
        if window not in self._kernel_masks:
            dtype = self.compute_dtype or self.dtype
            if mask.dtype == torch.bool:
                # a mask of padded keys alone (keys_only) takes the finite minimum, so that a row of
                # padding alone stays finite; the others -inf, as SDPA makes of a boolean mask
                low = torch.finfo(dtype).min if mask.shape[-2] == 1 else float("-inf")
                converted = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, low)
            else:
                converted = mask.to(dtype)
            self._kernel_masks[window] = converted
        return self._kernel_masks[window], is_causal

    def _build(self, window: int | None) -> tuple[Tensor | None, bool]:
        t = self.q_index.shape[0]
        k_index, key_padding, bias = self.k_index, self.key_padding, self.bias
        if window is not None and self.cache is not None:
            past = self.k_start + self.k_index.shape[0] - t
            offset = max(0, past - (window - 1)) - self.k_start  # the cache returns keys from here on
            k_index = k_index[offset:]
            key_padding = key_padding[:, offset:] if key_padding is not None else None
            bias = bias[..., offset:] if bias is not None else None
            if t == 1:
                window = None  # one query sees exactly the keys returned
        tk = k_index.shape[0]
        # a causal query sees every key when it is the only new token
        causal = self.causal and t > 1
        if self.keys_only and key_padding is not None and not causal and bias is None and window is None:
            # (B, 1, 1, Tk): attention's products path adds it to its scores (no T x Tk mask)
            return key_padding[:, None, None, :], False
        if bias is None and key_padding is None and window is None:
            if not causal:
                return None, False
            if t == tk:
                return None, True  # SDPA's own causal mask, never materialised
        q, k = self.q_index[:, None], k_index[None, :]  # (T, 1), (1, Tk)
        allowed: Tensor | None = None
        if causal:
            allowed = k <= q  # (T, Tk)
        if window is not None:
            near = (q - k < window) if self.causal else ((q - k).abs() < window)
            allowed = near if allowed is None else allowed & near
        if allowed is not None:
            allowed = allowed[None, None]  # (1, 1, T, Tk)
        if key_padding is not None:
            pad = key_padding[:, None, None, :]  # (B, 1, 1, Tk)
            # every query keeps itself, so no row is fully masked (left padding + causal)
            pad = pad | (k == q)[None, None]
            allowed = pad if allowed is None else allowed & pad
        if bias is None:
            return allowed, False
        if allowed is None:
            return bias, False
        floor = torch.finfo(bias.dtype).min
        return torch.where(allowed, bias, floor), False  # (B|1, H, T, Tk)


class Block(nn.Module):
    """One layer: self-attention, optional cross-attention, FFN, their norms and the
    residual dropout. Subclasses differ only in ``forward``'s wiring."""

    def __init__(
        self,
        *,
        self_attn: Attention,
        ffn: nn.Module,
        attn_norm: nn.Module,
        ffn_norm: nn.Module | None,
        cross_attn: Attention | None = None,
        cross_norm: nn.Module | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn_norm = attn_norm
        self.self_attn = self_attn
        self.cross_norm = cross_norm
        self.cross_attn = cross_attn
        self.ffn_norm = ffn_norm
        self.ffn = ffn
        self.dropout = Dropout(dropout)
        # a module of a registered type of one's own: its outputs are checked at each call, since
        # a wrong shape may broadcast into the residual stream without an error
        self._check = not (
            type(self_attn) is Attention
            and (cross_attn is None or type(cross_attn) is Attention)
            and type(ffn) in (MLP, GLU)
        )
        if type(self_attn) is not Attention:  # a forward that cannot take the call: said at build
            _check_forward(self_attn, "self-attention", ("mask", "is_causal", "rope", "cache", "need_weights"))
        if cross_attn is not None and type(cross_attn) is not Attention:
            _check_forward(cross_attn, "cross-attention", ("context", "mask", "cache", "need_weights"))
        if type(ffn) not in (MLP, GLU):
            _check_forward(ffn, "ffn")

    def _drop(self, x: Tensor) -> Tensor:
        # called only when it acts: a no-op module call costs microseconds per token in decoding
        return self.dropout(x) if self.training and self.dropout.p > 0 else x

    def _self(self, h: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None]:
        # an attention of another type need not have a window
        window = getattr(self.self_attn, "sliding_window", None)
        if getattr(self.self_attn, "backend", None) == "sdpa" and not s.need_weights:
            mask, is_causal = s.kernel_mask(window)
        else:
            mask, is_causal = s.self_mask(window)
        rope = s.rope_local if window is not None and s.rope_local is not None else s.rope
        result = self.self_attn(
            h, mask=mask, is_causal=is_causal, rope=rope, cache=s.cache, need_weights=s.need_weights
        )
        if self._check:
            _check_attention(result, h, self.self_attn, "self-attention")
        out, weights = result
        return self._drop(out), weights

    def _cross(self, h: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None]:
        result = self.cross_attn(
            h, context=s.context, mask=s.context_mask, cache=s.cache, need_weights=s.need_weights
        )
        if self._check:
            _check_attention(result, h, self.cross_attn, "cross-attention")
        out, weights = result
        return self._drop(out), weights

    def _ffn(self, h: Tensor) -> Tensor:
        out = self.ffn(h)
        if self._check and (not isinstance(out, Tensor) or out.shape != h.shape):
            raise ValueError(
                f"the ffn {type(self.ffn).__name__} returned {_described(out)} for an input of shape "
                f"{tuple(h.shape)}: an ffn module maps (B, T, D) to (B, T, D), the shape it is given "
                "(docs/components.md#adding-a-component)"
            )
        return self._drop(out)

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x (B, T, D) -> (x (B, T, D), self-attention weights, cross-attention weights)."""
        raise NotImplementedError


class PreNormBlock(Block):
    """Pre-norm residual wiring (GPT-2, Llama; Xiong et al. 2020)::

        x ──┬──────────────────────────(+)──┬────────────────────(+)── out
            └─ attn_norm ─ self_attn ───┘   └─ ffn_norm ─ ffn ───┘

    (with ``cross_norm ─ cross_attn`` as a third sublayer in between for a decoder
    of an encoder-decoder); the stack adds a final norm after the last layer.
    """

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        out, weights = self._self(self.attn_norm(x), s)
        x = x + out
        cross_weights = None
        if self.cross_attn is not None:
            out, cross_weights = self._cross(self.cross_norm(x), s)
            x = x + out
        x = x + self._ffn(self.ffn_norm(x))
        return x, weights, cross_weights


class SandwichBlock(Block):
    """Pre-norm wiring with a second norm on each sublayer's output (Gemma 2 and 3)::

        x ──┬──────────────────────────────────────────(+)──┬─────────────────────────────────(+)── out
            └─ attn_norm ─ self_attn ─ attn_post_norm ───┘   └─ ffn_norm ─ ffn ─ ffn_post_norm ─┘

    (``cross_norm ─ cross_attn ─ cross_post_norm`` in between for a decoder of an
    encoder-decoder); the stack adds a final norm after the last layer.
    """

    def __init__(self, *, attn_post_norm: nn.Module, ffn_post_norm: nn.Module,
                 cross_post_norm: nn.Module | None = None, **parts: Any) -> None:
        super().__init__(**parts)
        self.attn_post_norm = attn_post_norm
        self.cross_post_norm = cross_post_norm
        self.ffn_post_norm = ffn_post_norm

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        out, weights = self._self(self.attn_norm(x), s)
        x = x + self.attn_post_norm(out)
        cross_weights = None
        if self.cross_attn is not None:
            out, cross_weights = self._cross(self.cross_norm(x), s)
            x = x + self.cross_post_norm(out)
        x = x + self.ffn_post_norm(self._ffn(self.ffn_norm(x)))
        return x, weights, cross_weights


class OutputNormBlock(Block):
    """A norm on each sublayer's output and none before it (OLMo 2; Swin v2's res-post-norm)::

        x ──┬──────────────────────────(+)──┬────────────────────(+)── out
            └─ self_attn ─ attn_norm ───┘   └─ ffn ─ ffn_norm ───┘

    (``cross_attn ─ cross_norm`` in between for a decoder of an encoder-decoder); the
    residual stream itself is never normalised until the stack's final norm.
    """

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        out, weights = self._self(x, s)
        x = x + self.attn_norm(out)
        cross_weights = None
        if self.cross_attn is not None:
            out, cross_weights = self._cross(x, s)
            x = x + self.cross_norm(out)
        x = x + self.ffn_norm(self._ffn(x))
        return x, weights, cross_weights


class PostNormBlock(Block):
    """Post-norm residual wiring, the original Transformer's and BERT's
    (Vaswani et al. 2017: LayerNorm(x + Sublayer(x)))::

        x ──┬─────────────(+)─ attn_norm ──┬────────(+)─ ffn_norm ── out
            └─ self_attn ──┘               └─ ffn ───┘
    """

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        out, weights = self._self(x, s)
        x = self.attn_norm(x + out)
        cross_weights = None
        if self.cross_attn is not None:
            out, cross_weights = self._cross(x, s)
            x = self.cross_norm(x + out)
        x = self.ffn_norm(x + self._ffn(x))
        return x, weights, cross_weights


class ParallelBlock(Block):
    """Parallel residual (GPT-NeoX): both sublayers read the same input, each through
    its own norm::

        x ──┬──────────────────────────────(+)── out
            ├─ attn_norm ─ self_attn ───────┤
            └─ ffn_norm ── ffn ─────────────┘

    (a decoder's cross-attention joins as a third parallel branch). Without ``ffn_norm``
    (``residual.shared_norm``: GPT-J, Phi-1/1.5/2) ``attn_norm``'s output feeds every
    sublayer, computed once.
    """

    def forward(self, x: Tensor, s: LayerInputs) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h = self.attn_norm(x)
        out, weights = self._self(h, s)
        cross_weights = None
        if self.cross_attn is not None:
            cross_out, cross_weights = self._cross(h if self.cross_norm is None else self.cross_norm(x), s)
            out = out + cross_out
        return x + out + self._ffn(h if self.ffn_norm is None else self.ffn_norm(x)), weights, cross_weights


class Stack(nn.Module):
    """An encoder or decoder: its layers, its positional module and an optional final norm.

    ``causal`` (decoders) masks future keys. The stack computes what all layers share
    once per forward — rotary tables, the relative-position bias, the masks — and
    hands it to each layer in a :class:`LayerInputs`.
    """

    def __init__(
        self,
        layers: list[Block],
        *,
        positional: Positional,
        final_norm: nn.Module | None,
        causal: bool,
        final_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_dropout = final_dropout
        self.positional_name = positional.module_name
        self.add_module(positional.module_name, positional)
        self.final_norm = final_norm
        self.causal = causal
        self.checkpoint_layers = False  # activation checkpointing (the model's gradient_checkpointing_enable)
        # (n_heads, head_dim) for a positional module of one's own, whose bias and rotation are
        # checked at each call (the builder sets it); None for specformer's own
        self.positional_sizes: tuple[int, int] | None = None

    @property
    def positional_module(self) -> Positional:
        return self._modules[self.positional_name]  # type: ignore[return-value]

    def forward(
        self,
        x: Tensor,
        *,
        position_ids: Tensor,
        n_positions: int,
        attention_mask: Tensor | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """x (B, T, D) embedded input -> (hidden (B, T, D), self weights, cross weights).

        ``attention_mask`` (B, Tk) covers past and new keys (1 = real token);
        ``context_mask`` (B, S) covers the encoder output.
        """
        t = x.shape[1]
        past = cache.length if cache is not None else 0
        if attention_mask is not None and attention_mask.shape[-1] != past + t:
            raise ValueError(
                f"attention_mask covers {attention_mask.shape[-1]} positions but there are {past + t} "
                f"keys ({past} cached + {t} new); with a cache, pass the mask of past and new tokens"
            )
        # with a cache and a window in every layer, no query sees a key older than the widest
        # window's: the key indices, padding and bias start there, so that a step costs O(W)
        # however long the sequence (not O(past))
        k_start = 0
        if cache is not None and past:
            windows = [getattr(getattr(layer, "self_attn", None), "sliding_window", None) for layer in self.layers]
            if windows and all(isinstance(w, int) and w > 0 for w in windows):
                k_start = max(0, past - (max(windows) - 1))
        if attention_mask is not None and k_start:
            attention_mask = attention_mask[:, k_start:]
        key_padding = attention_mask.bool() if attention_mask is not None else None
        # a training forward: no loss reads a padded position's own output
        training = self.training and torch.is_grad_enabled() and not past and not need_weights
        if key_padding is not None and not torch.compiler.is_compiling():
            if bool(key_padding.all()):
                # nothing is padded: drop the mask so causal attention keeps SDPA's is_causal path
                key_padding = None
            elif self.causal and training and padded_on_the_right(key_padding):
                # training on rows padded on the right (pairs, SFT): a causal query at a real token
                # sees real keys only, so the mask changes the padding's own outputs alone, which
                # no loss reads (labels are -100 there); without it attention keeps its causal
                # path, in bf16 the products instead of torch's masked kernel
                key_padding = None
        q_index = torch.arange(past, past + t, device=x.device)  # (T,)
        k_index = torch.arange(k_start, past + t, device=x.device)  # (Tk,)
        pos = self.positional_module
        bias = pos.bias(q_index, k_index, dtype=x.dtype)
        rope = pos.rotation(position_ids, n_positions, dtype=x.dtype)
        if self.positional_sizes is not None:
            _check_positional(pos, bias, rope, x.shape[0], t, k_index.shape[0], *self.positional_sizes)
        s = LayerInputs(
            q_index=q_index,
            k_index=k_index,
            causal=self.causal,
            dtype=x.dtype,
            key_padding=key_padding,
            bias=bias,
            rope=rope,
            rope_local=local.rotation(position_ids, n_positions, dtype=x.dtype)
            if (local := getattr(pos, "local", None)) is not None else None,
            context=context,
            context_mask=context_mask.bool()[:, None, None, :] if context_mask is not None else None,
            cache=cache,
            need_weights=need_weights,
            compute_dtype=_compute_dtype(x),
            k_start=k_start,
            keys_only=training and not self.causal,
        )
        all_weights: list[Tensor] = []
        all_cross: list[Tensor] = []
        recompute = self.checkpoint_layers and self.training and torch.is_grad_enabled() and cache is None \
            and not need_weights
        if recompute:
            # the masks are built once, here, not inside the first layer that asks: a layer run
            # again in the backward pass must save the same tensors as its first run did
            for layer in self.layers:
                attn = getattr(layer, "self_attn", None)
                window = getattr(attn, "sliding_window", None)
                if getattr(attn, "backend", None) == "sdpa":
                    s.kernel_mask(window)
                else:
                    s.self_mask(window)
        for layer in self.layers:
            if recompute:
                # keeps the layer's input; its forward runs again in the backward pass
                x, weights, cross_weights = checkpoint(layer, x, s, use_reentrant=False)
            else:
                x, weights, cross_weights = layer(x, s)
            if need_weights:
                all_weights.append(weights)
                if cross_weights is not None:
                    all_cross.append(cross_weights)
        if cache is not None:
            _check_cached(cache, self.layers, past + t)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.final_dropout:
            x = nn.functional.dropout(x, self.final_dropout, self.training)
        if not need_weights:
            return x, None, None
        return x, tuple(all_weights), (tuple(all_cross) if all_cross else None)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's where it is on for x's device, else x's."""
    try:
        if torch.is_autocast_enabled(x.device.type):
            return torch.get_autocast_dtype(x.device.type)
    except RuntimeError:  # a device type autocast has no notion of (meta)
        pass
    return x.dtype


def _described(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _check_forward(
    module: nn.Module, what: str, keywords: tuple[str, ...] = (), *, args: tuple[str, ...] = ("x",),
    caller: str = "block",
) -> None:
    """Refuse a module of one's own (an attention, FFN, norm or head) whose ``forward`` cannot
    be called as specformer calls it: ``forward(x, mask=..., ...)`` with these positional
    ``args`` and keyword arguments, at build rather than at the first call."""
    import inspect

    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # no signature to read: the call says
        return
    try:
        signature.bind(*(None for _ in args), **dict.fromkeys(keywords))
    except TypeError as exc:
        call = ", ".join([*args, *(f"{k}=..." for k in keywords)])
        raise TypeError(
            f"the {what} {type(module).__name__}'s forward{signature} cannot be called as the {caller} calls it, "
            f"forward({call}): {exc} (docs/components.md#adding-a-component)"
        ) from None


def check_norm(module: nn.Module) -> None:
    """A norm module of one's own: refuse at build a ``forward`` that cannot be called as
    ``forward(x)``, and check at each call that it returns its input's shape, which a
    ``(B, T, 1)`` output (a norm, not the normalised rows) would broadcast into the residual
    stream without an error (output and sandwich norms add it to the stream)."""
    _check_forward(module, "norm", caller="model")
    module.register_forward_hook(_check_norm_output)


def _check_norm_output(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    x = args[0] if args else None
    if isinstance(x, Tensor) and (not isinstance(output, Tensor) or output.shape != x.shape):
        raise ValueError(
            f"the norm {type(module).__name__} returned {_described(output)} for an input of shape "
            f"{tuple(x.shape)}: a norm module maps (..., D) to the shape it is given "
            "(docs/components.md#adding-a-component)"
        )


def _check_attention(result: object, h: Tensor, module: nn.Module, what: str) -> None:
    """Refuse what an attention module of one's own returns unless it is ``(out, weights)`` with
    ``out`` shaped as its input: a bare tensor would be unpacked along its batch."""
    ok = isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Tensor)
    if not ok or result[0].shape != h.shape:  # type: ignore[index]
        got = _described(result) if not ok else f"an output of shape {tuple(result[0].shape)}"  # type: ignore[index]
        raise ValueError(
            f"the {what} {type(module).__name__} returned {got} for an input of shape {tuple(h.shape)}: an "
            "attention module returns (output, weights): output (B, T, D), the input's shape, and weights "
            "(B, H, T, S) or None (docs/components.md#adding-a-component)"
        )


def _check_positional(pos: nn.Module, bias: Any, rope: Any, b: int, t: int, tk: int, h: int, dh: int) -> None:
    """Refuse what a positional module of one's own returns unless its bias is ``(1|B, 1|H, T, Tk)``
    and its rotation a ``(cos, sin)`` pair, each ``(1|B, T, 1, R)`` with an even R up to the head
    size: another shape fails inside attention, where the error names no module, or broadcasts."""
    name = type(pos).__name__
    if bias is not None and not (
        isinstance(bias, Tensor) and bias.dim() == 4 and bias.shape[0] in (1, b) and bias.shape[1] in (1, h)
        and tuple(bias.shape[2:]) == (t, tk)
    ):
        raise ValueError(
            f"the positional module {name}'s bias(q_index, k_index) returned {_described(bias)} for {t} queries and "
            f"{tk} keys: an attention bias is None or (1, H, T, Tk) = (1, {h}, {t}, {tk}) (1 or B = {b} rows, 1 or "
            f"{h} heads) (docs/components.md#adding-a-component)"
        )
    if rope is None:
        return
    pair = isinstance(rope, tuple | list) and len(rope) == 2 and all(isinstance(r, Tensor) for r in rope)
    shape = tuple(rope[0].shape) if pair else None
    if not (
        pair and shape == tuple(rope[1].shape) and len(shape) == 4 and shape[0] in (1, b) and shape[1] == t
        and shape[2] == 1 and 0 < shape[3] <= dh and shape[3] % 2 == 0
    ):
        got = _described(rope) if not pair else f"tensors of shapes {tuple(rope[0].shape)} and {tuple(rope[1].shape)}"
        raise ValueError(
            f"the positional module {name}'s rotation(position_ids, ...) returned {got} for {t} positions: a rotation "
            f"is None or (cos, sin), each (1|B, T, 1, R) with R even and at most head_dim = {dh} "
            "(docs/components.md#adding-a-component)"
        )


def _check_cached(cache: KVCache, layers: nn.ModuleList, length: int) -> None:
    """Refuse a cache that a layer's self-attention did not fill: the next call would read
    positions from it that it never stored, and decode from a model that forgot the past."""
    for i, layer in enumerate(layers):
        if cache.layer_length(i) != length:
            attn = getattr(layer, "self_attn", layer)
            raise CacheNotFilledError(
                f"layer {i}'s self-attention ({type(attn).__name__}) did not store its keys and values in "
                f"the KV cache (it holds {cache.layer_length(i)} of the {length} positions): an attention "
                "module decodes with a cache only if its forward calls cache.update(layer_idx, k, v) "
                "(docs/components.md, KV cache)",
                "run this model without one: use_cache=False (specformer generate --no-cache)",
            )
