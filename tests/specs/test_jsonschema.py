"""The JSON Schema editors check spec files with: it accepts every file ``specformer
validate`` accepts (presets, docs, partial files that ``extends`` completes) and still
refuses typos, unknown types and values of the wrong type.

The schema's verdict is compared with the loader's on the same file. Validating needs
the ``jsonschema`` package, which is not a dependency: those tests skip without it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from specformer import load_spec, preset_names
from specformer.cli.interop_cmds import compact_spec_yaml
from specformer.specs.errors import SpecError
from specformer.specs.loader import deep_merge, load_spec_data, parse_yaml, preset_path
from specformer.specs.schema import ModelSpec

PRESETS = preset_names()
ROOT = Path(__file__).resolve().parents[2]
NANO = ["gpt-nano", "bert-nano", "t5-nano"]  # one preset of each kind


def _shipped_schema() -> dict[str, Any]:
    return json.loads(resources.files("specformer.specs").joinpath("specformer.schema.json").read_text())


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _shipped_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _schema_errors(validator: Any, data: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:200]}"
            for e in validator.iter_errors(data)]


def _check_both(validator: Any, text: str, tmp_path: Path) -> tuple[bool, list[str]]:
    """(whether the loader accepts the file ``text``, the schema's errors for it)."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    try:
        load_spec(path)
        loads = True
    except SpecError:
        loads = False
    return loads, _schema_errors(validator, parse_yaml(text)[0])


def _validates(data: dict[str, Any]) -> bool:
    try:
        ModelSpec.model_validate(data)
    except ValidationError:
        return False
    return True


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return value


# --------------------------------------------------------------------------- shape (no jsonschema needed)


def _nodes(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _nodes(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _nodes(item, f"{where}/{i}")


def test_only_a_list_item_requires_fields():
    # `extends`, overrides and --set complete a file, so no field of a mapping is required
    # there; a list item is replaced whole, never merged, so an override needs its layers and
    # an lr_scale entry its pattern and factor
    required = {where: node["required"] for where, node in _nodes(_shipped_schema()) if "required" in node}
    assert required == {"/$defs/LayerOverride": ["layers"], "/$defs/LRScaleSpec": ["pattern", "factor"]}


def test_family_unions_accept_a_mapping_without_type():
    # oneOf refuses `norm: {eps: 1.0e-6}`: it fits both norm types
    assert not [where for where, node in _nodes(_shipped_schema()) if "oneOf" in node]


# --------------------------------------------------------------------------- what must be accepted


@pytest.mark.parametrize("name", PRESETS)
def test_presets_and_their_resolved_and_compact_forms_pass(name, validator):
    spec = load_spec(name)
    forms = {
        "preset file": preset_path(name).read_text(),
        "specformer validate / to_yaml": spec.to_yaml(modeline=True),
        "import-hf (compact)": compact_spec_yaml(spec),
    }
    for form, text in forms.items():
        assert _schema_errors(validator, parse_yaml(text)[0]) == [], form


def _doc_blocks() -> list[tuple[str, str]]:
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            blocks.append((f"{doc.name}[{i}]", block))
    return blocks


@pytest.mark.parametrize(("where", "text"), _doc_blocks(), ids=[w for w, _ in _doc_blocks()])
def test_yaml_examples_in_the_docs_pass(where, text, validator, tmp_path):
    if "extends:" not in text and "kind:" not in text:
        text = "extends: gpt2-small\n" + text  # a fragment of a spec (docs/spec.md's overrides)
    loads, errors = _check_both(validator, text, tmp_path)
    assert loads, f"{where} is not a valid spec"
    assert errors == []


def _parts(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every value of a resolved spec, and every mapping also without its ``type:``."""
    if path:
        yield path, node
    if isinstance(node, dict):
        if path and "type" in node:
            yield path, {k: v for k, v in node.items() if k != "type"}
        for key, value in node.items():
            yield from _parts(value, path + (key,))


@pytest.mark.parametrize("name", PRESETS)
def test_a_file_that_extends_a_preset_may_give_any_part_of_it(name, validator):
    # `extends: P` plus any one section, field or type-less mapping of P's resolved spec
    # is P again: partial sections are what `extends` is for
    parent, _ = load_spec_data(name)
    rejected = []
    for path, value in _parts(load_spec(name).to_dict()):
        child = _nest(path, value)
        assert _validates(deep_merge(parent, child)), path
        errors = _schema_errors(validator, {"extends": name, **child})
        if errors:
            rejected.append((".".join(path), errors[0]))
    assert rejected == []


G = "extends: gpt-nano\n"
VALID = {
    # docs/spec.md: a mapping without `type:` is its family's first type
    "norm without type": "kind: decoder\nvocab_size: 64\nd_model: 32\ndecoder: {n_layers: 1, norm: {eps: 1.0e-6}}\n",
    "ffn without type": G + "decoder: {ffn: {activation: gelu}}\n",
    "embedding norm without type": G + "embedding: {norm: {eps: 1.0e-12}}\n",
    "positional without type": "extends: llama2-7b\npositional: {base: 500000.0}\n",
    "exponent without a dot": G + "decoder: {norm: {eps: 1e-6}}\n",
    # docs/spec.md: override layers are a range (inclusive), an index, or a list
    "layers range": G + "decoder: {overrides: [{layers: '0-2', ffn: {type: glu}}]}\n",
    "layers index": G + "decoder: {overrides: [{layers: 3, attention: {sliding_window: 8}}]}\n",
    "layers index as text": G + "decoder: {overrides: [{layers: '2', ffn: {d_ff: 64}}]}\n",
    "layers list": G + "decoder: {overrides: [{layers: [0, 3], norm: {eps: 1.0e-6}}]}\n",
    "override merges onto the stack's type": G + "decoder: {ffn: {type: glu}, overrides: [{layers: 0, ffn: {activation: gelu}}]}\n",
    "cross-attention changed field by field": "extends: t5-nano\ndecoder: {cross_attention: {n_heads: 2}}\n",
    # training.py's precision validator takes Lightning's spellings too
    "precision 32 as a number": G + "training: {precision: 32}\n",
    "precision 16 as a number": G + "training: {precision: 16}\n",
    "precision 64 as a number": G + "training: {precision: 64}\n",
    "precision bf16": G + "training: {precision: bf16}\n",
    "precision 32-true": G + "training: {precision: 32-true}\n",
    "precision fp32": G + "training: {precision: fp32}\n",
    "devices count": G + "training: {devices: 2}\n",
    "devices list": G + "training: {devices: [0, 1]}\n",
    # docs/training.md: one data path may be given alone
    "data paths alone": G + "training: {data: {type: files, paths: data/}}\n",
    # docs/training.md: a training section without `type:` gets the kind's default type
    "objective without type": G + "training: {objective: {label_smoothing: 0.1}}\n",
    "data without type": G + "training: {data: {max_mb: 1.0}}\n",
    "schedule without type": G + "training: {schedule: {warmup_steps: 10}}\n",
    "null replaces": G + "training: null\nhead: null\n",
    "anchors and merge keys": (
        "kind: encoder-decoder\nvocab_size: 64\nd_model: 32\n"
        "encoder: &stack {n_layers: 2, norm: {type: rmsnorm}}\ndecoder: {<<: *stack, n_layers: 1}\n"
    ),
}


@pytest.mark.parametrize("text", VALID.values(), ids=VALID.keys())
def test_documented_forms_pass(text, validator, tmp_path):
    loads, errors = _check_both(validator, text, tmp_path)
    assert loads
    assert errors == []


# --------------------------------------------------------------------------- what must be refused


INVALID = {
    "unknown field": G + "d_modle: 64\n",
    "unknown stack field": G + "decoder: {n_layer: 2}\n",
    "unknown field without type": G + "decoder: {norm: {epsilon: 1.0e-6}}\n",
    "field of another type": G + "decoder: {norm: {type: rmsnorm, bias: false}}\n",
    "unknown override field": G + "decoder: {overrides: [{layers: 0, atention: {}}]}\n",
    "unknown training field": G + "training: {batch_sise: 2}\n",
    "unknown type": G + "decoder: {ffn: {type: swiglu}}\n",
    "unknown training type": G + "training: {schedule: {type: cosine_annealing}}\n",
    "misspelled activation": G + "decoder: {ffn: {activation: gelu_new}}\n",
    "misspelled placement": G + "decoder: {norm: {placement: middle}}\n",
    "misspelled kind": G + "kind: decoder-only\n",
    "size as text": G + "d_model: '512'\n",
    "size as a switch": G + "decoder: {n_layers: true}\n",
    "switch as text": G + "decoder: {attention: {bias: 'yes'}}\n",
    "negative size": G + "d_model: -1\n",
    "positional as a name": G + "positional: rope\n",
    "layers not a range": G + "decoder: {overrides: [{layers: 'a-b'}]}\n",
    "layers negative": G + "decoder: {overrides: [{layers: -1}]}\n",
    "layers list of ranges": G + "decoder: {overrides: [{layers: ['0-1']}]}\n",
    "override without layers": G + "decoder: {overrides: [{ffn: {type: glu}}]}\n",
    "precision 8": G + "training: {precision: 8}\n",
    "precision fp16": G + "training: {precision: fp16}\n",
    "no devices": G + "training: {devices: 0}\n",
}


@pytest.mark.parametrize("text", INVALID.values(), ids=INVALID.keys())
def test_mistakes_are_refused(text, validator, tmp_path):
    loads, errors = _check_both(validator, text, tmp_path)
    assert not loads
    assert errors


def _leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
        if path:
            yield path + ("zzz",), 1  # an unknown field in every mapping
    else:
        yield path, node


def _wrong(value: Any) -> list[Any]:
    """Values of another JSON type (or a misspelling) in place of ``value``."""
    if isinstance(value, bool):
        return ["yes", 1]
    if isinstance(value, int):
        return [str(value), True, value + 0.5, -value - 1]
    if isinstance(value, float):
        return ["x", True]
    if isinstance(value, str):
        return [7, value + "x"]
    if isinstance(value, list):
        return ["x"]
    return [{"zzz": 1}]


@pytest.mark.parametrize("name", NANO)
def test_schema_agrees_with_the_loader_on_every_field(name, validator):
    # every field of a resolved spec, changed to a value of another type, a misspelling
    # or joined by an unknown field: the schema refuses exactly what the loader refuses
    # (cross-field rules, which a schema cannot express, are not exercised here)
    parent, _ = load_spec_data(name)
    disagree = []
    for path, value in _leaves(load_spec(name).to_dict()):
        for wrong in _wrong(value) if path[-1] != "zzz" else [value]:
            child = _nest(path, copy.deepcopy(wrong))
            loads = _validates(deep_merge(parent, child))
            passes = validator.is_valid({"extends": name, **child})
            if path[-1] == "freeze" and wrong == "x":
                # one pattern alone is a list of one, which the loader checks against the
                # model's parameter names (a cross-field rule): 'x' names none
                assert passes and not loads
                continue
            if loads != passes:
                disagree.append((".".join(path), wrong, "loader accepts" if loads else "loader refuses"))
    assert disagree == []
