"""Diff of fully resolved specs: every changed field, the consequences, checkpoint compatibility.

Specs are compared after ``extends``, overrides and defaults are resolved, and with
their derived values (``head_dim``, ``n_kv_heads``, ``out_bias``, ``d_ff``, the final norm,
``training.seq_len``, and the ``kv_groups`` computed here). Nothing is ignored: the ``name``
and every dropout, epsilon and init setting are fields like any other. A field that exists in only
some specs (because a ``type`` changed) is reported as absent in the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from specformer.analysis.flops import Count
from specformer.analysis.params import AnalysisError, as_spec, parameter_shapes
from specformer.analysis.report import SpecReport, analyze

__all__ = [
    "ABSENT",
    "Change",
    "Compatibility",
    "SpecDiff",
    "diff_specs",
    "flatten_spec",
    "checkpoint_compatibility",
    "state_dict_shapes",
]


class _Absent:
    """The value of a field that a spec does not have."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Change:
    """One field whose value differs between specs; ``values`` has one entry per spec.

    ``kept`` marks a per-layer path whose values are equal: its stack's field changed,
    but an override keeps these layers as they were (``decoder.ffn.d_ff`` 1024 → 2048,
    ``decoder.layers.2.ffn.d_ff`` 1024 in both).
    """

    path: str
    values: tuple[Any, ...]
    derived: bool = False
    kept: bool = False

    @property
    def left(self) -> Any:
        return self.values[0]

    @property
    def right(self) -> Any:
        return self.values[-1]

    def to_dict(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            return None if v is ABSENT else v

        return {
            "path": self.path,
            "left": plain(self.left),
            "right": plain(self.right),
            "values": [plain(v) for v in self.values],
            "present": [v is not ABSENT for v in self.values],
            "derived": self.derived,
            "kept": self.kept,
        }


@dataclass(frozen=True)
class Compatibility:
    """Whether a checkpoint of ``source`` loads (``strict=True``) into a model of ``target``."""

    source: str
    target: str
    missing: list[str]  # keys the target model needs that the checkpoint lacks
    unexpected: list[str]  # keys in the checkpoint the target model does not have
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]  # key, source shape, target shape
    method: str  # "meta build" or "analytic"

    @property
    def compatible(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "compatible": self.compatible,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "mismatched": [
                {"key": k, "source": list(a), "target": list(b)} for k, a, b in self.mismatched
            ],
            "method": self.method,
        }


@dataclass(frozen=True)
class SpecDiff:
    """The changes between specs, each spec's report, and checkpoint compatibility of the
    first spec with each other one (both directions)."""

    names: list[str]
    changes: list[Change]
    reports: list[SpecReport] = field(default_factory=list)
    compatibility: list[Compatibility] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.changes

    def __repr__(self) -> str:
        # one line: the dataclass repr would write out every report's spec
        paths = [c.path for c in self.changes]
        shown = ", ".join(paths[:5]) + (f", … ({len(paths) - 5} more)" if len(paths) > 5 else "")
        changes = f"{len(paths)} change{'s' * (len(paths) != 1)}: {shown}" if paths else "identical"
        loads = ""
        if self.compatibility:
            loads = ", checkpoints load: " + ", ".join(
                f"{c.source}→{c.target} {'yes' if c.compatible else 'no'}" for c in self.compatibility)
        return f"SpecDiff({self.names!r}, {changes}{loads})"

    def to_markdown(self) -> str:
        """The tables ``specformer diff --format markdown`` prints."""
        from specformer.cli.analysis_cmds import diff_markdown

        return diff_markdown(self)

    def _repr_markdown_(self) -> str:  # how Jupyter displays it
        return self.to_markdown()

    def to_dict(self) -> dict[str, Any]:
        return {
            "specs": list(self.names),
            "identical": self.identical,
            "changes": [c.to_dict() for c in self.changes],
            # each report says which spec it is of: its name alone repeats where one is the other --set
            "reports": [{"label": label, **r.to_dict()} for label, r in zip(self.names, self.reports, strict=False)],  # none: reports=False
            "compatibility": [c.to_dict() for c in self.compatibility],
        }


