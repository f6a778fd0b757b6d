"""The three top-level models: encoder-only, decoder-only, encoder-decoder.

Shape legend: B batch, T (decoder) length, S encoder length, D d_model, V vocabulary.

Every forward takes ``labels`` (B, T) (-100 for positions without one; for a decoder,
already shifted: position t's label is token t + 1, as specformer's collators make
them): the output's ``loss`` is then the mean cross-entropy, computed by the head
without the (B, T, V) logits (``logits`` is None) when the head can (language-model
and masked-LM heads; see :mod:`specformer.components.loss`).

State-dict names: ``embed`` (shared token embedding), ``decoder_embed`` (encoder-
decoder with separate embeddings), ``encoder`` / ``decoder`` (:class:`Stack`),
``head``. Attention masks follow Hugging Face: (B, length) with 1 for real tokens
and 0 for padding; with a cache, the decoder mask covers past and new tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.components.blocks import Stack
from specformer.components.cache import KVCache
from specformer.components.embedding import Embedding
from specformer.components.loss import IGNORE_INDEX, check_label_smoothing
from specformer.components.outputs import ModelOutput
from specformer.components.products import in_functorch_transform

__all__ = ["EncoderModel", "DecoderModel", "EncoderDecoderModel", "default_position_ids"]


def default_position_ids(attention_mask: Tensor | None, past: int, length: int, device: torch.device) -> Tensor:
    """Positions of the new tokens: counted over real tokens when a mask is given (so
    left padding does not shift them), else past .. past + length - 1. (B|1, T)."""
    if attention_mask is None:
        return torch.arange(past, past + length, device=device)[None]  # (1, T)
    positions = attention_mask.long().cumsum(-1) - 1  # (B, Tk)
    return positions[:, -length:].clamp(min=0)  # (B, T)


def _check_ids(
    ids: Tensor, mask: Tensor | None, past: int, *, name: str, mask_name: str, vocab_size: int
) -> Tensor:
    """Clear errors for token ids that are not (B, T) integers in [0, vocab_size) and for a
    mask (B, past + T) that does not cover them, before any embedding or broadcasting error
    could. Returns the ids as int64 (any integer dtype is accepted, as for labels)."""
    if not isinstance(ids, Tensor):
        hint = " (a batch of the data module: model(**batch))" if isinstance(ids, dict) else ""
        raise TypeError(f"{name} must be a tensor of token ids, got a {type(ids).__name__}{hint}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (batch, length), got shape {tuple(ids.shape)}")
    if not _is_integer(ids):
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    if mask is not None and tuple(mask.shape) != (ids.shape[0], past + ids.shape[1]):
        covers = f"the {past} cached and {ids.shape[1]} new" if past else f"the {ids.shape[1]}"
        raise ValueError(
            f"{mask_name} must be (batch, length) = ({ids.shape[0]}, {past + ids.shape[1]}), covering "
            f"{covers} positions of {name}; got shape {tuple(mask.shape)}"
        )
    ids = ids.long()  # nn.Embedding takes int64 (and int32) only; a no-op for int64
    # an id outside the table is an IndexError on the CPU and, on CUDA, a device-side
    # assert that leaves the context unusable: worth one min/max reduction, read on the
    # host (a device sync; generation syncs once per token anyway, for its stop test).
    # Skipped while torch.compile traces, where reading a value breaks the graph.
    if not torch.compiler.is_compiling():
        _check_range(ids, 0, vocab_size, name=name, allowed=f"token ids in [0, vocab_size) = [0, {vocab_size})")
        if mask is not None and mask.dtype != torch.bool:
            _check_mask_values(mask, mask_name)
    return ids


def _check_mask_values(mask: Tensor, name: str) -> None:
    """A mask of 1 for a real token and 0 for padding: other values (2, 0.5, -1) would count
    positions wrong, silently, and past the position table fail deep in the embedding."""
    if mask.numel() == 0 or mask.device.type == "meta":
        return
    if mask.is_floating_point() or mask.is_complex():
        bad = (mask != 0) & (mask != 1)
        if bool(bad.any()):
            where = [int(i) for i in bad.nonzero()[0]]
            raise ValueError(f"{name} must hold 1 for a real token and 0 for padding; found "
                             f"{mask[tuple(where)].item()} at {name}{where}")
        return
    _check_range(mask, 0, 2, name=name, allowed="1 for a real token and 0 for padding")


def _is_integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _value_range(t: Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tensor, read on the host: one reduction and, on
    a GPU, one sync (the second read has nothing left to wait for)."""
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


