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
    many tokens the model read (for tokens/s). A training step weighs each micro-batch's loss
    by its ``n_predicted`` (the step's gradient is that of the mean over all their tokens), so
    an objective of one's own gives the count its loss is a mean over; 0 adds no gradient."""

    loss: Tensor
    n_predicted: int
    n_input: int
    # sequence classification: how many of the n_predicted labelled texts the logits' argmax gets right
    correct: int | None = None


class Objective:
    """Base: call with the model's forward and a batch.

    A batch is a mapping of tensors: ``keys`` must be there, ``optional_keys`` may be
    (what :class:`~specformer.data.module.SpecDataModule`'s collators give, and what a
    dataloader of one's own yields for :class:`~specformer.builder.lightning.SpecModule`).
    """

    name = "objective"
    keys: tuple[str, ...] = ()
    optional_keys: tuple[str, ...] = ()
    # how the labels relate to the inputs, said when a batch lacks them
    labels_hint = ""
    #: the batch's masks of a causal stack whose padded positions the loss ignores (labels -100
    #: there): a compiled training step leaves such a mask out when its rows are padded on the
    #: right only (:func:`~specformer.builder.lightning.call_compiled`)
    causal_masks: tuple[str, ...] = ()

    def __init__(self, spec: Any, **_: Any) -> None:
        self.spec = spec

    def check_batch(self, batch: Any) -> None:
        """A ``TypeError`` or ``ValueError`` naming the keys this objective reads, when
        ``batch`` is not a mapping or lacks one of ``keys``."""
        if not self.keys:
            return
        wanted = (", ".join(self.keys[:-1]) + " and " if len(self.keys) > 1 else "") + self.keys[-1]
        wanted += (f" (optional: {', '.join(self.optional_keys)})" if self.optional_keys else "")
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"the {self.name} objective takes a batch as a dict of tensors with {wanted}; "
                f"got a {type(batch).__name__}"
            )
        missing = [k for k in self.keys if k not in batch]
        if missing:
            hint = f"; {self.labels_hint}" if "labels" in missing and self.labels_hint else ""
            raise ValueError(
                f"a batch for the {self.name} objective needs {wanted}; this one lacks {', '.join(missing)} "
                f"(it has {', '.join(map(str, batch)) or 'no keys'}){hint}"
            )

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        raise NotImplementedError

    @staticmethod
    def _count(labels: Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    @staticmethod
    def _off_padding(labels: Tensor, mask: Tensor | None) -> Tensor:
        """``labels`` with -100 wherever ``mask`` marks padding: no loss there."""
        return labels if mask is None else labels.masked_fill(mask == 0, IGNORE_INDEX)


class CausalLM(Objective):
    """Predict token t+1 from tokens ≤ t (Radford et al. 2018)."""

    name = "causal_lm"
    spec: CausalLMSpec
    keys = ("input_ids", "labels")
    optional_keys = ("attention_mask",)
    causal_masks = ("attention_mask",)
    labels_hint = "labels are the inputs shifted by one: input_ids=ids[:, :-1], labels=ids[:, 1:]"

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        self.check_batch(batch)
        mask = batch.get("attention_mask")
        labels = self._off_padding(batch["labels"], mask)
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
    keys = ("input_ids", "labels")
    optional_keys = ("attention_mask",)
    labels_hint = (
        "labels are the original ids at the masked positions and -100 elsewhere "
        "(specformer.data.collate.MaskedLMCollator(...).mask(ids, generator) makes them)"
    )

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        self.check_batch(batch)
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
    keys = ("input_ids", "labels")
    optional_keys = ("attention_mask",)
    labels_hint = "labels are one class id per text, shaped (batch,)"

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        self.check_batch(batch)
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
    keys = ("input_ids", "decoder_input_ids", "labels")
    optional_keys = ("attention_mask", "decoder_attention_mask")
    causal_masks = ("decoder_attention_mask",)
    labels_hint = "the decoder reads [start] + target, and labels are target + [eos]"

    def __call__(self, forward: Forward, batch: Mapping[str, Tensor]) -> ObjectiveOutput:
        self.check_batch(batch)
        decoder_mask = batch.get("decoder_attention_mask")
        labels = self._off_padding(batch["labels"], decoder_mask)
        loss = forward(
            batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            decoder_input_ids=batch["decoder_input_ids"],
            decoder_attention_mask=decoder_mask,
            labels=labels,
            label_smoothing=self.spec.label_smoothing,
        ).loss
        n_input = sum(
            int(mask.sum()) if mask is not None else ids.numel()
            for ids, mask in ((batch["input_ids"], batch.get("attention_mask")),
                              (batch["decoder_input_ids"], batch.get("decoder_attention_mask")))
        )
        return ObjectiveOutput(loss, self._count(labels), n_input)

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
