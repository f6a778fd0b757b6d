"""Classifying texts with a trained sequence classifier, as Hugging Face's
``pipeline("text-classification")`` does: each text's class probabilities (the softmax of
the classification head's logits) and its most likely labels, in batches.

Shapes: B batch, T the longest text of a batch (in tokens), C classes.

Each text is read as training read it (:func:`~specformer.data.module.classification_ids`):
framed by the tokenizer's template and cut to the training ``seq_len``. A batch is padded on
the right with an attention mask, so a text's probabilities do not depend on the texts it is
batched with; texts are batched by length (less padding) and returned in their own order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["classify", "Prediction", "Classified", "Score", "NotAClassifier", "check_classifier", "class_names",
           "class_probabilities", "score"]

Label = str | int


class NotAClassifier(ValueError):
    """A model without a classification head was given to :func:`classify`; the message
    says which command or function fits it."""


def check_classifier(spec: Any) -> None:
    """Raise :class:`NotAClassifier` unless ``spec``'s model has a classification head,
    naming what the model does instead and the command that does it."""
    head = getattr(getattr(spec, "head", None), "type", None)
    if head == "classification":
        return
    kind = getattr(spec, "kind", None)
    if kind == "decoder" and head == "lm":
        does = "a decoder language model (head: lm): it continues text; use `specformer generate` (generate())"
    elif kind == "encoder-decoder":
        does = "an encoder-decoder: it decodes an input into an output; use `specformer generate` (generate_seq2seq())"
    elif kind == "encoder" and head == "mlm":
        does = ("a masked language model (head: mlm): it predicts the tokens behind <mask>; use "
                "`specformer fill-mask`")
    else:
        does = f"{'an' if str(kind)[:1] in 'aeiou' else 'a'} {kind} with {f'head: {head}' if head else 'no head'}"
    raise NotAClassifier(
        f"this model is {does}. classify needs a sequence classifier: an encoder with head: "
        "{type: classification, n_classes: N} trained with objective classification on labelled texts"
    )


def class_names(spec: Any) -> tuple[Label, ...]:
    """The classes of ``spec``'s classification head in class order: the names the head
    gives (``head.labels``, which a run trained on named labels writes), else the class
    ids 0..C-1 (a run trained on integer labels)."""
    head = spec.head
    return tuple(head.labels) if head.labels is not None else tuple(range(head.n_classes))


@dataclass
class Prediction:
    """One text's classification. ``label`` and ``probability`` are the most likely class's
    (its name, or its id when the model names none); ``top`` the ``top_k`` most likely
    (label, probability), best first; ``probabilities`` every class's, in class order."""

    label: Label
    probability: float
    top: list[tuple[Label, float]]
    probabilities: list[float]
    truncated: bool = False


@dataclass
class Classified:
    """What :func:`classify` returns: a :class:`Prediction` per text, in the texts' order;
    how many texts were cut to fit ``seq_len`` tokens (as training cut them), and the model's
    classes in class order (:func:`class_names`)."""

    predictions: list[Prediction]
    truncated: int
    seq_len: int
    classes: tuple[Label, ...]


