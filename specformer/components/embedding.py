"""Token embeddings and everything around them.

Shape legend: B batch, T length, D d_model, V vocabulary.

State-dict names: ``tokens`` (nn.Embedding V x D), ``positions`` (the positional
module when it adds to the embeddings: a learned table ``positions.weight``, or
sinusoids with no parameters), ``segments`` (token-type embeddings), ``norm``.
An embedding built with ``shared_tokens`` (BART's decoder) reads another embedding's
token table and has no ``tokens`` entry of its own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import Tensor, nn

from specformer.components.dropout import Dropout
from specformer.components.positional import Positional

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import EmbeddingSpec

__all__ = ["Embedding"]


class Embedding(nn.Module):
    """tokens * (sqrt(D) if scaled) + positions + segments, then norm and dropout.

    The sqrt(d_model) scale is the original Transformer's (Vaswani et al. 2017,
    section 3.4); segment embeddings and the embedding LayerNorm are BERT's
    (Devlin et al. 2019). ``tokens.weight`` is the matrix a tied output head reuses.
    """

    def __init__(
        self,
        spec: EmbeddingSpec,
        *,
        vocab_size: int,
        d_model: int,
        positions: Positional | None = None,
        norm: nn.Module | None = None,
        shared_tokens: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        if shared_tokens is None:
            # padding_idx: that row's lookups give it no gradient (Marian's decoder start token)
            self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=getattr(spec, "padding_idx", None))
        else:
            # a plain attribute, not a submodule: the owning embedding holds (and saves) it
            object.__setattr__(self, "tokens", shared_tokens)
        self.positions = positions
        # a positional module of one's own: what its embed returns is checked (the builder sets it)
        self.positions_checked = False
        self.segments = (
            nn.Embedding(spec.segment_vocab_size, d_model) if spec.segment_vocab_size else None
        )
        self.norm = norm
        self.dropout = Dropout(spec.dropout)
        self.scale = math.sqrt(d_model) if spec.scale else None

    @property
    def weight(self) -> Tensor:
        """The token embedding matrix (V, D)."""
        return self.tokens.weight

    def forward(
        self,
        input_ids: Tensor,
        *,
        position_ids: Tensor,
        n_positions: int,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """input_ids (B, T), position_ids (B|1, T) -> (B, T, D)."""
        x = self.tokens(input_ids)  # (B, T, D)
        if self.scale is not None:
            x = x * self.scale
        if self.positions is not None:
            embedded = self.positions.embed(x, position_ids, n_positions)
            if self.positions_checked and (not isinstance(embedded, Tensor) or embedded.shape != x.shape):
                got = f"a tensor of shape {tuple(embedded.shape)}" if isinstance(embedded, Tensor) else (
                    f"a {type(embedded).__name__}")
                raise ValueError(
                    f"the positional module {type(self.positions).__name__}'s embed(x, position_ids, n_positions) "
                    f"returned {got} for embeddings x of shape {tuple(x.shape)}: it returns x with positions added, "
                    "(B, T, D) (docs/components.md#adding-a-component)"
                )
            x = embedded
        if self.segments is not None:
            # no token types given means every token is segment 0, as in BERT
            x = x + (self.segments(token_type_ids) if token_type_ids is not None else self.segments.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x) if self.training and self.dropout.p > 0 else x
