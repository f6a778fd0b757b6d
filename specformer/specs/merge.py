"""Deep merge of spec data: what ``extends``, ``--set`` and per-layer overrides share."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["deep_merge", "implicit_type", "family_fields"]


# the spec keys whose value is a family's mapping, selected by ``type`` (the families
# whose default does not depend on the model's kind)
_FAMILY_OF_KEY = {
    "positional": "positional",
    "attention": "attention",
    "cross_attention": "attention",
    "ffn": "ffn",
    "norm": "norm",
    "head": "head",
    "optimizer": "optimizer",
    "schedule": "schedule",
}


def implicit_type(mapping: dict[str, Any], key: Any) -> Any:
    """The ``type`` of ``mapping``, the value of spec key ``key``: its own ``type:``, or
    for a family's mapping without one, the family's default (``ffn: {d_ff: 64}`` is an
    mlp); None when unknown."""
    if "type" in mapping:
        return mapping["type"]
    from specformer.specs.base import FAMILY_DEFAULTS

    family = _FAMILY_OF_KEY.get(key) if isinstance(key, str) else None
    return FAMILY_DEFAULTS.get(family) if family is not None else None


# families whose common fields describe the stack rather than the type (sizes, placement);
# an optimizer's lr is common too, but each type's own default is what fits it
_STACK_FAMILIES = ("attention", "norm")


def family_fields(key: Any) -> tuple[str, ...]:
    """The fields that every type of the family at spec key ``key`` has and that belong to
    the stack (attention sizes, a norm's placement): a mapping given another type keeps them."""
    from specformer.registry import REQUIRED_FIELDS

    family = _FAMILY_OF_KEY.get(key) if isinstance(key, str) else None
    return tuple(REQUIRED_FIELDS[family]) if family in _STACK_FAMILIES else ()


def deep_merge(base: Any, over: Any, key: Any = None) -> Any:
    """Merge ``over`` onto ``base`` (the value of spec key ``key``): mappings merge
    recursively, anything else replaces; a mapping with a different ``type:`` replaces
    the base mapping whole (the base's fields belong to the other type), but for the
    fields every attention or norm type has (attention sizes, a norm's placement), which
    it keeps unless it sets them. A base without ``type:`` is its
    family's default type (``ffn: {activation: gelu}`` is an mlp, so ``ffn: {type: glu}``
    over it does not inherit the gelu). Neither input is modified."""
    if isinstance(base, dict) and isinstance(over, dict):
        base_type = implicit_type(base, key)
        if "type" in over and base_type is not None and over["type"] != base_type:
            out = copy.deepcopy(over)
            for name in family_fields(key):
                if name in base and name not in out:
                    out[name] = copy.deepcopy(base[name])
            return out
        out = copy.deepcopy(base)
        for k, value in over.items():
            out[k] = deep_merge(out[k], value, k) if k in out else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)
