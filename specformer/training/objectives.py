"""Training objectives: how a batch and a model give a loss.

Shapes: B batch, T (target) length, S source length, V vocabulary.

The objective follows the model's kind unless the spec's ``training.objective``
says otherwise: causal LM for decoders (supervised fine-tuning on the responses when
the data is (prompt, response) pairs), masked LM for encoders, sequence-to-sequence
with teacher forcing for encoder-decoders. The loss is the model's own (its forward
with ``labels``): the heads compute it in chunks, without the (B, T, V) logits, in
float32 whatever the autocast dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from specformer.data.collate import IGNORE_INDEX
from specformer.specs.training import (
    CausalLMSpec,
    ClassificationSpec,
    MaskedLMSpec,
    Seq2SeqSpec,
    SFTSpec,
)

__all__ = ["ObjectiveOutput", "Objective", "CausalLM", "SFT", "MaskedLM", "Seq2Seq", "Classification"]

Forward = Callable[..., Any]


@dataclass
class ObjectiveOutput:
    """The loss (mean over predicted tokens), how many tokens it averages over, and how
    many tokens the model read (for tokens/s)."""

    loss: Tensor
    n_predicted: int
    n_input: int
    # sequence classification: how many of the n_predicted labelled texts the logits' argmax gets right
    correct: int | None = None


class Objective:
    """Base: call with the model's forward and a batch."""

    name = "objective"

    def __init__(self, spec: Any, **_: Any) -> None:
        self.spec = spec

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        raise NotImplementedError

    @staticmethod
    def _count(labels: Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())


class CausalLM(Objective):
    """Predict token t+1 from tokens ≤ t (Radford et al. 2018)."""

    name = "causal_lm"
    spec: CausalLMSpec

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        mask = batch.get("attention_mask")
        labels = batch["labels"]
        if mask is not None:
            labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
        loss = forward(
            batch["input_ids"], attention_mask=mask, labels=labels, label_smoothing=self.spec.label_smoothing
        ).loss
        n_input = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        return ObjectiveOutput(loss, self._count(labels), n_input)


class SFT(CausalLM):
    """Supervised fine-tuning: next-token prediction over prompt + response + end token,
    the loss on the response and its end token alone. The collator
    (:class:`~specformer.data.collate.SFTCollator`) puts -100 on the labels of the prompt
    and the padding, so the loss and ``n_predicted`` cover the response tokens only."""

    name = "sft"
    spec: SFTSpec


class MaskedLM(Objective):
    """Predict the chosen tokens from the rest of the sequence (Devlin et al. 2019); the
    masking itself happens in :class:`~specformer.data.collate.MaskedLMCollator`."""

    name = "masked_lm"
    spec: MaskedLMSpec

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        mask = batch.get("attention_mask")
        loss = forward(
            batch["input_ids"],
            attention_mask=mask,
            labels=batch["labels"],
            label_smoothing=self.spec.label_smoothing,
        ).loss
        n_input = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        return ObjectiveOutput(loss, self._count(batch["labels"]), n_input)


class Classification(Objective):
    """Sequence classification (Devlin et al. 2019): the mean cross-entropy of the
    classification head's logits (B, C) against the labels (B,), one class id per text
    (-100: a row with no label, as the last validation batch's filler rows). ``correct``
    counts the labelled texts whose highest logit is their class: validation's accuracy."""

    name = "classification"
    spec: ClassificationSpec

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        mask = batch.get("attention_mask")
        labels = batch["labels"]
        out = forward(batch["input_ids"], attention_mask=mask, labels=labels, label_smoothing=self.spec.label_smoothing)
        scored = labels != IGNORE_INDEX
        correct = int((out.logits.detach().argmax(-1)[scored] == labels[scored]).sum())
        n_input = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        return ObjectiveOutput(out.loss, int(scored.sum()), n_input, correct=correct)


class Seq2Seq(Objective):
    """Teacher forcing: the decoder reads [start] + target and predicts target + [eos]
    (Sutskever et al. 2014; Vaswani et al. 2017)."""

    name = "seq2seq"
    spec: Seq2SeqSpec

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        loss = forward(
            batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            decoder_input_ids=batch["decoder_input_ids"],
            decoder_attention_mask=batch.get("decoder_attention_mask"),
            labels=batch["labels"],
            label_smoothing=self.spec.label_smoothing,
        ).loss
        n_input = int(batch["attention_mask"].sum() + batch["decoder_attention_mask"].sum())
        return ObjectiveOutput(loss, self._count(batch["labels"]), n_input)

    @torch.no_grad()
    def exact_match(
        self, model: Any, batch: Mapping[str, Tensor], *, start_id: int, eos_id: int, forced_start_id: int | None = None
    ) -> tuple[int, int]:
        """(correct, total): greedy decodes that equal the target exactly, end token included.
        ``forced_start_id`` (``training.objective.forced_start``) opens every decode, as it
        does in ``generate``; ``forced_end`` is left out, since an end token forced at the
        length limit would pass a decode that had not ended."""
        from specformer.components.cache import CacheNotFilledError
        from specformer.training.generate import generate_seq2seq

        labels = batch["labels"]  # (B, L+1): target + [eos], then -100
        decode = partial(
            generate_seq2seq,
            model,
            batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            start_id=start_id,
            eos_id=eos_id,
            max_new_tokens=labels.shape[1],
            temperature=0.0,
            forced_start_id=forced_start_id,
        )
        try:
            out = decode()  # (B, <= L+1)
        except CacheNotFilledError:  # an attention type that keeps no cache: re-read the target at each step
            out = decode(use_cache=False)
        correct = total = 0
        for row, target in zip(out, labels, strict=True):
            want = target[target != IGNORE_INDEX].tolist()
            if not want:  # a row that only fills the last batch up (see EvalCollator)
                continue
            got = row.tolist()[: len(want)]
            correct += int(got == want)
            total += 1
        return correct, total
