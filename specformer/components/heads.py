"""Output heads on top of the final hidden states.

Shape legend: B batch, T length, D d_model, V vocabulary, C classes.

Every head is called as ``head(hidden (B, T, D), attention_mask=None)``. The
vocabulary heads also have ``loss(hidden, labels)``: the mean cross-entropy against
labels (B, T) (-100: no label) without materialising the (B, T, V) logits (see
:mod:`specformer.components.loss`); the masked-LM head runs only on labelled positions.
State-dict names: ``proj`` (lm, absent when tied), ``bias`` (tied lm with a bias;
mlm), ``transform.dense`` / ``transform.norm`` (mlm), ``pooler`` / ``classifier``
(classification). A tied head holds no weight of its own: it reads the embedding's
``tokens.weight`` at call time, so the pair stays tied through ``.to()``,
``to_empty()`` and loading.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from specformer.components.dropout import Dropout
from specformer.components.embedding import Embedding
from specformer.components.ffn import ACTIVATIONS
from specformer.components.layout import decode_linear
from specformer.components.loss import IGNORE_INDEX, linear_cross_entropy
from specformer.components.products import Linear, linear

if TYPE_CHECKING:  # annotations only: a plugin imports these modules before the spec schema exists
    from specformer.specs.schema import ClassificationHeadSpec, LMHeadSpec, MLMHeadSpec

__all__ = ["LMHead", "MLMHead", "ClassificationHead", "check_head"]


def check_head(module: nn.Module, *, type_name: str, width: int, field: str) -> None:
    """A head of a registered type of one's own: check at each call that its logits are
    ``(B, T, width)`` for a vocabulary head (``field`` ``"vocab_size"``), or ``(B, width)``
    or ``(B, T, width)`` for a head whose spec has ``n_classes`` (``field`` ``"n_classes"``).
    Logits of another width fail later in the loss's cross-entropy, or sample ids past the
    vocabulary in ``generate``, naming no head. specformer's own heads carry no check."""
    module.register_forward_hook(functools.partial(_check_head_output, type_name, width, field))


def _check_head_output(
    type_name: str, width: int, field: str, module: nn.Module, args: tuple[Any, ...], output: Any
) -> None:
    hidden = args[0] if args else None
    if not isinstance(hidden, Tensor) or hidden.dim() < 2:
        return
    lead = tuple(hidden.shape[:-1])
    wanted = [(*lead, width)] if field == "vocab_size" else list(dict.fromkeys([(lead[0], width), (*lead, width)]))
    if isinstance(output, Tensor) and tuple(output.shape) in wanted:
        return
    got = f"logits of shape {tuple(output.shape)}" if isinstance(output, Tensor) else f"a {type(output).__name__}"
    form = "(B, T, vocab_size)" if field == "vocab_size" else "(B, n_classes) or (B, T, n_classes)"
    raise ValueError(
        f"the head {type(module).__name__} (head type {type_name!r}) returned {got} for hidden states of shape "
        f"{tuple(hidden.shape)}; expected {' or '.join(str(w) for w in wanted)}: a head returns logits {form}, "
        f"{field} = {width} (docs/components.md#adding-a-component)"
    )


def _check_labels(x: Tensor, labels: Tensor) -> None:
    if labels.shape != x.shape[:-1]:
        raise ValueError(
            f"labels must have the shape of the positions, {tuple(x.shape[:-1])}, got {tuple(labels.shape)}"
            " (a decoder's labels are already shifted: position t's label is token t + 1)"
        )


class _TiedOutput(nn.Module):
    """Base for heads whose vocabulary projection may reuse the token embeddings."""

    def __init__(self, embedding: Embedding | None) -> None:
        super().__init__()
        # a plain attribute, not a submodule: the embedding belongs to the model
        object.__setattr__(self, "_tied", embedding)

    @property
    def tied(self) -> bool:
        return self._tied is not None

    @property
    def tied_weight(self) -> Tensor | None:
        """The token embedding matrix (V, D) this head projects with when tied, else None."""
        return self._tied.weight if self._tied is not None else None

    def _projection(self) -> tuple[Tensor, Tensor | None]:
        """(weight (V, D), bias (V,) or None) of the vocabulary product: the head's own
        ``proj`` or the tied embedding, with whichever bias the head has."""
        proj = self.proj
        if proj is None:
            return self._tied.weight, self.bias
        return proj.weight, proj.bias if proj.bias is not None else self.bias


