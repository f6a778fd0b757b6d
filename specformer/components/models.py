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

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from specformer.components.blocks import Stack
from specformer.components.cache import KVCache
from specformer.components.embedding import Embedding
from specformer.components.loss import IGNORE_INDEX
from specformer.components.outputs import ModelOutput

__all__ = ["EncoderModel", "DecoderModel", "EncoderDecoderModel", "default_position_ids"]


def default_position_ids(attention_mask: Tensor | None, past: int, length: int, device: torch.device) -> Tensor:
    """Positions of the new tokens: counted over real tokens when a mask is given (so
    left padding does not shift them), else past .. past + length - 1. (B|1, T)."""
    if attention_mask is None:
        return torch.arange(past, past + length, device=device)[None]  # (1, T)
    positions = attention_mask.long().cumsum(-1) - 1  # (B, Tk)
    return positions[:, -length:].clamp(min=0)  # (B, T)


def _check_ids(ids: Tensor, mask: Tensor | None, past: int, *, name: str, mask_name: str) -> None:
    """Clear errors for token ids that are not (B, T) integers and for a mask (B, past + T)
    that does not cover them, before any embedding or broadcasting error could."""
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (batch, length), got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    if mask is not None and tuple(mask.shape) != (ids.shape[0], past + ids.shape[1]):
        covers = f"the {past} cached and {ids.shape[1]} new" if past else f"the {ids.shape[1]}"
        raise ValueError(
            f"{mask_name} must be (batch, length) = ({ids.shape[0]}, {past + ids.shape[1]}), covering "
            f"{covers} positions of {name}; got shape {tuple(mask.shape)}"
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
        logits = head(h, mask)
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
        if use_cache and cache is None:
            cache = KVCache()
        past = cache.length if cache is not None else 0
        _check_ids(input_ids, attention_mask, past, name="input_ids", mask_name="attention_mask")
        t = input_ids.shape[1]
        n_positions = past + t
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, past, t, input_ids.device)
        else:
            n_positions = int(position_ids.max()) + 1
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
        _check_ids(input_ids, attention_mask, 0, name="input_ids", mask_name="attention_mask")
        t = input_ids.shape[1]
        n_positions = t
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, 0, t, input_ids.device)  # (B|1, T)
        else:
            n_positions = int(position_ids.max()) + 1
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
        _check_ids(input_ids, attention_mask, 0, name="input_ids", mask_name="attention_mask")
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
        if encoder_hidden_states is None:
            if input_ids is None:
                raise ValueError("give input_ids or encoder_hidden_states")
            encoder_hidden_states = self.encode(input_ids, attention_mask)
        if use_cache and cache is None:
            cache = KVCache()
        past = cache.length if cache is not None else 0
        _check_ids(decoder_input_ids, decoder_attention_mask, past, name="decoder_input_ids",
                   mask_name="decoder_attention_mask")
        t = decoder_input_ids.shape[1]
        n_positions = past + t
        if decoder_position_ids is None:
            decoder_position_ids = default_position_ids(
                decoder_attention_mask, past, t, decoder_input_ids.device
            )
        else:
            n_positions = int(decoder_position_ids.max()) + 1
        embed = self.decoder_embed if self.decoder_embed is not None else self.embed
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