@torch.no_grad()
def class_probabilities(model: nn.Module, rows: Sequence[Sequence[int]], *, pad_id: int = 0) -> Tensor:
    """Class probabilities (B, C), float32 on the CPU, of the token ids ``rows`` (each
    already framed and cut): the softmax of the model's logits, the rows padded on the right
    with ``pad_id`` and masked out."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    logits = model(input_ids.to(device), attention_mask=attention_mask.to(device)).logits  # (B, C)
    if logits.dim() != 2:
        raise NotAClassifier(f"the model's logits are {tuple(logits.shape)}, not (batch, classes): it has no "
                             "classification head")
    return logits.float().softmax(-1).cpu()


def classify(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    top_k: int = 1,
    batch_size: int = 32,
    seq_len: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> Classified:
    """Classify ``texts`` with ``model`` (a classifier built from a spec, as
    ``load_checkpoint(path).model``) and its ``tokenizer``.

    Each text is framed by the tokenizer's template and cut to ``seq_len`` tokens (default:
    the length the model was trained at, ``training.seq_len`` or ``max_seq_len``), as
    training reads it. ``top_k`` labels are kept per text (at most the number of classes);
    texts go through the model ``batch_size`` at a time, on the device the model is on;
    ``on_batch`` is called with the number of texts classified so far after each batch.

    Example::

        loaded = load_checkpoint("runs/my-bert/<time>")
        result = classify(loaded.model, loaded.tokenizer, ["a good film", "a bad plot"])
        result.predictions[0].label, result.predictions[0].probability   # ('pos', 0.97)
    """
    from specformer.data.module import classification_ids, classification_pad_id

    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("classify takes a model built from a spec (build_model, load_checkpoint(...).model)")
    check_classifier(spec)
    if tokenizer is None:
        raise ValueError("classify needs the model's tokenizer (load_checkpoint(...).tokenizer): the texts are read "
                         "as its token ids")
    if isinstance(texts, str):
        raise ValueError("texts is a list of texts; one text is [text]")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}] is a {type(text).__name__}, not a string")
        if not text.strip():
            raise ValueError(f"texts[{i}] is empty; every text needs something to classify")
    t = getattr(spec, "training", None)
    length = seq_len if seq_len is not None else (getattr(t, "seq_len", None) or spec.max_seq_len)
    names = class_names(spec)
    k = min(top_k, len(names))
    encoded = [classification_ids(tokenizer, text, length) for text in texts]
    # longest first: a batch holds texts of about one length, with little padding
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i][0]))
    probabilities: list[Tensor | None] = [None] * len(texts)
    pad = classification_pad_id(tokenizer)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            probs = class_probabilities(model, [encoded[i][0] for i in chosen], pad_id=pad)  # (B, C)
            for row, i in enumerate(chosen):
                probabilities[i] = probs[row]
            if on_batch is not None:
                on_batch(min(start + batch_size, len(order)))
    finally:
        model.train(was_training)
    predictions = []
    for (_, cut), probs in zip(encoded, probabilities, strict=True):
        assert probs is not None
        best = probs.topk(k)
        top = [(names[int(i)], float(p)) for p, i in zip(best.values, best.indices, strict=True)]
        predictions.append(Prediction(label=top[0][0], probability=top[0][1], top=top,
                                      probabilities=probs.tolist(), truncated=cut))
    return Classified(predictions=predictions, truncated=sum(cut for _, cut in encoded), seq_len=length,
                      classes=names)


@dataclass
class Score:
    """How the predictions match the texts' own labels: ``correct`` of ``counted`` (the
    texts whose label the model knows), and the labels it does not know, with how many texts
    have each (left out of the count)."""

    correct: int
    counted: int
    unknown: dict[Label, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.counted if self.counted else None


def score(predictions: Sequence[Prediction], labels: Sequence[Label | None], names: Sequence[Label]) -> Score:
    """Compare ``predictions`` with the texts' ``labels`` as training numbers labels: when
    every label is an integer they are class ids, unless the model's names spell each of them
    (star ratings 1-5 under ``head.labels: ["1", ..., "5"]``), else names of ``names`` (the
    model's classes, :func:`class_names`). A label the model does not have is counted in
    ``unknown``, not as a wrong prediction; a text whose label is None is not counted."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions and {len(labels)} labels")
    index = {str(name): i for i, name in enumerate(names)}
    given = [x for x in labels if x is not None]
    ids = all(isinstance(x, int) for x in given) and not (
        all(isinstance(name, str) for name in names) and given and {str(x) for x in given} <= set(index))
    result = Score(correct=0, counted=0)
    for prediction, label in zip(predictions, labels, strict=True):
        if label is None:
            continue
        if ids:
            gold = label if 0 <= int(label) < len(names) else None
        else:
            gold = index.get(str(label))
        if gold is None:
            result.unknown[label] = result.unknown.get(label, 0) + 1
            continue
        result.counted += 1
        result.correct += int(names[int(gold)] == prediction.label)
    return result
