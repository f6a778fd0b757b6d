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
    """Tokenised (source, target) pairs of a sequence-to-sequence task: lists (a synthetic
    task's), or one flat array of ids with the length of each source and target, in turn
    (a pairs file's, memory-mapped from the token cache: 2 or 4 bytes a token, where a
    Python list of ints takes ~36, so a few million pairs stay a few hundred MB)."""

    def __init__(
        self,
        pairs: list[tuple[list[int], list[int]]] | None = None,
        *,
        ids: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        end_token: bool = True,
    ) -> None:
        if (pairs is None) == (ids is None or lengths is None):
            raise ValueError("give the pairs as lists, or as ids and lengths")
        self._pairs = pairs
        # whether the collator adds an end token after each target (a decoder's responses hold theirs)
        self._end = int(end_token)
        self._ids = PackedBlocks(ids, 1) if ids is not None else None  # (memory maps travel by file name)
        self._ends = None if lengths is None else np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self._pairs) if self._pairs is not None else (len(self._ends) - 1) // 2

    def pair(self, i: int) -> tuple[list[int], list[int]]:
        if self._pairs is not None:
            return self._pairs[i]
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} of {len(self)}")
        start, middle, end = (int(x) for x in self._ends[2 * i : 2 * i + 3])
        tokens = self._ids.tokens
        return tokens[start:middle].tolist(), tokens[middle:end].tolist()

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, tuple[list[int], list[int]]]:
        pos, i = key
        return pos, self.pair(i)

    @property
    def pairs(self) -> list[tuple[list[int], list[int]]]:
        """Every pair as two lists (made anew from the arrays: for inspection and tests)."""
        return self._pairs if self._pairs is not None else [self.pair(i) for i in range(len(self))]

    def n_tokens(self) -> int:
        """The tokens a pass over the pairs predicts or reads: each source and target, and
        the end token the collator adds after each target."""
        if self._pairs is not None:
            return sum(len(s) + len(g) + self._end for s, g in self._pairs)
        return int(self._ends[-1]) + self._end * len(self)


class LabelledTexts(Dataset):
    """Token ids of texts and a class id each, for sequence classification; items are
    ``(position, (ids, label))`` for the batch samplers' ``(position, index)`` keys."""

    def __init__(self, rows: list[tuple[list[int], int]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, tuple[list[int], int]]:
        pos, i = key
        return pos, self.rows[i]

    @property
    def labels(self) -> list[int]:
        return [label for _, label in self.rows]

    def n_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.rows)
