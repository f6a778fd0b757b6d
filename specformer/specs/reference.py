"""The field reference of docs/spec.md, generated from the schema so the two never drift.

Regenerate with ``python -m specformer.specs.reference docs/spec.md``: the text
between the ``<!-- reference:start -->`` and ``<!-- reference:end -->`` markers
is replaced.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

__all__ = ["field_reference", "update_file"]

START, END = "<!-- reference:start -->", "<!-- reference:end -->"


def _type_text(annotation: typing.Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_text(typing.get_args(annotation)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        parts = [_type_text(a) for a in typing.get_args(annotation)]
        return " \\| ".join(dict.fromkeys(parts))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list of {_type_text(args[0])}" if args else "list"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get("type")
        if field is not None and isinstance(field.default, str):
            # every choice the one model takes (residual: sequential or parallel), not its default alone
            choices = typing.get_args(field.annotation) or (field.default,)
            return " \\| ".join(f"`{{type: {choice}}}`" for choice in choices)
        return annotation.__name__
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: typing.Any) -> str:
    if field.default is PydanticUndefined:
        if field.default_factory is not None:
            made = field.default_factory()
            return f"`{{type: {made.type}}}`" if hasattr(made, "type") and isinstance(made.type, str) else "(defaults)"
        return "**required**"
    if field.default is None:
        return "derived" if "default" in (field.description or "").lower() else "null"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    if isinstance(field.default, tuple) and not field.default:
        return "`[]`"
    return f"`{field.default}`"


def _models() -> list[tuple[str, type[BaseModel]]]:
    from specformer.registry import REGISTRY
    from specformer.specs import schema

    out: list[tuple[str, type[BaseModel]]] = [
        ("top level", schema.ModelSpec),
        ("`encoder:` / `decoder:` (a stack)", schema.StackSpec),
        ("`overrides:` entries of a stack", schema.LayerOverride),
        ("`residual:`", schema.ResidualSpec),
        ("`embedding:`", schema.EmbeddingSpec),
        ("`init:`", schema.InitSpec),
    ]
    for family, where in (
        ("positional", "`positional:`"),
        ("attention", "`attention:` / `cross_attention:`"),
        ("ffn", "`ffn:`"),
        ("norm", "`norm:`"),
        ("head", "`head:`"),
    ):
        for name, entry in REGISTRY.entries(family).items():
            out.append((f"{where} `type: {name}`", entry.spec))
        if family == "positional":
            for scaling in schema.ROPE_SCALINGS:
                out.append((f"`positional.scaling:` `type: {scaling.model_fields['type'].default}`", scaling))
    extra = getattr(schema, "REFERENCE_EXTRA", ())
    out.extend(extra)
    return out


def field_reference() -> str:
    """Markdown tables: one per spec model, one row per field."""
    lines: list[str] = []
    for title, model in _models():
        doc = " ".join((model.__doc__ or "").split())
        lines += [f"### {title}", "", doc, "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if name == "type" and len(typing.get_args(field.annotation)) == 1:
                continue  # a registry entry's own name: the table's title says it
            desc = " ".join((field.description or "").split()).replace("|", "\\|")
            lines.append(f"| `{name}` | {_type_text(field.annotation)} | {_default_text(field)} | {desc} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def update_file(path: Path) -> bool:
    """Rewrite the generated part of ``path``; return whether it changed."""
    text = path.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    new = f"{head}{START}\n{field_reference()}{END}{tail}"
    if new != text:
        path.write_text(new)
        return True
    return False


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/spec.md")
    print(("updated " if update_file(target) else "unchanged ") + str(target))
