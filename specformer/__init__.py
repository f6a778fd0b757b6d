"""specformer: describe a Transformer in YAML; validate, build, train, analyse and diff it.

Importing this package is cheap: torch is imported only when a torch-backed name
(``build_model``, ``SpecModule``, ...) is first used.

Here: ``load_spec`` (a preset, a YAML path or text, a dict or a spec, with ``--set``-style
overrides), ``build_model``, ``SpecModule`` and ``SpecDataModule`` (Lightning),
``count_parameters`` and ``diff_specs``. Elsewhere:

- ``specformer.analysis``: ``analyze``, ``flops_per_token``, ``memory_estimate``,
  ``kv_cache_bytes``, ... (what ``specformer show`` prints);
- ``specformer.training``: ``train`` (what ``specformer train`` runs), ``load_checkpoint``
  and ``save_checkpoint`` (a model with its spec and tokenizer), ``load_weights_file``,
  ``generate``, ``generate_seq2seq``, ``beam_search``, ``encode_prompt``, ``classify``;
- ``specformer.registry``: ``register`` a component of your own (docs/components.md);
- ``specformer.interop``: Hugging Face configs and weights in and out.
"""

from __future__ import annotations

import importlib
from typing import Any

from specformer.specs.errors import SpecError
from specformer.specs.loader import load_spec, preset_names

__version__ = "0.1.0"

_LAZY = {
    "ModelSpec": "specformer.specs.schema",
    "build_model": "specformer.builder",
    "SpecModule": "specformer.builder.lightning",
    "SpecDataModule": "specformer.data.module",
    "count_parameters": "specformer.analysis",
    "diff_specs": "specformer.analysis",
}

__all__ = [
    "load_spec",
    "preset_names",
    "SpecError",
    "ModelSpec",
    "build_model",
    "SpecModule",
    "SpecDataModule",
    "count_parameters",
    "diff_specs",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too, for tab completion
    return sorted({*globals(), *__all__})
