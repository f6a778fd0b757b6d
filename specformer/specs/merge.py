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
    import specformer.specs.schema  # noqa: F401 - its import registers the families and their defaults
    from specformer.specs.base import FAMILY_DEFAULTS

    family = _FAMILY_OF_KEY.get(key) if isinstance(key, str) else None
    return FAMILY_DEFAULTS.get(family) if family is not None else None


# the fields of each family that describe the stack or the run rather than the type's own
# tuning: a mapping given another type keeps them (attention sizes, a norm's placement, the
# ffn's dropout, the parameters an optimizer freezes or scales, the schedule's warmup); the
# others (an activation, a bias, an eps, an lr, a min_lr_ratio) take the new type's defaults,
# each fitted to its type (glu's silu, sgd's lr 0.1)
_KEPT_ON_RETYPE: dict[str, tuple[str, ...]] = {
    "ffn": ("dropout",),
    "optimizer": ("freeze", "lr_scale"),
    "schedule": ("warmup_steps",),
}


# families whose kept fields every type must declare (registry.REQUIRED_FIELDS): the
# stack's sizes and placement, kept whatever the new type's default
_STACK_FAMILIES = ("attention", "norm")


def _default_of(family: str, type_name: Any, field: str) -> tuple[bool, Any]:
    """(known, default) of ``field`` in ``family``'s type ``type_name``: known is False for a
    type no one registered (its own error follows); a type without the field has no default."""
    from specformer.registry import REGISTRY

    try:
        spec = REGISTRY.get(family, type_name).spec
    except (LookupError, TypeError):
        return False, None
    info = getattr(spec, "model_fields", {}).get(field)
    if info is None:
        return True, _MISSING
    return True, info.get_default(call_default_factory=True)


_MISSING = object()


def family_fields(key: Any, old_type: Any = None, new_type: Any = None) -> tuple[str, ...]:
    """The fields that a mapping at spec key ``key`` given another type (``old_type`` ->
    ``new_type``) keeps from the old one: those that describe the stack or the run rather than
    the type (attention sizes, a norm's placement, an ffn's dropout, an optimizer's freeze and
    lr_scale, a schedule's warmup_steps). Those of an attention or a norm, which every type of
    the family has, are kept whatever the types; the others where the new type has the field
    with the same default as the old (so inverse_sqrt's warmup_steps, 4000 in the paper and
    never 0, is its own). Types not given (or not registered) are taken to share them."""
    family = _FAMILY_OF_KEY.get(key) if isinstance(key, str) else None
    names = _KEPT_ON_RETYPE.get(family, ()) if family is not None else ()
    if family in _STACK_FAMILIES:  # every type of the family has them, whatever its default
        from specformer.registry import REQUIRED_FIELDS

        return tuple(REQUIRED_FIELDS[family])
    kept = []
    for name in names:
        old_known, old = _default_of(family, old_type, name) if old_type is not None else (False, None)
        new_known, new = _default_of(family, new_type, name) if new_type is not None else (False, None)
        if (old_known and old is _MISSING) or (new_known and new is _MISSING):
            continue  # a type without the field
        if old_known and new_known and old != new:
            continue  # a default fitted to each type
        kept.append(name)
    return tuple(kept)


def deep_merge(base: Any, over: Any, key: Any = None) -> Any:
    """Merge ``over`` onto ``base`` (the value of spec key ``key``): mappings merge
    recursively, anything else replaces; a mapping with a different ``type:`` replaces
    the base mapping whole (the base's fields belong to the other type), but for the
    fields that describe the stack or the run (:func:`family_fields`: attention sizes, a
    norm's placement, a schedule's warmup_steps, ...), which it keeps unless it sets them.
    A base without ``type:`` is its family's default type (``ffn: {activation: gelu}`` is an mlp, so ``ffn: {type: glu}``
    over it does not inherit the gelu). Neither input is modified."""
    if isinstance(base, dict) and isinstance(over, dict):
        base_type = implicit_type(base, key)
        if "type" in over and base_type is not None and over["type"] != base_type:
            out = copy.deepcopy(over)
            for name in family_fields(key, base_type, over["type"]):
                if name in base and name not in out:
                    out[name] = copy.deepcopy(base[name])
            return out
        out = copy.deepcopy(base)
        for k, value in over.items():
            out[k] = deep_merge(out[k], value, k) if k in out else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)