def _check_range(t: Tensor, low: int, high: int | None, *, name: str, allowed: str) -> tuple[int, int] | None:
    """Refuse values of t outside [low, high) (high None: no upper bound), naming the first
    bad value and where it is; returns (min, max), or None for an empty t or one on the
    meta device (no values to read: a meta model runs for its shapes)."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    lo, hi = _value_range(t)
    if lo < low or (high is not None and hi >= high):
        bad = (t < low) if high is None else (t < low) | (t >= high)
        where = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(f"{name} must be {allowed}; found {int(t[tuple(where)])} at {name}{where}")
    return lo, hi


def _per_token(x: Tensor, ids: Tensor, *, name: str, ids_name: str, what: str) -> Tensor:
    """``x`` (B|1, T) of integers, one ``what`` per token of ``ids`` (B, T), as int64."""
    b, t = ids.shape
    if x.dim() != 2 or x.shape[0] not in (1, b) or x.shape[1] != t:
        raise ValueError(
            f"{name} must be (batch, length) = ({b}, {t}) or (1, {t}), one {what} per token of "
            f"{ids_name}; got shape {tuple(x.shape)}"
        )
    if not _is_integer(x):
        raise TypeError(f"{name} must hold integer {what}s, got {x.dtype}")
    return x.long()


def _check_positions(position_ids: Tensor, ids: Tensor, *, name: str, ids_name: str) -> tuple[Tensor, int]:
    """Position ids (B|1, T) of non-negative integers for ids (B, T); returns them as int64
    and n_positions, an exclusive upper bound of them."""
    position_ids = _per_token(position_ids, ids, name=name, ids_name=ids_name, what="position")
    bounds = _check_range(position_ids, 0, None, name=name, allowed="positions >= 0")
    return position_ids, (bounds[1] + 1 if bounds is not None else 0)


def _check_not_the_inputs(labels: Any, ids: Any, *, ids_name: str, instead: str) -> None:
    """Refuse labels that are the input tensor itself: Hugging Face's habit (``labels=input_ids``,
    shifted inside its models), which here, with labels already shifted, trains a copy."""
    if not (isinstance(labels, Tensor) and isinstance(ids, Tensor)):
        return
    # a compiled forward, or one under a torch.func transform, sees the identity, not the
    # storage (no data_ptr under tracing or for functorch's wrapped tensors)
    same = labels is ids or (
        not torch.compiler.is_compiling() and not in_functorch_transform()
        and labels.device.type != "meta" and labels.numel() > 0
        and labels.data_ptr() == ids.data_ptr() and labels.shape == ids.shape
        and labels.stride() == ids.stride() and labels.dtype == ids.dtype
    )
    if same:
        raise ValueError(
            f"labels are {ids_name} itself, which trains the model to copy its input: labels are already "
            f"shifted (position t's label is token t + 1; Hugging Face shifts inside its models instead); "
            f"{instead}"
        )


def _check_class_labels(logits: Tensor, labels: Tensor) -> Tensor:
    """Labels for a head without a ``loss`` (a classification head): one integer class in
    [0, C) or -100 per row of the logits (B, C) (or position of (B, T, C)), the checks
    the vocabulary heads' loss makes; returns them as int64, as cross_entropy needs."""
    want, n_classes = tuple(logits.shape[:-1]), logits.shape[-1]
    if tuple(labels.shape) != want:
        dims = ", ".join(("batch", "length")[: len(want)]) + ("," if len(want) == 1 else "")
        per = "sequence" if len(want) == 1 else "position"
        raise ValueError(
            f"labels must be ({dims}) = {want}, one class index per {per} of the head's logits "
            f"{tuple(logits.shape)}; got shape {tuple(labels.shape)}"
        )
    if not _is_integer(labels):
        raise TypeError(f"labels must be integer class indices (or {IGNORE_INDEX}: no label), got {labels.dtype}")
    labels = labels.long()
    if labels.numel() and not torch.compiler.is_compiling():
        bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= n_classes))
        if bool(bad.any()):
            raise ValueError(
                f"labels must be class indices in [0, {n_classes}) or {IGNORE_INDEX} (no label); "
                f"found {int(labels[bad][0])}"
            )
    return labels


