"""The JSON Schema of a spec file (what ``specformer schema`` prints).

It is generated from :class:`ModelSpec`, so it follows the registry: every
registered ``type:`` of every family appears, plugins included. A copy ships
beside the presets as ``specformer.schema.json`` for their modelines.
"""

from __future__ import annotations

from typing import Any

__all__ = ["spec_json_schema"]


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a spec as written in YAML, with ``extends``."""
    from specformer.specs.schema import ModelSpec

    schema = ModelSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specformer spec"
    props = schema.setdefault("properties", {})
    props["extends"] = {
        "type": "string",
        "description": "A preset name or a path (relative to this file) that this spec "
        "deep-merges onto: mappings merge, lists and scalars replace.",
    }
    # with `extends`, a file may leave out fields its parent gives
    schema.pop("required", None)
    return schema
