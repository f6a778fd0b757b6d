"""Map-style datasets over prepared data; items are addressed by ``(position, index)``.

The position (the batch number from :mod:`specformer.data.sampler`) travels with the
item so the collator can seed its random choices by it.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset

__all__ = ["PackedBlocks", "PairDataset"]


class PackedBlocks(Dataset):
    """A token stream cut into consecutive blocks of ``length`` tokens (documents are
    already joined by end-of-text); with ``overlap=1`` each block carries one more token,
    the last target of a causal LM."""

    def __init__(self, tokens: np.ndarray, length: int, *, overlap: int = 0) -> None:
        self.tokens, self.length, self.overlap = tokens, length, overlap
        self.n = max(0, (len(tokens) - overlap) // length)
        # a memory map travels to worker processes as its file name, not its bytes
        self._file = getattr(tokens, "filename", None)
        self._dtype, self._size = tokens.dtype, len(tokens)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._file is not None:
            state["tokens"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.tokens is None:
            self.tokens = np.memmap(self._file, dtype=self._dtype, mode="r", shape=(self._size,))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, np.ndarray]:
        pos, i = key
        start = i * self.length
        return pos, np.array(self.tokens[start : start + self.length + self.overlap], dtype=np.int64)


class PairDataset(Dataset):
    """Tokenised (source, target) pairs of a sequence-to-sequence task."""

    def __init__(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, tuple[list[int], list[int]]]:
        pos, i = key
        return pos, self.pairs[i]