def _check_keep(keep: Any) -> None:
    if isinstance(keep, bool) or not isinstance(keep, int):
        raise TypeError(
            f"logits_to_keep must be an int: the number of last positions to compute logits for "
            f"(0: all); got {type(keep).__name__} (for other positions, index the full logits)"
        )
    if keep < 0:
        raise ValueError(f"logits_to_keep must be >= 0 (the number of last positions; 0: all), got {keep}")


def _check_cache(cache: KVCache | None, ids: Tensor, *, name: str) -> None:
    batch = cache.batch_size if cache is not None else None
    if batch is not None and batch != ids.shape[0]:
        raise ValueError(
            f"the cache holds a batch of {batch} sequences but {name} has a batch of {ids.shape[0]}; "
            "pass the next tokens of every cached sequence (cache.reorder selects rows)"
        )


def _head(
    head: nn.Module,
    h: Tensor,
    mask: Tensor | None,
    keep: int = 0,
    labels: Tensor | None = None,
    smoothing: float = 0.0,
) -> tuple[Tensor | None, Tensor | None]:
    """(logits, loss) of the head on hidden states h (B, T, D)."""
    if labels is not None:
        loss = getattr(head, "loss", None)
        if loss is not None:
            return None, loss(h, labels, label_smoothing=smoothing)
        smoothing = check_label_smoothing(smoothing)
        logits = head(h, mask)
        labels = _check_class_labels(logits, labels)
        flat = logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, logits.shape[-1])
        return logits, F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE_INDEX, label_smoothing=smoothing)
    if keep > 0:
        h = h[:, -keep:]  # (B, k, D)
        mask = mask[:, -keep:] if mask is not None else None
    return head(h, mask), None


class _Model(nn.Module):
    def __init__(self, *, embed: Embedding, head: nn.Module) -> None:
        super().__init__()
        self.embed = embed
        self.head = head

    def num_parameters(self, *, trainable_only: bool = False) -> int:
        """Distinct parameters (a tied matrix counts once), as Hugging Face's ``num_parameters``."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def gradient_checkpointing_enable(self) -> None:
        """Activation checkpointing, as Hugging Face's method of this name: in training, each
        layer keeps only its input for the backward pass and runs its forward again there
        (``torch.utils.checkpoint``, dropout masks repeated), trading about a third more
        compute for the layers' activations. Decoding with a cache, and forwards asked for
        attention weights, run as usual. ``training.activation_checkpointing: true`` sets it."""
        self._set_checkpointing(True)

    def gradient_checkpointing_disable(self) -> None:
        self._set_checkpointing(False)

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(m, "checkpoint_layers", False) for m in self.modules())

    def _set_checkpointing(self, enabled: bool) -> None:
        for module in self.modules():
            if isinstance(module, Stack):
                module.checkpoint_layers = enabled


class DecoderModel(_Model):
    """Decoder-only Transformer (GPT, Llama): embed -> causal stack -> head."""

    def __init__(self, *, embed: Embedding, decoder: Stack, head: nn.Module) -> None:
        super().__init__(embed=embed, head=head)
        self.decoder = decoder

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        logits_to_keep: int = 0,
        labels: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, V). A cache (given, or created by
        ``use_cache=True``) is updated in place and returned in the output.
        ``logits_to_keep=k`` > 0 computes logits for the last k positions only
        (generation needs one: a prefill then skips a (T, V) projection).
        ``labels`` (B, T), shifted: the loss instead of the logits (module docstring)."""
        _check_keep(logits_to_keep)
        _check_not_the_inputs(labels, input_ids, ids_name="input_ids",
                              instead="for token ids `ids`, model(ids[:, :-1], labels=ids[:, 1:])")
        if use_cache and cache is None:
            cache = KVCache()
        past = cache.length if cache is not None else 0
        input_ids = _check_ids(
            input_ids, attention_mask, past, name="input_ids", mask_name="attention_mask",
            vocab_size=self.embed.weight.shape[0],
        )
        _check_cache(cache, input_ids, name="input_ids")
        t = input_ids.shape[1]
        n_positions = past + t
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, past, t, input_ids.device)
        else:
            position_ids, n_positions = _check_positions(
                position_ids, input_ids, name="position_ids", ids_name="input_ids"
            )
        x = self.embed(input_ids, position_ids=position_ids, n_positions=n_positions)
        h, attentions, _ = self.decoder(
            x,
            position_ids=position_ids,
            n_positions=n_positions,
            attention_mask=attention_mask,
            cache=cache,
            need_weights=output_attentions,
        )
        mask = attention_mask[:, -t:] if attention_mask is not None else None
        logits, loss = _head(self.head, h, mask, logits_to_keep, labels, label_smoothing)
        return ModelOutput(logits=logits, hidden_states=h, cache=cache, attentions=attentions, loss=loss)


