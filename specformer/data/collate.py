"""Collators: items to the batches the objectives read.

Batch keys follow the model's forward signature: ``input_ids``, ``attention_mask``
(1 = real token, 0 = padding), ``decoder_input_ids``, ``decoder_attention_mask``,
and ``labels`` with -100 where no loss is taken.

Shapes: B batch, T sequence length, S source length, L target length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specformer.components.loss import IGNORE_INDEX  # -100, as torch's cross_entropy
from specformer.specs.training import MaskedLMSpec

__all__ = [
    "IGNORE_INDEX", "CausalLMCollator", "ClassificationCollator", "MaskedLMCollator", "Seq2SeqCollator", "SFTCollator", "ConversationCollator", "batch_generator",
]


def batch_generator(seed: int, position: int, rank: int = 0) -> torch.Generator:
    """A generator seeded by (seed, batch position, rank): the same batch gets the same
    random choices in any worker and after a resume."""
    sign = 0 if position >= 0 else 1
    state = np.random.SeedSequence([seed, sign, abs(position), rank]).generate_state(2)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class CausalLMCollator:
    """Blocks of T+1 tokens -> inputs (B, T) and next-token labels (B, T)."""

    def __call__(self, items: Sequence[tuple[int, np.ndarray]]) -> dict[str, torch.Tensor]:
        x = torch.from_numpy(np.stack([block for _, block in items]))  # (B, T+1)
        return {"input_ids": x[:, :-1].contiguous(), "labels": x[:, 1:].contiguous()}


class MaskedLMCollator:
    """BERT's dynamic masking (Devlin et al. 2019): each batch draws new positions.

    A ``mask_prob`` share of the non-special tokens is chosen (at least one per row); of those, ``mask_token``
    become [MASK], ``random_token`` a uniformly random token and the rest stay as they
    are. Labels hold the original token at chosen positions and -100 elsewhere.
    """

    def __init__(
        self,
        spec: MaskedLMSpec,
        *,
        mask_id: int,
        vocab_size: int,
        special_ids: Sequence[int] = (),
        seed: int = 0,
        rank: int = 0,
    ) -> None:
        self.spec, self.mask_id, self.vocab_size = spec, mask_id, vocab_size
        self.special = torch.tensor(sorted(set(special_ids)), dtype=torch.long)
        self.seed, self.rank = seed, rank

    def __call__(self, items: Sequence[tuple[int, np.ndarray]]) -> dict[str, torch.Tensor]:
        position = items[0][0]
        g = batch_generator(self.seed, position, self.rank)
        x = torch.from_numpy(np.stack([block for _, block in items]))  # (B, T)
        return self.mask(x, g)

    def mask(self, x: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        s = self.spec
        candidates = ~torch.isin(x, self.special)
        chosen = (torch.rand(x.shape, generator=g) < s.mask_prob) & candidates
        # as BERT's data (max(1, round(T · mask_prob)) per sequence), every row predicts at
        # least one token: a short block with none would leave a batch without a loss (NaN)
        empty = ~chosen.any(-1) & candidates.any(-1)  # (B,)
        if bool(empty.any()):
            pick = torch.rand(x.shape, generator=g).masked_fill(~candidates, -1.0).argmax(-1)  # (B,)
            chosen[empty, pick[empty]] = True
        labels = torch.where(chosen, x, torch.full_like(x, IGNORE_INDEX))
        action = torch.rand(x.shape, generator=g)
        to_mask = chosen & (action < s.mask_token)
        to_random = chosen & (action >= s.mask_token) & (action < s.mask_token + s.random_token)
        random_ids = torch.randint(0, self.vocab_size, x.shape, generator=g)
        inputs = torch.where(to_mask, torch.full_like(x, self.mask_id), x)
        inputs = torch.where(to_random, random_ids, inputs)
        return {"input_ids": inputs, "attention_mask": torch.ones_like(x), "labels": labels}


class Seq2SeqCollator:
    """(source, target) id lists -> padded encoder inputs and teacher-forced decoder inputs.

    decoder_input_ids = [start] + target, labels = target + [eos]: the decoder predicts
    each target token from the ones before it, then the end. ``start_id`` is the decoder's
    start token (the tokenizer's bos, or ``training.objective.decoder_start``: T5's pad).
    """

    def __init__(self, *, pad_id: int, start_id: int, eos_id: int) -> None:
        self.pad_id, self.start_id, self.eos_id = pad_id, start_id, eos_id

    @staticmethod
    def _pad(rows: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows padded to the longest, and the mask of real tokens."""
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), value, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return out, mask

    def __call__(self, items: Sequence[tuple[int, tuple[list[int], list[int]]]]) -> dict[str, torch.Tensor]:
        sources = [list(src) for _, (src, _) in items]
        targets = [list(tgt) for _, (_, tgt) in items]
        input_ids, attention_mask = self._pad(sources, self.pad_id)  # (B, S)
        decoder_input_ids, decoder_mask = self._pad([[self.start_id] + t for t in targets], self.pad_id)  # (B, L+1)
        labels, _ = self._pad([t + [self.eos_id] for t in targets], IGNORE_INDEX)  # (B, L+1)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_mask,
            "labels": labels,
        }


