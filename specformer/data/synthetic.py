"""Synthetic sequence-to-sequence tasks generated from a seed: copy, reverse, sort, addition.

Small, exact tasks for checking that an encoder-decoder learns at all: a model that
reaches high exact-match accuracy on held-out examples has working attention,
cross-attention, masking and decoding. Validation examples are drawn first and
never appear in the training set.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np

from specformer.data.corpus import DataError
from specformer.specs.training import SyntheticDataSpec

__all__ = ["SyntheticTask", "length_problem", "solve"]


def solve(task: str, src: str) -> str:
    """The right answer of ``task`` for input ``src``."""
    if task == "copy":
        return src
    if task == "reverse":
        return src[::-1]
    if task == "sort":
        return "".join(sorted(src))
    if task == "addition":
        a, b = src.split("+")
        return str(int(a) + int(b))
    raise ValueError(f"unknown task {task!r}")


def length_problem(spec: Any) -> str | None:
    """Why the synthetic task of ``spec`` (a ``ModelSpec``) does not fit its run, or None: an
    example is never cut (a cut answer is another task), so the longest source, and target
    with its end token, must fit the run's ``training.seq_len``, not only ``max_seq_len``."""
    t = spec.training
    task = SyntheticTask(t.data)
    seq_len = t.seq_len or spec.max_seq_len
    longest = max(task.max_source_len, task.max_target_len + 1)
    if longest <= seq_len:
        return None
    limit = (f"training.seq_len is {seq_len}; lower training.data.max_len, or raise training.seq_len (up to "
             f"the model's max_seq_len={spec.max_seq_len})" if seq_len < spec.max_seq_len else
             f"max_seq_len is {spec.max_seq_len}; lower training.data.max_len, or raise max_seq_len")
    return (f"the {t.data.task} task makes sequences of up to {longest} tokens (training.data.max_len="
            f"{t.data.max_len}) but {limit}")


class SyntheticTask:
    """Seeded (input, target) string pairs for one task."""

    def __init__(self, spec: SyntheticDataSpec, **_: Any) -> None:
        self.spec = spec
        self.alphabet = string.ascii_lowercase[: spec.n_symbols]
        self._splits: dict[str, list[tuple[str, str]]] = {}

    @property
    def max_source_len(self) -> int:
        s = self.spec
        return 2 * s.max_len + 1 if s.task == "addition" else s.max_len

    @property
    def max_target_len(self) -> int:
        s = self.spec
        return s.max_len + 1 if s.task == "addition" else s.max_len

    def _source(self, rng: np.random.Generator) -> str:
        s = self.spec
        if s.task == "addition":
            def number() -> str:
                n = int(rng.integers(s.min_len, s.max_len + 1))
                first = str(int(rng.integers(1, 10))) if n > 1 else str(int(rng.integers(0, 10)))
                return first + "".join(str(d) for d in rng.integers(0, 10, size=n - 1))

            return f"{number()}+{number()}"
        n = int(rng.integers(s.min_len, s.max_len + 1))
        return "".join(self.alphabet[i] for i in rng.integers(0, len(self.alphabet), size=n))

    def _space(self) -> float:
        """How many distinct inputs exist (capped), to refuse impossible splits early."""
        s = self.spec
        if s.task == "addition":
            per = sum(9 * 10 ** (n - 1) if n > 1 else 10 for n in range(s.min_len, s.max_len + 1))
            return float(per) ** 2
        return float(sum(len(self.alphabet) ** n for n in range(s.min_len, s.max_len + 1)))

    def split(self, name: str) -> list[tuple[str, str]]:
        """``"train"`` or ``"val"``: a list of (input, target); val inputs never occur in train."""
        if name in self._splits:
            return self._splits[name]
        s = self.spec
        if self._space() < 2 * s.n_val:
            raise DataError(
                f"the {s.task} task with lengths {s.min_len}-{s.max_len} has only {int(self._space())} "
                f"distinct inputs, too few to hold out n_val={s.n_val}; raise max_len or lower n_val"
            )
        val_rng = np.random.default_rng([s.seed, 1])
        val: dict[str, str] = {}
        while len(val) < s.n_val:
            src = self._source(val_rng)
            val.setdefault(src, solve(s.task, src))
        held_out = set(val)
        train_rng = np.random.default_rng([s.seed, 2])
        train: list[tuple[str, str]] = []
        tries = 0
        while len(train) < s.n_train:
            tries += 1
            if tries > 20 * s.n_train:
                raise DataError(f"could not draw {s.n_train} training examples outside the held-out set")
            src = self._source(train_rng)
            if src not in held_out:
                train.append((src, solve(s.task, src)))
        self._splits = {"train": train, "val": list(val.items())}
        return self._splits[name]