# --------------------------------------------------------------------------- flattening


def _walk(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list | tuple) and value and any(isinstance(v, dict | list) for v in value):
        for i, v in enumerate(value):
            yield from _walk(v, f"{prefix}.{i}")
    elif isinstance(value, list | tuple):
        yield prefix, list(value)
    else:
        yield prefix, value


_LAYER_PARTS = ("attention", "cross_attention", "ffn", "norm", "residual")
_LAYER_PATH = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)$")


def _derived(spec: Any) -> Iterator[tuple[str, Any]]:
    for role, stack in spec.stacks():
        for part in ("attention", "cross_attention"):
            att = getattr(stack, part)
            if att is not None and getattr(att, "n_kv_heads", None):
                yield f"{role}.{part}.kv_groups", att.n_heads // att.n_kv_heads


def _layer_flat(layer: Any) -> dict[str, Any]:
    flat = dict(_walk({k: getattr(layer, k).model_dump(mode="json") if getattr(layer, k) is not None else None
                       for k in _LAYER_PARTS}, ""))
    for part in ("attention", "cross_attention"):
        att = getattr(layer, part)
        if att is not None and getattr(att, "n_kv_heads", None):
            flat[f"{part}.kv_groups"] = att.n_heads // att.n_kv_heads
    return flat


_DERIVABLE = re.compile(
    r"^(?P<at>(?:encoder|decoder)(?:\.layers\.[\d-]+)?)\.(?:(?P<att>attention|cross_attention)\.(?P<size>head_dim|n_kv_heads|out_bias)"
    r"|ffn\.d_ff|norm\.final)$"
)


def _follows_from_others(spec: Any, flat: dict[str, Any], path: str, *, inherited: bool = False) -> bool:
    """Whether the value at ``path`` (``head_dim``, ``n_kv_heads``, ``out_bias``, ``d_ff``,
    the final norm, ``training.seq_len``) is the one the spec derives from its other
    fields. ``inherited``: a layer's value that is its stack's, no override changing it."""
    if path == "training.seq_len":
        return path in flat and flat[path] == flat.get("max_seq_len")
    m = _DERIVABLE.match(path)
    if m is None or path not in flat:
        return False
    prefix, value = m.group("at"), flat[path]
    if ".layers." in path and not m.group("att"):
        # a layer's d_ff differs from its stack's where an override writes it, or where
        # the override changes the FFN's type (listed then) and the size is derived anew
        if not path.endswith("ffn.d_ff"):
            return False
        kind = flat.get(f"{prefix}.ffn.type")
        if kind is None and inherited:
            kind = _value_or_stack(flat, prefix, "ffn.type")
        return kind is not None and value == _default_d_ff(spec, kind)
    if m.group("size") == "out_bias":
        return value == _value_or_stack(flat, prefix, f"{m.group('att')}.bias")
    if m.group("att"):
        n_heads = _value_or_stack(flat, prefix, f"{m.group('att')}.n_heads")
        if not isinstance(n_heads, int) or n_heads <= 0:
            return False
        if m.group("size") == "n_kv_heads":
            return value == n_heads
        return spec.d_model % n_heads == 0 and value == spec.d_model // n_heads
    if path.endswith("ffn.d_ff"):
        return value == _default_d_ff(spec, _value_or_stack(flat, prefix, "ffn.type"))
    return value == (_value_or_stack(flat, prefix, "norm.placement") != "post")


def _default_d_ff(spec: Any, kind: Any) -> int | None:
    """The ``d_ff`` an FFN of type ``kind`` derives when none is written."""
    from specformer.specs.schema import default_glu_d_ff

    return 4 * spec.d_model if kind == "mlp" else default_glu_d_ff(spec.d_model) if kind == "glu" else None


def _value_or_stack(flat: dict[str, Any], prefix: str, field: str) -> Any:
    """A layer's field, or its stack's when no override changes it."""
    return flat.get(f"{prefix}.{field}", flat.get(f"{prefix.split('.')[0]}.{field}"))