class EncoderModel(_Model):
    """Encoder-only Transformer (BERT): embed -> bidirectional stack -> head."""

    def __init__(self, *, embed: Embedding, encoder: Stack, head: nn.Module) -> None:
        super().__init__(embed=embed, head=head)
        self.encoder = encoder

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool = False,
        labels: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """input_ids (B, T) -> logits (B, T, V) for mlm/lm heads, (B, C) for classification.
        ``labels`` ((B, T), or (B,) for classification): the loss (module docstring)."""
        input_ids = _check_ids(
            input_ids, attention_mask, 0, name="input_ids", mask_name="attention_mask",
            vocab_size=self.embed.weight.shape[0],
        )
        t = input_ids.shape[1]
        n_positions = t
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, 0, t, input_ids.device)  # (B|1, T)
        else:
            position_ids, n_positions = _check_positions(
                position_ids, input_ids, name="position_ids", ids_name="input_ids"
            )
        if token_type_ids is not None:
            token_type_ids = self._check_token_types(token_type_ids, input_ids)
        x = self.embed(
            input_ids, position_ids=position_ids, n_positions=n_positions, token_type_ids=token_type_ids
        )
        h, attentions, _ = self.encoder(
            x,
            position_ids=position_ids,
            n_positions=n_positions,
            attention_mask=attention_mask,
            need_weights=output_attentions,
        )
        logits, loss = _head(self.head, h, attention_mask, 0, labels, label_smoothing)
        return ModelOutput(logits=logits, hidden_states=h, attentions=attentions, loss=loss)

    def _check_token_types(self, token_type_ids: Tensor, input_ids: Tensor) -> Tensor:
        """Token types (B|1, T) in [0, segments) for input_ids (B, T), as int64. A model
        without segment embeddings treats every token as segment 0, so only 0 is allowed."""
        token_type_ids = _per_token(token_type_ids, input_ids, name="token_type_ids", ids_name="input_ids",
                                    what="segment id")
        segments = self.embed.segments
        n = segments.num_embeddings if segments is not None else 1
        allowed = (
            f"segment ids in [0, {n}) (the segment embeddings' size)" if segments is not None
            else "0 (this model has no segment embeddings: every token is segment 0)"
        )
        if not torch.compiler.is_compiling():
            _check_range(token_type_ids, 0, n, name="token_type_ids", allowed=allowed)
        return token_type_ids


