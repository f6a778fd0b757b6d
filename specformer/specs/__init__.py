"""Specs: the schema (pydantic, no torch), the YAML loader and the shipped presets."""

from specformer.specs.errors import Position, SpecError, SpecProblem
from specformer.specs.loader import load_spec, preset_names

__all__ = ["load_spec", "preset_names", "SpecError", "SpecProblem", "Position"]