class LMHead(_TiedOutput):
    """Language-model head: logits = x W^T (+ b), with W the token embeddings when tied
    (Press & Wolf 2017). ``scale_input`` first multiplies x by d_model^-0.5 (T5); ``softcap``
    makes the logits cap * tanh(logit / cap) (Gemma 2), in the loss too."""

    def __init__(
        self,
        spec: LMHeadSpec,
        *,
        d_model: int,
        vocab_size: int,
        embedding: Embedding | None = None,
    ) -> None:
        super().__init__(embedding)
        self.decoding = False  # set by components.layout.lay_out_for_decoding
        self.proj = None if embedding is not None else Linear(d_model, vocab_size, bias=spec.bias)
        self.bias = (
            nn.Parameter(torch.zeros(vocab_size)) if embedding is not None and spec.bias else None
        )
        self.input_scale = d_model**-0.5 if spec.scale_input else None
        self.softcap = getattr(spec, "softcap", None)

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if self.input_scale is not None:
            x = x * self.input_scale
        if self.decoding:  # laid out for decoding: one-row products split over the threads
            logits = decode_linear(x, *self._projection())
        else:
            logits = linear(x, *self._projection())  # (B, T, V)
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap

    def loss(self, x: Tensor, labels: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy of the logits ``forward(x)`` would give against labels (B, T)."""
        _check_labels(x, labels)
        if self.input_scale is not None:
            x = x * self.input_scale
        return linear_cross_entropy(
            x.reshape(-1, x.shape[-1]), *self._projection(), labels.reshape(-1), label_smoothing=label_smoothing,
            softcap=self.softcap,
        )

    def init_parameters(self, std: float) -> None:
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class _MLMTransform(nn.Module):
    def __init__(self, spec: MLMHeadSpec, *, d_model: int) -> None:
        super().__init__()
        self.dense = Linear(d_model, d_model)
        self.act = ACTIVATIONS[spec.activation]
        self.norm = nn.LayerNorm(d_model, eps=spec.eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(x)))  # (B, T, D)


class MLMHead(_TiedOutput):
    """BERT's masked-LM head (Devlin et al. 2019): dense + activation + LayerNorm, then
    the vocabulary decoder (tied to the token embeddings when the spec ties) + bias."""

    def __init__(
        self,
        spec: MLMHeadSpec,
        *,
        d_model: int,
        vocab_size: int,
        embedding: Embedding | None = None,
    ) -> None:
        super().__init__(embedding)
        self.transform = _MLMTransform(spec, d_model=d_model)
        self.proj = None if embedding is not None else Linear(d_model, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if spec.bias else None

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return linear(self.transform(x), *self._projection())  # (B, T, V)

    def loss(self, x: Tensor, labels: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy against labels (B, T), computed on the labelled positions
        only (BERT labels ~15%): the transform and the vocabulary product skip the rest."""
        _check_labels(x, labels)
        flat = labels.reshape(-1)
        keep = flat != IGNORE_INDEX
        h = self.transform(x.reshape(-1, x.shape[-1])[keep])  # (n, D)
        return linear_cross_entropy(h, *self._projection(), flat[keep], label_smoothing=label_smoothing)

    def init_parameters(self, std: float) -> None:
        if self.bias is not None:
            nn.init.zeros_(self.bias)


def _pool_first(x: Tensor, mask: Tensor | None) -> Tensor:
    return x[:, 0]  # (B, D)


def _pool_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return x.mean(dim=1)
    m = mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
    return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, D)


def _pool_last(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return x[:, -1]
    # index of the last real token, for left or right padding alike
    positions = torch.arange(x.shape[1], device=x.device)
    last = (mask.long() * positions).argmax(dim=-1)  # (B,)
    return x[torch.arange(x.shape[0], device=x.device), last]  # (B, D)


_POOLING = {"first": _pool_first, "mean": _pool_mean, "last": _pool_last}


class ClassificationHead(nn.Module):
    """Sequence classification: pool (first token as BERT's [CLS], mean over real
    tokens, or last real token as GPT), optional dense + tanh pooler (BERT; relu:
    DistilBERT's pre_classifier), dropout, then a linear classifier to C classes."""

    def __init__(
        self,
        spec: ClassificationHeadSpec,
        *,
        d_model: int,
        vocab_size: int = 0,
        embedding: Embedding | None = None,
    ) -> None:
        super().__init__()
        self.pooling = spec.pooling
        self._pool = _POOLING[spec.pooling]
        self.pooler = Linear(d_model, d_model) if spec.pooler else None
        self.pooler_activation = spec.pooler_activation
        self._activate = torch.tanh if spec.pooler_activation == "tanh" else ACTIVATIONS["relu"]
        self.dropout = Dropout(spec.dropout)
        self.classifier = Linear(d_model, spec.n_classes)

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        pooled = self._pool(x, attention_mask)  # (B, D)
        if self.pooler is not None:
            pooled = self._activate(self.pooler(pooled))
        return self.classifier(self.dropout(pooled))  # (B, C)

    def extra_repr(self) -> str:
        pooler = f", pooler_activation={self.pooler_activation}" if self.pooler is not None else ""
        return f"pooling={self.pooling}{pooler}"
