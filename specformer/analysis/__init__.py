"""Parameter, FLOP and memory accounting from a spec alone (no weights, no torch), and spec diff."""

from __future__ import annotations

from specformer.analysis.params import (
    AnalysisError,
    ParamCounts,
    count_parameters,
    parameter_shapes,
)

__all__ = [
    "AnalysisError",
    "ParamCounts",
    "count_parameters",
    "parameter_shapes",
]
