"""The JSON Schema of a spec file (what ``specformer schema`` prints).

It is generated from :class:`ModelSpec`, so it follows the registry: every
registered ``type:`` of every family appears, plugins included. A copy ships
beside the presets as ``specformer.schema.json`` for their modelines.

It describes a spec *file*, which is not yet a whole spec: ``extends``, per-layer
overrides and ``--set`` merge more onto it before :class:`ModelSpec` validates.
So, unlike pydantic's schema of the model, it

- requires no field (a parent may give it), except in a list item, which merging
  replaces whole (``overrides: [{layers: ...}]``);
- accepts a family's mapping without ``type:`` when it fits one of the family's
  types (``norm: {eps: 1.0e-6}``, ``ffn: {activation: gelu}``): the type may come
  from the family's default, the parent or the stack an override merges onto;
- accepts the other forms the loader's ``mode="before"`` validators take
  (``layers: "0-5"``, ``precision: 32``, ``training: null``).

It still refuses unknown fields, unknown ``type:`` and enum values and values of
the wrong JSON type; cross-field rules and completeness are ``specformer validate``'s.
"""

from __future__ import annotations

from typing import Any

__all__ = ["spec_json_schema"]

# What a field's mode="before" validator accepts besides its declared type, which
# pydantic's schema leaves out: (model, field) -> the other JSON Schema alternatives.
_ALSO_ACCEPTED: dict[tuple[str, str], list[dict[str, Any]]] = {
    # LayerOverride._parse_layers: one index, or an inclusive range "lo-hi"
    ("LayerOverride", "layers"): [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^\s*[0-9]+\s*(-\s*[0-9]+\s*)?$"},
    ],
    # TrainingSpec._precision: Lightning's integer and short spellings
    ("TrainingSpec", "precision"): [{"enum": [32, 16, 64, "32-true", "fp32", "bf16", "16"]}],
    # FilesDataSpec._one_path: one path alone, `paths: data/`
    ("FilesDataSpec", "paths"): [{"type": "string"}],
    # training._patterns: one pattern alone, `freeze: embed.*`
    **{(model, "freeze"): [{"type": "string", "minLength": 1}] for model in ("AdamWSpec", "SGDSpec", "AdafactorSpec")},
    # fill_training (in ModelSpec._fill_derived): null is the default section
    ("ModelSpec", "training"): [{"type": "null"}],
}

# keywords that describe a field rather than constrain its value
_ANNOTATIONS = ("title", "description", "default")


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a spec file as written in YAML, with ``extends``."""
    from specformer.specs.schema import ModelSpec

    schema = ModelSpec.model_json_schema(mode="validation")
    models = {ModelSpec.__name__: schema, **schema.get("$defs", {})}
    for (model, field), alternatives in _ALSO_ACCEPTED.items():
        _also_accept(models[model]["properties"][field], alternatives)
    _loosen(schema, keep_required=_list_items(schema))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specformer spec"
    schema["properties"]["extends"] = {
        "type": "string",
        "description": "A preset name or a path (relative to this file) that this spec "
        "deep-merges onto: mappings merge, lists and scalars replace.",
    }
    return schema


def _also_accept(prop: dict[str, Any], alternatives: list[dict[str, Any]]) -> None:
    """Widen the property schema ``prop`` in place to ``anyOf`` its own and ``alternatives``."""
    own = {k: prop.pop(k) for k in list(prop) if k not in _ANNOTATIONS}
    prop["anyOf"] = [*_alternatives(own), *alternatives]


def _alternatives(node: dict[str, Any]) -> list[dict[str, Any]]:
    # a bare {"anyOf": [...]} (or pydantic's {"oneOf": [...]} of a family) joins the
    # outer anyOf instead of nesting in it
    if len(node) == 1 and ("anyOf" in node or "oneOf" in node):
        return next(iter(node.values()))
    return [node]


def _loosen(node: Any, *, keep_required: set[str], name: str | None = None) -> None:
    """Make ``node`` and everything below it describe a file that merging completes:
    no ``required`` (but in the models named by ``keep_required``), and ``anyOf``
    for pydantic's ``oneOf`` of a family's types."""
    if isinstance(node, list):
        for item in node:
            _loosen(item, keep_required=keep_required)
        return
    if not isinstance(node, dict):
        return
    if name not in keep_required:
        node.pop("required", None)
    if "oneOf" in node:
        # oneOf fails on a mapping without `type:` that fits two members (`norm: {eps: ...}`
        # is a layernorm and an rmsnorm); every member still refuses fields it lacks
        node["anyOf"] = node.pop("oneOf")
    if "anyOf" in node:
        node["anyOf"] = [alt for member in node["anyOf"] for alt in _alternatives(member)]
    for key, value in node.items():
        if key in ("$defs", "properties"):
            for child_name, child in value.items():
                _loosen(child, keep_required=keep_required, name=child_name if key == "$defs" else None)
        else:
            _loosen(value, keep_required=keep_required)


def _list_items(schema: dict[str, Any]) -> set[str]:
    """The ``$defs`` used only as the items of a list: merging never adds to those."""
    as_items: set[str] = set()
    elsewhere: set[str] = set()

    def visit(node: Any, in_items: bool) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item, in_items)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                (as_items if in_items else elsewhere).add(ref.rsplit("/", 1)[1])
            for key, value in node.items():
                if key in ("$defs", "properties"):
                    visit(list(value.values()), False)
                else:
                    visit(value, key in ("items", "prefixItems"))

    visit(schema, False)
    return as_items - elsewhere