def flatten_spec(spec: Any) -> tuple[dict[str, Any], set[str]]:
    """Dotted path -> value for every field of the resolved spec, plus the set of paths
    whose value follows from others (``kv_groups``, and ``head_dim``, ``n_kv_heads``,
    ``d_ff`` and the final norm where they equal what the spec derives).

    Lists of mappings are indexed, other lists are values. A stack's ``overrides`` are
    replaced by their effect: ``{stack}.layers.{i}.{field}`` for each field where layer
    ``i`` differs from the stack's own setting.
    """
    data = spec.to_dict()
    layer_paths: dict[str, Any] = {}
    for role, stack in spec.stacks():
        data[role].pop("overrides", None)
        if not stack.overrides:
            continue
        base = _layer_flat(stack)
        for i in range(stack.n_layers):
            layer = _layer_flat(stack.layer(i))
            for path, value in layer.items():
                if path not in base or not _same(base[path], value):
                    layer_paths[f"{role}.layers.{i}.{path}"] = value
            for path in base:
                if path not in layer:
                    layer_paths[f"{role}.layers.{i}.{path}"] = ABSENT
    flat = dict(_walk(data, ""))
    derived = dict(_derived(spec))
    flat.update(derived)
    flat.update(layer_paths)
    derived_paths = set(derived) | {p for p in layer_paths if p.endswith(".kv_groups")}
    derived_paths |= {p for p in flat if _follows_from_others(spec, flat, p) and not _written(spec, flat, p)}
    return flat, derived_paths


def _written(spec: Any, flat: dict[str, Any], path: str) -> bool:
    """Whether the spec's files (or its Python caller) write ``path``'s value: a size that
    equals its derivation is still the spec's own where it is written (a d_ff: 512 stays 512
    when d_model changes). A layer's field is written where the last override of that layer
    with the part writes it, or where its value is the stack's and the stack writes it."""
    m = _LAYER_PATH.match(path)
    if m is None:
        *parents, name = path.split(".")
        node = spec
        for part in parents:
            node = getattr(node, part, None)
        return name in getattr(node, "model_fields_set", ())
    role, index, (part, _, name) = m.group(1), int(m.group(2)), m.group(3).partition(".")
    stack = getattr(spec, role, None)
    for ov in reversed(getattr(stack, "overrides", ())):
        node = getattr(ov, part, None) if index in ov.layers else None
        if node is not None:
            if name in node.model_fields_set:
                return True
            break
    stack_path = f"{role}.{m.group(3)}"
    return stack_path in flat and _same(flat[stack_path], flat.get(path)) and _written(spec, flat, stack_path)


def _value_at(spec: Any, flat: dict[str, Any], path: str) -> Any:
    """The value of ``path`` in one spec; a per-layer path the spec does not list has the
    stack's own value (no override there), or is absent if the layer does not exist."""
    if path in flat:
        return flat[path]
    m = _LAYER_PATH.match(path)
    if m is None:
        return ABSENT
    role, index, rest = m.group(1), int(m.group(2)), m.group(3)
    stack = getattr(spec, role, None)
    if stack is None or index >= stack.n_layers:
        return ABSENT
    return flat.get(f"{role}.{rest}", ABSENT)


def _derived_in(spec: Any, flat: dict[str, Any], derived: set[str], path: str, value: Any) -> bool:
    """Whether ``value``, ``path``'s value in ``spec``, follows from the spec's other
    fields (true of a field the spec lacks). A layer that no override changes at
    ``path`` has its stack's value, which the layer's own fields may not derive (a
    glu layer of an mlp stack with the mlp's ``d_ff``)."""
    if path in flat:
        return path in derived
    if value is ABSENT or path.endswith(".kv_groups"):
        return True
    with_layer = {**flat, path: value}
    return _follows_from_others(spec, with_layer, path, inherited=True) and not _written(spec, with_layer, path)