class EncoderDecoderModel(_Model):
    """Encoder-decoder Transformer (Vaswani et al. 2017; T5): the decoder attends to
    the encoder output through cross-attention. ``embed`` serves both stacks unless the
    spec separates them (then the decoder uses ``decoder_embed``)."""

    def __init__(
        self,
        *,
        embed: Embedding,
        encoder: Stack,
        decoder: Stack,
        head: nn.Module,
        decoder_embed: Embedding | None = None,
    ) -> None:
        super().__init__(embed=embed, head=head)
        self.decoder_embed = decoder_embed
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (B, S) -> encoder output (B, S, D), after the encoder's final norm."""
        input_ids = _check_ids(
            input_ids, attention_mask, 0, name="input_ids", mask_name="attention_mask",
            vocab_size=self.embed.weight.shape[0],
        )
        s = input_ids.shape[1]
        position_ids = default_position_ids(attention_mask, 0, s, input_ids.device)  # (B|1, S)
        x = self.embed(input_ids, position_ids=position_ids, n_positions=s)
        h, _, _ = self.encoder(x, position_ids=position_ids, n_positions=s, attention_mask=attention_mask)
        return h

    def forward(
        self,
        input_ids: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor,
        decoder_attention_mask: Tensor | None = None,
        decoder_position_ids: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        logits_to_keep: int = 0,
        labels: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """input_ids (B, S), decoder_input_ids (B, T) -> logits (B, T, V).

        Pass ``encoder_hidden_states`` (from :meth:`encode` or a previous output) to
        skip the encoder; ``attention_mask`` still masks the encoder's padding. With a
        cache, cross-attention keys and values are computed once and reused.
        ``logits_to_keep=k`` > 0 computes logits for the last k positions only.
        ``labels`` (B, T), aligned with ``decoder_input_ids``: the loss (module docstring).
        """
        if encoder_hidden_states is None and input_ids is None:
            raise ValueError("give input_ids or encoder_hidden_states")
        _check_keep(logits_to_keep)
        _check_not_the_inputs(
            labels, decoder_input_ids, ids_name="decoder_input_ids",
            instead="for a target `tgt` that starts with the decoder's start token, "
            "model(src, decoder_input_ids=tgt[:, :-1], labels=tgt[:, 1:])",
        )
        if use_cache and cache is None:
            cache = KVCache()
        past = cache.length if cache is not None else 0
        # every decoder-side check before the encoder runs
        embed = self.decoder_embed if self.decoder_embed is not None else self.embed
        decoder_input_ids = _check_ids(
            decoder_input_ids, decoder_attention_mask, past, name="decoder_input_ids",
            mask_name="decoder_attention_mask", vocab_size=embed.weight.shape[0],
        )
        _check_cache(cache, decoder_input_ids, name="decoder_input_ids")
        t = decoder_input_ids.shape[1]
        n_positions = past + t
        if decoder_position_ids is None:
            decoder_position_ids = default_position_ids(
                decoder_attention_mask, past, t, decoder_input_ids.device
            )
        else:
            decoder_position_ids, n_positions = _check_positions(
                decoder_position_ids, decoder_input_ids, name="decoder_position_ids", ids_name="decoder_input_ids"
            )
        b = decoder_input_ids.shape[0]
        if encoder_hidden_states is None:
            if input_ids.dim() == 2 and input_ids.shape[0] != b:
                raise ValueError(
                    f"input_ids has a batch of {input_ids.shape[0]} sources but decoder_input_ids has "
                    f"a batch of {b}; give one source per target"
                )
            encoder_hidden_states = self.encode(input_ids, attention_mask)
        else:
            self._check_encoder_output(encoder_hidden_states, attention_mask, b)
        x = embed(decoder_input_ids, position_ids=decoder_position_ids, n_positions=n_positions)
        h, attentions, cross = self.decoder(
            x,
            position_ids=decoder_position_ids,
            n_positions=n_positions,
            attention_mask=decoder_attention_mask,
            context=encoder_hidden_states,
            context_mask=attention_mask,
            cache=cache,
            need_weights=output_attentions,
        )
        mask = decoder_attention_mask[:, -t:] if decoder_attention_mask is not None else None
        logits, loss = _head(self.head, h, mask, logits_to_keep, labels, label_smoothing)
        return ModelOutput(
            logits=logits,
            loss=loss,
            hidden_states=h,
            cache=cache,
            attentions=attentions,
            encoder_hidden_states=encoder_hidden_states,
            cross_attentions=cross,
        )

    def _check_encoder_output(self, hidden: Tensor, mask: Tensor | None, batch: int) -> None:
        """A given encoder output must be (B, S, D) with the decoder's batch, and its mask (B, S):
        a mismatch would otherwise broadcast (one row's padding applied to every row) or fail
        inside cross-attention."""
        d = self.embed.weight.shape[1]
        if hidden.dim() != 3 or hidden.shape[0] != batch or hidden.shape[2] != d:
            raise ValueError(
                f"encoder_hidden_states must be (batch, source length, d_model) = ({batch}, S, {d}), "
                f"with the batch of decoder_input_ids; got shape {tuple(hidden.shape)}"
            )
        if not hidden.is_floating_point():
            raise TypeError(f"encoder_hidden_states must be a floating-point tensor, got {hidden.dtype}")
        if mask is not None and tuple(mask.shape) != tuple(hidden.shape[:2]):
            raise ValueError(
                f"attention_mask must be (batch, source length) = {tuple(hidden.shape[:2])}, covering "
                f"the positions of encoder_hidden_states {tuple(hidden.shape)}; got shape {tuple(mask.shape)}"
            )
