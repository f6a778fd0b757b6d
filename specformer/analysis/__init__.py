"""Parameter, FLOP and memory accounting from a spec alone (no weights, no torch), and spec diff.

>>> from specformer import load_spec
>>> from specformer.analysis import count_parameters, flops_per_token
>>> spec = load_spec("gpt2-small")
>>> count_parameters(spec).total
124439808
"""

from __future__ import annotations

from specformer.analysis.diff import (
    ABSENT,
    Change,
    Compatibility,
    SpecDiff,
    checkpoint_compatibility,
    diff_specs,
    flatten_spec,
    state_dict_shapes,
)
from specformer.analysis.flops import FlopCounts, flops_per_token, mean_attended_keys
from specformer.analysis.memory import (
    PRECISIONS,
    MemoryEstimate,
    Precision,
    activation_bytes,
    cross_kv_cache_bytes_per_source_token,
    dtype_bytes,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    memory_estimate,
    precision,
    trainable_parameters,
)
from specformer.analysis.params import (
    AnalysisError,
    ParamCounts,
    count_parameters,
    parameter_shapes,
)
from specformer.analysis.report import PositionTableWarning, SpecReport, analyze

__all__ = [
    "ABSENT",
    "AnalysisError",
    "Change",
    "Compatibility",
    "FlopCounts",
    "MemoryEstimate",
    "PRECISIONS",
    "ParamCounts",
    "Precision",
    "SpecDiff",
    "PositionTableWarning",
    "SpecReport",
    "activation_bytes",
    "analyze",
    "checkpoint_compatibility",
    "count_parameters",
    "cross_kv_cache_bytes_per_source_token",
    "diff_specs",
    "dtype_bytes",
    "flatten_spec",
    "flops_per_token",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes",
    "mean_attended_keys",
    "memory_estimate",
    "parameter_shapes",
    "precision",
    "state_dict_shapes",
    "trainable_parameters",
]
