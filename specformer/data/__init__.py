"""Data for training: corpora, tokenizers, synthetic tasks, batching and the data module.

Importing this package is cheap; the Lightning data module lives in
:mod:`specformer.data.module`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SpecDataModule", "prepare", "Corpus", "DataError", "Tokenizer", "tokenizer_from_state", "SyntheticTask"]

_LAZY = {
    "SpecDataModule": "specformer.data.module",
    "prepare": "specformer.data.module",
    "Corpus": "specformer.data.corpus",
    "DataError": "specformer.data.corpus",
    "Tokenizer": "specformer.data.tokenizers",
    "tokenizer_from_state": "specformer.data.tokenizers",
    "SyntheticTask": "specformer.data.synthetic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specformer.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too, for tab completion
    return sorted({*globals(), *__all__})