class SFTCollator:
    """(prompt, response) id lists -> one causal sequence each, the loss on the response.

    A pair's ids are prompt + response, the response already ending in the end token
    (:func:`~specformer.data.tokens.pair_token_ids` puts it there, and leaves it off a
    response it cuts). The inputs are that sequence less its last token, the labels the
    sequence less its first; a label whose token belongs to the prompt is -100, so the loss
    and its token count cover the response (and its end token) only. Rows are padded on the
    right with ``pad_id``: attention_mask 0 and labels -100 there.
    """

    def __init__(self, *, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[tuple[int, tuple[list[int], list[int]]]]) -> dict[str, torch.Tensor]:
        rows = [(list(prompt), list(response)) for _, (prompt, response) in items]
        width = max(len(p) + len(r) for p, r in rows) - 1
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        for i, (prompt, response) in enumerate(rows):
            sequence = torch.tensor(prompt + response, dtype=torch.long)
            n = len(sequence) - 1
            input_ids[i, :n] = sequence[:-1]
            attention_mask[i, :n] = 1
            # label j is token j + 1: the first response token is label len(prompt) - 1
            labels[i, len(prompt) - 1 : n] = sequence[len(prompt) :]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class ConversationCollator:
    """(ids, mask) of each conversation -> one causal sequence each, the loss on its assistant
    turns. The mask (:func:`~specformer.data.tokens.conversation_token_ids`) is 1 on the tokens
    of the assistant turns; the inputs are the ids less the last, the labels the ids less the
    first, -100 where the token they predict is not an assistant's. Rows are padded on the
    right with ``pad_id``: attention_mask 0 and labels -100 there."""

    def __init__(self, *, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[tuple[int, tuple[list[int], list[int]]]]) -> dict[str, torch.Tensor]:
        rows = [(list(ids), list(mask)) for _, (ids, mask) in items]
        width = max(len(ids) for ids, _ in rows) - 1
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        for i, (ids, mask) in enumerate(rows):
            sequence = torch.tensor(ids, dtype=torch.long)
            n = len(ids) - 1
            input_ids[i, :n] = sequence[:-1]
            attention_mask[i, :n] = 1
            scored = torch.tensor(mask[1:], dtype=torch.bool)  # label j is token j + 1
            labels[i, :n] = torch.where(scored, sequence[1:], IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class ClassificationCollator:
    """(ids, class id) items -> input_ids (B, T) padded on the right with ``pad_id``,
    attention_mask (B, T) (0 on padding) and labels (B,), one class id per text."""

    def __init__(self, *, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[tuple[int, tuple[Sequence[int], int]]]) -> dict[str, torch.Tensor]:
        rows = [(list(ids), int(label)) for _, (ids, label) in items]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, _) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        labels = torch.tensor([label for _, label in rows], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
