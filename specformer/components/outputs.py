"""The one output type of every specformer model.

Shape legend: B batch, T target length, S source (encoder) length, D d_model,
V vocabulary (or classes for a classification head), H heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from specformer.components.cache import KVCache

__all__ = ["ModelOutput"]


@dataclass
class ModelOutput:
    """What a forward pass returns.

    ``logits``: (B, T, V) for language-model and masked-LM heads, (B, C) for a
    classification head; None when ``labels`` were given to a head that computes its
    loss without them. ``loss``: the mean cross-entropy against the ``labels`` given
    to the forward pass (positions labelled -100 excluded), else None. ``hidden_states``: (B, T, D), the last stack's output
    after its final norm. ``cache``: the :class:`KVCache` when one was used, else
    None. ``attentions``: one (B, H, T, T_past + T) tensor of self-attention
    weights per layer when asked for (``output_attentions=True``), else None.
    ``encoder_hidden_states``: (B, S, D) for encoder-decoder models, else None.
    ``cross_attentions``: per-layer (B, H, T, S) cross-attention weights when
    asked for (encoder-decoder only).
    """

    logits: Tensor | None
    hidden_states: Tensor
    cache: KVCache | None = None
    attentions: tuple[Tensor, ...] | None = None
    encoder_hidden_states: Tensor | None = None
    cross_attentions: tuple[Tensor, ...] | None = None
    loss: Tensor | None = None
