"""The one output type of every specformer model.

Shape legend: B batch, T target length, S source (encoder) length, D d_model,
V vocabulary (or classes for a classification head), H heads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from torch import Tensor

from specformer.components.cache import KVCache

__all__ = ["LogitsNotComputedError", "ModelOutput"]


class LogitsNotComputedError(AttributeError):
    """Reading ``ModelOutput.logits`` of a forward pass given ``labels`` whose head computed
    the loss without them. An ``AttributeError``: ``getattr(out, "logits", None)`` is None."""


@dataclass(repr=False, eq=False)
class ModelOutput:
    """What a forward pass returns.

    ``logits``: (B, T, V) for language-model and masked-LM heads, (B, C) for a
    classification head. Given ``labels``, a language-model or masked-LM head computes the
    loss in chunks without ever holding the (B, T, V) logits, and reading ``logits`` raises
    :class:`LogitsNotComputedError` (an ``AttributeError``) saying how to get them.
    ``loss``: the mean cross-entropy against the ``labels`` given
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

    def __repr__(self) -> str:
        def shown(value: object) -> str:
            if isinstance(value, Tensor) and value.dim() == 0:
                return repr(value)  # a loss: its value
            if isinstance(value, Tensor):
                return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
            if isinstance(value, tuple):
                return f"({len(value)} tensors)"
            return repr(value)

        logits = self.__dict__.get("_logits")
        parts = ["logits=<not computed: labels were given>" if logits is None and self.loss is not None
                 else f"logits={shown(logits)}"]
        parts += [f"{f.name}={shown(getattr(self, f.name))}" for f in fields(self) if f.name != "logits"]
        return f"ModelOutput({', '.join(parts)})"


def _get_logits(self: ModelOutput) -> Tensor | None:
    logits = self.__dict__.get("_logits")
    if logits is None and self.loss is not None:
        raise LogitsNotComputedError(
            "logits were not computed: given labels, the head computes the loss in chunks without "
            "holding the (batch, length, vocabulary) logits; call the model without labels for them "
            "(and take the loss with F.cross_entropy), or compute them from this output as "
            "model.head(out.hidden_states)")
    return logits


def _set_logits(self: ModelOutput, value: Tensor | None) -> None:
    self.__dict__["_logits"] = value


# a property over the dataclass field (its __init__ still takes logits=): the field has no
# default, so nothing of the class's is replaced
ModelOutput.logits = property(_get_logits, _set_logits)  # type: ignore[assignment]
