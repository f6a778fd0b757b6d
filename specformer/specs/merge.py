"""Deep merge of spec data: what ``extends``, ``--set`` and per-layer overrides share."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["deep_merge"]


def deep_merge(base: Any, over: Any) -> Any:
    """Merge ``over`` onto ``base``: mappings merge recursively, anything else replaces;
    a mapping with a different ``type:`` replaces the base mapping whole (the base's
    fields belong to the other type). Neither input is modified."""
    if isinstance(base, dict) and isinstance(over, dict):
        if "type" in over and "type" in base and over["type"] != base["type"]:
            return copy.deepcopy(over)
        out = copy.deepcopy(base)
        for key, value in over.items():
            out[key] = deep_merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)
