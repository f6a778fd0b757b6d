"""An endless, resumable, rank-sharded stream of batches.

Training sees one endless epoch: pass ``p`` over the items is a permutation seeded
by ``(seed, p)``, and global batch ``b`` is items ``[b·B·W, (b+1)·B·W)`` of the
concatenated passes, rank ``r`` taking its own ``B``. So the data position is one
integer, the number of items consumed, and resuming is starting from it: the
same batches follow as in an uninterrupted run, on any number of workers. A run
resumed with another batch size, accumulation or number of processes reads on
from the same item, in batches of its own size.

Each item is yielded as ``(batch_position, index)`` so that random choices made in
the collator (masked-LM masking) can be seeded by the batch position and stay the
same on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from specformer.data.collate import IGNORE_INDEX

__all__ = ["StreamBatchSampler", "EvalBatchSampler", "EvalCollator"]


class StreamBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of ``(position, index)`` pairs; see the module docstring. ``start`` is the
    position of the first batch (micro-batches consumed), ``offset`` the item it begins
    at (default ``start × batch_size × world_size``). ``position``, where given, says at
    each new iteration which batch the stream has reached (the trainer's micro-batches
    consumed): Lightning iterates the loader again for each epoch, and an epoch cut short
    (``limit_train_batches``) must read on, not start over at ``start``."""

    def __init__(
        self,
        n_items: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        offset: int | None = None,
        shuffle: bool = True,
        position: Callable[[], int] | None = None,
    ) -> None:
        if n_items <= 0:
            raise ValueError("the training split is empty")
        self.n_items, self.batch_size = n_items, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start, self.shuffle, self.position = start, shuffle, position
        # the item global batch ``start`` begins at (the run's items consumed)
        self.offset = start * batch_size * world_size if offset is None else offset
        self._pass, self._order = -1, np.arange(0)

    def _order_of(self, p: int) -> np.ndarray:
        if p != self._pass:
            self._pass = p
            self._order = (
                np.random.default_rng([self.seed, p]).permutation(self.n_items)
                if self.shuffle
                else np.arange(self.n_items)
            )
        return self._order

    def batch(self, b: int) -> list[tuple[int, int]]:
        """Global batch ``b``'s share for this rank."""
        first = self.offset + ((b - self.start) * self.world_size + self.rank) * self.batch_size
        out = []
        for k in range(first, first + self.batch_size):
            p, i = divmod(k, self.n_items)
            out.append((b, int(self._order_of(p)[i])))
        return out

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        b = self.start if self.position is None else max(self.start, self.position())
        while True:
            yield self.batch(b)
            b += 1


class EvalBatchSampler(Sampler[list[tuple[int, int]]]):
    """The first ``n_batches`` global batches of a split, in order, sharded by rank.

    Batch ``b`` is yielded with position ``-1 - b``. With several processes every rank
    must run the same number of equal batches, so the last global batch is filled up by
    wrapping round to the start of the split; :meth:`n_real` says how many leading rows of
    a batch are real, and :class:`EvalCollator` hides the filler rows from the loss, so
    that no example counts twice.
    """

    def __init__(
        self, n_items: int, batch_size: int, *, n_batches: int | None = None, rank: int = 0, world_size: int = 1
    ) -> None:
        per_global = batch_size * world_size
        total = -(-n_items // per_global)
        self.n_batches = total if n_batches is None else min(n_batches, total)
        self.n_items, self.batch_size, self.rank, self.world_size = n_items, batch_size, rank, world_size

    def __len__(self) -> int:
        return self.n_batches

    def _first(self, b: int) -> int:
        return (b * self.world_size + self.rank) * self.batch_size

    def n_real(self, position: int) -> int:
        """How many leading rows of the batch at ``position`` are items of the split (the
        rest fill the last batch up to an equal size on every rank)."""
        return max(0, min(self.batch_size, self.n_items - self._first(-1 - position)))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for b in range(self.n_batches):
            first = self._first(b)
            if self.world_size == 1:
                yield [(-1 - b, k) for k in range(first, min(first + self.batch_size, self.n_items))]
            else:
                yield [(-1 - b, k % self.n_items) for k in range(first, first + self.batch_size)]


class EvalCollator:
    """A collator for :class:`EvalBatchSampler`'s batches: the rows that only fill the
    last batch up get no labels (``-100``), so they add nothing to the loss or to the
    count of predicted tokens."""

    def __init__(self, collate: Callable[[Sequence[Any]], dict[str, Any]], sampler: EvalBatchSampler) -> None:
        self.collate, self.sampler = collate, sampler

    def __call__(self, items: Sequence[tuple[int, Any]]) -> dict[str, Any]:
        batch = self.collate(items)
        real = self.sampler.n_real(items[0][0])
        if real < len(items):
            batch["labels"][real:] = IGNORE_INDEX
        return batch
