"""Training: objectives, schedules, the optimizer, checkpoints, callbacks, generation,
classification and the :func:`train` entry point behind ``specformer train``."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "train",
    "TrainResult",
    "TrainingInterrupted",
    "generate",
    "generate_seq2seq",
    "beam_search",
    "encode_prompt",
    "classify",
    "load_checkpoint",
    "save_checkpoint",
    "load_weights_file",
    "CheckpointError",
]

_LAZY = {
    "train": "specformer.training.run",
    "TrainResult": "specformer.training.run",
    "TrainingInterrupted": "specformer.training.stops",
    "load_checkpoint": "specformer.training.checkpoint",
    "save_checkpoint": "specformer.training.checkpoint",
    "load_weights_file": "specformer.training.checkpoint",
    "CheckpointError": "specformer.training.checkpoint",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specformer.training' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too, for tab completion
    return sorted({*globals(), *__all__})


# eager, not lazy: the submodules ``generate`` and ``classify`` have their functions' names, and
# importing a submodule binds it on the package, which would hand out the module instead
from specformer.training.classify import classify  # noqa: E402
from specformer.training.generate import beam_search, encode_prompt, generate, generate_seq2seq  # noqa: E402