def _changes(specs: list[Any]) -> list[Change]:
    flats = [flatten_spec(s) for s in specs]
    # merged field order: a path that only a later spec has goes right after the
    # path that precedes it in that spec, so changes read in spec order
    order: list[str] = []
    seen: set[str] = set()
    for flat, _ in flats:
        at = 0
        for path in flat:
            if path in seen:
                at = order.index(path) + 1
                continue
            order.insert(at, path)
            seen.add(path)
            at += 1
    # per-layer rows in layer order, in the places the layer rows took
    slots = [i for i, path in enumerate(order) if _LAYER_PATH.match(path)]
    rank = {"encoder": 0, "decoder": 1}

    def layer_key(i: int) -> tuple[int, int, int]:
        m = _LAYER_PATH.match(order[i])
        assert m is not None
        return rank[m.group(1)], int(m.group(2)), i

    for i, path in zip(slots, [order[j] for j in sorted(slots, key=layer_key)], strict=True):
        order[i] = path
    values = {
        path: tuple(_value_at(spec, flat, path) for spec, (flat, _) in zip(specs, flats, strict=True))
        for path in order
    }
    # derived: the value follows from the other fields in every spec that has it
    derived = {path for path in order
               if all(_derived_in(spec, flat, d, path, v)
                      for spec, (flat, d), v in zip(specs, flats, values[path], strict=True))}
    # a section that is null in one spec and has fields in another (`encoder` of a
    # decoder-only model and of an encoder-decoder) is shown by its fields, each absent
    # in the first: a row `encoder: null | —` would say the section does not exist in a
    # spec that has one
    prefixes = {path[: i] for path in order for i, ch in enumerate(path) if ch == "."}
    sections = {path for path, vs in values.items()
                if path in prefixes and all(v is None or v is ABSENT for v in vs)}
    changed = {path for path, vs in values.items()
               if path not in sections and any(not _same(vs[0], v) for v in vs[1:])}
    changes = []
    for path in order:
        if path in changed:
            changes.append(Change(path, values[path], path in derived))
            continue
        # a layer that an override keeps as it was while its stack's field changed
        m = _LAYER_PATH.match(path)
        if m is not None and f"{m.group(1)}.{m.group(3)}" in changed:
            changes.append(Change(path, values[path], path in derived, kept=True))
    return _merge_layer_ranges(changes)


def _merge_layer_ranges(changes: list[Change]) -> list[Change]:
    """Join per-layer changes of consecutive layers with equal values: ``decoder.layers.0-2.x``."""
    out: list[Change] = []
    open_runs: dict[tuple[str, str, tuple], tuple[int, int, int]] = {}  # key -> (out index, first, last)
    for ch in changes:
        m = _LAYER_PATH.match(ch.path)
        if m is None:
            out.append(ch)
            continue
        role, index, rest = m.group(1), int(m.group(2)), m.group(3)
        key = (role, rest, tuple(repr(v) for v in ch.values))
        run = open_runs.get(key)
        if run is not None and run[2] == index - 1:
            pos, first, _ = run
            out[pos] = replace(ch, path=f"{role}.layers.{first}-{index}.{rest}")
            open_runs[key] = (pos, first, index)
        else:
            open_runs[key] = (len(out), index, index)
            out.append(ch)
    return out


def _same(a: Any, b: Any) -> bool:
    if (a is ABSENT) != (b is ABSENT):
        return False
    # 1 and 1.0 and True are different YAML values; compare type and value
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------- checkpoints


def state_dict_shapes(spec: Any, method: str = "analytic") -> tuple[dict[str, tuple[int, ...]], str]:
    """State-dict key -> shape of ``spec``'s model, and the method that produced it.

    ``"analytic"`` (default) lists the parameters from the spec alone, no torch: the
    test suite checks that it equals the meta-device build's ``state_dict()`` (keys and
    shapes) for every preset and for generated specs. A type without an analytic
    count (a plugin entry) falls back to the meta build. ``"meta"`` always builds the
    model on the meta device (nothing allocated; imports torch).
    """
    if method not in ("analytic", "meta"):
        raise ValueError(f"method must be 'analytic' or 'meta', got {method!r}")
    if method == "analytic":
        try:
            return parameter_shapes(spec), "analytic"
        except AnalysisError:
            pass
    from specformer.analysis.params import meta_build

    model = meta_build(spec, "to list its state dict for the checkpoint check")
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, "meta build"


def checkpoint_compatibility(
    source: Any,
    target: Any,
    *,
    method: str = "analytic",
    shapes: dict[int, tuple[dict[str, tuple[int, ...]], str]] | None = None,
) -> Compatibility:
    """Whether a checkpoint of ``source`` loads (strictly) into a model built from ``target``."""
    cache = shapes if shapes is not None else {}
    for s in (source, target):
        if id(s) not in cache:
            cache[id(s)] = state_dict_shapes(s, method)
    src, m1 = cache[id(source)]
    dst, m2 = cache[id(target)]
    missing = [k for k in dst if k not in src]
    unexpected = [k for k in src if k not in dst]
    mismatched = [(k, src[k], dst[k]) for k in src if k in dst and src[k] != dst[k]]
    return Compatibility(
        source=source.name,
        target=target.name,
        missing=missing,
        unexpected=unexpected,
        mismatched=mismatched,
        method=m1 if m1 == m2 else f"{m1} / {m2}",
    )


# --------------------------------------------------------------------------- diff


def diff_specs(
    *specs: Any,
    batch: int = 1,
    seq_len: int | None = None,
    dtype: str = "bf16-mixed",
    reports: bool = True,
    checkpoints: bool = True,
    checkpoint_method: str = "analytic",
    labels: list[str] | None = None,
    count: Count = "needed",
) -> SpecDiff:
    """Compare resolved specs (``ModelSpec`` objects, preset names, YAML paths or dicts).

    ``changes`` lists every differing field; ``reports`` holds each spec's parameters,
    FLOPs, KV cache and memory at the same ``batch``, ``seq_len`` (default: the first
    spec's ``max_seq_len``) and ``dtype``; ``compatibility`` says whether a checkpoint
    of the first spec loads into each other one and back (state-dict shapes by
    ``checkpoint_method``, see :func:`state_dict_shapes`). ``labels`` name the specs in
    tables (default: their ``name`` fields, a repeated one numbered: ``gpt-nano #2``).
    ``count`` is :func:`flops_per_token`'s (``"needed"`` or ``"executed"``).
    """
    if len(specs) == 1 and isinstance(specs[0], list | tuple):
        raise TypeError(f"diff_specs takes the specs as arguments: diff_specs(*specs), not one "
                        f"{type(specs[0]).__name__} of {len(specs[0])}")
    if len(specs) < 2:
        raise ValueError(f"diff needs at least two specs, got {len(specs)}")
    if isinstance(labels, str):
        raise TypeError(f"labels are one name per spec, in a list: labels=[...], not the string {labels!r}")
    if labels is not None and len(labels) != len(specs):
        raise ValueError(f"{len(labels)} labels for {len(specs)} specs")
    resolved = [as_spec(s) for s in specs]
    t = seq_len if seq_len is not None else resolved[0].max_seq_len
    changes = _changes(resolved)
    out_reports = [analyze(s, batch=batch, seq_len=t, dtype=dtype, count=count) for s in resolved] if reports else []
    # the tables and the checkpoint lines name the specs by these: a label given twice is numbered
    names = distinct_names([str(label) for label in labels] if labels is not None else [s.name for s in resolved])
    compat: list[Compatibility] = []
    if checkpoints:
        cache: dict[int, tuple[dict[str, tuple[int, ...]], str]] = {}
        first = resolved[0]
        for other, name in zip(resolved[1:], names[1:], strict=True):
            # named by the labels, as in the tables: two specs may share a `name`
            there = checkpoint_compatibility(first, other, method=checkpoint_method, shapes=cache)
            back = checkpoint_compatibility(other, first, method=checkpoint_method, shapes=cache)
            compat.append(replace(there, source=names[0], target=name))
            compat.append(replace(back, source=name, target=names[0]))
    return SpecDiff(
        names=names,
        changes=changes,
        reports=out_reports,
        compatibility=compat,
    )


def distinct_names(names: list[str]) -> list[str]:
    """``names`` with each repeat numbered, so that two specs that share a ``name`` (one
    copied from the other) have columns of their own: ``gpt-nano``, ``gpt-nano #2``."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return out
